//! `[outbox]`: which tables (or `pg_logical_emit_message` prefix) hold the events, how a row
//! becomes a Kafka record, and `[outbox.sweeper]`, the retention sweeper.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::layering::unset;
use super::rules::{is_topic_byte, MAX_TOPIC_CHARS};
use super::serialization::SerializationConfig;
use super::validate::{check_header_name, check_identifier, check_range};
use super::ConfigError;

/// `outbox.partition_by` value: partition by the aggregate id (Java's murmur2 over its bytes).
pub const PARTITION_BY_AGGREGATE_ID: &str = "aggregate_id";
/// `outbox.partition_by` value: partition by the record key, as any Kafka producer does.
pub const PARTITION_BY_KEY: &str = "key";
/// Upper bound of `outbox.sweeper.batch_size`.
pub const MAX_SWEEPER_BATCH_SIZE: u64 = 100_000;
/// Schema of a bare `outbox.table`.
pub const DEFAULT_SCHEMA: &str = "public";
/// Placeholders allowed in `outbox.topic`, written `{name}`.
pub const TOPIC_PLACEHOLDERS: &[&str] = &[
    "aggregatetype",
    "aggregateid",
    "type",
    "id",
    "table",
    "schema",
];

/// Default of `outbox.cloudevents_source`: the CloudEvents `source` of each table's events.
pub const DEFAULT_CLOUDEVENTS_SOURCE: &str = "/outbox-relay/{schema}.{table}";
/// Placeholders allowed in `outbox.cloudevents_source`, written `{name}`.
pub const CLOUDEVENTS_SOURCE_PLACEHOLDERS: &[&str] = &["schema", "table"];
/// CloudEvents context attributes the spec defines: not usable as extension names.
pub const CLOUDEVENTS_RESERVED_ATTRIBUTES: &[&str] = &[
    "specversion",
    "id",
    "source",
    "type",
    "time",
    "subject",
    "datacontenttype",
    "dataschema",
    "data",
    "data_base64",
];
/// The length the CloudEvents spec recommends attribute names not to exceed; enforced here.
pub const MAX_CLOUDEVENTS_ATTRIBUTE_CHARS: usize = 20;

