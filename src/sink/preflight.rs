//! Before the first session: the Kafka settings are tried once, so that a setting that can
//! never work stops the relay at once with the key to change, instead of being retried as if
//! the broker were down.
//!
//! Neither check talks to a broker:
//! - what the configuration asks for (a codec, TLS, a SASL mechanism, OIDC) against the
//!   features this librdkafka was built with (`builtin.features`);
//! - a throwaway producer made from the settings every session uses ([`client_config`]),
//!   without bootstrap servers: librdkafka validates every property when a client is created.
//!
//! What the relay does when Kafka refuses a record at run time is decided by the one
//! classification in `sink::fault` (and its generated table,
//! `docs/src/reference/kafka-refusals.md`); what is found here is the definite kind — a setting
//! that can never work — which stops the relay at start (`run`) or is a problem (`check`),
//! naming the key, before anything is read from the slot.

use std::collections::BTreeSet;

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::error::KafkaError;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseProducer, ProducerContext};
use rdkafka::ClientContext;

use super::publisher::client_config;
use crate::config::{Compression, KafkaConfig, OWNED_KAFKA_PROPERTIES};

/// A Kafka setting that cannot work with this build of librdkafka: which key, why, the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}; fix: {fix}")]
pub struct Refused {
    /// The configuration key to change, as the operator sets it (`kafka.compression`,
    /// `kafka.properties."socket.timeout.ms"`).
    pub key: String,
    pub problem: String,
    pub fix: String,
}

/// The librdkafka this binary is linked with.
#[derive(Debug, Clone)]
pub struct Build {
    pub version: String,
    /// `builtin.features`; empty when librdkafka did not say.
    pub features: BTreeSet<String>,
}

impl Build {
    pub fn linked() -> Build {
        let features = ClientConfig::new()
            .create_native_config()
            .and_then(|c| c.get("builtin.features"))
            .unwrap_or_default();
        Build {
            version: rdkafka::util::get_rdkafka_version().1,
            features: features
                .split(',')
                .filter(|f| !f.is_empty())
                .map(str::to_string)
                .collect(),
        }
    }

    /// `2.12.1, builtin.features: gzip, snappy, …`
    pub fn describe(&self) -> String {
        let features: Vec<&str> = self.features.iter().map(String::as_str).collect();
        format!(
            "{}, builtin.features: {}",
            self.version,
            features.join(", ")
        )
    }
}

/// Both checks; runs librdkafka's client creation on the blocking pool.
pub async fn check(config: &KafkaConfig) -> Result<Build, Refused> {
    let config = config.clone();
    tokio::task::spawn_blocking(move || {
        let build = Build::linked();
        check_with(&config, &build)?;
        Ok(build)
    })
    .await
    .unwrap_or_else(|e| {
        Err(Refused {
            key: "kafka".into(),
            problem: format!("the Kafka settings check did not finish: {e}"),
            fix: "report this as a bug".into(),
        })
    })
}

/// Both checks against `build` (blocking: creates and destroys a producer).
pub fn check_with(config: &KafkaConfig, build: &Build) -> Result<(), Refused> {
    if let Some(refused) = missing_feature(config, build) {
        return Err(refused);
    }
    let mut client = client_config(config);
    // No broker is contacted: without bootstrap servers librdkafka only validates the
    // settings and starts its threads.
    client.remove("bootstrap.servers");
    client.set_log_level(RDKafkaLogLevel::Emerg);
    match client.create_with_context::<_, BaseProducer<Quiet>>(Quiet) {
        Ok(_) => Ok(()),
        Err(e) => Err(explain(&e, config, build)),
    }
}

/// One setting and the librdkafka feature it needs.
#[derive(Debug, PartialEq, Eq)]
struct Need {
    key: String,
    value: String,
    feature: &'static str,
}

