//! Dead letters: records for events that cannot be published as they are. Pure: builds the
//! record, the pipeline sends it like any other (and the slot waits for its acknowledgement,
//! so a dead letter is never lost either).
//!
//! The value keeps the original: the Kafka record's payload when there was one, or the row's
//! columns as JSON when the row could not become a record at all. Headers say why.

use std::sync::Arc;

use bytes::Bytes;
use rdkafka::message::{Headers, Message, OwnedMessage};

use crate::mapping::Record;
use crate::source::pgoutput::{Relation, Tuple, TupleValue};

/// Column values larger than this are left out of a row dead letter (the broker's default
/// record limit is 1 MB); the header `outbox-relay.dlq.omitted` names them.
const MAX_COLUMN_BYTES: usize = 256 * 1024;

pub const HEADER_REASON: &str = "outbox-relay.dlq.reason";
pub const HEADER_ERROR: &str = "outbox-relay.dlq.error";
pub const HEADER_ORIGINAL_TOPIC: &str = "outbox-relay.dlq.original-topic";
pub const HEADER_TABLE: &str = "outbox-relay.dlq.table";
pub const HEADER_OMITTED: &str = "outbox-relay.dlq.omitted";

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
}

impl Reason {
    /// The reason for a permanent Kafka error.
    pub fn for_kafka_error(error: &rdkafka::error::KafkaError) -> Reason {
        use rdkafka::types::RDKafkaErrorCode as Code;
        match error.rdkafka_error_code() {
            Some(
                Code::MessageSizeTooLarge | Code::InvalidMessageSize | Code::MessageBatchTooLarge,
            ) => Reason::TooLarge,
            Some(Code::InvalidTopic) => Reason::InvalidTopic,
            _ => Reason::Rejected,
        }
    }

    pub fn code(self) -> &'static str {
        match self {
            Reason::Mapping => "mapping",
            Reason::InvalidTopic => "invalid_topic",
            Reason::TooLarge => "too_large",
            Reason::Rejected => "rejected",
            Reason::Schema => "schema",
        }
    }
}

fn header(name: &str, value: impl Into<Bytes>) -> (Arc<str>, Bytes) {
    (Arc::from(name), value.into())
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
    let mut columns = serde_json::Map::new();
    let mut omitted = Vec::new();
    for (i, column) in relation.columns.iter().enumerate() {
        let value = match tuple.get(i) {
            Some(TupleValue::Text(b)) | Some(TupleValue::Binary(b))
                if b.len() > MAX_COLUMN_BYTES =>
            {
                omitted.push(format!("{} ({} bytes)", column.name, b.len()));
                serde_json::Value::Null
            }
            Some(TupleValue::Text(b)) => String::from_utf8_lossy(b).into_owned().into(),
            Some(TupleValue::Binary(b)) => format!("<{} bytes of binary>", b.len()).into(),
            Some(TupleValue::Null) | Some(TupleValue::UnchangedToast) | None => {
                serde_json::Value::Null
            }
        };
        columns.insert(column.name.clone(), value);
    }
    let table = format!("{}.{}", relation.namespace, relation.name);
    let value = serde_json::json!({ "table": table, "columns": columns });
    let mut headers = vec![
        header(HEADER_REASON, reason.code()),
        header(HEADER_ERROR, error.to_string()),
        header(HEADER_TABLE, table),
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

/// A dead letter for a record Kafka refused before sending (e.g. too large for the producer).
pub fn from_record(topic: &str, record: &Record, reason: Reason, error: &str) -> Record {
    let mut dead = record.clone();
    dead.topic = topic.to_string();
    dead.partition = None;
    annotate(&mut dead, reason, error, &record.topic);
    dead
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
    annotate(&mut dead, reason, error, message.topic());
    dead
}

/// Adds the reason headers; a payload that was too large is left out (it would be refused
/// again) and its size noted.
fn annotate(dead: &mut Record, reason: Reason, error: &str, original_topic: &str) {
    if reason == Reason::TooLarge {
        if let Some(payload) = dead.payload.take() {
            dead.headers.push(header(
                HEADER_OMITTED,
                format!("payload ({} bytes)", payload.len()),
            ));
        }
    }
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

    #[test]
    fn huge_columns_are_left_out_of_row_dead_letters() {
        let big = Bytes::from(vec![b'x'; MAX_COLUMN_BYTES + 1]);
        let tuple = Tuple(vec![
            TupleValue::Text(Bytes::from_static(b"e2")),
            TupleValue::Null,
            TupleValue::Text(big),
        ]);
        let r = from_row("dlq", &relation(), &tuple, Reason::Mapping, "x", None);
        assert!(r.payload.as_ref().unwrap().len() < 1024);
        assert!(header_value(&r, HEADER_OMITTED).is_some());
        assert!(r.key.is_empty());
    }

    #[test]
    fn too_large_record_is_dead_lettered_without_its_payload() {
        let record = Record {
            topic: "orders".into(),
            key: Bytes::from_static(b"e3"),
            payload: Some(Bytes::from(vec![b'x'; 10])),
            headers: vec![header("id", Bytes::from_static(b"e3"))],
            timestamp_ms: Some(5),
            partition: Some(2),
            ..Record::default()
        };
        let r = from_record("dlq", &record, Reason::TooLarge, "too large");
        assert_eq!(r.topic, "dlq");
        assert_eq!(r.payload, None);
        assert_eq!(r.partition, None);
        assert_eq!(
            header_value(&r, HEADER_ORIGINAL_TOPIC),
            Some(&b"orders"[..])
        );
        assert_eq!(header_value(&r, "id"), Some(&b"e3"[..]));
        assert_eq!(header_value(&r, HEADER_REASON), Some(&b"too_large"[..]));
    }
}
