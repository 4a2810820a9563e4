//! What each topic accepts: the largest record batch its brokers take (`max.message.bytes`).
//!
//! Kafka checks a topic's `max.message.bytes` against a whole record batch, and librdkafka
//! fails every record of a refused batch with MSG_SIZE_TOO_LARGE without splitting it
//! (`rd_kafka_handle_Produce_error`, librdkafka 2.12). A "too large" delivery report
//! therefore does not say that *this* record is too large: only a record that was alone in
//! its batch is. The rules that follow, all here:
//!
//! - The producer's `batch.size` stays below the smallest limit known
//!   ([`TopicLimits::batch_size`]), so that healthy records are never batched past a limit.
//!   librdkafka starts a new batch before a record that would push the batch past
//!   `batch.size` (`rd_kafka_msgset_writer_write_msgq`), so a record at least that large is
//!   always alone in its batch.
//! - A size refusal is judged by whether the record was alone in its batch
//!   ([`TopicLimits::judge`]): at least the producer's `batch.size` large, it was, and the
//!   refusal is the record's own — dead-lettered; otherwise its batch was too large, which is
//!   the producer's fault, not the record's: the limit is learned, the producer is made again
//!   with a smaller `batch.size`, and the records are sent again from the slot. The record's
//!   own size is never compared with the limit: the broker checks the *compressed* batch, so a
//!   record larger than the limit may well be taken.
//! - A record refused alone is remembered ([`TopicLimits::refused`]), so that a session that
//!   meets it again (`exactly_once` starts again after any refusal) refuses it before it is
//!   sent, and dead-letters it inside its Kafka transaction. So is a record the broker named
//!   invalid (INVALID_RECORD, [`TopicLimits::remember_invalid`]): the broker refuses its whole
//!   batch, and librdkafka fails the others with `_INVALID_DIFFERENT_RECORD`
//!   (`rd_kafka_msgbatch_handle_Produce_result_record_errors`), which sends them again from
//!   the slot — with the invalid one among them, every time, unless it is refused first.
//!
//! A topic's timestamp window is a limit too (`message.timestamp.before.max.ms` and
//! `after.max.ms` of a CreateTime topic; `message.timestamp.difference.max.ms` before Kafka
//! 3.6): the broker refuses a batch with a record outside it, naming each such record
//! INVALID_RECORD when there are several (`rd_kafka_msgbatch_handle_Produce_result_record_errors`).
//! A backlog older than the window is then refused record by record, though nothing is wrong
//! with any of them — and a failed delivery report carries no timestamp to tell them from
//! invalid ones (`rd_kafka_message_timestamp` returns none for a message with an error). So a
//! record outside its topic's known window ([`TopicLimits::outside_window`], with a margin for
//! the clocks) is not sent at all: its topic blocks (`record_timestamp`), and the session
//! restarts with back-off until the window is widened (the next session reads it again).
//!
//! Limits are read with DescribeConfigs when a topic is first met by a producer
//! (`partition_counts`), and learned from refusals when that is not allowed; they outlive
//! sessions (the publisher of the next session starts with them), like [`super::blocked`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use rdkafka::types::RDKafkaErrorCode;

use crate::mapping::Record;

/// librdkafka's default `batch.size`.
pub const DEFAULT_BATCH_SIZE: usize = 1_000_000;
/// librdkafka's default `message.max.bytes`: the largest record the producer takes.
pub const DEFAULT_MESSAGE_MAX_BYTES: usize = 1_000_000;

/// The record limit of each topic written to, as read from the brokers or learned from their
/// refusals.
#[derive(Debug, Default)]
pub struct TopicLimits {
    limits: Mutex<HashMap<String, usize>>,
    /// The limits as the brokers reported them (DescribeConfigs), not lowered by refused
    /// batches: what one record may hold ([`TopicLimits::record_limit`]).
    reported: Mutex<HashMap<String, usize>>,
    /// Records each topic refused for a fault of their own, by content, with the refusal.
    refused: Mutex<HashMap<String, HashMap<u64, RDKafkaErrorCode>>>,
    /// The timestamp window of CreateTime topics that have one, as read.
    windows: Mutex<HashMap<String, TimestampWindow>>,
    /// Some topic has a window: the produce path looks at the map (and the clock) only then.
    any_window: AtomicBool,
}

