//! One compiled set of rules per source (an outbox table, or the logical messages) and the
//! record it builds from any [`Source`] of named fields. Each record part has its own file:
//! [`super::topic`], [`super::timestamp`], [`super::headers`], [`super::payload`].

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;

use super::cloudevents::CloudEvents;
use super::headers::HeaderNames;
use super::topic::{EventFields, TopicTemplate};
use super::{MappingError, OutboxEvent, Record, UNKNOWN_ID};
use crate::config::{
    Format, NullPayload, OutboxConfig, PARTITION_BY_AGGREGATE_ID, PARTITION_BY_KEY,
};

/// Type OIDs whose text form the mapping interprets, or whose binary form it converts
/// ([`super::binary`]).
pub(super) mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const NAME: u32 = 19;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const TEXT: u32 = 25;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const BPCHAR: u32 = 1042;
    pub const VARCHAR: u32 = 1043;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const UUID: u32 = 2950;
    pub const JSONB: u32 = 3802;
}

/// What a mapped column (or message member) is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    Id,
    AggregateType,
    AggregateId,
    Type,
    Payload,
    Key,
    Timestamp,
    Headers,
    Tracing,
    Topic,
    Partition,
    Subject,
}

impl Role {
    pub(super) const ALL: [Role; 12] = [
        Role::Id,
        Role::AggregateType,
        Role::AggregateId,
        Role::Type,
        Role::Payload,
        Role::Key,
        Role::Timestamp,
        Role::Headers,
        Role::Tracing,
        Role::Topic,
        Role::Partition,
        Role::Subject,
    ];

    pub(super) fn index(self) -> usize {
        self as usize
    }

    /// The config key naming this role's column, for error messages.
    pub(super) fn setting(self) -> &'static str {
        match self {
            Role::Id => "id_column",
            Role::AggregateType => "aggregate_type_column",
            Role::AggregateId => "aggregate_id_column",
            Role::Type => "type_column",
            Role::Payload => "payload_column",
            Role::Key => "key_column",
            Role::Timestamp => "timestamp_column",
            Role::Headers => "headers_column",
            Role::Tracing => "tracing_column",
            Role::Topic => "topic_column",
            Role::Partition => "partition_by",
            Role::Subject => "cloudevents_subject_column",
        }
    }
}

/// How a value's text is read, from its column's type (or its JSON kind in a message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Any other type, `timestamp` and `timestamptz` included: a timestamp column parses
    /// their ISO text, as it does a text column's.
    Text,
    Json,
    /// Already decoded from `\x…` to the raw bytes.
    Bytea,
    Integer,
}

impl Kind {
    pub(super) fn of_type(type_oid: u32) -> Kind {
        match type_oid {
            oid::BYTEA => Kind::Bytea,
            oid::JSON | oid::JSONB => Kind::Json,
            oid::INT2 | oid::INT4 | oid::INT8 => Kind::Integer,
            _ => Kind::Text,
        }
    }
}

/// One field's value: its bytes (text form, bytea decoded) and how to read them.
#[derive(Debug, Clone)]
pub(super) struct Value {
    pub bytes: Bytes,
    pub kind: Kind,
}

/// Where an event's fields come from: a row ([`super::table`]), or a message's JSON object
/// ([`super::message`]).
pub(super) trait Source {
    /// The value of a role's field; `None` when null or when the role is not configured.
    fn get(&self, rules: &Rules, role: Role, event_id: &str)
        -> Result<Option<Value>, MappingError>;
    /// The value of the `i`-th extra column ([`Rules::extra_column`]).
    fn extra(&self, rules: &Rules, i: usize, event_id: &str)
        -> Result<Option<Value>, MappingError>;
}

/// How the partition is chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PartitionBy {
    AggregateId,
    Key,
    Column,
}

/// The compiled mapping of one source: an outbox table, or the logical messages.
#[derive(Debug)]
pub(super) struct Rules {
    pub schema: String,
    /// The table name, or the message prefix.
    pub table: String,
    /// Column (or member) name per [`Role`]; `None` for an optional role not configured.
    columns: [Option<String>; Role::ALL.len()],
    pub topic: TopicTemplate,
    pub topic_overrides: HashMap<String, TopicTemplate>,
    /// `plain` or `envelope` (the CloudEvents formats are in `cloudevents`).
    pub format: Format,
    /// The CloudEvents attributes, in the two CloudEvents formats.
    pub cloudevents: Option<CloudEvents>,
    pub null_payload: NullPayload,
    partition_by: PartitionBy,
    pub tracing_header: Arc<str>,
    /// `header_columns`: column → header name.
    pub extra_headers: Vec<(String, Arc<str>)>,
    pub headers: HeaderNames,
}

