//! `[kafka]`: the producer, its security settings and the librdkafka pass-through properties,
//! with the rules that keep those from breaking at-least-once delivery.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::layering::unset;
use super::secret::{Secret, REDACTED};
use super::topic_creation::TopicCreation;
use super::validate::check_range;
use super::ConfigError;

mod aws_msk_iam;
mod oauthbearer;
pub use aws_msk_iam::{AwsMskIam, AWS_MSK_IAM};
pub use oauthbearer::{OauthBearer, OAUTHBEARER};

/// librdkafka holds ~700 bytes per queued record; 20,000 is ~150 ms of a full-speed drain,
/// far more than a produce round trip, and keeps memory flat (bench/README.md).
pub const DEFAULT_MAX_IN_FLIGHT_MESSAGES: usize = 20_000;
/// Lower bound of `kafka.max_in_flight_bytes` (1 MiB).
pub const MIN_MAX_IN_FLIGHT_BYTES: usize = 1024 * 1024;
/// librdkafka's upper bound of `linger.ms`.
pub const MAX_LINGER_MS: u64 = 900_000;
/// librdkafka's upper bound of `batch.num.messages`.
pub const MAX_BATCH_NUM_MESSAGES: usize = 1_000_000;
/// Bounds of `kafka.message_timeout_ms`; the upper one is librdkafka's.
pub const MIN_MESSAGE_TIMEOUT_MS: u64 = 1_000;
pub const MAX_MESSAGE_TIMEOUT_MS: u64 = i32::MAX as u64;

/// librdkafka properties the relay sets from a dedicated field, with that field.
pub const OWNED_KAFKA_PROPERTIES: &[(&str, &str)] = &[
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
    (
        "sasl.oauthbearer.method",
        "kafka.sasl_mechanism = \"OAUTHBEARER\"",
    ),
    (
        "sasl.oauthbearer.token.endpoint.url",
        "kafka.oauthbearer.token_endpoint_url",
    ),
    ("sasl.oauthbearer.client.id", "kafka.oauthbearer.client_id"),
    (
        "sasl.oauthbearer.client.credentials.client.id",
        "kafka.oauthbearer.client_id",
    ),
    (
        "sasl.oauthbearer.client.secret",
        "kafka.oauthbearer.client_secret_file",
    ),
    (
        "sasl.oauthbearer.client.credentials.client.secret",
        "kafka.oauthbearer.client_secret_file",
    ),
    ("sasl.oauthbearer.scope", "kafka.oauthbearer.scope"),
    (
        "sasl.oauthbearer.extensions",
        "kafka.oauthbearer.extensions",
    ),
    // Derived from the slot in `delivery = "exactly_once"` (fencing depends on it).
    ("transactional.id", "kafka.delivery"),
];

