//! Dead letters: records for events that cannot be published as they are. Pure: builds the
//! record, the pipeline sends it like any other (and the slot waits for its acknowledgement,
//! so a dead letter is never lost either).
//!
//! The value keeps the original: the Kafka record's payload when there was one, or the row's
//! columns as JSON when the row could not become a record at all. Headers say why.
//!
//! What `dead-letters redrive` needs travels along (all additive, so older dead letters stay
//! readable): the row image (`{"table", "columns", "types", "commit_time_ms"}`) is the value
//! of a row dead letter, and the header `outbox-relay.dlq.row` of a record Kafka refused
//! while the relay still held the row; the original partition (or partition key) in headers.
//!
//! A dead letter keeps as much of that as its own topic and the producer take ([`fit`]: the
//! dead-letter topic's `max.message.bytes` when known, and the producer's
//! `message.max.bytes`): payload and row image when both fit, else what a redrive needs most,
//! the rest left out and named in `outbox-relay.dlq.omitted`. One that keeps neither
//! ([`lost_content`]) names its outbox row instead (`outbox-relay.dlq.outbox-row`), which
//! the relay keeps from the sweeper until a redrive re-sent it from the row.

use std::sync::Arc;

use bytes::Bytes;
use rdkafka::message::{Headers, Message, OwnedMessage};

use crate::mapping::{event_id_of, Record};
use crate::source::pgoutput::{Relation, Tuple, TupleValue};

pub const HEADER_REASON: &str = "outbox-relay.dlq.reason";
pub const HEADER_ERROR: &str = "outbox-relay.dlq.error";
pub const HEADER_ORIGINAL_TOPIC: &str = "outbox-relay.dlq.original-topic";
pub const HEADER_TABLE: &str = "outbox-relay.dlq.table";
pub const HEADER_OMITTED: &str = "outbox-relay.dlq.omitted";
/// The row image (JSON) of a record-level dead letter, when the relay still had the row.
pub const HEADER_ROW: &str = "outbox-relay.dlq.row";
/// The partition the refused record was produced to (decimal).
pub const HEADER_ORIGINAL_PARTITION: &str = "outbox-relay.dlq.original-partition";
/// The bytes the refused record's partition was to be chosen from (the aggregate id).
pub const HEADER_PARTITION_KEY: &str = "outbox-relay.dlq.partition-key";
/// How often the event was redriven (decimal): on redriven records and on their dead letters.
pub const HEADER_REDRIVES: &str = "outbox-relay.redrive-count";
/// The record's own timestamp (milliseconds, decimal), when its dead letter is stamped anew.
pub const HEADER_TIMESTAMP: &str = "outbox-relay.dlq.timestamp";
/// The event id, when the dead letter leaves out the value that held it (a CloudEvents
/// structured record too large to keep).
pub const HEADER_EVENT_ID: &str = "outbox-relay.dlq.event-id";
/// The outbox row of a dead letter that keeps neither payload nor row image, as JSON
/// `{"table", "id"}`: the relay keeps that row from the sweeper (`outbox_relay_kept_rows`), and
/// `dead-letters redrive` re-sends the event from it.
pub const HEADER_OUTBOX_ROW: &str = "outbox-relay.dlq.outbox-row";
/// The prefix of every header the relay adds to a dead letter (a redrive removes them).
pub const HEADER_PREFIX: &str = "outbox-relay.dlq.";

/// Room a dead letter leaves below its limit for the framing of its record and batch (the
/// record's varints, header lengths, the batch header): [`fit`] keeps its bytes below the
/// limit by this much (by an eighth of a limit below 8 KiB).
const FRAMING_BYTES: usize = 1024;

/// Why an event was dead-lettered, as a short stable code (the `reason` header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// The row could not be mapped (a null or missing routing column, bad encoding).
    Mapping,
    /// The topic name is not valid for Kafka.
    InvalidTopic,
    /// The record is larger than the producer or broker accepts.
    TooLarge,
    /// Kafka refused the record for another permanent reason.
    Rejected,
    /// The payload does not fit its subject's schema (`[outbox.serialization]`).
    Schema,
    /// The row's own timestamp (`timestamp_column`) lies outside its topic's window.
    Timestamp,
}

impl Reason {
    pub fn code(self) -> &'static str {
        match self {
            Reason::Mapping => "mapping",
            Reason::InvalidTopic => "invalid_topic",
            Reason::TooLarge => "too_large",
            Reason::Rejected => "rejected",
            Reason::Schema => "schema",
            Reason::Timestamp => "timestamp",
        }
    }
}

