//! `dead-letters list` and `dead-letters redrive`.
//!
//! `list` reads every partition of `dead_letter.topic` from its beginning to the end it had
//! when the command started (read_committed: a dead letter of an exactly-once transaction that
//! was aborted is not one), commits nothing, and prints each record's reason, event id,
//! original topic or table and error; then a count per reason.
//!
//! `redrive` (`redrive.rs`) reads from its consumer group's position, decides per dead letter
//! (`plan.rs`: map the row image again with `remap.rs`, or re-send the refused record),
//! sends, and commits the group only over what Kafka acknowledged (`positions.rs`);
//! `report.rs` says what it did.

mod from_row;
mod plan;
mod positions;
mod redrive;
mod remap;
mod report;

pub use redrive::{redrive, RedriveOptions, DEFAULT_MAX_REDRIVES, REDRIVE_GROUP};
pub use report::RedriveReport;

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde::Serialize;

use super::{OpsError, Report};
use crate::config::Config;
use crate::sink::dead_letter::{HEADER_ERROR, HEADER_ORIGINAL_TOPIC, HEADER_REASON, HEADER_TABLE};

/// The consumer group the command's reads use (they commit nothing; librdkafka's assign
/// wants a group).
pub const DEAD_LETTERS_GROUP: &str = "outbox-relay-dead-letters";
/// Per metadata and watermark request.
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the whole read may take.
const READ_TIMEOUT: Duration = Duration::from_secs(120);

/// Which dead letters to show; every given filter must match.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub reason: Option<String>,
    pub event_id: Option<String>,
    /// The original topic (records Kafka refused) or the table (rows that never became one).
    pub topic: Option<String>,
    /// Record timestamps at or after / before these (RFC 3339).
    pub since: Option<jiff::Timestamp>,
    pub until: Option<jiff::Timestamp>,
    pub limit: Option<usize>,
}

impl Filter {
    fn matches(&self, letter: &DeadLetter) -> bool {
        let is = |wanted: &Option<String>, actual: Option<&str>| {
            wanted.as_deref().is_none_or(|w| actual == Some(w))
        };
        let time = letter.timestamp_ms.map(jiff::Timestamp::from_millisecond);
        let after = |bound: &Option<jiff::Timestamp>, later: bool| {
            bound.is_none_or(|b| match time {
                Some(Ok(t)) if later => t >= b,
                Some(Ok(t)) => t < b,
                _ => false,
            })
        };
        is(&self.reason, letter.reason.as_deref())
            && is(&self.event_id, Some(&letter.event_id))
            && is(&self.topic, letter.original.as_deref())
            && after(&self.since, true)
            && after(&self.until, false)
    }
}

/// One record of the dead-letter topic.
#[derive(Debug, Serialize)]
pub struct DeadLetter {
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
    pub reason: Option<String>,
    /// The event id the dead letter carries (its `id` header, not its key: see
    /// `Letter::event_id`).
    pub event_id: String,
    /// The original topic, or the outbox table for a row that never became a record.
    pub original: Option<String>,
    pub error: Option<String>,
    pub payload_bytes: usize,
}

/// The outcome of `dead-letters list`.
#[derive(Debug, Serialize)]
pub struct ListReport {
    pub topic: String,
    /// Records read (all partitions, up to the end at the start).
    pub scanned: u64,
    pub letters: Vec<DeadLetter>,
    /// Matching records per reason (all of them, also past `--limit`).
    pub by_reason: BTreeMap<String, u64>,
}

impl Report for ListReport {}

impl fmt::Display for ListReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in &self.letters {
            writeln!(
                f,
                "{}/{}  {}  {}  {}  {}",
                l.partition,
                l.offset,
                l.reason.as_deref().unwrap_or("?"),
                l.event_id,
                l.original.as_deref().unwrap_or("-"),
                l.error.as_deref().unwrap_or("")
            )?;
        }
        let matched: u64 = self.by_reason.values().sum();
        let reasons: Vec<String> = self
            .by_reason
            .iter()
            .map(|(reason, n)| format!("{reason} {n}"))
            .collect();
        writeln!(
            f,
            "{matched} of {} dead letters in {} match ({}); {} shown",
            self.scanned,
            self.topic,
            if reasons.is_empty() {
                "none".to_string()
            } else {
                reasons.join(", ")
            },
            self.letters.len()
        )
    }
}