/// Substrings of `kafka.properties` keys whose values are secrets.
const SECRET_PROPERTY_MARKERS: &[&str] = &[
    "password",
    "secret",
    "sasl.jaas",
    "ssl.key",
    "sasl.oauthbearer.config",
];

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
    /// When the producer sends (`at_least_once`; `exactly_once` batches by its Kafka
    /// transactions and always uses `linger`):
    /// - `adaptive` (default): as `linger`, except that a record handed over while no other
    ///   is waiting for Kafka's acknowledgement is sent at once. A trickle is not delayed by
    ///   the linger; a backlog batches exactly as with `linger`.
    /// - `linger`: every record waits up to `linger_ms`.
    pub batching: Batching,
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
    /// unless `allow_unsafe_kafka_settings` is true (both lists: [refused librdkafka
    /// properties](#refused-librdkafka-properties)).
    #[serde(deserialize_with = "flat_properties")]
    pub properties: BTreeMap<String, String>,
    /// Accept `properties` that weaken at-least-once delivery or ordering (logged as warnings).
    pub allow_unsafe_kafka_settings: bool,
    /// How to talk to the brokers: `plaintext`, `ssl` (TLS), `sasl_plaintext` (SASL, no TLS) or
    /// `sasl_ssl` (SASL over TLS).
    pub security_protocol: KafkaSecurityProtocol,
    /// SASL mechanism for the `sasl_*` protocols: `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`
    /// (with `sasl_username` and a password), `OAUTHBEARER` (with `[kafka.oauthbearer]`), or
    /// `AWS_MSK_IAM` (Amazon MSK IAM access control, `sasl_ssl` only: tokens signed with the
    /// default AWS credential chain; `[kafka.aws_msk_iam]`).
    #[serde(with = "unset")]
    pub sasl_mechanism: Option<String>,
    /// SASL user name.
    #[serde(with = "unset")]
    pub sasl_username: Option<String>,
    /// SASL password (a secret: redacted in logs and `outbox-relay config`). Prefer
    /// `sasl_password_file`.
    #[serde(with = "unset")]
    pub sasl_password: Option<Secret>,
    /// File holding the SASL password (trimmed); wins over `sasl_password`.
    #[serde(with = "unset")]
    pub sasl_password_file: Option<PathBuf>,
    /// CA certificate file (PEM) to verify the brokers' certificates for `ssl` / `sasl_ssl`.
    /// Unset (`""` in the file): the system's trusted roots.
    #[serde(with = "unset")]
    pub ssl_ca_file: Option<PathBuf>,
    /// `[kafka.oauthbearer]`: OIDC client credentials for `sasl_mechanism = "OAUTHBEARER"`.
    pub oauthbearer: OauthBearer,
    /// `[kafka.aws_msk_iam]`: the region for `sasl_mechanism = "AWS_MSK_IAM"`.
    pub aws_msk_iam: AwsMskIam,
    /// `at_least_once` (default: every event at least once, a crash may repeat some) or
    /// `exactly_once` (Kafka transactions plus a progress record: consumers with
    /// `isolation.level=read_committed` see every event exactly once). In `exactly_once`,
    /// `message_timeout_ms` is capped at `transaction.timeout.ms` (60000 unless set in
    /// `properties`).
    pub delivery: Delivery,
    /// `exactly_once`: the compacted topic holding, per slot, the end LSN of the last
    /// PostgreSQL transaction committed to Kafka. Created (`cleanup.policy=compact`) when missing.
    pub progress_topic: String,
    /// `exactly_once`: a Kafka transaction is committed (at the next PostgreSQL transaction
    /// boundary) once it is this old, in milliseconds; 1 to 30000.
    pub transaction_max_ms: u64,
    /// `exactly_once`: ... and sooner, once at least this old, when the replication stream has
    /// nothing more to read at the moment (so that a steady trickle is not held for
    /// `transaction_max_ms`, while a backlog still fills big transactions); 0 to
    /// `transaction_max_ms`.
    pub transaction_min_ms: u64,
    /// `exactly_once`: ... or once it holds this many records; > 0.
    pub transaction_max_records: usize,
    /// `[kafka.topic_creation]`: topics the relay creates before their first record.
    pub topic_creation: TopicCreation,
}

/// `kafka.batching`: when records are handed to the producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Batching {
    Adaptive,
    Linger,
}

/// `kafka.delivery`: what a consumer may count on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    AtLeastOnce,
    ExactlyOnce,
}

impl Delivery {
    pub const NAMES: &'static [&'static str] = &["at_least_once", "exactly_once"];
}

/// Below librdkafka's `transaction.timeout.ms` default (60 s) with room to commit.
pub const MAX_TRANSACTION_MAX_MS: u64 = 30_000;

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

/// SASL mechanisms librdkafka supports here (built with OpenSSL and libcurl).
pub const SASL_MECHANISMS: &[&str] = &[
    "PLAIN",
    "SCRAM-SHA-256",
    "SCRAM-SHA-512",
    OAUTHBEARER,
    AWS_MSK_IAM,
];

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

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "127.0.0.1:9092".to_string(),
            client_id: "outbox-relay".to_string(),
            max_in_flight_messages: DEFAULT_MAX_IN_FLIGHT_MESSAGES,
            max_in_flight_bytes: 8 * 1024 * 1024, // bytes
            // 1 against 5 (bench/README.md, 2026-12-03 evening): over 50 topics at 1,000 and
            // 2,000 events/s p50 7.5 -> 2.0-2.6 ms, p99 14-19 -> 11-15 ms, relay CPU +1.5 points
            // of a core; backlog drains no slower.
            linger_ms: 1,
            batching: Batching::Adaptive,
            batch_num_messages: 10_000,
            compression: Compression::Lz4,
            message_timeout_ms: 300_000,
            properties: BTreeMap::new(),
            allow_unsafe_kafka_settings: false,
            security_protocol: KafkaSecurityProtocol::Plaintext,
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            sasl_password_file: None,
            ssl_ca_file: None,
            oauthbearer: OauthBearer::default(),
            aws_msk_iam: AwsMskIam::default(),
            delivery: Delivery::AtLeastOnce,
            progress_topic: "outbox-relay.progress".to_string(),
            // A Kafka transaction is committed once this old (what read_committed consumers
            // wait while a backlog is read), or once 10 ms old when nothing more is waiting (a
            // trickle): a commit costs ~1 ms on the broker, so 10 ms keeps it a small share.
            transaction_max_ms: 100,
            transaction_min_ms: 10,
            transaction_max_records: 10_000,
            topic_creation: TopicCreation::default(),
        }
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
            .field("batching", &self.batching)
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
            .field("sasl_password", &self.sasl_password)
            .field("sasl_password_file", &self.sasl_password_file)
            .field("ssl_ca_file", &self.ssl_ca_file)
            .field("oauthbearer", &self.oauthbearer)
            .field("aws_msk_iam", &self.aws_msk_iam)
            .field("delivery", &self.delivery)
            .field("progress_topic", &self.progress_topic)
            .field("transaction_max_ms", &self.transaction_max_ms)
            .field("transaction_min_ms", &self.transaction_min_ms)
            .field("transaction_max_records", &self.transaction_max_records)
            .field("topic_creation", &self.topic_creation)
            .finish()
    }
}

