//! Configuration: the TOML file, `OUTBOX_RELAY__…` environment overrides, validation.
//!
//! Sources, lowest precedence first:
//!
//! 1. built-in defaults (the `DEFAULT_*` constants below; `config/outbox-relay.toml` lists them all),
//! 2. the TOML file, if one is given,
//! 3. environment variables `OUTBOX_RELAY__<SECTION>__<KEY>` (upper-case, `__` between levels),
//!    e.g. `OUTBOX_RELAY__POSTGRES__SLOT=orders_relay` or
//!    `OUTBOX_RELAY__KAFKA__MAX_IN_FLIGHT_MESSAGES=5000`. The string is converted to the type of
//!    the key (integer, `true`/`false`, string). Entries of `kafka.properties` are set with
//!    `OUTBOX_RELAY__KAFKA__PROPERTIES__<KEY>`: the key is lower-cased and every `_` becomes `.`,
//!    so `OUTBOX_RELAY__KAFKA__PROPERTIES__SOCKET_TIMEOUT_MS=60000` sets `socket.timeout.ms`
//!    (a librdkafka property whose name contains `_` can only be set in the file). The whole
//!    `OUTBOX_RELAY__` prefix is reserved: a variable naming an unknown key is an error.
//!
//! Unknown keys, wrong types and invalid values are errors that name the key, the section and
//! the source. This module does no I/O except reading the config file ([`Config::load`]) and the
//! password file ([`PostgresConfig::password`]); secrets never reach `Debug`, `Display` or
//! [`Config::to_redacted_toml`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Prefix of the environment variables that override config keys.
pub const ENV_PREFIX: &str = "OUTBOX_RELAY__";
/// What [`Config::to_redacted_toml`], `Debug` and `Display` print instead of a secret.
pub const REDACTED: &str = "***";

pub const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";
pub const DEFAULT_PASSWORD_FILE: &str = "";
pub const DEFAULT_SLOT: &str = "outbox_relay";
pub const DEFAULT_PUBLICATION: &str = "outbox_relay_pub";
pub const DEFAULT_CREATE_SLOT: bool = true;
pub const DEFAULT_CREATE_PUBLICATION: bool = true;
pub const DEFAULT_STATUS_INTERVAL_MS: u64 = 1_000;
/// Upper bound of `postgres.status_interval_ms`; well below the server's default
/// `wal_sender_timeout` (60 s) so an idle relay is never disconnected.
pub const MAX_STATUS_INTERVAL_MS: u64 = 30_000;
pub const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_RECONNECT_BACKOFF_INITIAL_MS: u64 = 500;
pub const DEFAULT_RECONNECT_BACKOFF_MAX_MS: u64 = 30_000;
/// TCP keepalive on both PostgreSQL connections: first probe after this much silence.
pub const DEFAULT_KEEPALIVES_IDLE_MS: u64 = 30_000;
/// Between unanswered keepalive probes.
pub const DEFAULT_KEEPALIVES_INTERVAL_MS: u64 = 10_000;
/// Unanswered probes before the kernel drops the connection.
pub const DEFAULT_KEEPALIVES_RETRIES: u32 = 3;
/// `TCP_USER_TIMEOUT`: sent data unacknowledged this long drops the connection (Linux). Equal to
/// idle + interval × retries, so keepalives and unacknowledged writes give up alike.
pub const DEFAULT_TCP_USER_TIMEOUT_MS: u64 = 60_000;
/// `postgres.receive_timeout_ms` of 0: derive the deadline from the server's
/// `wal_sender_timeout`.
pub const DEFAULT_RECEIVE_TIMEOUT_MS: u64 = 0;
/// The replication receive deadline when it is derived and the server's `wal_sender_timeout`
/// is 0 (disabled).
pub const FALLBACK_RECEIVE_TIMEOUT_MS: u64 = 30_000;

pub const DEFAULT_OUTBOX_TABLE: &str = "public.outbox";
pub const DEFAULT_TOPIC_TEMPLATE: &str = "outbox.event.{aggregatetype}";
pub const DEFAULT_ID_COLUMN: &str = "id";
pub const DEFAULT_AGGREGATE_TYPE_COLUMN: &str = "aggregatetype";
pub const DEFAULT_AGGREGATE_ID_COLUMN: &str = "aggregateid";
pub const DEFAULT_TYPE_COLUMN: &str = "type";
pub const DEFAULT_PAYLOAD_COLUMN: &str = "payload";
/// Empty: the key is the event id (`outbox.id_column`).
pub const DEFAULT_KEY_COLUMN: &str = "";
/// Empty: the record timestamp is the transaction's commit time.
pub const DEFAULT_TIMESTAMP_COLUMN: &str = "";
/// Empty: no column of per-event headers.
pub const DEFAULT_HEADERS_COLUMN: &str = "";
/// Empty: no tracing span context column.
pub const DEFAULT_TRACING_COLUMN: &str = "";
pub const DEFAULT_TRACING_HEADER: &str = "traceparent";
/// Empty: the topic always comes from the template.
pub const DEFAULT_TOPIC_COLUMN: &str = "";
pub const DEFAULT_ENVELOPE: bool = false;
pub const DEFAULT_NULL_PAYLOAD: NullPayload = NullPayload::Error;
pub const DEFAULT_PARTITION_BY: &str = PARTITION_BY_AGGREGATE_ID;
/// `outbox.partition_by` value: partition by the aggregate id (Java's murmur2 over its bytes).
pub const PARTITION_BY_AGGREGATE_ID: &str = "aggregate_id";
/// `outbox.partition_by` value: partition by the record key, as any Kafka producer does.
pub const PARTITION_BY_KEY: &str = "key";
/// Empty: `pg_logical_emit_message` events are off.
pub const DEFAULT_MESSAGE_PREFIX: &str = "";
pub const DEFAULT_SWEEPER_ENABLED: bool = false;
/// 7 days.
pub const DEFAULT_SWEEPER_RETENTION_MS: u64 = 7 * 24 * 3600 * 1000;
pub const DEFAULT_SWEEPER_INTERVAL_MS: u64 = 10_000;
pub const DEFAULT_SWEEPER_BATCH_SIZE: u64 = 1_000;
pub const MAX_SWEEPER_BATCH_SIZE: u64 = 100_000;
pub const DEFAULT_SWEEPER_CREATED_AT_COLUMN: &str = "created_at";
pub const DEFAULT_SWEEPER_DROP_PARTITIONS: bool = false;
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

pub const DEFAULT_BROKERS: &str = "127.0.0.1:9092";
pub const DEFAULT_CLIENT_ID: &str = "outbox-relay";
/// librdkafka holds ~700 bytes per queued record; 20,000 is ~150 ms of a full-speed drain,
/// far more than a produce round trip, and keeps memory flat (bench/README.md).
pub const DEFAULT_MAX_IN_FLIGHT_MESSAGES: usize = 20_000;
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 8 * 1024 * 1024;
/// Lower bound of `kafka.max_in_flight_bytes` (1 MiB).
pub const MIN_MAX_IN_FLIGHT_BYTES: usize = 1024 * 1024;
pub const DEFAULT_LINGER_MS: u64 = 5;
/// librdkafka's upper bound of `linger.ms`.
pub const MAX_LINGER_MS: u64 = 900_000;
pub const DEFAULT_BATCH_NUM_MESSAGES: usize = 10_000;
/// librdkafka's upper bound of `batch.num.messages`.
pub const MAX_BATCH_NUM_MESSAGES: usize = 1_000_000;
pub const DEFAULT_COMPRESSION: Compression = Compression::Lz4;
pub const DEFAULT_MESSAGE_TIMEOUT_MS: u64 = 300_000;
pub const MIN_MESSAGE_TIMEOUT_MS: u64 = 1_000;
/// librdkafka's upper bound of `message.timeout.ms`.
pub const MAX_MESSAGE_TIMEOUT_MS: u64 = i32::MAX as u64;
pub const DEFAULT_ALLOW_UNSAFE_KAFKA_SETTINGS: bool = false;

pub const DEFAULT_SSL_MODE: SslMode = SslMode::Prefer;
pub const DEFAULT_STANDBY_RETRY_MS: u64 = 2_000;
pub const DEFAULT_STALE_HOLDER_AFTER_MS: u64 = 60_000;
pub const DEFAULT_SLOT_SAMPLE_INTERVAL_MS: u64 = 5_000;

pub const DEFAULT_HTTP_LISTEN: &str = "127.0.0.1:9187";
pub const DEFAULT_READY_STALENESS_MS: u64 = 30_000;

pub const DEFAULT_DEAD_LETTER_POLICY: DeadLetterPolicy = DeadLetterPolicy::DeadLetter;
pub const DEFAULT_DEAD_LETTER_TOPIC: &str = "outbox.dlq";

pub const DEFAULT_SHUTDOWN_TIMEOUT_MS: u64 = 30_000;
pub const DEFAULT_CONFIRM_DELAY_MS: u64 = 20;
pub const DEFAULT_LOG_FORMAT: LogFormat = LogFormat::Text;

/// Longest PostgreSQL identifier, in bytes (NAMEDATALEN - 1).
const MAX_IDENTIFIER_BYTES: usize = 63;
/// Longest Kafka topic name, in characters.
const MAX_TOPIC_CHARS: usize = 249;

/// librdkafka properties the relay sets from a dedicated field, with that field.
const OWNED_KAFKA_PROPERTIES: &[(&str, &str)] = &[
    ("bootstrap.servers", "kafka.brokers"),
    ("metadata.broker.list", "kafka.brokers"),
    ("client.id", "kafka.client_id"),
    ("linger.ms", "kafka.linger_ms"),
    ("queue.buffering.max.ms", "kafka.linger_ms"),
    ("batch.num.messages", "kafka.batch_num_messages"),
    ("compression.type", "kafka.compression"),
    ("compression.codec", "kafka.compression"),
    ("message.timeout.ms", "kafka.message_timeout_ms"),
    ("delivery.timeout.ms", "kafka.message_timeout_ms"),
    // The publisher sizes librdkafka's queue from the in-flight caps.
    (
        "queue.buffering.max.messages",
        "kafka.max_in_flight_messages",
    ),
    ("queue.buffering.max.kbytes", "kafka.max_in_flight_bytes"),
    ("security.protocol", "kafka.security_protocol"),
    ("sasl.mechanism", "kafka.sasl_mechanism"),
    ("sasl.mechanisms", "kafka.sasl_mechanism"),
    ("sasl.username", "kafka.sasl_username"),
    (
        "sasl.password",
        "kafka.sasl_password or kafka.sasl_password_file",
    ),
    ("ssl.ca.location", "kafka.ssl_ca_file"),
];

/// Substrings of `kafka.properties` keys whose values are secrets.
const SECRET_PROPERTY_MARKERS: &[&str] = &[
    "password",
    "secret",
    "sasl.jaas",
    "ssl.key",
    "sasl.oauthbearer.config",
];

/// A configuration problem. Every message is one line naming the file, variable or field.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A file (the config file or `postgres.password_file`) could not be read.
    #[error("cannot read `{}`: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The config text is not TOML, or has an unknown key or a value of the wrong type.
    #[error("{origin}: {message}")]
    Parse { origin: String, message: String },
    /// An `OUTBOX_RELAY__…` environment variable names no key or has an unusable value.
    #[error("environment variable `{var}`: {message}")]
    Env { var: String, message: String },
    /// A value is out of its allowed range or set.
    #[error("invalid config `{field}`: {problem}")]
    Invalid { field: String, problem: String },
}

impl ConfigError {
    fn invalid(field: impl Into<String>, problem: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            problem: problem.into(),
        }
    }

    fn env(var: &str, message: impl Into<String>) -> Self {
        ConfigError::Env {
            var: var.to_string(),
            message: message.into(),
        }
    }
}

/// A secret string: `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself; pass it on, never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

/// The whole configuration; one field per TOML section.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// `[postgres]`: the source database, slot and publication.
    pub postgres: PostgresConfig,
    /// `[outbox]`: the outbox table, its columns and the topic mapping.
    pub outbox: OutboxConfig,
    /// `[kafka]`: the producer.
    pub kafka: KafkaConfig,
    /// `[relay]`: process behaviour.
    pub relay: RelayConfig,
    /// `[http]`: metrics and health endpoints.
    pub http: HttpConfig,
    /// `[dead_letter]`: what happens to rows that cannot be published.
    pub dead_letter: DeadLetterConfig,
}

