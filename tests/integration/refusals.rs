//! No single row, topic or limit stops the stream (issue 50): the edges of the one fault
//! model (`sink::fault`), as a user's set-up meets them, against the real broker. Each test
//! counts what matters: healthy events missing or dead-lettered, what the row at fault
//! became, per-aggregate order, the slot moved past the row, the relay still running.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::*;

/// Rows of `outbox` whose payload is `{"n": n, "blob": <hex of about `hex_bytes`>}` (random,
/// different per row: compression cannot shrink a batch below a limit), all in one
/// transaction: `(id, aggregate)` in order. `dest`, when given, is the row's `dest` column
/// (the table must have one).
async fn insert(
    client: &tokio_postgres::Client,
    rows: &[(String, String, usize, Option<&str>)],
    hex_bytes: usize,
) {
    let chunks = hex_bytes.div_ceil(32) as i32;
    let ids: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let aggregates: Vec<String> = rows.iter().map(|r| r.1.clone()).collect();
    let ns: Vec<i64> = rows.iter().map(|r| r.2 as i64).collect();
    let dests: Vec<Option<String>> = rows.iter().map(|r| r.3.map(String::from)).collect();
    let has_dest = dests.iter().any(Option::is_some);
    let (dest_col, dest_val) = if has_dest {
        (", dest", ", d")
    } else {
        ("", "")
    };
    let sql = format!(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload{dest_col})
         SELECT i::uuid, 'order', a, 'Happened', jsonb_build_object('n', n, 'blob',
           (SELECT string_agg(md5(random()::text || g || i), '') FROM generate_series(1, $5) g))
           {dest_val}
         FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[]) AS u(i, a, n, d)"
    );
    client
        .execute(sql.as_str(), &[&ids, &aggregates, &ns, &dests, &chunks])
        .await
        .unwrap();
}

/// Reads `topics` until every id in `ids` arrived (by the `id` header: the key may be the
/// aggregate's), then for `settle` more.
async fn read_by_id(
    topics: &[String],
    ids: &[String],
    timeout: Duration,
    settle: Duration,
) -> Vec<Received> {
    let mut waiting: HashSet<String> = ids.iter().cloned().collect();
    read_until(topics, 1, timeout, settle, move |r| {
        if let Some(id) = r.header("id") {
            waiting.remove(id);
        }
        waiting.is_empty()
    })
    .await
}

/// What arrived of `healthy`: how many are missing, and how many events reached the topic
/// after a later event of their own aggregate (the first time each was seen; re-sends of what
/// was seen are at-least-once's).
fn count(healthy: &[String], got: &[Received]) -> (usize, usize) {
    let mut seen = HashSet::new();
    let mut newest: HashMap<String, i64> = HashMap::new();
    let mut out_of_order = 0;
    let mut records: Vec<&Received> = got.iter().collect();
    records.sort_by_key(|r| (r.partition, r.offset));
    for r in records {
        let Some(id) = r.header("id") else { continue };
        if !seen.insert(id.to_string()) {
            continue;
        }
        let aggregate = r.header("aggregateid").unwrap_or("").to_string();
        let value: serde_json::Value =
            serde_json::from_slice(r.payload.as_deref().unwrap_or_default()).unwrap();
        let n = value["n"].as_i64().unwrap();
        let last = newest.entry(aggregate).or_insert(i64::MIN);
        if n < *last {
            out_of_order += 1;
        }
        *last = (*last).max(n);
    }
    let missing = healthy.iter().filter(|id| !seen.contains(*id)).count();
    (missing, out_of_order)
}

