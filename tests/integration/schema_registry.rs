//! Schema Registry serialization (`[outbox.serialization]`, issue 23) against a real registry:
//! Apicurio Registry's Confluent-compatible API, started by `scripts/registry.sh` (here if it
//! does not run yet), and a stock consumer (Python `confluent-kafka`'s `AvroDeserializer`,
//! `JSONDeserializer` and `ProtobufDeserializer`, `scripts/registry/consume.py`) reading what
//! the relay wrote.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use crate::common::probe::{free_port, http_get, metric};
use crate::common::*;
use outbox_relay::config::{SerializationConfig, SerializationFormat};
use outbox_relay::sink::schema::registry::RegistryClient;
use outbox_relay::sink::schema::wire;

/// The schema of [`Event`]'s payload: `{"seq", "note", "writer"}`.
const EVENT_SCHEMA: &str = r#"{"type":"record","name":"Event","namespace":"dev.outbox.test",
  "fields":[{"name":"seq","type":"long"},{"name":"note","type":"string"},
  {"name":"writer","type":"long"}]}"#;

/// The same contract as a JSON Schema; `minimum` is a constraint no JSON type carries, so a
/// payload breaking it is caught only by validation.
const EVENT_JSON_SCHEMA: &str = r#"{"$schema":"http://json-schema.org/draft-07/schema#",
  "title":"Event","type":"object","properties":{"seq":{"type":"integer","minimum":0},
  "note":{"type":"string"},"writer":{"type":"integer"}},"required":["seq","note","writer"],
  "additionalProperties":false}"#;

/// The same contract as a `.proto` file; the relay encodes as its first message, `Event`.
const EVENT_PROTO: &str = r#"syntax = "proto3";
package dev.outbox.test;
message Event { int32 seq = 1; string note = 2; int32 writer = 3; }
message Unused { string other = 1; }
"#;

/// `scripts/registry.sh` with the run dir `run_dir`; its stdout.
fn registry_script(run_dir: &str, command: &str) -> String {
    let out = Command::new("bash")
        .arg(repo_path("scripts/registry.sh"))
        .arg(command)
        .env("OUTBOX_RUN_DIR", run_dir)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/registry.sh");
    assert!(out.status.success(), "scripts/registry.sh {command} failed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn run_dir() -> String {
    std::env::var("OUTBOX_RUN_DIR").unwrap_or_else(|_| "/tmp/outbox-relay-run".into())
}

/// The shared registry's ccompat URL (started when it does not run).
fn registry_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| registry_script(&run_dir(), "start"))
        .clone()
}

/// A python with confluent-kafka (installed on first use).
fn python() -> String {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON
        .get_or_init(|| registry_script(&run_dir(), "python"))
        .clone()
}

fn client(url: &str) -> RegistryClient {
    let config = SerializationConfig {
        format: SerializationFormat::Avro,
        registry_url: url.to_string(),
        ..SerializationConfig::default()
    };
    RegistryClient::new(&config, None)
}

/// Registers the event schema under `<topic>-value`; its id.
async fn register(url: &str, topic: &str) -> u32 {
    client(url)
        .register(&format!("{topic}-value"), EVENT_SCHEMA, "AVRO")
        .await
        .expect("register the event schema")
}

fn avro_env(db: &TestDb, url: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    serialization_env(db, url, "avro", extra)
}

fn serialization_env(
    db: &TestDb,
    url: &str,
    format: &str,
    extra: &[(&str, &str)],
) -> Vec<(String, String)> {
    let mut env = with(
        db.relay_env(),
        &[
            ("OUTBOX_RELAY__OUTBOX__SERIALIZATION__FORMAT", format),
            ("OUTBOX_RELAY__OUTBOX__SERIALIZATION__REGISTRY_URL", url),
        ],
    );
    env = with(
        env,
        &[("OUTBOX_RELAY__DEAD_LETTER__TOPIC", &db.topic("dlq"))],
    );
    with(env, extra)
}

fn events(n: usize, aggregate: &str) -> Vec<Event> {
    (0..n)
        .map(|i| Event::new(aggregate, &format!("a{}", i % 7), 0, i))
        .collect()
}

async fn write_in_batches(db: &TestDb, events: &[Event], batch: usize) {
    let mut client = db.client().await;
    for chunk in events.chunks(batch) {
        insert_events(&mut client, chunk, true).await;
    }
}

/// Requests to the shared registry whose path ends with `path` (its access log has one line
/// per request).
fn registry_requests(path: &str) -> usize {
    let log = std::fs::read_to_string(format!("{}/registry/registry.log", run_dir())).unwrap();
    let needle = format!("{path}\"");
    log.lines().filter(|l| l.contains(&needle)).count()
}

/// Every received value is framed with `schema_id`.
fn assert_framed(received: &[Received], schema_id: u32) {
    for r in received {
        let value = r.payload.as_deref().expect("a value");
        assert_eq!(
            wire::schema_id(value),
            Some(schema_id),
            "record {} is not framed with schema id {schema_id}: {:?}",
            r.key_str(),
            &value[..value.len().min(16)]
        );
    }
}

/// Decodes `topic` with Confluent's AvroDeserializer: key → decoded value.
fn decode_with_confluent(
    url: &str,
    topic: &str,
    count: usize,
) -> HashMap<String, serde_json::Value> {
    decode_as(url, topic, count, &["avro"])
}

