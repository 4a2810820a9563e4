//! Topics that refuse records when they are sent (at-least-once). A topic whose DESCRIBE is
//! allowed but WRITE is not passes every metadata check, and its refusal shows only in the
//! delivery reports (TOPIC_AUTHORIZATION_FAILED; also an ACL revoked while written to). That
//! is the deployment's fault, not the records': like a refusal found
//! at the first metadata read, it holds that topic's records here and nothing else — the
//! session never sees the failures, so no session restarts and nothing of other topics is
//! sent again, and the slot is not confirmed past the held records (they are still in flight
//! for the session).
//!
//! Held records wait in send order: first those refused, then those sent since. Refusals are
//! put in order by their transaction's sequence number, not taken in the order their reports
//! come: when a produce response says TOPIC_AUTHORIZATION_FAILED, librdkafka marks the topic
//! errored and fails the records still queued for it *before* it reports the batch that was
//! refused (`rd_kafka_handle_Produce_error` → `rd_kafka_topic_set_error` →
//! `rd_kafka_topic_assign_uas`, librdkafka 2.12), so later records are reported first. Taken in
//! report order, they went out ahead of the refused batch once the topic was fixed (CI saw
//! event 0 of an aggregate arrive after its event 93). Records of one transaction are put in
//! order by their place in it, which their opaque carries too ([`Opaque`]): without it, a
//! transaction's records split between the refused batch and the queue swapped (found by the
//! simulation, seed 1805 of `Defect::GateTiesInReportOrder`).
//!
//! The publisher's producer is gap-less (`Publisher::with_client_config`): a refusal it meets
//! is fatal to it, and the session restarts. So it never meets one it can help: a topic's
//! first record of a session goes through the **probe producer** (not idempotent, one
//! request at a time, made on first use) and the rest wait until Kafka wrote it
//! (`release_waiting`); a held topic's oldest record is sent through it too, alone, after a
//! pause (doubling up to [`PROBE_PAUSE_MAX`]). Refused again, it goes back to the front;
//! written (the block lifted), the rest follow in order through the publisher's producer.
//! Only a WRITE revoked mid-stream reaches the publisher's producer: fatal, the session
//! restarts, and its first record of the topic finds the refusal through the probe.

use std::collections::VecDeque;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::message::OwnedMessage;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::util::Timeout;
use rdkafka::Timestamp;
use tokio::sync::mpsc;
use tracing::info;

use super::super::delivery::{owned_headers, Delivery, Opaque, Refused};
use super::super::login::LoginContext;
use super::{PartitionCounts, Waiting};
use crate::sink::fault::KafkaFault;
use crate::sink::traces::{self, Outcome};

/// The first pause before a held topic's probe, doubled after each refused probe.
const PROBE_PAUSE: Duration = Duration::from_secs(1);
const PROBE_PAUSE_MAX: Duration = Duration::from_secs(30);

/// The records of one topic that refused them, and its probe.
#[derive(Default)]
pub(super) struct HeldTopic {
    /// Refused records, in the order refused.
    refused: VecDeque<Waiting>,
    /// Records routed to the topic while it was held, in send order.
    pub(super) later: VecDeque<Waiting>,
}

impl HeldTopic {
    fn pop_front(&mut self) -> Option<Waiting> {
        self.refused.pop_front().or_else(|| self.later.pop_front())
    }

    /// Puts a refused record among the refused in send order — by transaction, then by its
    /// place in it ([`Opaque`]) — whatever the order of the reports (see the module's docs for
    /// why not at the back).
    fn insert_refused(&mut self, waiting: Waiting) {
        let order = |w: &Waiting| Opaque::send_order(w.opaque);
        let at = self
            .refused
            .partition_point(|w| order(w) <= order(&waiting));
        self.refused.insert(at, waiting);
    }
}

impl PartitionCounts {
    /// Takes the refusals the delivery reporter sends back until the publisher goes.
    pub(in crate::sink::publisher) async fn serve_refusals(
        self: Arc<Self>,
        mut refusals: mpsc::UnboundedReceiver<Refused>,
    ) {
        loop {
            let refused = tokio::select! {
                _ = self.shared.stop.cancelled() => return,
                refused = refusals.recv() => match refused {
                    Some(refused) => refused,
                    None => return,
                },
            };
            self.hold(refused);
        }
    }

    /// Holds a record librdkafka refused at once for authorization (its metadata already
    /// says the topic refuses us), sent to `partition`.
    pub(in crate::sink::publisher) fn hold_refused(
        self: &Arc<Self>,
        record: &crate::mapping::Record,
        partition: Option<i32>,
        opaque: usize,
        error: &rdkafka::error::KafkaError,
    ) {
        use crate::sink::blocked::BlockReason;
        self.shared
            .blocked
            .block(BlockReason::TopicAuthorization, &record.topic, error);
        let mut record = record.clone();
        if partition.is_some() {
            record.partition = partition;
            record.partition_key = None;
        }
        self.hold(Refused { record, opaque });
    }