/// `dead-letters list`.
pub async fn list(config: &Config, filter: Filter) -> Result<ListReport, OpsError> {
    let topic = config.dead_letter.topic.clone();
    let mut client = crate::sink::publisher::client_config(&config.kafka);
    client
        .set("group.id", DEAD_LETTERS_GROUP)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true");
    let client = crate::sink::publisher::consumer_config(client);
    let login = crate::sink::publisher::KafkaLogin::from_config(&config.kafka);
    let read = tokio::task::spawn_blocking(move || read_all(client, &login, &topic, &filter)).await;
    let failed = |problem: String| OpsError::DeadLetters {
        topic: config.dead_letter.topic.clone(),
        problem,
    };
    read.map_err(|e| failed(e.to_string()))?.map_err(failed)
}

fn read_all(
    client: rdkafka::ClientConfig,
    login: &crate::sink::publisher::KafkaLogin,
    topic: &str,
    filter: &Filter,
) -> Result<ListReport, String> {
    // AWS_MSK_IAM: the consumer logs in with the relay's tokens.
    let context = crate::sink::publisher::LoginContext::new(login);
    let consumer = crate::sink::publisher::login::consumer(&client, context)
        .map_err(|e| format!("cannot create a consumer: {e}"))?;
    let ends = partition_ends(&consumer, topic)?;
    let mut report = ListReport {
        topic: topic.to_string(),
        scanned: 0,
        letters: Vec::new(),
        by_reason: BTreeMap::new(),
    };
    let mut assignment = TopicPartitionList::new();
    for (&partition, &(low, high)) in &ends {
        if high > low {
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .map_err(|e| e.to_string())?;
        }
    }
    if assignment.count() == 0 {
        return Ok(report);
    }
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    let mut open: Vec<i32> = ends
        .iter()
        .filter(|(_, (low, high))| high > low)
        .map(|(p, _)| *p)
        .collect();
    let started = Instant::now();
    while !open.is_empty() {
        if started.elapsed() > READ_TIMEOUT {
            return Err(format!(
                "not read to its end within {READ_TIMEOUT:?} (partitions {open:?} left)"
            ));
        }
        let message = match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => m,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                open.retain(|&o| o != p);
                continue;
            }
            Some(Err(e)) => return Err(format!("cannot read it: {e}")),
            None => continue,
        };
        let (partition, offset) = (message.partition(), message.offset());
        if offset + 1 >= ends[&partition].1 {
            open.retain(|&o| o != partition);
        }
        if offset >= ends[&partition].1 {
            continue;
        }
        report.scanned += 1;
        let letter = dead_letter(&plan::Letter::from_message(&message));
        if filter.matches(&letter) {
            let reason = letter.reason.clone().unwrap_or_else(|| "?".into());
            *report.by_reason.entry(reason).or_default() += 1;
            if filter.limit.is_none_or(|n| report.letters.len() < n) {
                report.letters.push(letter);
            }
        }
    }
    Ok(report)
}

/// Every partition's (low, high) watermarks when the read starts.
pub(super) fn partition_ends(
    consumer: &BaseConsumer<crate::sink::publisher::LoginContext>,
    topic: &str,
) -> Result<BTreeMap<i32, (i64, i64)>, String> {
    let metadata = consumer
        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
        .map_err(|e| format!("cannot read its metadata: {e}"))?;
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return Ok(BTreeMap::new());
    };
    if let Some(error) = t.error() {
        let error = rdkafka::types::RDKafkaErrorCode::from(error);
        // No dead letter was ever written: the topic does not exist yet.
        if error == rdkafka::types::RDKafkaErrorCode::UnknownTopicOrPartition {
            return Ok(BTreeMap::new());
        }
        return Err(format!("cannot read its metadata: {error}"));
    }
    let mut ends = BTreeMap::new();
    for p in t.partitions() {
        let marks = consumer
            .fetch_watermarks(topic, p.id(), REQUEST_TIMEOUT)
            .map_err(|e| format!("cannot read the offsets of partition {}: {e}", p.id()))?;
        ends.insert(p.id(), marks);
    }
    Ok(ends)
}

