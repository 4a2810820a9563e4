//! The relay's metrics and health, shared between the pipeline (which updates them) and the
//! HTTP listener (which renders them). Lock-free counters; one small mutex for labelled maps.
//!
//! Every series is named here, shaped `outbox_relay_<noun>_<unit>[_total]`, with
//! low-cardinality labels only (error kinds, states, wal_status values). The exposition (the
//! Prometheus text format 0.0.4) is written by `prometheus-client` from a snapshot taken at
//! each scrape.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram as PromHistogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use rdkafka::error::KafkaError;

use crate::config::KafkaConfig;
use crate::lsn::Lsn;
use crate::sink::blocked::{Block, Blocked};
use crate::sink::kafka_latency::{BrokerLatency, KafkaLatency, Quantiles};

/// The `Content-Type` of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
/// Where the relay stands; `/readyz` is ready only while `Streaming`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RelayState {
    Starting = 0,
    Streaming = 1,
    /// Another relay streams the slot; this one waits to take over.
    Standby = 2,
    /// Between sessions, waiting to reconnect.
    Reconnecting = 3,
    Draining = 4,
    Stopped = 5,
    /// Stopped on an error that needs an operator (slot lost, poison row with policy stop...).
    Failed = 6,
}

impl RelayState {
    const ALL: [RelayState; 7] = [
        RelayState::Starting,
        RelayState::Streaming,
        RelayState::Standby,
        RelayState::Reconnecting,
        RelayState::Draining,
        RelayState::Stopped,
        RelayState::Failed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RelayState::Starting => "starting",
            RelayState::Streaming => "streaming",
            RelayState::Standby => "standby",
            RelayState::Reconnecting => "reconnecting",
            RelayState::Draining => "draining",
            RelayState::Stopped => "stopped",
            RelayState::Failed => "failed",
        }
    }

    fn from_u8(v: u8) -> RelayState {
        Self::ALL
            .into_iter()
            .find(|s| *s as u8 == v)
            .unwrap_or(RelayState::Failed)
    }
}

/// Upper bounds (seconds) of the commit-to-acknowledgement latency buckets.
const LATENCY_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// The commit-to-acknowledgement latency histogram, with [`LATENCY_BUCKETS`].
#[derive(Debug)]
pub struct Histogram(PromHistogram);

impl Default for Histogram {
    fn default() -> Self {
        Histogram(PromHistogram::new(LATENCY_BUCKETS))
    }
}

impl Histogram {
    pub fn observe(&self, value: Duration) {
        self.0.observe(value.as_secs_f64());
    }
}

/// The label of `outbox_relay_delivery_errors_total` for a Kafka error: librdkafka's error code
/// name (`MessageSizeTooLarge`, `MessageTimedOut`…), or `Other` for an error without one.
pub fn delivery_error_kind(error: &KafkaError) -> String {
    match error.rdkafka_error_code() {
        Some(code) => format!("{code:?}"),
        None => "Other".to_string(),
    }
}

