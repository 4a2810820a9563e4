//! `kafka.sasl_mechanism = "AWS_MSK_IAM"` (issue 22, done-when 2): the relay's Kafka clients
//! log in with tokens from the relay's own token source, through rust-rdkafka's
//! `generate_oauth_token` (producers, consumers) and `rd_kafka_oauthbearer_set_token` (admin
//! clients, which rust-rdkafka never polls for a token), and get a new token before each
//! expires.
//!
//! It restarts the shared broker, so it lives in the exclusive binary. The broker is the main
//! broker's OAUTHBEARER listener (`OUTBOX_TEST_KAFKA_OAUTH_BROKERS`):
//! Kafka's unsecured-JWT validator, which ends a session when its token expires. A real MSK
//! token (a presigned URL, checked by AWS) is no JWT, so the test swaps only the token
//! source — [`KafkaLogin::custom`] with unsecured JWTs of a few seconds, counting calls; the
//! client settings (`client_config` of an `AWS_MSK_IAM` config), the contexts and the admin
//! login thread are the relay's. The MSK token itself is checked against AWS's own signer in
//! the unit tests of `src/aws/msk.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use outbox_relay::config::{KafkaConfig, KafkaSecurityProtocol};
use outbox_relay::sink::publisher::login::{self, TokenSource};
use outbox_relay::sink::publisher::{admin_client, client_config, KafkaLogin, LoginContext};
use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::OAuthToken;
use rdkafka::consumer::Consumer;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

/// Each token's lifetime: librdkafka asks for the next at 80% of it (8 s). Not shorter: the
/// broker refuses a re-authentication less than a second after the last (see
/// tests/kafka_oauth.rs).
const TOKEN_LIFETIME: Duration = Duration::from_secs(10);
const TIMEOUT: Duration = Duration::from_secs(30);

/// Unsecured JWTs (`alg: none`) for the test broker, counted.
#[derive(Default)]
struct CountingTokens {
    calls: AtomicUsize,
}

impl CountingTokens {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl TokenSource for CountingTokens {
    fn token(&self) -> Result<OAuthToken, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let expires = now + TOKEN_LIFETIME;
        let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#);
        let claims = format!(
            r#"{{"sub":"relay","iat":{},"exp":{}}}"#,
            now.as_secs(),
            expires.as_secs()
        );
        Ok(OAuthToken {
            token: format!("{header}.{}.", URL_SAFE_NO_PAD.encode(claims)),
            principal_name: "relay".into(),
            lifetime_ms: expires.as_millis() as i64,
        })
    }
}

/// The relay's librdkafka settings for an `AWS_MSK_IAM` config, pointed at the test
/// listener (which has no TLS: MSK's IAM listener has, so the config asks for `sasl_ssl`).
fn msk_client_config() -> ClientConfig {
    let config = KafkaConfig {
        brokers: env("OUTBOX_TEST_KAFKA_OAUTH_BROKERS"),
        security_protocol: KafkaSecurityProtocol::SaslSsl,
        sasl_mechanism: Some("AWS_MSK_IAM".into()),
        ..KafkaConfig::default()
    };
    let mut client = client_config(&config);
    assert_eq!(client.get("sasl.mechanism"), Some("OAUTHBEARER"));
    assert_eq!(
        client.get("sasl.oauthbearer.method"),
        None,
        "not librdkafka's OIDC"
    );
    client.set("security.protocol", "sasl_plaintext");
    client
}

fn login(tokens: &Arc<CountingTokens>) -> KafkaLogin {
    KafkaLogin::custom(tokens.clone())
}

fn context(tokens: &Arc<CountingTokens>) -> LoginContext {
    LoginContext {
        login: login(tokens),
    }
}