/// How far a record's timestamp may lie before and after the broker's clock (milliseconds;
/// `None`: no limit that side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampWindow {
    pub before_ms: Option<i64>,
    pub after_ms: Option<i64>,
}

impl TimestampWindow {
    /// From the topic's configuration entries (name, value): `None` for LogAppendTime topics
    /// and for windows without a limit (Kafka's default, `Long.MAX_VALUE`).
    pub fn from_config<'a>(value: impl Fn(&str) -> Option<&'a str>) -> Option<TimestampWindow> {
        if value("message.timestamp.type") == Some("LogAppendTime") {
            return None;
        }
        let limit = |name: &str| {
            value(name)
                .and_then(|v| v.parse::<i64>().ok())
                .filter(|ms| *ms < i64::MAX)
        };
        let legacy = limit("message.timestamp.difference.max.ms");
        let window = TimestampWindow {
            before_ms: limit("message.timestamp.before.max.ms").or(legacy),
            after_ms: limit("message.timestamp.after.max.ms").or(legacy),
        };
        (window.before_ms.is_some() || window.after_ms.is_some()).then_some(window)
    }

    /// Whether a record stamped `timestamp_ms` lies outside the window at `now_ms`, or so
    /// near its edge that the broker's clock may already see it outside: a margin of a tenth
    /// of the limit, at most 10 s (a record near the `before` edge only grows older).
    pub fn excludes(&self, timestamp_ms: i64, now_ms: i64) -> bool {
        let margin = |limit: i64| (limit / 10).min(10_000);
        self.before_ms
            .is_some_and(|b| timestamp_ms < now_ms.saturating_sub(b - margin(b)))
            || self
                .after_ms
                .is_some_and(|a| timestamp_ms > now_ms.saturating_add(a - margin(a)))
    }
}

/// What a size refusal means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeRefusal {
    /// The record alone is larger than its topic accepts (limit: what is known of it now):
    /// its own fault.
    Record { limit: usize },
    /// The record was refused with a batch larger than its topic accepts (limit: what is
    /// known of it now): nothing is wrong with the record.
    Batch { limit: usize },
}

impl TopicLimits {
    fn limits(&self) -> MutexGuard<'_, HashMap<String, usize>> {
        self.limits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The limit the brokers reported for `topic` (DescribeConfigs): it replaces what was
    /// known.
    pub fn read(&self, topic: &str, limit: usize) {
        self.limits().insert(topic.to_string(), limit);
        self.reported
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(topic.to_string(), limit);
    }

    /// The most one record of `topic` may hold, as the brokers reported it: a limit learned
    /// from refused batches bounds batches (halved until they fit), not one record alone.
    pub fn record_limit(&self, topic: &str) -> Option<usize> {
        let reported = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
        reported.get(topic).copied()
    }

    /// The topic's limit, if known.
    pub fn get(&self, topic: &str) -> Option<usize> {
        self.limits().get(topic).copied()
    }

    /// The `batch.size` a producer made now must use, given the one configured: below the
    /// smallest known limit by a sixteenth (room for the batch's framing and for records
    /// that compress badly), and never above the configured one.
    pub fn batch_size(&self, configured: usize) -> usize {
        let smallest = self.limits().values().copied().min();
        match smallest {
            Some(limit) => configured.min((limit - limit / 16).max(1)),
            None => configured,
        }
    }

    /// Judges a size refusal of a record of `topic` holding `content`, sent by a producer
    /// whose batches hold at most `batch_size`. Alone in its batch, the record is remembered
    /// as refused; otherwise what is known of the topic's limit goes below the batch size the
    /// producer used, so that the next producer's batches fit.
    pub fn judge(&self, topic: &str, content: RecordContent<'_>, batch_size: usize) -> SizeRefusal {
        let record_bytes = content.bytes();
        let mut limits = self.limits();
        let known = limits.get(topic).copied();
        // librdkafka starts a new batch before a record that would take it past
        // `batch_size`: one at least that large was alone.
        if record_bytes >= batch_size {
            self.remember(topic, content, RDKafkaErrorCode::MessageSizeTooLarge);
            return SizeRefusal::Record {
                limit: known.unwrap_or(batch_size),
            };
        }
        // The batch (at most `batch_size` large) was too large; the limit is below it. When
        // the known limit says the batch should have fitted (a limit lowered since it was
        // read), halve: repeated refusals then converge.
        let limit = match known {
            Some(known) if known < batch_size => known,
            _ => (batch_size / 2).max(1),
        };
        limits.insert(topic.to_string(), limit);
        SizeRefusal::Batch { limit }
    }

