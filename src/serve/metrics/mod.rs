//! The relay's metrics and health, shared between the pipeline (which updates them) and the
//! HTTP listener (which renders them).
//!
//! Every family is declared once, in [`Metrics::default`]: its name, help and type in one
//! `prometheus-client` registration that hands back the handle the code updates. The order
//! of the declarations is the order of the exposition (the Prometheus text format 0.0.4).
//! Names are shaped `outbox_relay_<noun>_<unit>[_total]`, with low-cardinality labels only
//! (error kinds, states, wal_status values, brokers, blocked topics).
//!
//! Counters and gauges are lock-free; the few families that show shared state (the state,
//! the slot's wal_status, Kafka's latency and blocks, the info labels) are small metric types
//! below that read it when scraped.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::gauge::Gauge as PromGauge;
use prometheus_client::registry::Registry;
use rdkafka::error::KafkaError;

use crate::config::KafkaConfig;
use crate::lsn::Lsn;
use crate::sink::blocked::Blocked;
use crate::sink::kafka_latency::KafkaLatency;
use crate::sink::schema::RegistryHealth;

mod kinds;

use kinds::{BrokerQuantiles, Declare, Info, Labelled, OneHot, Shared, StaleSchemas};
pub use kinds::{Counter, Gauge, Histogram};

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
    /// Every state, each at its own index (`state as usize`).
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
}