/// All the relay's numbers. Shared as `Arc<Metrics>`.
#[derive(Debug)]
pub struct Metrics {
    started: Instant,
    state: AtomicU8,
    pub events_published: AtomicU64,
    pub events_dead_lettered: AtomicU64,
    pub messages_rejected: AtomicU64,
    pub reconnects: AtomicU64,
    pub records_in_flight: AtomicI64,
    /// Transactions the checkpoint ledger holds (open, or waiting for acknowledgements).
    pub ledger_transactions: AtomicI64,
    pub received_lsn: AtomicU64,
    pub confirmed_lsn: AtomicU64,
    /// Bytes between the server's WAL position and the slot's confirmed position; -1 unknown.
    pub slot_lag_bytes: AtomicI64,
    /// Bytes of WAL the slot holds back (from its restart_lsn); -1 unknown.
    pub slot_retained_wal_bytes: AtomicI64,
    /// Milliseconds after `started` at which the stream last made progress (confirmed moved,
    /// or nothing was waiting).
    progress_at_ms: AtomicU64,
    /// Milliseconds after `started` at which bytes last arrived on the replication stream.
    frame_at_ms: AtomicU64,
    /// The stream's receive deadline in milliseconds (0: not streaming yet); `/readyz` is not
    /// ready once no frame arrived for longer.
    receive_timeout_ms: AtomicU64,
    pub commit_to_ack: Histogram,
    /// From a transaction's commit to the relay reading its BEGIN: PostgreSQL's share of
    /// `commit_to_ack` (WAL flush, walsender wake-up and decoding, the network).
    pub commit_to_read: Histogram,
    /// `exactly_once`: Kafka transactions committed.
    pub kafka_transactions_committed: AtomicU64,
    /// `exactly_once`: Kafka transactions aborted or failed (each ends its session).
    pub kafka_transactions_aborted: AtomicU64,
    /// `exactly_once`: records (events and dead letters) in committed Kafka transactions.
    pub kafka_transaction_records: AtomicU64,
    /// `exactly_once`: PostgreSQL transactions skipped at a session start because the progress
    /// record says Kafka already holds them.
    pub transactions_skipped: AtomicU64,
    /// `exactly_once`: how long a Kafka transaction's commit took.
    pub kafka_commit_latency: Histogram,
    delivery_errors: Mutex<BTreeMap<String, u64>>,
    /// The session's producer's view of the brokers (none before the first session).
    kafka_latency: Mutex<Option<Arc<KafkaLatency>>>,
    /// What Kafka refuses for deployment reasons; kept across sessions.
    blocked: Mutex<Option<Arc<Blocked>>>,
    wal_status: Mutex<String>,
    /// The `slot` and `publication` labels of `outbox_relay_info`.
    info: Mutex<(String, String)>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            started: Instant::now(),
            state: AtomicU8::new(RelayState::Starting as u8),
            events_published: AtomicU64::new(0),
            events_dead_lettered: AtomicU64::new(0),
            messages_rejected: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            records_in_flight: AtomicI64::new(0),
            ledger_transactions: AtomicI64::new(0),
            received_lsn: AtomicU64::new(0),
            confirmed_lsn: AtomicU64::new(0),
            slot_lag_bytes: AtomicI64::new(-1),
            slot_retained_wal_bytes: AtomicI64::new(-1),
            progress_at_ms: AtomicU64::new(0),
            frame_at_ms: AtomicU64::new(0),
            receive_timeout_ms: AtomicU64::new(0),
            commit_to_ack: Histogram::default(),
            commit_to_read: Histogram::default(),
            kafka_transactions_committed: AtomicU64::new(0),
            kafka_transactions_aborted: AtomicU64::new(0),
            kafka_transaction_records: AtomicU64::new(0),
            transactions_skipped: AtomicU64::new(0),
            kafka_commit_latency: Histogram::default(),
            delivery_errors: Mutex::new(BTreeMap::new()),
            kafka_latency: Mutex::new(None),
            blocked: Mutex::new(None),
            wal_status: Mutex::new(String::new()),
            info: Mutex::new((String::new(), String::new())),
        }
    }
}

impl Metrics {
    pub fn state(&self) -> RelayState {
        RelayState::from_u8(self.state.load(Relaxed))
    }

    pub fn set_state(&self, state: RelayState) {
        self.state.store(state as u8, Relaxed);
        if state == RelayState::Streaming {
            self.mark_progress();
            self.mark_received(Instant::now());
        }
    }

    /// Shows `latency` (a new session's producer's) from now on.
    pub fn watch_kafka(&self, latency: Arc<KafkaLatency>) {
        *self
            .kafka_latency
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(latency);
    }

    /// Shows (and makes `/readyz` depend on) what `blocked` holds, from now on.
    pub fn watch_blocked(&self, blocked: Arc<Blocked>) {
        *self.blocked.lock().unwrap_or_else(PoisonError::into_inner) = Some(blocked);
    }