/// `[postgres]`. `Debug` shows the URL with its password replaced by `***`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// Connection string, URL (`postgres://user[:password]@host[:port]/dbname?…`) or libpq
    /// `key=value` form. Must name a host and a user. The relay opens a normal and a replication
    /// connection to this database.
    pub url: String,
    /// Path of a file holding the password (surrounding whitespace trimmed). Empty: use the
    /// password in `url`, if any. When set it overrides the URL's password. Read at every connect.
    pub password_file: String,
    /// Logical replication slot (pgoutput) the relay consumes: lower-case letters, digits and
    /// `_`, 1 to 63 characters. Its confirmed LSN only advances past rows Kafka acknowledged.
    pub slot: String,
    /// Publication naming the outbox table (an identifier, up to 63 bytes, used quoted).
    pub publication: String,
    /// Create the slot (plugin pgoutput) at start-up if it does not exist.
    pub create_slot: bool,
    /// Create the publication `FOR TABLE <every outbox table> WITH (publish = 'insert')` at
    /// start-up if it does not exist, and add outbox tables it lacks.
    pub create_publication: bool,
    /// Period of standby status updates (LSN feedback and keepalive replies), in milliseconds;
    /// 1 to 30000.
    pub status_interval_ms: u64,
    /// Time limit for establishing a connection, in milliseconds; > 0.
    pub connect_timeout_ms: u64,
    /// First delay before reconnecting after a transient error, in milliseconds; > 0. Doubles on
    /// every further failure.
    pub reconnect_backoff_initial_ms: u64,
    /// Longest delay between reconnect attempts, in milliseconds; >= the initial backoff.
    pub reconnect_backoff_max_ms: u64,
    /// TLS towards PostgreSQL, on both connections: `disable`, `prefer` (TLS when the server
    /// offers it, unverified), `require` (TLS, unverified), `verify-ca` (TLS, certificate signed
    /// by `ssl_root_cert`), `verify-full` (as verify-ca, and the host name must match). An
    /// `sslmode=` / `sslrootcert=` in `url` is used when these keys are left at their defaults.
    pub ssl_mode: SslMode,
    /// CA certificate file (PEM) for `verify-ca` / `verify-full`. Empty: the system's roots.
    pub ssl_root_cert: String,
    /// While another relay streams the slot, how often this one (a standby) tries to take
    /// over, in milliseconds; 100 to 60000.
    pub standby_retry_ms: u64,
    /// A standby calls the slot's holder stale when PostgreSQL has had no reply from it for
    /// this long, in milliseconds (it is then logged as stale); > 0.
    pub stale_holder_after_ms: u64,
    /// End a stale holder's connection (`pg_terminate_backend`) so this relay can take over.
    /// Off by default: a stale-looking holder may still be a live relay behind a slow network.
    pub terminate_stale_holder: bool,
    /// How often the slot's lag, retained WAL and wal_status are sampled (for `/metrics`, and
    /// to stop when the slot is lost), in milliseconds; 100 to 600000.
    pub slot_sample_interval_ms: u64,
    /// TCP keepalive on both connections: silence before the first probe, in milliseconds, at
    /// least 1000 (the kernel counts whole seconds). A `keepalives_idle` (seconds) in `url` applies
    /// when this key is left at its default; `keepalives=0` in `url` turns keepalives off.
    pub keepalives_idle_ms: u64,
    /// Between unanswered keepalive probes, in milliseconds; >= 1000. `keepalives_interval`
    /// (seconds) in `url` applies when this key is left at its default.
    pub keepalives_interval_ms: u64,
    /// Unanswered probes before the connection is dropped; 1 to 127. `keepalives_retries` in
    /// `url` applies when this key is left at its default.
    pub keepalives_retries: u32,
    /// `TCP_USER_TIMEOUT` (Linux) on both connections: data sent and unacknowledged this long
    /// drops the connection, in milliseconds; 0 keeps the system default, else >= 1000.
    /// `tcp_user_timeout` (milliseconds, as libpq) in `url` applies when this key is left at its
    /// default.
    pub tcp_user_timeout_ms: u64,
    /// Receive deadline of the replication stream: no frame for this long ends the session
    /// (reconnect, resume from the slot), in milliseconds. 0 (default): three quarters of the
    /// server's `wal_sender_timeout` (the server sends a keepalive at least every half of it,
    /// and answers every status update), at least two status intervals; 30000 when the server's
    /// `wal_sender_timeout` is 0. Otherwise >= 2 × `status_interval_ms`.
    pub receive_timeout_ms: u64,
    /// Create the slot as a failover slot (PostgreSQL 17+: synchronized to standbys with
    /// `sync_replication_slots`, so that it survives a promotion), or turn failover on for an
    /// existing slot: `auto` (on when the server is 17 or newer), `true` (refuse to run on an
    /// older server), `false` (leave the slot as it is).
    pub failover_slot: FailoverSlot,
}

/// `postgres.failover_slot`: `"auto"`, or `true`/`false` (as strings or booleans).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FailoverSlot {
    Auto,
    True,
    False,
}

impl FailoverSlot {
    pub const NAMES: &'static [&'static str] = &["auto", "true", "false"];

    /// Whether the slot should be a failover slot on a server of this version.
    pub fn wanted(self, server_version_num: i32) -> bool {
        match self {
            FailoverSlot::Auto => server_version_num >= 170000,
            FailoverSlot::True => true,
            FailoverSlot::False => false,
        }
    }
}

impl<'de> Deserialize<'de> for FailoverSlot {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Name(String),
        }
        match Raw::deserialize(d)? {
            Raw::Flag(true) => Ok(FailoverSlot::True),
            Raw::Flag(false) => Ok(FailoverSlot::False),
            Raw::Name(n) => match n.as_str() {
                "auto" => Ok(FailoverSlot::Auto),
                "true" => Ok(FailoverSlot::True),
                "false" => Ok(FailoverSlot::False),
                _ => Err(serde::de::Error::custom(format!(
                    "`{n}` must be one of auto|true|false"
                ))),
            },
        }
    }
}

/// TCP settings for both PostgreSQL connections, resolved from `[postgres]` and the URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpKeepalive {
    /// Keepalive probes on (`keepalives=0` in the URL turns them off).
    pub enabled: bool,
    pub idle: std::time::Duration,
    pub interval: std::time::Duration,
    pub retries: u32,
    /// `TCP_USER_TIMEOUT`; `None` keeps the system default.
    pub user_timeout: Option<std::time::Duration>,
}

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
    /// `topic_overrides`. Empty: none.
    pub topic_column: String,
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
    /// Column holding the record key. Empty: the event id.
    pub key_column: String,
    /// Column holding the event time (timestamptz, timestamp as UTC, or an integer of
    /// milliseconds since the Unix epoch): the record timestamp. Empty, or a null value: the
    /// transaction's commit time.
    pub timestamp_column: String,
    /// Column holding a JSON object (jsonb or json); each key becomes a record header, its
    /// value the header value (strings as they are, other values as JSON, null skipped).
    /// Empty: none.
    pub headers_column: String,
    /// Column holding a tracing span context. A W3C `traceparent` value is sent as header
    /// `tracing_header`; a `key=value` list, one per line (Debezium's `tracingspancontext`),
    /// becomes one header per key. Empty: none.
    pub tracing_column: String,
    /// Header name for a plain span context from `tracing_column`.
    pub tracing_header: String,
    /// Further columns sent as headers (column → header name), like Debezium's
    /// `table.fields.additional.placement` with `header`. Null values are skipped.
    pub header_columns: BTreeMap<String, String>,
    /// Wrap the payload in one JSON object with the event's metadata:
    /// `{"id", "aggregatetype", "aggregateid", "type", "timestamp" (ms), "payload"}`. A json or
    /// jsonb payload is embedded as is, text as a JSON string, bytea as a base64 string.
    pub envelope: bool,
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
    /// Empty: messages are not read.
    pub message_prefix: String,
    /// More outbox tables in the same publication and slot (`[[outbox.tables]]`), each with a
    /// `table` and any of the mapping keys above; unset keys are inherited from `[outbox]`.
    pub tables: Vec<OutboxTableConfig>,
    /// `[outbox.sweeper]`: deletes old, already confirmed rows.
    pub sweeper: SweeperConfig,
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
/// `[outbox]`.
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
    pub envelope: Option<bool>,
    pub null_payload: Option<NullPayload>,
    pub partition_by: Option<String>,
}

/// `[outbox.sweeper]`: keeps the outbox tables small. Off by default.
///
/// Deletes rows whose `created_at_column` is older than `retention_ms` **and** whose inserting
/// transaction the slot has already confirmed (see `sweeper.rs` for why that is exact), in
/// batches of `batch_size`, every `interval_ms`. Rows younger than the retention stay, so
/// `outbox-relay replay` keeps that window of history.
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

/// `[kafka]`. `Debug` hides the values of secret `properties`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// Bootstrap brokers, comma-separated `host:port` (librdkafka `bootstrap.servers`).
    pub brokers: String,
    /// Client id reported to the brokers (librdkafka `client.id`).
    pub client_id: String,
    /// Most records handed to the producer and not yet acknowledged; > 0. At the cap the relay
    /// stops reading WAL until acks arrive.
    pub max_in_flight_messages: usize,
    /// Most key + payload bytes handed to the producer and not yet acknowledged, in bytes;
    /// >= 1 MiB (1048576). At the cap the relay stops reading WAL until acks arrive.
    pub max_in_flight_bytes: usize,
    /// How long the producer waits to fill a batch, in milliseconds (librdkafka `linger.ms`);
    /// 0 to 900000.
    pub linger_ms: u64,
    /// Most records per batch (librdkafka `batch.num.messages`); 1 to 1000000.
    pub batch_num_messages: usize,
    /// Batch compression (librdkafka `compression.type`): `none`, `gzip`, `snappy`, `lz4`, `zstd`.
    pub compression: Compression,
    /// How long a record may wait for the broker before its delivery fails, in milliseconds
    /// (librdkafka `message.timeout.ms`); 1000 to 2147483647. A failed delivery is retried by
    /// the relay; the slot never moves past it.
    pub message_timeout_ms: u64,
    /// Extra librdkafka producer settings, passed through (string to string). In the file,
    /// dotted keys may be quoted (`"socket.timeout.ms" = "60000"`) or bare
    /// (`socket.timeout.ms = 60000`); numbers and booleans become strings. Keys the relay sets
    /// itself are refused, and so are settings that break at-least-once delivery or per-key order
    /// (see [`KafkaConfig::unsafe_properties`]) unless `allow_unsafe_kafka_settings` is true.
    pub properties: BTreeMap<String, String>,
    /// Accept `properties` that weaken at-least-once delivery or ordering (logged as warnings).
    pub allow_unsafe_kafka_settings: bool,
    /// How to talk to the brokers: `plaintext`, `ssl` (TLS), `sasl_plaintext` (SASL, no TLS) or
    /// `sasl_ssl` (SASL over TLS).
    pub security_protocol: KafkaSecurityProtocol,
    /// SASL mechanism for the `sasl_*` protocols: `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub sasl_mechanism: String,
    /// SASL user name.
    pub sasl_username: String,
    /// SASL password (a secret: redacted in logs and `outbox-relay config`). Prefer
    /// `sasl_password_file`.
    pub sasl_password: String,
    /// File holding the SASL password (trimmed); wins over `sasl_password`.
    pub sasl_password_file: String,
    /// CA certificate file (PEM) to verify the brokers' certificates for `ssl` / `sasl_ssl`.
    /// Empty: the system's trusted roots.
    pub ssl_ca_file: String,
}

/// Kafka `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KafkaSecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl KafkaSecurityProtocol {
    pub const NAMES: &'static [&'static str] = &["plaintext", "ssl", "sasl_plaintext", "sasl_ssl"];

    /// The librdkafka `security.protocol` value.
    pub fn as_str(self) -> &'static str {
        Self::NAMES[self as usize]
    }

    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }
}

/// SASL mechanisms librdkafka supports here (built with OpenSSL).
pub const SASL_MECHANISMS: &[&str] = &["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// `[relay]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RelayConfig {
    /// On SIGTERM / Ctrl-C, how long to wait for in-flight deliveries before exiting, in
    /// milliseconds. Unacknowledged rows are never confirmed; they are sent again after restart.
    pub shutdown_timeout_ms: u64,
    /// After Kafka acknowledged events, how long to wait before confirming the new position to
    /// PostgreSQL, in milliseconds: later acknowledgements in that window share one status
    /// update. Bounds what a crash re-sends (about this long of traffic, plus what was in
    /// flight); 0 confirms after every batch of acknowledgements.
    pub confirm_delay_ms: u64,
    /// Log output format: `text` (human-readable) or `json` (one object per line).
    pub log_format: LogFormat,
}

/// `[http]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpConfig {
    /// Address of the HTTP listener serving `/metrics`, `/healthz` and `/readyz`
    /// (`host:port`). Empty: no listener.
    pub listen: String,
    /// `/readyz` reports not ready when events have waited this long without the confirmed
    /// position moving (Kafka down, a stuck delivery), in milliseconds; > 0.
    pub ready_staleness_ms: u64,
}

/// `[dead_letter]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeadLetterConfig {
    /// What to do with a row that cannot become a Kafka record (a null routing column, an
    /// invalid topic name, a payload over the broker's limit): `dead_letter` sends it to
    /// `topic` with headers saying why and the stream goes on; `stop` halts the relay with the
    /// error, without confirming past the row.
    pub policy: DeadLetterPolicy,
    /// The dead-letter topic.
    pub topic: String,
}

