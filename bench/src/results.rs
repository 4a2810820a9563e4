//! The result file (`bench/results/*.json`): what `report` writes and reads back. Every kept
//! result file (the latest full run of each shape) parses with these types (see the test at
//! the end), so that a field renamed here fails a test instead of making them unreadable.
//! Files written before a field existed lack it: such fields are `Option`s.

use serde::{Deserialize, Serialize};

use crate::records::{BigTxn, Failure, Idle, KafkaTransactions, Latency, LoadSample};
use crate::records::{Recvlogical, Resend, TxnProbe};

/// One benchmark run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BenchResult {
    pub run: RunMeta,
    pub machine: Machine,
    pub drain: Vec<DrainRow>,
    #[serde(default)]
    pub drain_exactly_once_over_at_least_once: Option<Vec<DeliveryRatio>>,
    /// `--peer debezium`: the peer's drains of the same backlogs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_drain: Option<Vec<PeerRow>>,
    #[serde(default)]
    pub payload: Option<Vec<DrainRow>>,
    #[serde(default)]
    pub many_topics: Option<Vec<DrainRow>>,
    /// The schema shape: the same backlog drained with values Avro-encoded and not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serialization: Option<Vec<DrainRow>>,
    #[serde(default)]
    pub big_transaction: Option<BigTransaction>,
    #[serde(default)]
    pub resend_per_kill: Option<Vec<Resend>>,
    pub latency: Vec<Latency>,
    #[serde(default)]
    pub kafka_transaction_probe: Option<TxnProbe>,
    /// One entry per delivery mode; a single object (or null) in files from before the modes.
    pub idle: Option<OneOrMany<Idle>>,
    #[serde(default)]
    pub errors: Option<Vec<Failure>>,
    pub load: Vec<LoadSample>,
    pub targets: Targets,
}

/// A list, or one item in files from before the list.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    Many(Vec<T>),
    One(T),
}

impl<T> OneOrMany<T> {
    pub fn as_slice(&self) -> &[T] {
        match self {
            OneOrMany::Many(v) => v,
            OneOrMany::One(one) => std::slice::from_ref(one),
        }
    }
}

/// How the run was made: the command, the settings, the versions.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunMeta {
    pub date: String,
    pub command: String,
    pub label: String,
    pub events: f64,
    pub partitions: f64,
    pub payload_bytes_avg: f64,
    pub drain_relay_status_interval_ms: f64,
    #[serde(default)]
    pub delivery: Option<String>,
    #[serde(default)]
    pub shapes: Option<String>,
    pub relay_extra_env: String,
    pub kafka_jvm_opts: String,
    pub load_start: String,
    pub load_end: String,
    pub git_commit: String,
    pub relay_sha256: String,
    pub postgres: String,
    pub kafka: String,
    pub rustc: String,
}

/// The machine the run was made on.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    pub nproc: u64,
    pub memory_mb: u64,
    pub cpu_model: String,
    pub kernel: String,
    pub librdkafka: String,
}

impl Machine {
    /// This machine.
    pub fn here() -> Machine {
        let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        let cpu_model = read("/proc/cpuinfo")
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_string())
            .unwrap_or_default();
        let mem_kb: u64 = read("/proc/meminfo")
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0);
        Machine {
            nproc: std::thread::available_parallelism().map_or(0, |n| n.get() as u64),
            memory_mb: mem_kb / 1024,
            cpu_model,
            kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
            librdkafka: rdkafka::util::get_rdkafka_version().1,
        }
    }
}

/// One relay drain beside `pg_recvlogical`'s drain of the same backlog.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRow {
    #[serde(default)]
    pub round: Option<String>,
    #[serde(default)]
    pub delivery: Option<String>,
    pub txn_rows: f64,
    pub events: f64,
    #[serde(default)]
    pub payload_bytes_avg: Option<f64>,
    #[serde(default)]
    pub payload_mb: Option<f64>,
    #[serde(default)]
    pub aggregate_types: Option<f64>,
    /// The relay's `outbox.serialization.format` (the schema shape).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serialization: Option<String>,
    pub pg_recvlogical_seconds: Option<f64>,
    pub pg_recvlogical_events_per_s: Option<f64>,
    #[serde(default)]
    pub pg_recvlogical_payload_mb_per_s: Option<f64>,
    /// CPU seconds of the walsender serving `pg_recvlogical` (about the drain's seconds: the
    /// walsender was the bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pg_recvlogical_walsender_cpu_seconds: Option<f64>,
    /// `pg_recvlogical` once more after every contender of the round, from its own copy of
    /// the slot: the limit measured after them as well as before (the ratios are against the
    /// drain before). Absent in runs from before 2026-12-06.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pg_recvlogical_after_events_per_s: Option<f64>,
    /// `--producer-alone`: the relay's producer sending the same events with no relay in
    /// front (the Kafka side's limit), and its CPU per million events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_alone_events_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_alone_cpu_seconds_per_million_events: Option<f64>,
    pub relay_seconds: f64,
    pub relay_events_per_s: f64,
    #[serde(default)]
    pub relay_second_half_events_per_s: Option<f64>,
    #[serde(default)]
    pub relay_payload_mb_per_s: Option<f64>,
    pub ratio: Option<f64>,
    pub ratio_target: Option<f64>,
    pub relay_peak_rss_mb: f64,
    pub relay_cpu_seconds: f64,
    pub relay_cpu_seconds_per_million_events: f64,
    /// CPU seconds of the walsender serving the relay until its slot reached the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_walsender_cpu_seconds: Option<f64>,
    pub relay_threads: f64,
    pub relay_context_switches_per_1000_events: f64,
    #[serde(default)]
    pub relay_kafka_transactions: Option<KafkaTransactions>,
    /// Dead letters of the drain (from the relay's `/metrics`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_events_dead_lettered: Option<f64>,
    pub load_before: String,
}