fn dead_letter(letter: &plan::Letter) -> DeadLetter {
    let header = |name: &str| letter.header(name);
    DeadLetter {
        partition: letter.partition,
        offset: letter.offset,
        timestamp_ms: letter.timestamp_ms,
        reason: header(HEADER_REASON),
        event_id: letter.event_id(),
        original: header(HEADER_ORIGINAL_TOPIC).or_else(|| header(HEADER_TABLE)),
        error: header(HEADER_ERROR),
        payload_bytes: letter.payload.as_ref().map_or(0, |p| p.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(reason: &str, at_ms: i64) -> DeadLetter {
        DeadLetter {
            partition: 0,
            offset: 0,
            timestamp_ms: Some(at_ms),
            reason: Some(reason.into()),
            event_id: "e-1".into(),
            original: Some("orders".into()),
            error: None,
            payload_bytes: 2,
        }
    }

    #[test]
    fn every_given_filter_must_match() {
        let l = letter("too_large", 1_000_000);
        assert!(Filter::default().matches(&l));
        let mut f = Filter {
            reason: Some("too_large".into()),
            topic: Some("orders".into()),
            ..Filter::default()
        };
        assert!(f.matches(&l));
        f.event_id = Some("e-2".into());
        assert!(!f.matches(&l));
        let at = jiff::Timestamp::from_millisecond(1_000_000).unwrap();
        let since = Filter {
            since: Some(at),
            ..Filter::default()
        };
        assert!(since.matches(&l), "since is inclusive");
        let until = Filter {
            until: Some(at),
            ..Filter::default()
        };
        assert!(!until.matches(&l), "until is exclusive");
    }

    /// A dead letter as the topic holds it, from the record the relay sent there.
    fn as_read(dead: &crate::mapping::Record) -> DeadLetter {
        dead_letter(&plan::Letter {
            partition: 0,
            offset: 0,
            timestamp_ms: dead.timestamp_ms,
            key: dead.key.clone(),
            payload: dead.payload.clone(),
            headers: dead.headers.clone(),
        })
    }

    /// `key_column = "aggregateid"`: the dead letter is keyed by the aggregate id, and
    /// `--event-id` (list and redrive filter alike) finds it by the event id only.
    #[test]
    fn event_id_filter_matches_the_event_id_not_the_aggregate_key() {
        use crate::sink::dead_letter::{fit, from_record, Reason};
        use bytes::Bytes;
        use std::sync::Arc;
        let h = |k: &str, v: &str| (Arc::from(k), Bytes::from(v.to_string()));
        let plain = crate::mapping::Record {
            topic: "orders".into(),
            key: Bytes::from_static(b"agg-1"),
            payload: Some(Bytes::from_static(b"{}")),
            headers: vec![
                h("id", "e-7"),
                h("type", "OrderPaid"),
                h("aggregatetype", "order"),
                h("aggregateid", "agg-1"),
            ],
            ..Default::default()
        };
        // Too large to keep its value: a structured CloudEvent's id lives in it.
        let structured = crate::mapping::Record {
            headers: vec![h(
                "content-type",
                "application/cloudevents+json; charset=UTF-8",
            )],
            payload: Some(Bytes::from(format!(
                r#"{{"specversion":"1.0","id":"e-7","data":"{}"}}"#,
                "x".repeat(64 * 1024)
            ))),
            ..plain.clone()
        };
        for record in [plain, structured] {
            let mut dead = from_record("dlq", &record, Reason::TooLarge, "too large");
            fit(&mut dead, 16 * 1024);
            let letter = as_read(&dead);
            assert_eq!(letter.event_id, "e-7");
            let by = |id: &str| Filter {
                event_id: Some(id.into()),
                ..Filter::default()
            };
            assert!(by("e-7").matches(&letter));
            assert!(!by("agg-1").matches(&letter));
        }
    }
}
