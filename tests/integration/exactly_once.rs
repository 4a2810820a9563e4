//! `kafka.delivery = "exactly_once"` against the real PostgreSQL and Kafka: a read_committed
//! consumer sees every committed event exactly once through SIGKILLs, a standby taking over
//! (with the old relay frozen and woken as a zombie), and the operator's slot commands.

use std::collections::HashMap;
use std::time::Duration;

use crate::common::cluster::OwnCluster;
use crate::common::*;
use rand::Rng;

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

/// `writers` writers commit `total` events in transactions of 1 to 50 rows, rolling back
/// every seventh transaction (those rows are returned apart). Committed events come back in
/// each writer's commit order.
async fn write_with_rollbacks(
    db: &TestDb,
    writers: usize,
    total: usize,
    pause: Duration,
) -> (Vec<Event>, Vec<Event>) {
    let per_writer = total / writers;
    let mut tasks = Vec::new();
    for w in 0..writers {
        let mut client = db.client().await;
        tasks.push(tokio::spawn(async move {
            let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
            let mut txn_no = 0;
            while committed.len() < per_writer {
                let n = rand::thread_rng()
                    .gen_range(1..=50)
                    .min(per_writer - committed.len());
                let aggregate_type = if txn_no % 2 == 0 { "order" } else { "customer" };
                let seq = committed.len() + rolled_back.len();
                let batch: Vec<Event> = (0..n)
                    .map(|i| Event::new(aggregate_type, &format!("w{w}-{txn_no}"), w, seq + i))
                    .collect();
                let commit = txn_no % 7 != 3;
                insert_events(&mut client, &batch, commit).await;
                if commit {
                    committed.extend(batch);
                } else {
                    rolled_back.extend(batch);
                }
                txn_no += 1;
                if !pause.is_zero() {
                    tokio::time::sleep(pause).await;
                }
            }
            (committed, rolled_back)
        }));
    }
    let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
    for t in tasks {
        let (c, r) = t.await.unwrap();
        committed.extend(c);
        rolled_back.extend(r);
    }
    (committed, rolled_back)
}

