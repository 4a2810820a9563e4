//! `kafka.sasl_mechanism = "AWS_MSK_IAM"` (issue 22, done-when 2): the relay's Kafka clients
//! log in with tokens from the relay's own token source, through rust-rdkafka's
//! `generate_oauth_token` (producers, consumers) and `rd_kafka_oauthbearer_set_token` (admin
//! clients, which rust-rdkafka never polls for a token), get a new token before each
//! expires, and a new one for each reconnect after a lost connection (a broker restart).
//!
//! The second test restarts the shared broker, so both are exclusive tests. The broker is the main
//! broker's OAUTHBEARER listener (`OUTBOX_TEST_KAFKA_OAUTH_BROKERS`):
//! Kafka's unsecured-JWT validator, which ends a session when its token expires. A real MSK
//! token (a presigned URL, checked by AWS) is no JWT, so the test swaps only the token
//! source — [`KafkaLogin::custom`] with unsecured JWTs of a few seconds, counting calls; the
//! client settings (`client_config` of an `AWS_MSK_IAM` config), the contexts and the admin
//! login thread are the relay's. The MSK token itself is checked against AWS's own signer in
//! the unit tests of `src/aws/msk.rs`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common::*;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use outbox_relay::config::{KafkaConfig, KafkaSecurityProtocol};
use outbox_relay::sink::publisher::login::{self, TokenSource};
use outbox_relay::sink::publisher::{admin_client, client_config, KafkaLogin, LoginContext};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::OAuthToken;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, FutureProducer, FutureRecord, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use rdkafka::{Message, Offset, TopicPartitionList};

/// Each token's lifetime: librdkafka asks for the next at 80% of it (8 s). Not shorter: the
/// broker refuses a re-authentication less than a second after the last (see
/// tests/kafka_oauth.rs).
const TOKEN_LIFETIME: Duration = Duration::from_secs(10);
const TIMEOUT: Duration = Duration::from_secs(30);

/// Unsecured JWTs (`alg: none`) for the test broker, counted, with when each was made.
struct CountingTokens {
    calls: AtomicUsize,
    lifetime: Duration,
    minted: Mutex<Vec<Instant>>,
}

impl Default for CountingTokens {
    fn default() -> Self {
        CountingTokens::lasting(TOKEN_LIFETIME)
    }
}

