//! Configuration: plain data and its validation. A leaf: it imports nothing of the data path.
//!
//! In: the TOML file (`config/outbox-relay.toml` lists every key with its default) and
//! `OUTBOX_RELAY__…` environment variables. Out: a validated [`Config`], loaded once in `main`,
//! whose sections (`postgres`, `outbox`, `kafka`, `relay`, `http`, `dead_letter`) are handed to
//! the stages that use them; plus the pure rules the data path shares with validation
//! ([`topic_name_problem`], [`split_tls_params`]).
//!
//! Sources, lowest precedence first:
//!
//! 1. built-in defaults (each section's `Default`),
//! 2. the TOML file, if one is given,
//! 3. environment variables `OUTBOX_RELAY__<SECTION>__<KEY>` (upper-case, `__` between levels),
//!    e.g. `OUTBOX_RELAY__POSTGRES__SLOT=orders_relay`,
//!    `OUTBOX_RELAY__KAFKA__MAX_IN_FLIGHT_MESSAGES=5000` or
//!    `OUTBOX_RELAY__OUTBOX__SWEEPER__ENABLED=true`. The string is converted to the type of
//!    the key (integer, `true`/`false`, string). Entries of `kafka.properties` are set with
//!    `OUTBOX_RELAY__KAFKA__PROPERTIES__<KEY>`: the key is lower-cased and every `_` becomes `.`,
//!    so `OUTBOX_RELAY__KAFKA__PROPERTIES__SOCKET_TIMEOUT_MS=60000` sets `socket.timeout.ms`
//!    (a librdkafka property whose name contains `_` can only be set in the file). The whole
//!    `OUTBOX_RELAY__` prefix is reserved: a variable naming an unknown key is an error.
//!
//! Unknown keys, wrong types and invalid values are errors that name the key, the section and
//! the source. A key that may be unset is an `Option`, written `""` in the file. This module
//! does no I/O except reading the config file ([`Config::load`]) and the password files
//! ([`PostgresConfig::password`], [`KafkaConfig::sasl_password`]); secrets never reach `Debug`,
//! `Display` or [`Config::to_redacted_toml`].
//!
//! Files: `postgres.rs`, `outbox.rs`, `kafka.rs` and `sections.rs` (relay, http, dead_letter)
//! hold the schema of each section with its defaults and rules; `layering.rs` merges the
//! sources; `validate.rs` has the shared field checks; `secret.rs` the redaction; `rules.rs`
//! the rules shared with the data path.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod kafka;
mod layering;
mod outbox;
mod postgres;
mod rules;
mod secret;
mod sections;
mod serialization;
mod topic_creation;
mod traces;
mod validate;

#[cfg(test)]
mod tests;

pub use kafka::{
    Batching, Compression, Delivery, KafkaConfig, KafkaSecurityProtocol, OauthBearer,
    DEFAULT_MAX_IN_FLIGHT_MESSAGES, MAX_BATCH_NUM_MESSAGES, MAX_LINGER_MS, MAX_MESSAGE_TIMEOUT_MS,
    MIN_MAX_IN_FLIGHT_BYTES, MIN_MESSAGE_TIMEOUT_MS, OAUTHBEARER, OWNED_KAFKA_PROPERTIES,
    SASL_MECHANISMS, UNSAFE_KAFKA_PROPERTIES,
};
pub use layering::ENV_PREFIX;
pub use outbox::{
    cloudevents_extension_problem, cloudevents_string_problem, Format, NullPayload, OutboxConfig,
    OutboxTableConfig, SweeperConfig, CLOUDEVENTS_RESERVED_ATTRIBUTES,
    CLOUDEVENTS_SOURCE_PLACEHOLDERS, DEFAULT_CLOUDEVENTS_SOURCE, DEFAULT_SCHEMA,
    MAX_CLOUDEVENTS_ATTRIBUTE_CHARS, MAX_SWEEPER_BATCH_SIZE, PARTITION_BY_AGGREGATE_ID,
    PARTITION_BY_KEY, TOPIC_PLACEHOLDERS,
};
pub use postgres::{
    FailoverSlot, PostgresAuth, PostgresConfig, SslMode, TcpKeepalive, DEFAULT_KEEPALIVES_IDLE_MS,
    DEFAULT_KEEPALIVES_INTERVAL_MS, DEFAULT_KEEPALIVES_RETRIES, DEFAULT_TCP_USER_TIMEOUT_MS,
    FALLBACK_RECEIVE_TIMEOUT_MS, MAX_STATUS_INTERVAL_MS,
};
pub use rules::{remove_params, split_tls_params, topic_name_problem, MAX_TOPIC_CHARS};
pub use secret::{Secret, REDACTED};
pub use sections::{
    BreakerPolicy, DeadLetterConfig, DeadLetterPolicy, HttpConfig, LogFormat, RelayConfig,
};
pub use serialization::{
    KeyFormat, SchemaVersion, SerializationConfig, SerializationFormat, SubjectStrategy,
    DEFAULT_LATEST_TTL_MS, DEFAULT_RECORD_NAME_HEADER, DEFAULT_REGISTRY_TIMEOUT_MS,
};
pub use topic_creation::{TopicCreation, TopicCreationGroup, TopicSpec};
pub use traces::{OtlpProtocol, SampleRatio, TracingConfig};

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
    /// `[tracing]`: OpenTelemetry spans per event (off by default).
    pub tracing: TracingConfig,
}

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
        let env = layering::env_vars()?;
        let config = Config::build(&origin, text.as_deref(), env)?;
        config.postgres.password()?;
        for section in config.outbox.serialization_profiles().0 {
            section.read_secret()?;
        }
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
        let config = layering::layer(origin, toml_text, env)?;
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
        self.tracing.validate()?;
        Ok(())
    }

    /// The effective configuration as TOML, for `outbox-relay config`: the URL's password, the
    /// SASL password and the values of secret `kafka.properties` are replaced by `***`.
    pub fn to_redacted_toml(&self) -> String {
        let mut shown = self.clone();
        shown.postgres.url = self.postgres.redacted_url();
        shown.kafka.properties = self.kafka.redacted_properties();
        // `kafka.sasl_password` is a `Secret`: it serializes as `***`.
        toml::to_string(&shown)
            .unwrap_or_else(|err| format!("# cannot render the configuration: {err}\n"))
    }
}
