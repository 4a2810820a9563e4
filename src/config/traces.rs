//! `[tracing]`: OpenTelemetry traces, a PRODUCER span per event exported as OTLP. Off by
//! default.

use serde::{Deserialize, Serialize};

use super::validate::check_range;
use super::ConfigError;

/// Default `tracing.endpoint`: a collector on the same host (OTLP/HTTP's port and path).
pub const DEFAULT_TRACING_ENDPOINT: &str = "http://127.0.0.1:4318/v1/traces";
/// Default `tracing.service_name`.
pub const DEFAULT_SERVICE_NAME: &str = "outbox-relay";
/// Default `tracing.export_interval_ms`.
pub const DEFAULT_EXPORT_INTERVAL_MS: u64 = 1_000;
/// Default `tracing.export_timeout_ms`.
pub const DEFAULT_EXPORT_TIMEOUT_MS: u64 = 10_000;
/// Default `tracing.max_queue_spans`: at 5,000 events/s a few seconds of a slow collector.
pub const DEFAULT_MAX_QUEUE_SPANS: u64 = 16_384;
/// Default `tracing.max_export_batch_spans`.
pub const DEFAULT_MAX_EXPORT_BATCH_SPANS: u64 = 1_024;

/// `[tracing]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TracingConfig {
    /// Make a span per event and export it. Off: no span is made and nothing is sent.
    pub enabled: bool,
    /// Where spans go: the full URL of the collector's OTLP/HTTP traces endpoint (with the
    /// `/v1/traces` path), `http://` or `https://`.
    pub endpoint: String,
    /// The OTLP transport: `http/protobuf` (the only one: every collector accepts it, and
    /// gRPC would more than double what tracing costs to build).
    pub protocol: OtlpProtocol,
    /// The spans' `service.name` resource attribute.
    pub service_name: String,
    /// The share of traces sampled when the row carries no trace context (0.0 to 1.0). A
    /// row's context decides for its event (parent-based): a sampled parent is always
    /// followed, an unsampled one never.
    pub sample_ratio: SampleRatio,
    /// How often the finished spans are exported, in milliseconds (sooner once
    /// `max_export_batch_spans` are waiting).
    pub export_interval_ms: u64,
    /// How long one export request may take, in milliseconds; then it counts as failed.
    pub export_timeout_ms: u64,
    /// Finished spans waiting for export; when full (a slow or unreachable collector), new
    /// spans are dropped, never waited for.
    pub max_queue_spans: u64,
    /// Spans per export request, at most `max_queue_spans`.
    pub max_export_batch_spans: u64,
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OtlpProtocol {
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// A ratio in 0.0..=1.0 (a float that compares by its bits, so that `Config` stays `Eq`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SampleRatio(pub f64);

impl PartialEq for SampleRatio {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for SampleRatio {}

impl Default for TracingConfig {
    fn default() -> Self {
        TracingConfig {
            enabled: false,
            endpoint: DEFAULT_TRACING_ENDPOINT.to_string(),
            protocol: OtlpProtocol::HttpProtobuf,
            service_name: DEFAULT_SERVICE_NAME.to_string(),
            sample_ratio: SampleRatio(1.0),
            export_interval_ms: DEFAULT_EXPORT_INTERVAL_MS,
            export_timeout_ms: DEFAULT_EXPORT_TIMEOUT_MS,
            max_queue_spans: DEFAULT_MAX_QUEUE_SPANS,
            max_export_batch_spans: DEFAULT_MAX_EXPORT_BATCH_SPANS,
        }
    }
}

impl TracingConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        let endpoint = self.endpoint.as_str();
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
            || endpoint.contains(char::is_whitespace)
        {
            return Err(ConfigError::invalid(
                "tracing.endpoint",
                format!("`{endpoint}` is not an http:// or https:// URL (e.g. {DEFAULT_TRACING_ENDPOINT})"),
            ));
        }
        if self.service_name.trim().is_empty() {
            return Err(ConfigError::invalid(
                "tracing.service_name",
                "must not be empty",
            ));
        }
        let ratio = self.sample_ratio.0;
        if !(0.0..=1.0).contains(&ratio) {
            return Err(ConfigError::invalid(
                "tracing.sample_ratio",
                format!("must be between 0.0 and 1.0, got {ratio}"),
            ));
        }
        check_range(
            "tracing.export_interval_ms",
            self.export_interval_ms,
            1,
            3_600_000,
            "ms",
        )?;
        check_range(
            "tracing.export_timeout_ms",
            self.export_timeout_ms,
            1,
            600_000,
            "ms",
        )?;
        check_range(
            "tracing.max_queue_spans",
            self.max_queue_spans,
            1,
            1 << 24,
            "spans",
        )?;
        check_range(
            "tracing.max_export_batch_spans",
            self.max_export_batch_spans,
            1,
            self.max_queue_spans,
            "spans, at most tracing.max_queue_spans",
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigError};

    fn field_of(toml: &str, env: &[(&str, &str)]) -> Result<Config, String> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::from_sources(Some(toml), env).map_err(|e| match e {
            ConfigError::Invalid { field, .. } => field,
            other => other.to_string(),
        })
    }

    #[test]
    fn tracing_is_off_by_default_and_env_overrides_it() {
        let config = field_of("", &[]).unwrap();
        assert!(!config.tracing.enabled);
        let config = field_of(
            "",
            &[
                ("OUTBOX_RELAY__TRACING__ENABLED", "true"),
                ("OUTBOX_RELAY__TRACING__SAMPLE_RATIO", "0.25"),
                (
                    "OUTBOX_RELAY__TRACING__ENDPOINT",
                    "https://otel:4318/v1/traces",
                ),
            ],
        )
        .unwrap();
        assert!(config.tracing.enabled);
        assert_eq!(config.tracing.sample_ratio.0, 0.25);
        assert_eq!(config.tracing.endpoint, "https://otel:4318/v1/traces");
    }

    #[test]
    fn bad_tracing_values_name_their_key() {
        for (toml, key) in [
            ("[tracing]\nendpoint = \"otel:4318\"", "tracing.endpoint"),
            ("[tracing]\nsample_ratio = 1.5", "tracing.sample_ratio"),
            ("[tracing]\nsample_ratio = -0.1", "tracing.sample_ratio"),
            ("[tracing]\nservice_name = \" \"", "tracing.service_name"),
            (
                "[tracing]\nexport_interval_ms = 0",
                "tracing.export_interval_ms",
            ),
            (
                "[tracing]\nmax_queue_spans = 10\nmax_export_batch_spans = 11",
                "tracing.max_export_batch_spans",
            ),
        ] {
            assert_eq!(field_of(toml, &[]).unwrap_err(), key, "{toml}");
        }
        let grpc = Config::from_sources(Some("[tracing]\nprotocol = \"grpc\""), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(
            grpc.contains("tracing.protocol") && grpc.contains("http/protobuf"),
            "{grpc}"
        );
        let env = field_of("", &[("OUTBOX_RELAY__TRACING__SAMPLE_RATIO", "half")]).unwrap_err();
        assert!(env.contains("OUTBOX_RELAY__TRACING__SAMPLE_RATIO"), "{env}");
    }
}