impl CountingTokens {
    fn lasting(lifetime: Duration) -> Self {
        CountingTokens {
            calls: AtomicUsize::new(0),
            lifetime,
            minted: Mutex::new(Vec::new()),
        }
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// How many tokens were made from `from` to `to`.
    fn minted_between(&self, from: Instant, to: Instant) -> usize {
        let minted = self.minted.lock().unwrap();
        minted.iter().filter(|&&at| at >= from && at <= to).count()
    }
}

impl TokenSource for CountingTokens {
    fn token(&self) -> Result<OAuthToken, String> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.minted.lock().unwrap().push(Instant::now());
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let expires = now + self.lifetime;
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
    LoginContext::new(&login(tokens))
}

fn producer(config: &ClientConfig, tokens: &Arc<CountingTokens>) -> FutureProducer<LoginContext> {
    config.create_with_context(context(tokens)).unwrap()
}

/// A producer as the relay's: polled on a thread of its own, its context able to set new
/// tokens on it (`login::attach`).
fn polled_producer(
    config: &ClientConfig,
    tokens: &Arc<CountingTokens>,
) -> Arc<ThreadedProducer<LoginContext>> {
    let producer: ThreadedProducer<LoginContext> =
        config.create_with_context(context(tokens)).unwrap();
    login::attach(producer.client());
    Arc::new(producer)
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

#[tokio::test(flavor = "multi_thread")]
async fn every_client_logs_in_with_the_relays_tokens_renewed_before_expiry() {
    // Serialized with the restarts of the next test.
    let _alone = super::alone().await;
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
    create_topic(&admin, &topic).await;

    let producer = producer(&config, &producer_tokens);
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
    let consumer = login::consumer(&consumer_config, context(&consumer_tokens)).unwrap();
    let name = topic.clone();
    let (_, high) =
        tokio::task::spawn_blocking(move || consumer.fetch_watermarks(&name, 0, TIMEOUT))
            .await
            .unwrap()
            .expect("the consumer logged in");
    assert_eq!(high, sent as i64, "every record is in the topic");
    assert_eq!(consumer_tokens.calls(), 1);
}

/// Tokens that outlive the test: librdkafka's own schedule asks for no other in it, so every
/// token after the first is one the relay made for a reconnect.
const LASTING: Duration = Duration::from_secs(600);
/// Records per phase: before the broker stops, while it is down, after it is back.
const PER_PHASE: usize = 20;
/// How long the broker stays down (before `kafka-start`, which takes seconds more).
const DOWN_FOR: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread")]
async fn a_reconnect_logs_in_with_a_token_made_after_the_connection_was_lost() {
    let _alone = super::alone().await;
    let topic = random_name("msk-iam-reconnect-");
    let config = msk_client_config();
    let [admin_tokens, producer_tokens, consumer_tokens] =
        [(); 3].map(|_| Arc::new(CountingTokens::lasting(LASTING)));

    let admin = admin_client(&config, context(&admin_tokens), &login(&admin_tokens)).unwrap();
    create_topic(&admin, &topic).await;
    let producer = polled_producer(&config, &producer_tokens);
    let reader = Reader::start(&config, &topic, &consumer_tokens);

    let keys: Vec<String> = (0..PER_PHASE * 3).map(|n| format!("k{n}")).collect();
    send_all(&producer, &topic, &keys[..PER_PHASE]).await;
    reader.wait_for(PER_PHASE).await;
    for tokens in [&admin_tokens, &producer_tokens, &consumer_tokens] {
        assert_eq!(tokens.calls(), 1, "one token each before the restart");
    }

    // The broker goes away with every client connected; records sent meanwhile wait in
    // the producer.
    let lost = Instant::now();
    let outage = super::BrokerOutage::begin();
    for key in &keys[PER_PHASE..PER_PHASE * 2] {
        producer
            .send(BaseRecord::to(&topic).key(key).payload("msk-iam"))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    tokio::time::sleep(DOWN_FOR).await;
    let restarting = Instant::now();
    drop(outage);
    send_all(&producer, &topic, &keys[PER_PHASE * 2..]).await;
    let admin = Arc::new(admin);
    let metadata = {
        let admin = admin.clone();
        tokio::task::spawn_blocking(move || admin.inner().fetch_metadata(None, TIMEOUT).map(|_| ()))
            .await
            .unwrap()
    };
    assert!(
        metadata.is_ok(),
        "the admin client logs in after the restart: {metadata:?}"
    );
    let got = reader.wait_for(keys.len()).await;

    let missing: Vec<_> = keys.iter().filter(|k| !got.contains_key(*k)).collect();
    let duplicates: usize = got.values().map(|n| n - 1).sum();
    eprintln!(
        "reconnect: {} records, {} missing, {duplicates} duplicates; tokens made while the \
         broker was down: admin {}, producer {}, consumer {}; in all: {}, {}, {}",
        keys.len(),
        missing.len(),
        admin_tokens.minted_between(lost, restarting),
        producer_tokens.minted_between(lost, restarting),
        consumer_tokens.minted_between(lost, restarting),
        admin_tokens.calls(),
        producer_tokens.calls(),
        consumer_tokens.calls(),
    );
    assert!(
        missing.is_empty(),
        "missing across the restart: {missing:?}"
    );
    // Each client lost its connection at `lost` and logged in again only once the broker,
    // started at `restarting`, was up: a token made in between is one the reconnect had.
    for (client, tokens) in [
        ("admin", &admin_tokens),
        ("producer", &producer_tokens),
        ("consumer", &consumer_tokens),
    ] {
        let made = tokens.minted_between(lost, restarting);
        assert!(
            made >= 1,
            "the {client} made no token after the connection was lost: its reconnect logged in with the old one"
        );
        // At most one a second while the broker was down (it fails every connection).
        let bound = (restarting - lost).as_secs() as usize + 1;
        assert!(
            made <= bound,
            "the {client} made {made} tokens in {:?}",
            restarting - lost
        );
    }
}

/// Sends a record per key and waits until the producer holds none (all acknowledged).
async fn send_all(producer: &Arc<ThreadedProducer<LoginContext>>, topic: &str, keys: &[String]) {
    for key in keys {
        producer
            .send(BaseRecord::to(topic).key(key).payload("msk-iam"))
            .map_err(|(e, _)| e)
            .unwrap();
    }
    let producer = producer.clone();
    tokio::task::spawn_blocking(move || producer.flush(TIMEOUT * 2))
        .await
        .unwrap()
        .expect("every record acknowledged");
}

/// A consumer polled all along (as the relay's readers are), counting the keys it reads.
struct Reader {
    got: Arc<Mutex<HashMap<String, usize>>>,
    stop: Arc<AtomicBool>,
}

impl Reader {
    fn start(config: &ClientConfig, topic: &str, tokens: &Arc<CountingTokens>) -> Reader {
        let mut consumer_config = config.clone();
        consumer_config
            .set("group.id", random_name("msk-iam-reader-"))
            .set("enable.auto.commit", "false");
        let consumer: BaseConsumer<LoginContext> =
            login::consumer(&consumer_config, context(tokens)).unwrap();
        let mut assignment = TopicPartitionList::new();
        assignment
            .add_partition_offset(topic, 0, Offset::Beginning)
            .unwrap();
        consumer.assign(&assignment).unwrap();
        let got = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (into, stopped) = (got.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                    let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                    *into.lock().unwrap().entry(key).or_insert(0) += 1;
                }
            }
        });
        Reader { got, stop }
    }

    /// The keys read and how often, once at least `n` distinct ones were.
    async fn wait_for(&self, n: usize) -> HashMap<String, usize> {
        let deadline = Instant::now() + TIMEOUT * 2;
        loop {
            let got = self.got.lock().unwrap().clone();
            if got.len() >= n || Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Creates `topic` (one partition) through `admin`: only an admin client that logged in can.
async fn create_topic<C: rdkafka::ClientContext + 'static>(admin: &AdminClient<C>, topic: &str) {
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(TIMEOUT));
    let created = tokio::time::timeout(TIMEOUT, admin.create_topics([&new], &options))
        .await
        .expect("the admin client logged in")
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
}