/// `[outbox]`: the outbox table(s), how a row becomes a Kafka record, the message outbox and
/// the retention sweeper.
///
/// The mapping keys (`topic` … `partition_by`) apply to `table`, to every `[[outbox.tables]]`
/// entry that does not set them itself, and to `pg_logical_emit_message` events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OutboxConfig {
    /// Outbox table, `schema.table` or a bare `table` (schema `public`). Each part is used
    /// verbatim and quoted (case-sensitive), up to 63 bytes; names containing `.` are not
    /// supported. Empty: no table at this level (then `tables` or `message_prefix` must be set).
    pub table: String,
    /// Topic template. Placeholders, replaced by the event's values: `{aggregatetype}`
    /// `{aggregateid}` `{type}` `{id}` `{table}` `{schema}` (for messages: `{table}` is the
    /// prefix, `{schema}` is empty). Other characters must be legal in a Kafka topic name
    /// (`A-Z a-z 0-9 . _ -`).
    pub topic: String,
    /// Per aggregate type, a topic template used instead of `topic` (aggregate type → template).
    pub topic_overrides: BTreeMap<String, String>,
    /// Column holding the topic name; where it is non-null it wins over `topic` and
    /// `topic_overrides`. Unset (`""`): none.
    #[serde(with = "unset")]
    pub topic_column: Option<String>,
    /// Column holding the event id: the Kafka key (unless `key_column` is set) and header `id`.
    pub id_column: String,
    /// Column holding the aggregate type (usually selects the topic; header `aggregatetype`).
    pub aggregate_type_column: String,
    /// Column holding the aggregate id (header `aggregateid`); with the default `partition_by`
    /// it chooses the partition, so one aggregate's events keep their order.
    pub aggregate_id_column: String,
    /// Column holding the event type (header `type`).
    pub type_column: String,
    /// Column holding the payload, the record value: jsonb, json and text are sent as their
    /// text, bytea as its raw bytes.
    pub payload_column: String,
    /// Column holding the record key. Unset (`""`): the event id. Set, the key is no longer the
    /// event id: consumers and `dead-letters --event-id` go by the `id` header.
    #[serde(with = "unset")]
    pub key_column: Option<String>,
    /// Column holding the event time (timestamptz, timestamp as UTC, or an integer of
    /// milliseconds since the Unix epoch): the record timestamp. Unset, or a null value: the
    /// transaction's commit time.
    #[serde(with = "unset")]
    pub timestamp_column: Option<String>,
    /// Column holding a JSON object (jsonb or json); each key becomes a record header, its
    /// value the header value (strings as they are, other values as JSON, null skipped).
    /// Unset (`""`): none.
    #[serde(with = "unset")]
    pub headers_column: Option<String>,
    /// Column holding a tracing span context. A W3C `traceparent` value is sent as header
    /// `tracing_header`; a `key=value` list, one per line (Debezium's `tracingspancontext`),
    /// becomes one header per key. Unset (`""`): none.
    #[serde(with = "unset")]
    pub tracing_column: Option<String>,
    /// Header name for a plain span context from `tracing_column`.
    pub tracing_header: String,
    /// Further columns sent as headers (column → header name), like Debezium's
    /// `table.fields.additional.placement` with `header`. Null values are skipped.
    pub header_columns: BTreeMap<String, String>,
    /// The record format: `plain` (the payload as the value, metadata in headers `id`, `type`,
    /// `aggregatetype`, `aggregateid`), `envelope` (one JSON object `{"id", "aggregatetype",
    /// "aggregateid", "type", "timestamp" (ms), "payload"}`; a json or jsonb payload embedded as
    /// is, text as a JSON string, bytea as a base64 string), `cloudevents_binary` (CloudEvents
    /// 1.0, Kafka binding, binary mode: the payload as the value, attributes in `ce_*` headers
    /// and `content-type`) or `cloudevents_structured` (one `application/cloudevents+json`
    /// object with the attributes and `data`, or `data_base64` for bytea).
    pub format: Format,
    /// Old spelling of `format = "envelope"`, still accepted; `true` with a `format` other
    /// than `plain` or `envelope` is an error.
    pub envelope: bool,
    /// CloudEvents formats: the `source` attribute, a URI-reference. Placeholders `{schema}`
    /// and `{table}` (for messages: `{table}` is the prefix, `{schema}` is `pg_logical_emit_message`). Put the
    /// database in it when several databases publish the same tables, e.g.
    /// `//db1.example.com/orders/{schema}.{table}`.
    pub cloudevents_source: String,
    /// CloudEvents formats: column holding the `subject` attribute (null: no subject).
    /// Unset (`""`): the aggregate id.
    #[serde(with = "unset")]
    pub cloudevents_subject_column: Option<String>,
    /// CloudEvents formats: the content type (`datacontenttype`) of a payload that is not
    /// json/jsonb (those are `application/json`). Unset (`""`): `text/plain; charset=utf-8`
    /// for text, `application/octet-stream` for bytea. A JSON media type (`application/json`,
    /// `…+json`) on a text payload embeds it as JSON in structured mode; it must then be JSON.
    #[serde(with = "unset")]
    pub cloudevents_content_type: Option<String>,
    /// CloudEvents formats: columns sent as extension attributes (column → attribute name;
    /// binary mode: header `ce_<name>`). Names: `a-z` `0-9`, at most 20 characters, not a
    /// name the spec defines. Values are strings; null values are left out.
    pub cloudevents_extensions: BTreeMap<String, String>,
    /// What a null payload becomes: `error` (a mapping error, handled by the dead-letter
    /// policy) or `tombstone` (a record with a null value).
    pub null_payload: NullPayload,
    /// How the partition is chosen: `aggregate_id` (murmur2 of the aggregate id, as the Java
    /// client hashes keys: one aggregate, one partition, while the key stays the event id),
    /// `key` (murmur2 of the key, Kafka's default), or the name of a column whose value is
    /// hashed the same way (a null value falls back to the key).
    pub partition_by: String,
    /// Prefix of transactional `pg_logical_emit_message(true, prefix, content)` messages to
    /// publish like outbox rows. The content is a JSON object whose members are named like the
    /// columns above. Non-transactional messages with this prefix are skipped with a warning.
    /// Unset (`""` in the file): messages are not read.
    #[serde(with = "unset")]
    pub message_prefix: Option<String>,
    /// More outbox tables in the same publication and slot (`[[outbox.tables]]`), each with a
    /// `table` and any of the mapping keys above; unset keys are inherited from `[outbox]`.
    pub tables: Vec<OutboxTableConfig>,
    /// `[outbox.sweeper]`: deletes old, already confirmed rows.
    pub sweeper: SweeperConfig,
    /// `[outbox.serialization]`: values encoded per a Schema Registry's schema (off by default).
    pub serialization: SerializationConfig,
}

/// The record format (`outbox.format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// The payload as the value; metadata in headers.
    #[default]
    Plain,
    /// One JSON object with the metadata and the payload.
    Envelope,
    /// CloudEvents 1.0, Kafka protocol binding, binary content mode.
    CloudeventsBinary,
    /// CloudEvents 1.0, Kafka protocol binding, structured content mode (JSON event format).
    CloudeventsStructured,
}