/// The values `outbox_relay_slot_wal_status` has a series for.
const WAL_STATUSES: [&str; 5] = ["reserved", "extended", "unreserved", "lost", "missing"];

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
    /// Every family, in the order `Metrics::default` declares them (the exposition's).
    registry: Registry,
    started: Instant,
    /// Milliseconds after `started` at which the stream last made progress (confirmed moved,
    /// or nothing was waiting).
    progress_at_ms: AtomicU64,
    /// Milliseconds after `started` at which bytes last arrived on the replication stream.
    frame_at_ms: AtomicU64,
    /// The stream's receive deadline in milliseconds (0: not streaming yet); `/readyz` is not
    /// ready once no frame arrived for longer.
    receive_timeout_ms: AtomicU64,

    pub events_published: Counter,
    pub events_dead_lettered: Counter,
    /// The dead-letter breaker: times it tripped, and 1 while it holds the relay (unready).
    pub dead_letter_breaker_trips: Counter,
    pub dead_letter_breaker_open: Gauge,
    /// A running total the mapping keeps (stored, not counted here).
    pub messages_rejected: Counter,
    pub reconnects: Counter,
    delivery_errors: Labelled<[(&'static str, String); 1], PromCounter>,
    state: OneHot,
    wal_status: OneHot,
    pub records_in_flight: Gauge,
    /// Transactions the checkpoint ledger holds (open, or waiting for acknowledgements).
    pub ledger_transactions: Gauge,
    pub received_lsn: Gauge<u64, AtomicU64>,
    pub confirmed_lsn: Gauge<u64, AtomicU64>,
    /// Bytes between the server's WAL position and the slot's confirmed position; -1 unknown.
    pub slot_lag_bytes: Gauge,
    /// Bytes of WAL the slot holds back (from its restart_lsn); -1 unknown.
    pub slot_retained_wal_bytes: Gauge,
    /// Set from the clocks above at each scrape.
    last_received_age: Gauge<f64, AtomicU64>,
    last_progress_age: Gauge<f64, AtomicU64>,
    pub commit_to_ack: Histogram,
    /// From a transaction's commit to the relay reading its BEGIN: PostgreSQL's share of
    /// `commit_to_ack` (WAL flush, walsender wake-up and decoding, the network).
    pub commit_to_read: Histogram,
    /// The session's producer's view of the brokers (none before the first session).
    kafka_latency: Shared<KafkaLatency>,
    /// `exactly_once`: Kafka transactions committed.
    pub kafka_transactions_committed: Counter,
    /// `exactly_once`: Kafka transactions aborted or failed (each ends its session).
    pub kafka_transactions_aborted: Counter,
    /// `exactly_once`: records (events and dead letters) in committed Kafka transactions.
    pub kafka_transaction_records: Counter,
    /// `exactly_once`: PostgreSQL transactions skipped at a session start because the progress
    /// record says Kafka already holds them.
    pub transactions_skipped: Counter,
    /// `exactly_once`: how long a Kafka transaction's commit took.
    pub kafka_commit_latency: Histogram,
    /// `[tracing]`: OTLP export requests that failed (their spans are dropped).
    pub trace_export_failures: Counter,
    /// What Kafka refuses for deployment reasons; kept across sessions.
    blocked: Shared<Blocked>,
    /// The subjects the schema registry gives no schema for now (`[outbox.serialization]`).
    schema_registry: Shared<RegistryHealth>,
    /// Seconds since each armed sweeper hold was armed, by outbox table (set by the sweeper).
    sweeper_holds: Labelled<[(&'static str, String); 1], PromGauge>,
    /// Set from [`Metrics::readiness`] at each scrape.
    ready: Gauge,
    /// The `slot` and `publication` labels of `outbox_relay_info`.
    info: Info,
}

impl Default for Metrics {
    /// Declares every family: name, help and type, once each. Struct fields are initialised
    /// in the order written, so this order is the exposition's.
    fn default() -> Self {
        let mut r = Declare(Registry::default());
        Metrics {
            started: Instant::now(),
            progress_at_ms: AtomicU64::new(0),
            frame_at_ms: AtomicU64::new(0),
            receive_timeout_ms: AtomicU64::new(0),

            events_published: r.counter(
                "outbox_relay_events_published_total",
                "Outbox events acknowledged by Kafka.",
            ),
            events_dead_lettered: r.counter(
                "outbox_relay_events_dead_lettered_total",
                "Events sent to the dead-letter topic.",
            ),
            dead_letter_breaker_trips: r.counter(
                "outbox_relay_dead_letter_breaker_trips_total",
                "Times more dead letters than dead_letter.max_per_minute arrived within a minute.",
            ),
            dead_letter_breaker_open: r.gauge(
                "outbox_relay_dead_letter_breaker_open",
                "1 while the tripped dead-letter breaker holds the relay (on_breaker = unready): nothing is read, /readyz is red.",
            ),
            messages_rejected: r.counter(
                "outbox_relay_messages_rejected_total",
                "Logical decoding messages ignored (non-transactional).",
            ),
            reconnects: r.counter(
                "outbox_relay_reconnects_total",
                "Sessions restarted after a transient error.",
            ),
            delivery_errors: r.family(
                "outbox_relay_delivery_errors_total",
                "Records Kafka did not take, by error kind.",
                Labelled::default(),
            ),
            state: r.family(
                "outbox_relay_state",
                "The relay's state (1 for the current one).",
                OneHot::new("state", RelayState::ALL.map(RelayState::name).to_vec())
                    .selecting(RelayState::Starting as usize),
            ),
            wal_status: r.family(
                "outbox_relay_slot_wal_status",
                "The slot's wal_status (1 for the current one).",
                OneHot::new("status", WAL_STATUSES.to_vec()),
            ),
            records_in_flight: r.gauge(
                "outbox_relay_records_in_flight",
                "Records handed to Kafka and not yet acknowledged.",
            ),
            ledger_transactions: r.gauge(
                "outbox_relay_ledger_transactions",
                "Transactions held by the checkpoint ledger (open, or waiting for acknowledgements).",
            ),
            received_lsn: r.gauge(
                "outbox_relay_received_lsn",
                "Newest WAL position received (as a number).",
            ),
            confirmed_lsn: r.gauge(
                "outbox_relay_confirmed_lsn",
                "WAL position confirmed to PostgreSQL (as a number).",
            ),
            slot_lag_bytes: r.family(
                "outbox_relay_slot_lag_bytes",
                "Server WAL position minus the slot's confirmed_flush_lsn (-1: unknown).",
                Gauge::unknown(),
            ),
            slot_retained_wal_bytes: r.family(
                "outbox_relay_slot_retained_wal_bytes",
                "WAL the slot holds back, from its restart_lsn (-1: unknown).",
                Gauge::unknown(),
            ),
            last_received_age: r.gauge(
                "outbox_relay_last_received_age_seconds",
                "Seconds since bytes last arrived on the replication stream.",
            ),
            last_progress_age: r.gauge(
                "outbox_relay_last_progress_age_seconds",
                "Seconds since the confirmed position last moved while events waited.",
            ),
            commit_to_ack: r.histogram(
                "outbox_relay_commit_to_ack_seconds",
                "Latency from transaction commit to Kafka acknowledgement.",
            ),
            commit_to_read: r.histogram(
                "outbox_relay_commit_to_read_seconds",
                "Latency from transaction commit to the relay reading it from the replication stream (PostgreSQL's share of commit_to_ack).",
            ),
            kafka_latency: {
                let latency = Shared::default();
                r.family(
                    "outbox_relay_kafka_rtt_seconds",
                    "Kafka request round-trip time by broker, over librdkafka's last statistics window (quantile 1: the maximum; 0 when no request).",
                    BrokerQuantiles(latency.clone(), |b| b.rtt),
                );
                r.family(
                    "outbox_relay_kafka_queue_seconds",
                    "How long records waited in librdkafka before their produce request was made, by broker, over the last statistics window.",
                    BrokerQuantiles(latency.clone(), |b| b.queue),
                );
                latency
            },
            kafka_transactions_committed: r.counter(
                "outbox_relay_kafka_transactions_committed_total",
                "Kafka transactions committed (delivery = exactly_once).",
            ),
            kafka_transactions_aborted: r.counter(
                "outbox_relay_kafka_transactions_aborted_total",
                "Kafka transactions aborted or failed; each ends its session (delivery = exactly_once).",
            ),
            kafka_transaction_records: r.counter(
                "outbox_relay_kafka_transaction_records_total",
                "Records in committed Kafka transactions; divided by the committed count: records per transaction.",
            ),
            transactions_skipped: r.counter(
                "outbox_relay_transactions_skipped_total",
                "PostgreSQL transactions skipped because the progress record says Kafka holds them.",
            ),
            kafka_commit_latency: r.histogram(
                "outbox_relay_kafka_commit_seconds",
                "How long committing a Kafka transaction took (delivery = exactly_once).",
            ),
            trace_export_failures: r.counter(
                "outbox_relay_trace_export_failures_total",
                "OTLP span export requests that failed (collector unreachable or refusing); their spans are dropped, publishing is not affected.",
            ),
            blocked: r.family(
                "outbox_relay_kafka_blocked",
                "1 per reason and topic that Kafka refuses for a deployment reason (a missing ACL or topic, a refused login or topic creation): records wait, /readyz is red.",
                Shared::default(),
            ),
            schema_registry: {
                let health = Shared::default();
                r.family(
                    "outbox_relay_schema_registry_blocked",
                    "1 per subject the schema registry gives no schema for now (down, refusing the login, or no configured subject): its records wait, /readyz is red.",
                    health.clone(),
                );
                r.family(
                    "outbox_relay_schema_registry_stale_seconds",
                    "Age of the cached latest schema used for a subject while the registry fails to refresh it (records flow; past latest_ttl_ms plus one hour they wait).",
                    StaleSchemas(health.clone()),
                );
                health
            },
            sweeper_holds: r.family(
                "outbox_relay_sweeper_hold_age_seconds",
                "Seconds since the sweeper hold on an outbox table was armed (a new slot): its rows committed before the slot are kept until a replay covers them or `outbox-relay slot release-hold` ends it.",
                Labelled::default(),
            ),
            ready: r.gauge(
                "outbox_relay_ready",
                "1 when /readyz answers 200: streaming, frames arriving, progress not stalled.",
            ),
            info: r.family(
                "outbox_relay_info",
                "The relay's slot, publication and version (always 1).",
                Info::default(),
            ),
            registry: r.0,
        }
    }
}

impl Metrics {
    pub fn state(&self) -> RelayState {
        self.state
            .selected()
            .and_then(|i| RelayState::ALL.get(i).copied())
            .unwrap_or(RelayState::Failed)
    }

    pub fn set_state(&self, state: RelayState) {
        self.state.select(Some(state as usize));
        if state == RelayState::Streaming {
            self.mark_progress();
            self.mark_received(Instant::now());
        }
    }

    /// Shows `latency` (a new session's producer's) from now on.
    pub fn watch_kafka(&self, latency: Arc<KafkaLatency>) {
        self.kafka_latency.set(latency);
    }

    /// Shows (and makes `/readyz` depend on) what `blocked` holds, from now on.
    pub fn watch_blocked(&self, blocked: Arc<Blocked>) {
        self.blocked.set(blocked);
    }

    /// Shows (and makes `/readyz` depend on) what the schema registry refuses, from now on.
    pub fn watch_registry(&self, health: Arc<RegistryHealth>) {
        self.schema_registry.set(health);
    }

    /// The registry of Kafka blocks the sessions report to (set with `watch_blocked`; a
    /// fresh one when none was).
    pub fn blocked(&self) -> Arc<Blocked> {
        self.blocked
            .get_or_insert_with(|| Blocked::new(&KafkaConfig::default()))
    }

    /// Kafka refuses something for a deployment reason now.
    pub fn kafka_blocked(&self) -> bool {
        self.blocked.get().is_some_and(|b| !b.current().is_empty())
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
        self.delivery_errors
            .0
            .get_or_create(&[("kind", kind)])
            .inc();
    }

    /// The sweeper holds armed now: `(schema.table, seconds since armed)`; the others' series
    /// go.
    pub fn set_sweeper_holds(&self, holds: &[(String, i64)]) {
        self.sweeper_holds.0.clear();
        for (table, age) in holds {
            self.sweeper_holds
                .0
                .get_or_create(&[("table", table.clone())])
                .set(*age);
        }
    }

    /// The slot and publication `outbox_relay_info` names.
    pub fn set_info(&self, slot: &str, publication: &str) {
        *self.info.0.lock().unwrap_or_else(PoisonError::into_inner) =
            (slot.to_string(), publication.to_string());
    }

    /// The slot's `wal_status`; one PostgreSQL does not name (or "") shows no series as 1.
    pub fn set_wal_status(&self, status: &str) {
        self.wal_status
            .select(WAL_STATUSES.iter().position(|s| *s == status));
    }

    pub fn set_lsns(&self, received: Lsn, confirmed: Lsn) {
        self.received_lsn.store(received.0, Relaxed);
        self.confirmed_lsn.store(confirmed.0, Relaxed);
    }

    /// Ready: streaming, frames arriving within the receive deadline, and not stuck with work
    /// waiting longer than `staleness`.
    pub fn readiness(&self, staleness: Duration) -> Result<(), String> {
        if let Some(blocked) = self.blocked.get() {
            blocked.readiness()?;
        }
        if let Some(registry) = self.schema_registry.get() {
            registry.readiness()?;
        }
        if self.dead_letter_breaker_open.load(Relaxed) > 0 {
            return Err("the dead-letter breaker tripped (dead_letter.max_per_minute): nothing is read until the relay is restarted; see the logs".into());
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
        self.last_received_age
            .set(self.since_received().as_secs_f64());
        self.last_progress_age
            .set(self.since_progress().as_secs_f64());
        self.ready.set(i64::from(self.readiness(staleness).is_ok()));
        let mut out = String::with_capacity(4096);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

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

    /// A `Metrics` with a value in every family (each labelled family with a series).
    pub(crate) fn every_family() -> Metrics {
        let m = Metrics::default();
        m.events_published.fetch_add(3, Relaxed);
        m.events_dead_lettered.fetch_add(1, Relaxed);
        m.messages_rejected.store(2, Relaxed);
        m.reconnects.fetch_add(1, Relaxed);
        m.records_in_flight.store(5, Relaxed);
        m.ledger_transactions.store(2, Relaxed);
        m.set_lsns(Lsn(0x16B_3748), Lsn(0x16B_3700));
        m.slot_lag_bytes.store(72, Relaxed);
        m.slot_retained_wal_bytes.store(4096, Relaxed);
        m.commit_to_ack.observe(Duration::from_millis(3));
        m.commit_to_read.observe(Duration::from_millis(1));
        m.kafka_transactions_committed.fetch_add(1, Relaxed);
        m.kafka_transactions_aborted.fetch_add(1, Relaxed);
        m.kafka_transaction_records.fetch_add(4, Relaxed);
        m.transactions_skipped.fetch_add(1, Relaxed);
        m.kafka_commit_latency.observe(Duration::from_millis(12));
        m.count_delivery_error(&KafkaError::MessageProduction(
            rdkafka::types::RDKafkaErrorCode::MessageTimedOut,
        ));
        m.set_wal_status("extended");
        m.set_state(RelayState::Streaming);
        m.set_info("outbox_relay", "outbox_relay_pub");
        let latency = Arc::new(KafkaLatency::default());
        let stats = r#"{"brokers": {"k:9092/1": {"name": "k:9092/1", "nodeid": 1,
            "rtt": {"p50": 500, "p99": 4000, "max": 47000},
            "int_latency": {"p50": 5000, "p99": 6000, "max": 9000}}}}"#;
        latency.update(stats.as_bytes()).unwrap();
        m.watch_kafka(latency);
        let blocked = Arc::new(Blocked::new(&KafkaConfig::default()));
        blocked.block(
            crate::sink::blocked::BlockReason::TopicAuthorization,
            "orders",
            &"denied",
        );
        m.watch_blocked(blocked);
        let registry = Arc::new(RegistryHealth::new("http://registry"));
        registry.block("orders-value", &"connection refused");
        let hour = Duration::from_secs(3600);
        registry.serving_stale("users-value", Duration::from_secs(400), hour, &"HTTP 503");
        m.watch_registry(registry);
        m.set_sweeper_holds(&[("public.outbox".into(), 90)]);
        m
    }

    /// Also the tool to diff the exposition across a change: with `OUTBOX_METRICS_DUMP=FILE`
    /// it writes this rendering to FILE and a fresh relay's to FILE.empty.
    #[test]
    fn every_family_has_help_a_type_and_a_sample() {
        let text = every_family().render(Duration::from_secs(5));
        if let Ok(path) = std::env::var("OUTBOX_METRICS_DUMP") {
            std::fs::write(&path, &text).unwrap();
            let empty = Metrics::default().render(Duration::from_secs(5));
            std::fs::write(format!("{path}.empty"), empty).unwrap();
        }
        let lines: Vec<&str> = text.lines().collect();
        let mut families = 0;
        for (i, line) in lines.iter().enumerate() {
            let Some(typed) = line.strip_prefix("# TYPE ") else {
                continue;
            };
            families += 1;
            let (name, kind) = typed.split_once(' ').unwrap();
            assert!(
                lines[i - 1].starts_with(&format!("# HELP {name} ")),
                "{name}: no help\n{text}"
            );
            assert!(
                ["counter", "gauge", "histogram"].contains(&kind),
                "{name}: {kind}"
            );
            let sample = lines.get(i + 1).copied().unwrap_or_default();
            assert!(
                sample.starts_with(name) && !sample.starts_with('#'),
                "{name}: no sample\n{text}"
            );
        }
        assert!(families > 20, "{text}");
    }
}
