//! The producer every part of the publisher sends through: librdkafka's producer, its topic
//! handles, and the channel failed records are reported on. [`Shared`] is held by the
//! [`Publisher`](super::Publisher) and by the background partition-count readers.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::BaseProducer;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::delivery::{Delivery, DeliveryReporter};
use super::topic_handles::TopicHandles;
use crate::mapping::Record;
use crate::sink::blocked::{BlockReason, Blocked};

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
    /// A `skip_linger` runs.
    pub(super) skipping_linger: AtomicBool,
    /// At-least-once: records a topic refuses for authorization wait in the gate
    /// (`partition_counts_refused.rs`) instead of failing.
    pub(super) holds_refusals: bool,
    /// The most a batch holds (`batch.size`, or `message.max.bytes` when smaller): a record at
    /// least this large is alone in its batch.
    pub(super) batch_size: usize,
    /// The producer's `message.max.bytes`: librdkafka refuses a larger record at once.
    pub(super) message_max_bytes: usize,
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

    /// The error means the topic refuses the relay's records for authorization, and such
    /// records are held (at-least-once) rather than failed.
    pub(super) fn holds_refusal(&self, error: &KafkaError) -> bool {
        self.holds_refusals
            && crate::sink::fault::KafkaFault::of(error).block()
                == Some(crate::sink::blocked::BlockReason::TopicAuthorization)
    }

    /// Hands one record to librdkafka, waiting out a full queue on the runtime's timer. A
    /// record outside its topic's known timestamp window is not sent: the broker would refuse
    /// it, and several such records of a batch come back INVALID_RECORD each, which would
    /// dead-letter healthy records (a failed delivery report carries no timestamp to tell them
    /// apart). It fails with INVALID_TIMESTAMP instead, a transient failure, and the topic is
    /// blocked `record_timestamp` until a delivery to it shows the window widened.
    pub(super) async fn produce(
        &self,
        record: &Record,
        opaque: usize,
        partition: Option<i32>,
    ) -> Result<(), KafkaError> {
        self.refuse_outside_window(record)?;
        let give_up = Instant::now() + QUEUE_FULL_WAIT;
        loop {
            match self.handles.send(record, partition, opaque) {
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

    /// The record lies outside its topic's known timestamp window: refused here (see
    /// [`Shared::produce`]), and the topic blocked `record_timestamp`.
    pub(super) fn refuse_outside_window(&self, record: &Record) -> Result<(), KafkaError> {
        if self.blocked.limits().outside_window(
            &record.topic,
            record.timestamp_ms,
            crate::clock::unix_ms,
        ) {
            let error = KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTimestamp);
            self.blocked
                .block(BlockReason::RecordTimestamp, &record.topic, &error);
            return Err(error);
        }
        Ok(())
    }
}