fn header(name: &str, value: impl Into<Bytes>) -> (Arc<str>, Bytes) {
    (Arc::from(name), value.into())
}

/// The row an event came from, as the relay read it.
#[derive(Debug, Clone, Copy)]
pub struct Row<'a> {
    pub relation: &'a Relation,
    pub tuple: &'a Tuple,
    /// Its transaction's commit time (the record timestamp a re-mapping uses).
    pub commit_time_ms: Option<i64>,
}

impl Row<'_> {
    pub fn table(&self) -> String {
        format!("{}.{}", self.relation.namespace, self.relation.name)
    }

    /// `{"table", "columns", "types", "commit_time_ms"}`, and the columns left out (too big).
    fn image(&self) -> (serde_json::Value, Vec<String>) {
        let mut columns = serde_json::Map::new();
        let mut types = serde_json::Map::new();
        let mut omitted = Vec::new();
        for (i, column) in self.relation.columns.iter().enumerate() {
            let value = match self.tuple.get(i) {
                Some(TupleValue::Text(b)) => String::from_utf8_lossy(b).into_owned().into(),
                Some(TupleValue::Binary(b)) => {
                    omitted.push(format!("{} (binary)", column.name));
                    format!("<{} bytes of binary>", b.len()).into()
                }
                Some(TupleValue::Null) | Some(TupleValue::UnchangedToast) | None => {
                    serde_json::Value::Null
                }
            };
            columns.insert(column.name.clone(), value);
            types.insert(column.name.clone(), column.type_oid.into());
        }
        let image = serde_json::json!({
            "table": self.table(),
            "columns": columns,
            "types": types,
            "commit_time_ms": self.commit_time_ms,
        });
        (image, omitted)
    }
}

/// A dead letter for a row that never became a record: its columns as a JSON object.
pub fn from_row(
    topic: &str,
    relation: &Relation,
    tuple: &Tuple,
    reason: Reason,
    error: &str,
    event_id: Option<&str>,
) -> Record {
    let row = Row {
        relation,
        tuple,
        commit_time_ms: None,
    };
    from_row_image(topic, row, reason, error, event_id)
}

/// [`from_row`], with the commit time in the row image.
pub fn from_row_image(
    topic: &str,
    row: Row<'_>,
    reason: Reason,
    error: &str,
    event_id: Option<&str>,
) -> Record {
    let (value, omitted) = row.image();
    let mut headers = vec![
        header(HEADER_REASON, reason.code()),
        header(HEADER_ERROR, error.to_string()),
        header(HEADER_TABLE, row.table()),
    ];
    if let Some(id) = event_id {
        headers.push(header("id", id.to_string()));
    }
    if !omitted.is_empty() {
        headers.push(header(HEADER_OMITTED, omitted.join(", ")));
    }
    Record {
        topic: topic.to_string(),
        key: event_id
            .map(|id| Bytes::from(id.to_string()))
            .unwrap_or_default(),
        payload: Some(Bytes::from(value.to_string())),
        headers,
        ..Record::default()
    }
}

/// Adds the row image of a record-level dead letter as a header ([`fit`] may leave it out).
pub fn with_row(dead: &mut Record, row: Row<'_>) {
    let (image, omitted) = row.image();
    let image = image.to_string();
    if !omitted.is_empty() {
        dead.headers.push(header(
            HEADER_OMITTED,
            format!("row: {}", omitted.join(", ")),
        ));
    }
    dead.headers.push(header(HEADER_ROW, image));
}

/// A dead letter for a record Kafka refused before sending (e.g. too large for the producer).
pub fn from_record(topic: &str, record: &Record, reason: Reason, error: &str) -> Record {
    let mut dead = record.clone();
    dead.topic = topic.to_string();
    dead.partition = None;
    dead.partition_key = None;
    if let Some(partition) = record.partition {
        dead.headers
            .push(header(HEADER_ORIGINAL_PARTITION, partition.to_string()));
    }
    if let Some(key) = &record.partition_key {
        dead.headers.push(header(HEADER_PARTITION_KEY, key.clone()));
    }
    annotate(&mut dead, reason, error, &record.topic);
    dead
}