impl Format {
    /// Every value, in the spelling of the config file.
    pub const NAMES: &'static [&'static str] = &[
        "plain",
        "envelope",
        "cloudevents_binary",
        "cloudevents_structured",
    ];

    /// True for the two CloudEvents formats.
    pub fn is_cloudevents(self) -> bool {
        matches!(
            self,
            Format::CloudeventsBinary | Format::CloudeventsStructured
        )
    }
}

/// What a null payload becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NullPayload {
    /// A mapping error naming the event (dead-letter policy).
    Error,
    /// A record with a null value: a tombstone for compacted topics.
    Tombstone,
}

impl NullPayload {
    /// Every value, in the spelling of the config file.
    pub const NAMES: &'static [&'static str] = &["error", "tombstone"];
}

/// One `[[outbox.tables]]` entry: a table and the mapping keys it sets differently from
/// `[outbox]`. A key left out takes `[outbox]`'s value; an optional column (`key_column`,
/// `topic_column`, …) set to `""` means none for this table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutboxTableConfig {
    /// `schema.table` or a bare `table` (schema `public`).
    pub table: String,
    pub topic: Option<String>,
    pub topic_overrides: Option<BTreeMap<String, String>>,
    pub topic_column: Option<String>,
    pub id_column: Option<String>,
    pub aggregate_type_column: Option<String>,
    pub aggregate_id_column: Option<String>,
    pub type_column: Option<String>,
    pub payload_column: Option<String>,
    pub key_column: Option<String>,
    pub timestamp_column: Option<String>,
    pub headers_column: Option<String>,
    pub tracing_column: Option<String>,
    pub tracing_header: Option<String>,
    pub header_columns: Option<BTreeMap<String, String>>,
    pub format: Option<Format>,
    pub envelope: Option<bool>,
    pub cloudevents_source: Option<String>,
    pub cloudevents_subject_column: Option<String>,
    pub cloudevents_content_type: Option<String>,
    pub cloudevents_extensions: Option<BTreeMap<String, String>>,
    pub null_payload: Option<NullPayload>,
    pub partition_by: Option<String>,
    /// `[outbox.tables.serialization]`: this table's own `[outbox.serialization]`, replacing
    /// the top-level one as a whole except for the registry connection: `registry_url`, and
    /// the login when the section sets none of its keys, are inherited when unset. Absent:
    /// the top-level section.
    pub serialization: Option<SerializationConfig>,
}

/// `[outbox.sweeper]`: keeps the outbox tables small. Off by default.
///
/// Deletes rows whose `created_at_column` is older than `retention_ms` **and** whose inserting
/// transaction the slot has already confirmed (see `relay/sweeper/mod.rs` for why that is
/// exact), in batches of `batch_size`, every `interval_ms`. Rows younger than the retention stay,
/// so `outbox-relay replay` keeps that window of history; rows committed before the slot was
/// created stay under a hold until a replay covers them (`relay/sweeper/hold.rs`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SweeperConfig {
    /// Run the sweeper inside `outbox-relay run`.
    pub enabled: bool,
    /// Rows older than this are deleted once confirmed, in milliseconds; > 0. Measured from
    /// `created_at_column` (the inserting transaction's start time, with the default `now()`).
    pub retention_ms: u64,
    /// Pause between sweeps, in milliseconds; > 0.
    pub interval_ms: u64,
    /// Most rows deleted per statement (one short transaction each); 1 to 100000.
    pub batch_size: u64,
    /// Timestamp column compared with the retention, in every outbox table.
    pub created_at_column: String,
    /// For a partitioned outbox table: drop whole partitions instead of deleting their rows.
    /// A partition (never the DEFAULT one, which keeps being swept row by row) is detached and
    /// dropped once it holds rows and every one of them is older than `retention_ms` and
    /// confirmed by the slot; until then its rows stay. Needs ownership of the tables.
    pub drop_partitions: bool,
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            table: "public.outbox".to_string(),
            topic: "outbox.event.{aggregatetype}".to_string(),
            topic_overrides: BTreeMap::new(),
            topic_column: None,
            id_column: "id".to_string(),
            aggregate_type_column: "aggregatetype".to_string(),
            aggregate_id_column: "aggregateid".to_string(),
            type_column: "type".to_string(),
            payload_column: "payload".to_string(),
            key_column: None,
            timestamp_column: None,
            headers_column: None,
            tracing_column: None,
            tracing_header: "traceparent".to_string(),
            header_columns: BTreeMap::new(),
            format: Format::Plain,
            envelope: false,
            cloudevents_source: DEFAULT_CLOUDEVENTS_SOURCE.to_string(),
            cloudevents_subject_column: None,
            cloudevents_content_type: None,
            cloudevents_extensions: BTreeMap::new(),
            null_payload: NullPayload::Error,
            partition_by: PARTITION_BY_AGGREGATE_ID.to_string(),
            message_prefix: None,
            tables: Vec::new(),
            sweeper: SweeperConfig::default(),
            serialization: Default::default(),
        }
    }
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            enabled: false,
            retention_ms: 7 * 24 * 3600 * 1000, // 7 days
            interval_ms: 10_000,
            batch_size: 1_000, // rows
            created_at_column: "created_at".to_string(),
            drop_partitions: false,
        }
    }
}

