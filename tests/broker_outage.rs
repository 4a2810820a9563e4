//! The Kafka broker goes away mid-stream. Kept in its own test binary: it stops the shared
//! broker, which would disturb tests running beside it (cargo runs binaries one at a time).

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Stops the broker; starts it again when dropped, also when the test panics, so that a
/// failure here does not leave the broker down.
struct BrokerOutage;

impl BrokerOutage {
    fn begin() -> BrokerOutage {
        services("kafka-stop");
        BrokerOutage
    }
}

impl Drop for BrokerOutage {
    fn drop(&mut self) {
        services("kafka-start");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_down_20s_loses_nothing_and_holds_the_slot() {
    let db = TestDb::new().await;
    db.create_slot().await;
    let mut relay = RelayProcess::start(&db.relay_env(), "broker_outage");
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
    let received = read_ids(
        &[topic],
        1,
        &all.iter().map(|e| e.id.clone()).collect::<Vec<_>>(),
        Duration::from_secs(180),
        Duration::from_secs(3),
    )
    .await;
    let t = tally(&all, &received);
    println!(
        "broker outage: {} events ({} written while down), {} missing, {} duplicates",
        all.len(),
        during.len(),
        t.missing.len(),
        t.duplicates
    );
    assert!(
        t.missing.is_empty(),
        "{} of {} events missing after the outage\n{}",
        t.missing.len(),
        all.len(),
        relay.log_text()
    );

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