/// What every test here ends with: the slot confirmed past `end` (past the row at fault too),
/// the relay still running; then it stops cleanly.
async fn assert_the_stream_went_on(db: TestDb, mut relay: RelayProcess, end: u64) {
    wait_for(
        "the slot confirmed past every event",
        Duration::from_secs(30),
        || async { db.confirmed_flush_lsn().await >= end },
    )
    .await;
    let log = relay.log_text();
    assert!(relay.try_status().is_none(), "the relay stopped\n{log}");
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

/// Everything in `topic` now (read for 2 s).
async fn read_all(topic: &str) -> Vec<Received> {
    let topics = [topic.to_string()];
    read_until(&topics, 1, Duration::from_secs(2), Duration::ZERO, |_| {
        false
    })
    .await
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// `key_column = "aggregateid"` (what `config --from-debezium` writes for Debezium's usual
/// set-up) and a topic limit of 20,000 bytes: one 30 KB event of `agg-1` is its own fault and
/// dead-lettered — and the 50 healthy events of `agg-1` written after it are published, not
/// dead-lettered unsent because they share its key (the refusal memory was keyed by
/// `(topic, key)`: 50 of 100 healthy ones were dead-lettered).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_oversized_event_keyed_by_its_aggregate_dead_letters_only_itself() {
    let db = TestDb::new().await;
    let (topic, dlq) = (db.topic("order"), format!("{}.dlq", db.topic_prefix));
    create_topic_with(&topic, 1, &[("max.message.bytes", "20000")]).await;
    create_topic(&dlq, 1).await;
    db.create_slot().await;
    let client = db.client().await;
    let big = new_id();
    insert(&client, &[(big.clone(), "agg-1".into(), 0, None)], 30_000).await;
    let env = with(
        db.relay_env(),
        &[
            ("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str()),
            ("OUTBOX_RELAY__OUTBOX__KEY_COLUMN", "aggregateid"),
        ],
    );
    let relay = RelayProcess::start(&env, "refusals_key_column");
    // The big one is judged first (its dead letter is there), then the healthy ones come.
    let dead = read_by_id(
        std::slice::from_ref(&dlq),
        std::slice::from_ref(&big),
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    assert!(
        dead.iter().any(|r| r.header("id") == Some(big.as_str())),
        "the 30 KB event was not dead-lettered\n{}",
        relay.log_text()
    );
    let mut healthy = Vec::new();
    for round in 0..5 {
        let rows: Vec<_> = (0..20)
            .map(|i| {
                let aggregate = if i % 2 == 0 { "agg-1" } else { "agg-2" };
                (new_id(), aggregate.to_string(), 1 + round * 20 + i, None)
            })
            .collect();
        healthy.extend(rows.iter().map(|r| r.0.clone()));
        insert(&client, &rows, 500).await;
    }
    let end = db.current_wal_lsn().await;
    let got = read_by_id(
        std::slice::from_ref(&topic),
        &healthy,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await;
    let dead = read_all(&dlq).await;
    let log = relay.log_text();
    let (missing, out_of_order) = count(&healthy, &got);
    let healthy_dead = dead
        .iter()
        .filter(|r| r.header("id") != Some(big.as_str()))
        .count();
    eprintln!(
        "key_column = aggregateid, 20,000-byte topic: {missing} of {} healthy missing, \
         {healthy_dead} healthy dead-lettered, {out_of_order} out of order",
        healthy.len()
    );
    assert_eq!(healthy_dead, 0, "healthy events dead-lettered\n{log}");
    assert_eq!(missing, 0, "healthy events missing\n{log}");
    assert_eq!(out_of_order, 0, "per-aggregate order broken\n{log}");
    assert!(
        !got.iter().any(|r| r.header("id") == Some(big.as_str())),
        "the oversized event was published"
    );
    assert_the_stream_went_on(db, relay, end).await;
}

/// A dead-letter topic with a 16 KiB limit, and one transaction carrying 20 rows whose
/// routing names an invalid topic among 50 healthy ones: the dead letters' batch is refused
/// as too large — the batch's fault, not theirs — so the limit is learned and they go again
/// in batches that fit. All 20 dead letters kept, all 50 healthy published, the relay up (it
/// stopped, "this needs an operator", with none of them kept and none published).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_topic_smaller_than_a_burst_of_dead_letters_keeps_them_all() {
    let db = TestDb::new().await;
    let (topic, dlq) = (db.topic("order"), format!("{}.dlq", db.topic_prefix));
    create_topic(&topic, 1).await;
    create_topic_with(&dlq, 1, &[("max.message.bytes", "16384")]).await;
    let client = db.client().await;
    client
        .batch_execute("ALTER TABLE outbox ADD COLUMN dest text")
        .await
        .unwrap();
    db.create_slot().await;
    // 20 rows routed to an invalid topic among 50 healthy ones, with 3 KB of hex each: their
    // dead letters are row images of about 3.5 KB, 70 KB in all, over the limit in any
    // batches librdkafka makes of them.
    let all_rows: Vec<_> = (0..70)
        .map(|i| {
            let dest = matches!(i % 7, 1 | 4).then_some("bad topic!");
            (new_id(), format!("agg-{}", i % 5), i, dest)
        })
        .collect();
    let bad: Vec<String> = all_rows
        .iter()
        .filter(|r| r.3.is_some())
        .map(|r| r.0.clone())
        .collect();
    let healthy: Vec<String> = all_rows
        .iter()
        .filter(|r| r.3.is_none())
        .map(|r| r.0.clone())
        .collect();
    assert_eq!((bad.len(), healthy.len()), (20, 50));
    client.execute("BEGIN", &[]).await.unwrap();
    insert(&client, &all_rows, 3_000).await;
    client.execute("COMMIT", &[]).await.unwrap();
    let end = db.current_wal_lsn().await;
    let env = with(
        db.relay_env(),
        &[
            ("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str()),
            ("OUTBOX_RELAY__OUTBOX__TOPIC_COLUMN", "dest"),
        ],
    );
    let relay = RelayProcess::start(&env, "refusals_small_dlq");
    let got = read_by_id(
        std::slice::from_ref(&topic),
        &healthy,
        Duration::from_secs(90),
        Duration::from_secs(1),
    )
    .await;
    let dead = read_by_id(
        std::slice::from_ref(&dlq),
        &bad,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await;
    let log = relay.log_text();
    let (missing, out_of_order) = count(&healthy, &got);
    let kept: HashSet<&str> = dead.iter().filter_map(|r| r.header("id")).collect();
    let kept_bad = bad.iter().filter(|id| kept.contains(id.as_str())).count();
    let healthy_dead = healthy
        .iter()
        .filter(|id| kept.contains(id.as_str()))
        .count();
    eprintln!(
        "16 KiB dead-letter topic: {kept_bad} of {} dead letters kept, {missing} of {} healthy \
         missing, {healthy_dead} healthy dead-lettered, {out_of_order} out of order",
        bad.len(),
        healthy.len()
    );
    assert_eq!(kept_bad, bad.len(), "dead letters not kept\n{log}");
    assert_eq!(missing, 0, "healthy events missing\n{log}");
    assert_eq!(healthy_dead, 0, "healthy events dead-lettered\n{log}");
    assert_eq!(out_of_order, 0, "per-aggregate order broken\n{log}");
    assert!(
        dead.iter()
            .all(|r| r.header("outbox-relay.dlq.reason") == Some("invalid_topic")),
        "{log}"
    );
    assert_the_stream_went_on(db, relay, end).await;
}

/// One row stamped two hours ahead by its own `timestamp_column`, on a CreateTime topic that
/// takes at most an hour ahead (`message.timestamp.after.max.ms`, Kafka 4's default): the
/// row's own fault. It is dead-lettered (reason `timestamp`, stamped with its commit time, its
/// own time in a header), the 100 healthy rows around it arrive in order, the slot passes it
/// and the relay stays up (the slot never passed it, and each restart re-sent what followed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_row_stamped_outside_its_topics_window_is_dead_lettered_and_the_stream_goes_on() {
    let db = TestDb::new().await;
    let (topic, dlq) = (db.topic("order"), format!("{}.dlq", db.topic_prefix));
    create_topic_with(
        &topic,
        1,
        &[
            ("message.timestamp.type", "CreateTime"),
            ("message.timestamp.after.max.ms", "3600000"),
        ],
    )
    .await;
    create_topic(&dlq, 1).await;
    db.create_slot().await;
    let client = db.client().await;
    let env = with(
        db.relay_env(),
        &[
            ("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str()),
            ("OUTBOX_RELAY__OUTBOX__TIMESTAMP_COLUMN", "created_at"),
        ],
    );
    let relay = RelayProcess::start(&env, "refusals_row_timestamp");
    let rows = |round: usize| -> Vec<(String, String, usize, Option<&'static str>)> {
        (0..20)
            .map(|i| (new_id(), format!("agg-{}", i % 4), round * 20 + i, None))
            .collect()
    };
    // The first rows make the relay meet the topic (and read its window).
    let first = rows(0);
    let mut healthy: Vec<String> = first.iter().map(|r| r.0.clone()).collect();
    insert(&client, &first, 200).await;
    read_by_id(
        std::slice::from_ref(&topic),
        &healthy,
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    let bad = new_id();
    for round in 1..5 {
        let rows = rows(round);
        healthy.extend(rows.iter().map(|r| r.0.clone()));
        client.execute("BEGIN", &[]).await.unwrap();
        insert(&client, &rows[..10], 200).await;
        if round == 2 {
            client
                .execute(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
                     VALUES ($1::text::uuid, 'order', 'agg-0', 'Happened', '{\"n\": 1000}',
                             now() + interval '2 hours')",
                    &[&bad],
                )
                .await
                .unwrap();
        }
        insert(&client, &rows[10..], 200).await;
        client.execute("COMMIT", &[]).await.unwrap();
    }
    let end = db.current_wal_lsn().await;
    let got = read_by_id(
        std::slice::from_ref(&topic),
        &healthy,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await;
    let dead = read_by_id(
        std::slice::from_ref(&dlq),
        std::slice::from_ref(&bad),
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await;
    let log = relay.log_text();
    // The bad row's n (1,000) is above every healthy one of agg-0: left out of the order count.
    let (missing, out_of_order) = count(&healthy, &got);
    let letter = dead.iter().find(|r| r.header("id") == Some(bad.as_str()));
    eprintln!(
        "a row stamped 2 h ahead: {missing} of {} healthy missing, {out_of_order} out of order, \
         dead-lettered: {}, {} dead letters in all",
        healthy.len(),
        letter.is_some(),
        dead.len()
    );
    assert_eq!(missing, 0, "healthy events missing\n{log}");
    assert_eq!(out_of_order, 0, "per-aggregate order broken\n{log}");
    let letter = letter.unwrap_or_else(|| panic!("the row was not dead-lettered\n{log}"));
    assert_eq!(letter.header("outbox-relay.dlq.reason"), Some("timestamp"));
    let own: i64 = letter
        .header("outbox-relay.dlq.timestamp")
        .expect("its own time in a header")
        .parse()
        .unwrap();
    let stamped = letter.timestamp_ms.expect("a timestamp");
    assert!(
        own - stamped > 3_600_000,
        "the dead letter was not stamped anew: own {own}, stamped {stamped}"
    );
    assert_eq!(dead.len(), 1, "only the bad row is dead-lettered\n{log}");
    assert!(
        !got.iter().any(|r| r.header("id") == Some(bad.as_str())),
        "the row stamped outside the window was published"
    );
    assert_the_stream_went_on(db, relay, end).await;
}

/// A topic's `max.message.bytes` lowered to 16 KiB while the relay streams, then bursts of
/// 2,000-row transactions of ~1 KB events (each fits alone): the batches over the new limit are
/// refused, the limit is learned and the records sent again — and per aggregate no event may
/// reach the topic after a later one. An idempotent producer without gap-less delivery bumps
/// its epoch after the refusal and writes the partition's later batches before the session
/// restarts: 478 of 12,000 out of order at 780034f (issue 50), 29 inside the loaded suite on
/// 2026-12-07; the gap-less producer (`Publisher::with_client_config`) writes none of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_topic_limit_lowered_mid_stream_keeps_each_aggregates_order() {
    let db = TestDb::new().await;
    let (topic, dlq) = (db.topic("order"), format!("{}.dlq", db.topic_prefix));
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    db.create_slot().await;
    let client = db.client().await;
    let env = with(
        db.relay_env(),
        &[("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())],
    );
    let relay = RelayProcess::start(&env, "refusals_limit_lowered");
    let mut healthy = Vec::new();
    let mut n = 0;
    let mut burst = |count: usize| {
        let rows: Vec<_> = (0..count)
            .map(|i| {
                n += 1;
                (new_id(), format!("agg-{}", i % 20), n, None)
            })
            .collect();
        healthy.extend(rows.iter().map(|r| r.0.clone()));
        rows
    };
    let first = burst(2_000);
    insert(&client, &first, 1_000).await;
    let seen: Vec<String> = first.iter().map(|r| r.0.clone()).collect();
    read_by_id(
        std::slice::from_ref(&topic),
        &seen,
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let lower =
        AlterConfig::new(ResourceSpecifier::Topic(&topic)).set("max.message.bytes", "16384");
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin.alter_configs(&[lower], &options).await.unwrap() {
        r.unwrap_or_else(|(_, e)| panic!("lower the limit of {topic}: {e}"));
    }
    for _ in 0..5 {
        let rows = burst(2_000);
        insert(&client, &rows, 1_000).await;
    }
    let end = db.current_wal_lsn().await;
    let got = read_by_id(
        std::slice::from_ref(&topic),
        &healthy,
        Duration::from_secs(180),
        Duration::from_secs(1),
    )
    .await;
    let dead = read_all(&dlq).await;
    let log = relay.log_text();
    let (missing, out_of_order) = count(&healthy, &got);
    eprintln!(
        "16 KiB limit set mid-stream: {missing} of {} missing, {out_of_order} out of order, {} \
         dead-lettered, {} records read",
        healthy.len(),
        dead.len(),
        got.len()
    );
    assert_eq!(missing, 0, "events missing\n{log}");
    assert_eq!(dead.len(), 0, "healthy events dead-lettered\n{log}");
    assert_eq!(out_of_order, 0, "per-aggregate order broken\n{log}");
    assert_the_stream_went_on(db, relay, end).await;
}

/// The 64 KiB topic of the last round, but the relay may not read its limit: the ACLs grant
/// WRITE (and so DESCRIBE), not DESCRIBE_CONFIGS. The relay learns the limit only from the
/// refusals, batch by batch: 5,000 healthy ~1 KB events of 20 aggregates with one 100 KB event
/// among them. Only the 100 KB event is dead-lettered, none is missing, and per aggregate none
/// reaches the topic after a later one (at 780034f: 3,106 of 5,000 did — the refused batches'
/// later neighbours were written before the session restarted).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_topic_limit_the_relay_may_not_read_keeps_each_aggregates_order() {
    let broker = crate::common::acl::AclBroker::start().await;
    let db = TestDb::new().await;
    let (topic, dlq) = (db.topic("order"), format!("{}.dlq", db.topic_prefix));
    broker
        .create_topic_with(&topic, 1, &[("max.message.bytes", "65536")])
        .await;
    broker.create_topic_with(&dlq, 1, &[]).await;
    broker.grant_write(&[&topic, &dlq]).await;
    db.create_slot().await;
    let client = db.client().await;
    let env = with(
        broker.relay_env(&db),
        &[("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())],
    );
    let relay = RelayProcess::start(&env, "refusals_limit_unreadable");
    let (mut healthy, mut n) = (Vec::new(), 0);
    let big = new_id();
    for txn in 0..10 {
        let rows: Vec<_> = (0..500)
            .map(|i| {
                n += 1;
                (new_id(), format!("agg-{}", i % 20), n, None)
            })
            .collect();
        healthy.extend(rows.iter().map(|r| r.0.clone()));
        insert(&client, &rows, 1_000).await;
        if txn == 4 {
            n += 1;
            insert(&client, &[(big.clone(), "agg-0".into(), n, None)], 100_000).await;
        }
    }
    let end = db.current_wal_lsn().await;
    let topics = [topic.clone()];
    let got = broker
        .read_ids(
            &topics,
            1,
            &healthy,
            Duration::from_secs(180),
            Duration::from_secs(1),
        )
        .await;
    let dead = broker
        .read_ids(
            std::slice::from_ref(&dlq),
            1,
            &[],
            Duration::ZERO,
            Duration::from_secs(2),
        )
        .await;
    let log = relay.log_text();
    let (missing, out_of_order) = count(&healthy, &got);
    let dead_ids: Vec<&str> = dead.iter().filter_map(|r| r.header("id")).collect();
    eprintln!(
        "64 KiB limit the relay may not read: {missing} of {} missing, {out_of_order} out of \
         order, {} dead-lettered ({} of them healthy), {} records read",
        healthy.len(),
        dead.len(),
        dead_ids.iter().filter(|id| **id != big).count(),
        got.len()
    );
    assert_eq!(missing, 0, "events missing\n{log}");
    assert_eq!(out_of_order, 0, "per-aggregate order broken\n{log}");
    assert!(
        dead_ids.contains(&big.as_str()),
        "the 100 KB event was not dead-lettered\n{log}"
    );
    assert!(
        dead_ids.iter().all(|id| *id == big),
        "healthy events dead-lettered: {dead_ids:?}\n{log}"
    );
    assert_the_stream_went_on(db, relay, end).await;
}

// ---- an event too large for its dead letter (issue 50, point 4) ----

/// Raises the topic's `max.message.bytes` (the operator's fix for `too_large`).
async fn raise_limit(topic: &str, max_message_bytes: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let raise = AlterConfig::new(ResourceSpecifier::Topic(topic))
        .set("max.message.bytes", max_message_bytes);
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in admin.alter_configs(&[raise], &options).await.unwrap() {
        r.unwrap_or_else(|(_, e)| panic!("raise the limit of {topic}: {e}"));
    }
}

/// The rows `outbox_relay_kept_rows` keeps for the test's slot (none without the table).
async fn kept_rows(db: &TestDb) -> Vec<String> {
    let client = db.client().await;
    let exists: bool = client
        .query_one(
            "SELECT to_regclass('public.outbox_relay_kept_rows') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if !exists {
        return Vec::new();
    }
    client
        .query(
            "SELECT row_id FROM outbox_relay_kept_rows WHERE slot = $1 ORDER BY row_id",
            &[&db.slot],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The ids of the rows in the outbox now.
async fn outbox_ids(db: &TestDb) -> Vec<String> {
    let client = db.client().await;
    client
        .query("SELECT id::text FROM outbox ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Issue 50's scenario: one event too large for Kafka and for its dead letter (`hex_bytes` of
/// random hex, over the producer's default `message.max.bytes` of 1,000,000 and the
/// dead-letter topic's default limit), then 40 healthy ones of four aggregates. The relay
/// stopped on it ("too large for Kafka and for its dead letter"), every topic with it. Now
/// its dead letter names its outbox row, the row is kept (from the sweeper, when `sweeping`),
/// the 40 healthy events arrive in order, the slot passes the row and the relay stays up. Then
/// the operator raises the limits and runs `dead-letters redrive`: the event is read from its
/// row and published whole, and the row is no longer kept (the sweeper deletes it then).
async fn too_large_for_its_dead_letter(hex_bytes: usize, sweeping: bool) {
    let db = TestDb::new().await;
    let (topic, dlq) = (db.topic("order"), format!("{}.dlq", db.topic_prefix));
    create_topic(&topic, 1).await;
    create_topic(&dlq, 1).await;
    db.create_slot().await;
    let client = db.client().await;
    let rows = |from: usize| -> Vec<(String, String, usize, Option<&'static str>)> {
        (from..from + 20)
            .map(|n| (new_id(), format!("agg-{}", n % 4), n, None))
            .collect()
    };
    let (before, after) = (rows(0), rows(100));
    let huge = new_id();
    // First: the topic's first record waits for its topic's first read in the publisher, where
    // librdkafka's own size check failed it after the session had let go of its row.
    insert(
        &client,
        &[(huge.clone(), "agg-0".into(), 50, None)],
        hex_bytes,
    )
    .await;
    insert(&client, &before, 200).await;
    insert(&client, &after, 200).await;
    let end = db.current_wal_lsn().await;
    let healthy: Vec<String> = before.iter().chain(&after).map(|r| r.0.clone()).collect();
    let mut env = with(
        db.relay_env(),
        &[("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())],
    );
    if sweeping {
        for (key, value) in [
            ("ENABLED", "true"),
            ("INTERVAL_MS", "200"),
            ("RETENTION_MS", "1"),
        ] {
            env.push((
                format!("OUTBOX_RELAY__OUTBOX__SWEEPER__{key}"),
                value.into(),
            ));
        }
    }
    let name = format!("refusals_too_large_to_keep_{}", hex_bytes / 1000);
    let relay = RelayProcess::start(&env, &name);
    let got = read_by_id(
        std::slice::from_ref(&topic),
        &healthy,
        Duration::from_secs(90),
        Duration::from_secs(1),
    )
    .await;
    let dead = read_by_id(
        std::slice::from_ref(&dlq),
        std::slice::from_ref(&huge),
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await;
    let log = relay.log_text();
    let (missing, out_of_order) = count(&healthy, &got);
    let letter = dead.iter().find(|r| r.header("id") == Some(huge.as_str()));
    let kept = kept_rows(&db).await;
    eprintln!(
        "a {hex_bytes}-byte event, sweeper {}: {missing} of {} healthy missing, {out_of_order} \
         out of order, dead letter naming its row: {}, rows kept: {kept:?}",
        if sweeping { "on" } else { "off" },
        healthy.len(),
        letter.is_some_and(|l| l.header("outbox-relay.dlq.outbox-row").is_some()),
    );
    assert_eq!(missing, 0, "healthy events missing\n{log}");
    assert_eq!(out_of_order, 0, "per-aggregate order broken\n{log}");
    let letter = letter.unwrap_or_else(|| panic!("the event was not dead-lettered\n{log}"));
    assert_eq!(letter.header("outbox-relay.dlq.reason"), Some("too_large"));
    assert_eq!(letter.payload, None, "{log}");
    assert!(letter.header("outbox-relay.dlq.row").is_none());
    let named: serde_json::Value =
        serde_json::from_str(letter.header("outbox-relay.dlq.outbox-row").unwrap()).unwrap();
    assert_eq!(
        named,
        serde_json::json!({"table": "public.outbox", "id": huge})
    );
    assert_eq!(kept, std::slice::from_ref(&huge), "the row is kept\n{log}");
    assert!(
        !got.iter().any(|r| r.header("id") == Some(huge.as_str())),
        "the event was published"
    );
    wait_for(
        "the slot confirmed past every event",
        Duration::from_secs(30),
        || async { db.confirmed_flush_lsn().await >= end },
    )
    .await;
    if sweeping {
        // Every other row is confirmed and older than the retention: swept; the kept one stays.
        wait_for(
            "the sweeper deleted the confirmed rows",
            Duration::from_secs(30),
            || async { outbox_ids(&db).await.len() == 1 },
        )
        .await;
        assert_eq!(
            outbox_ids(&db).await,
            std::slice::from_ref(&huge),
            "the kept row was swept"
        );
    }

    // The operator's fix: limits above the event, then a redrive.
    raise_limit(&topic, "12000000").await;
    let raised = with(
        env.clone(),
        &[(
            "OUTBOX_RELAY__KAFKA__PROPERTIES__MESSAGE_MAX_BYTES",
            "12000000",
        )],
    );
    let report = redrive(&raised, &[]);
    assert_eq!(report["failures"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["from_row"], 1, "{report:#}");
    assert_eq!(report["left"], 0, "{report:#}");
    let got = read_by_id(
        std::slice::from_ref(&topic),
        std::slice::from_ref(&huge),
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    let published = got
        .iter()
        .find(|r| r.header("id") == Some(huge.as_str()))
        .unwrap_or_else(|| panic!("the event was not redriven: {report:#}"));
    let bytes = published.payload.as_ref().map_or(0, Vec::len);
    eprintln!("redriven from its row: {bytes} bytes");
    assert!(bytes > hex_bytes, "published whole ({bytes} bytes)");
    assert_eq!(published.header("outbox-relay.redrive-count"), Some("1"));
    assert!(kept_rows(&db).await.is_empty(), "the row is still kept");
    if sweeping {
        wait_for(
            "the sweeper deleted the released row",
            Duration::from_secs(30),
            || async { outbox_ids(&db).await.is_empty() },
        )
        .await;
    }
    let again = redrive(&raised, &[]);
    assert_eq!(
        again["redriven"], 0,
        "a finished redrive sent again: {again:#}"
    );
    assert_the_stream_went_on(db, relay, end).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_5_mb_event_is_named_by_its_row_and_redriven_from_it_without_the_sweeper() {
    too_large_for_its_dead_letter(5_000_000, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_1_5_mb_event_is_kept_from_the_sweeper_and_redriven_from_its_row() {
    too_large_for_its_dead_letter(1_500_000, true).await;
}

/// A dead letter keeps as much as its topic and the producer take, not a fixed 512 KiB: a
/// 700 KB event on a topic limited to 100,000 bytes is dead-lettered with its payload (the
/// dead-letter topic takes 1 MB), and a redrive after the limit is raised re-sends it as it
/// was. The relay stopped on it ("too large for Kafka and for its dead letter").
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_keeps_a_payload_its_topic_takes_above_512_kib() {
    let db = TestDb::new().await;
    let (topic, dlq) = (db.topic("order"), format!("{}.dlq", db.topic_prefix));
    create_topic_with(&topic, 1, &[("max.message.bytes", "100000")]).await;
    create_topic(&dlq, 1).await;
    db.create_slot().await;
    let client = db.client().await;
    let healthy_rows: Vec<_> = (0..20)
        .map(|n| (new_id(), format!("agg-{}", n % 4), n, None))
        .collect();
    let big = new_id();
    insert(&client, &healthy_rows[..10], 200).await;
    insert(&client, &[(big.clone(), "agg-1".into(), 10, None)], 700_000).await;
    insert(&client, &healthy_rows[10..], 200).await;
    let end = db.current_wal_lsn().await;
    let healthy: Vec<String> = healthy_rows.iter().map(|r| r.0.clone()).collect();
    let env = with(
        db.relay_env(),
        &[("OUTBOX_RELAY__DEAD_LETTER__TOPIC", dlq.as_str())],
    );
    let relay = RelayProcess::start(&env, "refusals_dead_letter_keeps_700kb");
    let got = read_by_id(
        std::slice::from_ref(&topic),
        &healthy,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await;
    let dead = read_by_id(
        std::slice::from_ref(&dlq),
        std::slice::from_ref(&big),
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await;
    let log = relay.log_text();
    let (missing, out_of_order) = count(&healthy, &got);
    let letter = dead.iter().find(|r| r.header("id") == Some(big.as_str()));
    let kept = letter.and_then(|l| l.payload.as_ref()).map_or(0, Vec::len);
    eprintln!(
        "a 700 KB event on a 100,000-byte topic: {missing} of {} healthy missing, \
         {out_of_order} out of order, its dead letter keeps {kept} bytes of payload",
        healthy.len()
    );
    assert_eq!(missing, 0, "healthy events missing\n{log}");
    assert_eq!(out_of_order, 0, "per-aggregate order broken\n{log}");
    assert!(
        kept > 700_000,
        "the payload was not kept ({kept} bytes)\n{log}"
    );
    assert!(kept_rows(&db).await.is_empty(), "a row kept needlessly");
    raise_limit(&topic, "2000000").await;
    let report = redrive(&env, &[]);
    assert_eq!(report["failures"], serde_json::json!([]), "{report:#}");
    assert_eq!(report["resent"], 1, "{report:#}");
    let got = read_by_id(
        std::slice::from_ref(&topic),
        std::slice::from_ref(&big),
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    assert!(got
        .iter()
        .any(|r| r.header("id") == Some(big.as_str())
            && r.payload.as_ref().map_or(0, Vec::len) == kept));
    assert_the_stream_went_on(db, relay, end).await;
}
