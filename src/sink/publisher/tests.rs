//! The publisher against librdkafka's mock cluster.

use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::timeout;

use super::{Delivery, Publisher};
use crate::config::KafkaConfig;
use crate::mapping::Record;

/// Far longer than any wait below: a record sent before it did not linger.
const LINGER: Duration = Duration::from_secs(3);

fn record() -> Record {
    Record {
        topic: "t".into(),
        key: Bytes::from_static(b"k"),
        payload: Some(Bytes::from_static(b"{}")),
        headers: Vec::new(),
        timestamp_ms: None,
        partition: None,
        partition_key: None,
    }
}

async fn acknowledged(deliveries: &mut UnboundedReceiver<Delivery>, within: Duration) -> bool {
    match timeout(within, deliveries.recv()).await {
        Ok(Some(d)) => d.result.is_ok(),
        _ => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skip_linger_sends_a_lingering_record_at_once() {
    let cluster = MockCluster::<DefaultProducerContext>::new(1).unwrap();
    cluster.create_topic("t", 1, 1).unwrap();
    let config = KafkaConfig {
        brokers: cluster.bootstrap_servers(),
        linger_ms: LINGER.as_millis() as u64,
        ..KafkaConfig::default()
    };
    let (publisher, mut deliveries) = Publisher::new(&config).unwrap();
    // The first record also waits for the topic's metadata.
    publisher.send(&record(), 0, "e0").await.unwrap();
    assert!(acknowledged(&mut deliveries, LINGER * 3).await);

    publisher.send(&record(), 1, "e1").await.unwrap();
    let sent = Instant::now();
    assert!(
        !acknowledged(&mut deliveries, Duration::from_millis(300)).await,
        "acknowledged before the linger without a skip"
    );
    // Asked again until it goes: a broker thread that was not scheduled within one window
    // (a loaded machine) must not fail the test, the linger would.
    let mut skipped = false;
    while !skipped && sent.elapsed() < LINGER / 2 {
        publisher.skip_linger();
        skipped = acknowledged(&mut deliveries, Duration::from_millis(50)).await;
    }
    assert!(
        skipped,
        "still lingering {:?} after the send",
        sent.elapsed()
    );
    tokio::task::spawn_blocking(move || drop(publisher))
        .await
        .unwrap();
}

/// An invalid record is its own fault; the neighbours librdkafka fails with it
/// (`_INVALID_DIFFERENT_RECORD`) are not: they are sent again.
#[test]
fn only_the_invalid_record_of_a_refused_batch_is_at_fault() {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    let produced = KafkaError::MessageProduction;
    assert!(super::is_permanent(&produced(
        RDKafkaErrorCode::InvalidRecord
    )));
    assert!(!super::is_permanent(&produced(
        RDKafkaErrorCode::InvalidDifferentRecord
    )));
}

/// Exactly-once: a commit waits for its records at most as long as the producer's
/// `message.timeout.ms`, which is capped by the transaction timeout, not the configured 300 s.
#[test]
fn a_commit_waits_no_longer_than_the_capped_message_timeout() {
    let config = KafkaConfig {
        message_timeout_ms: 300_000,
        ..KafkaConfig::default()
    };
    let mut client = super::client_config(&config);
    assert_eq!(
        super::effective_message_timeout(&client, &config),
        Duration::from_secs(300)
    );
    client.set("message.timeout.ms", "60000");
    assert_eq!(
        super::effective_message_timeout(&client, &config),
        Duration::from_secs(60)
    );
}
