//! The publisher against librdkafka's mock cluster.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::timeout;

use super::{Delivery, Publisher};
use crate::config::{Batching, KafkaConfig};
use crate::mapping::Record;

/// Far longer than any wait below: a record sent before it did not linger.
const LINGER: Duration = Duration::from_secs(3);

fn record(partition: Option<i32>) -> Record {
    Record {
        topic: "t".into(),
        key: Bytes::from_static(b"k"),
        payload: Some(Bytes::from_static(b"{}")),
        headers: Vec::new(),
        timestamp_ms: None,
        partition,
        partition_key: None,
    }
}

async fn acknowledged(deliveries: &mut UnboundedReceiver<Delivery>, within: Duration) -> bool {
    match timeout(within, deliveries.recv()).await {
        Ok(Some(d)) => d.result.is_ok(),
        _ => false,
    }
}

/// Drops the publisher off the runtime thread (its teardown waits for librdkafka).
async fn close(publisher: Publisher) {
    tokio::task::spawn_blocking(move || drop(publisher))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_batching_sends_a_lone_record_at_once_and_linger_waits() {
    let cluster = MockCluster::<DefaultProducerContext>::new(1).unwrap();
    cluster.create_topic("t", 1, 1).unwrap();
    for (batching, lingers) in [(Batching::Adaptive, false), (Batching::Linger, true)] {
        let config = KafkaConfig {
            brokers: cluster.bootstrap_servers(),
            linger_ms: LINGER.as_millis() as u64,
            batching,
            ..KafkaConfig::default()
        };
        let (publisher, mut deliveries) = Publisher::new(&config).unwrap();
        // The first record also waits for the topic's metadata.
        publisher.send(&record(Some(0)), 0, "e0").await.unwrap();
        assert!(acknowledged(&mut deliveries, LINGER * 3).await);
        publisher.send(&record(Some(0)), 1, "e1").await.unwrap();
        let quick = acknowledged(&mut deliveries, Duration::from_millis(500)).await;
        assert_eq!(quick, !lingers, "{batching:?}: acknowledged within 500 ms");
        close(publisher).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_records_all_arrive_in_their_partitions_order() {
    let cluster = MockCluster::<DefaultProducerContext>::new(1).unwrap();
    cluster.create_topic("t", 2, 1).unwrap();
    let config = KafkaConfig {
        brokers: cluster.bootstrap_servers(),
        ..KafkaConfig::default()
    };
    let (publisher, mut deliveries) = Publisher::new(&config).unwrap();
    let total = 2_000;
    for seq in 0..total {
        let partition = (seq % 2) as i32;
        let id = format!("e{seq}");
        publisher
            .send(&record(Some(partition)), seq, &id)
            .await
            .unwrap();
    }
    let mut last: HashMap<u64, u64> = HashMap::new();
    for _ in 0..total {
        let delivery = timeout(Duration::from_secs(30), deliveries.recv())
            .await
            .expect("a held record was never released")
            .unwrap();
        assert!(delivery.result.is_ok(), "{delivery:?}");
        let seq = delivery.seq;
        if let Some(before) = last.insert(seq % 2, seq) {
            assert!(before < seq, "{seq} acknowledged after {before}");
        }
    }
    assert!(
        publisher.shared.pacer.ever_held.load(Ordering::Relaxed) > 0,
        "no record waited for room: the test did not pace"
    );
    assert!(!publisher.shared.pacer.holds_any());
    close(publisher).await;
}
