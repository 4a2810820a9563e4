//! The relay's metrics and health, shared between the pipeline (which updates them) and the
//! HTTP listener (which renders them). Lock-free counters; one small mutex for labelled maps.
//!
//! Every series is named here, shaped `outbox_relay_<noun>_<unit>[_total]`, with
//! low-cardinality labels only (error kinds, states, wal_status values).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::lsn::Lsn;

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

/// A fixed-bucket histogram (cumulative on render, as Prometheus wants).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, value: Duration) {
        let secs = value.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|&b| secs <= b) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros.fetch_add(value.as_micros() as u64, Relaxed);
    }

    /// The approximate quantile `q` (0..1) from the buckets: the upper bound of the bucket
    /// where it falls (`None` when empty or beyond the last bucket).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let count = self.count.load(Relaxed);
        if count == 0 {
            return None;
        }
        let target = (q * count as f64).ceil() as u64;
        let mut seen = 0;
        for (bucket, bound) in self.buckets.iter().zip(LATENCY_BUCKETS) {
            seen += bucket.load(Relaxed);
            if seen >= target {
                return Some(bound);
            }
        }
        None
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (bucket, bound) in self.buckets.iter().zip(LATENCY_BUCKETS) {
            cumulative += bucket.load(Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let count = self.count.load(Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_micros.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum {sum}\n{name}_count {count}");
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
    wal_status: Mutex<String>,
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
            kafka_transactions_committed: AtomicU64::new(0),
            kafka_transactions_aborted: AtomicU64::new(0),
            kafka_transaction_records: AtomicU64::new(0),
            transactions_skipped: AtomicU64::new(0),
            kafka_commit_latency: Histogram::default(),
            delivery_errors: Mutex::new(BTreeMap::new()),
            wal_status: Mutex::new(String::new()),
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

    pub fn count_delivery_error(&self, kind: &str) {
        if let Ok(mut map) = self.delivery_errors.lock() {
            *map.entry(kind.to_string()).or_default() += 1;
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

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let counter = |out: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}"
            );
        };
        let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        };
        counter(
            &mut out,
            "outbox_relay_events_published_total",
            "Outbox events acknowledged by Kafka.",
            self.events_published.load(Relaxed),
        );
        counter(
            &mut out,
            "outbox_relay_events_dead_lettered_total",
            "Events sent to the dead-letter topic.",
            self.events_dead_lettered.load(Relaxed),
        );
        counter(
            &mut out,
            "outbox_relay_messages_rejected_total",
            "Logical decoding messages ignored (non-transactional).",
            self.messages_rejected.load(Relaxed),
        );
        counter(
            &mut out,
            "outbox_relay_reconnects_total",
            "Sessions restarted after a transient error.",
            self.reconnects.load(Relaxed),
        );
        counter(
            &mut out,
            "outbox_relay_kafka_transactions_committed_total",
            "Kafka transactions committed (delivery = exactly_once).",
            self.kafka_transactions_committed.load(Relaxed),
        );
        counter(
            &mut out,
            "outbox_relay_kafka_transactions_aborted_total",
            "Kafka transactions aborted or failed; each ends its session (delivery = exactly_once).",
            self.kafka_transactions_aborted.load(Relaxed),
        );
        counter(
            &mut out,
            "outbox_relay_kafka_transaction_records_total",
            "Records in committed Kafka transactions; divided by the committed count: records per transaction.",
            self.kafka_transaction_records.load(Relaxed),
        );
        counter(
            &mut out,
            "outbox_relay_transactions_skipped_total",
            "PostgreSQL transactions skipped because the progress record says Kafka holds them.",
            self.transactions_skipped.load(Relaxed),
        );
        self.render_labelled(&mut out);
        gauge(
            &mut out,
            "outbox_relay_records_in_flight",
            "Records handed to Kafka and not yet acknowledged.",
            self.records_in_flight.load(Relaxed) as f64,
        );
        gauge(
            &mut out,
            "outbox_relay_ledger_transactions",
            "Transactions held by the checkpoint ledger (open, or waiting for acknowledgements).",
            self.ledger_transactions.load(Relaxed) as f64,
        );
        gauge(
            &mut out,
            "outbox_relay_received_lsn",
            "Newest WAL position received (as a number).",
            self.received_lsn.load(Relaxed) as f64,
        );
        gauge(
            &mut out,
            "outbox_relay_confirmed_lsn",
            "WAL position confirmed to PostgreSQL (as a number).",
            self.confirmed_lsn.load(Relaxed) as f64,
        );
        gauge(
            &mut out,
            "outbox_relay_slot_lag_bytes",
            "Server WAL position minus the slot's confirmed_flush_lsn (-1: unknown).",
            self.slot_lag_bytes.load(Relaxed) as f64,
        );
        gauge(
            &mut out,
            "outbox_relay_slot_retained_wal_bytes",
            "WAL the slot holds back, from its restart_lsn (-1: unknown).",
            self.slot_retained_wal_bytes.load(Relaxed) as f64,
        );
        gauge(
            &mut out,
            "outbox_relay_last_received_age_seconds",
            "Seconds since bytes last arrived on the replication stream.",
            self.since_received().as_secs_f64(),
        );
        gauge(
            &mut out,
            "outbox_relay_last_progress_age_seconds",
            "Seconds since the confirmed position last moved while events waited.",
            self.since_progress().as_secs_f64(),
        );
        self.commit_to_ack.render(
            &mut out,
            "outbox_relay_commit_to_ack_seconds",
            "Latency from transaction commit to Kafka acknowledgement.",
        );
        self.kafka_commit_latency.render(
            &mut out,
            "outbox_relay_kafka_commit_seconds",
            "How long committing a Kafka transaction took (delivery = exactly_once).",
        );
        out
    }

    fn render_labelled(&self, out: &mut String) {
        let _ = writeln!(out, "# HELP outbox_relay_delivery_errors_total Records Kafka did not take, by error kind.\n# TYPE outbox_relay_delivery_errors_total counter");
        if let Ok(map) = self.delivery_errors.lock() {
            for (kind, n) in map.iter() {
                let _ = writeln!(
                    out,
                    "outbox_relay_delivery_errors_total{{kind=\"{kind}\"}} {n}"
                );
            }
        }
        let _ = writeln!(out, "# HELP outbox_relay_state The relay's state (1 for the current one).\n# TYPE outbox_relay_state gauge");
        let current = self.state();
        for s in RelayState::ALL {
            let v = u8::from(s == current);
            let _ = writeln!(out, "outbox_relay_state{{state=\"{}\"}} {v}", s.name());
        }
        let _ = writeln!(out, "# HELP outbox_relay_slot_wal_status The slot's wal_status (1 for the current one).\n# TYPE outbox_relay_slot_wal_status gauge");
        if let Ok(status) = self.wal_status.lock() {
            for s in ["reserved", "extended", "unreserved", "lost", "missing"] {
                let v = u8::from(*status == s);
                let _ = writeln!(out, "outbox_relay_slot_wal_status{{status=\"{s}\"}} {v}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_is_cumulative_and_quantiles_follow_buckets() {
        let h = Histogram::default();
        for ms in [1, 2, 3, 8, 15, 40] {
            h.observe(Duration::from_millis(ms));
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.005\"} 3"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 6"), "{out}");
        assert!(out.contains("x_count 6"));
        assert_eq!(h.quantile(0.5), Some(0.005));
        assert_eq!(h.quantile(0.99), Some(0.05));
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
        m.count_delivery_error("MessageTimedOut");
        m.set_wal_status("reserved");
        let text = m.render();
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
        ] {
            assert!(text.contains(series), "missing {series}\n{text}");
        }
    }
}
