//! High availability: several hosts in `postgres.url`, `target_session_attrs`, and a primary
//! failover (the primary crashed with `pg_ctl -m immediate`, its physical standby promoted)
//! with and without a failover slot.
//!
//! The failover tests need the primary/standby pair of `scripts/services.sh pg-ha-start` and
//! PostgreSQL 17+ (failover slots); on an older major they print why and pass without running.
//! `scripts/test-versions.sh` runs them on 17. They share that one pair, so they take a lock.

use std::collections::HashSet;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::cluster::{query_text, with_db, HaPair};
use crate::common::*;
use tokio::sync::Mutex;
use tokio_postgres::NoTls;

/// One failover test at a time: they share the pg-ha pair.
static HA: Mutex<()> = Mutex::const_new(());

fn pg_major() -> u32 {
    std::env::var("OUTBOX_TEST_PG_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15)
}

/// True (after printing why) when this test cannot run here.
fn skip_unless_17(test: &str) -> bool {
    let major = pg_major();
    if major < 17 {
        println!("SKIPPED {test}: needs PostgreSQL 17+ (failover slots), this run has {major}; run scripts/test-versions.sh or OUTBOX_PG_VERSION=17 scripts/test.sh --test integration failover::");
        return true;
    }
    false
}

/// A fresh pg-ha pair whose failover slots are synced only when a test says so.
fn fresh_pair() -> HaPair {
    HaPair::fresh(&[("OUTBOX_PG_HA_SLOT_SYNC", "manual")])
}

/// `postgres://user@h1:p1,h2:p2/db?target_session_attrs=…` from single-host URLs.
fn multi_host(urls: &[&str], db: &str, attrs: &str) -> String {
    let split = |u: &str| {
        let rest = u.split_once("://").unwrap().1;
        let (auth, hostdb) = rest.split_once('@').unwrap();
        let host = hostdb.split('/').next().unwrap().to_string();
        (auth.to_string(), host)
    };
    let auth = split(urls[0]).0;
    let hosts: Vec<String> = urls.iter().map(|u| split(u).1).collect();
    format!(
        "postgres://{auth}@{}/{db}?target_session_attrs={attrs}",
        hosts.join(",")
    )
}

fn relay_env_with(db: &TestDb, url: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut env = db.relay_env();
    for (k, v) in env.iter_mut() {
        if k == "OUTBOX_RELAY__POSTGRES__URL" {
            *v = url.to_string();
        }
    }
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

/// What the writers committed: the events PostgreSQL acknowledged, each with the WAL insert
/// position read right after its commit (an upper bound of the commit's end).
#[derive(Default)]
struct Written {
    acked: Vec<(Event, u64)>,
    /// Events whose commit had no answer (the primary crashed): they may or may not exist.
    unknown: HashSet<String>,
}

/// `writers` writers, each writing transactions of 1 to 5 events through `url` (read-write:
/// they follow the promotion) until `stop`; a writer whose connection breaks reconnects.
async fn write_through(
    url: String,
    db: String,
    writers: usize,
    stop: Arc<AtomicBool>,
    pause: Arc<AtomicBool>,
) -> Written {
    let mut tasks = Vec::new();
    for w in 0..writers {
        let url = url.clone();
        let stop = stop.clone();
        let pause = pause.clone();
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Written::default();
            let give_up = Instant::now() + Duration::from_secs(180);
            let mut client = None;
            let mut txn = 0usize;
            while !stop.load(Relaxed) && Instant::now() < give_up {
                if pause.load(Relaxed) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                if client.is_none() {
                    match tokio_postgres::connect(&url, NoTls).await {
                        Ok((c, conn)) => {
                            tokio::spawn(conn);
                            client = Some(c);
                        }
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    }
                }
                let c = client.as_mut().unwrap();
                let n = 1 + txn % 5;
                let kind = if txn % 2 == 0 { "order" } else { "customer" };
                let batch: Vec<Event> = (0..n)
                    .map(|i| Event::new(kind, &format!("{db}-w{w}-{txn}"), w, out.acked.len() + i))
                    .collect();
                txn += 1;
                match insert_and_commit(c, &batch).await {
                    Ok(after) => out.acked.extend(batch.into_iter().map(|e| (e, after))),
                    Err(committed_unknown) => {
                        if committed_unknown {
                            out.unknown.extend(batch.into_iter().map(|e| e.id));
                        }
                        client = None;
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            out
        }));
    }
    let mut all = Written::default();
    for t in tasks {
        let w = t.await.unwrap();
        all.acked.extend(w.acked);
        all.unknown.extend(w.unknown);
    }
    all
}

/// Inserts and commits; `Ok(WAL position after the commit)`, or `Err(true)` when the COMMIT
/// itself got no answer (outcome unknown), `Err(false)` when nothing was committed.
async fn insert_and_commit(c: &mut tokio_postgres::Client, batch: &[Event]) -> Result<u64, bool> {
    let tx = c.transaction().await.map_err(|_| false)?;
    for e in batch {
        tx.execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES ($1::text::uuid, $2, $3, $4, $5::text::jsonb)",
            &[&e.id, &e.aggregate_type, &e.aggregate_id, &e.event_type, &e.payload],
        )
        .await
        .map_err(|_| false)?;
    }
    tx.commit().await.map_err(|_| true)?;
    let row = c
        .query_one("SELECT (pg_current_wal_insert_lsn() - '0/0')::bigint", &[])
        .await
        .map_err(|_| false)?;
    Ok(row.get::<_, i64>(0) as u64)
}

/// Makes the standby's copy of the slot synced and persistent (manual slot sync).
async fn sync_slot(pair: &HaPair, db: &TestDb) {
    let primary = with_db(&pair.primary, &db.name);
    let standby = with_db(&pair.standby, &db.name);
    let sql = format!(
        "SELECT (synced AND NOT temporary)::text FROM pg_replication_slots WHERE slot_name = '{}'",
        db.slot
    );
    wait_for(
        "the failover slot to be synced and persistent on the standby",
        Duration::from_secs(60),
        || async {
            let _ = query_text(&primary, "SELECT pg_log_standby_snapshot()").await;
            let _ = query_text(&standby, "SELECT pg_sync_replication_slots()").await;
            query_text(&standby, &sql).await.as_deref() == Some("true")
        },
    )
    .await;
}

/// The slot's confirmed position on `url`, as a number.
async fn confirmed(url: &str, slot: &str) -> Option<u64> {
    query_text(
        url,
        &format!("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    )
    .await
    .and_then(|t| t.parse().ok())
}

/// Waits until the outbox holds more than `rows` rows and `slot` confirmed the WAL insert
/// position read then, so that the writers' first transactions are confirmed (the slot's
/// position alone is not: a new slot has one before anything is written). Returns the
/// confirmed position.
async fn confirmed_past_rows(url: &str, slot: &str, rows: u64) -> u64 {
    wait_for(
        "the writers' first rows",
        Duration::from_secs(60),
        || async {
            query_text(url, "SELECT count(*) FROM outbox")
                .await
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
                > rows
        },
    )
    .await;
    let target = wal_insert_lsn(&connect(url).await).await;
    wait_for(
        "the relay to confirm the first rows",
        Duration::from_secs(60),
        || async { confirmed(url, slot).await.unwrap_or(0) >= target },
    )
    .await;
    confirmed(url, slot).await.expect("the slot's position")
}

/// Runs `outbox-relay <cmd>` with `env`; stdout and stderr.
fn command(env: &[(String, String)], cmd: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg(cmd)
        .envs(env.iter().cloned())
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn topics(db: &TestDb) -> Vec<String> {
    vec![db.topic("order"), db.topic("customer")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn promotion_with_a_synchronized_failover_slot_loses_nothing() {
    if skip_unless_17("promotion_with_a_synchronized_failover_slot_loses_nothing") {
        return;
    }
    let _ha = HA.lock().await;
    let pair = fresh_pair();
    let db = TestDb::new_on(&pair.primary).await;
    // The standby first: read-write must skip it until it is promoted.
    let url = multi_host(&[&pair.standby, &pair.primary], &db.name, "read-write");
    let mut relay = RelayProcess::start(&relay_env_with(&db, &url, &[]), "failover_synced");
    wait_for_slot(&db, &mut relay).await;
    let stop = Arc::new(AtomicBool::new(false));
    let pause = Arc::new(AtomicBool::new(false));
    let writers = tokio::spawn(write_through(
        url.clone(),
        db.name.clone(),
        8,
        stop.clone(),
        pause.clone(),
    ));

    // Mid-stream: the slot is a failover slot, synced to the standby; then the crash.
    let primary_db = with_db(&pair.primary, &db.name);
    confirmed_past_rows(&primary_db, &db.slot, 600).await;
    let failover = query_text(
        &primary_db,
        &format!(
            "SELECT failover::text FROM pg_replication_slots WHERE slot_name = '{}'",
            db.slot
        ),
    )
    .await;
    assert_eq!(
        failover.as_deref(),
        Some("true"),
        "the relay creates a failover slot on 17+"
    );
    // A manual slot sync keeps a not yet sync-ready copy only for the call, and with writers
    // always running the remote slot's restart_lsn never passes the standby's position at the
    // call: pause them while the copy becomes persistent. They resume before the crash.
    pause.store(true, Relaxed);
    sync_slot(&pair, &db).await;
    pause.store(false, Relaxed);
    // `check` sees the failover set-up on both hosts; `status` shows the slot's flags.
    let env = relay_env_with(&db, &url, &[]);
    let check = command(&env, "check");
    for line in [
        "postgres version",
        "failover slot",
        "is a failover slot",
        "synchronized_standby_slots",
        "keeps a synchronized, persistent copy of slot",
        // The test syncs by hand (pg_sync_replication_slots), with the worker off.
        "sync_replication_slots = 'off' (needs 'on')",
    ] {
        assert!(check.contains(line), "check should say `{line}`:\n{check}");
    }
    let status = command(&env, "status");
    assert!(status.contains("failover      yes"), "{status}");
    let count = |url: String| async move {
        query_text(&url, "SELECT count(*) FROM outbox")
            .await
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0)
    };
    let synced_at = count(primary_db.clone()).await;
    wait_for(
        "writers to go on after the sync",
        Duration::from_secs(60),
        || {
            let c = count(primary_db.clone());
            async move { c.await >= synced_at + 400 }
        },
    )
    .await;
    let before_crash = count(primary_db.clone()).await;
    services("pg-ha-crash");
    services("pg-ha-promote");
    // The writers go on on the promoted standby.
    let promoted_db = with_db(&pair.standby, &db.name);
    wait_for(
        "800 more events written on the promoted standby",
        Duration::from_secs(120),
        || async {
            query_text(&promoted_db, "SELECT count(*) FROM outbox")
                .await
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0)
                >= before_crash + 800
        },
    )
    .await;
    stop.store(true, Relaxed);
    let written = writers.await.unwrap();
    let acked: Vec<Event> = written.acked.iter().map(|(e, _)| e.clone()).collect();
    let (_, t) = expect_all(
        "failover with a synchronized slot",
        &topics(&db),
        &acked,
        Duration::from_secs(180),
        Duration::from_secs(3),
        &relay,
    )
    .await;
    println!(
        "failover: {} acknowledged events ({before_crash} before the crash), {} of unknown outcome, 0 missing, {} duplicates",
        acked.len(),
        written.unknown.len(),
        t.duplicates
    );
    assert!(
        relay.try_status().is_none(),
        "the relay must keep running:\n{}",
        relay.log_text()
    );
    let standby_target = pair
        .standby
        .split('@')
        .nth(1)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    assert!(
        relay
            .log_text()
            .contains(&format!("server={standby_target}")),
        "the relay should stream from the promoted standby {standby_target}:\n{}",
        relay.log_text()
    );
    relay.terminate(Duration::from_secs(30));
    services("pg-ha-reset");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn promotion_without_a_failover_slot_stops_with_exit_3() {
    if skip_unless_17("promotion_without_a_failover_slot_stops_with_exit_3") {
        return;
    }
    let _ha = HA.lock().await;
    let pair = fresh_pair();
    let db = TestDb::new_on(&pair.primary).await;
    let url = multi_host(&[&pair.primary, &pair.standby], &db.name, "read-write");
    let env = relay_env_with(
        &db,
        &url,
        &[("OUTBOX_RELAY__POSTGRES__FAILOVER_SLOT", "false")],
    );
    let mut relay = RelayProcess::start(&env, "failover_no_slot");
    wait_for_slot(&db, &mut relay).await;
    let stop = Arc::new(AtomicBool::new(false));
    let pause = Arc::new(AtomicBool::new(false));
    let writers = tokio::spawn(write_through(
        url.clone(),
        db.name.clone(),
        8,
        stop.clone(),
        pause.clone(),
    ));

    let primary_db = with_db(&pair.primary, &db.name);
    let last_confirmed = confirmed_past_rows(&primary_db, &db.slot, 500).await;
    services("pg-ha-crash");
    services("pg-ha-promote");

    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = relay.try_status() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the relay did not stop after the failover:\n{}",
            relay.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log = relay.log_text();
    assert_eq!(
        status.code(),
        Some(3),
        "exit code 3 (events may be missing):\n{log}"
    );
    assert!(
        log.contains("may be missing") && log.contains("outbox-relay replay"),
        "recovery message:\n{log}"
    );
    // Restarted (as an orchestrator would), it still refuses: the mark in the publication's
    // comment came over with the promoted standby; no new slot is created silently.
    let mut again = RelayProcess::start(&env, "failover_no_slot_restarted");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = again.try_status() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted relay did not stop:\n{}",
            again.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        status.code(),
        Some(3),
        "restarted: exit 3\n{}",
        again.log_text()
    );
    let standby_db = with_db(&pair.standby, &db.name);
    let slot_sql = format!(
        "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{}'",
        db.slot
    );
    assert_eq!(
        query_text(&standby_db, &slot_sql).await.as_deref(),
        Some("0"),
        "no slot may be recreated silently"
    );
    stop.store(true, Relaxed);
    let written = writers.await.unwrap();
    // Everything the old primary's slot confirmed was acknowledged by Kafka.
    let covered: Vec<Event> = written
        .acked
        .iter()
        .filter(|(_, after)| *after <= last_confirmed)
        .map(|(e, _)| e.clone())
        .collect();
    assert!(
        !covered.is_empty(),
        "no event confirmed before the crash (confirmed {last_confirmed})"
    );
    expect_all(
        "confirmed before the failover",
        &topics(&db),
        &covered,
        Duration::from_secs(60),
        Duration::from_secs(1),
        &relay,
    )
    .await;
    println!(
        "no failover slot: exit 3; {} events confirmed before the crash all in Kafka; {} written in all",
        covered.len(),
        written.acked.len()
    );
    services("pg-ha-reset");
}

/// The first host is down: the relay and an operator command use the second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_host_down_the_relay_and_commands_use_the_second() {
    let db = TestDb::new().await;
    // 127.0.0.1:1 refuses connections.
    let (auth, rest) = db.url.split_once('@').unwrap();
    let host = rest.split('/').next().unwrap();
    let url = format!("{auth}@127.0.0.1:1,{host}/{}", db.name);
    let env = relay_env_with(&db, &url, &[]);
    let mut relay = RelayProcess::start(&env, "first_host_down");
    wait_for_slot(&db, &mut relay).await;
    let events: Vec<Event> = (0..50).map(|i| Event::new("order", "a", 0, i)).collect();
    insert_events(&mut db.client().await, &events, true).await;
    expect_all(
        "first host down",
        &[db.topic("order")],
        &events,
        Duration::from_secs(60),
        Duration::from_secs(1),
        &relay,
    )
    .await;

    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("status")
        .envs(env.iter().cloned())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "status with the first host down: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(&format!("slot `{}`", db.slot)), "{stdout}");
    relay.terminate(Duration::from_secs(30));

    // Nothing reachable: the error names every host and why.
    let none = format!("{auth}@127.0.0.1:1,127.0.0.1:2/{}", db.name);
    let env = relay_env_with(&db, &none, &[]);
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .arg("status")
        .envs(env.iter().cloned())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success());
    assert!(
        text.contains("127.0.0.1:1") && text.contains("127.0.0.1:2"),
        "both hosts named: {text}"
    );
    db.cleanup().await;
}

/// Each statement on `url`, one by one (ALTER SYSTEM runs in no transaction block), panicking
/// with the error: the test's own set-up steps.
async fn execute(url: &str, statements: &[&str]) {
    let client = connect(url).await;
    for sql in statements {
        client
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("`{sql}` on {url}: {e:?}"));
    }
}

/// Writes `n` events through `url` in transactions of 5; returns them and, per transaction,
/// the WAL insert position before its COMMIT (a lower bound of its commit LSN, an upper bound
/// of the previous one's end).
async fn write_events(url: &str, tag: &str, writer: usize, n: usize) -> (Vec<Event>, Vec<u64>) {
    let mut client = connect(url).await;
    let mut events = Vec::new();
    let mut commits = Vec::new();
    for txn in 0..n.div_ceil(5) {
        let kind = if txn % 2 == 0 { "order" } else { "customer" };
        let batch: Vec<Event> = (0..5.min(n - events.len()))
            .map(|i| Event::new(kind, &format!("{tag}-{txn}"), writer, events.len() + i))
            .collect();
        commits.push(insert_events_at(&mut client, &batch, true).await);
        events.extend(batch);
    }
    (events, commits)
}

/// Issue 20, done-when 4 (failover): an exactly-once relay on a failover slot whose standby
/// replicates asynchronously and without `synchronized_standby_slots`. The standby is cut off,
/// the relay publishes transactions it will never have (its progress record goes past the
/// fork), the primary crashes and the standby is promoted onto timeline 2, which commits new
/// transactions at LSNs the old progress value already covers. The relay reads the timeline
/// history, holds the old value only up to the fork, and publishes every event of the
/// surviving history exactly once; the lost transactions' events stay in Kafka (once).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_across_an_asynchronous_promotion_publishes_the_new_timeline_once() {
    let test = "exactly_once_across_an_asynchronous_promotion_publishes_the_new_timeline_once";
    if skip_unless_17(test) {
        return;
    }
    let _ha = HA.lock().await;
    let pair = fresh_pair();
    // services.sh makes the pair synchronous with synchronized_standby_slots (written into
    // outbox-relay.conf at every start); postgresql.auto.conf is read after it, so ALTER
    // SYSTEM turns both off for this pair (pg-ha-reset deletes it afterwards).
    execute(
        &pair.primary,
        &[
            "ALTER SYSTEM SET synchronous_standby_names = ''",
            "ALTER SYSTEM SET synchronized_standby_slots = ''",
            "SELECT pg_reload_conf()",
        ],
    )
    .await;
    wait_for(
        "the primary to run without synchronized_standby_slots",
        Duration::from_secs(10),
        || async {
            query_text(&pair.primary, "SHOW synchronized_standby_slots")
                .await
                .as_deref()
                == Some("")
        },
    )
    .await;
    let db = TestDb::new_on(&pair.primary).await;
    let url = multi_host(&[&pair.primary, &pair.standby], &db.name, "read-write");
    let env = with(
        exactly_once_env(&db),
        &[("OUTBOX_RELAY__POSTGRES__URL", url.as_str())],
    );
    let check = command(&env, "check");
    assert!(
        check.contains("synchronized_standby_slots"),
        "check should warn about synchronized_standby_slots:\n{check}"
    );
    let mut relay = RelayProcess::start(&env, "failover_exactly_once_async");
    wait_for_slot(&db, &mut relay).await;
    let primary_db = with_db(&pair.primary, &db.name);
    let standby_db = with_db(&pair.standby, &db.name);

    // Timeline 1, on both servers: published, then the slot synced to the standby.
    let (before, _) = write_events(&primary_db, "tl1", 0, 200).await;
    let topics = topics(&db);
    let got = read_ids_committed(
        &topics,
        &ids(&before),
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    assert!(
        tally(&before, &got).missing.is_empty(),
        "timeline 1 events not published:\n{}",
        relay.log_text()
    );
    let published_to = db_wal(&primary_db).await;
    wait_for(
        "the relay to confirm timeline 1's events",
        Duration::from_secs(60),
        || async { confirmed(&primary_db, &db.slot).await.unwrap_or(0) >= published_to },
    )
    .await;
    sync_slot(&pair, &db).await;

    // The standby stops receiving WAL: what the primary commits now is lost at the failover.
    execute(
        &pair.standby,
        &[
            "ALTER SYSTEM SET primary_conninfo = ''",
            "SELECT pg_reload_conf()",
        ],
    )
    .await;
    wait_for(
        "the standby's walreceiver to stop",
        Duration::from_secs(30),
        || async {
            query_text(
                &pair.primary,
                "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'pg-ha-standby'",
            )
            .await
            .as_deref()
                == Some("0")
        },
    )
    .await;
    let (lost, lost_commits) = write_events(&primary_db, "lost", 1, 300).await;
    let got = read_ids_committed(
        &topics,
        &ids(&lost),
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    assert!(
        tally(&lost, &got).missing.is_empty(),
        "the events the standby never got were not published (the progress must pass the fork):\n{}",
        relay.log_text()
    );
    // The last lost transaction commits at or after this: the old progress value is past it.
    let old_progress = *lost_commits.last().unwrap();

    services("pg-ha-crash");
    services("pg-ha-promote");
    execute(&pair.standby, &["CHECKPOINT"]).await;
    assert_eq!(
        query_text(
            &pair.standby,
            "SELECT timeline_id::text FROM pg_control_checkpoint()"
        )
        .await
        .as_deref(),
        Some("2"),
        "the promoted standby should be on timeline 2"
    );
    // Timeline 2: new transactions at LSNs the old primary's progress value covers.
    let (after, commits) = write_events(&standby_db, "tl2", 2, 200).await;
    // Timeline 2's first transaction ends before its second one's COMMIT.
    assert!(
        commits[1] < old_progress,
        "timeline 2's first transaction (ends before {:#x}) should lie below the old primary's progress (at least {old_progress:#x}), or a relay that skipped by the stale value would pass",
        commits[1]
    );

    // What survived is what the new primary has: timeline 1's first events and timeline 2's.
    let survivors: HashSet<String> = connect(&standby_db)
        .await
        .query("SELECT id::text FROM outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let expected: HashSet<String> = ids(&before).into_iter().chain(ids(&after)).collect();
    assert_eq!(
        survivors, expected,
        "the new primary should have timeline 1's events before the cut and timeline 2's, none of the lost ones"
    );
    let surviving: Vec<Event> = before.iter().chain(&after).cloned().collect();
    let received = read_ids_committed(
        &topics,
        &ids(&surviving),
        Duration::from_secs(120),
        Duration::from_secs(5),
    )
    .await;
    let t = tally(&surviving, &received);
    let lost_ids: HashSet<String> = ids(&lost).into_iter().collect();
    let unexpected: Vec<String> = received
        .iter()
        .map(Received::key_str)
        .filter(|k| !expected.contains(k) && !lost_ids.contains(k))
        .collect();
    println!(
        "asynchronous promotion: {} surviving events, {} missing, {} duplicates; {} lost with timeline 1 (in Kafka, once)",
        surviving.len(),
        t.missing.len(),
        t.duplicates,
        lost.len()
    );
    let log = relay.log_text();
    assert!(
        t.missing.is_empty(),
        "{} of {} surviving events missing, e.g. {:?}\n{log}",
        t.missing.len(),
        surviving.len(),
        &t.missing[..t.missing.len().min(3)]
    );
    assert_eq!(
        t.duplicates, 0,
        "duplicates for a read_committed consumer:\n{log}"
    );
    assert!(
        unexpected.is_empty(),
        "records of no test event: {unexpected:?}"
    );
    assert!(
        log.contains("lies past the point where this server left its timeline"),
        "the relay should say it held the progress value up to the fork:\n{log}"
    );
    assert!(
        relay.try_status().is_none(),
        "the relay must keep running:\n{log}"
    );
    relay.terminate(Duration::from_secs(30));
    services("pg-ha-reset");
}

fn ids(events: &[Event]) -> Vec<String> {
    events.iter().map(|e| e.id.clone()).collect()
}

/// A WAL position at or after every commit so far on `url` (see `TestDb::current_wal_lsn`).
async fn db_wal(url: &str) -> u64 {
    let client = connect(url).await;
    client
        .batch_execute("SET synchronous_commit = on; SELECT txid_current()")
        .await
        .unwrap();
    let lsn: i64 = client
        .query_one("SELECT (pg_current_wal_lsn() - '0/0')::bigint", &[])
        .await
        .unwrap()
        .get(0);
    lsn as u64
}