/// Waits until the relay's log (shared by the test's relays) says `sessions` sessions began
/// streaming; fails if the relay exits.
async fn wait_streaming(relay: &mut RelayProcess, sessions: usize) {
    let began = std::time::Instant::now();
    while relay.log_text().matches("streaming from the slot").count() < sessions {
        if let Some(status) = relay.try_status() {
            panic!("relay exited with {status}:\n{}", relay.log_text());
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "session {sessions} did not start streaming within 60 s:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_ten_times_read_committed_sees_each_event_exactly_once() {
    let db = TestDb::new().await;
    db.create_slot().await;
    let mut env = exactly_once_env(&db);
    // The slot confirms 1.5 s after the Kafka commit: each kill leaves committed transactions
    // that PostgreSQL sends again, which the relay must skip.
    env.push((
        "OUTBOX_RELAY__RELAY__CONFIRM_DELAY_MS".into(),
        "1500".into(),
    ));
    let log_name = format!("eos-sigkill-{}", db.name);
    let mut relay = RelayProcess::start(&env, &log_name);
    wait_for_slot(&db, &mut relay).await;

    // About 30 s of writing (≈ 116 transactions per writer, 250 ms apart), so that events
    // flow through all ten kills: once a fast relay has caught up with writers that are done,
    // a restart has nothing to skip and the test proves nothing.
    let writer_db = db.clone();
    let writing = tokio::spawn(async move {
        write_with_rollbacks(&writer_db, 8, 20_000, Duration::from_millis(250)).await
    });
    for kill in 1..=10 {
        // Each kill lands while a session streams: one killed while it still sets up its
        // producer (a fenced predecessor's transaction is being aborted; seconds on a loaded
        // machine) commits nothing, and a restart after it has nothing to skip.
        wait_streaming(&mut relay, kill).await;
        let wait = rand::thread_rng().gen_range(300..1500);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        relay.kill9();
        eprintln!("kill {kill}: SIGKILL {wait} ms into streaming");
        tokio::time::sleep(Duration::from_millis(rand::thread_rng().gen_range(0..300))).await;
        relay = RelayProcess::start(&env, &log_name);
    }
    let (committed, rolled_back) = writing.await.unwrap();
    assert_eq!(committed.len(), 20_000);
    assert!(!rolled_back.is_empty());

    expect_exactly_once(
        "sigkill x10",
        &db,
        &committed,
        &rolled_back,
        &relay.log_text(),
    )
    .await;
    let log = relay.log_text();
    let skipped = log.matches("skipped=true").count();
    println!("sigkill x10: {skipped} transactions skipped as already in Kafka");
    assert!(
        skipped > 0,
        "no restart had anything to skip: the test proved nothing"
    );
    assert!(relay.terminate(Duration::from_secs(30)).success(), "{log}");
    db.cleanup().await;
}

/// Freezes or wakes a process.
fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_takes_over_and_a_woken_zombie_commits_nothing() {
    let db = TestDb::new().await;
    db.create_slot().await;
    let mut env = exactly_once_env(&db);
    for (k, v) in [
        ("OUTBOX_RELAY__POSTGRES__STANDBY_RETRY_MS", "300"),
        ("OUTBOX_RELAY__POSTGRES__STALE_HOLDER_AFTER_MS", "3000"),
        ("OUTBOX_RELAY__POSTGRES__TERMINATE_STALE_HOLDER", "true"),
    ] {
        env.push((k.into(), v.into()));
    }
    let mut first = RelayProcess::start(&env, "eos-active");
    wait_for_slot(&db, &mut first).await;
    let mut standby = RelayProcess::start(&env, "eos-standby");

    let writer_db = db.clone();
    let writing = tokio::spawn(async move {
        write_with_rollbacks(&writer_db, 8, 12_000, Duration::from_millis(20)).await
    });
    // Freeze the active relay mid-stream: it holds the slot and an open Kafka transaction.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    signal(first.pid(), "-STOP");
    eprintln!("active relay frozen");
    // The standby terminates the stale holder, takes the slot and fences the frozen producer.
    let client = db.client().await;
    wait_for(
        "the standby to hold the slot",
        Duration::from_secs(60),
        || async {
            let holder: Option<i32> = client
                .query_one(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
                    &[&db.slot],
                )
                .await
                .unwrap()
                .get(0);
            holder.is_some()
                && standby
                    .log_text()
                    .contains("exactly-once: producer initialised")
        },
    )
    .await;
    // The zombie wakes: whatever it had open, and whatever it still tries, must not commit.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    signal(first.pid(), "-CONT");
    eprintln!("zombie woken");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Then the standby is killed too, and the zombie (now a standby) takes over again.
    standby.kill9();
    eprintln!("standby killed");
    let (committed, rolled_back) = writing.await.unwrap();
    assert_eq!(committed.len(), 12_000);

    let logs = format!(
        "--- first\n{}\n--- standby\n{}",
        first.log_text(),
        standby.log_text()
    );
    expect_exactly_once("standby takeover", &db, &committed, &rolled_back, &logs).await;
    assert!(first.terminate(Duration::from_secs(30)).success(), "{logs}");
    db.cleanup().await;
}

/// Runs `outbox-relay <args>`, which must succeed; returns its stdout.
async fn ops(env: &[(String, String)], args: &[&str]) -> String {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(args)
        .envs(env.iter().cloned())
        .env_remove("OUTBOX_RELAY_CONFIG")
        .env_remove("OUTBOX_RELAY_LOG")
        .output()
        .await
        .expect("run outbox-relay");
    assert!(
        out.status.success(),
        "outbox-relay {args:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn write(db: &TestDb, n: usize, writer: usize) -> Vec<Event> {
    let mut client = db.client().await;
    let events: Vec<Event> = (0..n)
        .map(|i| Event::new("order", &format!("ops-{writer}-{i}"), writer, i))
        .collect();
    for chunk in events.chunks(10) {
        insert_events(&mut client, chunk, true).await;
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slot_drop_create_advance_and_replay_behave_as_documented() {
    let db = TestDb::new().await;
    db.create_slot().await;
    let env = exactly_once_env(&db);
    let mut relay = RelayProcess::start(&env, "eos-ops");
    wait_for_slot(&db, &mut relay).await;
    let first = write(&db, 200, 0).await;
    expect_exactly_once("before", &db, &first, &[], &relay.log_text()).await;
    assert!(relay.terminate(Duration::from_secs(30)).success());

    // `check` sees the progress topic the relay made, compacted.
    let report: serde_json::Value =
        serde_json::from_str(&ops(&env, &["check", "--json"]).await).unwrap();
    let item = report["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["check"] == "kafka exactly-once")
        .unwrap_or_else(|| panic!("no exactly-once item in {report:#}"));
    assert_eq!(item["status"], "ok", "{item:#}");
    assert!(
        item["detail"].as_str().unwrap().contains("is compacted"),
        "{item:#}"
    );

    // Drop and create: the progress record (same key) stands above nothing new.
    ops(&env, &["slot", "drop", "--yes"]).await;
    ops(&env, &["slot", "create"]).await;
    let second = write(&db, 200, 1).await;
    let mut relay = RelayProcess::start(&env, "eos-ops");
    wait_for_slot(&db, &mut relay).await;
    let third = write(&db, 200, 2).await;
    let mut expected: Vec<Event> = [&first[..], &second[..], &third[..]].concat();
    expect_exactly_once("drop + create", &db, &expected, &[], &relay.log_text()).await;
    assert!(relay.terminate(Duration::from_secs(30)).success());

    // Advance past events the operator gives up on: later ones are published.
    let given_up = write(&db, 100, 3).await;
    ops(&env, &["slot", "advance", "--to", "now"]).await;
    let since: String = db
        .client()
        .await
        .query_one("SELECT clock_timestamp()::text", &[])
        .await
        .unwrap()
        .get(0);
    let fourth = write(&db, 200, 4).await;
    let mut relay = RelayProcess::start(&env, "eos-ops");
    wait_for_slot(&db, &mut relay).await;
    let fifth = write(&db, 200, 5).await;
    let replayed: Vec<Event> = [&fourth[..], &fifth[..]].concat();
    expected.extend(fourth);
    expected.extend(fifth);
    expect_exactly_once("advance", &db, &expected, &given_up, &relay.log_text()).await;
    assert!(relay.terminate(Duration::from_secs(30)).success());

    // Replay publishes again on purpose (new records, not deduplicated), outside any
    // transaction: read_committed consumers see them; the progress record is untouched, so
    // the relay afterwards neither skips nor repeats.
    let report: serde_json::Value =
        serde_json::from_str(&ops(&env, &["replay", "--since", &since, "--json"]).await).unwrap();
    assert_eq!(report["acknowledged"], 400, "{report:#}");
    let mut relay = RelayProcess::start(&env, "eos-ops");
    wait_for_slot(&db, &mut relay).await;
    let sixth = write(&db, 100, 6).await;
    expected.extend(sixth.iter().cloned());
    let topics = vec![db.topic("order"), db.topic("customer")];
    let received = read_ids_committed(
        &topics,
        &ids(&sixth),
        Duration::from_secs(120),
        Duration::from_secs(5),
    )
    .await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for r in &received {
        *seen.entry(r.key_str()).or_default() += 1;
    }
    let twice: std::collections::HashSet<&str> = replayed.iter().map(|e| e.id.as_str()).collect();
    for e in &expected {
        let want = if twice.contains(e.id.as_str()) { 2 } else { 1 };
        assert_eq!(
            seen.get(&e.id).copied().unwrap_or(0),
            want,
            "event {} (writer payload {})",
            e.id,
            e.payload
        );
    }
    assert_eq!(received.len(), expected.len() + replayed.len());
    println!(
        "replay: {} replayed, {} read_committed records in all, as expected",
        replayed.len(),
        received.len()
    );
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

/// Issue 20, done-when 4 (restore): an earlier copy of the data directory started as it was
/// stays on timeline 1, with WAL below the progress record Kafka holds. The relay refuses to
/// start (exit 1, naming the fix); meanwhile nothing is published twice and the slot confirms
/// nothing, so the events the restored database commits are not skipped: once the operator
/// deletes the slot's progress with a tombstone, they are published, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restored_earlier_data_directory_stops_the_relay_and_skips_nothing() {
    let cluster = OwnCluster::new("restore");
    let db = TestDb::new_on(&cluster.url()).await;
    let env = exactly_once_env(&db);
    let mut relay = RelayProcess::start(&env, "eos-restore");
    wait_for_slot(&db, &mut relay).await;
    let first = write(&db, 100, 0).await;
    let topics = vec![db.topic("order")];
    let got = read_ids_committed(
        &topics,
        &ids(&first),
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    assert!(
        tally(&first, &got).missing.is_empty(),
        "first events not published:\n{}",
        relay.log_text()
    );

    // The copy: taken from a cleanly stopped server once the slot confirmed the first events;
    // the relay reconnects once it is back.
    let published_to = db.current_wal_lsn().await;
    wait_for(
        "the slot to confirm the first events",
        Duration::from_secs(30),
        || async { db.confirmed_flush_lsn().await >= published_to },
    )
    .await;
    cluster.stop();
    cluster.copy_data("data.copy");
    cluster.start();
    wait_for_slot(&db, &mut relay).await;
    let later = write(&db, 300, 1).await;
    let got = read_ids_committed(
        &topics,
        &ids(&later),
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    assert!(
        tally(&later, &got).missing.is_empty(),
        "events after the copy not published:\n{}",
        relay.log_text()
    );
    assert!(
        relay.terminate(Duration::from_secs(30)).success(),
        "{}",
        relay.log_text()
    );

    // The restore: the copy started as it was, and a few new transactions on it (at LSNs of
    // transactions Kafka already holds from the history that is gone).
    cluster.stop();
    cluster.restore_data("data.copy", "data.later");
    cluster.start();
    let restored = write(&db, 20, 2).await;
    let slot_before = db.confirmed_flush_lsn().await;
    let mut relay = RelayProcess::start(&env, "eos-restore-restored");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = relay.try_status() {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the relay did not stop within 60 s on a restored earlier copy:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = relay.log_text();
    assert_eq!(status.code(), Some(1), "exit 1 on a restored copy:\n{log}");
    assert!(
        log.contains("went back in time") && log.contains("tombstone"),
        "the relay should say the database went back in time and name the tombstone fix:\n{log}"
    );
    assert_eq!(
        db.confirmed_flush_lsn().await,
        slot_before,
        "the refused relay must not confirm anything on the restored slot"
    );
    // Each event before and after the copy once; none of the restored database's new ones.
    let before_restore: Vec<Event> = first.iter().chain(&later).cloned().collect();
    expect_exactly_once(
        "restored copy, refused",
        &db,
        &before_restore,
        &restored,
        &log,
    )
    .await;

    // The fix the message names: a tombstone for the slot's progress key. The restored
    // database's events then arrive, each once. What the copy's slot had not confirmed is sent
    // again, as the message warns (before 17, PostgreSQL does not write a slot whose only
    // change is its confirmed position at shutdown, so the copy's slot may stand before the
    // first events); the events after the copy, which the restored database lacks, are not.
    let identity = {
        let client = db.client().await;
        let row = client
            .query_one(
                "SELECT system_identifier::text, current_database()::text FROM pg_control_system()",
                &[],
            )
            .await
            .unwrap();
        outbox_relay::sink::progress::SlotIdentity {
            system_identifier: row.get(0),
            database: row.get(1),
            slot: db.slot.clone(),
        }
    };
    let key = String::from_utf8_lossy(&identity.key()).into_owned();
    assert!(
        log.contains(&key),
        "the message should name the progress key {key}:\n{log}"
    );
    tombstone(&db.topic("progress"), &identity.key()).await;
    let mut relay = RelayProcess::start(&env, "eos-restore-reset");
    let all: Vec<Event> = before_restore.iter().chain(&restored).cloned().collect();
    let received = read_ids_committed(
        &topics,
        &ids(&all),
        Duration::from_secs(60),
        Duration::from_secs(3),
    )
    .await;
    let log = relay.log_text();
    let t = tally(&all, &received);
    assert!(
        t.missing.is_empty(),
        "after the tombstone: {} of {} events missing, e.g. {:?}\n{log}",
        t.missing.len(),
        all.len(),
        &t.missing[..t.missing.len().min(3)]
    );
    assert_eq!(t.unexpected, 0, "records of no test event");
    let mut count: HashMap<String, usize> = HashMap::new();
    for r in &received {
        *count.entry(r.key_str()).or_default() += 1;
    }
    let twice = |events: &[Event]| events.iter().filter(|e| count[&e.id] > 1).count();
    println!(
        "restored copy, after the tombstone: {} of {} first events sent again (after the copy's slot position), {} later, {} restored",
        twice(&first),
        first.len(),
        twice(&later),
        twice(&restored)
    );
    assert_eq!(
        twice(&restored),
        0,
        "the restored database's events: once each\n{log}"
    );
    assert_eq!(
        twice(&later),
        0,
        "the events after the copy: not sent again\n{log}"
    );
    assert!(relay.try_status().is_none(), "{log}");
    relay.terminate(Duration::from_secs(30));
}

/// Produces a tombstone (null value) for `key` to `topic`, as an operator would.
async fn tombstone(topic: &str, key: &[u8]) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .expect("producer");
    producer
        .send(
            FutureRecord::<[u8], [u8]>::to(topic).key(key),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .expect("produce the tombstone");
}
