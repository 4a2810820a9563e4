//! What a redrive does with one dead letter. Pure: the dead letter and the current mapping
//! in, an [`Action`] out.
//!
//! | reason | with | redriven as |
//! |---|---|---|
//! | `mapping`, `invalid_topic`, `schema` | a row image | mapped again with the current configuration |
//! | `too_large`, `rejected` (and the above without a row image, when Kafka refused the record) | the original record | re-sent to the original topic and partition as it was |
//! | any | neither, its outbox row named (`outbox-relay.dlq.outbox-row`) | read from the outbox row by id and mapped with the current configuration; the row is then no longer kept from the sweeper |
//!
//! Every redriven record carries `outbox-relay.redrive-count`, one more than its dead
//! letter's; at `--max-redrives` the dead letter is left. One the current configuration still
//! cannot map is dead-lettered again, with the count raised and the new error.
//!
//! A record Kafka refuses on the redrive is judged as the relay judges it ([`refused`]): too
//! large with its batch is no fault of its own and goes again; only one refused alone (or for
//! an invalid topic or record) is dead-lettered again.

use std::sync::Arc;

use bytes::Bytes;
use rdkafka::message::{Headers, Message};
use serde::Deserialize;

use super::remap::{check_complete, Remap, RowImage};
use crate::mapping::{event_id_of, OutboxMapping, Record};
use crate::sink::dead_letter::{
    Reason, HEADER_ERROR, HEADER_EVENT_ID, HEADER_OMITTED, HEADER_ORIGINAL_PARTITION,
    HEADER_ORIGINAL_TOPIC, HEADER_OUTBOX_ROW, HEADER_PARTITION_KEY, HEADER_PREFIX, HEADER_REASON,
    HEADER_REDRIVES, HEADER_ROW, HEADER_TABLE,
};
use crate::sink::fault::{KafkaFault, Stamp, Verdict};
use crate::sink::limits::SizeRefusal;

/// One record of the dead-letter topic, owned.
#[derive(Debug, Clone)]
pub(super) struct Letter {
    pub partition: i32,
    pub offset: i64,
    pub timestamp_ms: Option<i64>,
    pub key: Bytes,
    pub payload: Option<Bytes>,
    pub headers: Vec<(Arc<str>, Bytes)>,
}