/// A peer's drain of one round's backlog beside `pg_recvlogical`'s and the relay's.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerRow {
    pub peer: String,
    pub round: String,
    pub txn_rows: f64,
    pub events: f64,
    /// Records in the peer's topic once its slot reached the end.
    pub kafka_events: f64,
    /// Events of the backlog not in its topic (0 expected).
    pub events_missing: f64,
    pub pg_recvlogical_events_per_s: Option<f64>,
    /// From streaming (its slot active) until the slot confirmed the last commit.
    pub peer_seconds: f64,
    /// None when events are missing: a peer that lost events does not show as fast.
    pub peer_events_per_s: Option<f64>,
    /// Peer events/s ÷ pg_recvlogical events/s (none when events are missing).
    pub ratio: Option<f64>,
    /// The relay compared (at-least-once when it ran, as the peer delivers).
    pub relay_delivery: Option<String>,
    pub relay_events_per_s: Option<f64>,
    pub relay_over_peer: Option<f64>,
    /// Process start to streaming (JVM, connector start), not in `peer_seconds`.
    pub peer_startup_seconds: f64,
    pub peer_startup_cpu_seconds: f64,
    pub peer_peak_rss_mb: f64,
    /// CPU seconds of the drain alone (the start-up's left out).
    pub peer_cpu_seconds: f64,
    pub peer_cpu_seconds_per_million_events: f64,
    pub relay_peak_rss_mb: Option<f64>,
    pub relay_cpu_seconds_per_million_events: Option<f64>,
    pub load_before: String,
}

/// exactly_once ÷ at_least_once for one round that has both.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeliveryRatio {
    pub round: String,
    pub txn_rows: u64,
    pub at_least_once_events_per_s: f64,
    pub exactly_once_events_per_s: f64,
    pub exactly_once_over_at_least_once: f64,
    pub target: Option<f64>,
}

/// The one-transaction shape: the relay per delivery mode, `pg_recvlogical` afterwards.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BigTransaction {
    pub relay: Vec<BigTxn>,
    pub pg_recvlogical: Option<Recvlogical>,
}

/// The figures the project aims at (recorded with each run, so a file explains itself).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Targets {
    pub drain_ratio_100_row_txns: f64,
    pub drain_ratio_1_row_txns: f64,
    #[serde(default)]
    pub exactly_once_drain_over_at_least_once_10_and_100_row_txns: Option<f64>,
    pub p99_ms_at_5000_per_s: f64,
    #[serde(default)]
    pub exactly_once_p99_ms_at_5000_per_s: Option<f64>,
    pub peak_rss_mb: f64,
    pub idle_cpu_percent_of_core: f64,
}

impl Default for Targets {
    fn default() -> Targets {
        Targets {
            drain_ratio_100_row_txns: 0.8,
            drain_ratio_1_row_txns: 0.6,
            exactly_once_drain_over_at_least_once_10_and_100_row_txns: Some(0.7),
            p99_ms_at_5000_per_s: 20.0,
            exactly_once_p99_ms_at_5000_per_s: Some(150.0),
            peak_rss_mb: 64.0,
            idle_cpu_percent_of_core: 1.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use serde_json::Value;

    use super::*;

    /// The committed result files: the latest full run of each shape (bench/README.md cites
    /// them; earlier runs are in git's history, read by the bench of their own commit).
    fn committed() -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        files.sort();
        files
    }

    /// A result as compared: numbers as f64 (1 and 1.0 alike: earlier files wrote either),
    /// null members left out (a file from before a field lacks it; the types write null).
    fn normalized(v: Value) -> Value {
        match v {
            Value::Number(n) => n.as_f64().map_or(Value::Null, |f| serde_json::json!(f)),
            Value::Array(a) => Value::Array(a.into_iter().map(normalized).collect()),
            Value::Object(o) => Value::Object(
                o.into_iter()
                    .filter(|(_, v)| !v.is_null())
                    .map(|(k, v)| (k, normalized(v)))
                    .collect(),
            ),
            other => other,
        }
    }

    /// Every kept result file parses with the typed structs, and writing it back gives the
    /// same JSON: no field is unknown to the types (they deny unknown fields), none is dropped
    /// or renamed on the way (the comparison), so `outbox-bench report --result` still prints
    /// the runs the README quotes, and a rename fails here rather than there.
    #[test]
    fn every_kept_result_file_round_trips_through_the_types() {
        let files = committed();
        assert!(!files.is_empty(), "no bench/results/*.json");
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            let typed: BenchResult =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let original: Value = serde_json::from_str(&text).unwrap();
            let back = serde_json::to_value(&typed).unwrap();
            assert_eq!(
                normalized(back),
                normalized(original),
                "{} changes when read and written back",
                path.display()
            );
        }
    }
}
