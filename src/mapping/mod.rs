//! Outbox rows (and `pg_logical_emit_message` events) to Kafka records: which relations are
//! outboxes, which columns hold what, and how topic, key, partition, payload, timestamp and
//! headers are formed. Pure: no I/O.
//!
//! Columns are found by name in the latest Relation message, so column order and added
//! columns do not matter. Values are PostgreSQL's text output, sent byte-for-byte, except
//! `bytea`, whose `\x…` text form is decoded back to the raw bytes.
//!
//! A record is built from any *source* of named fields: a row of an outbox table
//! ([`BoundTable::to_event`]) or the JSON object of a transactional logical message
//! ([`OutboxMapping::message_event`]), whose members are named like the columns. One set of
//! rules (a [`Rules`] per table, one for messages) turns either into the same record:
//!
//! | record part | from |
//! |---|---|
//! | topic | `topic_column` if non-null, else `topic_overrides[aggregatetype]`, else `topic` |
//! | key | `key_column`, else the event id |
//! | partition | `partition_by`: murmur2 of the aggregate id (default), of the key, or of a column |
//! | value | the payload; in envelope mode a JSON object with the metadata; null → tombstone or error |
//! | timestamp | `timestamp_column` if non-null, else the commit time |
//! | headers | `id`, `type`, `aggregatetype`, `aggregateid`, then `header_columns`, the `headers_column` object, the tracing context |

pub mod partition;
mod record;

pub use record::Record;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use crate::config::{
    topic_name_problem, NullPayload, OutboxConfig, PARTITION_BY_AGGREGATE_ID, PARTITION_BY_KEY,
};
use crate::lsn::Lsn;
use crate::source::pgoutput::{Column, Message, Relation, Tuple, TupleValue};

/// Type OIDs whose text form the mapping interprets.
mod oid {
    pub const BYTEA: u32 = 17;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const JSON: u32 = 114;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const JSONB: u32 = 3802;
}

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
    #[error("event {event_id}: payload column `{column}` is null; set outbox.null_payload = \"tombstone\" to publish null payloads as tombstones")]
    NullPayload { event_id: String, column: String },
    #[error("event {event_id}: column `{column}`: {reason}")]
    InvalidValue {
        event_id: String,
        column: String,
        reason: String,
    },
    #[error("logical message with prefix `{prefix}` at {lsn}: {reason}; its content must be a JSON object with the outbox fields (id, aggregatetype, aggregateid, type, payload by default)")]
    InvalidMessage {
        prefix: String,
        lsn: Lsn,
        reason: String,
    },
}

impl MappingError {
    /// The event id the error names, when the event got that far.
    pub fn event_id(&self) -> Option<&str> {
        let id = match self {
            MappingError::NullColumn { event_id, .. }
            | MappingError::NotText { event_id, .. }
            | MappingError::InvalidUtf8 { event_id, .. }
            | MappingError::InvalidTopic { event_id, .. }
            | MappingError::NullPayload { event_id, .. }
            | MappingError::InvalidValue { event_id, .. } => event_id.as_str(),
            MappingError::MissingColumn { .. }
            | MappingError::UnknownPlaceholder(..)
            | MappingError::InvalidMessage { .. } => return None,
        };
        (id != UNKNOWN_ID).then_some(id)
    }
}

/// Stands for the event id in errors about the id column itself.
const UNKNOWN_ID: &str = "?";

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

/// What a mapped column (or message member) is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
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
}

impl Role {
    const ALL: [Role; 11] = [
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
    ];

    fn index(self) -> usize {
        self as usize
    }

    /// The config key naming this role's column, for error messages.
    fn setting(self) -> &'static str {
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
        }
    }
}

/// How a value's text is read, from its column's type (or its JSON kind in a message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Text,
    Json,
    /// Already decoded from `\x…` to the raw bytes.
    Bytea,
    Integer,
    Timestamp,
    TimestampTz,
}

impl Kind {
    fn of_type(type_oid: u32) -> Kind {
        match type_oid {
            oid::BYTEA => Kind::Bytea,
            oid::JSON | oid::JSONB => Kind::Json,
            oid::INT2 | oid::INT4 | oid::INT8 => Kind::Integer,
            oid::TIMESTAMP => Kind::Timestamp,
            oid::TIMESTAMPTZ => Kind::TimestampTz,
            _ => Kind::Text,
        }
    }
}

/// One field's value: its bytes (text form, bytea decoded) and how to read them.
#[derive(Debug, Clone)]
struct Value {
    bytes: Bytes,
    kind: Kind,
}

/// Header names, allocated once and shared by every record.
#[derive(Debug, Clone)]
struct HeaderNames {
    id: Arc<str>,
    event_type: Arc<str>,
    aggregate_type: Arc<str>,
    aggregate_id: Arc<str>,
}