/// The features the configuration needs, keyed by the setting that needs them.
fn needs(config: &KafkaConfig) -> Vec<Need> {
    let need = |key: &str, value: &str, feature| Need {
        key: key.into(),
        value: value.into(),
        feature,
    };
    let mut needs = Vec::new();
    let codec = match config.compression {
        Compression::None => None,
        // zlib
        Compression::Gzip => Some("gzip"),
        Compression::Snappy => Some("snappy"),
        Compression::Lz4 => Some("lz4"),
        Compression::Zstd => Some("zstd"),
    };
    if let Some(feature) = codec {
        needs.push(need(
            "kafka.compression",
            config.compression.as_str(),
            feature,
        ));
    }
    let protocol = config.security_protocol;
    if protocol.uses_tls() {
        needs.push(need("kafka.security_protocol", protocol.as_str(), "ssl"));
    }
    if protocol.uses_sasl() {
        let mechanism = config.sasl_mechanism.as_deref().unwrap_or_default();
        if let Some(feature) = sasl_feature(mechanism) {
            needs.push(need("kafka.sasl_mechanism", mechanism, feature));
        }
        if config.uses_oauthbearer() {
            // librdkafka's own token fetch (sasl.oauthbearer.method=oidc) needs libcurl.
            needs.push(need("kafka.sasl_mechanism", mechanism, "oidc"));
        }
    }
    for (key, value) in &config.properties {
        let oidc = key.trim().eq_ignore_ascii_case("sasl.oauthbearer.method")
            && value.trim().eq_ignore_ascii_case("oidc");
        if oidc {
            needs.push(need(&property_key(key), value, "oidc"));
        }
    }
    needs
}

fn sasl_feature(mechanism: &str) -> Option<&'static str> {
    match mechanism.to_ascii_uppercase().as_str() {
        "PLAIN" => Some("sasl_plain"),
        "SCRAM-SHA-256" | "SCRAM-SHA-512" => Some("sasl_scram"),
        "OAUTHBEARER" => Some("sasl_oauthbearer"),
        // librdkafka's CMake build lists sasl_gssapi without Cyrus SASL, where GSSAPI has no
        // provider; the throwaway producer catches that ("No provider for SASL mechanism").
        "GSSAPI" => Some("sasl_gssapi"),
        _ => None,
    }
}

/// The first setting that needs a feature `build` lacks (none when the list is unknown).
fn missing_feature(config: &KafkaConfig, build: &Build) -> Option<Refused> {
    if build.features.is_empty() {
        return None;
    }
    let need = needs(config)
        .into_iter()
        .find(|n| !build.features.contains(n.feature))?;
    let listed: Vec<&str> = build.features.iter().map(String::as_str).collect();
    Some(Refused {
        problem: format!(
            "`{}` needs librdkafka's `{}` feature, which this build (librdkafka {}) lacks; builtin.features: {}",
            need.value,
            need.feature,
            build.version,
            listed.join(", ")
        ),
        fix: format!(
            "choose another value for {} (or build outbox-relay with librdkafka's `{}` support)",
            need.key, need.feature
        ),
        key: need.key,
    })
}

/// librdkafka's refusal of a client, as the key the operator set and what to do about it.
pub fn explain(error: &KafkaError, config: &KafkaConfig, build: &Build) -> Refused {
    let (property, message) = match error {
        // The property as it was set (an alias stays an alias), and librdkafka's reason.
        KafkaError::ClientConfig(_, message, key, _) => (Some(key.clone()), message.clone()),
        KafkaError::ClientCreation(message) => (property_named(message), message.clone()),
        other => (None, other.to_string()),
    };
    let message = redact(message.trim(), config);
    let Some(property) = property else {
        return Refused {
            key: "kafka".into(),
            problem: format!("librdkafka refuses the Kafka settings: {message}"),
            fix: "correct the [kafka] settings that message names".into(),
        };
    };
    let key = key_for(&property, config);
    let fix = if message.contains("No such configuration property") {
        format!(
            "remove {key} or correct its spelling: librdkafka {} has no such property (its CONFIGURATION.md lists them)",
            build.version
        )
    } else if message.contains("not supported in this build")
        || message.contains("not available at build time")
        || message.contains("No provider for SASL mechanism")
    {
        format!(
            "choose a value this build supports for {key}; librdkafka {}: builtin.features {}",
            build.version,
            build
                .features
                .iter()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )
    } else {
        format!("set {key} to a value librdkafka accepts (see librdkafka's CONFIGURATION.md)")
    };
    Refused {
        problem: format!("librdkafka refuses it: {message}"),
        fix,
        key,
    }
}

/// The configuration key behind a librdkafka property: the `kafka.properties` entry when the
/// operator set it there, else the dedicated field the relay sets it from.
pub fn key_for(property: &str, config: &KafkaConfig) -> String {
    let wanted = property.trim().to_ascii_lowercase();
    if let Some(key) = config
        .properties
        .keys()
        .find(|k| k.trim().to_ascii_lowercase() == wanted)
    {
        return property_key(key);
    }
    match OWNED_KAFKA_PROPERTIES
        .iter()
        .find(|(name, _)| *name == wanted)
    {
        Some((_, field)) => (*field).to_string(),
        None => property_key(property),
    }
}

