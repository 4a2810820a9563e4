//! CloudEvents records end to end (issue 13), against the real PostgreSQL and Kafka started by
//! `scripts/test.sh`: `outbox.format = "cloudevents_binary"` and `"cloudevents_structured"`,
//! checked attribute by attribute against CloudEvents 1.0 and its Kafka protocol binding, for
//! live records, records sent again by `outbox-relay replay`, and a row that cannot be an event
//! (dead-lettered with the reason).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use crate::common::*;
use base64::Engine;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");
const REPLAY_HEADER: &str = "outbox-relay-replay";
const STRUCTURED: &str = "application/cloudevents+json; charset=UTF-8";

/// One row written to an outbox table, with what its event must carry.
#[derive(Debug, Clone)]
struct Row {
    id: String,
    table: &'static str,
    aggregate_type: &'static str,
    aggregate_id: String,
    event_type: String,
    /// json text, or the raw bytes of a bytea payload
    payload: Vec<u8>,
    tenant: Option<String>,
    /// `occurred_at`, as the expected RFC 3339 text; `None`: the commit time.
    time: Option<&'static str>,
}

impl Row {
    fn source(&self) -> String {
        match self.table {
            "outbox" => "/outbox-relay/public.outbox".into(),
            _ => "//tests.example/app/public/files".into(),
        }
    }
}

/// The relay environment of `db` with `OUTBOX_RELAY_CONFIG` pointing at a file holding `toml`
/// (the outbox keys come from the file only).
fn env_with_config(db: &TestDb, name: &str, toml: &str) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = db
        .relay_env()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("OUTBOX_RELAY__OUTBOX__"))
        .collect();
    let path = write_config(name, toml);
    env.push((
        "OUTBOX_RELAY_CONFIG".into(),
        path.to_string_lossy().into_owned(),
    ));
    env
}

/// Runs `outbox-relay <args>` with `env`; returns (exit code, stdout, stderr).
async fn run(env: &[(String, String)], args: &[&str]) -> (i32, String, String) {
    let output = tokio::process::Command::new(BIN)
        .args(args)
        .envs(env.iter().cloned())
        .env_remove("OUTBOX_RELAY_LOG")
        .output()
        .await
        .expect("run outbox-relay");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn insert(client: &tokio_postgres::Client, rows: &[Row]) {
    for r in rows {
        let occurred_at = r.time.map(str::to_string);
        if r.table == "outbox" {
            let payload = String::from_utf8(r.payload.clone()).unwrap();
            client
                .execute(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, tenant, occurred_at)
                     VALUES ($1::text::uuid, $2, $3, $4, $5::text::jsonb, $6, $7::text::timestamptz)",
                    &[&r.id, &r.aggregate_type, &r.aggregate_id, &r.event_type, &payload, &r.tenant, &occurred_at],
                )
                .await
                .unwrap();
        } else {
            client
                .execute(
                    "INSERT INTO files (id, aggregatetype, aggregateid, type, payload, tenant, occurred_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7::text::timestamptz)",
                    &[&r.id, &r.aggregate_type, &r.aggregate_id, &r.event_type, &r.payload, &r.tenant, &occurred_at],
                )
                .await
                .unwrap();
        }
    }
}