/// TLS mode towards PostgreSQL, as libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    pub const NAMES: &'static [&'static str] =
        &["disable", "prefer", "require", "verify-ca", "verify-full"];

    pub fn parse(text: &str) -> Option<SslMode> {
        match text {
            "disable" => Some(SslMode::Disable),
            "prefer" | "allow" => Some(SslMode::Prefer),
            "require" => Some(SslMode::Require),
            "verify-ca" => Some(SslMode::VerifyCa),
            "verify-full" => Some(SslMode::VerifyFull),
            _ => None,
        }
    }
}

/// What to do with a row that cannot be published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterPolicy {
    DeadLetter,
    Stop,
}

impl DeadLetterPolicy {
    pub const NAMES: &'static [&'static str] = &["dead_letter", "stop"];
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: DEFAULT_HTTP_LISTEN.to_string(),
            ready_staleness_ms: DEFAULT_READY_STALENESS_MS,
        }
    }
}

impl Default for DeadLetterConfig {
    fn default() -> Self {
        DeadLetterConfig {
            policy: DEFAULT_DEAD_LETTER_POLICY,
            topic: DEFAULT_DEAD_LETTER_TOPIC.to_string(),
        }
    }
}

impl HttpConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if !self.listen.is_empty() && self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::invalid(
                "http.listen",
                format!(
                    "`{}` is not host:port (e.g. 127.0.0.1:9187); empty turns the listener off",
                    self.listen
                ),
            ));
        }
        if self.ready_staleness_ms == 0 {
            return Err(ConfigError::invalid(
                "http.ready_staleness_ms",
                "must be > 0 (ms)",
            ));
        }
        Ok(())
    }
}

impl DeadLetterConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(problem) = crate::mapping::topic_name_problem(&self.topic) {
            return Err(ConfigError::invalid(
                "dead_letter.topic",
                format!(
                    "`{}` is not a valid Kafka topic name: {problem}",
                    self.topic
                ),
            ));
        }
        Ok(())
    }
}

/// Kafka batch compression codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    /// Every codec, in the spelling of the config file.
    pub const NAMES: &'static [&'static str] = &["none", "gzip", "snappy", "lz4", "zstd"];

    /// The librdkafka `compression.type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Gzip => "gzip",
            Compression::Snappy => "snappy",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    /// Every format, in the spelling of the config file.
    pub const NAMES: &'static [&'static str] = &["text", "json"];
}

/// Keys whose string value must be one of a fixed set (the enums above), checked before
/// deserializing so that the error names the field.
const ENUM_KEYS: &[(&str, &str, &[&str])] = &[
    ("kafka", "compression", Compression::NAMES),
    ("relay", "log_format", LogFormat::NAMES),
    ("postgres", "ssl_mode", SslMode::NAMES),
    ("postgres", "failover_slot", FailoverSlot::NAMES),
    ("kafka", "security_protocol", KafkaSecurityProtocol::NAMES),
    ("dead_letter", "policy", DeadLetterPolicy::NAMES),
    ("outbox", "null_payload", NullPayload::NAMES),
];

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: DEFAULT_POSTGRES_URL.to_string(),
            password_file: DEFAULT_PASSWORD_FILE.to_string(),
            slot: DEFAULT_SLOT.to_string(),
            publication: DEFAULT_PUBLICATION.to_string(),
            create_slot: DEFAULT_CREATE_SLOT,
            create_publication: DEFAULT_CREATE_PUBLICATION,
            status_interval_ms: DEFAULT_STATUS_INTERVAL_MS,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            reconnect_backoff_initial_ms: DEFAULT_RECONNECT_BACKOFF_INITIAL_MS,
            reconnect_backoff_max_ms: DEFAULT_RECONNECT_BACKOFF_MAX_MS,
            ssl_mode: DEFAULT_SSL_MODE,
            ssl_root_cert: String::new(),
            standby_retry_ms: DEFAULT_STANDBY_RETRY_MS,
            stale_holder_after_ms: DEFAULT_STALE_HOLDER_AFTER_MS,
            terminate_stale_holder: false,
            slot_sample_interval_ms: DEFAULT_SLOT_SAMPLE_INTERVAL_MS,
            keepalives_idle_ms: DEFAULT_KEEPALIVES_IDLE_MS,
            keepalives_interval_ms: DEFAULT_KEEPALIVES_INTERVAL_MS,
            keepalives_retries: DEFAULT_KEEPALIVES_RETRIES,
            tcp_user_timeout_ms: DEFAULT_TCP_USER_TIMEOUT_MS,
            receive_timeout_ms: DEFAULT_RECEIVE_TIMEOUT_MS,
            failover_slot: FailoverSlot::Auto,
        }
    }
}

impl Default for OutboxConfig {
    fn default() -> Self {
        OutboxConfig {
            table: DEFAULT_OUTBOX_TABLE.to_string(),
            topic: DEFAULT_TOPIC_TEMPLATE.to_string(),
            topic_overrides: BTreeMap::new(),
            topic_column: DEFAULT_TOPIC_COLUMN.to_string(),
            id_column: DEFAULT_ID_COLUMN.to_string(),
            aggregate_type_column: DEFAULT_AGGREGATE_TYPE_COLUMN.to_string(),
            aggregate_id_column: DEFAULT_AGGREGATE_ID_COLUMN.to_string(),
            type_column: DEFAULT_TYPE_COLUMN.to_string(),
            payload_column: DEFAULT_PAYLOAD_COLUMN.to_string(),
            key_column: DEFAULT_KEY_COLUMN.to_string(),
            timestamp_column: DEFAULT_TIMESTAMP_COLUMN.to_string(),
            headers_column: DEFAULT_HEADERS_COLUMN.to_string(),
            tracing_column: DEFAULT_TRACING_COLUMN.to_string(),
            tracing_header: DEFAULT_TRACING_HEADER.to_string(),
            header_columns: BTreeMap::new(),
            envelope: DEFAULT_ENVELOPE,
            null_payload: DEFAULT_NULL_PAYLOAD,
            partition_by: DEFAULT_PARTITION_BY.to_string(),
            message_prefix: DEFAULT_MESSAGE_PREFIX.to_string(),
            tables: Vec::new(),
            sweeper: SweeperConfig::default(),
        }
    }
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            enabled: DEFAULT_SWEEPER_ENABLED,
            retention_ms: DEFAULT_SWEEPER_RETENTION_MS,
            interval_ms: DEFAULT_SWEEPER_INTERVAL_MS,
            batch_size: DEFAULT_SWEEPER_BATCH_SIZE,
            created_at_column: DEFAULT_SWEEPER_CREATED_AT_COLUMN.to_string(),
            drop_partitions: DEFAULT_SWEEPER_DROP_PARTITIONS,
        }
    }
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: DEFAULT_BROKERS.to_string(),
            client_id: DEFAULT_CLIENT_ID.to_string(),
            max_in_flight_messages: DEFAULT_MAX_IN_FLIGHT_MESSAGES,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            linger_ms: DEFAULT_LINGER_MS,
            batch_num_messages: DEFAULT_BATCH_NUM_MESSAGES,
            compression: DEFAULT_COMPRESSION,
            message_timeout_ms: DEFAULT_MESSAGE_TIMEOUT_MS,
            properties: BTreeMap::new(),
            allow_unsafe_kafka_settings: DEFAULT_ALLOW_UNSAFE_KAFKA_SETTINGS,
            security_protocol: KafkaSecurityProtocol::Plaintext,
            sasl_mechanism: String::new(),
            sasl_username: String::new(),
            sasl_password: String::new(),
            sasl_password_file: String::new(),
            ssl_ca_file: String::new(),
        }
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            shutdown_timeout_ms: DEFAULT_SHUTDOWN_TIMEOUT_MS,
            confirm_delay_ms: DEFAULT_CONFIRM_DELAY_MS,
            log_format: DEFAULT_LOG_FORMAT,
        }
    }
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &self.redacted_url())
            .field("password_file", &self.password_file)
            .field("slot", &self.slot)
            .field("publication", &self.publication)
            .field("create_slot", &self.create_slot)
            .field("create_publication", &self.create_publication)
            .field("status_interval_ms", &self.status_interval_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field(
                "reconnect_backoff_initial_ms",
                &self.reconnect_backoff_initial_ms,
            )
            .field("reconnect_backoff_max_ms", &self.reconnect_backoff_max_ms)
            .field("ssl_mode", &self.ssl_mode)
            .field("ssl_root_cert", &self.ssl_root_cert)
            .field("standby_retry_ms", &self.standby_retry_ms)
            .field("stale_holder_after_ms", &self.stale_holder_after_ms)
            .field("terminate_stale_holder", &self.terminate_stale_holder)
            .field("slot_sample_interval_ms", &self.slot_sample_interval_ms)
            .field("keepalives_idle_ms", &self.keepalives_idle_ms)
            .field("keepalives_interval_ms", &self.keepalives_interval_ms)
            .field("keepalives_retries", &self.keepalives_retries)
            .field("tcp_user_timeout_ms", &self.tcp_user_timeout_ms)
            .field("receive_timeout_ms", &self.receive_timeout_ms)
            .field("failover_slot", &self.failover_slot)
            .finish()
    }
}

impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("client_id", &self.client_id)
            .field("max_in_flight_messages", &self.max_in_flight_messages)
            .field("max_in_flight_bytes", &self.max_in_flight_bytes)
            .field("linger_ms", &self.linger_ms)
            .field("batch_num_messages", &self.batch_num_messages)
            .field("compression", &self.compression)
            .field("message_timeout_ms", &self.message_timeout_ms)
            .field("properties", &self.redacted_properties())
            .field(
                "allow_unsafe_kafka_settings",
                &self.allow_unsafe_kafka_settings,
            )
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &Secret::new(self.sasl_password.clone()))
            .field("sasl_password_file", &self.sasl_password_file)
            .field("ssl_ca_file", &self.ssl_ca_file)
            .finish()
    }
}

type Table = toml::map::Map<String, toml::Value>;

impl Config {
    /// Loads the configuration: defaults, then the TOML file at `path` (if given; a missing
    /// file is an error), then `OUTBOX_RELAY__…` variables of the process environment; then
    /// validates it and checks that `postgres.password_file`, if set, is readable.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let text = match path {
            Some(path) => {
                Some(
                    std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
                        path: path.to_path_buf(),
                        source,
                    })?,
                )
            }
            None => None,
        };
        let origin = match path {
            Some(path) => format!("config file `{}`", path.display()),
            None => "config".to_string(),
        };
        let env = env_vars()?;
        let config = Config::build(&origin, text.as_deref(), env)?;
        config.postgres.password()?;
        if config.kafka.allow_unsafe_kafka_settings {
            for (key, value, reason) in config.kafka.unsafe_properties() {
                tracing::warn!(
                    property = %key,
                    value = %value,
                    reason,
                    "unsafe Kafka setting accepted (kafka.allow_unsafe_kafka_settings = true)"
                );
            }
        }
        Ok(config)
    }

    /// [`Config::load`] without touching the file system or the process environment:
    /// `toml_text` is the file's content, `env` the environment variables to consider
    /// (variables without the `OUTBOX_RELAY__` prefix are ignored). Validates the result.
    pub fn from_sources(
        toml_text: Option<&str>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Config::build("config text", toml_text, env)
    }

    fn build(
        origin: &str,
        toml_text: Option<&str>,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut merged = match toml::Value::try_from(Config::default()) {
            Ok(toml::Value::Table(table)) => table,
            Ok(_) | Err(_) => {
                return Err(ConfigError::Parse {
                    origin: "built-in defaults".to_string(),
                    message: "cannot be represented as a TOML table".to_string(),
                })
            }
        };
        if let Some(text) = toml_text {
            let file = text.parse::<Table>().map_err(|err| ConfigError::Parse {
                origin: origin.to_string(),
                message: describe_toml_error(text, &err),
            })?;
            merge_file(&mut merged, file, "", origin)?;
        }
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .filter(|(name, _)| name.starts_with(ENV_PREFIX))
            .collect();
        env.sort();
        for (var, value) in &env {
            apply_env(&mut merged, var, value)?;
        }
        check_enums(&merged)?;
        let config: Config =
            toml::Value::Table(merged)
                .try_into()
                .map_err(|err: toml::de::Error| ConfigError::Parse {
                    origin: origin.to_string(),
                    message: one_line(err.message()),
                })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks every value against its constraint; the error names the field (`section.key`).
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.postgres.validate()?;
        self.outbox.validate()?;
        self.kafka.validate()?;
        self.http.validate()?;
        self.dead_letter.validate()?;
        Ok(())
    }

    /// The effective configuration as TOML, for `outbox-relay config`: the URL's password and
    /// the values of secret `kafka.properties` are replaced by `***`.
    pub fn to_redacted_toml(&self) -> String {
        let mut shown = self.clone();
        shown.postgres.url = self.postgres.redacted_url();
        shown.kafka.properties = self.kafka.redacted_properties();
        if !shown.kafka.sasl_password.is_empty() {
            shown.kafka.sasl_password = REDACTED.to_string();
        }
        toml::to_string(&shown)
            .unwrap_or_else(|err| format!("# cannot render the configuration: {err}\n"))
    }
}