impl HeaderNames {
    fn new() -> Self {
        HeaderNames {
            id: Arc::from("id"),
            event_type: Arc::from("type"),
            aggregate_type: Arc::from("aggregatetype"),
            aggregate_id: Arc::from("aggregateid"),
        }
    }
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
struct Rules {
    schema: String,
    /// The table name, or the message prefix.
    table: String,
    /// Column (or member) name per [`Role`]; `None` for an optional role not configured.
    columns: [Option<String>; Role::ALL.len()],
    topic: TopicTemplate,
    topic_overrides: HashMap<String, TopicTemplate>,
    envelope: bool,
    null_payload: NullPayload,
    partition_by: PartitionBy,
    tracing_header: Arc<str>,
    /// `header_columns`: column → header name.
    extra_headers: Vec<(String, Arc<str>)>,
    headers: HeaderNames,
}

impl Rules {
    fn new(config: &OutboxConfig, schema: String, table: String) -> Result<Rules, MappingError> {
        let partition_by = match config.partition_by.as_str() {
            PARTITION_BY_AGGREGATE_ID => PartitionBy::AggregateId,
            PARTITION_BY_KEY => PartitionBy::Key,
            _ => PartitionBy::Column,
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
            envelope: config.envelope,
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

    fn column(&self, role: Role) -> Option<&str> {
        self.columns[role.index()].as_deref()
    }

    /// The record for one event, its fields read from `source`.
    fn build(&self, source: &dyn Source, commit_time_ms: i64) -> Result<OutboxEvent, MappingError> {
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

        let topic = match source.get(self, Role::Topic, &id)? {
            Some(v) => self.utf8(&v.bytes, Role::Topic, &id)?.to_string(),
            None => self
                .topic_overrides
                .get(fields.aggregate_type)
                .unwrap_or(&self.topic)
                .render(&fields),
        };
        if let Some(reason) = topic_name_problem(&topic) {
            return Err(MappingError::InvalidTopic {
                event_id: id,
                topic,
                reason,
            });
        }

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

        let mut headers = vec![
            (self.headers.id.clone(), id_value.bytes.clone()),
            (self.headers.event_type.clone(), event_type.bytes.clone()),
            (
                self.headers.aggregate_type.clone(),
                aggregate_type.bytes.clone(),
            ),
            (
                self.headers.aggregate_id.clone(),
                aggregate_id.bytes.clone(),
            ),
        ];
        for (i, (_, header)) in self.extra_headers.iter().enumerate() {
            if let Some(v) = source.extra(self, i, &id)? {
                headers.push((header.clone(), v.bytes));
            }
        }
        if let Some(v) = source.get(self, Role::Headers, &id)? {
            self.json_headers(&v, &id, &mut headers)?;
        }
        if let Some(v) = source.get(self, Role::Tracing, &id)? {
            self.tracing_headers(&v, &id, &mut headers)?;
        }

        let payload = match source.get(self, Role::Payload, &id)? {
            Some(v) => Some(v),
            None if self.null_payload == NullPayload::Tombstone => None,
            None => {
                return Err(MappingError::NullPayload {
                    event_id: id,
                    column: self.column(Role::Payload).unwrap_or_default().to_string(),
                })
            }
        };
        let payload = match (self.envelope, payload) {
            (_, None) => None,
            (false, Some(v)) => Some(v.bytes),
            (true, Some(v)) => Some(envelope(&fields, timestamp_ms, &v)),
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
    fn required(
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

    fn utf8<'b>(
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

    fn invalid(&self, role: Role, event_id: &str, reason: impl Into<String>) -> MappingError {
        MappingError::InvalidValue {
            event_id: event_id.to_string(),
            column: self.column(role).unwrap_or_default().to_string(),
            reason: reason.into(),
        }
    }

    fn timestamp_ms(&self, value: &Value, event_id: &str) -> Result<i64, MappingError> {
        let text = self.utf8(&value.bytes, Role::Timestamp, event_id)?;
        let ms = match value.kind {
            Kind::Integer => text
                .trim()
                .parse::<i64>()
                .map_err(|_| format!("`{text}` is not an integer of milliseconds")),
            Kind::Bytea => Err("a bytea value is not a timestamp".to_string()),
            Kind::Json => Err("a JSON value is not a timestamp".to_string()),
            Kind::Text | Kind::Timestamp | Kind::TimestampTz => parse_timestamp_ms(text),
        }
        .map_err(|reason| self.invalid(Role::Timestamp, event_id, reason))?;
        if ms < 0 {
            return Err(self.invalid(
                Role::Timestamp,
                event_id,
                format!("{ms} ms is before 1970, which Kafka timestamps cannot express"),
            ));
        }
        Ok(ms)
    }

    /// One header per member of a JSON object.
    fn json_headers(
        &self,
        value: &Value,
        event_id: &str,
        headers: &mut Vec<(Arc<str>, Bytes)>,
    ) -> Result<(), MappingError> {
        let object: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(&value.bytes).map_err(|e| {
                self.invalid(
                    Role::Headers,
                    event_id,
                    format!("not a JSON object of headers ({e})"),
                )
            })?;
        for (name, v) in object {
            let bytes = match v {
                serde_json::Value::Null => continue,
                serde_json::Value::String(s) => Bytes::from(s),
                other => Bytes::from(other.to_string()),
            };
            headers.push((Arc::from(name.as_str()), bytes));
        }
        Ok(())
    }

    /// A W3C span context as one header, or a `key=value` list as one header per key.
    fn tracing_headers(
        &self,
        value: &Value,
        event_id: &str,
        headers: &mut Vec<(Arc<str>, Bytes)>,
    ) -> Result<(), MappingError> {
        let text = self.utf8(&value.bytes, Role::Tracing, event_id)?;
        if !text.contains('=') {
            let trimmed = text.trim();
            if !trimmed.is_empty() {
                headers.push((
                    self.tracing_header.clone(),
                    Bytes::copy_from_slice(trimmed.as_bytes()),
                ));
            }
            return Ok(());
        }
        for line in text.lines().map(str::trim) {
            if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
                continue;
            }
            let (name, v) = line.split_once('=').ok_or_else(|| {
                self.invalid(
                    Role::Tracing,
                    event_id,
                    format!("line `{line}` of the span context is not key=value"),
                )
            })?;
            headers.push((
                Arc::from(name.trim()),
                Bytes::copy_from_slice(v.trim().as_bytes()),
            ));
        }
        Ok(())
    }
}

/// Where an event's fields come from: a row, or a message's JSON object.
trait Source {
    /// The value of a role's field; `None` when null or when the role is not configured.
    fn get(&self, rules: &Rules, role: Role, event_id: &str)
        -> Result<Option<Value>, MappingError>;
    /// The value of the `i`-th `header_columns` entry.
    fn extra(&self, rules: &Rules, i: usize, event_id: &str)
        -> Result<Option<Value>, MappingError>;
}

/// The configured outbox: its tables, the message prefix, their mappings.
#[derive(Debug, Clone)]
pub struct OutboxMapping {
    tables: Vec<Arc<Rules>>,
    message_prefix: String,
    messages: Option<Arc<Rules>>,
    non_transactional: Arc<AtomicU64>,
}

/// The position and type of one mapped column.
#[derive(Debug, Clone, Copy)]
struct Slot {
    index: usize,
    kind: Kind,
}

/// An outbox table as the current Relation message describes it: column positions.
#[derive(Debug, Clone)]
pub struct BoundTable {
    rules: Arc<Rules>,
    slots: [Option<Slot>; Role::ALL.len()],
    extra: Vec<Slot>,
}

/// An event ready for Kafka, with its id kept for logs and dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub id: String,
    pub record: Record,
}

/// What to do with a logical decoding message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageRoute {
    /// Transactional, with the configured prefix: publish [`OutboxMapping::message_event`].
    Event,
    /// The configured prefix but not transactional: not an outbox event (it may belong to a
    /// transaction that rolled back). Skip it with a warning; this many were skipped so far.
    NonTransactional { rejected_total: u64 },
    /// Another prefix, or messages are off: not ours.
    Ignored,
}

impl OutboxMapping {
    pub fn new(config: &OutboxConfig) -> Result<Self, MappingError> {
        let mut tables = Vec::new();
        for table_config in config.table_configs() {
            let (schema, table) = table_config.schema_and_table();
            tables.push(Arc::new(Rules::new(&table_config, schema, table)?));
        }
        let messages = if config.messages_enabled() {
            Some(Arc::new(Rules::new(
                config,
                String::new(),
                config.message_prefix.clone().unwrap_or_default(),
            )?))
        } else {
            None
        };
        Ok(OutboxMapping {
            tables,
            message_prefix: config.message_prefix.clone().unwrap_or_default(),
            messages,
            non_transactional: Arc::new(AtomicU64::new(0)),
        })
    }

    /// `None` when the relation is not an outbox table; otherwise its column positions.
    pub fn bind(&self, relation: &Relation) -> Option<Result<BoundTable, MappingError>> {
        let rules = self
            .tables
            .iter()
            .find(|r| r.schema == relation.namespace && r.table == relation.name)?;
        Some(bind_columns(rules, relation))
    }

    /// Like [`OutboxMapping::bind`], but under another name: a partition of a partitioned
    /// outbox, bound with the configuration of its root `schema.table` (the table the topic
    /// templates and headers name). Columns are looked up by name in `relation`, so a leaf
    /// whose columns are ordered differently from its root still maps correctly. `None` when
    /// `schema.table` is not a configured outbox table.
    pub fn bind_as(
        &self,
        relation: &Relation,
        schema: &str,
        table: &str,
    ) -> Option<Result<BoundTable, MappingError>> {
        let rules = self
            .tables
            .iter()
            .find(|r| r.schema == schema && r.table == table)?;
        Some(bind_columns(rules, relation))
    }

    /// True when `pg_logical_emit_message` events are read (pgoutput option `messages`).
    pub fn messages_enabled(&self) -> bool {
        self.messages.is_some()
    }

    /// Whether a logical message is an outbox event. Counts non-transactional ones with our
    /// prefix ([`OutboxMapping::non_transactional_messages`]).
    pub fn route_message(&self, message: &Message) -> MessageRoute {
        if self.messages.is_none() || message.prefix != self.message_prefix {
            return MessageRoute::Ignored;
        }
        if message.transactional {
            return MessageRoute::Event;
        }
        let rejected_total = self.non_transactional.fetch_add(1, Ordering::Relaxed) + 1;
        MessageRoute::NonTransactional { rejected_total }
    }

    /// Non-transactional messages with the configured prefix skipped so far.
    pub fn non_transactional_messages(&self) -> u64 {
        self.non_transactional.load(Ordering::Relaxed)
    }

    /// The record for a transactional message with the configured prefix
    /// ([`MessageRoute::Event`]). `commit_time_ms` is its transaction's commit time.
    pub fn message_event(
        &self,
        message: &Message,
        commit_time_ms: i64,
    ) -> Result<OutboxEvent, MappingError> {
        let invalid = |reason: String| MappingError::InvalidMessage {
            prefix: message.prefix.clone(),
            lsn: message.lsn,
            reason,
        };
        let rules = self
            .messages
            .as_ref()
            .ok_or_else(|| invalid("outbox.message_prefix is not set".into()))?;
        let members = json::object_members(&message.content).map_err(invalid)?;
        rules.build(&MessageSource { members }, commit_time_ms)
    }
}

fn bind_columns(rules: &Arc<Rules>, relation: &Relation) -> Result<BoundTable, MappingError> {
    let find = |column: &str, setting: &'static str| {
        relation
            .columns
            .iter()
            .position(|c| c.name == column)
            .map(|index| Slot {
                index,
                kind: Kind::of_type(relation.columns[index].type_oid),
            })
            .ok_or_else(|| MappingError::MissingColumn {
                table: format!("{}.{}", relation.namespace, relation.name),
                column: column.to_string(),
                setting,
            })
    };
    let mut slots = [None; Role::ALL.len()];
    for role in Role::ALL {
        if let Some(column) = rules.column(role) {
            slots[role.index()] = Some(find(column, role.setting())?);
        }
    }
    let extra = rules
        .extra_headers
        .iter()
        .map(|(column, _)| find(column, "header_columns"))
        .collect::<Result<_, _>>()?;
    Ok(BoundTable {
        rules: rules.clone(),
        slots,
        extra,
    })
}

impl BoundTable {
    /// Builds the Kafka record for one inserted row.
    ///
    /// `commit_time_ms` (the transaction's commit time) becomes the record timestamp unless a
    /// `timestamp_column` is configured and non-null.
    pub fn to_event(
        &self,
        tuple: &Tuple,
        commit_time_ms: i64,
    ) -> Result<OutboxEvent, MappingError> {
        self.rules
            .build(&RowSource { bound: self, tuple }, commit_time_ms)
    }
}

struct RowSource<'a> {
    bound: &'a BoundTable,
    tuple: &'a Tuple,
}

impl RowSource<'_> {
    fn value(
        &self,
        slot: Option<Slot>,
        column: &str,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        let Some(slot) = slot else {
            return Ok(None);
        };
        match self.tuple.get(slot.index) {
            Some(TupleValue::Text(bytes)) => {
                let bytes = if slot.kind == Kind::Bytea {
                    decode_bytea(bytes).map_err(|reason| MappingError::InvalidValue {
                        event_id: event_id.to_string(),
                        column: column.to_string(),
                        reason,
                    })?
                } else {
                    bytes.clone()
                };
                Ok(Some(Value {
                    bytes,
                    kind: slot.kind,
                }))
            }
            Some(TupleValue::Null) | Some(TupleValue::UnchangedToast) | None => Ok(None),
            Some(TupleValue::Binary(_)) => Err(MappingError::NotText {
                event_id: event_id.to_string(),
                column: column.to_string(),
            }),
        }
    }
}

