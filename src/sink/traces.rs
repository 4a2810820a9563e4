//! OpenTelemetry traces (`[tracing]`): one PRODUCER span `publish <topic>` per event, from
//! the transaction's commit (the WAL's commit time) to Kafka's acknowledgement, child of the
//! trace context the row carries. The span's own context replaces the record's `traceparent`
//! and `tracestate` headers, so that the consumer's span is a child of the relay's.
//!
//! The data path sees three calls and no OpenTelemetry type: [`active`] (`None` when tracing
//! is off: one atomic load, no span made), [`Traces::start`] on a record about to be sent,
//! [`Traces::delivered`] from the delivery callback. Between the two a span waits in
//! `pending`, keyed by its span id, which the delivered record's `traceparent` names.
//! In `exactly_once` a record is in Kafka for good when its Kafka transaction commits: its
//! span waits for [`Traces::committed`] (or [`Traces::aborted`]) after its acknowledgement.
//! Finished spans go to the SDK's batch processor, whose own thread exports them (OTLP over
//! HTTP/protobuf): handing a span over never waits (a full queue drops it), and a failed
//! export only counts in `outbox_relay_trace_export_failures_total`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanKind, Status, Tracer as _, TracerProvider as _,
};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider, Span, SpanData,
    SpanExporter,
};
use opentelemetry_sdk::Resource;
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use tracing::{info, warn};

use crate::config::TracingConfig;
use crate::mapping::Record;

/// The W3C trace context headers.
pub const TRACEPARENT: &str = "traceparent";
pub const TRACESTATE: &str = "tracestate";

/// A span whose record got no delivery report this long after it was sent (its session was
/// torn down, or it never reached librdkafka) is ended as such, so `pending` stays bounded.
const STALE_AFTER: Duration = Duration::from_secs(15 * 60);
/// How often `pending` is checked for such spans.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// At most one warning per this long about failed exports (the counter counts each).
const WARN_EVERY: Duration = Duration::from_secs(60);
/// How long the way out waits for the last spans to be exported.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(2);

static ACTIVE: OnceLock<Traces> = OnceLock::new();

#[derive(Debug, thiserror::Error)]
#[error("cannot set up the OTLP exporter for tracing.endpoint `{endpoint}`: {reason}")]
pub struct TraceError {
    endpoint: String,
    reason: String,
}

/// The tracing of this process, when `[tracing]` is enabled (set up by [`install`]).
#[inline]
pub fn active() -> Option<&'static Traces> {
    ACTIVE.get()
}

/// Counts a failed export and says the total so far: the relay hands in its metric
/// (`outbox_relay_trace_export_failures_total`), so that traces import nothing of `serve`.
pub type FailureCount = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Sets up tracing for the process when `config.enabled` (once: a second call keeps the
/// first). Failed exports count in `failures`. `transactional`: records count once their
/// Kafka transaction commits (`exactly_once`).
pub fn install(
    config: &TracingConfig,
    transactional: bool,
    failures: FailureCount,
) -> Result<(), TraceError> {
    if !config.enabled || ACTIVE.get().is_some() {
        return Ok(());
    }
    let mut traces = Traces::new(config, failures)?;
    traces.transactional = transactional;
    if ACTIVE.set(traces).is_ok() {
        info!(endpoint = %config.endpoint, sample_ratio = config.sample_ratio.0,
            "tracing: a span per event, exported as OTLP/HTTP");
    }
    Ok(())
}

/// Exports what is left (waiting at most [`SHUTDOWN_WAIT`]), on the way out.
pub async fn shutdown() {
    if let Some(traces) = active() {
        let provider = traces.provider.clone();
        let _ = tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_WAIT))
            .await;
    }
}

/// What Kafka said about a traced record.
pub enum Outcome<'a> {
    Acknowledged,
    Failed(&'a KafkaError),
    /// It went to the dead-letter topic instead (the delivered record is the dead letter).
    DeadLettered,
}

pub struct Traces {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    pending: Mutex<Pending>,
    /// `exactly_once`: an acknowledged span ends when its Kafka transaction commits.
    transactional: bool,
}

/// Spans started and not yet ended, by span id; and (`exactly_once`) those acknowledged,
/// waiting for their Kafka transaction's commit.
struct Pending {
    spans: HashMap<u64, Waiting>,
    acknowledged: Vec<Waiting>,
    swept: Instant,
}

struct Waiting {
    span: Span,
    commit_time_us: i64,
    sent: Instant,
}

