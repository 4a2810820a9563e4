//! The librdkafka settings of every Kafka client the relay makes: the producer's (ours, then
//! the user's `kafka.properties`), the admin client's, and the security settings they share.

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use tracing::warn;

use crate::config::KafkaConfig;

/// `transaction.timeout.ms` unless `kafka.properties` sets it (librdkafka's default).
const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;

/// librdkafka settings: ours first, then the user's pass-through properties (validated by
/// the config so that none of them weakens the delivery guarantee).
pub fn client_config(config: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    let queue_kbytes = (config.max_in_flight_bytes * 4 / 1024).max(64 * 1024);
    c.set("bootstrap.servers", &config.brokers)
        .set("client.id", &config.client_id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", config.linger_ms.to_string())
        .set("batch.num.messages", config.batch_num_messages.to_string())
        .set("compression.type", config.compression.as_str())
        .set("message.timeout.ms", config.message_timeout_ms.to_string())
        .set("partitioner", "murmur2_random")
        // A broker connection that died without a FIN/RST is noticed by the kernel.
        .set("socket.keepalive.enable", "true")
        .set(
            "queue.buffering.max.messages",
            (config.max_in_flight_messages * 2).to_string(),
        )
        .set("queue.buffering.max.kbytes", queue_kbytes.to_string());
    set_security(&mut c, config);
    for (key, value) in &config.properties {
        c.set(key, value);
    }
    c
}

/// `transaction.timeout.ms` as the producer gets it: from `kafka.properties`, else 60000.
pub fn transaction_timeout_ms(config: &KafkaConfig) -> u64 {
    config
        .properties
        .get("transaction.timeout.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(DEFAULT_TRANSACTION_TIMEOUT_MS)
}

/// The settings of the admin client that creates topics: the producer's connection and
/// security, without idempotence (an admin client sends no records).
pub(super) fn admin_config(config: &KafkaConfig) -> ClientConfig {
    let mut c = client_config(config);
    c.set("enable.idempotence", "false");
    c
}

/// TLS and SASL settings from their dedicated fields.
fn set_security(c: &mut ClientConfig, config: &KafkaConfig) {
    let protocol = config.security_protocol;
    c.set("security.protocol", protocol.as_str());
    if let Some(ca) = config.ssl_ca_file.as_ref().filter(|_| protocol.uses_tls()) {
        c.set("ssl.ca.location", ca.display().to_string());
    }
    if config.uses_aws_msk_iam() {
        // librdkafka asks the client context for each token (`generate_oauth_token`): see
        // `login`. Method `default` is that callback (not the built-in OIDC fetch).
        c.set("sasl.mechanism", "OAUTHBEARER");
        // A lost connection is logged (facility FAIL) at info or warning, not reported as
        // an error: the contexts read those lines for a new token (`login`), so librdkafka
        // must send them; the relay's log filter still decides what is printed.
        if !matches!(c.log_level, RDKafkaLogLevel::Debug) {
            c.set_log_level(RDKafkaLogLevel::Info);
        }
    } else if config.uses_oauthbearer() {
        for (key, value) in config.oauthbearer.librdkafka_properties() {
            c.set(key, value);
        }
    } else if protocol.uses_sasl() {
        let password = config.sasl_password().unwrap_or_else(|e| {
            warn!(error = %e, "cannot read kafka.sasl_password_file; authenticating without a password");
            crate::config::Secret::new("")
        });
        c.set(
            "sasl.mechanism",
            config.sasl_mechanism.clone().unwrap_or_default(),
        )
        .set(
            "sasl.username",
            config.sasl_username.clone().unwrap_or_default(),
        )
        .set("sasl.password", password.expose());
    }
}

/// Drops the producer-only settings that `client_config` adds and a consumer rejects.
pub fn consumer_config(mut client: rdkafka::ClientConfig) -> rdkafka::ClientConfig {
    for key in [
        "enable.idempotence",
        "acks",
        "linger.ms",
        "batch.num.messages",
        "compression.type",
        "message.timeout.ms",
        "partitioner",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
    ] {
        client.remove(key);
    }
    client
}