impl Rules {
    pub(super) fn new(
        config: &OutboxConfig,
        schema: String,
        table: String,
    ) -> Result<Rules, MappingError> {
        let partition_by = match config.partition_by.as_str() {
            PARTITION_BY_AGGREGATE_ID => PartitionBy::AggregateId,
            PARTITION_BY_KEY => PartitionBy::Key,
            _ => PartitionBy::Column,
        };
        let format = config.effective_format();
        let cloudevents = if format.is_cloudevents() {
            Some(CloudEvents::new(config, format, &schema, &table)?)
        } else {
            None
        };
        let columns = [
            Some(config.id_column.clone()),
            Some(config.aggregate_type_column.clone()),
            Some(config.aggregate_id_column.clone()),
            Some(config.type_column.clone()),
            Some(config.payload_column.clone()),
            config.key_column.clone(),
            config.timestamp_column.clone(),
            config.headers_column.clone(),
            config.tracing_column.clone(),
            config.topic_column.clone(),
            (partition_by == PartitionBy::Column).then(|| config.partition_by.clone()),
            format.is_cloudevents().then(|| {
                config
                    .cloudevents_subject_column
                    .clone()
                    .unwrap_or_else(|| config.aggregate_id_column.clone())
            }),
        ];
        let mut topic_overrides = HashMap::with_capacity(config.topic_overrides.len());
        for (aggregate_type, template) in &config.topic_overrides {
            topic_overrides.insert(aggregate_type.clone(), TopicTemplate::parse(template)?);
        }
        Ok(Rules {
            schema,
            table,
            columns,
            topic: TopicTemplate::parse(&config.topic)?,
            topic_overrides,
            format,
            cloudevents,
            null_payload: config.null_payload,
            partition_by,
            tracing_header: Arc::from(config.tracing_header.as_str()),
            extra_headers: config
                .header_columns
                .iter()
                .map(|(column, header)| (column.clone(), Arc::from(header.as_str())))
                .collect(),
            headers: HeaderNames::new(),
        })
    }

    pub(super) fn column(&self, role: Role) -> Option<&str> {
        self.columns[role.index()].as_deref()
    }

    /// The `i`-th extra column: the `header_columns`, then the CloudEvents extensions.
    pub(super) fn extra_column(&self, i: usize) -> Option<&str> {
        match self.extra_headers.get(i) {
            Some((column, _)) => Some(column),
            None => self
                .cloudevents
                .as_ref()?
                .extension_column(i - self.extra_headers.len()),
        }
    }

    /// How many extra columns [`Rules::extra_column`] names.
    pub(super) fn extra_columns(&self) -> usize {
        self.extra_headers.len() + self.cloudevents.as_ref().map_or(0, CloudEvents::extensions)
    }

