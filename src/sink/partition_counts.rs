//! Partition counts of the topics the publisher writes to, read from the brokers without ever
//! making a sender wait: a record whose topic's count is not known yet waits in that topic's
//! queue (with every later record of the topic, so that none overtakes it in its partition)
//! while a background task reads the count; the queue is then produced in order, or failed as
//! librdkafka fails its own queue. Known counts are refreshed in the background.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::Producer;
use rdkafka::Timestamp;
use tracing::warn;

use super::publisher::{owned_headers, Delivery, DeliveryFailure, Shared, DEAD_LETTER_BIT};
use super::TxnSeq;
use crate::mapping::{partition, Record};

/// Partition counts of the topics written to, and the records waiting for one.
#[derive(Default)]
pub(super) struct Topics {
    /// Partition count per topic with the time it was read, for `Record::partition_key`.
    counts: HashMap<String, (i32, Instant)>,
    /// Records of topics whose count is being read for the first time, in send order.
    waiting: HashMap<String, VecDeque<Waiting>>,
    /// Topics whose count is being read again; their records use the known count meanwhile.
    refreshing: HashSet<String>,
}

impl Topics {
    /// Some record still waits for its topic's partition count.
    pub(super) fn any_waiting(&self) -> bool {
        !self.waiting.is_empty()
    }
}

/// A record that waits for its topic's partition count.
pub(super) struct Waiting {
    record: Record,
    opaque: usize,
}

/// How long a topic's partition count is trusted before it is read again (a topic may grow).
const PARTITION_COUNT_TTL: Duration = Duration::from_secs(60);
/// Per metadata request.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a topic the brokers answer for, but without partitions (maybe being
/// auto-created, or refused), may take to get them before its records fail.
const METADATA_WAIT: Duration = Duration::from_secs(10);
/// One attempt to refresh a known count; on failure the known count is kept.
const METADATA_REFRESH_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between metadata requests for a topic whose first count is not known yet.
const METADATA_RETRY: Duration = Duration::from_millis(200);

impl Shared {
    /// The record's partition (`Some(None)`: the partitioner hashes the key), or `None` when
    /// the record was queued to wait for its topic's partition count.
    pub(super) fn route(self: &Arc<Self>, record: &Record, opaque: usize) -> Option<Option<i32>> {
        let mut topics = self.topics();
        if let Some(queue) = topics.waiting.get_mut(&record.topic) {
            // Behind the records already waiting, whether or not this one needs the count: a
            // record that went straight to librdkafka could overtake them in its partition.
            queue.push_back(Waiting {
                record: record.clone(),
                opaque,
            });
            return None;
        }
        let Some(key) = needs_count(record) else {
            return Some(record.partition);
        };
        match topics.counts.get(&record.topic).copied() {
            Some((count, read_at)) => {
                if read_at.elapsed() >= PARTITION_COUNT_TTL
                    && topics.refreshing.insert(record.topic.clone())
                {
                    tokio::spawn(self.clone().refresh_count(record.topic.clone(), count));
                }
                Some(Some(partition::partition_for_key(key, count)))
            }
            None => {
                let first = Waiting {
                    record: record.clone(),
                    opaque,
                };
                topics
                    .waiting
                    .insert(record.topic.clone(), VecDeque::from([first]));
                tokio::spawn(self.clone().read_first_count(record.topic.clone()));
                None
            }
        }
    }

