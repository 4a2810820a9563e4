//! The benchmark's Kafka: topics made up front, a warm-up record, a bare transactional
//! producer (the floor under exactly-once) and the consumers that read the relay's topics.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use crate::records::{Spread, TxnProbe, TxnProbeKind};
use crate::util::{percentile, unix_ns};

/// Creates topics (replication factor 1) with `configs` (`key=value`); existing ones are
/// left alone.
pub async fn create_topics(
    brokers: &str,
    partitions: i32,
    configs: &[String],
    topics: &[String],
) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .context("create the Kafka admin client")?;
    let configs: Vec<(&str, &str)> = configs
        .iter()
        .map(|c| {
            c.split_once('=')
                .with_context(|| format!("`{c}` is not key=value"))
        })
        .collect::<anyhow::Result<_>>()?;
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| {
            configs.iter().fold(
                NewTopic::new(t, partitions, TopicReplication::Fixed(1)),
                |topic, (k, v)| topic.set(k, v),
            )
        })
        .collect();
    // Many topics at once (the many-topics shape) take the broker a while.
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(120)));
    let results = admin
        .create_topics(&new, &options)
        .await
        .context("create topics")?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => bail!("cannot create topic {topic}: {code:?}"),
        }
    }
    let wanted: HashSet<String> = topics.iter().cloned().collect();
    tokio::task::spawn_blocking(move || wait_topics_led(&admin, &wanted, partitions)).await?
}

/// How long created topics may take to get a leader for every partition.
const TOPICS_READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Waits until the broker's metadata shows each of `wanted` with `partitions` partitions, each
/// with a leader. CreateTopics returns once the controller has them; the broker applies them
/// (creating 1,000 topics' logs takes it seconds) after, and a drain started before that would
/// time the broker's work as the relay's. Blocking.
fn wait_topics_led(
    admin: &AdminClient<DefaultClientContext>,
    wanted: &HashSet<String>,
    partitions: i32,
) -> anyhow::Result<()> {
    let give_up = Instant::now() + TOPICS_READY_TIMEOUT;
    loop {
        let metadata = admin
            .inner()
            .fetch_metadata(None, Duration::from_secs(30))
            .context("read the created topics' metadata")?;
        let led = (metadata.topics().iter())
            .filter(|t| wanted.contains(t.name()))
            .filter(|t| t.partitions().len() == partitions as usize)
            .filter(|t| t.partitions().iter().all(|p| p.leader() >= 0))
            .count();
        if led == wanted.len() {
            return Ok(());
        }
        if Instant::now() > give_up {
            bail!(
                "after {} s, {led} of {} topics have {partitions} partitions with a leader each \
                 (an older topic of the same name with another partition count never will)",
                TOPICS_READY_TIMEOUT.as_secs(),
                wanted.len(),
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One record with an idempotent producer, acknowledged: a freshly started broker has then
/// loaded its transaction coordinator (which hands out producer ids) before anything is timed.
pub async fn warm_up(brokers: &str) -> anyhow::Result<()> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "120000")
        .create()
        .context("create the warm-up producer")?;
    let record = FutureRecord::to("outbox-bench-warm-up")
        .key("warm-up")
        .payload("warm-up");
    producer
        .send(record, Duration::from_secs(120))
        .await
        .map_err(|(e, _)| anyhow::anyhow!("warm-up record not acknowledged: {e}"))?;
    Ok(())
}

/// Writes one record to every partition of `topics` and waits for them all. A partition's
/// first write on this broker takes far longer than the next ones (100,000 records over 1,000
/// one-partition topics: 2.8 s on topics made just before, 1.1–1.4 s on topics made 20 s
/// before or written once), and a drain should measure the relay, not that: in production an
/// outbox's topics have long been written to. The records are not events of any backlog.
pub async fn touch_topics(brokers: &str, partitions: i32, topics: &[String]) -> anyhow::Result<()> {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "120000")
        .create()
        .context("create the producer that touches the topics")?;
    let mut pending = Vec::new();
    for topic in topics {
        for partition in 0..partitions {
            let record = FutureRecord::to(topic)
                .partition(partition)
                .key("bench-touch")
                .payload("{}");
            let delivery = producer
                .send_result(record)
                .map_err(|(e, _)| anyhow::anyhow!("touch {topic}: {e}"))?;
            pending.push((topic, delivery));
        }
    }
    for (topic, delivery) in pending {
        match delivery.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => bail!("touch {topic}: {e}"),
            Err(_) => bail!("touch {topic}: the producer went away"),
        }
    }
    Ok(())
}

/// What a `txn-probe` does.
pub struct ProbeLoad {
    pub transactions: u32,
    pub records: u32,
    /// Pause between a commit and the next transaction's first record.
    pub pause: Duration,
}