/// `kafka.properties."<key>"`, the way the key is written in the file.
fn property_key(key: &str) -> String {
    format!("kafka.properties.\"{key}\"")
}

/// The librdkafka property a client-creation error names, from the message forms librdkafka
/// uses: `No such configuration property: "x"`, `Invalid value "v" for configuration
/// property "x"`, `Configuration property "x" …`, `` `x` must be set … ``, `x failed: …`,
/// and the SASL mechanism refusals (`sasl.mechanism`).
pub fn property_named(message: &str) -> Option<String> {
    if message.contains("SASL mechanism") {
        return Some("sasl.mechanism".into());
    }
    let lower = message.to_ascii_lowercase();
    if let Some(at) = lower.find("property") {
        if let Some(name) = quoted(&message[at..], '"') {
            return Some(name);
        }
    }
    if let Some(name) = quoted(message, '`').filter(|n| property_chars(n)) {
        return Some(name);
    }
    let first = message.split_whitespace().next()?;
    let rest = message[first.len()..].trim_start();
    let dotted = first.contains('.') && property_chars(first);
    (dotted && rest.starts_with("failed")).then(|| first.to_string())
}

/// The first `quote`d text in `text`.
fn quoted(text: &str, quote: char) -> Option<String> {
    let start = text.find(quote)? + 1;
    let len = text[start..].find(quote)?;
    Some(text[start..start + len].to_string())
}

fn property_chars(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_')
}

/// `message` without the values of secret settings (librdkafka may quote a refused value).
fn redact(message: &str, config: &KafkaConfig) -> String {
    let shown = config.redacted_properties();
    let mut secrets: Vec<String> = config
        .properties
        .iter()
        .filter(|(key, value)| shown.get(*key) != Some(*value) && !value.is_empty())
        .map(|(_, value)| value.clone())
        .collect();
    if let Ok(password) = config.sasl_password() {
        secrets.push(password.expose().to_string());
    }
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .fold(message.to_string(), |m, secret| {
            m.replace(secret.as_str(), crate::config::REDACTED)
        })
}

/// The throwaway producer's context: it logs nothing (the refusal is the result).
struct Quiet;

impl ClientContext for Quiet {
    fn log(&self, _: RDKafkaLogLevel, _: &str, _: &str) {}
    fn error(&self, _: KafkaError, _: &str) {}
}

impl ProducerContext for Quiet {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KafkaSecurityProtocol;

    fn build(features: &str) -> Build {
        Build {
            version: "2.12.1".into(),
            features: features.split(',').map(str::to_string).collect(),
        }
    }

    fn with_property(key: &str, value: &str) -> KafkaConfig {
        let mut config = KafkaConfig::default();
        config.properties.insert(key.into(), value.into());
        config
    }

