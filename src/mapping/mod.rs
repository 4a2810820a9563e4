//! Outbox rows (and `pg_logical_emit_message` events) to Kafka records: which relations are
//! outboxes, which columns hold what, and how topic, key, partition, payload, timestamp and
//! headers are formed. Pure: no I/O.
//!
//! Columns are found by name in the latest Relation message, so column order and added
//! columns do not matter. Values are PostgreSQL's text output, sent byte-for-byte, except
//! `bytea`, whose `\x…` text form is decoded back to the raw bytes. In pgoutput's binary mode
//! values in their types' binary formats are first turned into those bytes (`binary.rs`).
//!
//! A record is built from any *source* of named fields: a row of an outbox table
//! ([`BoundTable::to_event`]) or the JSON object of a transactional logical message
//! ([`OutboxMapping::message_event`]), whose members are named like the columns. One set of
//! rules (a `Rules` per table, one for messages) turns either into the same record:
//!
//! | record part | from | file |
//! |---|---|---|
//! | topic | `topic_column` if non-null, else `topic_overrides[aggregatetype]`, else `topic` | `topic.rs` |
//! | key | `key_column`, else the event id | `rules.rs` |
//! | partition | `partition_by`: murmur2 of the aggregate id (default), of the key, or of a column | `rules.rs`, `partition.rs` |
//! | value | `outbox.format`: the payload (`plain`, `cloudevents_binary`); a JSON object with the metadata (`envelope`); a CloudEvents JSON event (`cloudevents_structured`); null → tombstone or error | `payload.rs`, `cloudevents.rs` |
//! | timestamp | `timestamp_column` if non-null, else the commit time | `timestamp.rs` |
//! | headers | `id`, `type`, `aggregatetype`, `aggregateid` (CloudEvents formats: the `ce_*` attributes and `content-type` instead), then `header_columns`, the `headers_column` object, the tracing context | `headers.rs`, `cloudevents.rs` |
//!
//! The key is the event id only while `key_column` is unset; [`event_id_of`] reads the event id
//! back from where every record carries it (`record.rs`).
//!
//! In: a [`Relation`] and the [`crate::source::pgoutput::Tuple`]s of its inserts, or a
//! [`Message`]. Out: an [`OutboxEvent`] (a [`Record`] and the event id) or a [`MappingError`].
//! `fields.rs` holds the vocabulary every part shares (roles, values, the `Source`
//! trait, the configured columns); `rules.rs` the compiled rules and the build order, the one
//! module that imports the parts; `table.rs` the binding of a table's columns
//! ([`BoundTable`]), `message.rs` the table-less outbox of logical messages.

mod binary;
mod cloudevents;
mod fields;
mod headers;
mod message;
pub mod partition;
mod payload;
mod record;
mod rules;
mod table;
#[cfg(test)]
mod test_support;
mod timestamp;
mod topic;

pub use message::message_as_row;
pub use record::{event_id_of, Record};
pub use table::BoundTable;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::config::OutboxConfig;
use crate::lsn::Lsn;
use crate::source::pgoutput::{Message, Relation};
use message::MessageSource;
use rules::Rules;

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
    #[error("event {event_id}: column `{column}` arrived in pgoutput's binary format, which the relay cannot convert for its type; set postgres.binary = false")]
    NotText { event_id: String, column: String },
    /// Binary mode, and a mapped column of a type the relay cannot read in binary.
    #[error("outbox table {table}: column `{column}` (outbox.{setting}) is of type {type_name}, which the relay cannot read in pgoutput's binary format: {reason}. Fix: set postgres.binary = false (OUTBOX_RELAY__POSTGRES__BINARY=false), or map another column")]
    NotBinary {
        table: String,
        column: String,
        setting: &'static str,
        type_name: String,
        reason: &'static str,
    },
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
    #[error("CloudEvents mapping: {0}")]
    InvalidCloudEventsConfig(String),
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
            | MappingError::NotBinary { .. }
            | MappingError::UnknownPlaceholder(..)
            | MappingError::InvalidCloudEventsConfig(..)
            | MappingError::InvalidMessage { .. } => return None,
        };
        (id != UNKNOWN_ID).then_some(id)
    }
}