impl KafkaConfig {
    /// The relay hands records over adaptively (at-least-once with `batching = "adaptive"`).
    pub fn adaptive_batching(&self) -> bool {
        self.batching == Batching::Adaptive && self.delivery == Delivery::AtLeastOnce
    }

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
        let Some(path) = &self.sasl_password_file else {
            return Ok(self
                .sasl_password
                .clone()
                .unwrap_or_else(|| Secret::new("")));
        };
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Secret::new(text.trim()))
    }

    /// The `exactly_once` fields (checked whatever the mode, so a switch cannot surprise).
    fn validate_delivery(&self) -> Result<(), ConfigError> {
        if let Some(problem) = super::rules::topic_name_problem(&self.progress_topic) {
            return Err(ConfigError::invalid(
                "kafka.progress_topic",
                format!(
                    "`{}` is not a valid Kafka topic name: {problem}",
                    self.progress_topic
                ),
            ));
        }
        check_range(
            "kafka.transaction_max_ms",
            self.transaction_max_ms,
            1,
            MAX_TRANSACTION_MAX_MS,
            "ms",
        )?;
        // A Kafka transaction must commit well inside the broker's transaction timeout, or
        // the broker aborts it under the relay.
        let transaction_timeout = self
            .properties
            .get("transaction.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok());
        if let (Delivery::ExactlyOnce, Some(timeout)) = (self.delivery, transaction_timeout) {
            check_range(
                "kafka.transaction_max_ms",
                self.transaction_max_ms,
                1,
                (timeout / 2).max(1),
                "ms, at most half of kafka.properties.\"transaction.timeout.ms\"",
            )?;
        }
        check_range(
            "kafka.transaction_min_ms",
            self.transaction_min_ms,
            0,
            self.transaction_max_ms,
            "ms, at most kafka.transaction_max_ms",
        )?;
        check_range(
            "kafka.transaction_max_records",
            self.transaction_max_records as u64,
            1,
            u64::MAX,
            "records",
        )
    }

    fn validate_security(&self) -> Result<(), ConfigError> {
        if self.ssl_ca_file.is_some() && !self.security_protocol.uses_tls() {
            return Err(ConfigError::invalid(
                "kafka.ssl_ca_file",
                "is only used with security_protocol = \"ssl\" or \"sasl_ssl\"",
            ));
        }
        let sasl = self.security_protocol.uses_sasl();
        let mechanism = self.sasl_mechanism.as_deref().unwrap_or_default();
        if sasl && !SASL_MECHANISMS.contains(&mechanism) {
            return Err(ConfigError::invalid(
                "kafka.sasl_mechanism",
                format!(
                    "`{}` is not one of {} (required with security_protocol = \"{}\")",
                    mechanism,
                    SASL_MECHANISMS.join(", "),
                    self.security_protocol.as_str()
                ),
            ));
        }
        if self.uses_aws_msk_iam() {
            return self.validate_aws_msk_iam();
        }
        if let Some(field) = self.aws_msk_iam.first_set_field() {
            return Err(ConfigError::invalid(
                field,
                "is only used with sasl_mechanism = \"AWS_MSK_IAM\"",
            ));
        }
        if self.uses_oauthbearer() {
            return self.validate_oauthbearer();
        }
        if let Some(field) = self.oauthbearer.first_set_field() {
            return Err(ConfigError::invalid(
                field,
                "is only used with sasl_mechanism = \"OAUTHBEARER\"",
            ));
        }
        if sasl && self.sasl_username.is_none() {
            return Err(ConfigError::invalid(
                "kafka.sasl_username",
                "must be set with a sasl_* security_protocol",
            ));
        }
        let sasl_fields = [
            ("kafka.sasl_mechanism", self.sasl_mechanism.is_some()),
            ("kafka.sasl_username", self.sasl_username.is_some()),
            ("kafka.sasl_password", self.sasl_password.is_some()),
            (
                "kafka.sasl_password_file",
                self.sasl_password_file.is_some(),
            ),
        ];
        if let Some((field, _)) = sasl_fields.iter().find(|(_, set)| !sasl && *set) {
            return Err(ConfigError::invalid(
                *field,
                "is only used with security_protocol = \"sasl_plaintext\" or \"sasl_ssl\"",
            ));
        }
        if self.sasl_password_file.is_some() {
            // Fail at start-up, not at the first connection to a broker.
            self.sasl_password()?;
        }
        Ok(())
    }

    /// SASL OAUTHBEARER (OIDC client credentials) is how the relay logs in.
    pub fn uses_oauthbearer(&self) -> bool {
        self.security_protocol.uses_sasl() && self.sasl_mechanism.as_deref() == Some(OAUTHBEARER)
    }

    /// Amazon MSK IAM: the relay signs OAUTHBEARER tokens with AWS credentials.
    pub fn uses_aws_msk_iam(&self) -> bool {
        self.security_protocol.uses_sasl() && self.sasl_mechanism.as_deref() == Some(AWS_MSK_IAM)
    }

    /// Where a refused Kafka login is fixed, for the messages that report one.
    pub fn login_fields(&self) -> &'static str {
        if self.uses_aws_msk_iam() {
            "the AWS credentials (the error names the source tried) and their IAM policy: kafka-cluster:Connect (and WriteData, DescribeTopic, CreateTopic as used) on the cluster, for the region kafka.aws_msk_iam.region or the brokers' names"
        } else if self.uses_oauthbearer() {
            "kafka.oauthbearer (token_endpoint_url, client_id, client_secret_file, scope): the token endpoint must issue the relay a token (the error quotes its answer) that the brokers accept"
        } else {
            "kafka.sasl_username, kafka.sasl_password_file and kafka.sasl_mechanism against the broker's users"
        }
    }

    /// AWS_MSK_IAM: over TLS, a region, no user name, password or `[kafka.oauthbearer]`.
    fn validate_aws_msk_iam(&self) -> Result<(), ConfigError> {
        if !self.security_protocol.uses_tls() {
            return Err(ConfigError::invalid(
                "kafka.security_protocol",
                "must be \"sasl_ssl\" with sasl_mechanism = \"AWS_MSK_IAM\" (MSK's IAM listener, port 9098, is TLS only)",
            ));
        }
        let unused = [
            ("kafka.sasl_username", self.sasl_username.is_some()),
            ("kafka.sasl_password", self.sasl_password.is_some()),
            (
                "kafka.sasl_password_file",
                self.sasl_password_file.is_some(),
            ),
        ];
        if let Some((field, _)) = unused.iter().find(|(_, set)| *set) {
            return Err(ConfigError::invalid(
                *field,
                "is not used with sasl_mechanism = \"AWS_MSK_IAM\" (the AWS credentials name the principal)",
            ));
        }
        if let Some(field) = self.oauthbearer.first_set_field() {
            return Err(ConfigError::invalid(
                field,
                "is only used with sasl_mechanism = \"OAUTHBEARER\"",
            ));
        }
        self.aws_msk_iam.validate_used(&self.brokers)
    }

    /// OAUTHBEARER: `[kafka.oauthbearer]` complete, and no user name or password (the
    /// token names the principal).
    fn validate_oauthbearer(&self) -> Result<(), ConfigError> {
        let password_fields = [
            ("kafka.sasl_username", self.sasl_username.is_some()),
            ("kafka.sasl_password", self.sasl_password.is_some()),
            (
                "kafka.sasl_password_file",
                self.sasl_password_file.is_some(),
            ),
        ];
        if let Some((field, _)) = password_fields.iter().find(|(_, set)| *set) {
            return Err(ConfigError::invalid(
                *field,
                "is not used with sasl_mechanism = \"OAUTHBEARER\" (the token names the principal); set [kafka.oauthbearer] instead",
            ));
        }
        self.oauthbearer.validate_used()
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

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        self.topic_creation.validate()?;
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
        self.validate_delivery()?;
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

/// A librdkafka setting that breaks at-least-once delivery or per-key order with some of its
/// values: refused in `kafka.properties` unless `allow_unsafe_kafka_settings` is true.
pub struct UnsafeProperty {
    /// Its names (librdkafka's aliases included), lower case.
    pub keys: &'static [&'static str],
    /// The values refused, in words (for the configuration reference).
    pub refused: &'static str,
    /// Whether a value (trimmed, lower case) is refused.
    refuses: fn(&str) -> bool,
    /// Why.
    pub reason: &'static str,
}