async fn send(producer: &FutureProducer<LoginContext>, topic: &str, n: usize) {
    let key = format!("k{n}");
    let record = FutureRecord::to(topic).key(&key).payload("msk-iam");
    match tokio::time::timeout(TIMEOUT, producer.send(record, TIMEOUT)).await {
        Ok(Ok(_)) => {}
        Ok(Err((e, _))) => panic!("record {n} not delivered: {e}"),
        Err(_) => panic!("record {n} not delivered in {TIMEOUT:?}: no login?"),
    }
}

/// Waits until `tokens` was asked at least `at_least` times.
async fn wait_calls(tokens: &CountingTokens, at_least: usize, what: &str) {
    let deadline = Instant::now() + TIMEOUT;
    while tokens.calls() < at_least {
        assert!(
            Instant::now() < deadline,
            "{what}: {} token requests, expected at least {at_least}",
            tokens.calls()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_client_logs_in_with_the_relays_tokens_renewed_before_expiry_and_after_a_restart() {
    // It restarts the shared broker.
    let _alone = crate::EXCLUSIVE.lock().await;
    let topic = random_name("msk-iam-");
    let config = msk_client_config();
    let (admin_tokens, producer_tokens, consumer_tokens) = (
        Arc::new(CountingTokens::default()),
        Arc::new(CountingTokens::default()),
        Arc::new(CountingTokens::default()),
    );

    // The admin client: no token request ever reaches it through rust-rdkafka; without the
    // login thread it cannot create the topic.
    let admin = admin_client(&config, context(&admin_tokens), &login(&admin_tokens)).unwrap();
    let new = NewTopic::new(&topic, 1, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let created = tokio::time::timeout(TIMEOUT, admin.create_topics([&new], &options))
        .await
        .expect("the admin client logged in")
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");

    let producer: FutureProducer<LoginContext> = config
        .create_with_context(context(&producer_tokens))
        .unwrap();
    let started = Instant::now();
    let mut sent = 0;
    // Across three token lifetimes: the broker ends a session whose token expired, so
    // records keep going only if librdkafka got new tokens (at 8 s, 16 s, 24 s).
    while started.elapsed() < TOKEN_LIFETIME * 3 {
        send(&producer, &topic, sent).await;
        sent += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        producer_tokens.calls() >= 3,
        "the producer asked for {} tokens in {:?}: not renewed before expiry",
        producer_tokens.calls(),
        started.elapsed()
    );
    // The admin client's login thread renews on the same schedule.
    assert!(
        admin_tokens.calls() >= 3,
        "admin: {} tokens",
        admin_tokens.calls()
    );

    // A consumer that is never polled still gets its first token (the relay's progress and
    // dead-letter readers only read offsets).
    let consumer_config = {
        let mut c = config.clone();
        c.set("group.id", random_name("msk-iam-group-"));
        c
    };
    let consumer = login::consumer(
        &consumer_config,
        context(&consumer_tokens),
        &login(&consumer_tokens),
    )
    .unwrap();
    let name = topic.clone();
    let (_, high) =
        tokio::task::spawn_blocking(move || consumer.fetch_watermarks(&name, 0, TIMEOUT))
            .await
            .unwrap()
            .expect("the consumer logged in");
    assert_eq!(high, sent as i64, "every record is in the topic");
    assert_eq!(consumer_tokens.calls(), 1);

    // A broker restart: the clients reconnect and log in with the token current then (within
    // its lifetime; librdkafka asks for none on reconnect), and renewal goes on.
    let before = producer_tokens.calls();
    drop(crate::BrokerOutage::begin());
    send(&producer, &topic, sent).await;
    wait_calls(
        &producer_tokens,
        before + 1,
        "the producer after the restart",
    )
    .await;
    let metadata = tokio::task::spawn_blocking(move || {
        admin
            .inner()
            .fetch_metadata(None, TIMEOUT)
            .map(|m| m.topics().len())
    })
    .await
    .unwrap();
    assert!(
        metadata.is_ok(),
        "the admin client logs in after the restart: {metadata:?}"
    );
}