    #[test]
    fn librdkafka_messages_name_their_property() {
        let cases = [
            (r#"No such configuration property: "foo.bar""#, "foo.bar"),
            (
                r#"Invalid value "brotli" for configuration property "compression.codec""#,
                "compression.codec",
            ),
            (
                "Configuration property \"socket.timeout.ms\" value 5 is outside allowed range 10..300000\n",
                "socket.timeout.ms",
            ),
            (
                r#"Configuration property "sasl.oauthbearer.method" not supported in this build: OAuth/OIDC depends on libcurl"#,
                "sasl.oauthbearer.method",
            ),
            (
                "`acks` must be set to `all` when `enable.idempotence` is true",
                "acks",
            ),
            (
                "`sasl.oauthbearer.token.endpoint.url` is mandatory when `sasl.oauthbearer.method=oidc` is set",
                "sasl.oauthbearer.token.endpoint.url",
            ),
            (
                "ssl.ca.location failed: error:05880002:x509 certificate routines::system lib",
                "ssl.ca.location",
            ),
            ("Unsupported SASL mechanism: FOO", "sasl.mechanism"),
            (
                "No provider for SASL mechanism GSSAPI: recompile librdkafka with libsasl2 or openssl support",
                "sasl.mechanism",
            ),
        ];
        for (message, property) in cases {
            assert_eq!(
                property_named(message).as_deref(),
                Some(property),
                "{message}"
            );
        }
        assert_eq!(property_named("Failed to create thread"), None);
    }

    #[test]
    fn properties_map_back_to_the_key_that_was_set() {
        let config = with_property("socket.timeout.ms", "5");
        assert_eq!(
            key_for("socket.timeout.ms", &config),
            r#"kafka.properties."socket.timeout.ms""#
        );
        assert_eq!(key_for("compression.codec", &config), "kafka.compression");
        assert_eq!(key_for("compression.type", &config), "kafka.compression");
        assert_eq!(
            key_for("queue.buffering.max.ms", &config),
            "kafka.linger_ms"
        );
        assert_eq!(key_for("sasl.mechanism", &config), "kafka.sasl_mechanism");
        assert_eq!(key_for("ssl.ca.location", &config), "kafka.ssl_ca_file");
        assert_eq!(
            key_for("enable.ssl.certificate.verification", &config),
            r#"kafka.properties."enable.ssl.certificate.verification""#
        );
    }

    #[test]
    fn a_codec_this_build_lacks_is_refused_naming_kafka_compression() {
        let mut config = KafkaConfig {
            compression: Compression::Zstd,
            ..KafkaConfig::default()
        };
        let refused = missing_feature(&config, &build("gzip,snappy,ssl,lz4")).unwrap();
        assert_eq!(refused.key, "kafka.compression");
        assert!(refused.problem.contains("`zstd`"), "{refused}");
        assert!(missing_feature(&config, &build("gzip,zstd")).is_none());
        config.compression = Compression::None;
        assert!(missing_feature(&config, &build("ssl")).is_none());
        // An unknown feature list refuses nothing.
        config.compression = Compression::Zstd;
        assert!(missing_feature(&config, &Build::linked_with_nothing()).is_none());
    }

    #[test]
    fn tls_sasl_and_oidc_need_their_features() {
        let mut config = KafkaConfig {
            compression: Compression::None,
            security_protocol: KafkaSecurityProtocol::SaslSsl,
            sasl_mechanism: Some("SCRAM-SHA-512".into()),
            ..KafkaConfig::default()
        };
        let refused = missing_feature(&config, &build("sasl_plain,sasl_scram")).unwrap();
        assert_eq!(refused.key, "kafka.security_protocol");
        let refused = missing_feature(&config, &build("ssl,sasl_plain")).unwrap();
        assert_eq!(refused.key, "kafka.sasl_mechanism");
        config.security_protocol = KafkaSecurityProtocol::Plaintext;
        config.sasl_mechanism = None;
        config
            .properties
            .insert("sasl.oauthbearer.method".into(), "OIDC".into());
        let refused = missing_feature(&config, &build("ssl,sasl_oauthbearer")).unwrap();
        assert_eq!(refused.key, r#"kafka.properties."sasl.oauthbearer.method""#);
        assert!(missing_feature(&config, &build("sasl_oauthbearer,http,oidc")).is_none());
    }

    #[test]
    fn an_unknown_property_is_refused_by_name() {
        let config = with_property("no.such.thing", "1");
        let refused = check_with(&config, &Build::linked()).unwrap_err();
        assert_eq!(refused.key, r#"kafka.properties."no.such.thing""#);
        assert!(refused.fix.contains("spelling"), "{refused}");
    }

    #[test]
    fn an_out_of_range_value_names_its_property() {
        let config = with_property("socket.timeout.ms", "5");
        let refused = check_with(&config, &Build::linked()).unwrap_err();
        assert_eq!(refused.key, r#"kafka.properties."socket.timeout.ms""#);
        assert!(
            refused.problem.contains("outside allowed range"),
            "{refused}"
        );
    }

    #[test]
    fn a_missing_ca_file_names_kafka_ssl_ca_file() {
        let config = KafkaConfig {
            security_protocol: KafkaSecurityProtocol::Ssl,
            ssl_ca_file: Some("/nonexistent/ca.pem".into()),
            ..KafkaConfig::default()
        };
        let refused = check_with(&config, &Build::linked()).unwrap_err();
        assert_eq!(refused.key, "kafka.ssl_ca_file");
    }

    #[test]
    fn the_default_settings_and_every_codec_pass() {
        let mut config = KafkaConfig::default();
        for codec in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            config.compression = codec;
            assert_eq!(check_with(&config, &Build::linked()), Ok(()), "{codec}");
        }
    }

    #[test]
    fn secret_values_are_not_repeated() {
        let config = with_property("ssl.key.password", "hunter2");
        let error = KafkaError::ClientCreation("bad value hunter2 for ssl.key.password".into());
        let refused = explain(&error, &config, &build("ssl"));
        assert!(!refused.to_string().contains("hunter2"), "{refused}");
    }

    impl Build {
        fn linked_with_nothing() -> Build {
            Build {
                version: "?".into(),
                features: BTreeSet::new(),
            }
        }
    }
}
