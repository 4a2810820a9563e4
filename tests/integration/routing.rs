//! Outbox routing end to end (issue 5), against the real PostgreSQL and Kafka started by
//! `scripts/test.sh`: every mapping option, per-aggregate order on a multi-partition topic,
//! several outbox tables and logical messages through one slot, insert-then-delete, and the
//! retention sweeper.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use outbox_relay::config::Config;
use outbox_relay::mapping::partition::partition_for_key;
use outbox_relay::postgres::control::Control;
use outbox_relay::relay::sweeper::Sweeper;
use rand::seq::SliceRandom;
use rand::Rng;

/// The relay environment of `db` without the outbox keys, so a config file (or the
/// defaults) decide the mapping.
fn env_without_outbox(db: &TestDb) -> Vec<(String, String)> {
    db.relay_env()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("OUTBOX_RELAY__OUTBOX__"))
        .collect()
}

/// `env` plus `OUTBOX_RELAY_CONFIG` pointing at a file with `toml`.
fn with_config_file(
    mut env: Vec<(String, String)>,
    name: &str,
    toml: &str,
) -> Vec<(String, String)> {
    let path = write_config(name, toml);
    env.push((
        "OUTBOX_RELAY_CONFIG".into(),
        path.to_string_lossy().into_owned(),
    ));
    env
}

fn uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Records by key; panics on a duplicate (a clean run publishes each event once).
fn by_key(records: &[Received]) -> HashMap<String, Received> {
    let mut map = HashMap::new();
    for r in records {
        if let Some(dup) = map.insert(r.key_str(), r.clone()) {
            panic!("{} published twice: {dup:?} and {r:?}", r.key_str());
        }
    }
    map
}

fn header_map(pairs: &[(&str, &str)]) -> HashMap<String, Vec<u8>> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
        .collect()
}

/// Done-when 5: a Debezium-style table (Debezium's documented layout) and no `[outbox]`
/// settings at all. Records go to `outbox.event.<aggregatetype>`, keyed by event id,
/// partitioned by aggregate id.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn debezium_table_works_with_no_mapping_configured() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // Debezium's example outbox table, and no publication: the relay creates it.
    client
        .batch_execute(
            "DROP PUBLICATION outbox_relay_pub;
             DROP TABLE outbox;
             CREATE TABLE outbox (
                 id            uuid         NOT NULL PRIMARY KEY,
                 aggregatetype varchar(255) NOT NULL,
                 aggregateid   varchar(255) NOT NULL,
                 type          varchar(255) NOT NULL,
                 payload       jsonb
             );",
        )
        .await
        .unwrap();
    // A fresh aggregate type, so the default topic is this test's own.
    let aggregate_type = random_name("order");
    let topic = format!("outbox.event.{aggregate_type}");
    create_topic(&topic, 3).await;

    let mut relay = RelayProcess::start(&env_without_outbox(&db), "routing_debezium");
    wait_for_slot(&db, &mut relay).await;

    let mut written = Vec::new();
    for i in 0..20 {
        let (id, aggregate_id) = (uuid(), format!("order-{}", i % 4));
        let payload = format!(r#"{{"n": {i}, "note": "ü"}}"#);
        client
            .execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                 VALUES ($1::text::uuid, $2, $3, 'OrderCreated', $4::text::jsonb)",
                &[&id, &aggregate_type, &aggregate_id, &payload],
            )
            .await
            .unwrap();
        written.push((id, aggregate_id, payload));
    }
    let ids: Vec<String> = written.iter().map(|w| w.0.clone()).collect();
    let received = read_ids(
        std::slice::from_ref(&topic),
        3,
        &ids,
        Duration::from_secs(60),
        Duration::from_secs(2),
    )
    .await;
    let got = by_key(&received);
    assert_eq!(
        got.len(),
        20,
        "{} of 20 events arrived:\n{}",
        got.len(),
        relay.log_text()
    );
    let mut last_offset: HashMap<i32, i64> = HashMap::new();
    for (id, aggregate_id, payload) in &written {
        let r = &got[id];
        assert_eq!(r.topic, topic);
        assert_eq!(r.payload.as_deref(), Some(payload.as_bytes()));
        assert_eq!(
            r.headers,
            header_map(&[
                ("id", id),
                ("type", "OrderCreated"),
                ("aggregatetype", &aggregate_type),
                ("aggregateid", aggregate_id),
            ])
        );
        assert_eq!(
            r.partition,
            partition_for_key(aggregate_id.as_bytes(), 3),
            "{aggregate_id}"
        );
        // Written one per transaction: within a partition, offsets follow commit order.
        let previous = last_offset.insert(r.partition, r.offset);
        assert!(previous.is_none_or(|p| p < r.offset), "{id} out of order");
    }

    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

