//! Faults that touch shared services: the Kafka broker going away, a cluster-wide WAL limit
//! that invalidates slots, a broker restart under token logins (`kafka_msk_iam`). Run beside
//! the other tests on their services, these would stop the broker and PostgreSQL under them:
//! `scripts/test.sh` runs `exclusive::` in a process of its own, on services of its own, one
//! test at a time ([`alone`]).

mod kafka_msk_iam;

use std::time::{Duration, Instant};

use crate::common::probe::{free_port, http_get, metric, wait_exit};
use crate::common::*;

/// One exclusive test at a time.
static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits until no other exclusive test runs. The services must be this process's alone:
/// `scripts/test.sh` says so with `OUTBOX_TEST_EXCLUSIVE=1` when it runs `exclusive::` on
/// services of its own (the whole suite) or with no other test selected; anywhere else the
/// test fails at once, saying how to run it.
pub(crate) async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    assert!(
        std::env::var_os("OUTBOX_TEST_EXCLUSIVE").is_some(),
        "this test stops and restarts the broker and PostgreSQL that other tests share: run it \
         through scripts/test.sh (the whole suite, or `scripts/test.sh --test integration -- \
         exclusive::`), which gives it services no other test uses"
    );
    EXCLUSIVE.lock().await
}

/// Stops the broker; starts it again when dropped, also when the test panics, so that a
/// failure here does not leave the broker down.
pub(crate) struct BrokerOutage;

impl BrokerOutage {
    pub(crate) fn begin() -> BrokerOutage {
        services("kafka-stop");
        BrokerOutage
    }
}

impl Drop for BrokerOutage {
    fn drop(&mut self) {
        services("kafka-start");
    }
}