impl PostgresConfig {
    /// `url` with any password (in the user info, a `password=` parameter or `password=` of
    /// the `key=value` form) replaced by `***`.
    pub fn redacted_url(&self) -> String {
        redact_connection_string(&self.url)
    }

    /// The password file, if `password_file` is set.
    pub fn password_file_path(&self) -> Option<&Path> {
        (!self.password_file.is_empty()).then(|| Path::new(&self.password_file))
    }

    /// The password to connect with: the trimmed content of `password_file` if set (read now),
    /// else the URL's password, if any.
    pub fn password(&self) -> Result<Option<Secret>, ConfigError> {
        if let Some(path) = self.password_file_path() {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            let password = text.trim();
            if password.is_empty() {
                return Err(ConfigError::invalid(
                    "postgres.password_file",
                    format!("`{}` is empty", path.display()),
                ));
            }
            return Ok(Some(Secret::new(password)));
        }
        let parsed = self.parsed_url()?;
        Ok(parsed
            .get_password()
            .map(|p| Secret::new(String::from_utf8_lossy(p).into_owned())))
    }

    fn parsed_url(&self) -> Result<tokio_postgres::Config, ConfigError> {
        // tokio-postgres knows neither verify-ca nor verify-full: the TLS parameters are ours
        // (see `tls::TlsSettings::resolve`), the rest is checked by its parser.
        let (url, mode, _) = crate::postgres::tls::split_tls_params(&self.url);
        if let Some(mode) = mode.filter(|m| SslMode::parse(m).is_none()) {
            return Err(ConfigError::invalid(
                "postgres.url",
                format!(
                    "sslmode `{mode}` is not one of {}",
                    SslMode::NAMES.join(", ")
                ),
            ));
        }
        // tokio-postgres' parse errors name the option, never its value.
        url.parse::<tokio_postgres::Config>().map_err(|err| {
            ConfigError::invalid(
                "postgres.url",
                format!("not a PostgreSQL connection string: {err}"),
            )
        })
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.url.trim().is_empty() {
            return Err(ConfigError::invalid("postgres.url", "must not be empty"));
        }
        let parsed = self.parsed_url()?;
        if parsed.get_hosts().is_empty() {
            return Err(ConfigError::invalid(
                "postgres.url",
                format!("`{}` names no host", self.redacted_url()),
            ));
        }
        if parsed.get_user().is_none_or(str::is_empty) {
            return Err(ConfigError::invalid(
                "postgres.url",
                format!("`{}` names no user", self.redacted_url()),
            ));
        }
        let slot_ok = (1..=MAX_IDENTIFIER_BYTES).contains(&self.slot.len())
            && self
                .slot
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !slot_ok {
            return Err(ConfigError::invalid(
                "postgres.slot",
                format!(
                    "`{}` is not a replication slot name: use 1 to 63 lower-case letters, digits or `_`",
                    self.slot
                ),
            ));
        }
        check_identifier("postgres.publication", &self.publication)?;
        check_range(
            "postgres.status_interval_ms",
            self.status_interval_ms,
            1,
            MAX_STATUS_INTERVAL_MS,
            "ms",
        )?;
        check_range(
            "postgres.connect_timeout_ms",
            self.connect_timeout_ms,
            1,
            u64::MAX,
            "ms",
        )?;
        check_range(
            "postgres.reconnect_backoff_initial_ms",
            self.reconnect_backoff_initial_ms,
            1,
            u64::MAX,
            "ms",
        )?;
        if self.reconnect_backoff_max_ms < self.reconnect_backoff_initial_ms {
            return Err(ConfigError::invalid(
                "postgres.reconnect_backoff_max_ms",
                format!(
                    "must be >= postgres.reconnect_backoff_initial_ms ({} ms), got {} ms",
                    self.reconnect_backoff_initial_ms, self.reconnect_backoff_max_ms
                ),
            ));
        }
        let ranges = [
            (
                "postgres.standby_retry_ms",
                self.standby_retry_ms,
                100,
                60_000,
            ),
            (
                "postgres.stale_holder_after_ms",
                self.stale_holder_after_ms,
                1,
                u64::MAX,
            ),
            (
                "postgres.slot_sample_interval_ms",
                self.slot_sample_interval_ms,
                100,
                600_000,
            ),
        ];
        for (field, value, min, max) in ranges {
            if !(min..=max).contains(&value) {
                return Err(ConfigError::invalid(
                    field,
                    format!("must be between {min} and {max} (ms), got {value}"),
                ));
            }
        }
        self.validate_network()?;
        let needs_ca = matches!(self.ssl_mode, SslMode::VerifyCa | SslMode::VerifyFull);
        if !self.ssl_root_cert.is_empty() && !needs_ca {
            return Err(ConfigError::invalid(
                "postgres.ssl_root_cert",
                "is only used with ssl_mode = \"verify-ca\" or \"verify-full\"",
            ));
        }
        Ok(())
    }
}