/// Done-when 1: every mapping option changes the record as documented. One relay streams
/// four outbox tables, each with its own mapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mapping_options_change_the_record_as_documented() {
    let db = TestDb::new().await;
    let p = db.topic_prefix.clone();
    let client = db.client().await;
    client
        .batch_execute(
            "CREATE SCHEMA app;
             CREATE TABLE app.events (
                 event_id    text PRIMARY KEY,
                 kind        text NOT NULL,
                 entity      text NOT NULL,
                 name        text NOT NULL,
                 body        bytea,
                 occurred_at timestamptz,
                 hdrs        jsonb,
                 span        text,
                 tenant      text,
                 dest        text
             );
             CREATE TABLE app.enveloped (
                 id text PRIMARY KEY, aggregatetype text, aggregateid text, type text,
                 payload text, k text, shard text
             );
             CREATE TABLE app.json_payloads (
                 id uuid PRIMARY KEY, aggregatetype text, aggregateid text, type text,
                 payload json
             );",
        )
        .await
        .unwrap();
    for topic in [
        "ev.order",
        "special.Archived",
        "routed",
        "env",
        "json",
        "order",
    ] {
        create_topic(&format!("{p}.{topic}"), 6).await;
    }
    // The publication exists (migration) with public.outbox only: the relay adds the others.
    let config = format!(
        r#"
[outbox]
table = "public.outbox"
topic = "{p}.{{aggregatetype}}"
null_payload = "error"

[[outbox.tables]]
table = "app.events"
id_column = "event_id"
aggregate_type_column = "kind"
aggregate_id_column = "entity"
type_column = "name"
payload_column = "body"
topic = "{p}.ev.{{aggregatetype}}"
topic_overrides = {{ special = "{p}.special.{{type}}" }}
topic_column = "dest"
timestamp_column = "occurred_at"
headers_column = "hdrs"
tracing_column = "span"
header_columns = {{ tenant = "x-tenant" }}
null_payload = "tombstone"

[[outbox.tables]]
table = "app.enveloped"
topic = "{p}.env"
envelope = true
key_column = "k"
partition_by = "shard"

[[outbox.tables]]
table = "app.json_payloads"
topic = "{p}.json"
partition_by = "key"

[dead_letter]
topic = "{p}.dlq"
"#
    );
    let env = with_config_file(env_without_outbox(&db), "routing_mapping", &config);
    let mut relay = RelayProcess::start(&env, "routing_mapping");
    wait_for_slot(&db, &mut relay).await;

    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    client
        .execute(
            "INSERT INTO app.events VALUES
               ('e1', 'order', 'o-1', 'Created', '\\x00ff5c78'::bytea,
                '2021-06-01 12:00:00.123+02', '{\"from-json\": \"t1\", \"n\": 7, \"skip\": null}',
                $1, 'acme', NULL),
               ('e2', 'special', 'o-2', 'Archived', NULL, NULL, NULL,
                'traceparent=' || $1 || E'\\ntracestate=x=1', NULL, NULL),
               ('e3', 'order', 'o-3', 'Created', '\\x6869'::bytea, NULL, NULL, NULL, NULL,
                $2),
               ('e4', 'order', 'o-4', 'Created', '\\x6869'::bytea, NULL, NULL, NULL, NULL,
                'not a topic!')",
            &[&traceparent, &format!("{p}.routed")],
        )
        .await
        .unwrap();
    client
        .batch_execute(
            "INSERT INTO app.enveloped VALUES
               ('v1', 'thing', 'x-1', 'Made', 'plain \"text\"', 'key-v1', 's-7');",
        )
        .await
        .unwrap();
    let json_payloads = ["{ \"a\" :1 }", "[1,  2]", "\"s\"", "null", "{\"b\":{}}"];
    let mut json_ids = Vec::new();
    for payload in json_payloads {
        let id = uuid();
        client
            .execute(
                "INSERT INTO app.json_payloads VALUES ($1::text::uuid, 'doc', 'd-1', 'Saved', $2::text::json)",
                &[&id, &payload],
            )
            .await
            .unwrap();
        json_ids.push(id);
    }
    let (o1, o2) = (uuid(), uuid());
    client
        .execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
               ($1::text::uuid, 'order', 'o-9', 'Created', '{\"ok\": true}'),
               ($2::text::uuid, 'order', 'o-9', 'Created', NULL)",
            &[&o1, &o2],
        )
        .await
        .unwrap();

    let topics: Vec<String> = [
        "ev.order",
        "special.Archived",
        "routed",
        "env",
        "json",
        "order",
    ]
    .iter()
    .map(|t| format!("{p}.{t}"))
    .collect();
    let mut expected: Vec<String> = ["e1", "e2", "e3", "key-v1"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    expected.extend(json_ids.iter().cloned());
    expected.push(o1.clone());
    let received = read_ids(
        &topics,
        6,
        &expected,
        Duration::from_secs(60),
        Duration::from_secs(2),
    )
    .await;
    let got = by_key(&received);
    let mut keys: Vec<&String> = got.keys().collect();
    keys.sort();
    let mut want: Vec<&String> = expected.iter().collect();
    want.sort();
    assert_eq!(keys, want, "\n{}", relay.log_text());

    // app.events: custom columns, bytea byte-for-byte, timestamp, JSON headers, tracing,
    // extra header column, key = event id, partition by the aggregate id.
    let e1 = &got["e1"];
    assert_eq!(e1.topic, format!("{p}.ev.order"));
    assert_eq!(e1.payload.as_deref(), Some(&b"\x00\xff\x5c\x78"[..]));
    assert_eq!(e1.timestamp_ms, Some(1_622_541_600_123));
    assert_eq!(e1.partition, partition_for_key(b"o-1", 6));
    assert_eq!(
        e1.headers,
        header_map(&[
            ("id", "e1"),
            ("type", "Created"),
            ("aggregatetype", "order"),
            ("aggregateid", "o-1"),
            ("x-tenant", "acme"),
            ("from-json", "t1"),
            ("n", "7"),
            ("traceparent", traceparent),
        ])
    );
    // Per-aggregate-type topic override, tombstone, commit time, span context as key=value.
    let e2 = &got["e2"];
    assert_eq!(e2.topic, format!("{p}.special.Archived"));
    assert_eq!(
        e2.payload, None,
        "null payload with null_payload = tombstone"
    );
    let commit_ms = e2.timestamp_ms.expect("timestamp");
    let now_ms = outbox_relay::clock::unix_ms();
    assert!(
        (now_ms - 120_000..=now_ms).contains(&commit_ms),
        "commit time {commit_ms} vs now {now_ms}"
    );
    assert_eq!(e2.header("traceparent"), Some(traceparent));
    assert_eq!(e2.header("tracestate"), Some("x=1"));
    assert_eq!(e2.header("x-tenant"), None, "null extra column: no header");
    // Topic column.
    assert_eq!(got["e3"].topic, format!("{p}.routed"));
    assert_eq!(got["e3"].payload.as_deref(), Some(&b"hi"[..]));

    // Envelope mode, key column, partition by a column.
    let v1 = &got["key-v1"];
    assert_eq!(v1.topic, format!("{p}.env"));
    assert_eq!(v1.partition, partition_for_key(b"s-7", 6));
    assert_eq!(v1.header("id"), Some("v1"));
    let envelope: serde_json::Value =
        serde_json::from_slice(v1.payload.as_deref().unwrap()).unwrap();
    assert_eq!(
        envelope,
        serde_json::json!({
            "id": "v1", "aggregatetype": "thing", "aggregateid": "x-1", "type": "Made",
            "timestamp": v1.timestamp_ms.unwrap(), "payload": "plain \"text\"",
        })
    );

    // json payloads byte-for-byte (json keeps the text as written); partition by the key,
    // placed by librdkafka's murmur2 partitioner: the same function as ours.
    for (id, payload) in json_ids.iter().zip(json_payloads) {
        let r = &got[id];
        assert_eq!(r.payload.as_deref(), Some(payload.as_bytes()), "{id}");
        assert_eq!(r.partition, partition_for_key(id.as_bytes(), 6), "{id}");
    }
    assert_eq!(got[&o1].payload.as_deref(), Some(&b"{\"ok\": true}"[..]));

    // The invalid topic (e4) and the null payload under null_payload = error (o2) were
    // caught before sending and went to the dead-letter topic.
    let dlq = read_until(
        &[format!("{p}.dlq")],
        1,
        Duration::from_secs(30),
        Duration::from_secs(1),
        {
            let mut n = 0;
            move |_| {
                n += 1;
                n == 2
            }
        },
    )
    .await;
    // Named by the row's id column, as the dead letter carries the row.
    let reasons: BTreeMap<String, String> = dlq
        .iter()
        .map(|r| {
            let row: serde_json::Value =
                serde_json::from_slice(r.payload.as_deref().unwrap_or(b"{}")).unwrap();
            let columns = &row["columns"];
            let id = columns["event_id"].as_str().or(columns["id"].as_str());
            (
                id.unwrap_or("?").to_string(),
                r.header("outbox-relay.dlq.reason")
                    .unwrap_or("?")
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        reasons,
        BTreeMap::from([
            ("e4".to_string(), "invalid_topic".to_string()),
            (o2.clone(), "mapping".to_string()),
        ]),
        "{dlq:?}"
    );

    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

/// Done-when 2: 200 aggregates × 50 events from 8 concurrent writers on a 6-partition topic.
/// Writers serialize per aggregate on a counter row (as an application's aggregate row lock
/// would), so each aggregate's commit order is its sequence number.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aggregates_keep_commit_order_on_a_six_partition_topic() {
    const AGGREGATES: usize = 200;
    const PER_AGGREGATE: usize = 50;
    const WRITERS: usize = 8;
    let db = TestDb::new().await;
    let topic = db.topic("order");
    create_topic(&topic, 6).await;
    let setup = db.client().await;
    setup
        .batch_execute(&format!(
            "CREATE TABLE agg_seq (aggregateid text PRIMARY KEY, seq int NOT NULL);
             INSERT INTO agg_seq SELECT format('agg-%s', lpad(g::text, 3, '0')), 0
             FROM generate_series(0, {}) g;",
            AGGREGATES - 1
        ))
        .await
        .unwrap();

    let mut relay = RelayProcess::start(&db.relay_env(), "routing_order");
    wait_for_slot(&db, &mut relay).await;

    let mut work: Vec<usize> = (0..AGGREGATES)
        .flat_map(|a| std::iter::repeat_n(a, PER_AGGREGATE))
        .collect();
    work.shuffle(&mut rand::thread_rng());
    let work = Arc::new(Mutex::new(work));
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let work = work.clone();
        let mut client = db.client().await;
        tasks.push(tokio::spawn(async move {
            // event id → (aggregate, sequence)
            let mut written: Vec<(String, String, i32)> = Vec::new();
            loop {
                let mut batch: Vec<String> = {
                    let mut work = work.lock().unwrap();
                    let n = rand::thread_rng().gen_range(1..=4).min(work.len());
                    let at = work.len() - n;
                    work.drain(at..).map(|a| format!("agg-{a:03}")).collect()
                };
                if batch.is_empty() {
                    return written;
                }
                // Lock counter rows in a fixed order: no deadlocks between writers.
                batch.sort();
                let tx = client.transaction().await.unwrap();
                for aggregate in batch {
                    let seq: i32 = tx
                        .query_one(
                            "UPDATE agg_seq SET seq = seq + 1 WHERE aggregateid = $1 RETURNING seq",
                            &[&aggregate],
                        )
                        .await
                        .unwrap()
                        .get(0);
                    let id = uuid();
                    let payload = format!(r#"{{"seq": {seq}}}"#);
                    tx.execute(
                        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
                         VALUES ($1::text::uuid, 'order', $2, 'Step', $3::text::jsonb)",
                        &[&id, &aggregate, &payload],
                    )
                    .await
                    .unwrap();
                    written.push((id, aggregate, seq));
                }
                tx.commit().await.unwrap();
            }
        }));
    }
    let mut written = Vec::new();
    for t in tasks {
        written.extend(t.await.unwrap());
    }
    assert_eq!(written.len(), AGGREGATES * PER_AGGREGATE);
    let ids: Vec<String> = written.iter().map(|w| w.0.clone()).collect();
    let received = read_ids(
        std::slice::from_ref(&topic),
        6,
        &ids,
        Duration::from_secs(180),
        Duration::from_secs(3),
    )
    .await;
    let got = by_key(&received);
    assert_eq!(
        got.len(),
        written.len(),
        "{} of {} events arrived",
        got.len(),
        written.len()
    );
    let expected: HashMap<&str, (&str, i32)> = written
        .iter()
        .map(|(id, a, s)| (id.as_str(), (a.as_str(), *s)))
        .collect();

    // Keys are event ids; every aggregate sits in murmur2(aggregate id) % 6; read in offset
    // order per partition, each aggregate's sequence is 1, 2, ..., 50.
    let mut by_partition: BTreeMap<i32, Vec<&Received>> = BTreeMap::new();
    for r in &received {
        let key = r.key_str();
        let (aggregate, _) = expected[key.as_str()];
        assert_eq!(r.header("id"), Some(key.as_str()));
        assert_eq!(r.header("aggregateid"), Some(aggregate));
        assert_eq!(
            r.partition,
            partition_for_key(aggregate.as_bytes(), 6),
            "{aggregate}"
        );
        by_partition.entry(r.partition).or_default().push(r);
    }
    assert_eq!(
        by_partition.len(),
        6,
        "200 aggregates should use all 6 partitions"
    );
    let mut next: HashMap<&str, i32> = HashMap::new();
    for records in by_partition.values_mut() {
        records.sort_by_key(|r| r.offset);
        for r in records.iter() {
            let (aggregate, seq) = expected[r.key_str().as_str()];
            let want = next.entry(aggregate).or_insert(1);
            assert_eq!(
                seq, *want,
                "{aggregate}: event {seq} arrived where {want} was due"
            );
            let payload: serde_json::Value =
                serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
            assert_eq!(payload["seq"], seq);
            *want += 1;
        }
    }
    assert_eq!(next.len(), AGGREGATES);
    assert!(next.values().all(|&n| n == PER_AGGREGATE as i32 + 1));

    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

/// Done-when 3: two outbox tables in two schemas, each with its own topic, and transactional
/// `pg_logical_emit_message` events, all through one publication and one slot. Messages
/// with another prefix are ignored, non-transactional ones skipped with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_schemas_and_logical_messages_share_one_slot() {
    let db = TestDb::new().await;
    let p = db.topic_prefix.clone();
    let mut client = db.client().await;
    client
        .batch_execute(
            "DROP PUBLICATION outbox_relay_pub;
             CREATE SCHEMA tenant_a;
             CREATE SCHEMA tenant_b;
             CREATE TABLE tenant_a.outbox (LIKE public.outbox INCLUDING ALL);
             CREATE TABLE tenant_b.outbox (LIKE public.outbox INCLUDING ALL);",
        )
        .await
        .unwrap();
    let config = format!(
        r#"
[outbox]
table = ""
topic = "{p}.msg.{{aggregatetype}}"
message_prefix = "outbox"

[[outbox.tables]]
table = "tenant_a.outbox"
topic = "{p}.a.{{aggregatetype}}"

[[outbox.tables]]
table = "tenant_b.outbox"
topic = "{p}.b.{{aggregatetype}}"
"#
    );
    let env = with_config_file(env_without_outbox(&db), "routing_two_schemas", &config);
    // A log of this run only: the test counts lines in it.
    let mut relay = RelayProcess::start(&env, &format!("routing_two_schemas_{}", db.name));
    wait_for_slot(&db, &mut relay).await;

    let insert = |schema: &str| {
        format!(
            "INSERT INTO {schema}.outbox (id, aggregatetype, aggregateid, type, payload)
             VALUES ($1::text::uuid, 'order', $2, 'Created', $3::text::jsonb)"
        )
    };
    let message = |id: &str, aggregate_id: &str, n: usize| {
        format!(
            r#"{{"id": "{id}", "aggregatetype": "order", "aggregateid": "{aggregate_id}", "type": "Created", "payload": {{"n": {n}}}}}"#
        )
    };
    let emit = "SELECT pg_logical_emit_message($1, $2, $3::text)";
    // topic → ids in the order written
    let mut expected: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut messages: HashMap<String, String> = HashMap::new();
    for i in 0..10 {
        for schema in ["a", "b"] {
            let id = uuid();
            client
                .execute(
                    &insert(&format!("tenant_{schema}")),
                    &[&id, &format!("{schema}-{i}"), &format!(r#"{{"n": {i}}}"#)],
                )
                .await
                .unwrap();
            expected
                .entry(format!("{p}.{schema}.order"))
                .or_default()
                .push(id);
        }
        let id = uuid();
        let content = message(&id, &format!("m-{i}"), i);
        client
            .execute(emit, &[&true, &"outbox", &content])
            .await
            .unwrap();
        expected
            .entry(format!("{p}.msg.order"))
            .or_default()
            .push(id.clone());
        messages.insert(id, format!(r#"{{"n": {i}}}"#));
    }
    // One transaction touching both tables and emitting a message.
    let (ra, m, rb) = (uuid(), uuid(), uuid());
    let tx = client.transaction().await.unwrap();
    tx.execute(&insert("tenant_a"), &[&ra, &"mixed", &"{}"])
        .await
        .unwrap();
    tx.execute(emit, &[&true, &"outbox", &message(&m, "mixed", 99)])
        .await
        .unwrap();
    tx.execute(&insert("tenant_b"), &[&rb, &"mixed", &"{}"])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    expected.get_mut(&format!("{p}.a.order")).unwrap().push(ra);
    expected
        .get_mut(&format!("{p}.msg.order"))
        .unwrap()
        .push(m.clone());
    expected.get_mut(&format!("{p}.b.order")).unwrap().push(rb);
    messages.insert(m, r#"{"n": 99}"#.to_string());

    // Not published: a rolled-back message, a non-transactional one, another prefix.
    let not_published = [uuid(), uuid(), uuid()];
    let tx = client.transaction().await.unwrap();
    tx.execute(
        emit,
        &[&true, &"outbox", &message(&not_published[0], "r", 0)],
    )
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    client
        .execute(
            emit,
            &[&false, &"outbox", &message(&not_published[1], "n", 0)],
        )
        .await
        .unwrap();
    client
        .execute(
            emit,
            &[&true, &"audit", &message(&not_published[2], "x", 0)],
        )
        .await
        .unwrap();
    // Committed last: once it arrived, everything before it was streamed.
    let marker = uuid();
    client
        .execute(emit, &[&true, &"outbox", &message(&marker, "marker", 0)])
        .await
        .unwrap();
    expected
        .get_mut(&format!("{p}.msg.order"))
        .unwrap()
        .push(marker.clone());
    messages.insert(marker, r#"{"n": 0}"#.to_string());

    let topics: Vec<String> = expected.keys().cloned().collect();
    let all: Vec<String> = expected.values().flatten().cloned().collect();
    let received = read_ids(
        &topics,
        1,
        &all,
        Duration::from_secs(60),
        Duration::from_secs(2),
    )
    .await;
    let _ = by_key(&received);
    let mut actual: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut sorted = received.clone();
    sorted.sort_by_key(|r| (r.topic.clone(), r.offset));
    for r in &sorted {
        actual.entry(r.topic.clone()).or_default().push(r.key_str());
        if let Some(payload) = messages.get(&r.key_str()) {
            assert_eq!(r.payload.as_deref(), Some(payload.as_bytes()));
        }
    }
    assert_eq!(actual, expected, "\n{}", relay.log_text());
    for id in &not_published {
        assert!(received.iter().all(|r| &r.key_str() != id));
    }
    let log = relay.log_text();
    assert_eq!(
        log.matches("skipped a non-transactional logical message")
            .count(),
        1,
        "{log}"
    );
    assert!(log.contains("rejected_total=1"), "{log}");

    // One slot, one publication covering exactly the two tables.
    let slots: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_replication_slots WHERE database = current_database()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, 1);
    let mut tables: Vec<String> = client
        .query(
            "SELECT schemaname || '.' || tablename FROM pg_publication_tables WHERE pubname = $1",
            &[&db.publication],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    tables.sort();
    assert_eq!(tables, ["tenant_a.outbox", "tenant_b.outbox"]);

    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

/// Done-when 4, first half: rows inserted and deleted in the same transaction (or deleted
/// later) are published exactly once; the publication publishes inserts only.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn insert_then_delete_is_published_once() {
    let db = TestDb::new().await;
    let mut relay = RelayProcess::start(&db.relay_env(), "routing_insert_delete");
    wait_for_slot(&db, &mut relay).await;
    let mut client = db.client().await;

    let same_txn: Vec<Event> = (0..50).map(|i| Event::new("order", "a", 0, i)).collect();
    let tx = client.transaction().await.unwrap();
    for e in &same_txn {
        tx.execute(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
             VALUES ($1::text::uuid, $2, $3, $4, $5::text::jsonb)",
            &[
                &e.id,
                &e.aggregate_type,
                &e.aggregate_id,
                &e.event_type,
                &e.payload,
            ],
        )
        .await
        .unwrap();
        tx.execute("DELETE FROM outbox WHERE id = $1::text::uuid", &[&e.id])
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let later: Vec<Event> = (0..50).map(|i| Event::new("order", "b", 0, i)).collect();
    insert_events(&mut client, &later, true).await;
    let later_ids: Vec<String> = later.iter().map(|e| e.id.clone()).collect();
    client
        .execute("DELETE FROM outbox WHERE id::text = ANY($1)", &[&later_ids])
        .await
        .unwrap();
    // Committed after the deletes: when it has arrived, the deletes have been streamed past.
    let marker = vec![Event::new("order", "marker", 0, 0)];
    insert_events(&mut client, &marker, true).await;

    let all: Vec<Event> = same_txn
        .iter()
        .chain(&later)
        .chain(&marker)
        .cloned()
        .collect();
    let ids: Vec<String> = all.iter().map(|e| e.id.clone()).collect();
    let received = read_ids(
        &[db.topic("order")],
        1,
        &ids,
        Duration::from_secs(60),
        Duration::from_secs(3),
    )
    .await;
    let t = tally(&all, &received);
    assert!(t.missing.is_empty(), "{} events missing", t.missing.len());
    assert_eq!(t.duplicates, 0);
    assert_eq!(t.unexpected, 0);
    assert_eq!(received.len(), 101);
    for r in &received {
        let e = all.iter().find(|e| e.id == r.key_str()).unwrap();
        assert_eq!(r.payload.as_deref(), Some(e.payload.as_bytes()));
    }
    let left: i64 = client
        .query_one(
            "SELECT count(*) FROM outbox WHERE aggregateid <> 'marker'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(left, 0);

    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

async fn outbox_ids(db: &TestDb) -> HashSet<String> {
    db.client()
        .await
        .query("SELECT id::text FROM outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Inserts one committed row with `created_at` set by `created_at` (SQL), returns its id.
async fn insert_aged(client: &tokio_postgres::Client, created_at: &str) -> String {
    let id = uuid();
    client
        .execute(
            &format!(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
                 VALUES ($1::text::uuid, 'order', 'a', 'Created', '{{}}', {created_at})"
            ),
            &[&id],
        )
        .await
        .unwrap();
    id
}

/// Done-when 4, second half, exactly: the sweeper deletes a row only when it is older than
/// the retention and its inserting transaction is confirmed by the slot, including a row
/// inserted in a savepoint of a transaction that commits after the mark (its `created_at`
/// is old, its commit is not confirmed).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sweeper_deletes_only_confirmed_rows_older_than_the_retention() {
    let db = TestDb::new().await;
    db.create_slot().await;
    let client = db.client().await;
    let mut config = Config::default();
    config.postgres.url = db.url.clone();
    config.postgres.slot = db.slot.clone();
    config.outbox.sweeper.retention_ms = 3_600_000;
    config.outbox.sweeper.batch_size = 2;
    let control = Control::connect(&config.postgres).await.unwrap();
    let mut sweeper = Sweeper::new(control, &config);

    let old = "now() - interval '2 hours'";
    let mut confirmed_old = Vec::new();
    for _ in 0..5 {
        confirmed_old.push(insert_aged(&client, old).await);
    }
    let young = insert_aged(&client, "now()").await;
    // A transaction that inserts an old-looking row in a savepoint and stays open.
    let open = db.client().await;
    let late = uuid();
    open.batch_execute(&format!(
        "BEGIN;
         SAVEPOINT s;
         INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
         VALUES ('{late}', 'order', 'a', 'Created', '{{}}', now() - interval '3 hours');
         RELEASE SAVEPOINT s;"
    ))
    .await
    .unwrap();

    let mark = mark_after(&mut sweeper, &db.client().await, &confirmed_old).await;
    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.used, None, "the slot has not confirmed the mark yet");
    assert_eq!(report.deleted, 0);

    open.batch_execute("COMMIT").await.unwrap();
    let after_mark = insert_aged(&client, old).await;
    // The slot confirms exactly the mark: everything committed before it, not after.
    advance_slot(&db, mark.lsn).await;
    assert_eq!(db.confirmed_flush_lsn().await, mark.lsn.0);

    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.used, Some(mark));
    assert_eq!(report.deleted, 5, "{report:?}");
    let left = outbox_ids(&db).await;
    let expect: HashSet<String> = [young.clone(), late.clone(), after_mark.clone()].into();
    assert_eq!(
        left, expect,
        "only the 5 confirmed old rows may go; the young row, the row committed after the mark \
         (old created_at, inserted in a savepoint) and the row inserted after it stay"
    );

    // Once the slot confirms a mark taken after those commits, the old ones go too.
    let mark2 = mark_after(
        &mut sweeper,
        &db.client().await,
        &[late.clone(), after_mark.clone()],
    )
    .await;
    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.used, Some(mark), "mark2 is not confirmed yet");
    assert_eq!(report.deleted, 0);
    advance_slot(&db, mark2.lsn).await;
    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.used, Some(mark2));
    assert_eq!(report.deleted, 2);
    assert_eq!(outbox_ids(&db).await, HashSet::from([young]));

    db.cleanup().await;
}

/// Done-when 4, with the relay: the sweeper enabled in `run` removes the rows past the
/// retention once they are published and confirmed, and keeps the younger ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn relay_sweeper_removes_published_rows_past_the_retention() {
    let db = TestDb::new().await;
    let mut env = db.relay_env();
    for (key, value) in [
        ("ENABLED", "true"),
        ("INTERVAL_MS", "200"),
        ("RETENTION_MS", "3600000"),
        ("BATCH_SIZE", "7"),
    ] {
        env.push((
            format!("OUTBOX_RELAY__OUTBOX__SWEEPER__{key}"),
            value.to_string(),
        ));
    }
    let mut relay = RelayProcess::start(&env, &format!("routing_sweeper_{}", db.name));
    wait_for_slot(&db, &mut relay).await;
    let client = db.client().await;
    let mut old = Vec::new();
    for _ in 0..30 {
        old.push(insert_aged(&client, "now() - interval '2 hours'").await);
    }
    let mut young = HashSet::new();
    for _ in 0..10 {
        young.insert(insert_aged(&client, "now()").await);
    }

    wait_for(
        "the sweeper to delete the 30 old rows",
        Duration::from_secs(60),
        || async { outbox_ids(&db).await.len() == young.len() },
    )
    .await;
    assert_eq!(outbox_ids(&db).await, young);
    // Every deleted row had been published.
    let received = read_ids(
        &[db.topic("order")],
        1,
        &old,
        Duration::from_secs(30),
        Duration::from_secs(1),
    )
    .await;
    let keys: HashSet<String> = received.iter().map(Received::key_str).collect();
    assert!(old.iter().all(|id| keys.contains(id)));
    assert!(
        relay.log_text().contains("sweeper deleted confirmed rows"),
        "{}",
        relay.log_text()
    );

    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}