impl Traces {
    pub fn new(config: &TracingConfig, failures: FailureCount) -> Result<Traces, TraceError> {
        let error = |reason: String| TraceError {
            endpoint: config.endpoint.clone(),
            reason,
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(config.endpoint.clone())
            .with_timeout(Duration::from_millis(config.export_timeout_ms))
            .with_headers(HashMap::new())
            .build()
            .map_err(|e| error(e.to_string()))?;
        let batches = BatchConfigBuilder::default()
            .with_max_queue_size(config.max_queue_spans as usize)
            .with_max_export_batch_size(config.max_export_batch_spans as usize)
            .with_scheduled_delay(Duration::from_millis(config.export_interval_ms))
            .build();
        let processor = BatchSpanProcessor::new(Counting::new(exporter, failures), batches);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio.0,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        Ok(Traces {
            tracer: provider.tracer("outbox-relay"),
            provider,
            propagator: TraceContextPropagator::new(),
            pending: Mutex::new(Pending {
                spans: HashMap::new(),
                acknowledged: Vec::new(),
                swept: Instant::now(),
            }),
            transactional: false,
        })
    }

    /// Starts the span of event `event_id`, committed at `commit_time_us` (µs since the Unix
    /// epoch), as a child of the context in `record`'s headers (a root span without one),
    /// and puts the span's context in those headers instead.
    pub fn start(&self, record: &mut Record, event_id: &str, commit_time_us: i64) {
        let parent = self.propagator.extract(&HeaderExtractor(&record.headers));
        let mut attributes = vec![
            KeyValue::new("messaging.system", "kafka"),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", "publish"),
            KeyValue::new("messaging.destination.name", record.topic.clone()),
            KeyValue::new("messaging.message.id", event_id.to_string()),
        ];
        if let Ok(key) = std::str::from_utf8(&record.key) {
            attributes.push(KeyValue::new(
                "messaging.kafka.message.key",
                key.to_string(),
            ));
        }
        if let Some(payload) = &record.payload {
            attributes.push(KeyValue::new(
                "messaging.message.body.size",
                payload.len() as i64,
            ));
        }
        let span = self
            .tracer
            .span_builder(format!("publish {}", record.topic))
            .with_kind(SpanKind::Producer)
            .with_start_time(unix_us(commit_time_us))
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        inject(span.span_context(), &mut record.headers);
        if span.is_recording() {
            let key = span_key(span.span_context());
            let waiting = Waiting {
                span,
                commit_time_us,
                sent: Instant::now(),
            };
            self.pending().insert(key, waiting);
        }
    }

    /// Ends the span of the record Kafka reported on, if it has one.
    pub fn delivered<M: Message>(&self, message: &M, outcome: Outcome<'_>) {
        let Some(key) = message.headers().and_then(|headers| {
            headers
                .iter()
                .find(|h| h.key == TRACEPARENT)
                .and_then(|h| h.value)
                .and_then(parse_span_id)
        }) else {
            return;
        };
        let mut pending = self.pending();
        let Some(mut waiting) = pending.take(key) else {
            return;
        };
        let span = &mut waiting.span;
        match outcome {
            Outcome::Acknowledged => {
                span.set_attribute(KeyValue::new(
                    "messaging.destination.partition.id",
                    message.partition().to_string(),
                ));
                span.set_attribute(KeyValue::new("messaging.kafka.offset", message.offset()));
                if self.transactional {
                    pending.acknowledged.push(waiting);
                    return;
                }
                drop(pending);
                return waiting.end_acknowledged(SystemTime::now());
            }
            Outcome::Failed(error) => {
                span.set_attribute(KeyValue::new("error.type", error_type(error)));
                span.set_status(Status::error(error.to_string()));
            }
            Outcome::DeadLettered => {
                span.set_attribute(KeyValue::new(
                    "outbox_relay.dead_letter_topic",
                    message.topic().to_string(),
                ));
                span.set_status(Status::error("sent to the dead-letter topic"));
            }
        }
        span.end();
    }

    /// `exactly_once`: the Kafka transaction committed, and with it every record acknowledged
    /// so far (its commit waits for every acknowledgement).
    pub fn committed(&self) {
        let now = SystemTime::now();
        let done = std::mem::take(&mut self.pending().acknowledged);
        for waiting in done {
            waiting.end_acknowledged(now);
        }
    }

    /// `exactly_once`: the Kafka transaction was aborted; its records will be sent again
    /// (with new spans).
    pub fn aborted(&self) {
        let done = std::mem::take(&mut self.pending().acknowledged);
        for mut waiting in done {
            waiting
                .span
                .set_attribute(KeyValue::new("error.type", "transaction_aborted"));
            waiting
                .span
                .set_status(Status::error("the Kafka transaction was aborted"));
            waiting.span.end();
        }
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Pending {
    fn insert(&mut self, key: u64, waiting: Waiting) {
        if self.swept.elapsed() >= SWEEP_EVERY {
            self.swept = Instant::now();
            self.spans.retain(|_, w| {
                let fresh = w.sent.elapsed() < STALE_AFTER;
                if !fresh {
                    w.span
                        .set_status(Status::error("no delivery report (the session ended)"));
                    w.span.end();
                }
                fresh
            });
        }
        self.spans.insert(key, waiting);
    }

    fn take(&mut self, key: u64) -> Option<Waiting> {
        self.spans.remove(&key)
    }
}

impl Waiting {
    /// Ends the span of a record in Kafka for good (`at`), with the commit-to-ack time.
    fn end_acknowledged(mut self, at: SystemTime) {
        let commit_to_ack_ms = at
            .duration_since(unix_us(self.commit_time_us))
            .unwrap_or_default()
            .as_secs_f64()
            * 1000.0;
        self.span.set_attribute(KeyValue::new(
            "outbox_relay.commit_to_ack_ms",
            commit_to_ack_ms,
        ));
        self.span.end_with_timestamp(at);
    }
}

fn unix_us(us: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_micros(us.max(0) as u64)
}

fn span_key(context: &SpanContext) -> u64 {
    u64::from_be_bytes(context.span_id().to_bytes())
}

/// The parent-id field of a `traceparent` value (`00-<trace id>-<span id>-<flags>`).
fn parse_span_id(traceparent: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(traceparent).ok()?;
    let mut parts = text.split('-');
    let span_id = parts.nth(2)?;
    if span_id.len() != 16 {
        return None;
    }
    u64::from_str_radix(span_id, 16).ok()
}

/// Replaces the trace context headers with `context`'s.
fn inject(context: &SpanContext, headers: &mut Vec<(std::sync::Arc<str>, Bytes)>) {
    headers.retain(|(name, _)| {
        !name.eq_ignore_ascii_case(TRACEPARENT) && !name.eq_ignore_ascii_case(TRACESTATE)
    });
    let traceparent = format!(
        "00-{}-{}-{:02x}",
        context.trace_id(),
        context.span_id(),
        context.trace_flags().to_u8()
    );
    headers.push((TRACEPARENT.into(), Bytes::from(traceparent)));
    let state = context.trace_state().header();
    if !state.is_empty() {
        headers.push((TRACESTATE.into(), Bytes::from(state)));
    }
}

/// A low-cardinality name for `error.type`: librdkafka's error code.
fn error_type(error: &KafkaError) -> String {
    match error.rdkafka_error_code() {
        Some(code) => format!("{code:?}"),
        None => "kafka_error".to_string(),
    }
}

struct HeaderExtractor<'a>(&'a [(std::sync::Arc<str>, Bytes)]);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case(key))
            .and_then(|(_, value)| std::str::from_utf8(value).ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| &**name).collect()
    }
}

/// The OTLP exporter, counting (and now and then logging) the exports that failed.
struct Counting<E> {
    inner: E,
    failures: FailureCount,
    warned: Mutex<Option<Instant>>,
}

impl<E: std::fmt::Debug> std::fmt::Debug for Counting<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counting")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<E> Counting<E> {
    fn new(inner: E, failures: FailureCount) -> Self {
        Counting {
            inner,
            failures,
            warned: Mutex::new(None),
        }
    }

    fn failed(&self, error: &dyn std::fmt::Display) {
        let total = (self.failures)();
        let mut warned = self.warned.lock().unwrap_or_else(PoisonError::into_inner);
        if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
            *warned = Some(Instant::now());
            warn!(error = %error, failures_total = total,
                "cannot export spans to tracing.endpoint; they are dropped, publishing goes on");
        }
    }
}

impl<E: SpanExporter> SpanExporter for Counting<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let result = self.inner.export(batch).await;
        if let Err(e) = &result {
            self.failed(e);
        }
        result
    }

    fn shutdown_with_timeout(&mut self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&mut self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests;
