//! Outbox rows to Kafka records: which relation is the outbox, which columns hold what, and
//! how topic, key, payload and headers are formed. Pure: no I/O.
//!
//! Columns are found by name in the latest Relation message, so column order and added
//! columns do not matter. Values are sent byte-for-byte as PostgreSQL's text output.

use std::sync::Arc;

use bytes::Bytes;

use crate::config::OutboxConfig;
use crate::pgoutput::{Relation, Tuple, TupleValue};
use crate::publisher::Record;

/// Kafka's limit on topic name length.
const MAX_TOPIC_LEN: usize = 249;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MappingError {
    #[error("outbox table {table} has no column `{column}` (configured as outbox.{setting})")]
    MissingColumn {
        table: String,
        column: String,
        setting: &'static str,
    },
    #[error("event {event_id}: column `{column}` is null")]
    NullColumn { event_id: String, column: String },
    #[error("event {event_id}: column `{column}` arrived in binary format; text was expected")]
    NotText { event_id: String, column: String },
    #[error("event {event_id}: column `{column}` is not valid UTF-8")]
    InvalidUtf8 { event_id: String, column: String },
    #[error("event {event_id}: topic `{topic}` is not a valid Kafka topic name ({reason})")]
    InvalidTopic {
        event_id: String,
        topic: String,
        reason: &'static str,
    },
    #[error("topic template `{0}` has an unknown placeholder `{{{1}}}`")]
    UnknownPlaceholder(String, String),
}

/// The fields of an outbox event a topic template may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Id,
    AggregateType,
    AggregateId,
    Type,
    Table,
    Schema,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Literal(String),
    Field(Field),
}

/// A parsed topic template such as `outbox.event.{aggregatetype}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicTemplate {
    segments: Vec<Segment>,
}

impl TopicTemplate {
    pub fn parse(template: &str) -> Result<Self, MappingError> {
        let mut segments = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                segments.push(Segment::Literal(rest[..open].to_string()));
            }
            let close = rest[open..].find('}').map(|c| open + c).ok_or_else(|| {
                MappingError::UnknownPlaceholder(template.into(), rest[open + 1..].into())
            })?;
            let name = &rest[open + 1..close];
            let field = match name {
                "id" => Field::Id,
                "aggregatetype" => Field::AggregateType,
                "aggregateid" => Field::AggregateId,
                "type" => Field::Type,
                "table" => Field::Table,
                "schema" => Field::Schema,
                other => {
                    return Err(MappingError::UnknownPlaceholder(
                        template.into(),
                        other.into(),
                    ))
                }
            };
            segments.push(Segment::Field(field));
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            segments.push(Segment::Literal(rest.to_string()));
        }
        Ok(TopicTemplate { segments })
    }

    fn render(&self, event: &EventFields<'_>) -> String {
        let mut topic = String::with_capacity(64);
        for segment in &self.segments {
            match segment {
                Segment::Literal(s) => topic.push_str(s),
                Segment::Field(f) => topic.push_str(event.get(*f)),
            }
        }
        topic
    }
}

/// Checks a topic name the way the broker will, so a bad one is caught before sending.
pub fn topic_name_problem(topic: &str) -> Option<&'static str> {
    if topic.is_empty() {
        Some("empty")
    } else if topic.len() > MAX_TOPIC_LEN {
        Some("longer than 249 characters")
    } else if topic == "." || topic == ".." {
        Some("`.` and `..` are reserved")
    } else if !topic
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        Some("only ASCII letters, digits, `.`, `_` and `-` are allowed")
    } else {
        None
    }
}

struct EventFields<'a> {
    id: &'a str,
    aggregate_type: &'a str,
    aggregate_id: &'a str,
    event_type: &'a str,
    table: &'a str,
    schema: &'a str,
}

impl EventFields<'_> {
    fn get(&self, field: Field) -> &str {
        match field {
            Field::Id => self.id,
            Field::AggregateType => self.aggregate_type,
            Field::AggregateId => self.aggregate_id,
            Field::Type => self.event_type,
            Field::Table => self.table,
            Field::Schema => self.schema,
        }
    }
}

/// Header names, allocated once and shared by every record.
#[derive(Debug, Clone)]
struct HeaderNames {
    id: Arc<str>,
    event_type: Arc<str>,
    aggregate_type: Arc<str>,
    aggregate_id: Arc<str>,
}

/// The configured outbox: which table, which columns, which topic.
#[derive(Debug, Clone)]
pub struct OutboxMapping {
    schema: String,
    table: String,
    config: OutboxConfig,
    topic: TopicTemplate,
    headers: HeaderNames,
}

/// The outbox table as the current Relation message describes it: column positions.
#[derive(Debug, Clone)]
pub struct BoundTable {
    id: usize,
    aggregate_type: usize,
    aggregate_id: usize,
    event_type: usize,
    payload: usize,
    mapping: OutboxMapping,
}

