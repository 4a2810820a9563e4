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
    use crate::sink::fault::{KafkaFault, Stamp, Verdict};
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    let verdict = |code| KafkaFault::of(&KafkaError::MessageProduction(code)).verdict(Stamp::Row);
    assert!(matches!(
        verdict(RDKafkaErrorCode::InvalidRecord),
        Verdict::OwnFault(_)
    ));
    assert_eq!(
        verdict(RDKafkaErrorCode::InvalidDifferentRecord),
        Verdict::Retry
    );
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

/// The opaque's place: records of one transaction count up from 0, dead letters among them, a
/// new transaction starts again at 0; ordered by opaque, records are in send order; a
/// transaction number past what an opaque carries is an error, never a wrapped number.
#[test]
fn opaques_carry_the_transaction_and_each_records_place_in_send_order() {
    use super::delivery::{Opaque, PROGRESS_OPAQUE};
    let cluster = MockCluster::<DefaultProducerContext>::new(1).unwrap();
    let config = KafkaConfig {
        brokers: cluster.bootstrap_servers(),
        ..KafkaConfig::default()
    };
    let (publisher, _deliveries) = Publisher::new(&config).unwrap();
    let sent: Vec<(u64, bool)> = vec![(7, false), (7, true), (7, false), (8, false), (8, false)];
    let opaques: Vec<usize> = sent
        .iter()
        .map(|&(seq, dead_letter)| publisher.opaque(seq, dead_letter).unwrap())
        .collect();
    let decoded: Vec<(u64, usize, bool)> = opaques
        .iter()
        .map(|&o| Opaque::decode(o))
        .map(|o| (o.seq, o.place, o.dead_letter))
        .collect();
    assert_eq!(
        decoded,
        [
            (7, 0, false),
            (7, 1, true),
            (7, 2, false),
            (8, 0, false),
            (8, 1, false)
        ]
    );
    let mut by_order = opaques.clone();
    by_order.reverse();
    by_order.sort_by_key(|&o| Opaque::send_order(o));
    assert_eq!(by_order, opaques, "sorted by send order is the order sent");

    let largest = (1u64 << 43) - 2;
    let last = Opaque {
        seq: largest,
        place: usize::MAX,
        dead_letter: true,
    };
    let encoded = last.encode().expect("the largest sequence number fits");
    assert_ne!(encoded, PROGRESS_OPAQUE);
    assert_eq!(Opaque::decode(encoded).seq, largest);
    assert!(matches!(
        publisher.opaque(largest + 1, false),
        Err(super::PublishError::Fatal(_))
    ));
    drop(publisher);
}

/// A record over the producer's `message.max.bytes` is refused at `send`, while the session
/// still has its row, also as the first record of a topic (which otherwise waits for the
/// topic's first read, and librdkafka would fail it from there, after the row was let go);
/// one within it goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_over_message_max_bytes_is_refused_at_send_even_before_its_topic_is_met() {
    use super::PublishError;
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    let cluster = MockCluster::<DefaultProducerContext>::new(1).unwrap();
    cluster.create_topic("t", 1, 1).unwrap();
    let mut config = KafkaConfig {
        brokers: cluster.bootstrap_servers(),
        ..KafkaConfig::default()
    };
    config
        .properties
        .insert("message.max.bytes".into(), "10000".into());
    let (publisher, mut deliveries) = Publisher::new(&config).unwrap();
    assert_eq!(publisher.record_limit("t"), 10_000);
    let big = Record {
        payload: Some(Bytes::from(vec![b'x'; 10_000])),
        ..record()
    };
    match publisher.send(&big, 0, "e0").await {
        Err(PublishError::Rejected(r)) => assert_eq!(
            r.error,
            KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge)
        ),
        other => panic!("{other:?}"),
    }
    publisher.send(&record(), 1, "e1").await.unwrap();
    assert!(acknowledged(&mut deliveries, Duration::from_secs(10)).await);
    tokio::task::spawn_blocking(move || drop(publisher))
        .await
        .unwrap();
}