impl Source for RowSource<'_> {
    fn get(
        &self,
        rules: &Rules,
        role: Role,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        let column = rules.column(role).unwrap_or_default();
        self.value(self.bound.slots[role.index()], column, event_id)
    }

    fn extra(
        &self,
        rules: &Rules,
        i: usize,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        let column = rules.extra_headers.get(i).map_or("", |(c, _)| c.as_str());
        self.value(self.bound.extra.get(i).copied(), column, event_id)
    }
}

/// A message's JSON members, named like the columns.
struct MessageSource {
    members: Vec<(String, json::Member)>,
}

impl MessageSource {
    fn member(
        &self,
        name: &str,
        is_payload: bool,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        let Some((_, member)) = self.members.iter().find(|(n, _)| n == name) else {
            return Ok(None);
        };
        let value = match member.kind {
            json::Kind::Null => None,
            // The payload is the member's JSON text, as a jsonb column's would be.
            _ if is_payload => Some(Value {
                bytes: member.raw.clone(),
                kind: Kind::Json,
            }),
            json::Kind::String => {
                let text: String = serde_json::from_slice(&member.raw).map_err(|e| {
                    MappingError::InvalidValue {
                        event_id: event_id.to_string(),
                        column: name.to_string(),
                        reason: e.to_string(),
                    }
                })?;
                Some(Value {
                    bytes: Bytes::from(text),
                    kind: Kind::Text,
                })
            }
            json::Kind::Number => Some(Value {
                bytes: member.raw.clone(),
                kind: Kind::Integer,
            }),
            json::Kind::Bool => Some(Value {
                bytes: member.raw.clone(),
                kind: Kind::Text,
            }),
            json::Kind::Object | json::Kind::Array => Some(Value {
                bytes: member.raw.clone(),
                kind: Kind::Json,
            }),
        };
        Ok(value)
    }
}

