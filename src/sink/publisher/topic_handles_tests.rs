//! Records produced through cached topic handles, against librdkafka's mock cluster: every
//! field arrives, one handle serves every record of its topic, errors are those of producing
//! by name, and nothing hangs when the producer goes with handles alive.

use std::collections::HashMap;
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::unix_ms;

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Headers, Message, OwnedMessage};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, ProducerContext};
use rdkafka::{ClientContext, Offset, Timestamp, TopicPartitionList};

use super::topic_handles::TopicHandles;
use super::{Delivery, Publisher};
use crate::config::KafkaConfig;
use crate::mapping::partition::partition_for_key;
use crate::mapping::Record;

const PARTITIONS: i32 = 3;
const WAIT: Duration = Duration::from_secs(30);

/// A delivery report: the opaque, and the partition or the error.
type Report = (usize, Result<i32, KafkaError>);

/// Sends each delivery report down a channel.
struct Reports(Mutex<mpsc::Sender<Report>>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: usize) {
        let outcome = match result {
            Ok(m) => Ok(m.partition()),
            Err((e, _)) => Err(e.clone()),
        };
        let _ = self.0.lock().unwrap().send((opaque, outcome));
    }
}

fn cluster(topics: &[&str]) -> MockCluster<'static, DefaultProducerContext> {
    let cluster = MockCluster::new(1).unwrap();
    for topic in topics {
        cluster.create_topic(topic, PARTITIONS, 1).unwrap();
    }
    cluster
}

/// A producer set up as the relay's (its partitioner), with `extra` settings.
fn producer(
    brokers: &str,
    extra: &[(&str, &str)],
) -> (Arc<BaseProducer<Reports>>, mpsc::Receiver<Report>) {
    let (tx, rx) = mpsc::channel();
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", brokers)
        .set("partitioner", "murmur2_random");
    for (key, value) in extra {
        config.set(*key, *value);
    }
    let producer = config.create_with_context(Reports(Mutex::new(tx))).unwrap();
    (Arc::new(producer), rx)
}

/// Polls the producer until `n` delivery reports came, by opaque.
fn reports(
    producer: &BaseProducer<Reports>,
    rx: &mpsc::Receiver<Report>,
    n: usize,
) -> HashMap<usize, Result<i32, KafkaError>> {
    let give_up = Instant::now() + WAIT;
    let mut got = HashMap::new();
    while got.len() < n {
        assert!(Instant::now() < give_up, "{} of {n} reports", got.len());
        producer.poll(Duration::from_millis(50));
        got.extend(rx.try_iter());
    }
    got
}

/// Reads `n` records from every partition of `topics`, from the beginning.
fn consume(brokers: &str, topics: &[&str], n: usize) -> Vec<OwnedMessage> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "topic-handles-test")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        for p in 0..PARTITIONS {
            assignment
                .add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
    }
    consumer.assign(&assignment).unwrap();
    let give_up = Instant::now() + WAIT;
    let mut got = Vec::new();
    while got.len() < n {
        assert!(Instant::now() < give_up, "consumed {} of {n}", got.len());
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            got.push(m.unwrap().detach());
        }
    }
    got
}

fn record(topic: &str, key: &str) -> Record {
    Record {
        topic: topic.into(),
        key: Bytes::from(key.to_string()),
        payload: Some(Bytes::from(format!("payload of {key}"))),
        ..Record::default()
    }
}

fn headers(pairs: &[(&str, &str)]) -> Vec<(Arc<str>, Bytes)> {
    pairs
        .iter()
        .map(|(k, v)| (Arc::from(*k), Bytes::from(v.to_string())))
        .collect()
}

fn header_pairs(m: &OwnedMessage) -> Vec<(String, Vec<u8>)> {
    m.headers().map_or_else(Vec::new, |h| {
        h.iter()
            .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
            .collect()
    })
}

/// Where a record must land: its explicit partition, or the partitioner's pick by key.
fn expected_partition(r: &Record) -> i32 {
    r.partition
        .unwrap_or_else(|| partition_for_key(&r.key, PARTITIONS))
}

#[test]
fn every_field_arrives_through_the_handles() {
    let cluster = cluster(&["alpha", "beta"]);
    let brokers = cluster.bootstrap_servers();
    let (producer, rx) = producer(&brokers, &[]);
    let handles = TopicHandles::new(producer.clone());
    let records = vec![
        Record {
            headers: headers(&[("h1", "v1"), ("empty", "")]),
            timestamp_ms: Some(1_700_000_000_123),
            partition: Some(2),
            ..record("alpha", "a-explicit")
        },
        Record {
            headers: headers(&[("trace", "abc")]),
            ..record("beta", "b-partitioner")
        },
        Record {
            payload: None,
            timestamp_ms: Some(1_700_000_000_456),
            ..record("alpha", "a-tombstone")
        },
        Record {
            partition: Some(0),
            ..record("beta", "b-explicit")
        },
    ];
    let sent_at = unix_ms();
    for (i, r) in records.iter().enumerate() {
        handles.send(r, r.partition, i).unwrap();
    }

    let reports = reports(&producer, &rx, records.len());
    for (i, r) in records.iter().enumerate() {
        let partition = reports[&i].as_ref().expect("delivered");
        assert_eq!(*partition, expected_partition(r), "{}", r.topic);
    }
    let consumed = consume(&brokers, &["alpha", "beta"], records.len());
    for r in &records {
        let m = consumed
            .iter()
            .find(|m| m.key() == Some(&r.key[..]))
            .expect("consumed");
        assert_eq!(m.topic(), r.topic);
        assert_eq!(m.partition(), expected_partition(r));
        assert_eq!(m.payload(), r.payload.as_deref());
        let sent = r.headers.iter().map(|(k, v)| (k.to_string(), v.to_vec()));
        assert_eq!(header_pairs(m), sent.collect::<Vec<_>>());
        match (r.timestamp_ms, m.timestamp()) {
            (Some(ts), got) => assert_eq!(got, Timestamp::CreateTime(ts)),
            // Stamped by the producer when it took the record.
            (None, Timestamp::CreateTime(ts)) => assert!((sent_at..=unix_ms()).contains(&ts)),
            (None, got) => panic!("unexpected timestamp {got:?}"),
        }
    }
}

