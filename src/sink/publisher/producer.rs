//! The producer every part of the publisher sends through: librdkafka's producer, its topic
//! handles, the pacer in front of its partitions, and the channel failed records are
//! reported on. [`Shared`] is held by the
//! [`Publisher`](super::Publisher) and by the background partition-count readers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::BaseProducer;
use rdkafka::Timestamp;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::delivery::{
    owned_headers, transaction_seq, Delivery, DeliveryFailure, DeliveryReporter, DEAD_LETTER_BIT,
    PROGRESS_OPAQUE,
};
use super::pacing::{self, Pacer};
use super::topic_handles::TopicHandles;
use crate::mapping::Record;
use crate::sink::blocked::Blocked;

/// The producer and what every sender needs: shared by the publisher and its background
/// partition-count readers.
pub(super) struct Shared {
    pub(super) producer: Arc<BaseProducer<DeliveryReporter>>,
    /// What records are produced through, so that librdkafka need not look their topic up
    /// by name. It holds a producer reference of its own and destroys its topic handles
    /// before dropping it, as librdkafka's destroy requires.
    pub(super) handles: TopicHandles<DeliveryReporter>,
    /// Where failures of records that never reached librdkafka are reported.
    pub(super) deliveries: mpsc::UnboundedSender<Delivery>,
    /// How long a record may wait for its topic's partition count while the brokers cannot
    /// be reached: librdkafka's own `message.timeout.ms` for records in its queue.
    pub(super) message_timeout: Duration,
    /// Cancelled when the publisher goes: background readers stop.
    pub(super) stop: CancellationToken,
    /// What Kafka refuses for deployment reasons (missing ACLs, topics), shared with the
    /// metrics; records it stops wait.
    pub(super) blocked: Arc<Blocked>,
    /// A record of the open Kafka transaction failed before librdkafka saw it
    /// (`exactly_once`): the transaction must abort, never commit.
    pub(super) doomed: AtomicBool,
    /// Holds a partition's records while librdkafka has its fill of them (shared with the
    /// delivery callback, which releases them).
    pub(super) pacer: Arc<Pacer>,
    /// librdkafka's `message.max.bytes`.
    pub(super) max_message_bytes: usize,
}

/// How long a record waits for room in a full librdkafka queue before it is refused.
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(1);

impl Shared {
    /// Waits (1 ms steps, on the runtime's timer) while `busy` holds; fails as a timed-out
    /// message at `give_up` or when the publisher goes.
    pub(super) async fn wait_while(
        &self,
        give_up: Instant,
        busy: impl Fn() -> bool,
    ) -> Result<(), KafkaError> {
        while busy() {
            if Instant::now() >= give_up || self.stop.is_cancelled() {
                return Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::MessageTimedOut,
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    /// Hands one record to librdkafka, or to the pacer when its partition is known (every
    /// record but the progress record and those librdkafka partitions by their key),
    /// waiting out a full queue on the runtime's timer.
    pub(super) async fn produce(
        &self,
        record: &Record,
        opaque: usize,
        partition: Option<i32>,
    ) -> Result<(), KafkaError> {
        let give_up = Instant::now() + QUEUE_FULL_WAIT;
        loop {
            let sent = match partition {
                Some(p) if opaque != PROGRESS_OPAQUE && !self.too_large(record) => {
                    self.pacer.offer(self, record, opaque, p)
                }
                _ => self.handles.send(record, partition, opaque),
            };
            match sent {
                Ok(()) => return Ok(()),
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
                    if Instant::now() < give_up =>
                {
                    // Our in-flight cap sits below librdkafka's queue limit, so this is rare:
                    // give the polling thread a moment to drain callbacks.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

impl Shared {
    /// librdkafka will refuse the record as soon as it is produced (its key, value and
    /// headers alone are over `message.max.bytes`). Such a record goes straight to it, so
    /// that the refusal comes back from the send and the session dead-letters the record in
    /// its place, in either delivery mode; held, it would fail later, on a delivery thread,
    /// which an exactly-once session cannot dead-letter. It never reaches Kafka, so it
    /// overtakes nothing.
    fn too_large(&self, record: &Record) -> bool {
        let headers: usize = (record.headers.iter())
            .map(|(k, v)| k.len() + v.len())
            .sum();
        record.size() + headers > self.max_message_bytes
    }
}

impl pacing::Sender for Shared {
    fn send(&self, record: &Record, partition: i32, opaque: usize) -> Result<(), KafkaError> {
        self.handles.send(record, Some(partition), opaque)
    }

    fn fail(&self, record: Record, opaque: usize, error: KafkaError) {
        warn!(topic = %record.topic, error = %error, "a record held for room in its partition could not be handed to librdkafka");
        self.fail_unsent(&record, opaque, error);
    }
}

impl Shared {
    /// Reports a record that never reached librdkafka as a failed delivery, as librdkafka
    /// would have: the session then decides (dead letter, or restart from the slot).
    pub(super) fn fail_unsent(&self, record: &Record, opaque: usize, error: KafkaError) {
        self.doomed.store(true, Ordering::Release);
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
            seq: transaction_seq(opaque),
            dead_letter: opaque & DEAD_LETTER_BIT != 0,
            bytes: record.size(),
            result: Err(DeliveryFailure { error, message }),
        });
    }
}