/// Decodes `topic` with the Confluent deserializer `how` names (`consume.py`'s FORMAT and
/// PROTO_FILE): key → decoded value.
fn decode_as(
    url: &str,
    topic: &str,
    count: usize,
    how: &[&str],
) -> HashMap<String, serde_json::Value> {
    let out = Command::new(python())
        .arg(repo_path("scripts/registry/consume.py"))
        .args([&brokers(), url, topic, &count.to_string(), "120"])
        .args(how)
        .stderr(Stdio::inherit())
        .output()
        .expect("run consume.py");
    assert!(out.status.success(), "consume.py failed");
    let mut decoded = HashMap::new();
    for line in String::from_utf8(out.stdout).unwrap().lines() {
        let row: serde_json::Value = serde_json::from_str(line).unwrap();
        let key = row["key"].as_str().unwrap().to_string();
        decoded.insert(key, row["value"].clone());
    }
    decoded
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn avro_events_arrive_framed_and_a_stock_deserializer_decodes_each() {
    let url = registry_url();
    let db = TestDb::new().await;
    db.create_slot().await;
    let topic = db.topic("order");
    let schema_id = register(&url, &topic).await;
    let mut relay = RelayProcess::start(&avro_env(&db, &url, &[]), "registry_avro");
    wait_for_slot(&db, &mut relay).await;

    let sent = events(1_000, "order");
    write_in_batches(&db, &sent, 100).await;
    let (received, _) = expect_all(
        "avro",
        std::slice::from_ref(&topic),
        &sent,
        Duration::from_secs(60),
        Duration::from_millis(500),
        &relay,
    )
    .await;
    assert_framed(&received, schema_id);
    // The schema is cached: one lookup for the subject, not one per record.
    let lookups = registry_requests(&format!("/subjects/{topic}-value/versions/latest"));
    assert_eq!(
        lookups, 1,
        "registry lookups of the subject for 1,000 events"
    );

    let decoded = decode_with_confluent(&url, &topic, sent.len());
    assert_eq!(decoded.len(), sent.len(), "one decoded record per event");
    for event in &sent {
        let original: serde_json::Value = serde_json::from_str(&event.payload).unwrap();
        assert_eq!(
            decoded.get(&event.id),
            Some(&original),
            "event {} decodes to its original content",
            event.id
        );
    }
    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

/// One relay run per format (lean): 1,000 events arrive framed with the subject's schema id
/// and decode with Confluent's deserializer (`decoder`) to their original content; one more
/// event among them, `bad_payload`, breaks the schema and is dead-lettered with reason
/// `schema` and the validator's message (`says`), and only it.
async fn contract_end_to_end(
    format: &str,
    schema_type: &str,
    schema: &str,
    bad_payload: &str,
    says: &str,
    decoder: &[&str],
) {
    let url = registry_url();
    let db = TestDb::new().await;
    db.create_slot().await;
    let topic = db.topic("order");
    let schema_id = client(&url)
        .register(&format!("{topic}-value"), schema, schema_type)
        .await
        .expect("register the event schema");
    let env = serialization_env(&db, &url, format, &[]);
    let mut relay = RelayProcess::start(&env, &format!("registry_{format}"));
    wait_for_slot(&db, &mut relay).await;

    let mut sent = events(1_001, "order");
    sent[500].payload = bad_payload.into();
    write_in_batches(&db, &sent, 100).await;
    let bad = sent.remove(500);
    let (received, _) = expect_all(
        format,
        std::slice::from_ref(&topic),
        &sent,
        Duration::from_secs(60),
        Duration::from_millis(500),
        &relay,
    )
    .await;
    assert!(
        received.iter().all(|r| r.key_str() != bad.id),
        "the payload that breaks the schema reached the topic"
    );
    assert_framed(&received, schema_id);

    let dead = read_ids(
        &[db.topic("dlq")],
        1,
        std::slice::from_ref(&bad.id),
        Duration::from_secs(30),
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(dead.len(), 1, "one dead letter:\n{}", relay.log_text());
    let letter = &dead[0];
    assert_eq!(letter.key_str(), bad.id);
    assert_eq!(letter.header("outbox-relay.dlq.reason"), Some("schema"));
    let error = letter.header("outbox-relay.dlq.error").unwrap();
    assert!(error.contains(&format!("{topic}-value")), "{error}");
    assert!(error.contains(says), "{error}");

    let decoded = decode_as(&url, &topic, sent.len(), decoder);
    assert_eq!(decoded.len(), sent.len(), "one decoded record per event");
    assert_decoded_to_originals(&decoded, &sent);
    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn json_schema_events_are_validated_framed_and_decoded_by_a_stock_deserializer() {
    contract_end_to_end(
        "json_schema",
        "JSON",
        EVENT_JSON_SCHEMA,
        r#"{"seq": -1, "note": "x", "writer": 0}"#,
        "at /seq: must be >=0, but got -1",
        &["json"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn protobuf_events_arrive_encoded_and_a_stock_deserializer_decodes_each() {
    // The consumer's message class is generated from the same .proto (protoc, in consume.py).
    let dir = std::env::temp_dir().join(format!("registry-proto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let proto = dir.join("event.proto");
    std::fs::write(&proto, EVENT_PROTO).unwrap();
    contract_end_to_end(
        "protobuf",
        "PROTOBUF",
        EVENT_PROTO,
        r#"{"seq": 1, "note": "x", "writer": 0, "colour": "red"}"#,
        "colour",
        &["protobuf", proto.to_str().unwrap()],
    )
    .await;
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_payload_that_breaks_the_schema_is_dead_lettered_and_its_neighbours_arrive() {
    let url = registry_url();
    let db = TestDb::new().await;
    db.create_slot().await;
    let topic = db.topic("order");
    let schema_id = register(&url, &topic).await;
    let mut relay = RelayProcess::start(&avro_env(&db, &url, &[]), "registry_bad_payload");
    wait_for_slot(&db, &mut relay).await;

    let mut sent = events(5, "order");
    sent[2].payload = r#"{"seq": "two", "note": "x", "writer": 0}"#.into();
    write_in_batches(&db, &sent, 5).await;
    let good: Vec<Event> = sent
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, e)| e.clone())
        .collect();
    let (received, _) = expect_all(
        "neighbours",
        std::slice::from_ref(&topic),
        &good,
        Duration::from_secs(60),
        Duration::from_millis(500),
        &relay,
    )
    .await;
    assert_eq!(received.len(), 4, "only the four neighbours on the topic");
    assert_framed(&received, schema_id);

    let dead = read_ids(
        &[db.topic("dlq")],
        1,
        &[sent[2].id.clone()],
        Duration::from_secs(30),
        Duration::from_millis(500),
    )
    .await;
    assert_eq!(dead.len(), 1, "one dead letter:\n{}", relay.log_text());
    let letter = &dead[0];
    assert_eq!(letter.header("outbox-relay.dlq.reason"), Some("schema"));
    let error = letter.header("outbox-relay.dlq.error").unwrap();
    assert!(error.contains(&format!("{topic}-value")), "{error}");
    assert!(error.contains("Avro schema"), "{error}");
    // The dead letter keeps the original payload, unencoded.
    assert_eq!(letter.payload.as_deref(), Some(sent[2].payload.as_bytes()));
    relay.terminate(Duration::from_secs(30));

    // The contract changes to take it (`seq` a string); redriven, it is encoded with the
    // new version, never sent as the raw JSON of its dead letter.
    let v2 = EVENT_SCHEMA.replace(
        r#"{"name":"seq","type":"long"}"#,
        r#"{"name":"seq","type":"string"}"#,
    );
    let v2_id = client(&url)
        .register(&format!("{topic}-value"), &v2, "AVRO")
        .await
        .expect("register version 2");
    assert_ne!(v2_id, schema_id, "version 2 has an id of its own");
    let report = redrive(&avro_env(&db, &url, &[]), &[]);
    assert_eq!(report["redriven"], 1, "{report:#}");
    let redriven = read_ids(
        std::slice::from_ref(&topic),
        1,
        &[sent[2].id.clone()],
        Duration::from_secs(30),
        Duration::from_millis(500),
    )
    .await;
    let redriven: Vec<Received> = redriven
        .into_iter()
        .filter(|r| r.key_str() == sent[2].id)
        .collect();
    assert_eq!(redriven.len(), 1, "the redriven record, once");
    assert_framed(&redriven, v2_id);
    let decoded = decode_with_confluent(&url, &topic, 5);
    assert_eq!(decoded[&sent[2].id]["seq"], "two", "{decoded:?}");
    db.cleanup().await;
}

/// Numbers beyond their Avro field's type (3,000,000,000 in an `int`, 2^63 in a `long`) and a
/// fraction in an integer field are schema errors: dead-lettered as `schema`, never published
/// wrapped to fit; the rows around them arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn avro_numbers_out_of_their_fields_range_are_dead_lettered_not_wrapped() {
    let url = registry_url();
    let db = TestDb::new().await;
    db.create_slot().await;
    let topic = db.topic("order");
    let narrow = EVENT_SCHEMA.replace(
        r#"{"name":"writer","type":"long"}"#,
        r#"{"name":"writer","type":"int"}"#,
    );
    let schema_id = client(&url)
        .register(&format!("{topic}-value"), &narrow, "AVRO")
        .await
        .expect("register the schema");
    let mut relay = RelayProcess::start(&avro_env(&db, &url, &[]), "registry_avro_range");
    wait_for_slot(&db, &mut relay).await;

    let mut sent = events(6, "order");
    sent[1].payload = r#"{"seq": 1, "note": "x", "writer": 3000000000}"#.into();
    sent[3].payload = r#"{"seq": 9223372036854775808, "note": "x", "writer": 0}"#.into();
    sent[4].payload = r#"{"seq": 1.5, "note": "x", "writer": 0}"#.into();
    sent[5].payload = r#"{"seq": 9223372036854775807, "note": "x", "writer": 2147483647}"#.into();
    write_in_batches(&db, &sent, 6).await;
    let bad = [1, 3, 4];
    let good: Vec<Event> = (0..6)
        .filter(|i| !bad.contains(i))
        .map(|i| sent[i].clone())
        .collect();
    let (received, _) = expect_all(
        "in range",
        std::slice::from_ref(&topic),
        &good,
        Duration::from_secs(60),
        Duration::from_millis(500),
        &relay,
    )
    .await;
    assert_eq!(
        received.len(),
        3,
        "none of the out-of-range rows is published"
    );
    assert_framed(&received, schema_id);
    let bad_ids: Vec<String> = bad.iter().map(|&i| sent[i].id.clone()).collect();
    let dead = read_ids(
        &[db.topic("dlq")],
        1,
        &bad_ids,
        Duration::from_secs(30),
        Duration::from_secs(1),
    )
    .await;
    assert_eq!(dead.len(), 3, "three dead letters:\n{}", relay.log_text());
    for letter in &dead {
        assert_eq!(letter.header("outbox-relay.dlq.reason"), Some("schema"));
        let error = letter.header("outbox-relay.dlq.error").unwrap();
        assert!(
            error.contains("out of range") || error.contains("not an integer"),
            "{error}"
        );
    }
    // The bounds themselves are published exactly.
    let decoded = decode_with_confluent(&url, &topic, 3);
    assert_eq!(decoded[&sent[5].id]["seq"], i64::MAX, "{decoded:?}");
    assert_eq!(decoded[&sent[5].id]["writer"], i32::MAX, "{decoded:?}");
    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

/// `schema_id_header`: each record is encoded with the schema whose id its header (here the
/// event type, header `type`) names, not the subject's latest; a value that is no id is
/// dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schema_id_from_a_header_picks_each_records_schema() {
    let url = registry_url();
    let db = TestDb::new().await;
    db.create_slot().await;
    let topic = db.topic("order");
    let v1 = register(&url, &topic).await;
    let v2_schema = EVENT_SCHEMA.replace(
        r#"{"name":"seq","type":"long"}"#,
        r#"{"name":"seq","type":"string"}"#,
    );
    let v2 = client(&url)
        .register(&format!("{topic}-value"), &v2_schema, "AVRO")
        .await
        .expect("register version 2");
    let env = avro_env(
        &db,
        &url,
        &[(
            "OUTBOX_RELAY__OUTBOX__SERIALIZATION__SCHEMA_ID_HEADER",
            "type",
        )],
    );
    let mut relay = RelayProcess::start(&env, "registry_schema_id");
    wait_for_slot(&db, &mut relay).await;

    let mut sent = events(4, "order");
    sent[0].event_type = v1.to_string();
    sent[1].event_type = v1.to_string();
    sent[2].event_type = v2.to_string();
    sent[2].payload = r#"{"seq": "two", "note": "x", "writer": 0}"#.into();
    sent[3].event_type = "Created".into();
    write_in_batches(&db, &sent, 4).await;
    let (received, _) = expect_all(
        "schema id header",
        std::slice::from_ref(&topic),
        &sent[..3],
        Duration::from_secs(60),
        Duration::from_millis(500),
        &relay,
    )
    .await;
    assert_eq!(received.len(), 3, "three records on the topic");
    for r in &received {
        let want = if r.key_str() == sent[2].id { v2 } else { v1 };
        assert_framed(std::slice::from_ref(r), want);
    }
    let dead = read_ids(
        &[db.topic("dlq")],
        1,
        std::slice::from_ref(&sent[3].id),
        Duration::from_secs(30),
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(dead.len(), 1, "one dead letter:\n{}", relay.log_text());
    assert_eq!(dead[0].header("outbox-relay.dlq.reason"), Some("schema"));
    let error = dead[0].header("outbox-relay.dlq.error").unwrap();
    assert!(
        error.contains("header `type` is not a schema id"),
        "{error}"
    );

    let decoded = decode_with_confluent(&url, &topic, 3);
    assert_decoded_to_originals(&decoded, &sent[..3]);
    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

/// `subject_strategy = "record"`: a row whose event type names no registered subject (an
/// application's typo) is its own fault. It is dead-lettered as `schema`, naming the subject
/// and the fix; the 200 valid rows behind it, on another topic, all arrive, and nothing else
/// is dead-lettered. (Before, the relay waited on the 404 inline and nothing moved.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_row_naming_an_unregistered_subject_is_dead_lettered_and_the_rows_behind_it_arrive() {
    let url = registry_url();
    let db = TestDb::new().await;
    db.create_slot().await;
    // Subjects are the registry's, shared by the tests: named after this test's topics.
    let good_subject = db.topic("Good");
    let typo_subject = db.topic("Goood");
    let schema_id = client(&url)
        .register(&good_subject, EVENT_SCHEMA, "AVRO")
        .await
        .expect("register the event schema");
    let env = avro_env(
        &db,
        &url,
        &[(
            "OUTBOX_RELAY__OUTBOX__SERIALIZATION__SUBJECT_STRATEGY",
            "record",
        )],
    );
    let mut relay = RelayProcess::start(&env, "registry_unregistered_subject");
    wait_for_slot(&db, &mut relay).await;

    let mut typo = Event::new("typo", "t1", 0, 0);
    typo.event_type = typo_subject.clone();
    write_in_batches(&db, std::slice::from_ref(&typo), 1).await;
    let mut valid = events(200, "order");
    for e in &mut valid {
        e.event_type = good_subject.clone();
    }
    let started = std::time::Instant::now();
    write_in_batches(&db, &valid, 20).await;
    let topic = db.topic("order");
    let (received, _) = expect_all(
        "behind the unregistered subject",
        std::slice::from_ref(&topic),
        &valid,
        Duration::from_secs(60),
        Duration::from_millis(500),
        &relay,
    )
    .await;
    println!(
        "unregistered subject: all 200 valid rows arrived {:.1} s after they were written",
        started.elapsed().as_secs_f64()
    );
    assert_framed(&received, schema_id);

    let dead = read_ids(
        &[db.topic("dlq")],
        1,
        std::slice::from_ref(&typo.id),
        Duration::from_secs(30),
        Duration::from_secs(2),
    )
    .await;
    let ids: Vec<String> = dead.iter().map(|d| d.key_str().to_string()).collect();
    assert_eq!(ids, vec![typo.id.clone()], "only the typo is dead-lettered");
    assert_eq!(dead[0].header("outbox-relay.dlq.reason"), Some("schema"));
    let error = dead[0].header("outbox-relay.dlq.error").unwrap();
    assert!(error.contains(&typo_subject), "{error}");
    assert!(error.contains("subject_strategy"), "{error}");
    assert!(error.contains("dead-letters redrive"), "{error}");
    let typo_topic = db.topic("typo");
    let on_typo_topic = read_until(
        std::slice::from_ref(&typo_topic),
        1,
        Duration::from_secs(2),
        Duration::ZERO,
        |_| false,
    )
    .await;
    assert!(on_typo_topic.is_empty(), "the typo row is never published");
    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

/// The registry down for 20 s mid-stream. A subject whose `latest` schema is cached keeps
/// flowing with it although its refresh fails (`latest_ttl_ms` short: the relay asks again
/// every half second), and `outbox_relay_schema_registry_stale_seconds` shows it; a subject
/// not cached yet waits, `/readyz` is red meanwhile. Nothing is dead-lettered, nothing lost.
/// Its own registry, so that the outage does not hit the other tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_registry_outage_blocks_and_loses_nothing() {
    let own_dir = format!("{}/registry-outage", run_dir());
    let url = registry_script(&own_dir, "start");
    let db = TestDb::new().await;
    db.create_slot().await;
    let topic = db.topic("order");
    let schema_id = register(&url, &topic).await;
    // Registered, but no record of it comes before the outage: not cached.
    let uncached = db.topic("customer");
    let uncached_id = register(&url, &uncached).await;
    let port = free_port();
    let env = avro_env(
        &db,
        &url,
        &[
            ("OUTBOX_RELAY__OUTBOX__SERIALIZATION__LATEST_TTL_MS", "500"),
            (
                "OUTBOX_RELAY__OUTBOX__SERIALIZATION__REQUEST_TIMEOUT_MS",
                "2000",
            ),
            ("OUTBOX_RELAY__HTTP__LISTEN", &format!("127.0.0.1:{port}")),
        ],
    );
    let mut relay = RelayProcess::start(&env, "registry_outage");
    wait_for_slot(&db, &mut relay).await;
    let ready = || http_get(port, "/readyz").map(|(status, _)| status);

    let before = events(50, "order");
    write_in_batches(&db, &before, 10).await;
    // Delivered: the subject's schema is cached before the registry goes (however slow its
    // first answer on a loaded machine).
    expect_all(
        "before the outage",
        std::slice::from_ref(&topic),
        &before,
        Duration::from_secs(60),
        Duration::ZERO,
        &relay,
    )
    .await;
    wait_for(
        "ready before the outage",
        Duration::from_secs(30),
        || async { ready() == Some(200) },
    )
    .await;

    registry_script(&own_dir, "stop");
    let stopped = std::time::Instant::now();
    // The cached subject: served stale, its records arrive during the outage.
    let during = events(100, "order");
    write_in_batches(&db, &during, 10).await;
    let mut flowing = before.clone();
    flowing.extend(during.iter().cloned());
    let (received, _) = expect_all(
        "cached subject during the outage",
        std::slice::from_ref(&topic),
        &flowing,
        Duration::from_secs(60),
        Duration::from_millis(500),
        &relay,
    )
    .await;
    assert_framed(&received, schema_id);
    let (_, body) = http_get(port, "/metrics").unwrap();
    let stale = format!("outbox_relay_schema_registry_stale_seconds{{subject=\"{topic}-value\"}}");
    assert!(metric(&body, &stale).is_some(), "{stale} in\n{body}");

    // The subject not cached: its records (and what follows them) wait.
    let waiting = events(100, "customer");
    write_in_batches(&db, &waiting, 10).await;
    wait_for(
        "/readyz red while the registry is down",
        Duration::from_secs(15),
        || async { ready() == Some(503) },
    )
    .await;
    let (_, body) = http_get(port, "/metrics").unwrap();
    let series = format!("outbox_relay_schema_registry_blocked{{subject=\"{uncached}-value\"}}");
    assert_eq!(metric(&body, &series), Some(1.0), "{series} in\n{body}");
    tokio::time::sleep(Duration::from_secs(20).saturating_sub(stopped.elapsed())).await;
    assert_eq!(
        ready(),
        Some(503),
        "still red after 20 s without the registry"
    );
    registry_script(&own_dir, "start");

    let (received, _) = expect_all(
        "outage",
        std::slice::from_ref(&uncached),
        &waiting,
        Duration::from_secs(90),
        Duration::from_secs(1),
        &relay,
    )
    .await;
    assert_framed(&received, uncached_id);
    wait_for("ready again", Duration::from_secs(30), || async {
        ready() == Some(200)
    })
    .await;
    // The next record of the cached subject refreshes its schema: no longer stale.
    let after = events(10, "order");
    write_in_batches(&db, &after, 10).await;
    expect_all(
        "after the outage",
        std::slice::from_ref(&topic),
        &after,
        Duration::from_secs(30),
        Duration::from_millis(500),
        &relay,
    )
    .await;
    let (_, body) = http_get(port, "/metrics").unwrap();
    assert_eq!(metric(&body, &stale), None, "refreshed again:\n{body}");
    let dead = read_until(
        &[db.topic("dlq")],
        1,
        Duration::from_secs(3),
        Duration::ZERO,
        |_| false,
    )
    .await;
    assert!(
        dead.is_empty(),
        "{} dead letters during the outage",
        dead.len()
    );
    relay.terminate(Duration::from_secs(30));
    registry_script(&own_dir, "stop");
    db.cleanup().await;
}

/// At-least-once, a subject missing for one topic (`auto_register` off, the operator has not
/// registered it yet) holds that topic alone: the other topic's events written after its
/// events arrive, `/readyz` is red and names nothing dead-lettered, the slot stays below the
/// first waiting event; once the subject is registered, the waiting events arrive, each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_subject_missing_for_one_topic_holds_only_that_topic() {
    let url = registry_url();
    let db = TestDb::new().await;
    db.create_slot().await;
    let (order, customer) = (db.topic("order"), db.topic("customer"));
    let order_id = register(&url, &order).await;
    let port = free_port();
    let env = avro_env(
        &db,
        &url,
        &[("OUTBOX_RELAY__HTTP__LISTEN", &format!("127.0.0.1:{port}"))],
    );
    let mut relay = RelayProcess::start(&env, "registry_missing_subject");
    wait_for_slot(&db, &mut relay).await;

    let mut client = db.client().await;
    let waiting = events(20, "customer");
    let first_waiting = insert_events_at(&mut client, &waiting[..10], true).await;
    insert_events(&mut client, &waiting[10..], true).await;
    let flowing = events(50, "order");
    write_in_batches(&db, &flowing, 10).await;
    let (received, _) = expect_all(
        "the other topic, behind the waiting one",
        std::slice::from_ref(&order),
        &flowing,
        Duration::from_secs(60),
        Duration::ZERO,
        &relay,
    )
    .await;
    assert_framed(&received, order_id);
    wait_for("/readyz red", Duration::from_secs(15), || async {
        http_get(port, "/readyz").is_some_and(|(status, _)| status == 503)
    })
    .await;
    let (_, body) = http_get(port, "/metrics").unwrap();
    let series = format!("outbox_relay_schema_registry_blocked{{subject=\"{customer}-value\"}}");
    assert_eq!(metric(&body, &series), Some(1.0), "{series} in\n{body}");
    let early = read_until(
        std::slice::from_ref(&customer),
        1,
        Duration::from_secs(2),
        Duration::ZERO,
        |_| false,
    )
    .await;
    assert!(
        early.is_empty(),
        "{} records without their schema",
        early.len()
    );
    let confirmed = db.confirmed_flush_lsn().await;
    assert!(
        confirmed <= first_waiting,
        "the slot ({confirmed:X}) passed the first waiting event ({first_waiting:X})"
    );

    let customer_id = register(&url, &customer).await;
    let (received, _) = expect_all(
        "the waiting topic, once its subject is registered",
        std::slice::from_ref(&customer),
        &waiting,
        Duration::from_secs(60),
        Duration::from_secs(1),
        &relay,
    )
    .await;
    assert_framed(&received, customer_id);
    let dead = read_until(
        &[db.topic("dlq")],
        1,
        Duration::from_secs(2),
        Duration::ZERO,
        |_| false,
    )
    .await;
    assert!(dead.is_empty(), "{} dead letters", dead.len());
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

/// A registry that takes connections and answers nothing, in front of the shared one, until
/// [`SilentRegistry::answer`]: then each connection, held or new, is passed through to it.
/// Its tasks end when it is dropped.
struct SilentRegistry {
    /// The ccompat URL through it.
    url: String,
    answering: tokio::sync::watch::Sender<bool>,
    /// Connections taken while silent.
    held: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl SilentRegistry {
    async fn start(registry_url: &str) -> SilentRegistry {
        let upstream = registry_url
            .strip_prefix("http://")
            .and_then(|rest| rest.split('/').next())
            .expect("an http:// registry URL")
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let here = listener.local_addr().unwrap().to_string();
        let url = registry_url.replacen(&upstream, &here, 1);
        let (answering, answered) = tokio::sync::watch::channel(false);
        let held = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = held.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let mut answered = answered.clone();
                if !*answered.borrow() {
                    counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if answered.wait_for(|answering| *answering).await.is_err() {
                        return;
                    }
                    if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        SilentRegistry {
            url,
            answering,
            held,
            accept,
        }
    }

    fn held(&self) -> usize {
        self.held.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn answer(&self) {
        self.answering.send_replace(true);
    }
}

impl Drop for SilentRegistry {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// A registry that does not answer holds only the topics whose schemas it must give (issue
/// 50, point 7). `public.outbox` publishes JSON (no registry); `avro_outbox` is encoded with
/// Avro by a registry that takes the relay's request and answers nothing (its
/// `request_timeout_ms` 10 min, which the config allows). While it is silent: every JSON
/// event written after the waiting Avro ones arrives, the slot is confirmed past the JSON
/// events before them and never past the first waiting one, nothing Avro is published. Once
/// the registry answers, the Avro events arrive, each once and in the order written, and the
/// slot passes everything; nothing is dead-lettered. Before the request was an arm of the
/// session's loop, it was awaited in a loop of its own that read no frame: no JSON event
/// written after the Avro ones arrived while the registry was silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_silent_registry_holds_only_the_topics_whose_schemas_it_must_give() {
    let url = registry_url();
    let silent = SilentRegistry::start(&url).await;
    let db = TestDb::new().await;
    let p = db.topic_prefix.clone();
    let (json, avro) = (db.topic("json"), db.topic("avro"));
    let pg = db.client().await;
    pg.batch_execute("CREATE TABLE avro_outbox (LIKE outbox INCLUDING ALL)")
        .await
        .unwrap();
    let avro_id = register(&url, &avro).await;
    db.create_slot().await;
    let config = format!(
        r#"
[outbox]
table = "public.outbox"
topic = "{json}"
[[outbox.tables]]
table = "public.avro_outbox"
topic = "{avro}"
[outbox.tables.serialization]
format = "avro"
registry_url = "{}"
request_timeout_ms = 600000
[dead_letter]
topic = "{p}.dlq"
"#,
        silent.url
    );
    let mut env: Vec<(String, String)> = db
        .relay_env()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("OUTBOX_RELAY__OUTBOX__"))
        .collect();
    let path = write_config(&format!("{p}-silent-registry"), &config);
    env.push(("OUTBOX_RELAY_CONFIG".into(), path.display().to_string()));
    let mut relay = RelayProcess::start(&env, "registry_silent");
    wait_for_slot(&db, &mut relay).await;

    let mut client = db.client().await;
    let before = events(20, "json");
    insert_events(&mut client, &before[..10], true).await;
    let last_before = insert_events_at(&mut client, &before[10..], true).await;
    let first_waiting = wal_insert_lsn(&pg).await;
    let waiting = events(10, "avro");
    for pair in waiting.chunks(2) {
        insert_into(&pg, "avro_outbox", pair).await;
    }
    let after = events(200, "json");
    write_in_batches(&db, &after, 10).await;
    let mut flowing = before.clone();
    flowing.extend(after.iter().cloned());
    expect_all(
        "the JSON topic while the registry is silent",
        std::slice::from_ref(&json),
        &flowing,
        Duration::from_secs(60),
        Duration::ZERO,
        &relay,
    )
    .await;
    wait_for(
        "the slot confirmed past the JSON events before the waiting ones",
        Duration::from_secs(30),
        || async { db.confirmed_flush_lsn().await > last_before },
    )
    .await;
    assert!(silent.held() > 0, "the relay never asked the registry");
    let early = read_until(
        std::slice::from_ref(&avro),
        1,
        Duration::from_secs(2),
        Duration::ZERO,
        |_| false,
    )
    .await;
    assert!(
        early.is_empty(),
        "{} records without their schema",
        early.len()
    );
    let confirmed = db.confirmed_flush_lsn().await;
    assert!(
        confirmed <= first_waiting,
        "the slot ({confirmed:X}) passed the first waiting event ({first_waiting:X})"
    );
    println!(
        "while silent: {} of {} JSON events arrived, {} registry connections held, slot {confirmed:X} (first waiting event at {first_waiting:X})",
        flowing.len(),
        flowing.len(),
        silent.held()
    );

    silent.answer();
    let (received, t) = expect_all(
        "the Avro topic once the registry answers",
        std::slice::from_ref(&avro),
        &waiting,
        Duration::from_secs(60),
        Duration::from_secs(1),
        &relay,
    )
    .await;
    assert_eq!(t.duplicates, 0, "Avro events published twice");
    assert_framed(&received, avro_id);
    let order: Vec<usize> = received
        .iter()
        .map(|r| waiting.iter().position(|e| e.id == r.key_str()).unwrap())
        .collect();
    assert_eq!(
        order,
        (0..waiting.len()).collect::<Vec<_>>(),
        "the Avro events out of the order written"
    );
    let last = insert_events_at(&mut client, &events(1, "json"), true).await;
    wait_for(
        "the slot past every event",
        Duration::from_secs(30),
        || async { db.confirmed_flush_lsn().await > last },
    )
    .await;
    let dead = read_until(
        &[db.topic("dlq")],
        1,
        Duration::from_secs(2),
        Duration::ZERO,
        |_| false,
    )
    .await;
    assert!(dead.is_empty(), "{} dead letters", dead.len());
    assert!(relay.terminate(Duration::from_secs(30)).success());
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_five_times_with_avro_loses_nothing() {
    use rand::Rng;
    let url = registry_url();
    let db = TestDb::new().await;
    db.create_slot().await;
    let topics = vec![db.topic("order"), db.topic("customer")];
    let mut ids = Vec::new();
    for topic in &topics {
        ids.push(register(&url, topic).await);
    }
    let env = avro_env(&db, &url, &[]);
    let mut relay = RelayProcess::start(&env, "registry_sigkill");
    wait_for_slot(&db, &mut relay).await;

    let writer_db = db.clone();
    let writing = tokio::spawn(async move {
        write_concurrently(&writer_db, 2, 4_000, 20, Duration::from_millis(60)).await
    });
    // Each kill while the relay streams (and serializes): it was restarted and holds the slot.
    for kill in 1..=5 {
        let wait = rand::thread_rng().gen_range(200..900);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        assert!(
            !writing.is_finished(),
            "the writers were done before kill {kill}"
        );
        relay.kill9();
        println!("kill {kill}: SIGKILL after {wait} ms of streaming");
        relay = RelayProcess::start(&env, "registry_sigkill");
        wait_for_slot(&db, &mut relay).await;
    }
    let committed: Vec<Event> = writing.await.unwrap().into_iter().flatten().collect();
    let wanted: Vec<String> = committed.iter().map(|e| e.id.clone()).collect();
    let received = read_ids(
        &topics,
        1,
        &wanted,
        Duration::from_secs(120),
        Duration::from_secs(1),
    )
    .await;
    let t = assert_none_missing("sigkill avro", &committed, &received, &relay.log_text());
    println!(
        "sigkill avro: {} duplicates (at-least-once redelivery)",
        t.duplicates
    );
    for r in &received {
        let id = wire::schema_id(r.payload.as_deref().unwrap());
        assert!(
            id.is_some_and(|id| ids.contains(&id)),
            "record {} framed with {id:?}, not one of {ids:?}",
            r.key_str()
        );
    }
    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

/// `check` asks the registry for the subject of every topic the outbox's rows map to: a
/// registered one is ok, a missing one a problem naming the fix; without the registry, a
/// problem saying it is unreachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_verifies_the_subjects_against_the_registry() {
    let url = registry_url();
    let db = TestDb::new().await;
    register(&url, &db.topic("order")).await;
    let mut client = db.client().await;
    insert_events(&mut client, &events(1, "order"), true).await;
    insert_events(&mut client, &events(1, "customer"), true).await;
    let items = |env: Vec<(String, String)>| async move {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
            .args(["check", "--json"])
            .envs(env)
            .env_remove("OUTBOX_RELAY_CONFIG")
            .output()
            .await
            .expect("run outbox-relay check");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "check --json: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        report["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i["check"] == "schema registry")
            .map(|i| {
                (
                    i["status"].as_str().unwrap().to_string(),
                    i["detail"].to_string(),
                )
            })
            .collect::<Vec<_>>()
    };
    let found = items(avro_env(&db, &url, &[])).await;
    let order = format!("subject `{}-value`", db.topic("order"));
    let customer = format!("subject `{}-value`", db.topic("customer"));
    assert!(
        found.iter().any(|(s, d)| s == "ok" && d.contains(&order)),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|(s, d)| s == "problem" && d.contains(&customer) && d.contains("404")),
        "{found:?}"
    );
    // json_schema: a JSON Schema that compiles is ok; the Avro one is the wrong format.
    self::client(&url)
        .register(
            &format!("{}-value", db.topic("customer")),
            EVENT_JSON_SCHEMA,
            "JSON",
        )
        .await
        .expect("register the JSON Schema");
    let json = items(serialization_env(&db, &url, "json_schema", &[])).await;
    assert!(
        json.iter()
            .any(|(s, d)| s == "ok" && d.contains(&customer) && d.contains("parses")),
        "{json:?}"
    );
    assert!(
        json.iter()
            .any(|(s, d)| s == "problem" && d.contains(&order) && d.contains("AVRO schema")),
        "{json:?}"
    );
    let down = items(avro_env(&db, "http://127.0.0.1:1/apis/ccompat/v7", &[])).await;
    assert!(
        !down.is_empty()
            && down
                .iter()
                .all(|(s, d)| s == "problem" && d.contains("unreachable")),
        "{down:?}"
    );
    db.cleanup().await;
}

/// Each event decoded (by Confluent's deserializer, keyed by event id) to its original payload.
fn assert_decoded_to_originals(decoded: &HashMap<String, serde_json::Value>, events: &[Event]) {
    for event in events {
        let original: serde_json::Value = serde_json::from_str(&event.payload).unwrap();
        assert_eq!(
            decoded.get(&event.id),
            Some(&original),
            "event {} decodes to its original content",
            event.id
        );
    }
}

/// One record as `consume.py --key=…` decoded it with Confluent's deserializers.
#[derive(Debug)]
struct Decoded {
    key: String,
    key_schema_id: u64,
    /// `None` for an unframed value (`format = "none"`).
    schema_id: Option<u64>,
    partition: i32,
    offset: i64,
    value: serde_json::Value,
}

/// Decodes `count` records of `topic`, key and value, with Confluent's deserializers
/// (`consume.py`'s KEY_FORMAT and FORMAT).
fn decode_keyed(url: &str, topic: &str, count: usize, key: &str, value: &str) -> Vec<Decoded> {
    let out = Command::new(python())
        .arg(repo_path("scripts/registry/consume.py"))
        .arg(format!("--key={key}"))
        .args([&brokers(), url, topic, &count.to_string(), "120", value])
        .stderr(Stdio::inherit())
        .output()
        .expect("run consume.py");
    assert!(
        out.status.success(),
        "consume.py --key={key} {topic} failed"
    );
    let lines = String::from_utf8(out.stdout).unwrap();
    lines
        .lines()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            Decoded {
                key: row["key"].as_str().expect("a decoded string key").into(),
                key_schema_id: row["key_schema_id"].as_u64().unwrap(),
                schema_id: row["schema_id"].as_u64(),
                partition: row["partition"].as_i64().unwrap() as i32,
                offset: row["offset"].as_i64().unwrap(),
                value: row["value"].clone(),
            }
        })
        .collect()
}

/// The latest schema id of `subject`.
async fn subject_id(url: &str, subject: &str) -> u32 {
    client(url)
        .version(subject, outbox_relay::config::SchemaVersion::Latest)
        .await
        .unwrap_or_else(|e| panic!("subject {subject}: {e}"))
        .id
}

/// Each of `events` arrived `copies` times, every copy framed (value and key) with the given
/// ids, decoded to the original, and in the partition its string key would have had (the
/// aggregate's, or with `by_key` the event id's), each aggregate in order.
fn assert_each_table_encoded(
    decoded: &[Decoded],
    events: &[Event],
    ids: (Option<u64>, u64),
    by_key: bool,
    copies: usize,
) {
    use outbox_relay::mapping::partition::partition_for_key;
    assert_eq!(decoded.len(), events.len() * copies, "records on the topic");
    let by_id: HashMap<&str, &Event> = events.iter().map(|e| (e.id.as_str(), e)).collect();
    let mut runs: HashMap<(i32, &str), Vec<i64>> = HashMap::new();
    let mut in_order: Vec<&Decoded> = decoded.iter().collect();
    in_order.sort_by_key(|d| (d.partition, d.offset));
    for d in in_order {
        let event = by_id.get(d.key.as_str()).unwrap_or_else(|| {
            panic!(
                "key {:?} is no event id (not decoded as a string key)",
                d.key
            )
        });
        assert_eq!((d.schema_id, d.key_schema_id), ids, "record {}", d.key);
        let original: serde_json::Value = serde_json::from_str(&event.payload).unwrap();
        assert_eq!(d.value, original, "record {}", d.key);
        let hashed = if by_key {
            &event.id
        } else {
            &event.aggregate_id
        };
        assert_eq!(
            d.partition,
            partition_for_key(hashed.as_bytes(), 3),
            "record {}: not the partition of its string key",
            d.key
        );
        let seq = original["seq"].as_i64().unwrap();
        runs.entry((d.partition, &event.aggregate_id))
            .or_default()
            .push(seq);
    }
    // Per aggregate, in offset order: its events as written (live), then the same again (a
    // replay, whose own order within a transaction is not the point here).
    for ((partition, aggregate), seqs) in runs {
        let mut once: Vec<i64> = seqs.clone();
        once.sort_unstable();
        once.dedup();
        assert_eq!(seqs.len(), once.len() * copies, "aggregate {aggregate}");
        assert_eq!(
            seqs[..once.len()],
            once[..],
            "aggregate {aggregate} in partition {partition}: live records out of order"
        );
        for copy in seqs.chunks(once.len()).skip(1) {
            let mut copy = copy.to_vec();
            copy.sort_unstable();
            assert_eq!(copy, once, "aggregate {aggregate}: a replayed copy");
        }
    }
}

/// The string key's `.proto` as the relay registers it (`key_format = "protobuf"`).
const KEY_PROTO: &str =
    "syntax = \"proto3\";\npackage outbox_relay;\n\nmessage Key {\n  string key = 1;\n}\n";

/// Inserts `events` into the outbox-shaped `table` in one statement.
async fn insert_into(pg: &tokio_postgres::Client, table: &str, events: &[Event]) {
    let column = |f: fn(&Event) -> &str| events.iter().map(f).collect::<Vec<&str>>();
    pg.execute(
        &format!(
            "INSERT INTO {table} (id, aggregatetype, aggregateid, type, payload)
             SELECT i::uuid, a, g, t, p::jsonb FROM unnest($1::text[], $2::text[],
               $3::text[], $4::text[], $5::text[]) WITH ORDINALITY AS u(i, a, g, t, p, n)
             ORDER BY n"
        ),
        &[
            &column(|e| &e.id),
            &column(|e| &e.aggregate_type),
            &column(|e| &e.aggregate_id),
            &column(|e| &e.event_type),
            &column(|e| &e.payload),
        ],
    )
    .await
    .unwrap();
}

/// Issue 23, per-table sections and `key_format`: `public.outbox` is encoded by the top-level
/// section (Avro values and Avro keys, both subjects auto-registered), `audit_outbox` by its
/// own (JSON Schema values and keys, the registry inherited, `partition_by = "key"`),
/// `ledger_outbox` by its own too (values as they are, Protobuf keys auto-registered). A
/// consumer with Confluent's key and value deserializers decodes every record of each; each
/// record is in the partition its plain string key would give; a replay of the range encodes
/// each table's records by its own section again; `check` verifies each table's subjects.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_table_is_encoded_by_its_own_section_and_keys_are_framed_strings() {
    let url = registry_url();
    let db = TestDb::new().await;
    let p = db.topic_prefix.clone();
    let (order, audit, ledger) = (db.topic("order"), db.topic("audit"), db.topic("ledger"));
    let pg = db.client().await;
    pg.batch_execute(
        "CREATE TABLE audit_outbox (LIKE outbox INCLUDING ALL);
         CREATE TABLE ledger_outbox (LIKE outbox INCLUDING ALL)",
    )
    .await
    .unwrap();
    for topic in [&order, &audit, &ledger] {
        create_topic(topic, 3).await;
    }
    let audit_value = client(&url)
        .register(&format!("{audit}-value"), EVENT_JSON_SCHEMA, "JSON")
        .await
        .unwrap();
    let audit_key = client(&url)
        .register(
            &format!("{audit}-key"),
            r#"{"$schema":"http://json-schema.org/draft-07/schema#","type":"string"}"#,
            "JSON",
        )
        .await
        .unwrap();
    let schema_file = write_config(&format!("{p}-event.avsc"), EVENT_SCHEMA);
    db.create_slot().await;
    let config = format!(
        r#"
[outbox]
table = "public.outbox"
topic = "{order}"
[outbox.serialization]
format = "avro"
key_format = "avro"
registry_url = "{url}"
auto_register = true
schema_file = "{}"
[[outbox.tables]]
table = "public.audit_outbox"
topic = "{audit}"
partition_by = "key"
[outbox.tables.serialization]
format = "json_schema"
key_format = "json_schema"
[[outbox.tables]]
table = "public.ledger_outbox"
topic = "{ledger}"
[outbox.tables.serialization]
format = "none"
key_format = "protobuf"
auto_register = true
[dead_letter]
topic = "{p}.dlq"
"#,
        schema_file.display()
    );
    let mut env: Vec<(String, String)> = db
        .relay_env()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("OUTBOX_RELAY__OUTBOX__"))
        .collect();
    let path = write_config(&format!("{p}-tables"), &config);
    env.push(("OUTBOX_RELAY_CONFIG".into(), path.display().to_string()));
    let mut relay = RelayProcess::start(&env, "registry_tables");
    wait_for_slot(&db, &mut relay).await;

    let since: String = pg
        .query_one("SELECT clock_timestamp()::text", &[])
        .await
        .unwrap()
        .get(0);
    let (orders, audits, ledgers) = (
        events(200, "order"),
        events(200, "audit"),
        events(200, "ledger"),
    );
    write_in_batches(&db, &orders, 50).await;
    insert_into(&pg, "audit_outbox", &audits).await;
    insert_into(&pg, "ledger_outbox", &ledgers).await;
    let mut seen = 0;
    let live = read_until(
        &[order.clone(), audit.clone(), ledger.clone()],
        3,
        Duration::from_secs(60),
        Duration::from_millis(500),
        move |_| {
            seen += 1;
            seen >= 600
        },
    )
    .await;
    assert_eq!(live.len(), 600, "live records:\n{}", relay.log_text());
    relay.terminate(Duration::from_secs(30));

    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["replay", "--since", &since, "--json"])
        .envs(env.iter().cloned())
        .output()
        .expect("run replay");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "replay: {report}");
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    assert_eq!(report["acknowledged"], 600, "{report:#}");

    let order_ids = (
        Some(u64::from(subject_id(&url, &format!("{order}-value")).await)),
        u64::from(subject_id(&url, &format!("{order}-key")).await),
    );
    let decoded = decode_keyed(&url, &order, 400, "avro", "avro");
    assert_each_table_encoded(&decoded, &orders, order_ids, false, 2);
    let decoded = decode_keyed(&url, &audit, 400, "json", "json");
    let audit_ids = (Some(u64::from(audit_value)), u64::from(audit_key));
    assert_each_table_encoded(&decoded, &audits, audit_ids, true, 2);
    // consume.py checks that the key's schema id names this very `.proto` text.
    let key_proto = std::env::temp_dir().join(format!("{p}_key.proto"));
    std::fs::write(&key_proto, KEY_PROTO).unwrap();
    let key = format!("protobuf:{}", key_proto.display());
    let decoded = decode_keyed(&url, &ledger, 400, &key, "plain");
    let ledger_key = u64::from(subject_id(&url, &format!("{ledger}-key")).await);
    assert_each_table_encoded(&decoded, &ledgers, (None, ledger_key), false, 2);

    // `check` verifies each table's subjects with its own section: by the Avro one, the
    // audit subjects' JSON Schemas would be "the wrong format".
    let out = Command::new(env!("CARGO_BIN_EXE_outbox-relay"))
        .args(["check", "--json"])
        .envs(env.iter().cloned())
        .output()
        .expect("run check");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let items: Vec<String> = report["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["check"] == "schema registry")
        .map(|i| format!("{} {}", i["status"], i["detail"]))
        .collect();
    for subject in [
        "order-value",
        "order-key",
        "audit-value",
        "audit-key",
        "ledger-key",
    ] {
        let wanted = format!("\"ok\" \"subject `{p}.{subject}`");
        assert!(
            items.iter().any(|i| i.starts_with(&wanted)),
            "{subject}: {items:#?}"
        );
    }
    std::fs::remove_file(key_proto).unwrap();
    db.cleanup().await;
}
