//! First reads of partition counts, batched: the reader's turns (plain state), and against
//! librdkafka's mock cluster, topics waiting together read in one request, a refused topic
//! among them keeping only its own records waiting.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaRespErr;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::timeout;

use super::{FirstRead, Topics, Turn, METADATA_RETRY, STILL_WAITING_LOG};
use crate::config::KafkaConfig;
use crate::mapping::Record;
use crate::sink::blocked::BlockReason;
use crate::sink::publisher::{Delivery, Publisher};

#[test]
fn topics_queued_together_are_one_batch_and_the_first_queue_starts_the_reader() {
    let mut topics = Topics::default();
    let now = Instant::now();
    assert!(
        topics.queue_first_read("b", now),
        "the first topic starts a reader"
    );
    assert!(!topics.queue_first_read("a", now), "one reader at a time");
    assert!(!topics.queue_first_read("a", now));
    assert_eq!(
        topics.next_turn(now),
        Turn::Read(vec!["a".into(), "b".into()])
    );
}

#[test]
fn a_retried_topic_waits_for_its_pause_and_the_reader_ends_when_none_is_left() {
    let mut topics = Topics::default();
    let now = Instant::now();
    topics.queue_first_read("a", now);
    topics.queue_first_read("b", now);
    topics.first_reads.get_mut("a").unwrap().retry(now);
    assert_eq!(topics.next_turn(now), Turn::Read(vec!["b".into()]));
    topics.first_reads.remove("b");
    assert_eq!(topics.next_turn(now), Turn::Sleep(now + METADATA_RETRY));
    let later = now + METADATA_RETRY;
    assert_eq!(topics.next_turn(later), Turn::Read(vec!["a".into()]));
    // The pause doubles with each failure.
    topics.first_reads.get_mut("a").unwrap().retry(later);
    assert_eq!(
        topics.next_turn(later),
        Turn::Sleep(later + METADATA_RETRY * 2)
    );
    topics.first_reads.remove("a");
    assert_eq!(topics.next_turn(later), Turn::Done);
    assert!(
        topics.queue_first_read("c", later),
        "an ended reader is started again"
    );
}

#[test]
fn a_first_read_that_keeps_failing_is_logged_again_while_it_lasts() {
    let now = Instant::now();
    let mut read = FirstRead::new(now);
    assert!(read.log_failure(now), "the first failure is logged");
    assert!(!read.log_failure(now + METADATA_RETRY));
    assert!(!read.log_failure(now + STILL_WAITING_LOG - Duration::from_millis(1)));
    assert!(
        read.log_failure(now + STILL_WAITING_LOG),
        "a topic still waiting is logged again"
    );
    assert!(!read.log_failure(now + STILL_WAITING_LOG + METADATA_RETRY));
}

fn record(topic: &str) -> Record {
    Record {
        topic: topic.into(),
        key: Bytes::from_static(b"k"),
        payload: Some(Bytes::from_static(b"{}")),
        headers: Vec::new(),
        timestamp_ms: None,
        partition: None,
        partition_key: Some(Bytes::from_static(b"aggregate-1")),
    }
}

/// The next `n` deliveries (each must succeed), by transaction sequence number, sorted.
async fn delivered(deliveries: &mut UnboundedReceiver<Delivery>, n: usize) -> Vec<u64> {
    let mut seqs = Vec::new();
    while seqs.len() < n {
        let d = timeout(Duration::from_secs(20), deliveries.recv())
            .await
            .expect("a delivery report in time")
            .expect("the channel is open");
        assert!(d.result.is_ok(), "{:?}", d.result.err());
        seqs.push(d.seq);
    }
    seqs.sort_unstable();
    seqs
}

fn publisher(
    cluster: &MockCluster<'_, DefaultProducerContext>,
) -> (Publisher, UnboundedReceiver<Delivery>) {
    let config = KafkaConfig {
        brokers: cluster.bootstrap_servers(),
        linger_ms: 0,
        ..KafkaConfig::default()
    };
    Publisher::new(&config).unwrap()
}

/// Drops the publisher off the runtime thread (its teardown waits).
async fn drop_publisher(publisher: Publisher) {
    tokio::task::spawn_blocking(move || drop(publisher))
        .await
        .unwrap();
}

#[tokio::test]
async fn three_new_topics_are_read_in_one_metadata_request() {
    let cluster = MockCluster::<DefaultProducerContext>::new(1).unwrap();
    for topic in ["a", "b", "c"] {
        cluster.create_topic(topic, 3, 1).unwrap();
    }
    let (publisher, mut deliveries) = publisher(&cluster);
    // Nothing yields between the sends (a single-threaded runtime): all three wait at once.
    for (seq, topic) in ["a", "b", "c"].into_iter().enumerate() {
        publisher
            .send(&record(topic), seq as u64, "e")
            .await
            .unwrap();
    }
    assert_eq!(delivered(&mut deliveries, 3).await, vec![0, 1, 2]);
    assert_eq!(publisher.counts.metadata_requests.load(Relaxed), 1);
    drop_publisher(publisher).await;
}

#[tokio::test]
async fn a_refused_topic_among_many_keeps_only_its_own_records_waiting() {
    let cluster = MockCluster::<DefaultProducerContext>::new(1).unwrap();
    for topic in ["a", "b", "refused"] {
        cluster.create_topic(topic, 3, 1).unwrap();
    }
    cluster
        .topic_error(
            "refused",
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
        )
        .unwrap();
    let (publisher, mut deliveries) = publisher(&cluster);
    let rx = &mut deliveries;
    for (seq, topic) in ["a", "refused", "b", "refused"].into_iter().enumerate() {
        publisher
            .send(&record(topic), seq as u64, "e")
            .await
            .unwrap();
    }
    assert_eq!(delivered(rx, 2).await, vec![0, 2], "the other topics go on");
    // Past the block's grace (and the read after it): reported, while the refused topic's
    // records are neither delivered nor failed.
    let give_up = Instant::now() + Duration::from_secs(15);
    let blocked = |b: &crate::sink::blocked::Block| {
        b.reason == BlockReason::TopicAuthorization && b.subject == "refused"
    };
    while !publisher.blocked().current().iter().any(blocked) {
        assert!(Instant::now() < give_up, "never reported as blocked");
        let quiet = timeout(Duration::from_millis(100), rx.recv()).await;
        assert!(
            quiet.is_err(),
            "a refused topic's record came back: {quiet:?}"
        );
    }
    let blocks = publisher.blocked().current();
    assert_eq!(blocks.len(), 1, "only the refused topic: {blocks:?}");
    // The ACL is granted: its records go, in order, and the block ends.
    cluster
        .topic_error("refused", RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR)
        .unwrap();
    assert_eq!(delivered(rx, 2).await, vec![1, 3]);
    assert!(publisher.blocked().current().is_empty());
    drop_publisher(publisher).await;
}