#[test]
fn one_handle_serves_every_record_of_its_topic() {
    let cluster = cluster(&["alpha", "beta"]);
    let brokers = cluster.bootstrap_servers();
    let (producer, rx) = producer(&brokers, &[]);
    let handles = TopicHandles::new(producer.clone());
    let n = 200;
    for i in 0..n {
        let topic = if i % 2 == 0 { "alpha" } else { "beta" };
        handles
            .send(&record(topic, &format!("k{i}")), None, i)
            .unwrap();
    }
    assert_eq!(handles.len(), 2);
    let reports = reports(&producer, &rx, n);
    assert!(reports.values().all(Result::is_ok), "{reports:?}");
    assert_eq!(consume(&brokers, &["alpha", "beta"], n).len(), n);
}

#[test]
fn a_full_queue_is_queue_full_as_when_producing_by_name() {
    let cluster = cluster(&["alpha"]);
    let brokers = cluster.bootstrap_servers();
    // One message fits, and it stays counted until its report is polled.
    let (producer, rx) = producer(&brokers, &[("queue.buffering.max.messages", "1")]);
    let handles = TopicHandles::new(producer.clone());
    let r = Record {
        headers: headers(&[("h", "v")]),
        ..record("alpha", "k")
    };
    handles.send(&r, None, 1).unwrap();
    let refused = handles.send(&r, None, 2).unwrap_err();
    assert_eq!(
        refused,
        KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull)
    );
    let by_name = BaseRecord::with_opaque_to("alpha", 3).key("k").payload("p");
    assert_eq!(producer.send(by_name).unwrap_err().0, refused);
    // Only the record librdkafka took is reported.
    let reports = reports(&producer, &rx, 1);
    assert!(reports[&1].is_ok());
    assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
}

#[test]
fn bad_topic_names_fail_as_when_producing_by_name() {
    let cluster = cluster(&[]);
    let (producer, _rx) = producer(&cluster.bootstrap_servers(), &[]);
    let handles = TopicHandles::new(producer.clone());
    let too_long = "t".repeat(600);
    let by_name = BaseRecord::<str, str, usize>::with_opaque_to(&too_long, 0).key("k");
    let expected = producer.send(by_name).unwrap_err().0;
    assert_eq!(
        handles.send(&record(&too_long, "k"), None, 0).unwrap_err(),
        expected
    );
    assert!(matches!(
        handles.send(&record("a\0b", "k"), None, 0),
        Err(KafkaError::Nul(_))
    ));
    assert_eq!(handles.len(), 0);
}

/// Runs `f` on a thread of its own; fails if it takes longer than `within`.
fn finishes_within(within: Duration, f: impl FnOnce() + Send + 'static) {
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = done.send(());
    });
    finished
        .recv_timeout(within)
        .expect("finished in time (librdkafka's destroy hangs while topic handles live)");
}

#[test]
fn the_handles_keep_their_producer_and_go_before_it() {
    let cluster = cluster(&["alpha", "beta"]);
    let (producer, rx) = producer(&cluster.bootstrap_servers(), &[]);
    let handles = TopicHandles::new(producer.clone());
    for (i, topic) in ["alpha", "beta"].into_iter().enumerate() {
        handles.send(&record(topic, "k"), None, i).unwrap();
    }
    reports(&producer, &rx, 2);
    // The handles keep their producer: records still go after every other reference went.
    drop(producer);
    handles.send(&record("alpha", "late"), None, 9).unwrap();
    // Their producer goes after them, with that record still in flight (purged).
    finishes_within(Duration::from_secs(10), move || drop(handles));
}

fn kafka_config(brokers: String) -> KafkaConfig {
    KafkaConfig {
        brokers,
        ..KafkaConfig::default()
    }
}

async fn delivered(deliveries: &mut tokio::sync::mpsc::UnboundedReceiver<Delivery>) -> Delivery {
    tokio::time::timeout(WAIT, deliveries.recv())
        .await
        .expect("a delivery report in time")
        .expect("the channel is open")
}

/// The publisher's own teardown (outside a runtime it runs inline) with handles alive.
#[test]
fn the_publisher_goes_with_its_handles_without_hanging() {
    let cluster = cluster(&["alpha", "beta"]);
    let (publisher, mut deliveries) =
        Publisher::new(&kafka_config(cluster.bootstrap_servers())).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for i in 0..20u64 {
            let topic = if i % 2 == 0 { "alpha" } else { "beta" };
            let r = Record {
                headers: headers(&[("n", &i.to_string())]),
                ..record(topic, &format!("k{i}"))
            };
            publisher.send(&r, i, "e").await.unwrap();
        }
        for _ in 0..20 {
            let d = delivered(&mut deliveries).await;
            assert!(d.result.is_ok(), "{:?}", d.result.err());
            assert!(!d.dead_letter);
        }
    });
    assert_eq!(publisher.topic_handle_count(), 2);
    drop(runtime);
    finishes_within(Duration::from_secs(10), move || drop(publisher));
}