/// An event ready for Kafka, with its id kept for logs and dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub id: String,
    pub record: Record,
}

impl OutboxMapping {
    pub fn new(config: &OutboxConfig) -> Result<Self, MappingError> {
        let (schema, table) = config.schema_and_table();
        Ok(OutboxMapping {
            schema,
            table,
            topic: TopicTemplate::parse(&config.topic)?,
            config: config.clone(),
            headers: HeaderNames {
                id: Arc::from("id"),
                event_type: Arc::from("type"),
                aggregate_type: Arc::from("aggregatetype"),
                aggregate_id: Arc::from("aggregateid"),
            },
        })
    }

    /// `None` when the relation is not the outbox table; otherwise its column positions.
    pub fn bind(&self, relation: &Relation) -> Option<Result<BoundTable, MappingError>> {
        if relation.namespace != self.schema || relation.name != self.table {
            return None;
        }
        Some(self.bind_columns(relation))
    }

    fn bind_columns(&self, relation: &Relation) -> Result<BoundTable, MappingError> {
        let c = &self.config;
        let find = |column: &str, setting: &'static str| {
            relation
                .column_index(column)
                .ok_or_else(|| MappingError::MissingColumn {
                    table: format!("{}.{}", relation.namespace, relation.name),
                    column: column.to_string(),
                    setting,
                })
        };
        Ok(BoundTable {
            id: find(&c.id_column, "id_column")?,
            aggregate_type: find(&c.aggregate_type_column, "aggregate_type_column")?,
            aggregate_id: find(&c.aggregate_id_column, "aggregate_id_column")?,
            event_type: find(&c.type_column, "type_column")?,
            payload: find(&c.payload_column, "payload_column")?,
            mapping: self.clone(),
        })
    }
}

impl BoundTable {
    /// Builds the Kafka record for one inserted row.
    ///
    /// `commit_time_ms` (the transaction's commit time) becomes the record timestamp.
    pub fn to_event(
        &self,
        tuple: &Tuple,
        commit_time_ms: i64,
    ) -> Result<OutboxEvent, MappingError> {
        let m = &self.mapping;
        let c = &m.config;
        let id_bytes = text_value(tuple, self.id, &c.id_column, "?")?;
        let id = utf8(&id_bytes, &c.id_column, "?")?.to_string();
        let aggregate_type = text_value(tuple, self.aggregate_type, &c.aggregate_type_column, &id)?;
        let aggregate_id = text_value(tuple, self.aggregate_id, &c.aggregate_id_column, &id)?;
        let event_type = text_value(tuple, self.event_type, &c.type_column, &id)?;
        let payload = optional_value(tuple, self.payload, &c.payload_column, &id)?;
        let fields = EventFields {
            id: &id,
            aggregate_type: utf8(&aggregate_type, &c.aggregate_type_column, &id)?,
            aggregate_id: utf8(&aggregate_id, &c.aggregate_id_column, &id)?,
            event_type: utf8(&event_type, &c.type_column, &id)?,
            table: &m.table,
            schema: &m.schema,
        };
        let topic = m.topic.render(&fields);
        if let Some(reason) = topic_name_problem(&topic) {
            return Err(MappingError::InvalidTopic {
                event_id: id,
                topic,
                reason,
            });
        }
        let headers = vec![
            (m.headers.id.clone(), id_bytes.clone()),
            (m.headers.event_type.clone(), event_type),
            (m.headers.aggregate_type.clone(), aggregate_type),
            (m.headers.aggregate_id.clone(), aggregate_id),
        ];
        Ok(OutboxEvent {
            id,
            record: Record {
                topic,
                key: id_bytes,
                payload,
                headers,
                timestamp_ms: Some(commit_time_ms),
                partition: None,
            },
        })
    }
}

/// A non-null text value (shared with the frame, not copied).
fn text_value(
    tuple: &Tuple,
    index: usize,
    column: &str,
    event_id: &str,
) -> Result<Bytes, MappingError> {
    optional_value(tuple, index, column, event_id)?.ok_or_else(|| MappingError::NullColumn {
        event_id: event_id.to_string(),
        column: column.to_string(),
    })
}

fn optional_value(
    tuple: &Tuple,
    index: usize,
    column: &str,
    event_id: &str,
) -> Result<Option<Bytes>, MappingError> {
    match tuple.get(index) {
        Some(TupleValue::Text(bytes)) => Ok(Some(bytes.clone())),
        Some(TupleValue::Null) | Some(TupleValue::UnchangedToast) | None => Ok(None),
        Some(TupleValue::Binary(_)) => Err(MappingError::NotText {
            event_id: event_id.to_string(),
            column: column.to_string(),
        }),
    }
}