impl OutboxConfig {
    /// `table` split into schema and table; a bare name is in schema `public`.
    pub fn schema_and_table(&self) -> (String, String) {
        split_table(&self.table)
    }

    /// Every outbox table with its complete mapping: `table` (unless empty) first, then each
    /// `[[outbox.tables]]` entry with the keys it leaves unset taken from `[outbox]`. Each
    /// returned config names one table and has no `tables` of its own.
    pub fn table_configs(&self) -> Vec<OutboxConfig> {
        let base = OutboxConfig {
            tables: Vec::new(),
            ..self.clone()
        };
        let mut configs = Vec::with_capacity(1 + self.tables.len());
        if !self.table.is_empty() {
            configs.push(base.clone());
        }
        for entry in &self.tables {
            configs.push(entry.resolve(&base));
        }
        configs
    }

    /// `(schema, table)` of every outbox table, for the publication.
    pub fn publication_tables(&self) -> Vec<(String, String)> {
        self.table_configs()
            .iter()
            .map(OutboxConfig::schema_and_table)
            .collect()
    }

    /// The format records are built in: `format`, or `envelope` for the old `envelope = true`.
    pub fn effective_format(&self) -> Format {
        if self.envelope && self.format == Format::Plain {
            Format::Envelope
        } else {
            self.format
        }
    }

    /// True when `pg_logical_emit_message` events are read (`message_prefix` is set): the
    /// replication must then be started with the pgoutput option `messages`.
    pub fn messages_enabled(&self) -> bool {
        self.message_prefix.is_some()
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.table.is_empty() {
            if self.tables.is_empty() && self.message_prefix.is_none() {
                return Err(ConfigError::invalid(
                    "outbox.table",
                    "must not be empty unless [[outbox.tables]] or outbox.message_prefix is set",
                ));
            }
        } else {
            check_table_name("outbox.table", &self.table)?;
        }
        self.validate_mapping("outbox")?;
        let mut seen = std::collections::BTreeSet::new();
        if !self.table.is_empty() {
            seen.insert(self.schema_and_table());
        }
        for (i, entry) in self.tables.iter().enumerate() {
            let path = format!("outbox.tables[{i}]");
            check_table_name(&format!("{path}.table"), &entry.table)?;
            let resolved = entry.resolve(self);
            resolved.validate_mapping(&path)?;
            let (schema, table) = resolved.schema_and_table();
            if !seen.insert((schema.clone(), table.clone())) {
                return Err(ConfigError::invalid(
                    format!("{path}.table"),
                    format!("`{schema}.{table}` is configured twice"),
                ));
            }
        }
        if self
            .message_prefix
            .as_deref()
            .is_some_and(|p| p.contains('\0'))
        {
            return Err(ConfigError::invalid(
                "outbox.message_prefix",
                "must not contain a NUL character",
            ));
        }
        self.sweeper.validate()?;
        self.validate_serialization()
    }

    /// Each `[outbox.serialization]` section against the record format of the tables (and
    /// messages) it encodes: the top-level one, then each entry's own, resolved.
    fn validate_serialization(&self) -> Result<(), ConfigError> {
        let mut formats = vec![("outbox".to_string(), self.format)];
        for (i, entry) in self.tables.iter().enumerate() {
            let path = format!("outbox.tables[{i}]");
            let resolved = entry.resolve(self);
            match entry.serialization {
                None => formats.push((path, resolved.format)),
                Some(_) => resolved.serialization.validate(
                    &format!("{path}.serialization"),
                    &[(path.clone(), resolved.format)],
                )?,
            }
        }
        self.serialization
            .validate("outbox.serialization", &formats)
    }