    /// The registry of Kafka blocks the sessions report to (set with `watch_blocked`; a
    /// fresh one when none was).
    pub fn blocked(&self) -> Arc<Blocked> {
        let mut blocked = self.blocked.lock().unwrap_or_else(PoisonError::into_inner);
        blocked
            .get_or_insert_with(|| Arc::new(Blocked::new(&KafkaConfig::default())))
            .clone()
    }

    /// Kafka refuses something for a deployment reason now.
    pub fn kafka_blocked(&self) -> bool {
        !self.current_blocks().is_empty()
    }

    fn current_blocks(&self) -> Vec<Block> {
        let blocked = self
            .blocked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        blocked.map_or_else(Vec::new, |b| b.current())
    }

    /// Each broker's last statistics window, by quantile.
    fn kafka_quantiles(&self, pick: fn(&BrokerLatency) -> Quantiles) -> Vec<(String, Quantiles)> {
        let latency = self
            .kafka_latency
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        latency.map_or_else(Vec::new, |l| {
            l.brokers()
                .into_iter()
                .map(|(name, b)| (name, pick(&b)))
                .collect()
        })
    }

    /// Bytes arrived on the replication stream at `at` (the stream's own clock, read once per
    /// socket read, so this is a single store).
    pub fn mark_received(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.started).as_millis() as u64;
        self.frame_at_ms.store(ms, Relaxed);
    }

    /// The stream's receive deadline, which `/readyz` also applies.
    pub fn set_receive_timeout(&self, limit: Duration) {
        self.receive_timeout_ms
            .store(limit.as_millis() as u64, Relaxed);
    }

    pub fn since_received(&self) -> Duration {
        let now = self.started.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.frame_at_ms.load(Relaxed)))
    }

    /// The stream is moving (or has nothing to move): resets the staleness clock.
    pub fn mark_progress(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.progress_at_ms.store(now, Relaxed);
    }

    pub fn since_progress(&self) -> Duration {
        let now = self.started.elapsed().as_millis() as u64;
        Duration::from_millis(now.saturating_sub(self.progress_at_ms.load(Relaxed)))
    }

    /// Counts a record Kafka did not take, labelled by [`delivery_error_kind`].
    pub fn count_delivery_error(&self, error: &KafkaError) {
        let kind = delivery_error_kind(error);
        if let Ok(mut map) = self.delivery_errors.lock() {
            *map.entry(kind).or_default() += 1;
        }
    }

    /// The slot and publication `outbox_relay_info` names.
    pub fn set_info(&self, slot: &str, publication: &str) {
        if let Ok(mut info) = self.info.lock() {
            *info = (slot.to_string(), publication.to_string());
        }
    }

    pub fn set_wal_status(&self, status: &str) {
        if let Ok(mut s) = self.wal_status.lock() {
            status.clone_into(&mut s);
        }
    }

    pub fn set_lsns(&self, received: Lsn, confirmed: Lsn) {
        self.received_lsn.store(received.0, Relaxed);
        self.confirmed_lsn.store(confirmed.0, Relaxed);
    }

    /// Ready: streaming, frames arriving within the receive deadline, and not stuck with work
    /// waiting longer than `staleness`.
    pub fn readiness(&self, staleness: Duration) -> Result<(), String> {
        let blocked = self
            .blocked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(blocked) = blocked {
            blocked.readiness()?;
        }
        let state = self.state();
        if state != RelayState::Streaming {
            return Err(format!("not streaming (state: {})", state.name()));
        }
        let limit = Duration::from_millis(self.receive_timeout_ms.load(Relaxed));
        let silent = self.since_received();
        if !limit.is_zero() && silent > limit {
            return Err(format!(
                "nothing received from PostgreSQL for {:.1}s (receive deadline {:.1}s): the replication connection may be dead; see the logs",
                silent.as_secs_f64(),
                limit.as_secs_f64()
            ));
        }
        let stalled = self.since_progress();
        if stalled > staleness {
            return Err(format!(
                "no progress confirmed for {:.1}s while events wait (limit {:.1}s); see /metrics and the logs",
                stalled.as_secs_f64(),
                staleness.as_secs_f64()
            ));
        }
        Ok(())
    }

    /// The Prometheus text exposition (format 0.0.4, [`CONTENT_TYPE`]); `staleness` as for
    /// [`Metrics::readiness`], which `outbox_relay_ready` reports.
    pub fn render(&self, staleness: Duration) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.scrape(staleness)));
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry);
        out
    }

    /// Every series' value now, in exposition order.
    fn scrape(&self, staleness: Duration) -> Scrape {
        let delivery_errors = self
            .delivery_errors
            .lock()
            .map(|map| map.iter().map(|(k, n)| (k.clone(), *n)).collect())
            .unwrap_or_default();
        let current = self.state();
        let states = RelayState::ALL
            .into_iter()
            .map(|s| (s.name().to_string(), i64::from(s == current)))
            .collect();
        let wal_status = self
            .wal_status
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let wal_statuses = WAL_STATUSES
            .into_iter()
            .map(|s| (s.to_string(), i64::from(wal_status == s)))
            .collect();
        let (slot, publication) = self.info.lock().map(|i| i.clone()).unwrap_or_default();
        let gauge = |v: i64| Value::Gauge(v);
        let families = vec![
            family(
                "outbox_relay_events_published_total",
                "Outbox events acknowledged by Kafka.",
                Value::Counter(self.events_published.load(Relaxed)),
            ),
            family(
                "outbox_relay_events_dead_lettered_total",
                "Events sent to the dead-letter topic.",
                Value::Counter(self.events_dead_lettered.load(Relaxed)),
            ),
            family(
                "outbox_relay_messages_rejected_total",
                "Logical decoding messages ignored (non-transactional).",
                Value::Counter(self.messages_rejected.load(Relaxed)),
            ),
            family(
                "outbox_relay_reconnects_total",
                "Sessions restarted after a transient error.",
                Value::Counter(self.reconnects.load(Relaxed)),
            ),
            family(
                "outbox_relay_delivery_errors_total",
                "Records Kafka did not take, by error kind.",
                Value::Counters("kind", delivery_errors),
            ),
            family(
                "outbox_relay_state",
                "The relay's state (1 for the current one).",
                Value::Gauges("state", states),
            ),
            family(
                "outbox_relay_slot_wal_status",
                "The slot's wal_status (1 for the current one).",
                Value::Gauges("status", wal_statuses),
            ),
            family(
                "outbox_relay_records_in_flight",
                "Records handed to Kafka and not yet acknowledged.",
                gauge(self.records_in_flight.load(Relaxed)),
            ),
            family(
                "outbox_relay_ledger_transactions",
                "Transactions held by the checkpoint ledger (open, or waiting for acknowledgements).",
                gauge(self.ledger_transactions.load(Relaxed)),
            ),
            family(
                "outbox_relay_received_lsn",
                "Newest WAL position received (as a number).",
                gauge(self.received_lsn.load(Relaxed) as i64),
            ),
            family(
                "outbox_relay_confirmed_lsn",
                "WAL position confirmed to PostgreSQL (as a number).",
                gauge(self.confirmed_lsn.load(Relaxed) as i64),
            ),
            family(
                "outbox_relay_slot_lag_bytes",
                "Server WAL position minus the slot's confirmed_flush_lsn (-1: unknown).",
                gauge(self.slot_lag_bytes.load(Relaxed)),
            ),
            family(
                "outbox_relay_slot_retained_wal_bytes",
                "WAL the slot holds back, from its restart_lsn (-1: unknown).",
                gauge(self.slot_retained_wal_bytes.load(Relaxed)),
            ),
            family(
                "outbox_relay_last_received_age_seconds",
                "Seconds since bytes last arrived on the replication stream.",
                Value::Seconds(self.since_received().as_secs_f64()),
            ),
            family(
                "outbox_relay_last_progress_age_seconds",
                "Seconds since the confirmed position last moved while events waited.",
                Value::Seconds(self.since_progress().as_secs_f64()),
            ),
            family(
                "outbox_relay_commit_to_ack_seconds",
                "Latency from transaction commit to Kafka acknowledgement.",
                Value::Histogram(self.commit_to_ack.0.clone()),
            ),
            family(
                "outbox_relay_commit_to_read_seconds",
                "Latency from transaction commit to the relay reading it from the replication stream (PostgreSQL's share of commit_to_ack).",
                Value::Histogram(self.commit_to_read.0.clone()),
            ),
            family(
                "outbox_relay_kafka_rtt_seconds",
                "Kafka request round-trip time by broker, over librdkafka's last statistics window (quantile 1: the maximum; 0 when no request).",
                Value::Quantiles(self.kafka_quantiles(|b| b.rtt)),
            ),
            family(
                "outbox_relay_kafka_queue_seconds",
                "How long records waited in librdkafka before their produce request was made, by broker, over the last statistics window.",
                Value::Quantiles(self.kafka_quantiles(|b| b.queue)),
            ),
            family(
                "outbox_relay_kafka_transactions_committed_total",
                "Kafka transactions committed (delivery = exactly_once).",
                Value::Counter(self.kafka_transactions_committed.load(Relaxed)),
            ),
            family(
                "outbox_relay_kafka_transactions_aborted_total",
                "Kafka transactions aborted or failed; each ends its session (delivery = exactly_once).",
                Value::Counter(self.kafka_transactions_aborted.load(Relaxed)),
            ),
            family(
                "outbox_relay_kafka_transaction_records_total",
                "Records in committed Kafka transactions; divided by the committed count: records per transaction.",
                Value::Counter(self.kafka_transaction_records.load(Relaxed)),
            ),
            family(
                "outbox_relay_transactions_skipped_total",
                "PostgreSQL transactions skipped because the progress record says Kafka holds them.",
                Value::Counter(self.transactions_skipped.load(Relaxed)),
            ),
            family(
                "outbox_relay_kafka_commit_seconds",
                "How long committing a Kafka transaction took (delivery = exactly_once).",
                Value::Histogram(self.kafka_commit_latency.0.clone()),
            ),
            family(
                "outbox_relay_kafka_blocked",
                "1 per reason and topic that Kafka refuses for a deployment reason (a missing ACL or topic, a refused login or topic creation): records wait, /readyz is red.",
                Value::Blocks(
                    self.current_blocks()
                        .into_iter()
                        .map(|b| (b.reason.name(), b.subject))
                        .collect(),
                ),
            ),
            family(
                "outbox_relay_ready",
                "1 when /readyz answers 200: streaming, frames arriving, progress not stalled.",
                gauge(i64::from(self.readiness(staleness).is_ok())),
            ),
            family(
                "outbox_relay_info",
                "The relay's slot, publication and version (always 1).",
                Value::Info(vec![
                    ("slot", slot),
                    ("publication", publication),
                    ("version", env!("CARGO_PKG_VERSION").to_string()),
                ]),
            ),
        ];
        Scrape(families)
    }
}