fn is_false(value: &str) -> bool {
    matches!(value, "false" | "0" | "f" | "off" | "no")
}

fn is_true(value: &str) -> bool {
    matches!(value, "true" | "1" | "t" | "on" | "yes")
}

/// Every setting that can break at-least-once delivery or ordering, and when.
pub const UNSAFE_KAFKA_PROPERTIES: &[UnsafeProperty] = &[
    UnsafeProperty {
        keys: &["acks", "request.required.acks"],
        refused: "anything but `all` or `-1`",
        refuses: |v| v != "all" && v != "-1",
        reason: "the broker would acknowledge records before all in-sync replicas have them, so an acknowledged record can be lost (use `all`)",
    },
    UnsafeProperty {
        keys: &["enable.idempotence"],
        refused: "`false`, `0`, `f`, `off`, `no`",
        refuses: is_false,
        reason: "without idempotence, retries can reorder or duplicate records within a partition",
    },
    UnsafeProperty {
        keys: &["max.in.flight.requests.per.connection", "max.in.flight"],
        refused: "more than 5",
        refuses: |v| !matches!(v.parse::<u64>(), Ok(n) if n <= 5),
        reason: "more than 5 in-flight requests per connection breaks ordering of the idempotent producer",
    },
    UnsafeProperty {
        keys: &["message.send.max.retries", "retries"],
        refused: "`0`",
        refuses: |v| v == "0",
        reason: "without retries a transient broker error fails the delivery instead of retrying it",
    },
    UnsafeProperty {
        keys: &["enable.gapless.guarantee"],
        refused: "`false`, `0`, `f`, `off`, `no`",
        refuses: is_false,
        reason: "a batch refused for good lets the partition's later batches through, and the refused records are sent again after them: per-aggregate order breaks",
    },
    UnsafeProperty {
        keys: &["delivery.report.only.error"],
        refused: "`true`, `1`, `t`, `on`, `yes`",
        refuses: is_true,
        reason: "the relay needs a delivery report for every record to confirm the slot",
    },
];