impl Source for MessageSource {
    fn get(
        &self,
        rules: &Rules,
        role: Role,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        match rules.column(role) {
            Some(name) => self.member(name, role == Role::Payload, event_id),
            None => Ok(None),
        }
    }

    fn extra(
        &self,
        rules: &Rules,
        i: usize,
        event_id: &str,
    ) -> Result<Option<Value>, MappingError> {
        match rules.extra_headers.get(i) {
            Some((name, _)) => self.member(name, false, event_id),
            None => Ok(None),
        }
    }
}

/// A logical message as a one-column row (`content`, json) of a relation named after its
/// prefix in namespace `pg_logical_emit_message`: lets row-shaped consumers such as dead
/// letters carry it.
pub fn message_as_row(message: &Message) -> (Relation, Tuple) {
    let relation = Relation {
        id: 0,
        namespace: "pg_logical_emit_message".into(),
        name: message.prefix.clone(),
        replica_identity: b'n',
        columns: vec![Column {
            flags: 0,
            name: "content".into(),
            type_oid: oid::JSON,
            type_modifier: -1,
        }],
    };
    (
        relation,
        Tuple(vec![TupleValue::Text(message.content.clone())]),
    )
}

/// The envelope: metadata and payload in one JSON object.
fn envelope(fields: &EventFields<'_>, timestamp_ms: i64, payload: &Value) -> Bytes {
    fn member(out: &mut Vec<u8>, name: &str, value: &str) {
        out.push(if out.is_empty() { b'{' } else { b',' });
        json::write_string(out, name);
        out.push(b':');
        json::write_string(out, value);
    }
    let mut out = Vec::with_capacity(128 + payload.bytes.len() * 4 / 3);
    member(&mut out, "id", fields.id);
    member(&mut out, "aggregatetype", fields.aggregate_type);
    member(&mut out, "aggregateid", fields.aggregate_id);
    member(&mut out, "type", fields.event_type);
    out.extend_from_slice(format!(",\"timestamp\":{timestamp_ms},\"payload\":").as_bytes());
    match payload.kind {
        Kind::Json => out.extend_from_slice(&payload.bytes),
        Kind::Bytea => {
            out.push(b'"');
            out.extend_from_slice(base64(&payload.bytes).as_bytes());
            out.push(b'"');
        }
        Kind::Text | Kind::Integer | Kind::Timestamp | Kind::TimestampTz => {
            json::write_string(&mut out, &String::from_utf8_lossy(&payload.bytes))
        }
    }
    out.push(b'}');
    Bytes::from(out)
}

/// Standard base64 with padding (RFC 4648 §4).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 0x3f) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// bytea's text output back to its bytes: the `hex` format (`\x0aff…`, the default) or the
/// `escape` format (`\\` and `\ooo` octal escapes).
fn decode_bytea(text: &[u8]) -> Result<Bytes, String> {
    if let Some(hex) = text.strip_prefix(b"\\x") {
        if hex.len() % 2 != 0 {
            return Err("bytea hex text has an odd number of digits".into());
        }
        let digit = |b: u8| match b {
            b'0'..=b'9' => Ok(b - b'0'),
            b'a'..=b'f' => Ok(b - b'a' + 10),
            b'A'..=b'F' => Ok(b - b'A' + 10),
            _ => Err(format!(
                "`{}` is not a hex digit in bytea text",
                b.escape_ascii()
            )),
        };
        return hex
            .chunks_exact(2)
            .map(|pair| Ok(digit(pair[0])? << 4 | digit(pair[1])?))
            .collect::<Result<Vec<u8>, String>>()
            .map(Bytes::from);
    }
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] != b'\\' {
            out.push(text[i]);
            i += 1;
            continue;
        }
        if text.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
            continue;
        }
        match text.get(i + 1..i + 4) {
            Some(&[a, b, c]) if [a, b, c].iter().all(|d| (b'0'..=b'7').contains(d)) => {
                let n = u32::from(a - b'0') << 6 | u32::from(b - b'0') << 3 | u32::from(c - b'0');
                out.push(u8::try_from(n).map_err(|_| "bytea escape out of range".to_string())?);
                i += 4;
            }
            _ => return Err("bytea escape text has a bad `\\` sequence".into()),
        }
    }
    Ok(Bytes::from(out))
}