    /// The distinct serialization sections in force, and which one each of
    /// [`OutboxConfig::table_configs`] uses (by index). Index 0 is the top-level
    /// `[outbox.serialization]` (also that of the logical messages); entries with equal
    /// sections share one, so they share its schema cache.
    pub fn serialization_profiles(&self) -> (Vec<SerializationConfig>, Vec<usize>) {
        let mut profiles = vec![self.serialization.clone()];
        let mut of_table = Vec::new();
        for table in self.table_configs() {
            let index = match profiles.iter().position(|p| *p == table.serialization) {
                Some(index) => index,
                None => {
                    profiles.push(table.serialization);
                    profiles.len() - 1
                }
            };
            of_table.push(index);
        }
        (profiles, of_table)
    }

    /// The mapping keys; `path` is `outbox` or `outbox.tables[i]` for the error's field.
    fn validate_mapping(&self, path: &str) -> Result<(), ConfigError> {
        let field = |key: &str| format!("{path}.{key}");
        check_topic_template(&field("topic"), &self.topic)?;
        for (aggregate_type, template) in &self.topic_overrides {
            if aggregate_type.is_empty() {
                return Err(ConfigError::invalid(
                    field("topic_overrides"),
                    "an aggregate type must not be empty",
                ));
            }
            check_topic_template(
                &field(&format!("topic_overrides.{aggregate_type}")),
                template,
            )?;
        }
        for (key, column) in [
            ("id_column", &self.id_column),
            ("aggregate_type_column", &self.aggregate_type_column),
            ("aggregate_id_column", &self.aggregate_id_column),
            ("type_column", &self.type_column),
            ("payload_column", &self.payload_column),
        ] {
            check_identifier(&field(key), column)?;
        }
        for (key, column) in [
            ("topic_column", &self.topic_column),
            ("key_column", &self.key_column),
            ("timestamp_column", &self.timestamp_column),
            ("headers_column", &self.headers_column),
            ("tracing_column", &self.tracing_column),
            (
                "cloudevents_subject_column",
                &self.cloudevents_subject_column,
            ),
        ] {
            if let Some(column) = column {
                check_identifier(&field(key), column)?;
            }
        }
        if self.tracing_column.is_some() {
            check_header_name(&field("tracing_header"), &self.tracing_header)?;
        }
        for (column, header) in &self.header_columns {
            check_identifier(&field("header_columns"), column)?;
            check_header_name(&field(&format!("header_columns.{column}")), header)?;
        }
        self.validate_format(path)?;
        if self.partition_by.is_empty() {
            return Err(ConfigError::invalid(
                field("partition_by"),
                format!(
                    "must be `{PARTITION_BY_AGGREGATE_ID}`, `{PARTITION_BY_KEY}` or a column name"
                ),
            ));
        }
        check_identifier(&field("partition_by"), &self.partition_by)
    }
}

impl OutboxConfig {
    /// `format`, `envelope` and the `cloudevents_*` keys.
    fn validate_format(&self, path: &str) -> Result<(), ConfigError> {
        let field = |key: &str| format!("{path}.{key}");
        if self.envelope && !matches!(self.format, Format::Plain | Format::Envelope) {
            return Err(ConfigError::invalid(
                field("envelope"),
                format!(
                    "`envelope = true` is the old spelling of `format = \"envelope\"` and contradicts `format = \"{}\"`; remove `envelope`",
                    Format::NAMES[self.format as usize]
                ),
            ));
        }
        check_cloudevents_source(&field("cloudevents_source"), &self.cloudevents_source)?;
        if let Some(content_type) = &self.cloudevents_content_type {
            if let Some(problem) = cloudevents_string_problem(content_type) {
                return Err(ConfigError::invalid(
                    field("cloudevents_content_type"),
                    problem,
                ));
            }
        }
        let mut attributes = std::collections::BTreeSet::new();
        for (column, name) in &self.cloudevents_extensions {
            check_identifier(&field("cloudevents_extensions"), column)?;
            let key = field(&format!("cloudevents_extensions.{column}"));
            if let Some(problem) = cloudevents_extension_problem(name) {
                return Err(ConfigError::invalid(key, problem));
            }
            if !attributes.insert(name) {
                return Err(ConfigError::invalid(
                    key,
                    format!("attribute `{name}` is mapped from two columns"),
                ));
            }
        }
        Ok(())
    }
}

