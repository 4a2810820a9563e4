//! What one run measures, one typed record per measurement (the run directory's
//! `results.jsonl`, one record a line). Each record carries its `kind`, which `report` groups
//! by. A leaf: the measuring modules make these, `report` reads them.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// A zero-sized `kind` field that (de)serialises as one fixed string, so that a record of
/// the wrong kind does not parse as another.
macro_rules! kind_tag {
    ($name:ident, $text:literal) => {
        #[derive(Debug, Clone, Copy, Default, PartialEq)]
        pub struct $name;
        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str($text)
            }
        }
        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                if text == $text {
                    Ok($name)
                } else {
                    Err(D::Error::custom(format!(
                        "kind {text:?}, expected {:?}",
                        $text
                    )))
                }
            }
        }
    };
}

kind_tag!(LoadKind, "load");
kind_tag!(RecvlogicalKind, "recvlogical");
kind_tag!(RelayDrainKind, "relay_drain");
kind_tag!(RelayMetricsKind, "relay_metrics");
kind_tag!(LatencyKind, "latency");
kind_tag!(IdleKind, "idle");
kind_tag!(BigTxnKind, "big_txn");
kind_tag!(ResendKind, "resend");
kind_tag!(ErrorKind, "error");
kind_tag!(TxnProbeKind, "txn_probe");
kind_tag!(PeerDrainKind, "peer_drain");
kind_tag!(ProducerAloneDrainKind, "producer_alone_drain");

/// One line of `results.jsonl`.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Record {
    Load(LoadSample),
    Recvlogical(Recvlogical),
    RelayDrain(RelayDrain),
    RelayMetrics(RelayMetrics),
    Latency(Latency),
    Idle(Idle),
    BigTxn(BigTxn),
    Resend(Resend),
    Error(Failure),
    TxnProbe(TxnProbe),
    PeerDrain(PeerDrain),
    ProducerAloneDrain(ProducerAloneDrain),
}

impl Record {
    /// Parses one line, by its `kind` (so that an error names the field of that kind).
    pub fn from_line(line: &str) -> Result<Record, serde_json::Error> {
        let value: Value = serde_json::from_str(line)?;
        let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
        Ok(match kind {
            "load" => Record::Load(serde_json::from_value(value)?),
            "recvlogical" => Record::Recvlogical(serde_json::from_value(value)?),
            "relay_drain" => Record::RelayDrain(serde_json::from_value(value)?),
            "relay_metrics" => Record::RelayMetrics(serde_json::from_value(value)?),
            "latency" => Record::Latency(serde_json::from_value(value)?),
            "idle" => Record::Idle(serde_json::from_value(value)?),
            "big_txn" => Record::BigTxn(serde_json::from_value(value)?),
            "resend" => Record::Resend(serde_json::from_value(value)?),
            "error" => Record::Error(serde_json::from_value(value)?),
            "txn_probe" => Record::TxnProbe(serde_json::from_value(value)?),
            "peer_drain" => Record::PeerDrain(serde_json::from_value(value)?),
            "producer_alone_drain" => Record::ProducerAloneDrain(serde_json::from_value(value)?),
            other => return Err(serde_json::Error::custom(format!("unknown kind {other:?}"))),
        })
    }
}

/// The load average (`/proc/loadavg`, first three fields) before a timed phase.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadSample {
    pub kind: LoadKind,
    pub phase: String,
    pub loadavg: String,
}

/// The backlog a drain round measured: shared by `pg_recvlogical`'s and the relays' records.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
// No deny_unknown_fields: serde does not support it with flatten.
pub struct Backlog {
    /// `txn`, `payload`, `topics`, `schema` or `big_txn`: groups the report's tables.
    pub shape: String,
    /// Names the database, the slots and the topics.
    pub round: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn_rows: Option<u64>,
    pub events: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload_bytes: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toast_mb: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_types: Option<u64>,
    /// The relay's `outbox.serialization.format` (the schema shape; none elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serialization: Option<String>,
}

