//! Decoding on a standby (PostgreSQL 16+, issue 22 done-when 4): the relay streams a slot made
//! on the physical standby of `scripts/services.sh pg-ha-start` while the events are written on
//! the primary. Five SIGKILLs of the relay lose nothing, and an idle outbox on a busy primary
//! still advances the standby's slot (the primary's `pg_log_standby_snapshot()` gives the
//! standby's decoder the running-transactions record it moves on).
//!
//! Exactly-once on a standby promoted in place (issue 39 point 5): the walsender goes on
//! decoding across the promotion, so the progress values the relay writes after it must carry
//! the new timeline; with the old one, the next session cuts them back to the switch point and
//! publishes again what Kafka already has.
//!
//! On a major below 16 the tests print why and pass without running;
//! `scripts/test-versions.sh` runs it on 17 with the failover tests.

use std::time::{Duration, Instant};

use crate::common::cluster::{query_text, with_db, HaPair};
use crate::common::*;

const KILLS: usize = 5;

fn pg_major() -> u32 {
    std::env::var("OUTBOX_TEST_PG_VERSION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15)
}

/// Creates the slot on the standby: creation waits for a running-transactions record from the
/// primary, which `pg_log_standby_snapshot()` writes at once.
async fn create_standby_slot(primary: &str, standby: &str, slot: &str) {
    let create = {
        let (standby, slot) = (standby.to_string(), slot.to_string());
        tokio::spawn(async move {
            query_text(
                &standby,
                &format!("SELECT lsn::text FROM pg_create_logical_replication_slot('{slot}', 'pgoutput')"),
            )
            .await
        })
    };
    let began = Instant::now();
    while !create.is_finished() {
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the slot on the standby was not created within 60 s"
        );
        let _ = query_text(primary, "SELECT pg_log_standby_snapshot()").await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lsn = create.await.unwrap();
    assert!(lsn.is_some(), "creating slot {slot} on the standby failed");
}

/// A fresh primary and standby (`pg-ha`), a test database on both and the test's slot on the
/// standby; `None` (the test prints why and passes) below PostgreSQL 16.
struct OnStandby {
    pair: HaPair,
    db: TestDb,
    /// The test database's URL on the primary.
    primary: String,
    /// The test database's URL on the standby.
    standby: String,
}

async fn on_a_fresh_standby() -> Option<OnStandby> {
    let major = pg_major();
    if major < 16 {
        println!("SKIPPED: decoding on a standby needs PostgreSQL 16+, this run has {major}; run scripts/test-versions.sh or OUTBOX_PG_VERSION=17 scripts/test.sh --test integration standby::");
        return None;
    }
    let pair = HaPair::fresh(&[]);
    let db = TestDb::new_on(&pair.primary).await;
    let primary = with_db(&pair.primary, &db.name);
    let standby = with_db(&pair.standby, &db.name);
    wait_for(
        "the database on the standby",
        Duration::from_secs(30),
        || async { query_text(&standby, "SELECT 1").await.is_some() },
    )
    .await;
    create_standby_slot(&primary, &standby, &db.slot).await;
    Some(OnStandby {
        pair,
        db,
        primary,
        standby,
    })
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_on_a_standby_survives_sigkills_and_advances_while_the_outbox_is_idle() {
    let Some(OnStandby {
        pair: _,
        db,
        primary,
        standby,
    }) = on_a_fresh_standby().await
    else {
        return;
    };
    let env = with(
        db.relay_env(),
        &[
            (
                "OUTBOX_RELAY__POSTGRES__URL",
                &format!("{standby}?target_session_attrs=standby"),
            ),
            ("OUTBOX_RELAY__POSTGRES__CREATE_SLOT", "false"),
            ("OUTBOX_RELAY__POSTGRES__CREATE_PUBLICATION", "false"),
            ("OUTBOX_RELAY__POSTGRES__FAILOVER_SLOT", "false"),
        ],
    );
    let mut client = connect(&primary).await;
    let mut events = Vec::new();
    let mut relay = RelayProcess::start(&env, &format!("standby_{}", db.name));
    // Each round writes on the primary while the relay streams from the standby, then kills
    // the relay mid-stream and starts the next.
    for round in 0..=KILLS {
        for seq in 0..10 {
            let batch: Vec<Event> = (0..10)
                .map(|i| Event::new("order", &format!("a{round}"), round, seq * 10 + i))
                .collect();
            insert_events(&mut client, &batch, true).await;
            events.extend(batch);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if round < KILLS {
            relay.kill9();
            relay = RelayProcess::start(&env, &format!("standby_{}", db.name));
        }
    }
    expect_all(
        &format!("decoding on a standby, {KILLS} SIGKILLs"),
        &[db.topic("order")],
        &events,
        Duration::from_secs(90),
        Duration::ZERO,
        &relay,
    )
    .await;

    // The outbox idles while the primary is busy elsewhere: the standby's slot must still
    // pass what the primary wrote.
    client
        .batch_execute("CREATE TABLE busy (id bigserial PRIMARY KEY, note text)")
        .await
        .unwrap();
    for _ in 0..20 {
        client
            .batch_execute("INSERT INTO busy (note) SELECT 'x' FROM generate_series(1, 100)")
            .await
            .unwrap();
    }
    let target: u64 = query_text(&primary, "SELECT (pg_current_wal_lsn() - '0/0')::bigint")
        .await
        .unwrap()
        .parse()
        .unwrap();
    let began = Instant::now();
    loop {
        let _ = query_text(&primary, "SELECT pg_log_standby_snapshot()").await;
        let now = confirmed(&standby, &db.slot).await.unwrap_or(0);
        if now >= target {
            println!(
                "idle outbox: the standby's slot passed the primary's WAL in {:?}",
                began.elapsed()
            );
            break;
        }
        if let Some(status) = relay.try_status() {
            panic!("relay exited with {status}:\n{}", relay.log_text());
        }
        assert!(
            began.elapsed() < Duration::from_secs(60),
            "the standby's slot stayed at {now} below {target} for 60 s while the outbox idled:\n{}",
            relay.log_text()
        );
        client
            .batch_execute("INSERT INTO busy (note) VALUES ('tick')")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let log = relay.log_text();
    assert!(
        !log.contains("cannot sample the slot"),
        "the slot's lag could not be sampled on the standby:\n{log}"
    );
    assert!(relay.terminate(Duration::from_secs(30)).success());
    let _ = query_text(
        &standby,
        &format!("SELECT pg_drop_replication_slot('{}')", db.slot),
    )
    .await;
    db.cleanup().await;
    services("pg-ha-stop");
}

/// The timeline `url`'s server writes on now (a primary: the one of its current WAL file).
async fn current_timeline(url: &str) -> u32 {
    let file = query_text(url, "SELECT pg_walfile_name(pg_current_wal_lsn())")
        .await
        .expect("the WAL file name of a primary");
    u32::from_str_radix(&file[..8], 16).expect("a WAL file name starts with its timeline")
}

/// The timeline of the last progress value on `topic` (read_committed).
async fn last_progress_timeline(topic: &str) -> Option<u64> {
    let records = read_until(
        &[topic.to_string()],
        1,
        Duration::from_secs(10),
        Duration::from_millis(500),
        |_| true,
    )
    .await;
    let last = records.last()?;
    let value: serde_json::Value = serde_json::from_slice(last.payload.as_deref()?).ok()?;
    value["timeline"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_once_on_a_standby_promoted_mid_stream_publishes_each_event_once() {
    let Some(OnStandby {
        pair,
        db,
        primary,
        standby,
    }) = on_a_fresh_standby().await
    else {
        return;
    };
    // No target_session_attrs: the restart below finds the same server promoted. A status
    // update every 20 s (the first at the start; the relay keeps it under a third of
    // wal_sender_timeout) and a new position confirmed 20 s late, so the kill leaves every transaction since the promotion
    // unconfirmed: the next session is sent them again and must skip them all.
    for sql in [
        "ALTER SYSTEM SET wal_sender_timeout = '90s'",
        "SELECT pg_reload_conf()",
    ] {
        query_text(&pair.standby, sql).await;
    }
    let env = with(
        exactly_once_env(&db),
        &[
            ("OUTBOX_RELAY__POSTGRES__URL", standby.as_str()),
            ("OUTBOX_RELAY__POSTGRES__CREATE_SLOT", "false"),
            ("OUTBOX_RELAY__POSTGRES__CREATE_PUBLICATION", "false"),
            ("OUTBOX_RELAY__POSTGRES__FAILOVER_SLOT", "false"),
            ("OUTBOX_RELAY__POSTGRES__STATUS_INTERVAL_MS", "20000"),
            ("OUTBOX_RELAY__RELAY__CONFIRM_DELAY_MS", "20000"),
        ],
    );
    let order = db.topic("order");
    let log_name = format!("standby_promoted_{}", db.name);
    let mut relay = RelayProcess::start(&env, &log_name);
    let mut events = Vec::new();
    // Written on `url`, 10 transactions of 10, then read back (read_committed) before going on.
    let mut round = |url: String, writer: usize| {
        let order = order.clone();
        let ids_before = events.len();
        let batch: Vec<Event> = (0..100)
            .map(|i| Event::new("order", &format!("a{writer}"), writer, i))
            .collect();
        events.extend(batch.clone());
        let all: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
        async move {
            let mut client = connect(&url).await;
            for txn in batch.chunks(10) {
                insert_events(&mut client, txn, true).await;
            }
            let got =
                read_ids_committed(&[order], &all, Duration::from_secs(90), Duration::ZERO).await;
            assert!(
                got.len() >= all.len(),
                "writer {writer}: {} of {} events arrived ({ids_before} before this round)",
                got.len(),
                all.len()
            );
        }
    };
    round(primary.clone(), 0).await;
    let before = current_timeline(&primary).await;
    services("pg-ha-promote");
    let after = current_timeline(&standby).await;
    assert!(after > before, "the promotion started no new timeline");
    // The relay streams on across the promotion; what it decodes now lies on `after`.
    round(standby.clone(), 1).await;
    assert!(relay.try_status().is_none(), "{}", relay.log_text());
    let timeline = last_progress_timeline(&db.topic("progress")).await;
    relay.kill9();
    relay = RelayProcess::start(&env, &log_name);
    round(standby.clone(), 2).await;
    expect_exactly_once(
        "a standby promoted mid-stream, then a SIGKILL",
        &db,
        &events,
        &[],
        &relay.log_text(),
    )
    .await;
    let log = relay.log_text();
    assert_eq!(
        timeline,
        Some(u64::from(after)),
        "the last progress value before the kill lies past the switch point, on timeline {after}:\n{log}"
    );
    assert!(
        log.contains("skipped=true"),
        "the restart had nothing to skip: the test proved nothing\n{log}"
    );
    assert!(relay.terminate(Duration::from_secs(30)).success(), "{log}");
    db.cleanup().await;
    services("pg-ha-stop");
}