    /// The broker named this record invalid (INVALID_RECORD in a delivery report: with
    /// KIP-467's record errors only the records at fault get it).
    pub fn remember_invalid(&self, topic: &str, content: RecordContent<'_>) {
        self.remember(topic, content, RDKafkaErrorCode::InvalidRecord);
    }

    fn remember(&self, topic: &str, content: RecordContent<'_>, refusal: RDKafkaErrorCode) {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(topic.to_string())
            .or_default()
            .insert(content.fingerprint(), refusal);
    }

    /// The topic's timestamp window as read (DescribeConfigs); `None` removes it.
    pub fn read_window(&self, topic: &str, window: Option<TimestampWindow>) {
        let mut windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        match window {
            Some(window) => windows.insert(topic.to_string(), window),
            None => windows.remove(topic),
        };
        self.any_window
            .store(!windows.is_empty(), Ordering::Release);
    }

    /// Whether a record of `topic` stamped `timestamp_ms` lies outside the topic's known
    /// timestamp window at `now_ms()` (read only when some topic has a window: this runs for
    /// every record sent).
    pub fn outside_window(
        &self,
        topic: &str,
        timestamp_ms: Option<i64>,
        now_ms: impl FnOnce() -> i64,
    ) -> bool {
        if !self.any_window.load(Ordering::Acquire) {
            return false;
        }
        let windows = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        match (windows.get(topic), timestamp_ms) {
            (Some(window), Some(ts)) => window.excludes(ts, now_ms()),
            _ => false,
        }
    }

    /// How the topic refused a record with this content for its own fault before, if it did:
    /// it is refused so before it is sent again. (Only a topic that refused one pays for the
    /// content's fingerprint.)
    pub fn refused(&self, topic: &str, content: RecordContent<'_>) -> Option<RDKafkaErrorCode> {
        let refused = self.refused.lock().unwrap_or_else(PoisonError::into_inner);
        if refused.is_empty() {
            return None;
        }
        refused.get(topic)?.get(&content.fingerprint()).copied()
    }
}

/// What a record holds, its key and value, by which a refusal of its own is remembered. The
/// broker judged those bytes (their size, their validity); a record with other bytes is
/// another record, whatever its key — the key is the event id only by default, and
/// `key_column = "aggregateid"` gives every event of an aggregate the same one. Two events
/// with the same key and value are refused alike, so telling them apart is not needed.
#[derive(Debug, Clone, Copy)]
pub struct RecordContent<'a> {
    key: &'a [u8],
    payload: Option<&'a [u8]>,
}