/// `pg_recvlogical` draining a slot to `/dev/null`: PostgreSQL's own limit.
#[derive(Debug, Clone, Serialize, Deserialize)]
// No deny_unknown_fields: serde does not support it with flatten.
pub struct Recvlogical {
    pub kind: RecvlogicalKind,
    #[serde(flatten)]
    pub backlog: Backlog,
    pub seconds: f64,
    /// CPU seconds of the walsender that served it (`walsender_cpu.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walsender_cpu_seconds: Option<f64>,
    /// The round's second `pg_recvlogical` drain, from a slot copy of its own, after every
    /// contender: the limit is measured before and after them, so a limit that moved during
    /// the round shows (false: the drain before them, the one the ratios are against).
    #[serde(default, skip_serializing_if = "is_false")]
    pub after_contenders: bool,
}

fn is_false(b: &bool) -> bool {
    !b
}

/// `--producer-alone` on a drain round: the relay's producer sending the backlog's events to
/// topics of its own (the Kafka side's limit, as `pg_recvlogical` is the walsender's).
#[derive(Debug, Clone, Serialize, Deserialize)]
// No deny_unknown_fields: serde does not support it with flatten.
pub struct ProducerAloneDrain {
    pub kind: ProducerAloneDrainKind,
    #[serde(flatten)]
    pub backlog: Backlog,
    pub sent: ProducerAlone,
}

/// The relay's producer with no relay in front of it (`producer_alone.rs`): the records
/// measured (a steady rate's warm-up left out), the seconds from its creation (or the
/// warm-up's end) to the last acknowledgement, and its process's CPU over them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProducerAlone {
    pub events: u64,
    pub seconds: f64,
    pub cpu_seconds: f64,
}

/// A slot that reached its target, and the relay's `/proc` figures at that moment.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SlotReached {
    /// From the relay's start (or the commit, big-txn) to the slot confirming the target.
    pub seconds: f64,
    pub confirmed_flush_lsn: Option<String>,
    pub target_lsn: String,
    pub vmhwm_kb: u64,
    pub vmrss_kb: u64,
    pub cpu_seconds: f64,
    pub threads: u64,
    pub context_switches: u64,
    /// When (s) and at which fraction of the way the slot was first seen half-way or further.
    pub half_way_seconds: Option<f64>,
    pub half_way_fraction: Option<f64>,
}

/// The relay draining a backlog until its slot confirmed the last commit.
#[derive(Debug, Clone, Serialize, Deserialize)]
// No deny_unknown_fields: serde does not support it with flatten.
pub struct RelayDrain {
    pub kind: RelayDrainKind,
    pub delivery: String,
    #[serde(flatten)]
    pub backlog: Backlog,
    pub load_before: String,
    #[serde(flatten)]
    pub reached: SlotReached,
    /// CPU seconds of the walsender that served it until the slot reached the end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walsender_cpu_seconds: Option<f64>,
}

/// A peer (`--peer debezium`) draining its own copy of a round's slot after the relays.
#[derive(Debug, Clone, Serialize, Deserialize)]
// No deny_unknown_fields: serde does not support it with flatten.
pub struct PeerDrain {
    pub kind: PeerDrainKind,
    /// `debezium`.
    pub peer: String,
    #[serde(flatten)]
    pub backlog: Backlog,
    pub load_before: String,
    /// From the process start until its slot was active (JVM, connector start): left out of
    /// `seconds`, which run from that moment.
    pub startup_seconds: f64,
    /// CPU seconds used by then (`cpu_seconds` includes them).
    pub startup_cpu_seconds: f64,
    /// Records in its topic when the slot reached the end (the sum of the end offsets).
    pub kafka_events: u64,
    #[serde(flatten)]
    pub reached: SlotReached,
}

/// A summary of one of the relay's Prometheus histograms (bucket upper bounds).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HistogramSummary {
    pub count: u64,
    pub mean_ms: Option<f64>,
    pub p50_at_most_ms: Option<f64>,
    pub p99_at_most_ms: Option<f64>,
    pub source: String,
}