fn utf8<'a>(bytes: &'a [u8], column: &str, event_id: &str) -> Result<&'a str, MappingError> {
    std::str::from_utf8(bytes).map_err(|_| MappingError::InvalidUtf8 {
        event_id: event_id.to_string(),
        column: column.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pgoutput::Column;

    fn relation(columns: &[&str]) -> Relation {
        Relation {
            id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: columns
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

    fn text(s: &str) -> TupleValue {
        TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn default_mapping() -> OutboxMapping {
        OutboxMapping::new(&OutboxConfig::default()).unwrap()
    }

    const COLUMNS: [&str; 6] = [
        "id",
        "aggregatetype",
        "aggregateid",
        "type",
        "payload",
        "created_at",
    ];

    fn row(aggregate_type: TupleValue, payload: TupleValue) -> Tuple {
        Tuple(vec![
            text("7c9e6679-7425-40de-944b-e07fc1f90ae7"),
            aggregate_type,
            text("42"),
            text("OrderCreated"),
            payload,
            text("2026-01-01 00:00:00+00"),
        ])
    }

    #[test]
    fn debezium_row_becomes_record() {
        let bound = default_mapping()
            .bind(&relation(&COLUMNS))
            .unwrap()
            .unwrap();
        let event = bound
            .to_event(&row(text("order"), text(r#"{"total": 3}"#)), 1234)
            .unwrap();
        let r = &event.record;
        assert_eq!(r.topic, "outbox.event.order");
        assert_eq!(&r.key[..], b"7c9e6679-7425-40de-944b-e07fc1f90ae7");
        assert_eq!(r.payload.as_deref(), Some(&br#"{"total": 3}"#[..]));
        assert_eq!(r.timestamp_ms, Some(1234));
        let headers: Vec<(&str, &[u8])> = r.headers.iter().map(|(k, v)| (&**k, &v[..])).collect();
        assert_eq!(
            headers,
            vec![
                ("id", &b"7c9e6679-7425-40de-944b-e07fc1f90ae7"[..]),
                ("type", b"OrderCreated"),
                ("aggregatetype", b"order"),
                ("aggregateid", b"42"),
            ]
        );
    }

    #[test]
    fn columns_are_found_by_name_in_any_order() {
        let mut cols = COLUMNS;
        cols.reverse();
        let bound = default_mapping().bind(&relation(&cols)).unwrap().unwrap();
        let mut values = row(text("order"), text("{}")).0;
        values.reverse();
        let event = bound.to_event(&Tuple(values), 0).unwrap();
        assert_eq!(event.record.topic, "outbox.event.order");
    }

    #[test]
    fn other_tables_are_not_bound() {
        let mut other = relation(&COLUMNS);
        other.name = "orders".into();
        assert!(default_mapping().bind(&other).is_none());
    }

    #[test]
    fn missing_column_names_the_setting() {
        let err = default_mapping()
            .bind(&relation(&["id", "aggregatetype", "type", "payload"]))
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("aggregate_id_column"), "{err}");
    }

    #[test]
    fn null_routing_column_is_an_error_naming_the_event() {
        let bound = default_mapping()
            .bind(&relation(&COLUMNS))
            .unwrap()
            .unwrap();
        let err = bound
            .to_event(&row(TupleValue::Null, text("{}")), 0)
            .unwrap_err();
        assert!(
            matches!(err, MappingError::NullColumn { ref column, .. } if column == "aggregatetype")
        );
        assert!(err.to_string().contains("7c9e6679"));
    }

    #[test]
    fn null_payload_is_a_tombstone() {
        let bound = default_mapping()
            .bind(&relation(&COLUMNS))
            .unwrap()
            .unwrap();
        let event = bound
            .to_event(&row(text("order"), TupleValue::Null), 0)
            .unwrap();
        assert_eq!(event.record.payload, None);
    }

    #[test]
    fn invalid_topic_is_caught_before_sending() {
        let bound = default_mapping()
            .bind(&relation(&COLUMNS))
            .unwrap()
            .unwrap();
        let err = bound
            .to_event(&row(text("bad name!"), text("{}")), 0)
            .unwrap_err();
        assert!(matches!(err, MappingError::InvalidTopic { .. }), "{err}");
    }

    #[test]
    fn template_placeholders() {
        let t = TopicTemplate::parse("{schema}.{table}.{type}-x").unwrap();
        let f = EventFields {
            id: "i",
            aggregate_type: "a",
            aggregate_id: "b",
            event_type: "T",
            table: "outbox",
            schema: "s",
        };
        assert_eq!(t.render(&f), "s.outbox.T-x");
        assert!(TopicTemplate::parse("x.{nope}").is_err());
        assert!(TopicTemplate::parse("x.{type").is_err());
    }

    #[test]
    fn topic_names_are_checked_like_kafka_does() {
        assert_eq!(topic_name_problem("outbox.event.order_1-x"), None);
        for bad in ["", ".", "..", "a b", "ü", &"x".repeat(250)] {
            assert!(topic_name_problem(bad).is_some(), "{bad}");
        }
    }
}
