//! The small sections: `[relay]` (process behaviour), `[http]` (metrics and health endpoints)
//! and `[dead_letter]` (rows that cannot be published).

use serde::{Deserialize, Serialize};

use super::layering::unset;
use super::rules::topic_name_problem;
use super::ConfigError;

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
    /// (`host:port`). Unset (`""` in the file): no listener.
    #[serde(with = "unset")]
    pub listen: Option<String>,
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
    /// The dead-letter breaker: more dead letters than this within a sliding minute trip it
    /// (`on_breaker` says what then). 0 turns it off (the default: what a normal rate is
    /// depends on the outbox; set it from `outbox_relay_events_dead_lettered_total`).
    pub max_per_minute: u32,
    /// What a tripped breaker does: `stop` ends the relay (exit 1) with the slot confirmed up
    /// to the last transaction before the one that tripped it; `unready` keeps the slot and
    /// the position, reads nothing more and turns `/readyz` red until the relay is restarted.
    pub on_breaker: BreakerPolicy,
}

/// What a tripped dead-letter breaker does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerPolicy {
    Stop,
    Unready,
}

impl BreakerPolicy {
    pub const NAMES: &'static [&'static str] = &["stop", "unready"];
}

/// `dead_letter.max_per_minute` by default: off.
pub const DEFAULT_DEAD_LETTER_MAX_PER_MINUTE: u32 = 0;

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

impl Default for RelayConfig {
    fn default() -> Self {
        RelayConfig {
            shutdown_timeout_ms: 30_000,
            confirm_delay_ms: 20,
            log_format: LogFormat::Text,
        }
    }
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: Some("127.0.0.1:9187".to_string()),
            ready_staleness_ms: 30_000,
        }
    }
}

impl Default for DeadLetterConfig {
    fn default() -> Self {
        DeadLetterConfig {
            policy: DeadLetterPolicy::DeadLetter,
            topic: "outbox.dlq".to_string(),
            max_per_minute: DEFAULT_DEAD_LETTER_MAX_PER_MINUTE,
            on_breaker: BreakerPolicy::Stop,
        }
    }
}

impl HttpConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let listen = self.listen.as_deref().unwrap_or_default();
        if !listen.is_empty() && listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(ConfigError::invalid(
                "http.listen",
                format!(
                    "`{}` is not host:port (e.g. 127.0.0.1:9187); empty turns the listener off",
                    listen
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
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Some(problem) = topic_name_problem(&self.topic) {
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