    /// Holds a refused record; the first of its topic starts the topic's prober.
    fn hold(self: &Arc<Self>, refused: Refused) {
        let Refused { record, opaque } = refused;
        let topic = record.topic.clone();
        let mut topics = self.topics();
        let new = !topics.held.contains_key(&topic);
        let held = topics.held.entry(topic.clone()).or_default();
        held.insert_refused(Waiting { record, opaque });
        drop(topics);
        if new {
            info!(topic = %topic, "the topic refused a record when it was sent: its records wait (nothing else does) and one is sent now and then to find out when it takes them again");
            tokio::spawn(self.clone().probe_until_taken(topic));
        }
    }

    /// Holds the records still waiting for `topic`'s first count (read: `outcome`) behind
    /// its refused ones and before those routed to it since it was held.
    pub(super) fn hold_waiting(&self, topic: &str, outcome: &Result<i32, KafkaError>) {
        let mut topics = self.topics();
        let rest = topics.waiting.remove(topic).unwrap_or_default();
        let held = topics.held.entry(topic.to_string()).or_default();
        for mut waiting in rest.into_iter().rev() {
            if let Ok(Some(partition)) = super::partition_of(&waiting.record, outcome) {
                waiting.record.partition = Some(partition);
                waiting.record.partition_key = None;
            }
            held.later.push_front(waiting);
        }
    }