/// Stamps a dead letter `timestamp_ms` (its event's commit time), keeping the time it had in
/// a header: a dead letter whose own time the topics refuse must still be taken.
pub fn restamp(dead: &mut Record, timestamp_ms: i64) {
    if let Some(own) = dead.timestamp_ms.replace(timestamp_ms) {
        dead.headers.push(header(HEADER_TIMESTAMP, own.to_string()));
    }
}

/// A dead letter for a record whose delivery failed permanently.
pub fn from_failed(topic: &str, message: &OwnedMessage, reason: Reason, error: &str) -> Record {
    let headers = message
        .headers()
        .map(|h| {
            h.iter()
                .map(|h| header(h.key, Bytes::copy_from_slice(h.value.unwrap_or_default())))
                .collect()
        })
        .unwrap_or_default();
    let mut dead = Record {
        topic: topic.to_string(),
        key: Bytes::copy_from_slice(message.key().unwrap_or_default()),
        payload: message.payload().map(Bytes::copy_from_slice),
        headers,
        timestamp_ms: message.timestamp().to_millis(),
        ..Record::default()
    };
    if message.partition() >= 0 {
        dead.headers.push(header(
            HEADER_ORIGINAL_PARTITION,
            message.partition().to_string(),
        ));
    }
    annotate(&mut dead, reason, error, message.topic());
    dead
}

/// Fits a dead letter into `limit` bytes, the most its topic and the producer take (the
/// dead-letter topic's `max.message.bytes` as read, the producer's `message.max.bytes`), less
/// [`FRAMING_BYTES`]. Payload and row image stay when they fit. Otherwise what a redrive
/// needs least goes first, each named in `outbox-relay.dlq.omitted`: for a record dead
/// letter the row image before the payload (a redrive re-sends the payload as it was), unless
/// the reason is one a redrive maps the row again for (`mapping`, `invalid_topic`, `schema`);
/// for a row dead letter (its value is the image), its largest columns. What is still left
/// out then is [`lost_content`]'s to tell.
pub fn fit(dead: &mut Record, limit: usize) {
    let budget = limit - FRAMING_BYTES.min(limit / 8);
    if dead.wire_bytes() <= budget {
        return;
    }
    if is_row_letter(dead) {
        return fit_row_letter(dead, budget);
    }
    let reason = header_value(dead, HEADER_REASON).unwrap_or_default();
    let remaps = [Reason::Mapping, Reason::InvalidTopic, Reason::Schema]
        .iter()
        .any(|r| r.code().as_bytes() == reason.as_slice());
    let order: [fn(&mut Record); 2] = match remaps {
        true => [drop_payload, drop_row],
        false => [drop_row, drop_payload],
    };
    for drop in order {
        if dead.wire_bytes() <= budget {
            return;
        }
        drop(dead);
    }
}

/// A dead letter for a row that never became a record: no original topic, its value the
/// row image.
fn is_row_letter(dead: &Record) -> bool {
    let has = |name| dead.headers.iter().any(|(k, _)| &**k == name);
    !has(HEADER_ORIGINAL_TOPIC) && has(HEADER_TABLE)
}

fn header_value(dead: &Record, name: &str) -> Option<Vec<u8>> {
    dead.headers
        .iter()
        .rev()
        .find(|(k, _)| &**k == name)
        .map(|(_, v)| v.to_vec())
}

/// Leaves the payload out (a CloudEvents structured record holds its event id in it: the id
/// is kept in a header).
fn drop_payload(dead: &mut Record) {
    let headers = || dead.headers.iter().map(|(k, v)| (&**k, &v[..]));
    let only_in_value = match event_id_of(headers(), None) {
        Some(_) => None,
        None => event_id_of(headers(), dead.payload.as_deref()),
    };
    if let Some(id) = only_in_value {
        dead.headers.push(header(HEADER_EVENT_ID, id));
    }
    if let Some(payload) = dead.payload.take() {
        dead.headers.push(header(
            HEADER_OMITTED,
            format!("payload ({} bytes)", payload.len()),
        ));
    }
}

/// Leaves the row image header out.
fn drop_row(dead: &mut Record) {
    let Some(i) = dead.headers.iter().position(|(k, _)| &**k == HEADER_ROW) else {
        return;
    };
    let (_, image) = dead.headers.remove(i);
    dead.headers
        .retain(|(k, v)| !(&**k == HEADER_OMITTED && v.starts_with(b"row: ")));
    dead.headers.push(header(
        HEADER_OMITTED,
        format!("row ({} bytes)", image.len()),
    ));
}