/// A bare transactional producer: `transactions` Kafka transactions of `records` records,
/// back to back. Delivery reports are served on this thread before each commit, so that
/// rust-rdkafka's flush inside `commit_transaction` finds nothing outstanding. Blocking.
pub fn txn_probe(brokers: &str, topic: &str, load: &ProbeLoad) -> anyhow::Result<TxnProbe> {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let timeout = Duration::from_secs(30);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "transactional.id",
            format!("outbox-bench-probe-{}", unix_ns()),
        )
        .set("linger.ms", "5")
        .create()
        .context("create the transactional producer")?;
    producer.init_transactions(timeout)?;
    let (mut commit_ms, mut total_ms) = (Vec::new(), Vec::new());
    for t in 0..load.transactions {
        let begun = Instant::now();
        producer.begin_transaction()?;
        for r in 0..load.records {
            let key = format!("{t}-{r}");
            producer
                .send(BaseRecord::to(topic).key(&key).payload("probe"))
                .map_err(|(e, _)| e)?;
        }
        while producer.in_flight_count() > 0 {
            if begun.elapsed() > timeout {
                bail!("transaction {t}: records not acknowledged after {timeout:?}");
            }
            producer.poll(Duration::from_millis(1));
        }
        let committing = Instant::now();
        producer.commit_transaction(timeout)?;
        commit_ms.push(committing.elapsed().as_secs_f64() * 1000.0);
        total_ms.push(begun.elapsed().as_secs_f64() * 1000.0);
        std::thread::sleep(load.pause);
    }
    let probe = TxnProbe {
        kind: TxnProbeKind,
        transactions: load.transactions,
        records: load.records,
        pause_ms: load.pause.as_millis() as u64,
        commit: spread(&mut commit_ms),
        begin_to_committed: spread(&mut total_ms),
    };
    eprintln!(
        "[outbox-bench] txn-probe: {} transactions of {} records; commit_transaction p50 {:.1} \
         ms, p99 {:.1} ms",
        probe.transactions, probe.records, probe.commit.p50_ms, probe.commit.p99_ms
    );
    Ok(probe)
}

fn spread(v: &mut [f64]) -> Spread {
    v.sort_by(f64::total_cmp);
    Spread {
        p50_ms: percentile(v, 50.0),
        p99_ms: percentile(v, 99.0),
        max_ms: v.last().copied().unwrap_or(f64::NAN),
    }
}

/// A read_committed consumer of every partition of `topics` from the beginning.
///
/// Commit-to-visible: with `kafka.delivery = "exactly_once"` a record counts once its Kafka
/// transaction committed; records of a non-transactional producer are visible at once either
/// way. The broker answers a fetch as soon as one byte is there; the fetch settings only bound
/// the wait when there is nothing, so they cannot delay a record.
pub fn assigned_consumer(
    brokers: &str,
    topics: &[String],
    group_prefix: &str,
) -> anyhow::Result<BaseConsumer> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("{group_prefix}-{}", unix_ns()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", "10")
        .set("fetch.min.bytes", "1")
        .set("isolation.level", "read_committed")
        .create()
        .context("create the Kafka consumer")?;
    let mut assignment = TopicPartitionList::new();
    for topic in topics {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .with_context(|| format!("metadata of topic {topic}"))?;
        let partitions: Vec<i32> = metadata
            .topics()
            .iter()
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect();
        if partitions.is_empty() {
            bail!("topic {topic} has no partitions; create it first");
        }
        for p in partitions {
            assignment.add_partition_offset(topic, p, Offset::Beginning)?;
        }
    }
    consumer.assign(&assignment)?;
    Ok(consumer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against the test suite's broker (scripts/test.sh): one record in every partition.
    #[tokio::test(flavor = "multi_thread")]
    async fn touching_writes_one_record_to_every_partition() {
        let brokers = std::env::var("OUTBOX_TEST_KAFKA_BROKERS")
            .expect("OUTBOX_TEST_KAFKA_BROKERS is not set: run the tests through scripts/test.sh");
        let topics: Vec<String> = (0..2)
            .map(|i| format!("bench-touch-{}-{i}", std::process::id()))
            .collect();
        create_topics(&brokers, 3, &[], &topics).await.unwrap();
        touch_topics(&brokers, 3, &topics).await.unwrap();
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .unwrap();
        for topic in &topics {
            for partition in 0..3 {
                let (low, high) = consumer
                    .fetch_watermarks(topic, partition, Duration::from_secs(10))
                    .unwrap();
                assert_eq!(high - low, 1, "{topic}/{partition}");
            }
        }
    }
}