/// Why `key = value` breaks at-least-once delivery or ordering, if it does.
fn unsafe_reason(key: &str, value: &str) -> Option<&'static str> {
    let key = key.trim().to_ascii_lowercase();
    let value = value.trim().to_ascii_lowercase();
    UNSAFE_KAFKA_PROPERTIES
        .iter()
        .find(|p| p.keys.contains(&key.as_str()))
        .filter(|p| (p.refuses)(&value))
        .map(|p| p.reason)
}

fn is_secret_property(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    SECRET_PROPERTY_MARKERS
        .iter()
        .any(|marker| key.contains(marker))
}

/// `kafka.properties` as `"dotted.key" = "string"` entries: a bare dotted key in TOML
/// (`socket.timeout.ms = 1`) is a nested table and is flattened; numbers and booleans become
/// strings.
fn flat_properties<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    let mut out = BTreeMap::new();
    deserializer.deserialize_map(PropertiesVisitor {
        prefix: String::new(),
        out: &mut out,
    })?;
    Ok(out)
}

/// Collects one level of `kafka.properties` into `out`, keys prefixed by `prefix`.
struct PropertiesVisitor<'a> {
    prefix: String,
    out: &'a mut BTreeMap<String, String>,
}

impl<'de> Visitor<'de> for PropertiesVisitor<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a table of strings, numbers or booleans")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(key) = map.next_key::<String>()? {
            let full = if self.prefix.is_empty() {
                key
            } else {
                format!("{}.{key}", self.prefix)
            };
            map.next_value_seed(PropertyValue {
                key: full,
                out: &mut *self.out,
            })?;
        }
        Ok(())
    }
}

/// One value of `kafka.properties`: a scalar (stored as a string) or a nested table.
struct PropertyValue<'a> {
    key: String,
    out: &'a mut BTreeMap<String, String>,
}

impl<'de> de::DeserializeSeed<'de> for PropertyValue<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PropertyValue<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string, number or boolean")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.out.insert(self.key, v.to_string());
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.visit_str(&v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.visit_str(&v.to_string())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.visit_str(&v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        self.visit_str(&v.to_string())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        PropertiesVisitor {
            prefix: self.key,
            out: self.out,
        }
        .visit_map(map)
    }
}