/// Milliseconds since the Unix epoch of PostgreSQL's ISO text output of `timestamptz`
/// (`2026-01-01 12:00:00.123456+02`, `+05:30`) or `timestamp` (taken as UTC); also accepts
/// `T` between date and time and a `Z` suffix. Fractions below a millisecond are truncated.
pub fn parse_timestamp_ms(text: &str) -> Result<i64, String> {
    let bad = || format!("`{text}` is not an ISO timestamp (PostgreSQL DateStyle ISO)");
    let s = text.trim();
    if s.ends_with(" BC") {
        return Err(format!("`{text}` is before the common era"));
    }
    if s.eq_ignore_ascii_case("infinity") || s.eq_ignore_ascii_case("-infinity") {
        return Err(format!("`{text}` has no Kafka timestamp"));
    }
    let split = s.find([' ', 'T']).ok_or_else(bad)?;
    let (date, time) = (&s[..split], &s[split + 1..]);
    let mut parts = date.splitn(3, '-');
    let mut number = |max: i64| -> Result<i64, String> {
        let part = parts.next().ok_or_else(bad)?;
        let n: i64 = part.parse().map_err(|_| bad())?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) || n > max {
            return Err(bad());
        }
        Ok(n)
    };
    let (year, month, day) = (number(294_276)?, number(12)?, number(31)?);
    if month == 0 || day == 0 {
        return Err(bad());
    }

    let zone_at = time.find(['+', '-', 'Z']).unwrap_or(time.len());
    let (clock, zone) = time.split_at(zone_at);
    let (hms, fraction) = clock.split_once('.').unwrap_or((clock, ""));
    let hms: Vec<i64> = hms
        .split(':')
        .map(|p| p.parse::<i64>().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
    let [hour, minute, second] = hms[..] else {
        return Err(bad());
    };
    if !(0..=24).contains(&hour) || !(0..60).contains(&minute) || !(0..=60).contains(&second) {
        return Err(bad());
    }
    if !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let millis = fraction
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(3)
        .fold(0, |n, d| n * 10 + i64::from(d - b'0'));

    let offset_s = match zone.as_bytes().first() {
        None | Some(b'Z') if zone.len() <= 1 => 0,
        Some(sign @ (b'+' | b'-')) => {
            let parts: Vec<i64> = zone[1..]
                .split(':')
                .map(|p| p.parse::<i64>().map_err(|_| bad()))
                .collect::<Result<_, _>>()?;
            let seconds = match parts[..] {
                [h] => h * 3600,
                [h, m] => h * 3600 + m * 60,
                [h, m, s] => h * 3600 + m * 60 + s,
                _ => return Err(bad()),
            };
            if *sign == b'-' {
                -seconds
            } else {
                seconds
            }
        }
        _ => return Err(bad()),
    };
    let days = days_from_civil(year, month, day);
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    Ok(seconds * 1000 + millis)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The little JSON the mapping needs: the members of a top-level object with their raw text
/// (so a payload is forwarded byte-for-byte), and string writing.
mod json {
    use bytes::Bytes;

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Kind {
        Null,
        Bool,
        Number,
        String,
        Object,
        Array,
    }

    /// One member's value: its JSON text (a slice of the input) and kind.
    #[derive(Debug, Clone)]
    pub struct Member {
        pub raw: Bytes,
        pub kind: Kind,
    }

    /// The members of the JSON object `text`, in order, values as raw slices of `text`.
    pub fn object_members(text: &Bytes) -> Result<Vec<(String, Member)>, String> {
        // Validate first, so the scanner below only ever walks well-formed JSON.
        serde_json::from_slice::<serde::de::IgnoredAny>(text)
            .map_err(|e| format!("content is not JSON ({e})"))?;
        let b = &text[..];
        let mut i = skip_ws(b, 0);
        if b.get(i) != Some(&b'{') {
            return Err("content is not a JSON object".into());
        }
        i = skip_ws(b, i + 1);
        let mut members = Vec::new();
        if b.get(i) == Some(&b'}') {
            return Ok(members);
        }
        loop {
            let key_end = string_end(b, i);
            let key: String = serde_json::from_slice(&b[i..key_end])
                .map_err(|e| format!("bad member name ({e})"))?;
            i = skip_ws(b, key_end);
            // `:`
            i = skip_ws(b, i + 1);
            let end = value_end(b, i);
            let kind = match b[i] {
                b'n' => Kind::Null,
                b't' | b'f' => Kind::Bool,
                b'"' => Kind::String,
                b'{' => Kind::Object,
                b'[' => Kind::Array,
                _ => Kind::Number,
            };
            members.push((
                key,
                Member {
                    raw: text.slice(i..end),
                    kind,
                },
            ));
            i = skip_ws(b, end);
            match b.get(i) {
                Some(b',') => i = skip_ws(b, i + 1),
                _ => return Ok(members),
            }
        }
    }

    fn skip_ws(b: &[u8], mut i: usize) -> usize {
        while matches!(b.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            i += 1;
        }
        i
    }

    /// `b[i]` is `"`; the index after the closing quote.
    fn string_end(b: &[u8], mut i: usize) -> usize {
        i += 1;
        while i < b.len() {
            match b[i] {
                b'\\' => i += 2,
                b'"' => return i + 1,
                _ => i += 1,
            }
        }
        b.len()
    }

    /// The index after the value starting at `b[i]`.
    fn value_end(b: &[u8], i: usize) -> usize {
        match b[i] {
            b'"' => string_end(b, i),
            b'{' | b'[' => {
                let mut depth = 0usize;
                let mut j = i;
                while j < b.len() {
                    match b[j] {
                        b'"' => {
                            j = string_end(b, j);
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return j + 1;
                            }
                        }
                        _ => {}
                    }
                    j += 1;
                }
                b.len()
            }
            _ => {
                let mut j = i;
                while j < b.len()
                    && !matches!(b[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                {
                    j += 1;
                }
                j
            }
        }
    }

    /// Appends `s` as a JSON string.
    pub fn write_string(out: &mut Vec<u8>, s: &str) {
        // Writing a &str to a Vec cannot fail.
        let _ = serde_json::to_writer(out, s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, type_oid: u32) -> Column {
        Column {
            flags: 0,
            name: name.to_string(),
            type_oid,
            type_modifier: -1,
        }
    }

    fn relation_of(columns: &[(&str, u32)]) -> Relation {
        Relation {
            id: 1,
            namespace: "public".into(),
            name: "outbox".into(),
            replica_identity: b'd',
            columns: columns.iter().map(|(n, t)| column(n, *t)).collect(),
        }
    }

    fn relation(columns: &[&str]) -> Relation {
        relation_of(&columns.iter().map(|c| (*c, 25)).collect::<Vec<_>>())
    }

    fn text(s: &str) -> TupleValue {
        TupleValue::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    fn default_mapping() -> OutboxMapping {
        OutboxMapping::new(&OutboxConfig::default()).unwrap()
    }

    fn mapping(edit: impl FnOnce(&mut OutboxConfig)) -> OutboxMapping {
        let mut config = OutboxConfig::default();
        edit(&mut config);
        OutboxMapping::new(&config).unwrap()
    }

    const ID: &str = "7c9e6679-7425-40de-944b-e07fc1f90ae7";

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
            text(ID),
            aggregate_type,
            text("42"),
            text("OrderCreated"),
            payload,
            text("2026-01-01 00:00:00+00"),
        ])
    }

    /// Binds `columns` (name, type, value) under `mapping` and maps the row.
    fn map_row(
        mapping: &OutboxMapping,
        columns: &[(&str, u32, TupleValue)],
    ) -> Result<OutboxEvent, MappingError> {
        let rel = relation_of(&columns.iter().map(|(n, t, _)| (*n, *t)).collect::<Vec<_>>());
        let tuple = Tuple(columns.iter().map(|(_, _, v)| v.clone()).collect());
        mapping.bind(&rel).unwrap()?.to_event(&tuple, 1234)
    }

    #[test]
    fn a_partition_binds_as_its_root_by_column_name() {
        let m = mapping(|c| c.topic = "{schema}.{table}.{aggregatetype}".into());
        // A leaf attached with its columns in another order than the root's.
        let mut leaf = relation(&[
            "created_at",
            "payload",
            "type",
            "aggregateid",
            "aggregatetype",
            "id",
        ]);
        leaf.name = "outbox_2026_01".into();
        assert!(m.bind(&leaf).is_none(), "a leaf is not the outbox by name");
        assert!(m.bind_as(&leaf, "public", "other").is_none());
        let bound = m.bind_as(&leaf, "public", "outbox").unwrap().unwrap();
        let tuple = Tuple(vec![
            text("2026-01-01 00:00:00+00"),
            text("{}"),
            text("OrderCreated"),
            text("42"),
            text("order"),
            text(ID),
        ]);
        let event = bound.to_event(&tuple, 1).unwrap();
        assert_eq!(event.id, ID);
        assert_eq!(event.record.topic, "public.outbox.order");
    }

    fn debezium_columns(payload: TupleValue) -> Vec<(&'static str, u32, TupleValue)> {
        vec![
            ("id", 2950, text(ID)),
            ("aggregatetype", 1043, text("order")),
            ("aggregateid", 1043, text("42")),
            ("type", 1043, text("OrderCreated")),
            ("payload", oid::JSONB, payload),
        ]
    }

    fn headers(record: &Record) -> Vec<(&str, &[u8])> {
        record.headers.iter().map(|(k, v)| (&**k, &v[..])).collect()
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
        assert_eq!(event.id, ID);
        assert_eq!(r.topic, "outbox.event.order");
        assert_eq!(&r.key[..], ID.as_bytes());
        assert_eq!(r.payload.as_deref(), Some(&br#"{"total": 3}"#[..]));
        assert_eq!(r.timestamp_ms, Some(1234));
        assert_eq!(r.partition, None);
        assert_eq!(r.partition_key.as_deref(), Some(&b"42"[..]));
        assert_eq!(
            headers(r),
            vec![
                ("id", ID.as_bytes()),
                ("type", &b"OrderCreated"[..]),
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
        other.name = "outbox".into();
        other.namespace = "sales".into();
        assert!(default_mapping().bind(&other).is_none());
    }

    #[test]
    fn missing_column_names_the_setting() {
        let err = default_mapping()
            .bind(&relation(&["id", "aggregatetype", "type", "payload"]))
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("aggregate_id_column"), "{err}");

        let m = mapping(|c| c.timestamp_column = Some("occurred_at".into()));
        let err = m.bind(&relation(&COLUMNS)).unwrap().unwrap_err();
        assert!(err.to_string().contains("timestamp_column"), "{err}");
        let m = mapping(|c| {
            c.header_columns.insert("tenant".into(), "x-tenant".into());
        });
        let err = m.bind(&relation(&COLUMNS)).unwrap().unwrap_err();
        assert!(err.to_string().contains("header_columns"), "{err}");
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
        assert_eq!(err.event_id(), Some(ID));
    }

    #[test]
    fn null_payload_is_an_error_unless_tombstones_are_configured() {
        let bound = default_mapping()
            .bind(&relation(&COLUMNS))
            .unwrap()
            .unwrap();
        let err = bound
            .to_event(&row(text("order"), TupleValue::Null), 0)
            .unwrap_err();
        assert!(matches!(err, MappingError::NullPayload { .. }), "{err}");
        assert!(err.to_string().contains("null_payload"), "{err}");
        assert_eq!(err.event_id(), Some(ID));

        let m = mapping(|c| c.null_payload = NullPayload::Tombstone);
        let bound = m.bind(&relation(&COLUMNS)).unwrap().unwrap();
        let event = bound
            .to_event(&row(text("order"), TupleValue::Null), 0)
            .unwrap();
        assert_eq!(event.record.payload, None);
        assert_eq!(&event.record.key[..], ID.as_bytes());
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
        let long = "x".repeat(240);
        let err = bound
            .to_event(&row(text(&long), text("{}")), 0)
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
    fn topic_overrides_and_topic_column_choose_the_topic() {
        let m = mapping(|c| {
            c.topic = "{schema}.{table}.{aggregatetype}.{type}".into();
            c.topic_overrides
                .insert("customer".into(), "crm.{aggregateid}".into());
            c.topic_column = Some("destination".into());
        });
        let mut cols = debezium_columns(text("{}"));
        cols.push(("destination", 25, TupleValue::Null));
        assert_eq!(
            map_row(&m, &cols).unwrap().record.topic,
            "public.outbox.order.OrderCreated"
        );
        cols[1].2 = text("customer");
        assert_eq!(map_row(&m, &cols).unwrap().record.topic, "crm.42");
        cols[5].2 = text("explicit.topic");
        assert_eq!(map_row(&m, &cols).unwrap().record.topic, "explicit.topic");
        cols[5].2 = text("not a topic");
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::InvalidTopic { .. })
        ));
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

    #[test]
    fn payload_types_are_sent_byte_for_byte() {
        let m = default_mapping();
        for (type_oid, sent, expected) in [
            (oid::JSONB, &br#"{"a": 1}"#[..], &br#"{"a": 1}"#[..]),
            (oid::JSON, b"{ \"a\" :1 }", b"{ \"a\" :1 }"),
            (25, "ünï\ttext".as_bytes(), "ünï\ttext".as_bytes()),
            (oid::BYTEA, b"\\x00ff0a5c78", b"\x00\xff\x0a\x5c\x78"),
        ] {
            let mut cols = debezium_columns(TupleValue::Text(Bytes::copy_from_slice(sent)));
            cols[4].1 = type_oid;
            let event = map_row(&m, &cols).unwrap();
            assert_eq!(
                event.record.payload.as_deref(),
                Some(expected),
                "type {type_oid}"
            );
        }
        let mut cols = debezium_columns(text("\\x0"));
        cols[4].1 = oid::BYTEA;
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::InvalidValue { .. })
        ));
        let mut cols = debezium_columns(TupleValue::Binary(Bytes::from_static(b"x")));
        cols[4].1 = oid::BYTEA;
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::NotText { .. })
        ));
    }

    #[test]
    fn bytea_escape_format_is_decoded() {
        assert_eq!(
            &decode_bytea(b"ab\\\\c\\000\\377").unwrap()[..],
            b"ab\\c\x00\xff"
        );
        assert!(decode_bytea(b"a\\9").is_err());
        assert_eq!(&decode_bytea(b"\\x").unwrap()[..], b"");
        assert_eq!(
            &decode_bytea(b"\\xDEADbeef").unwrap()[..],
            b"\xde\xad\xbe\xef"
        );
    }

    #[test]
    fn timestamp_column_sets_the_record_timestamp() {
        let m = mapping(|c| c.timestamp_column = Some("occurred_at".into()));
        let mut cols = debezium_columns(text("{}"));
        cols.push((
            "occurred_at",
            oid::TIMESTAMPTZ,
            text("2026-03-01 12:30:45.678901+02"),
        ));
        let event = map_row(&m, &cols).unwrap();
        // 2026-03-01T10:30:45.678Z
        assert_eq!(event.record.timestamp_ms, Some(1_772_361_045_678));
        cols[5].2 = TupleValue::Null;
        assert_eq!(map_row(&m, &cols).unwrap().record.timestamp_ms, Some(1234));
        cols[5] = ("occurred_at", oid::INT8, text("1700000000123"));
        assert_eq!(
            map_row(&m, &cols).unwrap().record.timestamp_ms,
            Some(1_700_000_000_123)
        );
        cols[5] = ("occurred_at", oid::TIMESTAMPTZ, text("infinity"));
        assert!(matches!(
            map_row(&m, &cols),
            Err(MappingError::InvalidValue { .. })
        ));
    }

    #[test]
    fn timestamps_parse_like_postgres_prints_them() {
        let cases = [
            ("1970-01-01 00:00:00+00", 0),
            ("1970-01-01 00:00:00", 0),
            ("1970-01-01T00:00:01Z", 1000),
            ("2000-02-29 23:59:59.999+00", 951_868_799_999),
            ("2026-03-01 12:30:45.5+05:30", 1_772_348_445_500),
            ("2026-03-01 12:30:45-03:30:15", 1_772_380_860_000),
            ("1969-12-31 23:59:59+00", -1000),
            ("2024-12-31 23:59:59.1234567+00", 1_735_689_599_123),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_timestamp_ms(text), Ok(expected), "{text}");
        }
        for bad in [
            "",
            "yesterday",
            "2026-13-01 00:00:00",
            "2026-01-01",
            "2026-01-01 25:00:00",
            "2026-01-01 00:00",
            "0001-01-01 00:00:00 BC",
            "-infinity",
            "2026-01-01 00:00:00+x",
        ] {
            assert!(parse_timestamp_ms(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn headers_column_and_extra_columns_become_headers() {
        let m = mapping(|c| {
            c.headers_column = Some("headers".into());
            c.header_columns.insert("tenant".into(), "x-tenant".into());
            c.header_columns.insert("region".into(), "x-region".into());
        });
        let mut cols = debezium_columns(text("{}"));
        cols.push(("tenant", 25, text("acme")));
        cols.push(("region", 25, TupleValue::Null));
        cols.push((
            "headers",
            oid::JSONB,
            text(r#"{"n": 1, "s": "v", "nothing": null, "o": {"a": [1]}}"#),
        ));
        let event = map_row(&m, &cols).unwrap();
        assert_eq!(
            headers(&event.record)[4..],
            [
                ("x-tenant", &b"acme"[..]),
                ("n", b"1"),
                ("o", br#"{"a":[1]}"#),
                ("s", b"v"),
            ]
        );
        cols[7].2 = text("[1, 2]");
        let err = map_row(&m, &cols).unwrap_err();
        assert!(err.to_string().contains("headers"), "{err}");
    }

    #[test]
    fn tracing_context_becomes_headers() {
        let m = mapping(|c| c.tracing_column = Some("tracingspancontext".into()));
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut cols = debezium_columns(text("{}"));
        cols.push(("tracingspancontext", 25, text(traceparent)));
        let event = map_row(&m, &cols).unwrap();
        assert_eq!(
            headers(&event.record)[4..],
            [("traceparent", traceparent.as_bytes())]
        );
        let properties = format!("#Mon Jan 01\ntraceparent={traceparent}\ntracestate=k=v\n");
        cols[5].2 = text(&properties);
        let event = map_row(&m, &cols).unwrap();
        assert_eq!(
            headers(&event.record)[4..],
            [
                ("traceparent", traceparent.as_bytes()),
                ("tracestate", &b"k=v"[..])
            ]
        );
    }

    #[test]
    fn envelope_wraps_metadata_and_payload() {
        let m = mapping(|c| c.envelope = true);
        let event = map_row(&m, &debezium_columns(text(r#"{"total": 3}"#))).unwrap();
        let expected = format!(
            r#"{{"id":"{ID}","aggregatetype":"order","aggregateid":"42","type":"OrderCreated","timestamp":1234,"payload":{{"total": 3}}}}"#
        );
        assert_eq!(event.record.payload.as_deref(), Some(expected.as_bytes()));

        let mut cols = debezium_columns(text("say \"hi\""));
        cols[4].1 = 25;
        let event = map_row(&m, &cols).unwrap();
        let value: serde_json::Value =
            serde_json::from_slice(event.record.payload.as_deref().unwrap()).unwrap();
        assert_eq!(value["payload"], "say \"hi\"");

        cols[4] = ("payload", oid::BYTEA, text("\\x00ff10"));
        let event = map_row(&m, &cols).unwrap();
        let value: serde_json::Value =
            serde_json::from_slice(event.record.payload.as_deref().unwrap()).unwrap();
        assert_eq!(value["payload"], "AP8Q");
    }

    #[test]
    fn base64_pads_like_rfc_4648() {
        for (input, expected) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input), expected);
        }
    }

    #[test]
    fn several_tables_each_with_its_own_mapping() {
        let mut config = OutboxConfig::default();
        config.tables.push(crate::config::OutboxTableConfig {
            table: "tenant_b.events".into(),
            topic: Some("b.{aggregatetype}".into()),
            aggregate_id_column: Some("entity".into()),
            ..Default::default()
        });
        let m = OutboxMapping::new(&config).unwrap();
        let a = map_row(&m, &debezium_columns(text("{}"))).unwrap();
        assert_eq!(a.record.topic, "outbox.event.order");

        let mut rel = relation(&["id", "aggregatetype", "entity", "type", "payload"]);
        rel.namespace = "tenant_b".into();
        rel.name = "events".into();
        let tuple = Tuple(vec![
            text("b-1"),
            text("invoice"),
            text("inv-7"),
            text("Paid"),
            text("{}"),
        ]);
        let event = m.bind(&rel).unwrap().unwrap().to_event(&tuple, 5).unwrap();
        assert_eq!(event.record.topic, "b.invoice");
        assert_eq!(event.record.partition_key.as_deref(), Some(&b"inv-7"[..]));
    }

    fn message(transactional: bool, prefix: &str, content: &str) -> Message {
        Message {
            transactional,
            lsn: Lsn(0x1_0000_0010),
            prefix: prefix.into(),
            content: Bytes::copy_from_slice(content.as_bytes()),
        }
    }

    #[test]
    fn transactional_messages_with_the_prefix_become_events() {
        let m = mapping(|c| c.message_prefix = Some("outbox".into()));
        assert!(m.messages_enabled());
        let content = r#" { "id" : "m-1", "aggregatetype": "order", "aggregateid": 42,
            "type": "Shipped", "payload": {"b": [1, "}"], "a": "x"}, "extra": null } "#;
        let msg = message(true, "outbox", content);
        assert_eq!(m.route_message(&msg), MessageRoute::Event);
        let event = m.message_event(&msg, 99).unwrap();
        assert_eq!(event.id, "m-1");
        assert_eq!(event.record.topic, "outbox.event.order");
        assert_eq!(&event.record.key[..], b"m-1");
        assert_eq!(event.record.partition_key.as_deref(), Some(&b"42"[..]));
        assert_eq!(
            event.record.payload.as_deref(),
            Some(&br#"{"b": [1, "}"], "a": "x"}"#[..])
        );
        assert_eq!(event.record.timestamp_ms, Some(99));
        assert_eq!(headers(&event.record)[1], ("type", &b"Shipped"[..]));

        assert_eq!(
            m.route_message(&message(true, "other", content)),
            MessageRoute::Ignored
        );
        assert_eq!(
            m.route_message(&message(false, "outbox", content)),
            MessageRoute::NonTransactional { rejected_total: 1 }
        );
        assert_eq!(
            m.route_message(&message(false, "outbox", content)),
            MessageRoute::NonTransactional { rejected_total: 2 }
        );
        assert_eq!(m.non_transactional_messages(), 2);
        assert_eq!(
            default_mapping().route_message(&message(true, "", content)),
            MessageRoute::Ignored
        );
        assert!(!default_mapping().messages_enabled());
    }

    #[test]
    fn bad_message_content_is_a_mapping_error() {
        let m = mapping(|c| {
            c.message_prefix = Some("outbox".into());
            c.timestamp_column = Some("at".into());
        });
        for (content, expect) in [
            ("not json", "not JSON"),
            ("[1]", "not a JSON object"),
            (r#"{"id": "x"}"#, "aggregatetype"),
            (
                r#"{"id":"x","aggregatetype":"o","aggregateid":"1","type":"t","payload":{},"at":"soon"}"#,
                "ISO timestamp",
            ),
        ] {
            let err = m
                .message_event(&message(true, "outbox", content), 0)
                .unwrap_err();
            assert!(err.to_string().contains(expect), "{content}: {err}");
        }
        let ok = r#"{"id":"x","aggregatetype":"o","aggregateid":"1","type":"t","payload":"s","at":1700000000000}"#;
        let event = m.message_event(&message(true, "outbox", ok), 0).unwrap();
        assert_eq!(event.record.timestamp_ms, Some(1_700_000_000_000));
        assert_eq!(event.record.payload.as_deref(), Some(&b"\"s\""[..]));
        let null_payload =
            r#"{"id":"x","aggregatetype":"o","aggregateid":"1","type":"t","payload":null}"#;
        assert!(matches!(
            m.message_event(&message(true, "outbox", null_payload), 0),
            Err(MappingError::NullPayload { .. })
        ));
    }

    #[test]
    fn message_as_row_keeps_the_content() {
        let (rel, tuple) = message_as_row(&message(true, "outbox", "{}"));
        assert_eq!(rel.name, "outbox");
        assert_eq!(rel.columns[0].name, "content");
        assert_eq!(tuple.0, vec![text("{}")]);
    }

    #[test]
    fn json_members_are_raw_slices() {
        let text = Bytes::from_static(br#"{"a":"x\"}","b" : [ {"c": "]"} ] ,"d":-1.5e3,"e":true}"#);
        let members = json::object_members(&text).unwrap();
        let shown: Vec<(&str, &[u8])> = members
            .iter()
            .map(|(k, m)| (k.as_str(), &m.raw[..]))
            .collect();
        assert_eq!(
            shown,
            vec![
                ("a", &br#""x\"}""#[..]),
                ("b", br#"[ {"c": "]"} ]"#),
                ("d", b"-1.5e3"),
                ("e", b"true"),
            ]
        );
        assert!(json::object_members(&Bytes::from_static(b"{}"))
            .unwrap()
            .is_empty());
    }
}