/// A row dead letter over `budget`: its largest columns are left out (null in the image,
/// named in `outbox-relay.dlq.omitted` as `columns: …`) until it fits.
fn fit_row_letter(dead: &mut Record, budget: usize) {
    let Some(mut image) = dead
        .payload
        .as_deref()
        .and_then(|p| serde_json::from_slice::<serde_json::Value>(p).ok())
    else {
        return;
    };
    let mut omitted = Vec::new();
    let mut over = dead.wire_bytes().saturating_sub(budget);
    if let Some(columns) = image.get_mut("columns").and_then(|c| c.as_object_mut()) {
        let mut by_size: Vec<(String, usize)> = columns
            .iter()
            .map(|(name, v)| (name.clone(), v.as_str().map_or(0, str::len)))
            .filter(|(_, len)| *len > 0)
            .collect();
        by_size.sort_by_key(|c| std::cmp::Reverse(c.1));
        for (name, len) in by_size {
            if over == 0 {
                break;
            }
            columns.insert(name.clone(), serde_json::Value::Null);
            omitted.push(format!("{name} ({len} bytes)"));
            over = over.saturating_sub(len);
        }
    }
    if !omitted.is_empty() {
        dead.payload = Some(Bytes::from(image.to_string()));
        let omitted = format!("columns: {}", omitted.join(", "));
        dead.headers.push(header(HEADER_OMITTED, omitted));
    }
}

/// What a dead letter left out of its event's content when it keeps neither the payload nor
/// a whole row image (a record dead letter without both; a row dead letter that left columns
/// out): a redrive cannot re-send such an event from it, and once its outbox row is gone (the
/// sweeper, insert-then-delete) it would be lost. `None` when the content is kept.
pub fn lost_content(dead: &Record) -> Option<String> {
    let omitted = |what: &[u8]| {
        dead.headers
            .iter()
            .find(|(k, v)| &**k == HEADER_OMITTED && v.starts_with(what))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    };
    if is_row_letter(dead) {
        return omitted(b"columns: ");
    }
    // A row image counts only whole: one that left a column out cannot be mapped again.
    let whole_row =
        dead.headers.iter().any(|(k, _)| &**k == HEADER_ROW) && omitted(b"row").is_none();
    if dead.payload.is_some() || whole_row {
        return None;
    }
    let payload = omitted(b"payload")?;
    Some(match omitted(b"row") {
        Some(row) => format!("{payload}; {row}"),
        None => payload,
    })
}

/// Names the outbox row a dead letter that keeps neither payload nor row image stands for
/// (`table`: `schema.table`, `id`: its id column's text): a redrive re-sends the event from it.
pub fn name_row(dead: &mut Record, table: &str, id: &str) {
    let row = serde_json::json!({"table": table, "id": id});
    dead.headers
        .push(header(HEADER_OUTBOX_ROW, row.to_string()));
}