impl PostgresConfig {
    /// Keepalive, user timeout and receive deadline bounds.
    fn validate_network(&self) -> Result<(), ConfigError> {
        check_range(
            "postgres.keepalives_idle_ms",
            self.keepalives_idle_ms,
            1_000,
            u64::MAX,
            "ms",
        )?;
        check_range(
            "postgres.keepalives_interval_ms",
            self.keepalives_interval_ms,
            1_000,
            u64::MAX,
            "ms",
        )?;
        check_range(
            "postgres.keepalives_retries",
            u64::from(self.keepalives_retries),
            1,
            127,
            "probes",
        )?;
        if self.tcp_user_timeout_ms != 0 && self.tcp_user_timeout_ms < 1_000 {
            return Err(ConfigError::invalid(
                "postgres.tcp_user_timeout_ms",
                format!(
                    "must be 0 (system default) or >= 1000 (ms), got {}",
                    self.tcp_user_timeout_ms
                ),
            ));
        }
        let min_receive = self.status_interval_ms.saturating_mul(2);
        if self.receive_timeout_ms != 0 && self.receive_timeout_ms < min_receive {
            return Err(ConfigError::invalid(
                "postgres.receive_timeout_ms",
                format!(
                    "must be 0 (derived from wal_sender_timeout) or >= 2 × postgres.status_interval_ms ({min_receive} ms): the server's frames answer our status updates; got {}",
                    self.receive_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    /// The TCP settings both connections use: the `[postgres]` keys, or the URL's libpq
    /// parameters (`keepalives`, `keepalives_idle`, `keepalives_interval`, `keepalives_retries`
    /// in seconds/count, `tcp_user_timeout` in milliseconds) where a key is left at its default.
    pub fn tcp_keepalive(&self) -> TcpKeepalive {
        use std::time::Duration;
        let (url, _, _) = crate::postgres::tls::split_tls_params(&self.url);
        let parsed = url.parse::<tokio_postgres::Config>().ok();
        // tokio-postgres' own defaults: a getter that differs from them was set by the URL.
        let pristine = tokio_postgres::Config::new();
        let from_url = |get: &dyn Fn(&tokio_postgres::Config) -> Option<Duration>| {
            parsed
                .as_ref()
                .and_then(|p| get(p).filter(|d| Some(*d) != get(&pristine)))
        };
        let keyed = |configured_ms: u64, default_ms: u64, url: Option<Duration>| match url {
            Some(d) if configured_ms == default_ms => d,
            _ => Duration::from_millis(configured_ms),
        };
        let idle = keyed(
            self.keepalives_idle_ms,
            DEFAULT_KEEPALIVES_IDLE_MS,
            from_url(&|c| Some(c.get_keepalives_idle())),
        );
        let interval = keyed(
            self.keepalives_interval_ms,
            DEFAULT_KEEPALIVES_INTERVAL_MS,
            from_url(&|c| c.get_keepalives_interval()),
        );
        let retries = match parsed.as_ref().and_then(|p| p.get_keepalives_retries()) {
            Some(n) if self.keepalives_retries == DEFAULT_KEEPALIVES_RETRIES && n > 0 => n,
            _ => self.keepalives_retries,
        };
        // libpq counts tcp_user_timeout in milliseconds; tokio-postgres' parser reads seconds.
        let url_user_timeout = from_url(&|c| c.get_tcp_user_timeout().copied())
            .map(|d| Duration::from_millis(d.as_secs()));
        let user_timeout = keyed(
            self.tcp_user_timeout_ms,
            DEFAULT_TCP_USER_TIMEOUT_MS,
            url_user_timeout,
        );
        TcpKeepalive {
            enabled: parsed.as_ref().is_none_or(|p| p.get_keepalives()),
            idle,
            interval,
            retries,
            user_timeout: (!user_timeout.is_zero()).then_some(user_timeout),
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

    /// True when `pg_logical_emit_message` events are read (`message_prefix` is set): the
    /// replication must then be started with the pgoutput option `messages`.
    pub fn messages_enabled(&self) -> bool {
        !self.message_prefix.is_empty()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.table.is_empty() {
            if self.tables.is_empty() && self.message_prefix.is_empty() {
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
        if self.message_prefix.contains('\0') {
            return Err(ConfigError::invalid(
                "outbox.message_prefix",
                "must not contain a NUL character",
            ));
        }
        self.sweeper.validate()
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
        ] {
            if !column.is_empty() {
                check_identifier(&field(key), column)?;
            }
        }
        if !self.tracing_column.is_empty() {
            check_header_name(&field("tracing_header"), &self.tracing_header)?;
        }
        for (column, header) in &self.header_columns {
            check_identifier(&field("header_columns"), column)?;
            check_header_name(&field(&format!("header_columns.{column}")), header)?;
        }
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

impl OutboxTableConfig {
    /// This entry's complete mapping: its own keys, the rest from `base`.
    fn resolve(&self, base: &OutboxConfig) -> OutboxConfig {
        fn pick<T: Clone>(own: &Option<T>, inherited: &T) -> T {
            own.clone().unwrap_or_else(|| inherited.clone())
        }
        OutboxConfig {
            table: self.table.clone(),
            topic: pick(&self.topic, &base.topic),
            topic_overrides: pick(&self.topic_overrides, &base.topic_overrides),
            topic_column: pick(&self.topic_column, &base.topic_column),
            id_column: pick(&self.id_column, &base.id_column),
            aggregate_type_column: pick(&self.aggregate_type_column, &base.aggregate_type_column),
            aggregate_id_column: pick(&self.aggregate_id_column, &base.aggregate_id_column),
            type_column: pick(&self.type_column, &base.type_column),
            payload_column: pick(&self.payload_column, &base.payload_column),
            key_column: pick(&self.key_column, &base.key_column),
            timestamp_column: pick(&self.timestamp_column, &base.timestamp_column),
            headers_column: pick(&self.headers_column, &base.headers_column),
            tracing_column: pick(&self.tracing_column, &base.tracing_column),
            tracing_header: pick(&self.tracing_header, &base.tracing_header),
            header_columns: pick(&self.header_columns, &base.header_columns),
            envelope: pick(&self.envelope, &base.envelope),
            null_payload: pick(&self.null_payload, &base.null_payload),
            partition_by: pick(&self.partition_by, &base.partition_by),
            message_prefix: base.message_prefix.clone(),
            tables: Vec::new(),
            sweeper: base.sweeper.clone(),
        }
    }
}

impl SweeperConfig {
    fn validate(&self) -> Result<(), ConfigError> {
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

/// A Kafka header name: non-empty UTF-8 (any characters are allowed by Kafka).
fn check_header_name(field: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty() {
        return Err(ConfigError::invalid(
            field,
            "a header name must not be empty",
        ));
    }
    Ok(())
}

/// `[outbox]` keys whose value is not a scalar: the maps column → header and aggregate type →
/// topic (tables of strings) and `[[outbox.tables]]` (an array of tables, whose entries are
/// checked when deserialized): true when `full` is one of them and `value` has its shape.
fn is_outbox_free_form(full: &str, value: &toml::Value) -> Result<bool, String> {
    match full {
        "outbox.topic_overrides" | "outbox.header_columns" => match value {
            toml::Value::Table(entries) => {
                if let Some((key, bad)) = entries.iter().find(|(_, v)| !v.is_str()) {
                    return Err(format!(
                        "`{full}.{key}` must be a string, found {}",
                        type_name(bad)
                    ));
                }
                Ok(true)
            }
            other => Err(format!(
                "`{full}` must be a table of strings, found {}",
                type_name(other)
            )),
        },
        "outbox.tables" => match value {
            toml::Value::Array(entries) if entries.iter().all(toml::Value::is_table) => Ok(true),
            other => Err(format!(
                "`{full}` must be an array of tables ([[outbox.tables]] entries), found {}",
                type_name(other)
            )),
        },
        _ => Ok(false),
    }
}

impl KafkaConfig {
    /// Entries of `properties` that would break at-least-once delivery or per-key ordering:
    /// `(key, value, reason)`. [`Config::validate`] refuses them unless
    /// `allow_unsafe_kafka_settings` is true.
    pub fn unsafe_properties(&self) -> Vec<(String, String, &'static str)> {
        self.properties
            .iter()
            .filter_map(|(key, value)| {
                unsafe_reason(key, value).map(|reason| (key.clone(), value.clone(), reason))
            })
            .collect()
    }

    /// The SASL password: the trimmed content of `sasl_password_file` if set (read now), else
    /// `sasl_password`.
    pub fn sasl_password(&self) -> Result<Secret, ConfigError> {
        if self.sasl_password_file.is_empty() {
            return Ok(Secret::new(self.sasl_password.clone()));
        }
        let path = Path::new(&self.sasl_password_file);
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Secret::new(text.trim()))
    }

    fn validate_security(&self) -> Result<(), ConfigError> {
        let sasl = self.security_protocol.uses_sasl();
        if sasl && !SASL_MECHANISMS.contains(&self.sasl_mechanism.as_str()) {
            return Err(ConfigError::invalid(
                "kafka.sasl_mechanism",
                format!(
                    "`{}` is not one of {} (required with security_protocol = \"{}\")",
                    self.sasl_mechanism,
                    SASL_MECHANISMS.join(", "),
                    self.security_protocol.as_str()
                ),
            ));
        }
        if sasl && self.sasl_username.is_empty() {
            return Err(ConfigError::invalid(
                "kafka.sasl_username",
                "must be set with a sasl_* security_protocol",
            ));
        }
        let sasl_fields = [
            ("kafka.sasl_mechanism", &self.sasl_mechanism),
            ("kafka.sasl_username", &self.sasl_username),
            ("kafka.sasl_password", &self.sasl_password),
            ("kafka.sasl_password_file", &self.sasl_password_file),
        ];
        if let Some((field, _)) = sasl_fields.iter().find(|(_, v)| !sasl && !v.is_empty()) {
            return Err(ConfigError::invalid(
                *field,
                "is only used with security_protocol = \"sasl_plaintext\" or \"sasl_ssl\"",
            ));
        }
        if !self.sasl_password_file.is_empty() {
            // Fail at start-up, not at the first connection to a broker.
            self.sasl_password()?;
        }
        if !self.ssl_ca_file.is_empty() && !self.security_protocol.uses_tls() {
            return Err(ConfigError::invalid(
                "kafka.ssl_ca_file",
                "is only used with security_protocol = \"ssl\" or \"sasl_ssl\"",
            ));
        }
        Ok(())
    }

    /// `properties` with the values of secret keys (containing `password`, `secret`,
    /// `sasl.jaas`, `ssl.key`, `sasl.oauthbearer.config`) replaced by `***`.
    pub fn redacted_properties(&self) -> BTreeMap<String, String> {
        self.properties
            .iter()
            .map(|(key, value)| {
                let shown = if is_secret_property(key) {
                    REDACTED.to_string()
                } else {
                    value.clone()
                };
                (key.clone(), shown)
            })
            .collect()
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.brokers.trim().is_empty() {
            return Err(ConfigError::invalid("kafka.brokers", "must not be empty"));
        }
        if self.brokers.split(',').any(|b| b.trim().is_empty()) {
            return Err(ConfigError::invalid(
                "kafka.brokers",
                format!("`{}` has an empty entry", self.brokers),
            ));
        }
        if self.client_id.trim().is_empty() {
            return Err(ConfigError::invalid("kafka.client_id", "must not be empty"));
        }
        check_range(
            "kafka.max_in_flight_messages",
            self.max_in_flight_messages as u64,
            1,
            u64::MAX,
            "messages",
        )?;
        check_range(
            "kafka.max_in_flight_bytes",
            self.max_in_flight_bytes as u64,
            MIN_MAX_IN_FLIGHT_BYTES as u64,
            u64::MAX,
            "bytes",
        )?;
        check_range("kafka.linger_ms", self.linger_ms, 0, MAX_LINGER_MS, "ms")?;
        check_range(
            "kafka.batch_num_messages",
            self.batch_num_messages as u64,
            1,
            MAX_BATCH_NUM_MESSAGES as u64,
            "messages",
        )?;
        check_range(
            "kafka.message_timeout_ms",
            self.message_timeout_ms,
            MIN_MESSAGE_TIMEOUT_MS,
            MAX_MESSAGE_TIMEOUT_MS,
            "ms",
        )?;
        for key in self.properties.keys() {
            let field = format!("kafka.properties.{key}");
            if key.trim().is_empty() {
                return Err(ConfigError::invalid(field, "the key must not be empty"));
            }
            let normalized = key.trim().to_ascii_lowercase();
            if let Some((_, owner)) = OWNED_KAFKA_PROPERTIES
                .iter()
                .find(|(name, _)| *name == normalized)
            {
                return Err(ConfigError::invalid(
                    field,
                    format!("is set by the relay; use `{owner}` instead"),
                ));
            }
        }
        self.validate_security()?;
        if !self.allow_unsafe_kafka_settings {
            if let Some((key, value, reason)) = self.unsafe_properties().into_iter().next() {
                return Err(ConfigError::invalid(
                    format!("kafka.properties.{key}"),
                    format!(
                        "`{value}` is unsafe: {reason}; remove it, or set \
                         kafka.allow_unsafe_kafka_settings = true to accept the risk"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Why `key = value` breaks at-least-once delivery or ordering, if it does.
fn unsafe_reason(key: &str, value: &str) -> Option<&'static str> {
    let key = key.trim().to_ascii_lowercase();
    let value = value.trim().to_ascii_lowercase();
    let is_false = matches!(value.as_str(), "false" | "0" | "f" | "off" | "no");
    let is_true = matches!(value.as_str(), "true" | "1" | "t" | "on" | "yes");
    match key.as_str() {
        "acks" | "request.required.acks" if value != "all" && value != "-1" => {
            Some("the broker would acknowledge records before all in-sync replicas have them, so an acknowledged record can be lost (use `all`)")
        }
        "enable.idempotence" if is_false => {
            Some("without idempotence, retries can reorder or duplicate records within a partition")
        }
        "max.in.flight.requests.per.connection" | "max.in.flight" => match value.parse::<u64>() {
            Ok(n) if n <= 5 => None,
            _ => Some("more than 5 in-flight requests per connection breaks ordering of the idempotent producer"),
        },
        "message.send.max.retries" | "retries" if value == "0" => {
            Some("without retries a transient broker error fails the delivery instead of retrying it")
        }
        "delivery.report.only.error" if is_true => {
            Some("the relay needs a delivery report for every record to confirm the slot")
        }
        _ => None,
    }
}

fn is_secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_PROPERTY_MARKERS
        .iter()
        .any(|marker| key.contains(marker))
}

fn check_range(field: &str, value: u64, min: u64, max: u64, unit: &str) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) {
        return Ok(());
    }
    let problem = match (min, max) {
        (1, u64::MAX) => format!("must be > 0 ({unit}), got {value}"),
        (_, u64::MAX) => format!("must be >= {min} ({unit}), got {value}"),
        _ => format!("must be between {min} and {max} ({unit}), got {value}"),
    };
    Err(ConfigError::invalid(field, problem))
}

/// A PostgreSQL identifier that the relay quotes: non-empty, at most 63 bytes, no NUL.
fn check_identifier(field: &str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() {
        return Err(ConfigError::invalid(field, "must not be empty"));
    }
    if value.len() > MAX_IDENTIFIER_BYTES {
        return Err(ConfigError::invalid(
            field,
            format!(
                "`{value}` is {} bytes; PostgreSQL identifiers have at most {MAX_IDENTIFIER_BYTES}",
                value.len()
            ),
        ));
    }
    if value.contains('\0') {
        return Err(ConfigError::invalid(
            field,
            "must not contain a NUL character",
        ));
    }
    Ok(())
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
        if !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
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

/// The process environment as UTF-8 pairs; a non-UTF-8 variable with our prefix is an error,
/// other non-UTF-8 variables are ignored.
fn env_vars() -> Result<Vec<(String, String)>, ConfigError> {
    let mut vars = Vec::new();
    for (name, value) in std::env::vars_os() {
        let name = name.to_string_lossy().into_owned();
        if !name.starts_with(ENV_PREFIX) {
            continue;
        }
        match value.into_string() {
            Ok(value) => vars.push((name, value)),
            Err(_) => return Err(ConfigError::env(&name, "the value is not valid UTF-8")),
        }
    }
    Ok(vars)
}

fn type_name(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date-time",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

fn join_path(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn known_keys(table: &Table) -> String {
    table
        .keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Lays the file's `file` table over `defaults`, refusing unknown keys and wrong types.
fn merge_file(
    defaults: &mut Table,
    file: Table,
    path: &str,
    origin: &str,
) -> Result<(), ConfigError> {
    let parse_err = |message: String| ConfigError::Parse {
        origin: origin.to_string(),
        message,
    };
    let known = known_keys(defaults);
    for (key, value) in file {
        let full = join_path(path, &key);
        if full == "kafka.properties" {
            let toml::Value::Table(entries) = value else {
                return Err(parse_err(format!(
                    "`kafka.properties` must be a table of strings, found {}",
                    type_name(&value)
                )));
            };
            let mut flat = Table::new();
            flatten_properties(&mut flat, entries, "").map_err(parse_err)?;
            defaults.insert(key, toml::Value::Table(flat));
            continue;
        }
        if is_outbox_free_form(&full, &value).map_err(parse_err)? {
            defaults.insert(key, value);
            continue;
        }
        let Some(slot) = defaults.get_mut(&key) else {
            return Err(parse_err(if path.is_empty() {
                format!("unknown section [{key}]; known sections: {known}")
            } else {
                format!("unknown key `{key}` in section [{path}]; known keys: {known}")
            }));
        };
        match (slot, value) {
            (toml::Value::Table(inner), toml::Value::Table(value)) => {
                merge_file(inner, value, &full, origin)?;
            }
            (toml::Value::Table(_), value) => {
                return Err(parse_err(format!(
                    "`{full}` must be a section (table), found {}",
                    type_name(&value)
                )));
            }
            (slot, value) => {
                let same_type = matches!(
                    (&*slot, &value),
                    (toml::Value::String(_), toml::Value::String(_))
                        | (toml::Value::Integer(_), toml::Value::Integer(_))
                        | (toml::Value::Boolean(_), toml::Value::Boolean(_))
                );
                if !same_type {
                    return Err(parse_err(format!(
                        "`{full}` must be {}, found {}",
                        type_name(slot),
                        type_name(&value)
                    )));
                }
                if let toml::Value::Integer(n) = value {
                    // Every numeric setting is unsigned.
                    if n < 0 {
                        return Err(parse_err(format!(
                            "`{full}` must not be negative, found {n}"
                        )));
                    }
                }
                *slot = value;
            }
        }
    }
    Ok(())
}

/// Flattens `kafka.properties` into `"dotted.key" = "string"` entries: a bare dotted key in TOML
/// (`socket.timeout.ms = 1`) is a nested table; scalars become strings.
fn flatten_properties(out: &mut Table, entries: Table, prefix: &str) -> Result<(), String> {
    for (key, value) in entries {
        let full = join_path(prefix, &key);
        let text = match value {
            toml::Value::Table(inner) => {
                flatten_properties(out, inner, &full)?;
                continue;
            }
            toml::Value::String(s) => s,
            toml::Value::Integer(n) => n.to_string(),
            toml::Value::Float(x) => x.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            other => {
                return Err(format!(
                    "`kafka.properties.{full}` must be a string, number or boolean, found {}",
                    type_name(&other)
                ))
            }
        };
        out.insert(full, toml::Value::String(text));
    }
    Ok(())
}

/// Applies one `OUTBOX_RELAY__…` variable to the merged table.
fn apply_env(merged: &mut Table, var: &str, raw: &str) -> Result<(), ConfigError> {
    let rest = &var[ENV_PREFIX.len()..];
    let segments: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
    if segments.len() >= 3 && segments[0] == "kafka" && segments[1] == "properties" {
        let key = segments[2..].join("_").replace('_', ".");
        if key.is_empty() || key.starts_with('.') || key.ends_with('.') || key.contains("..") {
            return Err(ConfigError::env(
                var,
                "not a property name: use OUTBOX_RELAY__KAFKA__PROPERTIES__<KEY> with `_` for `.`, \
                 e.g. OUTBOX_RELAY__KAFKA__PROPERTIES__SOCKET_TIMEOUT_MS",
            ));
        }
        if let Some(toml::Value::Table(kafka)) = merged.get_mut("kafka") {
            if let Some(toml::Value::Table(properties)) = kafka.get_mut("properties") {
                properties.insert(key, toml::Value::String(raw.to_string()));
                return Ok(());
            }
        }
        return Err(ConfigError::env(var, "`kafka.properties` is missing"));
    }
    let dotted = segments.join(".");
    let unknown = |table: &Table| {
        ConfigError::env(
            var,
            format!(
                "no config key `{dotted}`; expected OUTBOX_RELAY__<SECTION>__<KEY> (known here: {})",
                known_keys(table)
            ),
        )
    };
    let (last, parents) = match segments.split_last() {
        Some(split) => split,
        None => return Err(unknown(merged)),
    };
    let mut table = merged;
    for segment in parents {
        if !matches!(table.get(segment.as_str()), Some(toml::Value::Table(_))) {
            return Err(unknown(table));
        }
        let Some(toml::Value::Table(inner)) = table.get_mut(segment.as_str()) else {
            return Err(ConfigError::env(var, format!("no config key `{dotted}`")));
        };
        table = inner;
    }
    let Some(slot) = table.get_mut(last.as_str()) else {
        return Err(unknown(table));
    };
    *slot = match slot {
        toml::Value::String(_) => toml::Value::String(raw.to_string()),
        toml::Value::Integer(_) => {
            let n = raw
                .trim()
                .parse::<u64>()
                .ok()
                .and_then(|n| i64::try_from(n).ok())
                .ok_or_else(|| {
                    ConfigError::env(var, format!("`{dotted}` expects a non-negative integer"))
                })?;
            toml::Value::Integer(n)
        }
        toml::Value::Boolean(_) => match raw.trim().to_ascii_lowercase().as_str() {
            "true" => toml::Value::Boolean(true),
            "false" => toml::Value::Boolean(false),
            _ => {
                return Err(ConfigError::env(
                    var,
                    format!("`{dotted}` expects a boolean (`true` or `false`)"),
                ))
            }
        },
        toml::Value::Table(_) => {
            return Err(ConfigError::env(
                var,
                format!("`{dotted}` is a section; set its keys, e.g. {var}__<KEY>"),
            ))
        }
        other => {
            return Err(ConfigError::env(
                var,
                format!(
                    "`{dotted}` is {} and cannot be set from the environment",
                    type_name(other)
                ),
            ))
        }
    };
    Ok(())
}

fn check_enums(merged: &Table) -> Result<(), ConfigError> {
    for (section, key, allowed) in ENUM_KEYS {
        let value = merged
            .get(*section)
            .and_then(|s| s.get(*key))
            .and_then(toml::Value::as_str);
        if let Some(value) = value {
            if !allowed.contains(&value) {
                return Err(ConfigError::invalid(
                    format!("{section}.{key}"),
                    format!("`{value}` must be one of {}", allowed.join("|")),
                ));
            }
        }
    }
    Ok(())
}

/// A TOML syntax error as one line with its position.
fn describe_toml_error(text: &str, err: &toml::de::Error) -> String {
    let message = one_line(err.message());
    match err.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message,
    }
}

fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Replaces the password in a libpq connection string (URL or `key=value` form) by `***`.
fn redact_connection_string(conn: &str) -> String {
    for prefix in ["postgres://", "postgresql://"] {
        if let Some(rest) = conn.strip_prefix(prefix) {
            return format!("{prefix}{}", redact_url_rest(rest));
        }
    }
    redact_key_value(conn).unwrap_or_else(|| REDACTED.to_string())
}

/// The part of a URL after the scheme. Mirrors tokio-postgres: the user info ends at the first
/// `@`, the password follows the first `:` in it; `password=` query parameters are masked too.
fn redact_url_rest(rest: &str) -> String {
    let mut masks: Vec<(usize, usize)> = Vec::new();
    if let Some(at) = rest.find('@') {
        if let Some(colon) = rest[..at].find(':') {
            masks.push((colon + 1, at));
        }
    }
    if let Some(q) = rest.find('?') {
        let mut start = q + 1;
        for param in rest[q + 1..].split('&') {
            if let Some((key, _)) = param.split_once('=') {
                if percent_decode(key).eq_ignore_ascii_case("password") {
                    masks.push((start + key.len() + 1, start + param.len()));
                }
            }
            start += param.len() + 1;
        }
    }
    masks.sort_unstable();
    let mut out = String::with_capacity(rest.len());
    let mut pos = 0;
    for (start, end) in masks {
        if end <= pos {
            continue;
        }
        let start = start.max(pos);
        out.push_str(&rest[pos..start]);
        out.push_str(REDACTED);
        pos = end;
    }
    out.push_str(&rest[pos..]);
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .filter(|h| h.bytes().all(|b| b.is_ascii_hexdigit()))
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(b) = hex {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// libpq `key = value …` form with the value of `password` masked; `None` if it does not
/// tokenize (the caller then hides the whole string).
fn redact_key_value(conn: &str) -> Option<String> {
    let bytes = conn.as_bytes();
    let mut out = String::with_capacity(conn.len());
    let mut i = 0;
    let skip_ws = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        let ws_end = skip_ws(i);
        out.push_str(&conn[i..ws_end]);
        i = ws_end;
        if i >= bytes.len() {
            return Some(out);
        }
        let key_start = i;
        while i < bytes.len() && bytes[i] != b'=' && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = &conn[key_start..i];
        let eq = skip_ws(i);
        if eq >= bytes.len() || bytes[eq] != b'=' || key.is_empty() {
            return None;
        }
        let value_start = skip_ws(eq + 1);
        out.push_str(&conn[key_start..value_start]);
        let mut j = value_start;
        if j < bytes.len() && bytes[j] == b'\'' {
            j += 1;
            loop {
                match bytes.get(j) {
                    None => return None,
                    Some(b'\\') => j += 2,
                    Some(b'\'') => {
                        j += 1;
                        break;
                    }
                    Some(_) => j += 1,
                }
            }
        } else {
            while j < bytes.len() && !bytes[j].is_ascii_whitespace() {
                j += if bytes[j] == b'\\' { 2 } else { 1 };
            }
        }
        let j = j.min(bytes.len());
        if key == "password" {
            out.push_str(REDACTED);
        } else {
            out.push_str(conn.get(value_start..j)?);
        }
        i = j;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../config/outbox-relay.toml");

    fn no_env() -> Vec<(String, String)> {
        Vec::new()
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn from_env(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_sources(None, env(pairs))
    }

    fn from_toml(text: &str) -> Result<Config, ConfigError> {
        Config::from_sources(Some(text), no_env())
    }

    /// Asserts that `config` fails validation with an `Invalid` error for `field`.
    fn assert_invalid(config: &Config, field: &str) -> String {
        match config.validate() {
            Err(err @ ConfigError::Invalid { .. }) => {
                let message = err.to_string();
                let ConfigError::Invalid { field: got, .. } = &err else {
                    unreachable!()
                };
                assert_eq!(got, field, "{message}");
                assert!(message.contains(field), "{message}");
                message
            }
            other => panic!("expected Invalid {{ field: {field} }}, got {other:?}"),
        }
    }

    fn with(edit: impl FnOnce(&mut Config)) -> Config {
        let mut config = Config::default();
        edit(&mut config);
        config
    }

    #[test]
    fn defaults_validate() {
        Config::default().validate().unwrap();
        assert_eq!(
            Config::from_sources(None, no_env()).unwrap(),
            Config::default()
        );
    }

    #[test]
    fn example_file_loads_and_lists_the_defaults() {
        let config = from_toml(EXAMPLE).unwrap();
        assert_eq!(config, Config::default());
    }

    #[test]
    fn example_file_has_every_key() {
        let file: Table = EXAMPLE.parse().unwrap();
        let defaults = match toml::Value::try_from(Config::default()).unwrap() {
            toml::Value::Table(t) => t,
            _ => unreachable!(),
        };
        for (section, keys) in &defaults {
            let keys = keys.as_table().unwrap();
            let in_file = file[section].as_table().unwrap();
            for key in keys.keys() {
                assert!(in_file.contains_key(key), "example lacks {section}.{key}");
            }
        }
    }

    #[test]
    fn load_reads_the_example_file() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/outbox-relay.toml");
        Config::load(Some(&path)).unwrap();
    }

    #[test]
    fn load_names_a_missing_file() {
        let path = Path::new("/nonexistent/outbox-relay.toml");
        let err = Config::load(Some(path)).unwrap_err();
        assert!(matches!(err, ConfigError::Io { .. }));
        assert!(
            err.to_string().contains("/nonexistent/outbox-relay.toml"),
            "{err}"
        );
    }

    #[test]
    fn env_overrides_strings() {
        let config = from_env(&[
            (
                "OUTBOX_RELAY__POSTGRES__URL",
                "postgres://relay:pw@db.internal:6432/app",
            ),
            ("OUTBOX_RELAY__POSTGRES__SLOT", "orders_slot"),
            ("OUTBOX_RELAY__POSTGRES__PUBLICATION", "orders_pub"),
            ("OUTBOX_RELAY__OUTBOX__TABLE", "sales.outbox_events"),
            ("OUTBOX_RELAY__KAFKA__BROKERS", "k1:9092,k2:9092"),
            ("UNRELATED", "ignored"),
        ])
        .unwrap();
        assert_eq!(
            config.postgres.url,
            "postgres://relay:pw@db.internal:6432/app"
        );
        assert_eq!(config.postgres.slot, "orders_slot");
        assert_eq!(config.postgres.publication, "orders_pub");
        assert_eq!(config.outbox.table, "sales.outbox_events");
        assert_eq!(
            config.outbox.schema_and_table(),
            ("sales".to_string(), "outbox_events".to_string())
        );
        assert_eq!(config.kafka.brokers, "k1:9092,k2:9092");
    }

    #[test]
    fn env_overrides_convert_numbers_and_booleans() {
        let config = from_env(&[
            ("OUTBOX_RELAY__KAFKA__MAX_IN_FLIGHT_MESSAGES", "5000"),
            ("OUTBOX_RELAY__POSTGRES__CREATE_SLOT", "false"),
            ("OUTBOX_RELAY__KAFKA__ALLOW_UNSAFE_KAFKA_SETTINGS", "TRUE"),
            ("OUTBOX_RELAY__KAFKA__COMPRESSION", "zstd"),
            ("OUTBOX_RELAY__RELAY__LOG_FORMAT", "json"),
        ])
        .unwrap();
        assert_eq!(config.kafka.max_in_flight_messages, 5000);
        assert!(!config.postgres.create_slot);
        assert!(config.kafka.allow_unsafe_kafka_settings);
        assert_eq!(config.kafka.compression, Compression::Zstd);
        assert_eq!(config.relay.log_format, LogFormat::Json);
    }

    #[test]
    fn env_overrides_beat_the_file() {
        let config = Config::from_sources(
            Some("[postgres]\nslot = \"from_file\"\n"),
            env(&[("OUTBOX_RELAY__POSTGRES__SLOT", "from_env")]),
        )
        .unwrap();
        assert_eq!(config.postgres.slot, "from_env");
    }

    #[test]
    fn env_sets_kafka_properties_with_dotted_lower_case_keys() {
        let config = from_env(&[
            (
                "OUTBOX_RELAY__KAFKA__PROPERTIES__SOCKET_TIMEOUT_MS",
                "60000",
            ),
            ("OUTBOX_RELAY__KAFKA__PROPERTIES__CLIENT_RACK", "rack-a"),
        ])
        .unwrap();
        assert_eq!(config.kafka.properties["socket.timeout.ms"], "60000");
        assert_eq!(config.kafka.properties["client.rack"], "rack-a");
    }

    #[test]
    fn env_unparsable_number_names_variable_and_type() {
        let err = from_env(&[("OUTBOX_RELAY__KAFKA__MAX_IN_FLIGHT_MESSAGES", "lots")]).unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, ConfigError::Env { .. }));
        assert!(
            message.contains("OUTBOX_RELAY__KAFKA__MAX_IN_FLIGHT_MESSAGES"),
            "{message}"
        );
        assert!(message.contains("integer"), "{message}");
        assert!(
            !message.contains("lots"),
            "values are not echoed: {message}"
        );

        let err = from_env(&[("OUTBOX_RELAY__KAFKA__LINGER_MS", "-1")]).unwrap_err();
        assert!(err.to_string().contains("non-negative integer"), "{err}");

        let err = from_env(&[("OUTBOX_RELAY__POSTGRES__CREATE_SLOT", "yes")]).unwrap_err();
        assert!(err.to_string().contains("boolean"), "{err}");
    }

    #[test]
    fn env_unknown_key_or_section_is_an_error() {
        for var in [
            "OUTBOX_RELAY__POSTGRES__SLOTT",
            "OUTBOX_RELAY__NOPE__SLOT",
            "OUTBOX_RELAY__POSTGRES",
            "OUTBOX_RELAY__POSTGRES__SLOT__X",
            "OUTBOX_RELAY__",
        ] {
            let err = from_env(&[(var, "x")]).unwrap_err();
            assert!(matches!(err, ConfigError::Env { .. }), "{var}: {err:?}");
            assert!(err.to_string().contains(var), "{err}");
        }
        let err = from_env(&[("OUTBOX_RELAY__KAFKA__PROPERTIES", "x")]).unwrap_err();
        assert!(err.to_string().contains("section"), "{err}");
        let err = from_env(&[("OUTBOX_RELAY__KAFKA__PROPERTIES__", "x")]).unwrap_err();
        assert!(matches!(err, ConfigError::Env { .. }), "{err:?}");
    }

    #[test]
    fn unknown_file_key_names_key_section_and_file() {
        let err = from_toml("[postgres]\nslot_name = \"x\"\n").unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, ConfigError::Parse { .. }));
        assert!(message.contains("slot_name"), "{message}");
        assert!(message.contains("[postgres]"), "{message}");
        assert!(message.contains("config text"), "{message}");

        let err = from_toml("[kafkaa]\nbrokers = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("[kafkaa]"), "{err}");
    }

    #[test]
    fn load_errors_name_the_file() {
        let dir = std::env::temp_dir().join(format!("outbox-relay-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.toml");
        std::fs::write(&path, "[relay]\nshutdown_timeout = 5\n").unwrap();
        let err = Config::load(Some(&path)).unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        let message = err.to_string();
        assert!(message.contains("bad.toml"), "{message}");
        assert!(message.contains("shutdown_timeout"), "{message}");
    }

    #[test]
    fn wrong_types_and_syntax_errors_are_one_line() {
        let err = from_toml("[kafka]\nlinger_ms = \"5\"\n").unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("kafka.linger_ms") && message.contains("integer"),
            "{message}"
        );

        let err = from_toml("[kafka]\nlinger_ms = -5\n").unwrap_err();
        assert!(err.to_string().contains("kafka.linger_ms"), "{err}");

        let err = from_toml("postgres = 3\n").unwrap_err();
        assert!(err.to_string().contains("section"), "{err}");

        let err = from_toml("[postgres\nslot = 1\n").unwrap_err();
        let message = err.to_string();
        assert!(message.contains("line 1"), "{message}");
        assert!(!message.contains('\n'), "{message}");
    }

    #[test]
    fn file_properties_accept_bare_dotted_keys_and_scalars() {
        let config = from_toml(
            "[kafka.properties]\nsocket.timeout.ms = 60000\n\"client.rack\" = \"ssl\"\n\
             enable.idempotence = true\n",
        )
        .unwrap();
        assert_eq!(config.kafka.properties["socket.timeout.ms"], "60000");
        assert_eq!(config.kafka.properties["client.rack"], "ssl");
        assert_eq!(config.kafka.properties["enable.idempotence"], "true");
    }

    #[test]
    fn network_rules_name_their_field() {
        Config::default().validate().unwrap();
        for (config, field) in [
            (
                with(|c| c.postgres.keepalives_idle_ms = 999),
                "postgres.keepalives_idle_ms",
            ),
            (
                with(|c| c.postgres.keepalives_interval_ms = 0),
                "postgres.keepalives_interval_ms",
            ),
            (
                with(|c| c.postgres.keepalives_retries = 0),
                "postgres.keepalives_retries",
            ),
            (
                with(|c| c.postgres.keepalives_retries = 128),
                "postgres.keepalives_retries",
            ),
            (
                with(|c| c.postgres.tcp_user_timeout_ms = 500),
                "postgres.tcp_user_timeout_ms",
            ),
        ] {
            assert_invalid(&config, field);
        }
        let message = assert_invalid(
            &with(|c| c.postgres.receive_timeout_ms = 1_500),
            "postgres.receive_timeout_ms",
        );
        assert!(message.contains("2000 ms"), "{message}");
        with(|c| c.postgres.receive_timeout_ms = 2_000)
            .validate()
            .unwrap();
        with(|c| c.postgres.tcp_user_timeout_ms = 0)
            .validate()
            .unwrap();
        let from_env = from_env(&[("OUTBOX_RELAY__POSTGRES__RECEIVE_TIMEOUT_MS", "4000")]).unwrap();
        assert_eq!(from_env.postgres.receive_timeout_ms, 4_000);
    }

    #[test]
    fn keepalives_come_from_the_keys_or_the_url() {
        use std::time::Duration;
        let defaults = PostgresConfig::default().tcp_keepalive();
        assert_eq!(
            defaults,
            TcpKeepalive {
                enabled: true,
                idle: Duration::from_secs(30),
                interval: Duration::from_secs(10),
                retries: 3,
                user_timeout: Some(Duration::from_secs(60)),
            }
        );
        let url = PostgresConfig {
            url: "postgres://u@db/app?keepalives_idle=5&keepalives_interval=2&keepalives_retries=4&tcp_user_timeout=9000&sslmode=require".into(),
            ..PostgresConfig::default()
        };
        assert_eq!(
            url.tcp_keepalive(),
            TcpKeepalive {
                enabled: true,
                idle: Duration::from_secs(5),
                interval: Duration::from_secs(2),
                retries: 4,
                user_timeout: Some(Duration::from_millis(9_000)),
            }
        );
        // Keys set in the config win over the URL.
        let keyed = PostgresConfig {
            keepalives_idle_ms: 7_000,
            tcp_user_timeout_ms: 0,
            ..url.clone()
        };
        let resolved = keyed.tcp_keepalive();
        assert_eq!(resolved.idle, Duration::from_secs(7));
        assert_eq!(resolved.user_timeout, None);
        let off = PostgresConfig {
            url: "host=db user=u keepalives=0".into(),
            ..PostgresConfig::default()
        };
        assert!(!off.tcp_keepalive().enabled);
    }

    #[test]
    fn postgres_rules_name_their_field() {
        assert_invalid(&with(|c| c.postgres.url = String::new()), "postgres.url");
        assert_invalid(
            &with(|c| c.postgres.url = "postgres://127.0.0.1/db".into()),
            "postgres.url",
        );
        assert_invalid(
            &with(|c| c.postgres.url = "postgres://user@/db".into()),
            "postgres.url",
        );
        assert_invalid(
            &with(|c| c.postgres.url = "postgres://u@h:notaport/db".into()),
            "postgres.url",
        );
        with(|c| c.postgres.url = "host=db user=relay password='a b' dbname=app".into())
            .validate()
            .unwrap();
        for slot in ["", "Outbox", "out-box", &"a".repeat(64)] {
            assert_invalid(
                &with(|c| c.postgres.slot = slot.to_string()),
                "postgres.slot",
            );
        }
        with(|c| c.postgres.slot = "a".repeat(63))
            .validate()
            .unwrap();
        assert_invalid(
            &with(|c| c.postgres.publication = String::new()),
            "postgres.publication",
        );
        assert_invalid(
            &with(|c| c.postgres.publication = "p".repeat(64)),
            "postgres.publication",
        );
        with(|c| c.postgres.publication = "Mixed Case-pub".into())
            .validate()
            .unwrap();
        let message = assert_invalid(
            &with(|c| c.postgres.status_interval_ms = 0),
            "postgres.status_interval_ms",
        );
        assert!(message.contains("between 1 and 30000 (ms)"), "{message}");
        assert_invalid(
            &with(|c| c.postgres.status_interval_ms = 30_001),
            "postgres.status_interval_ms",
        );
        assert_invalid(
            &with(|c| c.postgres.connect_timeout_ms = 0),
            "postgres.connect_timeout_ms",
        );
        assert_invalid(
            &with(|c| c.postgres.reconnect_backoff_initial_ms = 0),
            "postgres.reconnect_backoff_initial_ms",
        );
        assert_invalid(
            &with(|c| c.postgres.reconnect_backoff_max_ms = 100),
            "postgres.reconnect_backoff_max_ms",
        );
    }

    #[test]
    fn outbox_rules_name_their_field() {
        assert_invalid(&with(|c| c.outbox.table = String::new()), "outbox.table");
        assert_invalid(&with(|c| c.outbox.table = "a.b.c".into()), "outbox.table");
        assert_invalid(&with(|c| c.outbox.table = ".outbox".into()), "outbox.table");
        assert_invalid(
            &with(|c| c.outbox.table = format!("public.{}", "t".repeat(64))),
            "outbox.table",
        );
        let config = with(|c| c.outbox.table = "Outbox".into());
        config.validate().unwrap();
        assert_eq!(
            config.outbox.schema_and_table(),
            ("public".to_string(), "Outbox".to_string())
        );

        assert_invalid(&with(|c| c.outbox.topic = String::new()), "outbox.topic");
        let message = assert_invalid(
            &with(|c| c.outbox.topic = "events.{foo}".into()),
            "outbox.topic",
        );
        assert!(message.contains("{foo}"), "{message}");
        assert_invalid(
            &with(|c| c.outbox.topic = "events.{type".into()),
            "outbox.topic",
        );
        assert_invalid(
            &with(|c| c.outbox.topic = "events/{type}".into()),
            "outbox.topic",
        );
        with(|c| {
            c.outbox.topic = "{schema}.{table}.{aggregatetype}.{type}-{id}_{aggregateid}".into()
        })
        .validate()
        .unwrap();

        assert_invalid(
            &with(|c| c.outbox.id_column = String::new()),
            "outbox.id_column",
        );
        assert_invalid(
            &with(|c| c.outbox.aggregate_type_column = String::new()),
            "outbox.aggregate_type_column",
        );
        assert_invalid(
            &with(|c| c.outbox.aggregate_id_column = "c".repeat(64)),
            "outbox.aggregate_id_column",
        );
        assert_invalid(
            &with(|c| c.outbox.type_column = String::new()),
            "outbox.type_column",
        );
        assert_invalid(
            &with(|c| c.outbox.payload_column = String::new()),
            "outbox.payload_column",
        );
    }

    #[test]
    fn outbox_tables_inherit_the_top_level_mapping() {
        let config = from_toml(
            r#"
[outbox]
table = "public.outbox"
topic = "events.{aggregatetype}"
partition_by = "key"
topic_overrides = { order = "orders.v2" }
header_columns = { tenant = "x-tenant" }
null_payload = "tombstone"

[[outbox.tables]]
table = "tenant_b.outbox"
topic = "b.{aggregatetype}"

[[outbox.tables]]
table = "billing.events"
aggregate_id_column = "invoice_id"
header_columns = {}
envelope = true
"#,
        )
        .unwrap();
        let tables = config.outbox.table_configs();
        assert_eq!(tables.len(), 3);
        assert_eq!(
            config.outbox.publication_tables(),
            vec![
                ("public".to_string(), "outbox".to_string()),
                ("tenant_b".to_string(), "outbox".to_string()),
                ("billing".to_string(), "events".to_string()),
            ]
        );
        let b = &tables[1];
        assert_eq!(b.topic, "b.{aggregatetype}");
        assert_eq!(b.partition_by, "key");
        assert_eq!(b.null_payload, NullPayload::Tombstone);
        assert_eq!(b.topic_overrides["order"], "orders.v2");
        assert_eq!(b.header_columns["tenant"], "x-tenant");
        assert!(b.tables.is_empty());
        let billing = &tables[2];
        assert_eq!(billing.topic, "events.{aggregatetype}");
        assert_eq!(billing.aggregate_id_column, "invoice_id");
        assert!(billing.header_columns.is_empty());
        assert!(billing.envelope);
        assert!(!tables[0].envelope);

        // The effective configuration renders as a loadable file.
        let reparsed = from_toml(&config.to_redacted_toml()).unwrap();
        assert_eq!(reparsed.outbox, config.outbox);
    }

    #[test]
    fn outbox_mapping_keys_are_validated_per_table() {
        assert_invalid(&with(|c| c.outbox.table = String::new()), "outbox.table");
        with(|c| {
            c.outbox.table = String::new();
            c.outbox.message_prefix = "outbox".into();
        })
        .validate()
        .unwrap();
        let entry = |table: &str| OutboxTableConfig {
            table: table.into(),
            ..OutboxTableConfig::default()
        };
        let message = assert_invalid(
            &with(|c| c.outbox.tables.push(entry("public.outbox"))),
            "outbox.tables[0].table",
        );
        assert!(message.contains("twice"), "{message}");
        assert_invalid(
            &with(|c| c.outbox.tables.push(entry("a.b.c"))),
            "outbox.tables[0].table",
        );
        assert_invalid(
            &with(|c| {
                c.outbox.tables.push(entry("s.t"));
                c.outbox.tables.push(OutboxTableConfig {
                    topic: Some("bad/{type}".into()),
                    ..entry("s.u")
                });
            }),
            "outbox.tables[1].topic",
        );
        assert_invalid(
            &with(|c| {
                c.outbox
                    .topic_overrides
                    .insert("order".into(), "x.{nope}".into());
            }),
            "outbox.topic_overrides.order",
        );
        assert_invalid(
            &with(|c| {
                c.outbox
                    .header_columns
                    .insert("tenant".into(), String::new());
            }),
            "outbox.header_columns.tenant",
        );
        assert_invalid(
            &with(|c| c.outbox.partition_by = String::new()),
            "outbox.partition_by",
        );
        assert_invalid(
            &with(|c| c.outbox.timestamp_column = "t".repeat(64)),
            "outbox.timestamp_column",
        );
        assert_invalid(
            &with(|c| {
                c.outbox.tracing_column = "span".into();
                c.outbox.tracing_header = String::new();
            }),
            "outbox.tracing_header",
        );
        assert_invalid(
            &with(|c| c.outbox.sweeper.retention_ms = 0),
            "outbox.sweeper.retention_ms",
        );
        assert_invalid(
            &with(|c| c.outbox.sweeper.batch_size = MAX_SWEEPER_BATCH_SIZE + 1),
            "outbox.sweeper.batch_size",
        );
        assert_invalid(
            &with(|c| c.outbox.sweeper.interval_ms = 0),
            "outbox.sweeper.interval_ms",
        );

        let err = from_toml("[outbox]\nnull_payload = \"drop\"\n").unwrap_err();
        assert!(err.to_string().contains("outbox.null_payload"), "{err}");
        let err = from_toml("[outbox]\ntopic_overrides = { order = 1 }\n").unwrap_err();
        assert!(
            err.to_string().contains("outbox.topic_overrides.order"),
            "{err}"
        );
        let err = from_toml("[outbox]\ntables = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("outbox.tables"), "{err}");
        let err = from_toml("[[outbox.tables]]\ntable = \"s.t\"\ntopics = \"x\"\n").unwrap_err();
        assert!(err.to_string().contains("topics"), "{err}");
    }

    #[test]
    fn env_overrides_reach_the_new_outbox_keys() {
        let config = from_env(&[
            ("OUTBOX_RELAY__OUTBOX__PARTITION_BY", "key"),
            ("OUTBOX_RELAY__OUTBOX__ENVELOPE", "true"),
            ("OUTBOX_RELAY__OUTBOX__NULL_PAYLOAD", "tombstone"),
            ("OUTBOX_RELAY__OUTBOX__MESSAGE_PREFIX", "outbox"),
            ("OUTBOX_RELAY__OUTBOX__TIMESTAMP_COLUMN", "occurred_at"),
            ("OUTBOX_RELAY__OUTBOX__SWEEPER__ENABLED", "true"),
            ("OUTBOX_RELAY__OUTBOX__SWEEPER__RETENTION_MS", "60000"),
        ])
        .unwrap();
        let o = &config.outbox;
        assert_eq!(o.partition_by, "key");
        assert!(o.envelope);
        assert_eq!(o.null_payload, NullPayload::Tombstone);
        assert!(o.messages_enabled());
        assert_eq!(o.timestamp_column, "occurred_at");
        assert!(o.sweeper.enabled);
        assert_eq!(o.sweeper.retention_ms, 60_000);
        let err = from_env(&[("OUTBOX_RELAY__OUTBOX__TABLES", "x")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot be set from the environment"),
            "{err}"
        );
    }

    #[test]
    fn kafka_and_relay_rules_name_their_field() {
        assert_invalid(&with(|c| c.kafka.brokers = " ".into()), "kafka.brokers");
        assert_invalid(
            &with(|c| c.kafka.brokers = "a:9092,".into()),
            "kafka.brokers",
        );
        assert_invalid(
            &with(|c| c.kafka.client_id = String::new()),
            "kafka.client_id",
        );
        assert_invalid(
            &with(|c| c.kafka.max_in_flight_messages = 0),
            "kafka.max_in_flight_messages",
        );
        assert_invalid(
            &with(|c| c.kafka.max_in_flight_bytes = MIN_MAX_IN_FLIGHT_BYTES - 1),
            "kafka.max_in_flight_bytes",
        );
        with(|c| c.kafka.max_in_flight_bytes = MIN_MAX_IN_FLIGHT_BYTES)
            .validate()
            .unwrap();
        assert_invalid(
            &with(|c| c.kafka.linger_ms = MAX_LINGER_MS + 1),
            "kafka.linger_ms",
        );
        assert_invalid(
            &with(|c| c.kafka.batch_num_messages = 0),
            "kafka.batch_num_messages",
        );
        assert_invalid(
            &with(|c| c.kafka.message_timeout_ms = 999),
            "kafka.message_timeout_ms",
        );

        let err = from_toml("[kafka]\ncompression = \"brotli\"\n").unwrap_err();
        assert!(err.to_string().contains("kafka.compression"), "{err}");
        assert!(matches!(err, ConfigError::Invalid { .. }));
        let err = from_env(&[("OUTBOX_RELAY__RELAY__LOG_FORMAT", "xml")]).unwrap_err();
        assert!(err.to_string().contains("relay.log_format"), "{err}");
        assert_eq!(
            from_toml("[kafka]\ncompression = \"none\"\n")
                .unwrap()
                .kafka
                .compression,
            Compression::None
        );
    }

    #[test]
    fn unsafe_kafka_properties_are_refused_unless_allowed() {
        let cases = [
            ("acks", "1"),
            ("request.required.acks", "0"),
            ("enable.idempotence", "false"),
            ("max.in.flight.requests.per.connection", "6"),
            ("message.send.max.retries", "0"),
            ("retries", "0"),
            ("delivery.report.only.error", "true"),
        ];
        for (key, value) in cases {
            let config = with(|c| {
                c.kafka
                    .properties
                    .insert(key.to_string(), value.to_string());
            });
            let message = assert_invalid(&config, &format!("kafka.properties.{key}"));
            assert!(message.contains("allow_unsafe_kafka_settings"), "{message}");
            assert_eq!(config.kafka.unsafe_properties().len(), 1, "{key}");

            let allowed = with(|c| {
                c.kafka
                    .properties
                    .insert(key.to_string(), value.to_string());
                c.kafka.allow_unsafe_kafka_settings = true;
            });
            allowed.validate().unwrap();
        }
        let safe = [
            ("acks", "all"),
            ("acks", "-1"),
            ("enable.idempotence", "true"),
            ("max.in.flight.requests.per.connection", "5"),
            ("retries", "10"),
            ("enable.gapless.guarantee", "false"),
            ("queue.buffering.backpressure.threshold", "1"),
            ("delivery.report.only.error", "false"),
            ("partitioner", "murmur2_random"),
        ];
        for (key, value) in safe {
            let config = with(|c| {
                c.kafka
                    .properties
                    .insert(key.to_string(), value.to_string());
            });
            config.validate().unwrap();
            assert!(config.kafka.unsafe_properties().is_empty(), "{key}");
        }
    }

    #[test]
    fn relay_owned_kafka_properties_point_to_their_field() {
        for (key, field) in OWNED_KAFKA_PROPERTIES {
            let config = with(|c| {
                c.kafka.properties.insert(key.to_string(), "x".to_string());
                c.kafka.allow_unsafe_kafka_settings = true;
            });
            let message = assert_invalid(&config, &format!("kafka.properties.{key}"));
            assert!(message.contains(field), "{message}");
        }
        let err =
            from_env(&[("OUTBOX_RELAY__KAFKA__PROPERTIES__BOOTSTRAP_SERVERS", "x:1")]).unwrap_err();
        assert!(err.to_string().contains("kafka.brokers"), "{err}");
    }

    #[test]
    fn url_may_carry_every_libpq_sslmode() {
        for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
            let url = format!("postgres://u@db/app?sslmode={mode}&sslrootcert=/ca.pem");
            from_env(&[("OUTBOX_RELAY__POSTGRES__URL", &url)]).unwrap();
        }
        let err = from_env(&[(
            "OUTBOX_RELAY__POSTGRES__URL",
            "postgres://u@db/app?sslmode=paranoid",
        )])
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("postgres.url") && err.contains("paranoid"),
            "{err}"
        );
    }

    #[test]
    fn kafka_sasl_fields_are_checked_together_and_the_password_hidden() {
        let sasl = |protocol: &str, mechanism: &str, user: &str| {
            from_env(&[
                ("OUTBOX_RELAY__KAFKA__SECURITY_PROTOCOL", protocol),
                ("OUTBOX_RELAY__KAFKA__SASL_MECHANISM", mechanism),
                ("OUTBOX_RELAY__KAFKA__SASL_USERNAME", user),
                ("OUTBOX_RELAY__KAFKA__SASL_PASSWORD", "s3cret-pw"),
            ])
        };
        let config = sasl("sasl_ssl", "SCRAM-SHA-512", "relay").unwrap();
        assert_eq!(
            config.kafka.security_protocol,
            KafkaSecurityProtocol::SaslSsl
        );
        assert!(!format!("{config:?}").contains("s3cret-pw"));
        assert!(!config.to_redacted_toml().contains("s3cret-pw"));
        let err = sasl("sasl_plaintext", "GSSAPI", "relay")
            .unwrap_err()
            .to_string();
        assert!(err.contains("kafka.sasl_mechanism"), "{err}");
        let err = sasl("sasl_plaintext", "PLAIN", "").unwrap_err().to_string();
        assert!(err.contains("kafka.sasl_username"), "{err}");
        let err = sasl("plaintext", "PLAIN", "relay").unwrap_err().to_string();
        assert!(err.contains("only used with"), "{err}");
        let err = from_env(&[("OUTBOX_RELAY__KAFKA__SECURITY_PROTOCOL", "tls")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("kafka.security_protocol"), "{err}");
        let err = from_env(&[("OUTBOX_RELAY__KAFKA__PROPERTIES__SASL_PASSWORD", "x")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("kafka.sasl_password"), "{err}");
    }

    #[test]
    fn secrets_are_hidden_in_debug_and_redacted_toml() {
        let config = with(|c| {
            c.postgres.url = "postgres://relay:hunter2@db:5432/app?sslmode=disable".into();
            c.kafka
                .properties
                .insert("ssl.keystore.password".into(), "kafkapass".into());
            c.kafka.properties.insert(
                "sasl.jaas.config".into(),
                "user=\"u\" password=\"jaaspass\"".into(),
            );
            c.kafka
                .properties
                .insert("ssl.key.pem".into(), "PEMDATA".into());
            c.kafka
                .properties
                .insert("socket.timeout.ms".into(), "60000".into());
        });
        config.validate().unwrap();
        assert_eq!(
            config.postgres.redacted_url(),
            "postgres://relay:***@db:5432/app?sslmode=disable"
        );
        let debug = format!("{config:?}");
        let rendered = config.to_redacted_toml();
        for shown in [&debug, &rendered] {
            for secret in ["hunter2", "kafkapass", "jaaspass", "PEMDATA"] {
                assert!(!shown.contains(secret), "{secret} leaked: {shown}");
            }
            assert!(
                shown.contains("postgres://relay:***@db:5432/app"),
                "{shown}"
            );
            assert!(shown.contains("60000"), "{shown}");
        }
        // The rendering is a loadable config.
        let reparsed = from_toml(&rendered).unwrap();
        assert_eq!(reparsed.kafka.properties["ssl.keystore.password"], "***");
        assert_eq!(reparsed.postgres.slot, config.postgres.slot);
    }

    #[test]
    fn connection_string_redaction_covers_every_form() {
        let cases = [
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("postgresql://u:p%40ss@h/db", "postgresql://u:***@h/db"),
            (
                "postgres://u@h/db?password=pw&sslmode=require",
                "postgres://u@h/db?password=***&sslmode=require",
            ),
            ("postgres://h:5432/db", "postgres://h:5432/db"),
            (
                "host=h user=u password=pw dbname=d",
                "host=h user=u password=*** dbname=d",
            ),
            (
                "host=h password = 'a \\' b' user=u",
                "host=h password = *** user=u",
            ),
            ("host=h password='unterminated", "***"),
        ];
        for (input, expected) in cases {
            assert_eq!(redact_connection_string(input), expected, "{input}");
        }
    }

    #[test]
    fn password_comes_from_the_file_over_the_url() {
        let config = with(|c| c.postgres.url = "postgres://u:urlpw@h/db".into());
        assert_eq!(
            config.postgres.password().unwrap().unwrap().expose(),
            "urlpw"
        );
        assert_eq!(
            format!("{:?}", config.postgres.password().unwrap()),
            "Some(***)"
        );

        let dir = std::env::temp_dir().join(format!("outbox-relay-pw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pw");
        std::fs::write(&path, "  filepw\n").unwrap();
        let config = with(|c| {
            c.postgres.url = "postgres://u:urlpw@h/db".into();
            c.postgres.password_file = path.to_string_lossy().into_owned();
        });
        assert_eq!(
            config.postgres.password().unwrap().unwrap().expose(),
            "filepw"
        );
        let _ = std::fs::remove_dir_all(&dir);

        let missing = with(|c| c.postgres.password_file = "/nonexistent/pw".into());
        let err = missing.postgres.password().unwrap_err();
        assert!(err.to_string().contains("/nonexistent/pw"), "{err}");
    }

    #[test]
    fn error_messages_are_single_lines() {
        let errors = [
            from_toml("[postgres]\nbogus = 1\n").unwrap_err(),
            from_env(&[("OUTBOX_RELAY__X__Y", "1")]).unwrap_err(),
            with(|c| c.postgres.slot = "X".into())
                .validate()
                .unwrap_err(),
        ];
        for err in errors {
            assert!(!err.to_string().contains('\n'), "{err}");
        }
    }
}