/// Stands for the event id in errors about the id column itself.
pub(crate) const UNKNOWN_ID: &str = "?";

/// The configured outbox: its tables, the message prefix, their mappings.
#[derive(Debug, Clone)]
pub struct OutboxMapping {
    tables: Vec<Arc<Rules>>,
    message_prefix: String,
    messages: Option<Arc<Rules>>,
    non_transactional: Arc<AtomicU64>,
    /// pgoutput's binary mode (`postgres.binary`): tables bind only when the relay can read
    /// every mapped column in binary.
    binary: bool,
}

/// An event ready for Kafka, with its id kept for logs and dead letters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxEvent {
    pub id: String,
    pub record: Record,
    /// Which serialization section encodes it: an index of
    /// [`OutboxConfig::serialization_profiles`] (its table's; 0 for logical messages).
    pub profile: usize,
    /// The record's timestamp is the row's own (`timestamp_column`), not the commit time: a
    /// time its topic refuses is then the row's fault.
    pub own_timestamp: bool,
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
        let (_, profiles) = config.serialization_profiles();
        for (table_config, profile) in config.table_configs().iter().zip(profiles) {
            let (schema, table) = table_config.schema_and_table();
            let rules = Rules::new(table_config, schema, table)?.with_profile(profile);
            tables.push(Arc::new(rules));
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
            binary: false,
        })
    }

    /// For a stream in pgoutput's binary mode (`postgres.binary = true`): binding a table then
    /// fails, naming the column and the fix, when a mapped column's type has a binary format
    /// the relay cannot convert.
    pub fn with_binary(mut self, binary: bool) -> Self {
        self.binary = binary;
        self
    }

    /// `None` when the relation is not an outbox table; otherwise its column positions.
    pub fn bind(&self, relation: &Relation) -> Option<Result<BoundTable, MappingError>> {
        let rules = self
            .tables
            .iter()
            .find(|r| r.schema == relation.namespace && r.table == relation.name)?;
        Some(BoundTable::bind(rules, relation, self.binary))
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
        Some(BoundTable::bind(rules, relation, self.binary))
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
        let source = MessageSource::parse(&message.content).map_err(invalid)?;
        rules.build(&source, commit_time_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::test_support::*;

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
    fn each_event_names_its_tables_serialization_section() {
        let mut config = OutboxConfig::default();
        let avro = crate::config::SerializationConfig {
            format: crate::config::SerializationFormat::Avro,
            registry_url: "http://r".into(),
            ..Default::default()
        };
        for (table, own) in [
            ("b.events", Some(avro.clone())),
            ("c.events", None),
            ("d.events", Some(avro)),
        ] {
            config.tables.push(crate::config::OutboxTableConfig {
                table: table.into(),
                serialization: own,
                ..Default::default()
            });
        }
        let m = OutboxMapping::new(&config).unwrap();
        let profile = |namespace: &str| {
            let mut rel = relation(&COLUMNS);
            rel.namespace = namespace.into();
            rel.name = "events".into();
            let row = row(text("order"), text("{}"));
            m.bind(&rel)
                .unwrap()
                .unwrap()
                .to_event(&row, 1)
                .unwrap()
                .profile
        };
        // `public.outbox` and `c.events` the top-level section; `b` and `d` share theirs.
        assert_eq!(
            map_row(&m, &debezium_columns(text("{}"))).unwrap().profile,
            0
        );
        assert_eq!([profile("b"), profile("c"), profile("d")], [1, 0, 1]);
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
        // Both tables use the top-level serialization section.
        assert_eq!((a.profile, event.profile), (0, 0));
        assert_eq!(event.record.partition_key.as_deref(), Some(&b"inv-7"[..]));
    }
}