/// Adds the reason headers. What does not fit the dead letter's limits is left out later, by
/// [`fit`].
fn annotate(dead: &mut Record, reason: Reason, error: &str, original_topic: &str) {
    dead.headers.push(header(HEADER_REASON, reason.code()));
    dead.headers.push(header(HEADER_ERROR, error.to_string()));
    dead.headers
        .push(header(HEADER_ORIGINAL_TOPIC, original_topic.to_string()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::pgoutput::Column;

    fn relation() -> Relation {
        Relation {
            id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: ["id", "aggregatetype", "payload"]
                .iter()
                .map(|n| Column {
                    flags: 0,
                    name: n.to_string(),
                    type_oid: 25,
                    type_modifier: -1,
                })
                .collect(),
        }
    }

    fn header_value<'a>(r: &'a Record, name: &str) -> Option<&'a [u8]> {
        r.headers
            .iter()
            .find(|(k, _)| &**k == name)
            .map(|(_, v)| &v[..])
    }

    #[test]
    fn row_dead_letter_keeps_the_columns_and_says_why() {
        let tuple = Tuple(vec![
            TupleValue::Text(Bytes::from_static(b"e1")),
            TupleValue::Null,
            TupleValue::Text(Bytes::from_static(br#"{"a": 1}"#)),
        ]);
        let r = from_row(
            "dlq",
            &relation(),
            &tuple,
            Reason::Mapping,
            "column `aggregatetype` is null",
            Some("e1"),
        );
        assert_eq!(r.topic, "dlq");
        assert_eq!(&r.key[..], b"e1");
        let value: serde_json::Value = serde_json::from_slice(r.payload.as_ref().unwrap()).unwrap();
        assert_eq!(value["table"], "public.outbox");
        assert_eq!(value["columns"]["aggregatetype"], serde_json::Value::Null);
        assert_eq!(value["columns"]["payload"], r#"{"a": 1}"#);
        assert_eq!(header_value(&r, HEADER_REASON), Some(&b"mapping"[..]));
        assert_eq!(header_value(&r, "id"), Some(&b"e1"[..]));
    }

    /// The producer's default `message.max.bytes`, the limit of these dead letters.
    const LIMIT: usize = 1_000_000;

    #[test]
    fn a_row_dead_letter_over_its_limit_leaves_its_largest_columns_out() {
        let tuple = |payload: usize| {
            Tuple(vec![
                TupleValue::Text(Bytes::from_static(b"e2")),
                TupleValue::Text(Bytes::from(vec![b'o'; 600_000])),
                TupleValue::Text(Bytes::from(vec![b'x'; payload])),
            ])
        };
        // 900 KB of columns fit a 1 MB limit whole: kept, nothing lost.
        let mut r = from_row(
            "dlq",
            &relation(),
            &tuple(300_000),
            Reason::Mapping,
            "x",
            None,
        );
        fit(&mut r, LIMIT);
        assert!(r.payload.as_ref().unwrap().len() > 900_000);
        assert_eq!(header_value(&r, HEADER_OMITTED), None);
        assert_eq!(lost_content(&r), None);
        // 1.1 MB do not: the largest column goes, the row image is no longer whole.
        let mut r = from_row(
            "dlq",
            &relation(),
            &tuple(500_000),
            Reason::Mapping,
            "x",
            None,
        );
        fit(&mut r, LIMIT);
        assert!(r.wire_bytes() <= LIMIT - FRAMING_BYTES);
        let image: serde_json::Value = serde_json::from_slice(r.payload.as_ref().unwrap()).unwrap();
        assert_eq!(image["columns"]["aggregatetype"], serde_json::Value::Null);
        assert_eq!(image["columns"]["payload"].as_str().unwrap().len(), 500_000);
        assert_eq!(
            header_value(&r, HEADER_OMITTED),
            Some(&b"columns: aggregatetype (600000 bytes)"[..])
        );
        assert!(lost_content(&r).unwrap().contains("aggregatetype"));
        assert!(r.key.is_empty());
    }

    #[test]
    fn too_large_record_is_dead_lettered_without_its_payload_only_over_the_limit() {
        let record = |bytes: usize| Record {
            topic: "orders".into(),
            key: Bytes::from_static(b"e3"),
            payload: Some(Bytes::from(vec![b'x'; bytes])),
            headers: vec![header("id", Bytes::from_static(b"e3"))],
            timestamp_ms: Some(5),
            partition: Some(2),
            ..Record::default()
        };
        // Above the 512 KiB a dead letter kept at most before, within the limit: kept.
        let mut kept = from_record("dlq", &record(900_000), Reason::TooLarge, "too large");
        fit(&mut kept, LIMIT);
        assert_eq!(kept.payload.as_ref().map(Bytes::len), Some(900_000));
        // Within a smaller dead-letter topic's limit it is not.
        fit(&mut kept, 64 * 1024);
        assert_eq!(kept.payload, None);
        let mut r = from_record("dlq", &record(LIMIT), Reason::TooLarge, "too large");
        fit(&mut r, LIMIT);
        assert_eq!(r.topic, "dlq");
        assert_eq!(r.payload, None);
        assert_eq!(r.partition, None);
        assert_eq!(
            header_value(&r, HEADER_ORIGINAL_TOPIC),
            Some(&b"orders"[..])
        );
        assert_eq!(header_value(&r, "id"), Some(&b"e3"[..]));
        assert_eq!(header_value(&r, HEADER_REASON), Some(&b"too_large"[..]));
        assert_eq!(header_value(&r, HEADER_ORIGINAL_PARTITION), Some(&b"2"[..]));
        assert_eq!(
            header_value(&r, HEADER_OMITTED),
            Some(format!("payload ({LIMIT} bytes)").as_bytes())
        );
    }

    /// What a redrive needs most stays: the payload of a record it re-sends as it was, the
    /// row image of one it maps again.
    #[test]
    fn over_its_limit_a_dead_letter_keeps_what_its_redrive_needs() {
        let relation = relation();
        let tuple = Tuple(vec![
            TupleValue::Text(Bytes::from_static(b"e5")),
            TupleValue::Text(Bytes::from_static(b"order")),
            TupleValue::Text(Bytes::from(vec![b'x'; 600_000])),
        ]);
        let row = Row {
            relation: &relation,
            tuple: &tuple,
            commit_time_ms: None,
        };
        let record = Record {
            topic: "orders".into(),
            key: Bytes::from_static(b"e5"),
            payload: Some(Bytes::from(vec![b'x'; 600_000])),
            ..Record::default()
        };
        for (reason, keeps_payload) in [(Reason::TooLarge, true), (Reason::Schema, false)] {
            let mut dead = from_record("dlq", &record, reason, "x");
            with_row(&mut dead, row);
            fit(&mut dead, LIMIT);
            assert_eq!(dead.payload.is_some(), keeps_payload, "{reason:?}");
            assert_eq!(header_value(&dead, HEADER_ROW).is_some(), !keeps_payload);
            assert_eq!(lost_content(&dead), None, "{reason:?}");
        }
    }

    #[test]
    fn a_dead_letter_that_keeps_neither_payload_nor_row_says_what_it_lost() {
        let mut record = Record {
            topic: "orders".into(),
            key: Bytes::from_static(b"e1"),
            payload: Some(Bytes::from(vec![b'x'; LIMIT + 1])),
            ..Record::default()
        };
        let mut dead = from_record("dlq", &record, Reason::TooLarge, "too large");
        fit(&mut dead, LIMIT);
        assert_eq!(
            lost_content(&dead).as_deref(),
            Some(format!("payload ({} bytes)", LIMIT + 1).as_str())
        );
        // Its row image, as large, cannot stay either.
        let tuple = Tuple(vec![
            TupleValue::Text(Bytes::from_static(b"e1")),
            TupleValue::Text(Bytes::from_static(b"order")),
            TupleValue::Text(Bytes::from(vec![b'x'; LIMIT + 1])),
        ]);
        let relation = relation();
        let mut with_image = from_record("dlq", &record, Reason::TooLarge, "too large");
        let row = Row {
            relation: &relation,
            tuple: &tuple,
            commit_time_ms: None,
        };
        with_row(&mut with_image, row);
        fit(&mut with_image, LIMIT);
        assert_eq!(header_value(&with_image, HEADER_ROW), None);
        let lost = lost_content(&with_image).unwrap();
        assert!(
            lost.contains("payload (") && lost.contains("row ("),
            "{lost}"
        );
        name_row(&mut with_image, "public.outbox", "e1");
        let named: serde_json::Value =
            serde_json::from_slice(header_value(&with_image, HEADER_OUTBOX_ROW).unwrap()).unwrap();
        assert_eq!(
            named,
            serde_json::json!({"table": "public.outbox", "id": "e1"})
        );
        record.payload = Some(Bytes::from(vec![b'x'; 1_000]));
        let mut small = from_record("dlq", &record, Reason::TooLarge, "x");
        fit(&mut small, LIMIT);
        assert_eq!(lost_content(&small), None);
    }

    #[test]
    fn a_too_large_payload_that_fits_the_dead_letter_is_kept_with_the_row() {
        let record = Record {
            topic: "orders".into(),
            key: Bytes::from_static(b"e4"),
            payload: Some(Bytes::from(vec![b'x'; 2000])),
            partition_key: Some(Bytes::from_static(b"agg-1")),
            ..Record::default()
        };
        let mut r = from_record("dlq", &record, Reason::TooLarge, "too large");
        assert_eq!(r.payload, record.payload, "kept for a redrive");
        assert_eq!(r.partition_key, None);
        assert_eq!(header_value(&r, HEADER_PARTITION_KEY), Some(&b"agg-1"[..]));
        let tuple = Tuple(vec![
            TupleValue::Text(Bytes::from_static(b"e4")),
            TupleValue::Text(Bytes::from_static(b"order")),
            TupleValue::Null,
        ]);
        let row = Row {
            relation: &relation(),
            tuple: &tuple,
            commit_time_ms: Some(7),
        };
        with_row(&mut r, row);
        let image: serde_json::Value =
            serde_json::from_slice(header_value(&r, HEADER_ROW).unwrap()).unwrap();
        assert_eq!(image["table"], "public.outbox");
        assert_eq!(image["columns"]["aggregatetype"], "order");
        assert_eq!(image["types"]["id"], 25);
        assert_eq!(image["commit_time_ms"], 7);
    }
}