    /// Sends the held topic's oldest record alone through the probe producer now and then
    /// until it is written, then the rest in order.
    async fn probe_until_taken(self: Arc<Self>, topic: String) {
        let mut pause = PROBE_PAUSE;
        loop {
            tokio::select! {
                _ = self.shared.stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            let probe = {
                let mut topics = self.topics();
                let Some(held) = topics.held.get_mut(&topic) else {
                    return;
                };
                let Some(probe) = held.pop_front() else {
                    topics.held.remove(&topic);
                    return;
                };
                probe
            };
            let partition = probe.record.partition;
            match self.probe(&probe, partition).await {
                Ok(()) if self.release_held(&topic).await => return,
                // Refused again while the rest went out: probing resumes.
                Ok(()) => pause = PROBE_PAUSE,
                Err(error) if self.shared.holds_refusal(&error) => {
                    self.back_to_front(&topic, probe);
                    pause = (pause * 2).min(PROBE_PAUSE_MAX);
                }
                // Its own fault, or a transient one: the session decides.
                Err(error) => self.fail(probe, error),
            }
        }
    }

    /// Sends `waiting` through the probe producer to `partition` and waits for Kafka's
    /// answer. Written, it is reported delivered (and the topic's block lifted).
    pub(super) async fn probe(
        &self,
        waiting: &Waiting,
        partition: Option<i32>,
    ) -> Result<(), KafkaError> {
        let record = &waiting.record;
        self.shared.refuse_outside_window(record)?;
        let producer = self.probe_producer()?;
        let mut sent = FutureRecord::to(&record.topic)
            .key(&record.key[..])
            .headers(owned_headers(record));
        if let Some(payload) = &record.payload {
            sent = sent.payload(&payload[..]);
        }
        if let Some(at) = record.timestamp_ms {
            sent = sent.timestamp(at);
        }
        if let Some(partition) = partition {
            sent = sent.partition(partition);
        }
        let timeout = Timeout::After(self.shared.message_timeout);
        let written = producer.send(sent, timeout).await;
        let opaque = Opaque::decode(waiting.opaque);
        // The event's span ends here, as the delivery callback ends it for the publisher's
        // producer; a record held for a WRITE refusal keeps it for when it is written.
        if let Some(traces) = traces::active() {
            match &written {
                Ok(at) => {
                    let message = OwnedMessage::new(
                        None,
                        None,
                        record.topic.clone(),
                        Timestamp::NotAvailable,
                        at.partition,
                        at.offset,
                        Some(owned_headers(record)),
                    );
                    let outcome = if opaque.dead_letter {
                        Outcome::DeadLettered
                    } else {
                        Outcome::Acknowledged
                    };
                    traces.delivered(&message, outcome);
                }
                Err((error, _)) if self.shared.holds_refusal(error) => {}
                Err((error, message)) => traces.delivered(message, Outcome::Failed(error)),
            }
        }
        if let Err((error, _)) = &written {
            // As the delivery callback keeps a refusal for the publisher's producer.
            if let Some(reason) = KafkaFault::of(error).block() {
                self.shared.blocked.block(reason, &record.topic, error);
            }
        }
        written.map_err(|(e, _)| e)?;
        self.shared.blocked.delivered(&record.topic);
        let _ = self.shared.deliveries.send(Delivery {
            seq: opaque.seq,
            dead_letter: opaque.dead_letter,
            bytes: record.size(),
            result: Ok(()),
        });
        Ok(())
    }

    /// The probe producer, made on first use: the admin client's settings (not idempotent),
    /// one request at a time, no linger.
    fn probe_producer(&self) -> Result<Arc<FutureProducer<LoginContext>>, KafkaError> {
        let mut probe = self.probe.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(producer) = probe.as_ref() {
            return Ok(producer.clone());
        }
        let mut config = self.admin_config.clone();
        config
            .set("linger.ms", "0")
            .set("max.in.flight.requests.per.connection", "1");
        // Not `login::attach`ed (its context is wrapped): after a lost connection it waits for
        // librdkafka's own token refresh, as the admin client does between its refreshes.
        let producer: FutureProducer<LoginContext> =
            config.create_with_context(LoginContext::new(&self.login))?;
        let producer = Arc::new(producer);
        *probe = Some(producer.clone());
        Ok(producer)
    }

    /// Sends the held records in order; the topic is held no more once none is left (under
    /// the same lock as `route` queues behind them): `true`. Refused again meanwhile: `false`.
    async fn release_held(&self, topic: &str) -> bool {
        loop {
            if self.shared.stop.is_cancelled() {
                return true;
            }
            if self.shared.blocked.holds_topic(topic) {
                return false;
            }
            let next = {
                let mut topics = self.topics();
                let Some(held) = topics.held.get_mut(topic) else {
                    return true;
                };
                match held.pop_front() {
                    Some(next) => next,
                    None => {
                        topics.held.remove(topic);
                        info!(
                            topic,
                            "the topic takes records again: its held records are sent"
                        );
                        return true;
                    }
                }
            };
            let partition = next.record.partition;
            match self
                .shared
                .produce(&next.record, next.opaque, partition)
                .await
            {
                Ok(()) => {}
                Err(error) if self.shared.holds_refusal(&error) => {
                    self.back_to_front(topic, next);
                    return false;
                }
                Err(error) => self.fail(next, error),
            }
        }
    }

    /// Puts a record taken from the front of its topic's held records back there.
    fn back_to_front(&self, topic: &str, waiting: Waiting) {
        let mut topics = self.topics();
        let held = topics.held.entry(topic.to_string()).or_default();
        held.refused.push_front(waiting);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapping::Record;

    /// A record of transaction `seq` at `place` among those sent for it.
    fn waiting((seq, place): (u64, usize), key: &str) -> Waiting {
        let opaque = Opaque {
            seq,
            place,
            dead_letter: false,
        };
        Waiting {
            record: Record {
                topic: "a".into(),
                key: bytes::Bytes::from(key.to_string()),
                ..Record::default()
            },
            opaque: opaque.encode().unwrap(),
        }
    }

    fn keys(mut held: HeldTopic) -> Vec<String> {
        std::iter::from_fn(|| held.pop_front())
            .map(|w| String::from_utf8(w.record.key.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn refusals_reported_queue_first_wait_in_send_order() {
        let mut held = HeldTopic::default();
        // librdkafka's order: the records still queued (transactions 5 to 7, one with two
        // records), then the refused batch (3 and 4).
        for (at, key) in [
            ((5, 0), "e5"),
            ((6, 0), "e6a"),
            ((6, 1), "e6b"),
            ((7, 0), "e7"),
            ((3, 0), "e3"),
            ((4, 0), "e4"),
        ] {
            held.insert_refused(waiting(at, key));
        }
        held.later.push_back(waiting((8, 0), "e8"));
        assert_eq!(keys(held), ["e3", "e4", "e5", "e6a", "e6b", "e7", "e8"]);
    }

    /// One transaction's records split between the refused batch (its first two) and the
    /// queue (the rest): reported queue first, they still wait in the order sent — the swap
    /// the simulation found (seed 1805 of `Defect::GateTiesInReportOrder`).
    #[test]
    fn a_transactions_records_reported_queue_first_wait_in_send_order() {
        let mut held = HeldTopic::default();
        for (at, key) in [
            ((9, 2), "e9c"),
            ((9, 3), "e9d"),
            ((10, 0), "e10"),
            ((9, 0), "e9a"),
            ((9, 1), "e9b"),
        ] {
            held.insert_refused(waiting(at, key));
        }
        assert_eq!(keys(held), ["e9a", "e9b", "e9c", "e9d", "e10"]);
    }
}