/// `n` rows, alternating the jsonb outbox and the bytea `files` table.
fn rows(n: usize, tag: &str) -> Vec<Row> {
    (0..n)
        .map(|i| {
            let id = uuid::Uuid::new_v4().to_string();
            let (table, aggregate_type, payload) = if i % 2 == 0 {
                (
                    "outbox",
                    "order",
                    // Spacing and key order as jsonb prints them (shorter keys first): the
                    // text must arrive unchanged.
                    format!(r#"{{"n": {i}, "xs": [1.5, null], "tag": "{tag}", "note": "ü\"q"}}"#)
                        .into_bytes(),
                )
            } else {
                ("files", "file", vec![0, 0xff, i as u8, b'\\', b'x', 0x80])
            };
            Row {
                id,
                table,
                aggregate_type,
                aggregate_id: format!("{aggregate_type}-{}", i % 3),
                event_type: format!("{tag}.Happened{i}"),
                payload,
                tenant: (i % 4 != 3).then(|| format!("tenant-{i}")),
                time: match i % 3 {
                    0 => Some("2026-03-01T10:30:45.678Z"),
                    1 => Some("1999-12-31T23:59:59.001Z"),
                    _ => None,
                },
            }
        })
        .collect()
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ`, an RFC 3339 date-time, and the instant it names in ms.
fn rfc3339_ms(time: &str) -> i64 {
    let b = time.as_bytes();
    assert_eq!(b.len(), 24, "{time}");
    for (i, c) in b.iter().enumerate() {
        let expected_digit = !matches!(i, 4 | 7 | 10 | 13 | 16 | 19 | 23);
        assert_eq!(c.is_ascii_digit(), expected_digit, "{time} at {i}");
    }
    assert_eq!([b[4], b[7], b[10], b[13], b[16], b[19], b[23]], *b"--T::.Z");
    let t: jiff::Timestamp = time.parse().unwrap_or_else(|e| panic!("{time}: {e}"));
    t.as_millisecond()
}

/// The attributes of a record, whichever the mode: from `ce_*` headers (binary) or from the
/// JSON event (structured). Checks the mode's own rules on the way.
fn attributes(r: &Received, structured: bool) -> (HashMap<String, String>, Option<Value>) {
    if structured {
        assert_eq!(r.header("content-type"), Some(STRUCTURED), "{r:?}");
        assert!(
            !r.headers.keys().any(|h| h.starts_with("ce_")),
            "structured records carry no ce_ headers: {r:?}"
        );
        let event: Value = serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
        let mut attrs = HashMap::new();
        for (k, v) in event.as_object().unwrap() {
            if k != "data" && k != "data_base64" {
                attrs.insert(k.clone(), v.as_str().unwrap().to_string());
            }
        }
        (attrs, Some(event))
    } else {
        let mut attrs = HashMap::new();
        for (k, v) in &r.headers {
            if let Some(name) = k.strip_prefix("ce_") {
                attrs.insert(name.to_string(), String::from_utf8(v.clone()).unwrap());
            }
        }
        if let Some(ct) = r.header("content-type") {
            attrs.insert("datacontenttype".into(), ct.to_string());
        }
        (attrs, None)
    }
}

/// Checks one record against its row, attribute by attribute.
fn check(row: &Row, r: &Received, structured: bool, topic_prefix: &str) {
    assert_eq!(r.key_str(), row.id, "the key stays the event id");
    assert_eq!(r.topic, format!("{topic_prefix}.{}", row.aggregate_type));
    for plain in ["id", "type", "aggregatetype", "aggregateid"] {
        assert!(r.header(plain).is_none(), "plain header {plain} in {r:?}");
    }
    let (attrs, event) = attributes(r, structured);
    let json = row.table == "outbox";
    let mut expected: HashMap<String, String> = [
        ("specversion", "1.0".to_string()),
        ("id", row.id.clone()),
        ("source", row.source()),
        ("type", row.event_type.clone()),
        ("subject", row.aggregate_id.clone()),
        (
            "datacontenttype",
            if json {
                "application/json"
            } else {
                "application/octet-stream"
            }
            .to_string(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    if let Some(tenant) = &row.tenant {
        expected.insert("tenant".into(), tenant.clone());
    }
    // time: RFC 3339, the record timestamp; the row's occurred_at when set.
    let time = attrs.get("time").expect("time attribute").clone();
    let ms = rfc3339_ms(&time);
    assert_eq!(Some(ms), r.timestamp_ms, "time is the record timestamp");
    if let Some(t) = row.time {
        assert_eq!(time, t);
    }
    expected.insert("time".into(), time);
    assert_eq!(attrs, expected, "attributes of {}", row.id);

    match (structured, json) {
        (false, _) => assert_eq!(r.payload.as_deref(), Some(&row.payload[..])),
        (true, true) => {
            let event = event.unwrap();
            // data is the payload embedded as JSON, byte for byte.
            let text = std::str::from_utf8(r.payload.as_deref().unwrap()).unwrap();
            let embedded = format!(",\"data\":{}}}", std::str::from_utf8(&row.payload).unwrap());
            assert!(text.ends_with(&embedded), "{text}");
            let payload: Value = serde_json::from_slice(&row.payload).unwrap();
            assert_eq!(event["data"], payload);
            assert!(event.get("data_base64").is_none());
        }
        (true, false) => {
            let event = event.unwrap();
            let b64 = event["data_base64"].as_str().expect("data_base64");
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap();
            assert_eq!(bytes, row.payload);
            assert!(event.get("data").is_none());
        }
    }
}

async fn cloudevents_end_to_end(format: &str) {
    let structured = format == "cloudevents_structured";
    let db = TestDb::new().await;
    let p = db.topic_prefix.clone();
    let client = db.client().await;
    client
        .batch_execute(
            "ALTER TABLE outbox ADD COLUMN tenant text, ADD COLUMN occurred_at timestamptz;
             CREATE TABLE files (
                 id text PRIMARY KEY, aggregatetype text NOT NULL, aggregateid text NOT NULL,
                 type text NOT NULL, payload bytea, tenant text, occurred_at timestamptz,
                 created_at timestamptz NOT NULL DEFAULT now()
             );",
        )
        .await
        .unwrap();
    for topic in ["order", "file", "dlq"] {
        create_topic(&format!("{p}.{topic}"), 1).await;
    }
    let config = format!(
        r#"
[outbox]
table = "public.outbox"
topic = "{p}.{{aggregatetype}}"
format = "{format}"
timestamp_column = "occurred_at"
cloudevents_extensions = {{ tenant = "tenant" }}

[[outbox.tables]]
table = "public.files"
cloudevents_source = "//tests.example/app/{{schema}}/{{table}}"

[dead_letter]
topic = "{p}.dlq"
"#
    );
    let env = env_with_config(&db, &format!("ce_{format}"), &config);
    let mut relay = RelayProcess::start(&env, &format!("cloudevents_{format}"));
    wait_for_slot(&db, &mut relay).await;

    // Live: 12 events, then a row whose extension value has a newline (no CloudEvents string
    // may), then 8 more after `since`.
    let first = rows(12, "first");
    insert(&client, &first).await;
    let poison = Row {
        tenant: Some("acme\nevil".into()),
        ..rows(1, "poison").remove(0)
    };
    insert(&client, std::slice::from_ref(&poison)).await;
    let since: String = client
        .query_one("SELECT clock_timestamp()::text", &[])
        .await
        .unwrap()
        .get(0);
    let second = rows(8, "second");
    insert(&client, &second).await;

    let all: Vec<Row> = first.iter().chain(&second).cloned().collect();
    let topics = [format!("{p}.order"), format!("{p}.file")];
    let ids: Vec<String> = all.iter().map(|r| r.id.clone()).collect();
    let live = read_ids(
        &topics,
        1,
        &ids,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await;
    let by_id: HashMap<String, &Received> = live.iter().map(|r| (r.key_str(), r)).collect();
    let missing: Vec<&String> = ids.iter().filter(|i| !by_id.contains_key(*i)).collect();
    assert!(
        missing.is_empty(),
        "{format}: {} of {} events missing, e.g. {:?}\n{}",
        missing.len(),
        ids.len(),
        &missing[..missing.len().min(3)],
        relay.log_text()
    );
    assert_eq!(live.len(), all.len(), "{format}: duplicates or strays");
    assert!(
        !by_id.contains_key(&poison.id),
        "the poison row was published"
    );
    for row in &all {
        check(row, by_id[&row.id], structured, &p);
    }
    println!("{format}: {} live records checked", all.len());

    // The invalid row is dead-lettered with the reason, and the stream went on past it.
    let dead = read_ids(
        &[format!("{p}.dlq")],
        1,
        std::slice::from_ref(&poison.id),
        Duration::from_secs(30),
        Duration::from_secs(1),
    )
    .await;
    assert_eq!(dead.len(), 1, "{format}: dead letters {dead:?}");
    let d = &dead[0];
    assert_eq!(d.key_str(), poison.id);
    assert_eq!(d.header("outbox-relay.dlq.reason"), Some("mapping"));
    let error = d.header("outbox-relay.dlq.error").unwrap();
    assert!(
        error.contains(&poison.id) && error.contains("tenant") && error.contains("U+000A"),
        "{error}"
    );
    relay.terminate(Duration::from_secs(30));

    // Replay sends the events after `since` again, in the same format.
    let (code, out, err) = run(&env, &["replay", "--since", &since, "--json"]).await;
    assert_eq!(code, 0, "replay: {out}\n{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["acknowledged"], second.len(), "{report:#}");
    let expected = all.len() + second.len();
    let mut seen = 0;
    let records = read_until(
        &topics,
        1,
        Duration::from_secs(60),
        Duration::from_secs(2),
        move |_| {
            seen += 1;
            seen >= expected
        },
    )
    .await;
    let replayed: Vec<&Received> = records
        .iter()
        .filter(|r| r.header(REPLAY_HEADER).is_some())
        .collect();
    assert_eq!(replayed.len(), second.len(), "{format}: replayed records");
    assert_eq!(records.len(), expected, "{format}: records in all");
    let second_ids: HashSet<&str> = second.iter().map(|r| r.id.as_str()).collect();
    for r in &replayed {
        let row = second.iter().find(|row| row.id == r.key_str()).unwrap();
        assert!(second_ids.contains(r.key_str().as_str()));
        let live = by_id[&row.id];
        if row.time.is_some() {
            // Same event, same record: headers (but the replay mark) and value.
            let mut headers = r.headers.clone();
            headers.remove(REPLAY_HEADER);
            assert_eq!(headers, live.headers, "{format}: headers of {}", row.id);
            assert_eq!(r.payload, live.payload, "{format}: value of {}", row.id);
        }
        let mut unmarked = (*r).clone();
        unmarked.headers.remove(REPLAY_HEADER);
        check(row, &unmarked, structured, &p);
    }
    println!("{format}: {} replayed records checked", replayed.len());
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binary_mode_records_are_cloudevents_live_replayed_and_dead_lettered() {
    cloudevents_end_to_end("cloudevents_binary").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn structured_mode_records_are_cloudevents_live_replayed_and_dead_lettered() {
    cloudevents_end_to_end("cloudevents_structured").await;
}