impl Letter {
    pub(super) fn from_message<M: Message>(m: &M) -> Letter {
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| {
                        let value = Bytes::copy_from_slice(h.value.unwrap_or_default());
                        (Arc::from(h.key), value)
                    })
                    .collect()
            })
            .unwrap_or_default();
        Letter {
            partition: m.partition(),
            offset: m.offset(),
            timestamp_ms: m.timestamp().to_millis(),
            key: Bytes::copy_from_slice(m.key().unwrap_or_default()),
            payload: m.payload().map(Bytes::copy_from_slice),
            headers,
        }
    }

    /// The last value of header `name`, as text.
    pub(super) fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .rev()
            .find(|(k, _)| &**k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    fn all(&self, name: &str) -> Vec<String> {
        self.headers
            .iter()
            .filter(|(k, _)| &**k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    /// The outbox row it names (a dead letter that could keep neither payload nor row
    /// image): `(schema.table, id)`.
    pub(super) fn outbox_row(&self) -> Option<(String, String)> {
        #[derive(Deserialize)]
        struct Named {
            table: String,
            id: String,
        }
        let named = self
            .headers
            .iter()
            .rev()
            .find(|(k, _)| &**k == HEADER_OUTBOX_ROW)?;
        let named: Named = serde_json::from_slice(&named.1).ok()?;
        Some((named.table, named.id))
    }

    /// Times redriven so far.
    pub(super) fn redrives(&self) -> u32 {
        self.header(HEADER_REDRIVES)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The event id, where the relay wrote it: the header it keeps when the value holding the
    /// id was left out, else [`event_id_of`] (the `id` or `ce_id` header, a structured
    /// CloudEvent's `id`). The key only when none is there: it is the event id only while
    /// `key_column` is unset.
    pub(super) fn event_id(&self) -> String {
        let headers = self.headers.iter().map(|(k, v)| (&**k, &v[..]));
        self.header(HEADER_EVENT_ID)
            .or_else(|| event_id_of(headers, self.payload.as_deref()))
            .unwrap_or_else(|| String::from_utf8_lossy(&self.key).into_owned())
    }
}

/// How a record was redriven.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum How {
    Remapped,
    Resent,
    /// Read from its outbox row and mapped.
    FromRow,
}

#[derive(Debug)]
pub(super) enum Action {
    /// The record, and the serialization section of its table when it was mapped again
    /// (`OutboxEvent::profile`; `None` for a record re-sent as it was).
    Send(Record, How, Option<usize>),
    /// Still unmappable: a new dead letter (count raised) stands in for it.
    DeadLetterAgain(Record),
    /// To be read from its outbox row `(schema.table, id)` and mapped (`Run::read_named_row`),
    /// redriven for the time given.
    FromRow((String, String), u32),
    /// Not redriven; why.
    Leave(String),
}

/// What becomes of a record Kafka did not take on the redrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Refused with a batch larger than its topic takes: nothing is wrong with the record. It
    /// goes again, through a producer made again whose batches fit what is now known of the
    /// topic's limit; its dead letter stays uncommitted until it is acknowledged.
    SendAgain,
    /// Refused for a fault of its own (too large alone in its batch, an invalid topic or
    /// record): a new dead letter stands in for it, with this reason.
    DeadLetterAgain(Reason),
    /// Anything else, and a dead letter (`dead_letter`) refused for a fault of its own: the
    /// redrive stops, committing nothing past it (run it again).
    Stop,
}

/// Judges a refusal (`fault`, `sink::fault`'s one classification) of a record as the relay
/// does: a size refusal by `size`, the publisher's judgment of it
/// (`Publisher::judge_size_refusal`, asked only for size refusals, which learns the topic's
/// limit from a refused batch). The record's timestamp is not known here.
pub(super) fn refused(
    fault: KafkaFault,
    dead_letter: bool,
    size: impl FnOnce() -> SizeRefusal,
) -> Refused {
    let own = match fault.verdict(Stamp::CommitOrUnknown) {
        Verdict::JudgeSize => match size() {
            SizeRefusal::Batch { .. } => return Refused::SendAgain,
            SizeRefusal::Record { .. } => Some(Reason::TooLarge),
        },
        Verdict::OwnFault(reason) => Some(reason),
        Verdict::Retry | Verdict::Hold(_) => None,
    };
    match (own, dead_letter) {
        (Some(reason), false) => Refused::DeadLetterAgain(reason),
        (Some(_), true) | (None, _) => Refused::Stop,
    }
}

/// What to do with `letter`.
pub(super) fn plan(letter: &Letter, mapping: &OutboxMapping, dlq: &str, max: u32) -> Action {
    let count = letter.redrives();
    if count >= max {
        return Action::Leave(format!(
            "redriven {count} times already (--max-redrives {max})"
        ));
    }
    // It kept neither payload nor row image: its outbox row was kept for it.
    if let Some(row) = letter.outbox_row() {
        return Action::FromRow(row, count + 1);
    }
    let reason = letter.header(HEADER_REASON).unwrap_or_default();
    let original = letter.header(HEADER_ORIGINAL_TOPIC);
    let remappable = matches!(reason.as_str(), "mapping" | "invalid_topic" | "schema");
    if remappable {
        if let Some((image, in_value)) = row_image(letter) {
            return remap(letter, &image, in_value, mapping, dlq, count);
        }
    }
    match (reason.as_str(), original) {
        ("too_large" | "rejected" | "invalid_topic" | "schema", Some(topic)) => {
            resend(letter, &topic, count)
        }
        ("", _) => Action::Leave("it has no reason header: not a dead letter of the relay".into()),
        (reason, _) => Action::Leave(format!("reason `{reason}` without a row image to map")),
    }
}

/// The row image: the value of a row dead letter (`true`), or the `row` header.
fn row_image(letter: &Letter) -> Option<(Bytes, bool)> {
    let is_row_letter =
        letter.header(HEADER_ORIGINAL_TOPIC).is_none() && letter.header(HEADER_TABLE).is_some();
    if is_row_letter {
        return letter.payload.clone().map(|p| (p, true));
    }
    letter
        .headers
        .iter()
        .rev()
        .find(|(k, _)| &**k == HEADER_ROW)
        .map(|(_, v)| (v.clone(), false))
}

fn remap(
    letter: &Letter,
    image: &[u8],
    in_value: bool,
    mapping: &OutboxMapping,
    dlq: &str,
    count: u32,
) -> Action {
    let mapped = check_complete(in_value, &letter.all(HEADER_OMITTED))
        .and_then(|()| RowImage::parse(image))
        .and_then(|row| row.map(mapping, letter.timestamp_ms.unwrap_or_default()));
    match mapped {
        Ok(event) => {
            let mut record = event.record;
            set_count(&mut record.headers, count + 1);
            Action::Send(record, How::Remapped, Some(event.profile))
        }
        Err(Remap::Failed(why)) => Action::DeadLetterAgain(again(letter, dlq, None, &why)),
        Err(Remap::Unusable(why)) => Action::Leave(why),
    }
}

fn resend(letter: &Letter, topic: &str, count: u32) -> Action {
    if letter.payload.is_none() {
        if let Some(what) = letter
            .all(HEADER_OMITTED)
            .into_iter()
            .find(|o| o.starts_with("payload"))
        {
            return Action::Leave(format!("its dead letter left out the {what}"));
        }
    }
    let mut headers: Vec<_> = letter
        .headers
        .iter()
        .filter(|(k, _)| !k.starts_with(HEADER_PREFIX) && &**k != HEADER_REDRIVES)
        .cloned()
        .collect();
    set_count(&mut headers, count + 1);
    let record = Record {
        topic: topic.to_string(),
        key: letter.key.clone(),
        payload: letter.payload.clone(),
        headers,
        timestamp_ms: letter.timestamp_ms,
        partition: letter
            .header(HEADER_ORIGINAL_PARTITION)
            .and_then(|p| p.parse().ok()),
        partition_key: letter
            .headers
            .iter()
            .find(|(k, _)| &**k == HEADER_PARTITION_KEY)
            .map(|(_, v)| v.clone()),
    };
    Action::Send(record, How::Resent, None)
}

/// The dead letter again, for `dlq`, with the redrive count raised and the new error (and
/// reason, for a record Kafka refused on the redrive).
pub(super) fn again(letter: &Letter, dlq: &str, reason: Option<&str>, why: &str) -> Record {
    let replaced = |k: &str| {
        k == HEADER_ERROR || k == HEADER_REDRIVES || (reason.is_some() && k == HEADER_REASON)
    };
    let mut headers: Vec<_> = letter
        .headers
        .iter()
        .filter(|(k, _)| !replaced(k))
        .cloned()
        .collect();
    if let Some(reason) = reason {
        headers.push((Arc::from(HEADER_REASON), Bytes::from(reason.to_string())));
    }
    headers.push((Arc::from(HEADER_ERROR), Bytes::from(why.to_string())));
    set_count(&mut headers, letter.redrives() + 1);
    Record {
        topic: dlq.to_string(),
        key: letter.key.clone(),
        payload: letter.payload.clone(),
        headers,
        timestamp_ms: letter.timestamp_ms,
        ..Record::default()
    }
}

pub(super) fn set_count(headers: &mut Vec<(Arc<str>, Bytes)>, count: u32) {
    headers.retain(|(k, _)| &**k != HEADER_REDRIVES);
    headers.push((Arc::from(HEADER_REDRIVES), Bytes::from(count.to_string())));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OutboxConfig;

    fn h(k: &str, v: &str) -> (Arc<str>, Bytes) {
        (Arc::from(k), Bytes::from(v.to_string()))
    }

    fn letter(headers: Vec<(Arc<str>, Bytes)>, payload: Option<&str>) -> Letter {
        Letter {
            partition: 0,
            offset: 3,
            timestamp_ms: Some(1000),
            key: Bytes::from_static(b"e-1"),
            payload: payload.map(|p| Bytes::from(p.to_string())),
            headers,
        }
    }

    fn mapping() -> OutboxMapping {
        let config = OutboxConfig {
            topic_column: Some("topic".into()),
            ..OutboxConfig::default()
        };
        OutboxMapping::new(&config).unwrap()
    }

    fn row(topic: &str) -> String {
        serde_json::json!({"table": "public.outbox", "columns": {"id": "e-1",
            "aggregatetype": "order", "aggregateid": "a-1", "type": "T", "payload": "{}",
            "topic": topic}})
        .to_string()
    }

    fn value(r: &Record, name: &str) -> Option<String> {
        r.headers
            .iter()
            .rev()
            .find(|(k, _)| &**k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    #[test]
    fn a_refused_record_is_resent_as_it_was_without_the_dead_letter_headers() {
        let l = letter(
            vec![
                h("id", "e-1"),
                h(HEADER_REDRIVES, "1"),
                h(HEADER_REASON, "too_large"),
                h(HEADER_ORIGINAL_TOPIC, "orders"),
                h(HEADER_ORIGINAL_PARTITION, "2"),
            ],
            Some("big"),
        );
        let Action::Send(r, How::Resent, None) = plan(&l, &mapping(), "dlq", 3) else {
            panic!("resent");
        };
        assert_eq!((r.topic.as_str(), r.partition), ("orders", Some(2)));
        assert_eq!(r.payload.as_deref(), Some(&b"big"[..]));
        assert_eq!(value(&r, HEADER_REDRIVES).as_deref(), Some("2"));
        assert_eq!(value(&r, "id").as_deref(), Some("e-1"));
        assert!(r.headers.iter().all(|(k, _)| !k.starts_with(HEADER_PREFIX)));
    }

    #[test]
    fn a_mapping_dead_letter_is_mapped_again_or_dead_lettered_again() {
        let headers = vec![
            h(HEADER_REASON, "invalid_topic"),
            h(HEADER_TABLE, "public.outbox"),
        ];
        let fixed = letter(headers.clone(), Some(&row("orders")));
        let Action::Send(r, How::Remapped, Some(0)) = plan(&fixed, &mapping(), "dlq", 3) else {
            panic!("remapped");
        };
        assert_eq!(r.topic, "orders");
        assert_eq!(value(&r, HEADER_REDRIVES).as_deref(), Some("1"));
        let still_bad = letter(headers, Some(&row("bad topic!")));
        let Action::DeadLetterAgain(d) = plan(&still_bad, &mapping(), "dlq", 3) else {
            panic!("dead-lettered again");
        };
        assert_eq!(d.topic, "dlq");
        assert_eq!(value(&d, HEADER_REDRIVES).as_deref(), Some("1"));
        assert_eq!(value(&d, HEADER_REASON).as_deref(), Some("invalid_topic"));
        assert_eq!(d.payload, still_bad.payload, "the row image travels on");
    }

    #[test]
    fn a_schema_dead_letter_is_mapped_again_with_its_tables_serialization_section() {
        let mut config = OutboxConfig::default();
        config.tables.push(crate::config::OutboxTableConfig {
            table: "public.audit".into(),
            serialization: Some(crate::config::SerializationConfig {
                format: crate::config::SerializationFormat::JsonSchema,
                registry_url: "http://r".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        let mapping = OutboxMapping::new(&config).unwrap();
        // As the session writes it: the record as it was, and its row in a header.
        let of = |table: &str| {
            let row = row("").replace("public.outbox", table);
            let headers = vec![
                h(HEADER_REASON, "schema"),
                h(HEADER_ORIGINAL_TOPIC, "orders"),
                h(HEADER_ROW, &row),
            ];
            match plan(&letter(headers, Some("{}")), &mapping, "dlq", 3) {
                Action::Send(_, How::Remapped, profile) => profile,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(of("public.audit"), Some(1));
        assert_eq!(of("public.outbox"), Some(0));
    }

    /// Issue 50, point 5: ~3 KB records redriven after their topic's limit was raised to
    /// 100,000 bytes go out in librdkafka's default batches (1,000,000 bytes), which Kafka
    /// refuses whole. Sent again, not dead-lettered again; only a record refused alone is.
    #[test]
    fn a_record_refused_with_its_batch_is_sent_again_and_one_refused_alone_dead_lettered_again() {
        use crate::sink::limits::{RecordContent, TopicLimits, DEFAULT_BATCH_SIZE};
        use rdkafka::types::RDKafkaErrorCode as Code;
        let error = |code| KafkaFault::of_code(code);
        let too_large = error(Code::MessageSizeTooLarge);
        let limits = TopicLimits::default();
        limits.read("t", 100_000);
        let payloads: Vec<Vec<u8>> = [3_000, 150_000].map(|n| vec![b'x'; n]).into();
        let judge = |key: &[u8], bytes: usize, batch_size| {
            let payload = payloads.iter().find(|p| p.len() == bytes).unwrap();
            limits.judge("t", RecordContent::of(Some(key), Some(payload)), batch_size)
        };
        assert_eq!(
            refused(too_large, false, || judge(b"e1", 3_000, DEFAULT_BATCH_SIZE)),
            Refused::SendAgain
        );
        let e1 = RecordContent::of(Some(b"e1"), Some(&payloads[0]));
        assert_eq!(limits.refused("t", e1), None, "not the record's fault");
        // A dead letter written again in such a batch goes again too.
        assert_eq!(
            refused(too_large, true, || judge(b"e2", 3_000, DEFAULT_BATCH_SIZE)),
            Refused::SendAgain
        );
        // The next producer's batches fit the limit; a record refused alone in one is at fault.
        let batch_size = limits.batch_size(DEFAULT_BATCH_SIZE);
        assert!(batch_size < 100_000, "{batch_size}");
        assert_eq!(
            refused(too_large, false, || judge(b"big", 150_000, batch_size)),
            Refused::DeadLetterAgain(Reason::TooLarge)
        );
        assert_eq!(
            refused(too_large, true, || judge(b"big-dlq", 150_000, batch_size)),
            Refused::Stop,
            "a dead letter refused for itself has nothing to stand in for it"
        );
        // Other refusals are not judged by size.
        let unjudged = || -> SizeRefusal { panic!("judged a refusal that is not for size") };
        assert_eq!(
            refused(error(Code::InvalidTopic), false, unjudged),
            Refused::DeadLetterAgain(Reason::InvalidTopic)
        );
        assert_eq!(
            refused(error(Code::MessageTimedOut), false, unjudged),
            Refused::Stop
        );
    }

    #[test]
    fn a_dead_letter_that_names_its_outbox_row_is_redriven_from_it() {
        let named = r#"{"table": "public.outbox", "id": "e-1"}"#;
        let l = letter(
            vec![
                h(HEADER_REASON, "too_large"),
                h(HEADER_ORIGINAL_TOPIC, "orders"),
                h(HEADER_OMITTED, "payload (2000000 bytes)"),
                h(HEADER_OMITTED, "row (2000300 bytes)"),
                h(HEADER_OUTBOX_ROW, named),
                h(HEADER_REDRIVES, "1"),
            ],
            None,
        );
        let Action::FromRow((table, id), 2) = plan(&l, &mapping(), "dlq", 3) else {
            panic!("from its row");
        };
        assert_eq!((table.as_str(), id.as_str()), ("public.outbox", "e-1"));
    }

    #[test]
    fn past_max_redrives_or_without_its_payload_a_dead_letter_is_left() {
        let mut l = letter(
            vec![
                h(HEADER_REASON, "too_large"),
                h(HEADER_ORIGINAL_TOPIC, "orders"),
                h(HEADER_OMITTED, "payload (2000000 bytes)"),
            ],
            None,
        );
        assert!(matches!(plan(&l, &mapping(), "dlq", 3), Action::Leave(_)));
        l.payload = Some(Bytes::from_static(b"x"));
        l.headers.push(h(HEADER_REDRIVES, "3"));
        assert!(matches!(plan(&l, &mapping(), "dlq", 3), Action::Leave(_)));
        assert!(matches!(plan(&l, &mapping(), "dlq", 4), Action::Send(..)));
    }
}