/// Exactly-once's Kafka transactions over a measurement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaTransactions {
    pub committed: f64,
    pub aborted: f64,
    pub records: Option<f64>,
    pub records_per_transaction: Option<f64>,
    pub commit_seconds: Option<HistogramSummary>,
}

/// One scrape of the relay's `/metrics` after a drain.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayMetrics {
    pub kind: RelayMetricsKind,
    pub delivery: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shape: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round: Option<String>,
    pub kafka_transactions: Option<KafkaTransactions>,
    pub commit_to_ack: Option<HistogramSummary>,
    pub events_published: Option<f64>,
    /// Dead letters since the relay started (0 expected: a schema the payloads do not fit
    /// would make a drain look fast).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events_dead_lettered: Option<f64>,
}

/// Latency at one steady rate of 1-row transactions. Older result files lack the later
/// fields; a field present is never renamed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    pub kind: LatencyKind,
    #[serde(default)]
    pub delivery: Option<String>,
    /// `off` or `on` (`--tracing`).
    #[serde(default)]
    pub tracing: Option<String>,
    #[serde(default)]
    pub relay_cpu_seconds: Option<f64>,
    /// The relay's walsender over the same window: the limit a steady rate is held to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walsender_cpu_seconds: Option<f64>,
    /// `--producer-alone`: the relay's producer alone at the same rate over the same topics,
    /// its CPU seconds over a window as long (the Kafka side's share of the relay's CPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer_alone_cpu_seconds: Option<f64>,
    /// Topics the rate's rows spread over (`--latency-topics`), when more than one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topics: Option<u64>,
    pub rate_target: u64,
    pub rate_achieved: f64,
    pub seconds: u64,
    pub writers: u64,
    pub committed: u64,
    pub received: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub method: String,
    #[serde(default)]
    pub relay_commit_to_ack: Option<HistogramSummary>,
    #[serde(default)]
    pub relay_commit_to_read: Option<HistogramSummary>,
    #[serde(default)]
    pub relay_kafka_transactions: Option<KafkaTransactions>,
    /// The rows written before the measured window (`--warm-up-seconds`), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_up: Option<Box<WarmUp>>,
}

/// The warm-up before a latency window: its records' latencies, kept apart from the
/// window's (the first records of a new topic's partitions can wait for seconds).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WarmUp {
    pub received: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

/// The latency relay's CPU over a window with no traffic.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Idle {
    pub kind: IdleKind,
    #[serde(default)]
    pub delivery: Option<String>,
    pub seconds: u64,
    pub cpu_seconds: f64,
    pub cpu_percent: f64,
    pub vmrss_kb: u64,
}

/// One transaction of many rows, committed while the relay streams.
#[derive(Debug, Clone, Serialize, Deserialize)]
// No deny_unknown_fields: serde does not support it with flatten.
pub struct BigTxn {
    pub kind: BigTxnKind,
    pub delivery: String,
    pub events: f64,
    #[serde(flatten)]
    pub reached: SlotReached,
    /// Filled in by the report, from the relay's metrics record of the same run.
    #[serde(default)]
    pub relay_kafka_transactions: Option<KafkaTransactions>,
}

/// Re-sent events while the relay was SIGKILLed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resend {
    pub kind: ResendKind,
    pub delivery: String,
    pub kills: u64,
    pub rate_target: u64,
    pub rate_achieved: f64,
    pub seconds: u64,
    pub writers: u64,
    pub committed: u64,
    pub received: u64,
    pub distinct: u64,
    pub duplicates: u64,
    pub max_copies: u64,
    pub missing: u64,
    pub missing_sample: Vec<String>,
    pub foreign_records: u64,
    pub method: String,
}

/// A phase that failed (the run went on with the others).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Failure {
    pub kind: ErrorKind,
    pub phase: String,
    pub delivery: String,
    pub message: String,
}

/// p50, p99 and max of a series, ms.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// A bare transactional producer's commit times (no relay).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TxnProbe {
    pub kind: TxnProbeKind,
    pub transactions: u32,
    pub records: u32,
    pub pause_ms: u64,
    pub commit: Spread,
    pub begin_to_committed: Spread,
}