/// Why `name` cannot be a CloudEvents extension attribute name, if it cannot: the spec's
/// `a-z0-9`, its recommended 20 characters, and none of the names the spec defines.
pub fn cloudevents_extension_problem(name: &str) -> Option<String> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Some(format!(
            "`{name}` is not a CloudEvents attribute name (lower-case letters a-z and digits 0-9 only)"
        ));
    }
    if name.len() > MAX_CLOUDEVENTS_ATTRIBUTE_CHARS {
        return Some(format!(
            "`{name}` is longer than {MAX_CLOUDEVENTS_ATTRIBUTE_CHARS} characters, the most the CloudEvents spec recommends"
        ));
    }
    if CLOUDEVENTS_RESERVED_ATTRIBUTES.contains(&name) {
        return Some(format!(
            "`{name}` is an attribute the CloudEvents spec defines, not an extension"
        ));
    }
    None
}

/// Why `value` is not a CloudEvents String, if it is not: the spec forbids the control
/// characters U+0000–U+001F and U+007F–U+009F and the Unicode noncharacters.
pub fn cloudevents_string_problem(value: &str) -> Option<String> {
    let bad = value.chars().find(|&c| {
        let n = c as u32;
        n <= 0x1f
            || (0x7f..=0x9f).contains(&n)
            || (0xfdd0..=0xfdef).contains(&n)
            || n & 0xfffe == 0xfffe
    })?;
    Some(format!(
        "contains U+{:04X}, which a CloudEvents string must not",
        bad as u32
    ))
}

/// Non-empty, placeholders from [`CLOUDEVENTS_SOURCE_PLACEHOLDERS`] only, no spaces or control
/// characters (the rendered value must be a URI-reference).
fn check_cloudevents_source(field: &str, template: &str) -> Result<(), ConfigError> {
    if template.is_empty() {
        return Err(ConfigError::invalid(field, "must not be empty"));
    }
    if let Some(c) = template
        .chars()
        .find(|c| c.is_whitespace() || c.is_control())
    {
        return Err(ConfigError::invalid(
            field,
            format!(
                "`{template}` contains {c:?}; a URI-reference has no spaces or control characters"
            ),
        ));
    }
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            return Err(ConfigError::invalid(
                field,
                format!("`{template}` has a `{{` without a closing `}}`"),
            ));
        };
        let name = &after[..close];
        if !CLOUDEVENTS_SOURCE_PLACEHOLDERS.contains(&name) {
            return Err(ConfigError::invalid(
                field,
                format!(
                    "unknown placeholder `{{{name}}}` in `{template}`; known: {{schema}} {{table}}"
                ),
            ));
        }
        rest = &after[close + 1..];
    }
    Ok(())
}

impl OutboxTableConfig {
    /// This entry's complete mapping: its own keys, the rest from `base`.
    fn resolve(&self, base: &OutboxConfig) -> OutboxConfig {
        fn pick<T: Clone>(own: &Option<T>, inherited: &T) -> T {
            own.clone().unwrap_or_else(|| inherited.clone())
        }
        // An optional column set to `""` in the entry means none, whatever `[outbox]` says.
        fn pick_column(own: &Option<String>, inherited: &Option<String>) -> Option<String> {
            match own {
                Some(column) => (!column.is_empty()).then(|| column.clone()),
                None => inherited.clone(),
            }
        }
        OutboxConfig {
            table: self.table.clone(),
            topic: pick(&self.topic, &base.topic),
            topic_overrides: pick(&self.topic_overrides, &base.topic_overrides),
            topic_column: pick_column(&self.topic_column, &base.topic_column),
            id_column: pick(&self.id_column, &base.id_column),
            aggregate_type_column: pick(&self.aggregate_type_column, &base.aggregate_type_column),
            aggregate_id_column: pick(&self.aggregate_id_column, &base.aggregate_id_column),
            type_column: pick(&self.type_column, &base.type_column),
            payload_column: pick(&self.payload_column, &base.payload_column),
            key_column: pick_column(&self.key_column, &base.key_column),
            timestamp_column: pick_column(&self.timestamp_column, &base.timestamp_column),
            headers_column: pick_column(&self.headers_column, &base.headers_column),
            tracing_column: pick_column(&self.tracing_column, &base.tracing_column),
            tracing_header: pick(&self.tracing_header, &base.tracing_header),
            header_columns: pick(&self.header_columns, &base.header_columns),
            format: pick(&self.format, &base.format),
            // An entry that sets `format` does not inherit the old `envelope` flag.
            envelope: match self.format {
                Some(_) => self.envelope.unwrap_or(false),
                None => pick(&self.envelope, &base.envelope),
            },
            cloudevents_source: pick(&self.cloudevents_source, &base.cloudevents_source),
            cloudevents_subject_column: pick_column(
                &self.cloudevents_subject_column,
                &base.cloudevents_subject_column,
            ),
            cloudevents_content_type: pick_column(
                &self.cloudevents_content_type,
                &base.cloudevents_content_type,
            ),
            cloudevents_extensions: pick(
                &self.cloudevents_extensions,
                &base.cloudevents_extensions,
            ),
            null_payload: pick(&self.null_payload, &base.null_payload),
            partition_by: pick(&self.partition_by, &base.partition_by),
            message_prefix: base.message_prefix.clone(),
            tables: Vec::new(),
            sweeper: base.sweeper.clone(),
            serialization: match &self.serialization {
                Some(own) => own.inherit(&base.serialization),
                None => base.serialization.clone(),
            },
        }
    }
}