    /// The record for one event, its fields read from `source`. Errors are checked in a fixed
    /// order (routing fields, topic, key, partition, timestamp, headers, payload), so the same
    /// bad event always reports the same first problem.
    pub(super) fn build(
        &self,
        source: &dyn Source,
        commit_time_ms: i64,
    ) -> Result<OutboxEvent, MappingError> {
        let id_value = self.required(source, Role::Id, UNKNOWN_ID)?;
        let id = self
            .utf8(&id_value.bytes, Role::Id, UNKNOWN_ID)?
            .to_string();
        let aggregate_type = self.required(source, Role::AggregateType, &id)?;
        let aggregate_id = self.required(source, Role::AggregateId, &id)?;
        let event_type = self.required(source, Role::Type, &id)?;
        let fields = EventFields {
            id: &id,
            aggregate_type: self.utf8(&aggregate_type.bytes, Role::AggregateType, &id)?,
            aggregate_id: self.utf8(&aggregate_id.bytes, Role::AggregateId, &id)?,
            event_type: self.utf8(&event_type.bytes, Role::Type, &id)?,
            table: &self.table,
            schema: &self.schema,
        };

        let topic = self.topic(source, &fields)?;
        let key = match self.column(Role::Key) {
            Some(_) => self.required(source, Role::Key, &id)?.bytes,
            None => id_value.bytes.clone(),
        };
        let partition_key = match self.partition_by {
            PartitionBy::AggregateId => Some(aggregate_id.bytes.clone()),
            PartitionBy::Key => None,
            PartitionBy::Column => source.get(self, Role::Partition, &id)?.map(|v| v.bytes),
        };
        let timestamp_ms = match source.get(self, Role::Timestamp, &id)? {
            Some(v) => self.timestamp_ms(&v, &id)?,
            None => commit_time_ms,
        };
        let (payload, headers) = match &self.cloudevents {
            Some(ce) => ce.build(self, source, &fields, timestamp_ms)?,
            None => {
                let headers = self.headers(
                    source,
                    &id,
                    Some([&id_value, &event_type, &aggregate_type, &aggregate_id]),
                )?;
                let payload = self.payload(source, &fields, timestamp_ms)?;
                (payload, headers)
            }
        };

        Ok(OutboxEvent {
            record: Record {
                topic,
                key,
                payload,
                headers,
                timestamp_ms: Some(timestamp_ms),
                partition: None,
                partition_key,
            },
            id,
        })
    }

    /// A configured field that must not be null.
    pub(super) fn required(
        &self,
        source: &dyn Source,
        role: Role,
        event_id: &str,
    ) -> Result<Value, MappingError> {
        source
            .get(self, role, event_id)?
            .ok_or_else(|| MappingError::NullColumn {
                event_id: event_id.to_string(),
                column: self.column(role).unwrap_or_default().to_string(),
            })
    }

    pub(super) fn utf8<'b>(
        &self,
        bytes: &'b [u8],
        role: Role,
        event_id: &str,
    ) -> Result<&'b str, MappingError> {
        std::str::from_utf8(bytes).map_err(|_| MappingError::InvalidUtf8 {
            event_id: event_id.to_string(),
            column: self.column(role).unwrap_or_default().to_string(),
        })
    }

    pub(super) fn invalid(
        &self,
        role: Role,
        event_id: &str,
        reason: impl Into<String>,
    ) -> MappingError {
        MappingError::InvalidValue {
            event_id: event_id.to_string(),
            column: self.column(role).unwrap_or_default().to_string(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::test_support::*;

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
        assert_eq!(err.event_id(), Some(ID));
    }

    #[test]
    fn custom_column_names_key_and_partition() {
        let m = mapping(|c| {
            c.id_column = "event_id".into();
            c.aggregate_type_column = "kind".into();
            c.aggregate_id_column = "entity".into();
            c.type_column = "name".into();
            c.payload_column = "body".into();
            c.key_column = Some("k".into());
            c.partition_by = "shard".into();
        });
        let cols = vec![
            ("body", 25, text("plain text")),
            ("shard", 25, text("s-1")),
            ("k", 25, text("the-key")),
            ("name", 25, text("Renamed")),
            ("entity", 25, text("e-9")),
            ("kind", 25, text("thing")),
            ("event_id", 25, text("ev-1")),
        ];
        let event = map_row(&m, &cols).unwrap();
        assert_eq!(event.id, "ev-1");
        assert_eq!(event.record.topic, "outbox.event.thing");
        assert_eq!(&event.record.key[..], b"the-key");
        assert_eq!(event.record.partition_key.as_deref(), Some(&b"s-1"[..]));
        assert_eq!(event.record.payload.as_deref(), Some(&b"plain text"[..]));
        assert_eq!(headers(&event.record)[0], ("id", &b"ev-1"[..]));

        // A null partition column falls back to the key's partition.
        let mut cols = cols;
        cols[1].2 = TupleValue::Null;
        assert_eq!(map_row(&m, &cols).unwrap().record.partition_key, None);
        // A configured key column must not be null.
        cols[2].2 = TupleValue::Null;
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::NullColumn { ref column, .. }) if column == "k"
        ));

        let by_key = mapping(|c| c.partition_by = "key".into());
        let event = map_row(&by_key, &debezium_columns(text("{}"))).unwrap();
        assert_eq!(event.record.partition_key, None);
    }
}
