//! `[tracing]` against the real PostgreSQL and Kafka and a test OTLP receiver (an HTTP server
//! here that decodes each `ExportTraceServiceRequest`): one PRODUCER span per event, child of
//! the row's trace context, its attributes matching the Kafka record, and the record's
//! `traceparent` naming it; tracing off sends nothing; an unreachable collector only counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::common::probe::{free_port, http_get, metric};
use crate::common::*;

/// A span as the receiver got it.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    start_ns: u64,
    end_ns: u64,
    attributes: HashMap<String, String>,
}

/// The test OTLP/HTTP receiver: every span of every request, and how many requests came.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Got>>>,
    requests: Arc<Mutex<usize>>,
}

impl Receiver {
    async fn start() -> (Receiver, u16) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let receiver = Receiver::default();
        let serving = receiver.clone();
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serving.clone().connection(socket));
            }
        });
        (receiver, port)
    }

    /// HTTP/1.1 requests on one connection (the exporter keeps it alive), each answered 200.
    async fn connection(self, socket: tokio::net::TcpStream) {
        let mut socket = BufReader::new(socket);
        loop {
            let mut length = 0;
            loop {
                let mut line = String::new();
                if socket.read_line(&mut line).await.unwrap_or(0) == 0 {
                    return;
                }
                if line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':') {
                    if name.eq_ignore_ascii_case("content-length") {
                        length = value.trim().parse().unwrap();
                    }
                }
            }
            let mut body = vec![0; length];
            socket.read_exact(&mut body).await.unwrap();
            self.take(&body);
            let ok = b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
            if socket.get_mut().write_all(ok).await.is_err() {
                return;
            }
        }
    }

    fn take(&self, body: &[u8]) {
        let request = ExportTraceServiceRequest::decode(body).expect("an OTLP trace request");
        *self.requests.lock().unwrap() += 1;
        let mut spans = self.spans.lock().unwrap();
        for resource in request.resource_spans {
            let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
            let service = text_attributes(&attributes)
                .remove("service.name")
                .unwrap_or_default();
            for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
                spans.push(Got {
                    service: service.clone(),
                    name: span.name,
                    kind: span.kind,
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent_span_id: hex::encode(&span.parent_span_id),
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                    attributes: text_attributes(&span.attributes),
                });
            }
        }
    }

    fn spans(&self) -> Vec<Got> {
        self.spans.lock().unwrap().clone()
    }

    fn requests(&self) -> usize {
        *self.requests.lock().unwrap()
    }
}

/// Attribute values as text (ints and doubles formatted), to compare with Kafka's.
fn text_attributes(
    attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue],
) -> HashMap<String, String> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => s.clone(),
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// What the row's trace context column holds for each kind of event.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Context {
    Sampled,
    Unsampled,
    None,
}

struct Row {
    event: Event,
    context: Context,
    /// The row's trace id and span id (random per row).
    trace_id: String,
    span_id: String,
}

impl Row {
    fn traceparent(&self) -> Option<String> {
        let flags = match self.context {
            Context::Sampled => "01",
            Context::Unsampled => "00",
            Context::None => return None,
        };
        Some(format!("00-{}-{}-{flags}", self.trace_id, self.span_id))
    }
}

fn rows(aggregate_type: &str, n: usize, context: Context) -> Vec<Row> {
    (0..n)
        .map(|i| Row {
            event: Event::new(aggregate_type, &format!("agg-{}", i % 7), 0, i),
            context,
            trace_id: uuid::Uuid::new_v4().simple().to_string(),
            span_id: uuid::Uuid::new_v4().simple().to_string()[..16].to_string(),
        })
        .collect()
}