impl<'a> RecordContent<'a> {
    pub fn of(key: Option<&'a [u8]>, payload: Option<&'a [u8]>) -> RecordContent<'a> {
        RecordContent {
            key: key.unwrap_or_default(),
            payload,
        }
    }

    pub fn of_record(record: &'a Record) -> RecordContent<'a> {
        RecordContent::of(Some(&record.key), record.payload.as_deref())
    }

    /// Key + payload bytes (as `Record::size` counts them).
    pub fn bytes(&self) -> usize {
        self.key.len() + self.payload.map_or(0, <[u8]>::len)
    }

    fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.key.hash(&mut hasher);
        self.payload.hash(&mut hasher);
        hasher.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_time_topic_with_a_window_excludes_what_lies_outside_it_only() {
        let config = |entries: &'static [(&'static str, &'static str)]| {
            move |name: &str| entries.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
        };
        // Kafka's "no limit": Long.MAX_VALUE.
        const UNLIMITED: &str = "9223372036854775807";
        assert_eq!(
            TimestampWindow::from_config(config(&[
                ("message.timestamp.type", "CreateTime"),
                ("message.timestamp.before.max.ms", "60000"),
            ])),
            Some(TimestampWindow {
                before_ms: Some(60_000),
                after_ms: None
            })
        );
        assert_eq!(
            TimestampWindow::from_config(config(&[
                ("message.timestamp.type", "CreateTime"),
                ("message.timestamp.before.max.ms", UNLIMITED),
                ("message.timestamp.after.max.ms", UNLIMITED),
            ])),
            None
        );
        assert_eq!(
            TimestampWindow::from_config(config(&[
                ("message.timestamp.type", "LogAppendTime"),
                ("message.timestamp.before.max.ms", "60000"),
            ])),
            None
        );
        let legacy = TimestampWindow::from_config(config(&[(
            "message.timestamp.difference.max.ms",
            "1000",
        )]))
        .unwrap();
        // A 1 s window, less its 100 ms margin.
        assert!(legacy.excludes(9_099, 10_000) && legacy.excludes(10_901, 10_000));
        assert!(!legacy.excludes(9_100, 10_000) && !legacy.excludes(10_900, 10_000));

        let limits = TopicLimits::default();
        limits.read_window("t", Some(legacy));
        assert!(limits.outside_window("t", Some(1), || 10_000));
        assert!(
            !limits.outside_window("t", None, || 10_000),
            "no timestamp: the broker's own"
        );
        assert!(!limits.outside_window("other", Some(1), || 10_000));
        limits.read_window("t", None);
        assert!(!limits.outside_window("t", Some(1), || 10_000));
    }

    const KIB: usize = 1024;

    /// A record of `key` and a payload making it `bytes` large in all.
    struct Sized {
        key: &'static [u8],
        payload: Vec<u8>,
    }

    impl Sized {
        fn new(key: &'static [u8], bytes: usize) -> Sized {
            Sized {
                key,
                payload: vec![b'x'; bytes.saturating_sub(key.len())],
            }
        }

        fn content(&self) -> RecordContent<'_> {
            RecordContent::of(Some(self.key), Some(&self.payload))
        }
    }

    #[test]
    fn the_batch_size_stays_below_the_smallest_limit_and_never_above_the_configured_one() {
        let limits = TopicLimits::default();
        assert_eq!(limits.batch_size(DEFAULT_BATCH_SIZE), DEFAULT_BATCH_SIZE);
        limits.read("big", 8 * 1024 * KIB);
        assert_eq!(limits.batch_size(DEFAULT_BATCH_SIZE), DEFAULT_BATCH_SIZE);
        limits.read("small", 64 * KIB);
        assert_eq!(limits.batch_size(DEFAULT_BATCH_SIZE), 60 * KIB);
        assert_eq!(limits.batch_size(16 * KIB), 16 * KIB);
    }

    #[test]
    fn a_record_alone_in_its_batch_is_its_own_fault_and_its_neighbours_are_not() {
        let limits = TopicLimits::default();
        // Batched healthy records of 400 bytes, refused with a 1 MB batch: the producer's.
        assert_eq!(
            limits.judge("t", Sized::new(b"e1", 400).content(), DEFAULT_BATCH_SIZE),
            SizeRefusal::Batch {
                limit: DEFAULT_BATCH_SIZE / 2
            }
        );
        assert_eq!(limits.refused("t", Sized::new(b"e1", 400).content()), None);
        // Read from the brokers: 64 KiB. A 100 KB record, alone in a 60 KiB batch, is refused
        // for itself, and remembered.
        limits.read("t", 64 * KIB);
        assert_eq!(
            limits.judge("t", Sized::new(b"big", 100_000).content(), 60 * KIB),
            SizeRefusal::Record { limit: 64 * KIB }
        );
        assert_eq!(
            limits.refused("t", Sized::new(b"big", 100_000).content()),
            Some(RDKafkaErrorCode::MessageSizeTooLarge)
        );
        assert_eq!(limits.refused("t", Sized::new(b"e1", 400).content()), None);
        assert_eq!(
            limits.refused("other", Sized::new(b"big", 100_000).content()),
            None
        );
        // A healthy one refused with a batch that should have fitted: the limit was lowered
        // meanwhile; what is known of it halves.
        assert_eq!(
            limits.judge("t", Sized::new(b"e2", 400).content(), 32 * KIB),
            SizeRefusal::Batch { limit: 16 * KIB }
        );
    }

    #[test]
    fn without_the_topics_configuration_refusals_converge_on_a_batch_size_that_fits() {
        // The relay may not read the topic's configuration: its limit (64 KiB) is learned
        // from refusals alone. Healthy 400-byte records must end up in batches that fit, and
        // a 100 KB record must end up judged alone.
        let actual = 64 * KIB;
        let limits = TopicLimits::default();
        let mut restarts = 0;
        loop {
            let batch_size = limits.batch_size(DEFAULT_BATCH_SIZE);
            if batch_size <= actual {
                break;
            }
            assert!(matches!(
                limits.judge("t", Sized::new(b"e", 400).content(), batch_size),
                SizeRefusal::Batch { .. }
            ));
            restarts += 1;
            assert!(restarts < 10, "no convergence: batch.size {batch_size}");
        }
        let batch_size = limits.batch_size(DEFAULT_BATCH_SIZE);
        assert!(matches!(
            limits.judge("t", Sized::new(b"big", 100_000).content(), batch_size),
            SizeRefusal::Record { .. }
        ));
    }

    /// A dead letter is cut to what one record may hold: the limit the brokers reported, not
    /// one halved by refused batches (which bounds batches), and none when it was not read.
    #[test]
    fn a_records_limit_is_the_reported_one_not_a_learned_batch_bound() {
        let limits = TopicLimits::default();
        let judged = limits.judge("dlq", Sized::new(b"d", 400).content(), DEFAULT_BATCH_SIZE);
        assert!(matches!(judged, SizeRefusal::Batch { .. }));
        assert_eq!(limits.record_limit("dlq"), None, "learned, not reported");
        limits.read("dlq", 1_000_000);
        assert!(matches!(
            limits.judge("dlq", Sized::new(b"d", 400).content(), 600_000),
            SizeRefusal::Batch { limit: 300_000 }
        ));
        assert_eq!(limits.get("dlq"), Some(300_000));
        assert_eq!(limits.record_limit("dlq"), Some(1_000_000));
    }

    /// The broker named one record of a batch invalid: that one is refused before it is sent
    /// again (by its own error), its neighbours are not.
    #[test]
    fn a_record_named_invalid_is_refused_before_it_is_sent_again_and_only_it() {
        let limits = TopicLimits::default();
        limits.remember_invalid("t", Sized::new(b"bad", 400).content());
        assert_eq!(
            limits.refused("t", Sized::new(b"bad", 400).content()),
            Some(RDKafkaErrorCode::InvalidRecord)
        );
        assert_eq!(
            limits.refused("t", Sized::new(b"healthy", 400).content()),
            None
        );
    }

    /// `key_column = "aggregateid"`: every event of an aggregate has one key. A record of it
    /// refused for its own size is remembered by what it holds, so the aggregate's later,
    /// healthy events are sent, not refused at `send` (50 of 100 healthy ones were).
    #[test]
    fn a_refusal_is_remembered_by_the_records_content_not_by_its_key() {
        let limits = TopicLimits::default();
        limits.read("t", 20_000);
        let big = Sized::new(b"agg-1", 30_000);
        assert_eq!(
            limits.judge("t", big.content(), 18_000),
            SizeRefusal::Record { limit: 20_000 }
        );
        assert!(limits.refused("t", big.content()).is_some());
        for healthy in [500, 1_000, 30_001] {
            let later = Sized::new(b"agg-1", healthy);
            assert_eq!(
                limits.refused("t", later.content()),
                None,
                "{healthy} bytes"
            );
        }
        // Its neighbour named invalid: that one only.
        let bad = Sized::new(b"agg-2", 10);
        limits.remember_invalid("t", bad.content());
        assert!(limits.refused("t", bad.content()).is_some());
        assert_eq!(
            limits.refused("t", Sized::new(b"agg-2", 11).content()),
            None
        );
    }
}