/// The values `outbox_relay_slot_wal_status` has a series for.
const WAL_STATUSES: [&str; 5] = ["reserved", "extended", "unreserved", "lost", "missing"];

/// One metric family of a scrape: its name, help and value(s).
#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    value: Value,
}

fn family(name: &'static str, help: &'static str, value: Value) -> Family {
    Family { name, help, value }
}

#[derive(Debug)]
enum Value {
    Counter(u64),
    Gauge(i64),
    Seconds(f64),
    /// A counter per value of one label.
    Counters(&'static str, Vec<(String, u64)>),
    /// A gauge per value of one label.
    Gauges(&'static str, Vec<(String, i64)>),
    /// A gauge that is always 1, its labels the information.
    Info(Vec<(&'static str, String)>),
    Histogram(PromHistogram),
    /// Seconds per broker and quantile (`broker`, `quantile` labels).
    Quantiles(Vec<(String, Quantiles)>),
    /// 1 per `reason` and `topic`.
    Blocks(Vec<(&'static str, String)>),
}

/// The values of one scrape, encoded by prometheus-client.
#[derive(Debug)]
struct Scrape(Vec<Family>);

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for Family { name, help, value } in &self.0 {
            // The text encoder appends `_total` to a counter's name.
            let base = match value {
                Value::Counter(_) | Value::Counters(..) => {
                    name.strip_suffix("_total").unwrap_or(name)
                }
                _ => name,
            };
            let metric_type = match value {
                Value::Counter(_) | Value::Counters(..) => MetricType::Counter,
                Value::Histogram(_) => MetricType::Histogram,
                _ => MetricType::Gauge,
            };
            let mut metric = encoder.encode_descriptor(base, help, None, metric_type)?;
            match value {
                Value::Counter(v) => ConstCounter::new(*v).encode(metric)?,
                Value::Gauge(v) => ConstGauge::new(*v).encode(metric)?,
                Value::Seconds(v) => ConstGauge::new(*v).encode(metric)?,
                Value::Counters(label, values) => {
                    for (value, n) in values {
                        let labels = [(*label, value.as_str())];
                        ConstCounter::new(*n).encode(metric.encode_family(&labels)?)?;
                    }
                }
                Value::Gauges(label, values) => {
                    for (value, v) in values {
                        let labels = [(*label, value.as_str())];
                        ConstGauge::new(*v).encode(metric.encode_family(&labels)?)?;
                    }
                }
                Value::Info(labels) => {
                    let labels: Vec<(&str, &str)> =
                        labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    ConstGauge::new(1i64).encode(metric.encode_family(&labels)?)?;
                }
                Value::Histogram(h) => h.encode(metric)?,
                Value::Blocks(blocks) => {
                    for (reason, topic) in blocks {
                        let labels = [("reason", *reason), ("topic", topic.as_str())];
                        ConstGauge::new(1i64).encode(metric.encode_family(&labels)?)?;
                    }
                }
                Value::Quantiles(brokers) => {
                    for (broker, q) in brokers {
                        for (quantile, v) in [("0.5", q.p50), ("0.99", q.p99), ("1", q.max)] {
                            let labels = [("broker", broker.as_str()), ("quantile", quantile)];
                            ConstGauge::new(v).encode(metric.encode_family(&labels)?)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative() {
        let m = Metrics::default();
        for ms in [1, 2, 3, 8, 15, 40] {
            m.commit_to_ack.observe(Duration::from_millis(ms));
        }
        let out = m.render(Duration::from_secs(5));
        let name = "outbox_relay_commit_to_ack_seconds";
        assert!(out.contains(&format!("# TYPE {name} histogram")), "{out}");
        assert!(
            out.contains(&format!("{name}_bucket{{le=\"0.005\"}} 3")),
            "{out}"
        );
        assert!(
            out.contains(&format!("{name}_bucket{{le=\"+Inf\"}} 6")),
            "{out}"
        );
        assert!(out.contains(&format!("{name}_count 6")), "{out}");
        assert!(out.contains(&format!("{name}_sum 0.069")), "{out}");
    }

    #[test]
    fn kafka_latency_shows_per_broker_and_quantile_once_watched() {
        let m = Metrics::default();
        let name = "outbox_relay_kafka_rtt_seconds";
        let out = m.render(Duration::from_secs(5));
        assert!(!out.contains(&format!("{name}{{")), "{out}");
        let latency = Arc::new(KafkaLatency::default());
        m.watch_kafka(latency.clone());
        let stats = r#"{"brokers": {"k:9092/1": {"name": "k:9092/1", "nodeid": 1,
            "rtt": {"p50": 500, "p99": 4000, "max": 47000},
            "int_latency": {"p50": 5000, "p99": 6000, "max": 9000}}}}"#;
        latency.update(stats.as_bytes()).unwrap();
        let out = m.render(Duration::from_secs(5));
        for line in [
            format!("{name}{{broker=\"k:9092/1\",quantile=\"0.5\"}} 0.0005"),
            format!("{name}{{broker=\"k:9092/1\",quantile=\"0.99\"}} 0.004"),
            format!("{name}{{broker=\"k:9092/1\",quantile=\"1\"}} 0.047"),
            "outbox_relay_kafka_queue_seconds{broker=\"k:9092/1\",quantile=\"0.99\"} 0.006"
                .to_string(),
        ] {
            assert!(out.contains(&line), "no {line} in:\n{out}");
        }
    }

    #[test]
    fn a_delivery_error_has_one_label_form() {
        use rdkafka::types::RDKafkaErrorCode;
        let too_large = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
        assert_eq!(delivery_error_kind(&too_large), "MessageSizeTooLarge");
        assert_eq!(delivery_error_kind(&KafkaError::Canceled), "Other");
        let m = Metrics::default();
        m.count_delivery_error(&too_large);
        m.count_delivery_error(&too_large);
        let out = m.render(Duration::from_secs(5));
        assert!(
            out.contains("outbox_relay_delivery_errors_total{kind=\"MessageSizeTooLarge\"} 2"),
            "{out}"
        );
        assert!(!out.contains("Some("), "{out}");
    }

    #[test]
    fn ready_follows_readyz_and_info_names_the_slot() {
        let m = Metrics::default();
        m.set_info("outbox_relay", "outbox_relay_pub");
        let out = m.render(Duration::from_secs(5));
        assert!(
            out.contains("# TYPE outbox_relay_ready gauge\noutbox_relay_ready 0\n"),
            "{out}"
        );
        let info = format!(
            "outbox_relay_info{{slot=\"outbox_relay\",publication=\"outbox_relay_pub\",version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(out.contains(&info), "{out}");
        m.set_state(RelayState::Streaming);
        let out = m.render(Duration::from_secs(5));
        assert!(out.contains("\noutbox_relay_ready 1\n"), "{out}");
    }

    #[test]
    fn ready_only_while_streaming_and_fresh() {
        let m = Metrics::default();
        assert!(m.readiness(Duration::from_secs(5)).is_err());
        m.set_state(RelayState::Streaming);
        assert!(m.readiness(Duration::from_secs(5)).is_ok());
        m.set_state(RelayState::Standby);
        let why = m.readiness(Duration::from_secs(5)).unwrap_err();
        assert!(why.contains("standby"), "{why}");
    }

    #[test]
    fn silent_stream_is_not_ready() {
        let m = Metrics::default();
        m.set_receive_timeout(Duration::from_millis(50));
        m.set_state(RelayState::Streaming);
        assert!(m.readiness(Duration::from_secs(60)).is_ok());
        std::thread::sleep(Duration::from_millis(80));
        let why = m.readiness(Duration::from_secs(60)).unwrap_err();
        assert!(why.contains("nothing received from PostgreSQL"), "{why}");
        m.mark_received(Instant::now());
        assert!(m.readiness(Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn render_names_every_series() {
        let m = Metrics::default();
        m.count_delivery_error(&KafkaError::MessageProduction(
            rdkafka::types::RDKafkaErrorCode::MessageTimedOut,
        ));
        m.set_wal_status("reserved");
        let text = m.render(Duration::from_secs(5));
        for series in [
            "outbox_relay_events_published_total 0",
            "outbox_relay_events_dead_lettered_total 0",
            "outbox_relay_delivery_errors_total{kind=\"MessageTimedOut\"} 1",
            "outbox_relay_records_in_flight 0",
            "outbox_relay_confirmed_lsn 0",
            "outbox_relay_slot_lag_bytes -1",
            "outbox_relay_slot_wal_status{status=\"reserved\"} 1",
            "outbox_relay_state{state=\"starting\"} 1",
            "outbox_relay_commit_to_ack_seconds_count 0",
            "outbox_relay_last_received_age_seconds",
            "# TYPE outbox_relay_events_published_total counter\n",
            "# HELP outbox_relay_events_published_total Outbox events acknowledged by Kafka.\n",
            "# TYPE outbox_relay_state gauge\n",
        ] {
            assert!(text.contains(series), "missing {series}\n{text}");
        }
        assert!(!text.contains(".."), "help with two periods\n{text}");
    }
}