impl SweeperConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        check_range(
            "outbox.sweeper.retention_ms",
            self.retention_ms,
            1,
            u64::MAX,
            "ms",
        )?;
        check_range(
            "outbox.sweeper.interval_ms",
            self.interval_ms,
            1,
            u64::MAX,
            "ms",
        )?;
        check_range(
            "outbox.sweeper.batch_size",
            self.batch_size,
            1,
            MAX_SWEEPER_BATCH_SIZE,
            "rows",
        )?;
        check_identifier("outbox.sweeper.created_at_column", &self.created_at_column)
    }
}

/// `schema.table` or `table` (schema `public`).
fn split_table(name: &str) -> (String, String) {
    match name.split_once('.') {
        Some((schema, table)) => (schema.to_string(), table.to_string()),
        None => (DEFAULT_SCHEMA.to_string(), name.to_string()),
    }
}

fn check_table_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.matches('.').count() > 1 {
        return Err(ConfigError::invalid(
            field,
            format!(
                "`{name}` must be `table` or `schema.table` (names containing `.` are not supported)"
            ),
        ));
    }
    let (schema, table) = split_table(name);
    check_identifier(field, &schema)?;
    check_identifier(field, &table)
}

/// Non-empty, placeholders from [`TOPIC_PLACEHOLDERS`] only, literal text legal in a topic name.
fn check_topic_template(field: &str, template: &str) -> Result<(), ConfigError> {
    if template.is_empty() {
        return Err(ConfigError::invalid(field, "must not be empty"));
    }
    let mut rest = template;
    let mut literal_chars = 0;
    while !rest.is_empty() {
        if let Some(after_open) = rest.strip_prefix('{') {
            let Some(close) = after_open.find('}') else {
                return Err(ConfigError::invalid(
                    field,
                    format!("`{template}` has a `{{` without a closing `}}`"),
                ));
            };
            let name = &after_open[..close];
            if !TOPIC_PLACEHOLDERS.contains(&name) {
                return Err(ConfigError::invalid(
                    field,
                    format!(
                        "unknown placeholder `{{{name}}}` in `{template}`; known: {}",
                        TOPIC_PLACEHOLDERS
                            .iter()
                            .map(|p| format!("{{{p}}}"))
                            .collect::<Vec<_>>()
                            .join(" ")
                    ),
                ));
            }
            rest = &after_open[close + 1..];
            continue;
        }
        let mut chars = rest.chars();
        let c = chars.next().unwrap_or_default();
        if !(c.is_ascii() && is_topic_byte(c as u8)) {
            return Err(ConfigError::invalid(
                field,
                format!(
                    "`{template}` contains `{c}`; topic names allow only A-Z a-z 0-9 . _ - besides placeholders"
                ),
            ));
        }
        literal_chars += 1;
        rest = chars.as_str();
    }
    if literal_chars > MAX_TOPIC_CHARS {
        return Err(ConfigError::invalid(
            field,
            format!(
                "`{template}` is longer than a topic name may be ({MAX_TOPIC_CHARS} characters)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn load(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_sources(
            Some(toml),
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        )
    }

    #[test]
    fn format_is_read_from_the_file_and_the_environment() {
        assert_eq!(Config::default().outbox.effective_format(), Format::Plain);
        for (i, name) in Format::NAMES.iter().enumerate() {
            let c = load(&format!("[outbox]\nformat = \"{name}\""), &[]).unwrap();
            assert_eq!(c.outbox.format as usize, i, "{name}");
            let c = load("", &[("OUTBOX_RELAY__OUTBOX__FORMAT", name)]).unwrap();
            assert_eq!(c.outbox.format as usize, i, "{name}");
            // `outbox-relay config` shows the spelling the file takes.
            assert!(c
                .to_redacted_toml()
                .contains(&format!("format = \"{name}\"")));
        }
        // `outbox-relay config` shows the new keys with their defaults.
        let shown = Config::default().to_redacted_toml();
        for line in [
            "format = \"plain\"",
            "cloudevents_source = \"/outbox-relay/{schema}.{table}\"",
            "cloudevents_subject_column = \"\"",
            "cloudevents_content_type = \"\"",
        ] {
            assert!(shown.contains(line), "{line} missing from\n{shown}");
        }
        assert!(shown.contains("cloudevents_extensions"), "{shown}");
        let err = load("[outbox]\nformat = \"cloudevents\"", &[]).unwrap_err();
        assert!(err.to_string().contains("format"), "{err}");
    }

    #[test]
    fn old_envelope_flag_means_the_envelope_format_and_cannot_contradict_format() {
        let c = load("[outbox]\nenvelope = true", &[]).unwrap();
        assert_eq!(c.outbox.effective_format(), Format::Envelope);
        let c = load("[outbox]\nenvelope = true\nformat = \"envelope\"", &[]).unwrap();
        assert_eq!(c.outbox.effective_format(), Format::Envelope);
        let err = load(
            "[outbox]\nenvelope = true\nformat = \"cloudevents_binary\"",
            &[],
        )
        .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("outbox.envelope"), "{text}");
        assert!(text.contains("format = \"envelope\""), "{text}");
        assert!(text.contains("cloudevents_binary"), "{text}");
    }

    #[test]
    fn each_table_may_choose_its_format() {
        let c = load(
            r#"[outbox]
envelope = true
cloudevents_extensions = { tenant = "tenant" }
[[outbox.tables]]
table = "billing.events"
format = "cloudevents_structured"
cloudevents_source = "/billing/{table}"
cloudevents_subject_column = "customer"
[[outbox.tables]]
table = "audit.events"
"#,
            &[],
        )
        .unwrap();
        let tables = c.outbox.table_configs();
        assert_eq!(tables[0].effective_format(), Format::Envelope);
        assert_eq!(tables[1].effective_format(), Format::CloudeventsStructured);
        assert!(
            !tables[1].envelope,
            "a table's format wins over the old flag"
        );
        assert_eq!(tables[1].cloudevents_source, "/billing/{table}");
        assert_eq!(
            tables[1].cloudevents_subject_column.as_deref(),
            Some("customer")
        );
        assert_eq!(tables[1].cloudevents_extensions["tenant"], "tenant");
        assert_eq!(tables[2].effective_format(), Format::Envelope);
    }

    #[test]
    fn cloudevents_keys_are_validated_with_their_field() {
        for (toml, field, problem) in [
            (
                "cloudevents_extensions = { tenant = \"Tenant\" }",
                "outbox.cloudevents_extensions.tenant",
                "a-z",
            ),
            (
                "cloudevents_extensions = { tenant = \"abcdefghijklmnopqrstu\" }",
                "outbox.cloudevents_extensions.tenant",
                "20 characters",
            ),
            (
                "cloudevents_extensions = { tenant = \"time\" }",
                "outbox.cloudevents_extensions.tenant",
                "defines",
            ),
            (
                "cloudevents_extensions = { a = \"x\", b = \"x\" }",
                "outbox.cloudevents_extensions.b",
                "two columns",
            ),
            (
                "cloudevents_source = \"/x/{database}\"",
                "outbox.cloudevents_source",
                "unknown placeholder",
            ),
            (
                "cloudevents_source = \"/x y\"",
                "outbox.cloudevents_source",
                "URI-reference",
            ),
            (
                "cloudevents_source = \"\"",
                "outbox.cloudevents_source",
                "empty",
            ),
            (
                "cloudevents_content_type = \"text/plain\\n\"",
                "outbox.cloudevents_content_type",
                "U+000A",
            ),
        ] {
            let err = load(&format!("[outbox]\n{toml}"), &[]).unwrap_err();
            match err {
                ConfigError::Invalid {
                    field: f,
                    problem: p,
                } => {
                    assert_eq!(f, field, "{toml}");
                    assert!(p.contains(problem), "{toml}: {p}");
                }
                other => panic!("{toml}: {other}"),
            }
        }
        let err = load(
            "[[outbox.tables]]\ntable = \"b.e\"\ncloudevents_extensions = { t = \"T\" }",
            &[],
        )
        .unwrap_err();
        assert!(
            err.to_string()
                .contains("outbox.tables[0].cloudevents_extensions.t"),
            "{err}"
        );
    }

    #[test]
    fn cloudevents_strings_refuse_control_characters_and_noncharacters() {
        assert_eq!(cloudevents_string_problem("ok ünï €"), None);
        for bad in [
            "\u{0}",
            "a\u{1f}",
            "\u{7f}",
            "\u{9f}",
            "\u{fdd0}",
            "\u{1fffe}",
        ] {
            assert!(cloudevents_string_problem(bad).is_some(), "{bad:?}");
        }
    }
}