    /// Reads a topic's first partition count, then produces its waiting records in order,
    /// or fails them all. Brokers that cannot be reached are waited for as long as
    /// librdkafka waits for the records in its own queue (`message.timeout.ms`).
    async fn read_first_count(self: Arc<Self>, topic: String) {
        let started = Instant::now();
        let mut warned = false;
        let outcome = loop {
            let error = match self.fetch_count(&topic, METADATA_TIMEOUT).await {
                Ok(count) => break Ok(count),
                Err(e) => e,
            };
            let unreachable = matches!(
                error.rdkafka_error_code(),
                Some(
                    RDKafkaErrorCode::BrokerTransportFailure
                        | RDKafkaErrorCode::AllBrokersDown
                        | RDKafkaErrorCode::OperationTimedOut
                )
            );
            if !unreachable && started.elapsed() >= METADATA_WAIT {
                break Err(error);
            }
            if started.elapsed() >= self.message_timeout {
                break Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::MessageTimedOut,
                ));
            }
            if !warned {
                warn!(topic, error = %error, "cannot read the topic's partition count yet; its records wait");
                warned = true;
            }
            tokio::select! {
                _ = self.stop.cancelled() => return,
                _ = tokio::time::sleep(METADATA_RETRY) => {}
            }
        };
        if let Ok(count) = outcome {
            self.topics()
                .counts
                .insert(topic.clone(), (count, Instant::now()));
        }
        self.release_waiting(&topic, outcome).await;
    }

    /// Produces (or fails) the records waiting for `topic`, oldest first; the queue goes
    /// only once empty, so a record sent meanwhile still lines up behind them.
    async fn release_waiting(&self, topic: &str, outcome: Result<i32, KafkaError>) {
        loop {
            if self.stop.is_cancelled() {
                return;
            }
            let next = {
                let mut topics = self.topics();
                match topics.waiting.get_mut(topic).and_then(VecDeque::pop_front) {
                    Some(next) => next,
                    None => {
                        topics.waiting.remove(topic);
                        return;
                    }
                }
            };
            let partition = match (needs_count(&next.record), &outcome) {
                (None, _) => Ok(next.record.partition),
                (Some(key), Ok(count)) => Ok(Some(partition::partition_for_key(key, *count))),
                (Some(_), Err(error)) => Err(error.clone()),
            };
            let result = match partition {
                Ok(partition) => self.produce(&next.record, next.opaque, partition).await,
                Err(error) => Err(error),
            };
            if let Err(error) = result {
                self.fail(next, error);
            }
        }
    }

    /// Refreshes a known count in the background; on failure the known one stays, for
    /// another TTL.
    async fn refresh_count(self: Arc<Self>, topic: String, known: i32) {
        let count = self
            .fetch_count(&topic, METADATA_REFRESH_TIMEOUT)
            .await
            .unwrap_or(known);
        let mut topics = self.topics();
        topics.counts.insert(topic.clone(), (count, Instant::now()));
        topics.refreshing.remove(&topic);
    }

    /// One metadata request for `topic` (which creates it when the brokers auto-create
    /// topics). librdkafka's request blocks its caller, so it runs on the blocking pool.
    async fn fetch_count(&self, topic: &str, timeout: Duration) -> Result<i32, KafkaError> {
        let producer = self.producer.clone();
        let name = topic.to_string();
        let fetched = tokio::task::spawn_blocking(move || {
            producer.client().fetch_metadata(Some(&name), timeout)
        })
        .await
        // Only a panic or a runtime shutting down get here.
        .map_err(|_| KafkaError::MetadataFetch(RDKafkaErrorCode::Fail))?;
        let metadata = fetched?;
        match metadata.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                Ok(t.partitions().len() as i32)
            }
            Some(t) => Err(KafkaError::MetadataFetch(
                t.error()
                    .map_or(RDKafkaErrorCode::UnknownTopicOrPartition, Into::into),
            )),
            None => Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::UnknownTopicOrPartition,
            )),
        }
    }

    /// Reports a record that never reached librdkafka as a failed delivery, as librdkafka
    /// would have: the session then decides (dead letter, or restart from the slot).
    fn fail(&self, waiting: Waiting, error: KafkaError) {
        let record = &waiting.record;
        warn!(topic = %record.topic, error = %error, "a record waiting for its topic's partition count failed");
        let message = OwnedMessage::new(
            record.payload.as_ref().map(|p| p.to_vec()),
            Some(record.key.to_vec()),
            record.topic.clone(),
            record
                .timestamp_ms
                .map_or(Timestamp::NotAvailable, Timestamp::CreateTime),
            -1,
            -1,
            Some(owned_headers(record)),
        );
        let _ = self.deliveries.send(Delivery {
            seq: (waiting.opaque & !DEAD_LETTER_BIT) as TxnSeq,
            dead_letter: waiting.opaque & DEAD_LETTER_BIT != 0,
            bytes: record.size(),
            result: Err(DeliveryFailure { error, message }),
        });
    }
}

/// The bytes a record's partition is hashed from, when that needs the topic's partition
/// count (no explicit partition, a partition key); `None` when librdkafka can take it as is.
fn needs_count(record: &Record) -> Option<&[u8]> {
    record
        .partition_key
        .as_deref()
        .filter(|_| record.partition.is_none())
}