/// The relay's environment with librdkafka's broker and metadata debug lines in its log: twice,
/// in loaded full runs, a relay whose broker stopped right after a topic's first write logged
/// no connection attempt at all from then on and sent nothing after the broker came back (not
/// reproduced since); the next such log says what librdkafka was doing.
fn kafka_debug(env: Vec<(String, String)>) -> Vec<(String, String)> {
    with(
        env,
        &[("OUTBOX_RELAY__KAFKA__PROPERTIES__DEBUG", "broker,metadata")],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_down_20s_loses_nothing_and_holds_the_slot() {
    let _alone = alone().await;
    let db = TestDb::new().await;
    db.create_slot().await;
    let mut relay = RelayProcess::start(&kafka_debug(db.relay_env()), "broker_outage");
    let mut client = db.client().await;

    // Before the outage: a first batch flows through.
    let before: Vec<Event> = (0..500).map(|i| Event::new("order", "a", 0, i)).collect();
    for chunk in before.chunks(50) {
        insert_events(&mut client, chunk, true).await;
    }
    let topic = db.topic("order");
    let got = read_ids(
        std::slice::from_ref(&topic),
        1,
        &before.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    assert_eq!(
        tally(&before, &got).missing.len(),
        0,
        "events missing before the outage"
    );

    let outage = BrokerOutage::begin();
    let stopped = Instant::now();
    // Nothing committed from here on can be acknowledged until the broker is back. The slot
    // may pass WAL of transactions still open (they are re-sent on restart because their
    // commit comes later), but never the commit of the first transaction written now.
    let first: Vec<Event> = (0..20)
        .map(|i| Event::new("order", "b", 0, 500 + i))
        .collect();
    let first_commit_at_least = insert_events_at(&mut client, &first, true).await;
    let mut during = first;
    let mut samples = Vec::new();
    let mut seq = 520;
    while stopped.elapsed() < Duration::from_secs(20) {
        let batch: Vec<Event> = (0..20)
            .map(|i| Event::new("order", "b", 0, seq + i))
            .collect();
        seq += 20;
        insert_events(&mut client, &batch, true).await;
        during.extend(batch);
        samples.push(db.confirmed_flush_lsn().await);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        relay.try_status().is_none(),
        "relay exited while the broker was down:\n{}",
        relay.log_text()
    );
    let highest = samples.iter().copied().max().unwrap();
    assert!(
        highest <= first_commit_at_least,
        "confirmed_flush_lsn moved to {highest:#x}, past the commit (>= {first_commit_at_least:#x}) of unacknowledged events"
    );
    println!(
        "broker down: {} samples, confirmed_flush_lsn stayed at or below {highest:#x} (first unacknowledged commit >= {first_commit_at_least:#x})",
        samples.len()
    );
    drop(outage);

    let after: Vec<Event> = (0..500)
        .map(|i| Event::new("order", "c", 0, seq + i))
        .collect();
    for chunk in after.chunks(50) {
        insert_events(&mut client, chunk, true).await;
    }
    let all: Vec<Event> = before
        .iter()
        .chain(&during)
        .chain(&after)
        .cloned()
        .collect();
    println!(
        "broker outage: {} events written while the broker was down",
        during.len()
    );
    expect_all(
        "broker outage",
        &[topic],
        &all,
        Duration::from_secs(180),
        Duration::from_secs(3),
        &relay,
    )
    .await;

    let target = db.current_wal_lsn().await;
    wait_for(
        "the slot to confirm everything after the outage",
        Duration::from_secs(60),
        || async { db.confirmed_flush_lsn().await >= target },
    )
    .await;
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

/// Waits for `/readyz` to answer 200 after the broker came back; fails with its last answer
/// and the relay's log (what is it waiting for?).
async fn wait_ready(port: u16, relay: &RelayProcess, timeout: Duration) {
    let readyz = || http_get(port, "/readyz").map(|r| format!("{} {}", r.0, r.1));
    let green = tokio::time::timeout(timeout, async {
        while !readyz().is_some_and(|r| r.starts_with("200")) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(
        green.is_ok(),
        "/readyz still {:?} {timeout:?} after the broker came back; log {}:\n{}",
        readyz(),
        relay.log.display(),
        relay.log_text()
    );
}

/// A topic's first record arrives while the broker is down (its first metadata read, where an
/// open broker auto-creates it, fails): once the broker is back, every event arrives and
/// `/readyz` turns green. (A loaded run once stopped the broker within a second of the first
/// write, and the relay never recovered.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_topic_first_written_while_the_broker_is_down_arrives_after() {
    let _alone = alone().await;
    let db = TestDb::new().await;
    let port = free_port();
    let env = with(
        db.relay_env(),
        &[
            ("OUTBOX_RELAY__HTTP__LISTEN", &format!("127.0.0.1:{port}")),
            ("OUTBOX_RELAY__HTTP__READY_STALENESS_MS", "3000"),
        ],
    );
    let mut relay = RelayProcess::start(&kafka_debug(env), "first-write-outage");
    wait_for("the relay to be ready", Duration::from_secs(30), || async {
        http_get(port, "/readyz").is_some_and(|r| r.0 == 200)
    })
    .await;
    let outage = BrokerOutage::begin();
    let mut client = db.client().await;
    let events: Vec<Event> = (0..50).map(|i| Event::new("order", "f", 0, i)).collect();
    for chunk in events.chunks(10) {
        insert_events(&mut client, chunk, true).await;
    }
    wait_for("/readyz to turn red", Duration::from_secs(30), || async {
        http_get(port, "/readyz").is_some_and(|r| r.0 == 503)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(outage);
    let back = Instant::now();
    wait_ready(port, &relay, Duration::from_secs(60)).await;
    println!(
        "readyz green {:?} after the broker came back",
        back.elapsed()
    );
    expect_all(
        "first write during an outage",
        &[db.topic("order")],
        &events,
        Duration::from_secs(60),
        Duration::from_secs(1),
        &relay,
    )
    .await;
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn readiness_turns_red_while_the_broker_is_down_and_green_after() {
    let _alone = alone().await;
    let db = TestDb::new().await;
    let port = free_port();
    let mut env = db.relay_env();
    env.retain(|(k, _)| k != "OUTBOX_RELAY__HTTP__LISTEN");
    env.push((
        "OUTBOX_RELAY__HTTP__LISTEN".into(),
        format!("127.0.0.1:{port}"),
    ));
    env.push((
        "OUTBOX_RELAY__HTTP__READY_STALENESS_MS".into(),
        "3000".into(),
    ));
    let mut relay = RelayProcess::start(&kafka_debug(env), "readiness");
    wait_for("the relay to be ready", Duration::from_secs(30), || async {
        http_get(port, "/readyz").is_some_and(|r| r.0 == 200)
    })
    .await;

    let writer_db = db.clone();
    let stop_writing = tokio_util::sync::CancellationToken::new();
    let stop = stop_writing.clone();
    let writing = tokio::spawn(async move {
        let mut client = writer_db.client().await;
        let mut all = Vec::new();
        let mut seq = 0;
        while !stop.is_cancelled() {
            let batch: Vec<Event> = (0..10)
                .map(|i| Event::new("order", "r", 0, seq + i))
                .collect();
            seq += 10;
            insert_events(&mut client, &batch, true).await;
            all.extend(batch);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        all
    });

    let outage = BrokerOutage::begin();
    let down = Instant::now();
    wait_for(
        "/readyz to report not ready while the broker is down",
        Duration::from_secs(15),
        || async { http_get(port, "/readyz").is_some_and(|r| r.0 == 503) },
    )
    .await;
    println!(
        "readyz went red {:?} after the broker stopped (staleness 3 s)",
        down.elapsed()
    );
    assert_eq!(
        http_get(port, "/healthz").map(|r| r.0),
        Some(200),
        "the process is alive"
    );
    drop(outage);
    let up = Instant::now();
    wait_ready(port, &relay, Duration::from_secs(60)).await;
    println!(
        "readyz went green {:?} after the broker restarted",
        up.elapsed()
    );

    stop_writing.cancel();
    let all = writing.await.unwrap();
    expect_all(
        "broker down behind /readyz",
        &[db.topic("order")],
        &all,
        Duration::from_secs(120),
        Duration::from_secs(1),
        &relay,
    )
    .await;
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

/// The relay's peak resident memory, from /proc (kB → bytes).
fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/<pid>/status");
    kb * 1024
}

/// Memory is bounded by the records in flight, whatever the traffic: while the broker is down,
/// 100,000 transactions that carry no outbox record (each with a logical message of another
/// prefix, which pgoutput sends on every version, as PostgreSQL 14 sends every transaction)
/// must not pile up behind the first unacknowledged one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_down_under_100k_recordless_transactions_keeps_memory_flat() {
    let _alone = alone().await;
    let db = TestDb::new().await;
    db.create_slot().await;
    let port = free_port();
    let mut env = db.relay_env();
    env.retain(|(k, _)| k != "OUTBOX_RELAY__HTTP__LISTEN");
    env.push((
        "OUTBOX_RELAY__HTTP__LISTEN".into(),
        format!("127.0.0.1:{port}"),
    ));
    // Decoding logical messages: every transaction that emits one reaches the relay.
    env.push((
        "OUTBOX_RELAY__OUTBOX__MESSAGE_PREFIX".into(),
        "outbox".into(),
    ));
    let mut relay = RelayProcess::start(&kafka_debug(env), "memory_outage");
    wait_for_slot(&db, &mut relay).await;
    let mut client = db.client().await;
    let mut all: Vec<Event> = (0..100).map(|i| Event::new("order", "m", 0, i)).collect();
    insert_events(&mut client, &all, true).await;

    let outage = BrokerOutage::begin();
    for round in 0..10 {
        let batch: Vec<Event> = (0..20)
            .map(|i| Event::new("order", "m", 0, 100 + round * 20 + i))
            .collect();
        insert_events(&mut client, &batch, true).await;
        all.extend(batch);
        client
            .batch_execute(
                "DO $$ BEGIN FOR i IN 1..10000 LOOP \
                   PERFORM pg_logical_emit_message(true, 'unrelated', 'x'); COMMIT; \
                 END LOOP; END $$",
            )
            .await
            .unwrap();
    }
    let written = db.current_wal_lsn().await;
    wait_for(
        "the relay to read every transaction written during the outage",
        Duration::from_secs(120),
        || async {
            http_get(port, "/metrics")
                .and_then(|(_, body)| metric(&body, "outbox_relay_received_lsn"))
                .is_some_and(|lsn| lsn as u64 >= written)
        },
    )
    .await;
    let peak = peak_rss_bytes(relay.pid());
    let held = http_get(port, "/metrics")
        .and_then(|(_, body)| metric(&body, "outbox_relay_ledger_transactions"))
        .unwrap_or(f64::NAN);
    println!(
        "broker down, 100,000 recordless transactions read: peak RSS {:.1} MB, ledger holds {held} transactions",
        peak as f64 / 1e6
    );
    assert!(
        peak < 64 * 1024 * 1024,
        "relay peak RSS {peak} bytes >= 64 MiB while the broker was down"
    );
    assert!(held <= 50.0, "the ledger holds {held} transactions");
    drop(outage);

    expect_all(
        "broker down under recordless traffic",
        &[db.topic("order")],
        &all,
        Duration::from_secs(120),
        Duration::from_secs(1),
        &relay,
    )
    .await;
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

/// Sets a cluster-wide setting for the test and resets it afterwards, also on failure.
struct SystemSetting {
    url: String,
    name: &'static str,
}

impl SystemSetting {
    async fn set(url: &str, name: &'static str, value: &str) -> SystemSetting {
        let admin = connect(url).await;
        // ALTER SYSTEM refuses to run inside the implicit transaction of a multi-statement batch.
        admin
            .batch_execute(&format!("ALTER SYSTEM SET {name} = '{value}'"))
            .await
            .unwrap();
        admin
            .batch_execute("SELECT pg_reload_conf()")
            .await
            .unwrap();
        SystemSetting {
            url: url.to_string(),
            name,
        }
    }
}

impl Drop for SystemSetting {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name);
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let admin = connect(&url).await;
                let _ = admin
                    .batch_execute(&format!("ALTER SYSTEM RESET {name}"))
                    .await;
                let _ = admin.batch_execute("SELECT pg_reload_conf()").await;
            });
        })
        .join()
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalidated_slot_stops_the_relay_with_the_recovery_steps() {
    let _alone = alone().await;
    let db = TestDb::new().await;
    db.create_slot().await;
    let mut relay = RelayProcess::start(&db.relay_env(), "slot_invalidated");
    wait_for_slot(&db, &mut relay).await;
    let admin = db.client().await;

    // With the broker down, an event stays unacknowledged, so the running relay cannot confirm
    // past it and the slot falls behind; cap retained WAL and outrun the cap.
    let _cap =
        SystemSetting::set(&env("OUTBOX_TEST_PG_URL"), "max_slot_wal_keep_size", "1MB").await;
    let outage = BrokerOutage::begin();
    let mut client = db.client().await;
    insert_events(&mut client, &[Event::new("order", "lost", 0, 0)], true).await;
    admin
        .batch_execute("CREATE TABLE noise (id bigserial PRIMARY KEY, pad text NOT NULL)")
        .await
        .unwrap();
    let lost = async {
        for _ in 0..40 {
            admin
                .batch_execute(
                    "INSERT INTO noise (pad) SELECT repeat(md5(g::text), 32) FROM generate_series(1, 2000) g;
                     SELECT pg_switch_wal(); CHECKPOINT;",
                )
                .await
                .unwrap();
            let status: Option<String> = admin
                .query_one("SELECT wal_status FROM pg_replication_slots WHERE slot_name = $1", &[&db.slot])
                .await
                .unwrap()
                .get(0);
            if status.as_deref() == Some("lost") {
                return true;
            }
        }
        false
    }
    .await;
    assert!(lost, "could not invalidate the slot for the test");

    let status = wait_exit(&mut relay, Duration::from_secs(60));
    drop(outage);
    let log = relay.log_text();
    assert_eq!(status.code(), Some(3), "exit code for a lost slot\n{log}");
    assert!(
        log.contains("lost") && log.contains("may be missing") && log.contains("replay"),
        "{log}"
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_mid_stream_loses_nothing() {
    let _alone = alone().await;
    let db = TestDb::new().await;
    db.create_slot().await;
    let mut relay = RelayProcess::start(&db.relay_env(), "pg_restart");
    let mut client = db.client().await;
    let before: Vec<Event> = (0..2000).map(|i| Event::new("order", "pg", 0, i)).collect();
    for chunk in before.chunks(100) {
        insert_events(&mut client, chunk, true).await;
    }
    // Restart the server while those are (partly) still streaming.
    services("pg-stop");
    services("pg-start");
    let mut client = db.client().await;
    let after: Vec<Event> = (0..2000)
        .map(|i| Event::new("order", "pg", 0, 2000 + i))
        .collect();
    for chunk in after.chunks(100) {
        insert_events(&mut client, chunk, true).await;
    }
    let all: Vec<Event> = before.iter().chain(&after).cloned().collect();
    expect_all(
        "postgres restart",
        &[db.topic("order")],
        &all,
        Duration::from_secs(120),
        Duration::from_secs(2),
        &relay,
    )
    .await;
    assert!(
        relay.log_text().contains("reconnecting"),
        "the relay should have reconnected"
    );
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

// ---------------------------------------------------------------------------------------
// Exactly-once (`kafka.delivery = "exactly_once"`) through the same faults.

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_through_a_20s_broker_outage() {
    let _alone = alone().await;
    let db = TestDb::new().await;
    db.create_slot().await;
    let relay = RelayProcess::start(&kafka_debug(exactly_once_env(&db)), "eos_broker_outage");
    let writer_db = db.clone();
    let writing = tokio::spawn(async move {
        write_concurrently(&writer_db, 4, 12_000, 50, Duration::from_millis(60)).await
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    {
        let _outage = BrokerOutage::begin();
        eprintln!("broker stopped");
        tokio::time::sleep(Duration::from_secs(20)).await;
    }
    eprintln!("broker started");
    let all: Vec<Event> = writing.await.unwrap().into_iter().flatten().collect();
    assert_eq!(all.len(), 12_000);
    expect_exactly_once("broker outage", &db, &all, &[], &relay.log_text()).await;
    let mut relay = relay;
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_through_a_postgres_restart() {
    let _alone = alone().await;
    let db = TestDb::new().await;
    db.create_slot().await;
    let mut env = exactly_once_env(&db);
    // The slot confirms late, so the restart leaves transactions to skip.
    env.push((
        "OUTBOX_RELAY__RELAY__CONFIRM_DELAY_MS".into(),
        "1500".into(),
    ));
    let mut relay = RelayProcess::start(&env, "eos_pg_restart");
    let mut client = db.client().await;
    let before: Vec<Event> = (0..3000).map(|i| Event::new("order", "pg", 0, i)).collect();
    for chunk in before.chunks(30) {
        insert_events(&mut client, chunk, true).await;
    }
    services("pg-stop");
    services("pg-start");
    let mut client = db.client().await;
    let after: Vec<Event> = (0..3000)
        .map(|i| Event::new("order", "pg", 0, 3000 + i))
        .collect();
    for chunk in after.chunks(30) {
        insert_events(&mut client, chunk, true).await;
    }
    let all: Vec<Event> = before.iter().chain(&after).cloned().collect();
    expect_exactly_once("postgres restart", &db, &all, &[], &relay.log_text()).await;
    let log = relay.log_text();
    assert!(
        log.contains("reconnecting"),
        "the relay should have reconnected"
    );
    println!(
        "postgres restart: {} transactions skipped as already in Kafka",
        log.matches("skipped=true").count()
    );
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}