/// Inserts `rows` in transactions of `per_txn`, the trace context in column `span`.
async fn insert(db: &TestDb, rows: &[Row], per_txn: usize) {
    let mut client = db.client().await;
    for chunk in rows.chunks(per_txn) {
        let tx = client.transaction().await.unwrap();
        for row in chunk {
            let e = &row.event;
            tx.execute(
                "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, span)
                 VALUES ($1::text::uuid, $2, $3, $4, $5::text::jsonb, $6)",
                &[
                    &e.id,
                    &e.aggregate_type,
                    &e.aggregate_id,
                    &e.event_type,
                    &e.payload,
                    &row.traceparent(),
                ],
            )
            .await
            .unwrap();
        }
        tx.commit().await.unwrap();
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// A database whose outbox has a trace context column, and a relay environment tracing to
/// `endpoint_port` (`enabled`), reading that column.
async fn setup(enabled: bool, endpoint_port: u16) -> (TestDb, Vec<(String, String)>) {
    let db = TestDb::new().await;
    db.client()
        .await
        .batch_execute("ALTER TABLE outbox ADD COLUMN span text")
        .await
        .unwrap();
    let env = with(
        db.relay_env(),
        &[
            ("OUTBOX_RELAY__OUTBOX__TRACING_COLUMN", "span"),
            (
                "OUTBOX_RELAY__TRACING__ENABLED",
                if enabled { "true" } else { "false" },
            ),
            (
                "OUTBOX_RELAY__TRACING__ENDPOINT",
                &format!("http://127.0.0.1:{endpoint_port}/v1/traces"),
            ),
            ("OUTBOX_RELAY__TRACING__SERVICE_NAME", "traces-test"),
            ("OUTBOX_RELAY__TRACING__EXPORT_INTERVAL_MS", "200"),
            ("OUTBOX_RELAY__TRACING__EXPORT_TIMEOUT_MS", "2000"),
        ],
    );
    (db, env)
}

fn header_fields(record: &Received) -> (String, String, String) {
    let tp = record.header("traceparent").expect("a traceparent header");
    let parts: Vec<&str> = tp.split('-').collect();
    assert_eq!(parts.len(), 4, "traceparent `{tp}`");
    assert_eq!(parts[0], "00", "traceparent `{tp}`");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

/// 200 events with a sampled row context, 20 with an unsampled one, 20 with none: one span
/// each for the 220 sampled ones, checked against the row and the Kafka record.
async fn one_span_per_event(delivery_env: impl Fn(&TestDb) -> Vec<(String, String)>) {
    let (receiver, port) = Receiver::start().await;
    let (db, env) = setup(true, port).await;
    let env = [delivery_env(&db), env].concat();
    let topic = db.topic("order");
    create_topic(&topic, 3).await;
    let mut relay = RelayProcess::start(&env, "traces");
    wait_for_slot(&db, &mut relay).await;

    let mut all = rows("order", 200, Context::Sampled);
    all.extend(rows("order", 20, Context::Unsampled));
    all.extend(rows("order", 20, Context::None));
    let before_ns = now_ns();
    insert(&db, &all, 10).await;
    let after_ns = now_ns();
    let ids: Vec<String> = all.iter().map(|r| r.event.id.clone()).collect();
    let records = read_ids(
        std::slice::from_ref(&topic),
        3,
        &ids,
        Duration::from_secs(60),
        Duration::from_millis(500),
    )
    .await;
    let records: HashMap<String, Received> =
        records.into_iter().map(|r| (r.key_str(), r)).collect();
    assert_eq!(
        records.len(),
        all.len(),
        "events missing in Kafka:\n{}",
        relay.log_text()
    );

    wait_for("220 spans", Duration::from_secs(30), || {
        let n = receiver.spans().len();
        async move { n >= 220 }
    })
    .await;
    // Long enough for a further export (200 ms) to bring any extra span.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let spans = receiver.spans();
    let mut by_event: HashMap<String, Vec<Got>> = HashMap::new();
    for span in spans.clone() {
        let id = span
            .attributes
            .get("messaging.message.id")
            .cloned()
            .unwrap_or_default();
        by_event.entry(id).or_default().push(span);
    }
    assert_eq!(
        spans.len(),
        220,
        "spans: {:?}",
        by_event.keys().take(3).collect::<Vec<_>>()
    );

    for row in &all {
        let id = &row.event.id;
        let record = &records[id];
        let (trace, span_id, flags) = header_fields(record);
        if row.context == Context::Unsampled {
            assert!(
                !by_event.contains_key(id),
                "a span for an unsampled event {id}"
            );
            assert_eq!(
                (trace.as_str(), flags.as_str()),
                (row.trace_id.as_str(), "00")
            );
            assert_ne!(
                span_id, row.span_id,
                "the relay's context replaces the row's"
            );
            continue;
        }
        let got = by_event.get(id).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(got.len(), 1, "event {id}: {} spans", got.len());
        let span = &got[0];
        if row.context == Context::Sampled {
            assert_eq!(span.trace_id, row.trace_id, "event {id}: the row's trace");
            assert_eq!(
                span.parent_span_id, row.span_id,
                "event {id}: the row's span is the parent"
            );
        } else {
            assert_eq!(
                span.parent_span_id, "",
                "event {id}: no context, a root span"
            );
        }
        assert_eq!(
            (trace.as_str(), span_id.as_str(), flags.as_str()),
            (span.trace_id.as_str(), span.span_id.as_str(), "01"),
            "event {id}: the record's traceparent names the span"
        );
        assert_eq!(span.name, format!("publish {topic}"));
        assert_eq!(span.kind, SpanKind::Producer as i32);
        assert_eq!(span.service, "traces-test");
        let a = &span.attributes;
        let expect = [
            ("messaging.system", "kafka".to_string()),
            ("messaging.operation.type", "send".to_string()),
            ("messaging.destination.name", topic.clone()),
            ("messaging.kafka.message.key", id.clone()),
            (
                "messaging.destination.partition.id",
                record.partition.to_string(),
            ),
            ("messaging.kafka.offset", record.offset.to_string()),
        ];
        for (key, value) in expect {
            assert_eq!(
                a.get(key),
                Some(&value),
                "event {id}: attribute {key}: {a:?}"
            );
        }
        // The span starts at the commit (the WAL's commit time) and ends at the ack.
        assert!(
            (before_ns..=after_ns).contains(&span.start_ns) && span.start_ns <= span.end_ns,
            "event {id}: span {}..{} outside the inserts' {before_ns}..{after_ns}",
            span.start_ns,
            span.end_ns
        );
        let commit_to_ack: f64 = a["outbox_relay.commit_to_ack_ms"].parse().unwrap();
        let length_ms = (span.end_ns - span.start_ns) as f64 / 1e6;
        assert!(
            (commit_to_ack - length_ms).abs() < 1.0,
            "event {id}: commit_to_ack_ms {commit_to_ack} but the span lasts {length_ms} ms"
        );
    }
    relay.terminate(Duration::from_secs(20));
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_event_gets_one_producer_span_child_of_its_row() {
    one_span_per_event(|_| Vec::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn exactly_once_events_get_their_spans_too() {
    one_span_per_event(|db| {
        exactly_once_env(db)
            .into_iter()
            .filter(|(k, _)| k.contains("DELIVERY") || k.contains("PROGRESS"))
            .collect()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tracing_off_sends_nothing_and_leaves_the_row_s_context() {
    let (receiver, port) = Receiver::start().await;
    let (db, env) = setup(false, port).await;
    let topic = db.topic("order");
    let mut relay = RelayProcess::start(&env, "traces_off");
    wait_for_slot(&db, &mut relay).await;
    let all = rows("order", 50, Context::Sampled);
    insert(&db, &all, 10).await;
    let ids: Vec<String> = all.iter().map(|r| r.event.id.clone()).collect();
    let records = read_ids(
        std::slice::from_ref(&topic),
        1,
        &ids,
        Duration::from_secs(60),
        Duration::from_millis(1000),
    )
    .await;
    assert_eq!(records.len(), all.len(), "{}", relay.log_text());
    for record in &records {
        let row = all.iter().find(|r| r.event.id == record.key_str()).unwrap();
        assert_eq!(record.header("traceparent"), row.traceparent().as_deref());
    }
    relay.terminate(Duration::from_secs(20));
    // Also what the way out would export.
    assert_eq!(
        receiver.requests(),
        0,
        "tracing is off, yet spans were sent"
    );
    db.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_collector_costs_only_a_counter() {
    let (db, env) = setup(true, free_port()).await;
    let metrics_port = free_port();
    let env = with(
        env,
        &[(
            "OUTBOX_RELAY__HTTP__LISTEN",
            &format!("127.0.0.1:{metrics_port}"),
        )],
    );
    let topic = db.topic("order");
    let mut relay = RelayProcess::start(&env, "traces_unreachable");
    wait_for_slot(&db, &mut relay).await;
    let all = rows("order", 200, Context::Sampled);
    insert(&db, &all, 10).await;
    let ids: Vec<String> = all.iter().map(|r| r.event.id.clone()).collect();
    let records = read_ids(
        std::slice::from_ref(&topic),
        1,
        &ids,
        Duration::from_secs(30),
        Duration::from_millis(200),
    )
    .await;
    let delivered: std::collections::HashSet<String> =
        records.iter().map(Received::key_str).collect();
    assert_eq!(delivered.len(), all.len(), "{}", relay.log_text());
    wait_for(
        "a counted export failure",
        Duration::from_secs(20),
        || async {
            http_get(metrics_port, "/metrics")
                .and_then(|(_, body)| metric(&body, "outbox_relay_trace_export_failures_total"))
                .is_some_and(|n| n > 0.0)
        },
    )
    .await;
    let status = relay.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}\n{}", relay.log_text());
    db.cleanup().await;
}
