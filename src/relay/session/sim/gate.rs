//! The publisher's gate, as the simulation models it: the records of a topic Kafka refuses
//! for a deployment reason wait here — never failed, never dead-lettered, the slot never
//! confirmed past them — while the other topics go on. Two ways in, as in
//! `sink/publisher/partition_counts.rs` and `partition_counts_refused.rs`:
//!
//! - **Metadata time** (both modes): a topic's first record in a producer's life waits for
//!   the topic's first metadata read (`PartitionCounts::route`); a read the brokers refuse
//!   (no DESCRIBE, or a missing topic that is not created: `after_failure` → `Retry`) keeps
//!   it and every later record of the topic waiting, retried with back-off.
//! - **Produce time** (at-least-once): a topic whose DESCRIBE is allowed but WRITE is not
//!   passes the metadata read and fails when records are sent (TOPIC_AUTHORIZATION_FAILED in
//!   the delivery report); the reporter sends them back here (`DeliveryReporter::delivery`,
//!   `waits_at_gate`). librdkafka then marks the topic errored
//!   (`rd_kafka_handle_Produce_error` → `rd_kafka_topic_set_error`, rdkafka_request.c and
//!   rdkafka_topic.c), which fails the records still queued for the topic at once
//!   (`rd_kafka_topic_partition_cnt_update(rkt, 0)` moves them to the UA partition,
//!   `rd_kafka_topic_assign_uas` fails them with the topic's error) — reported *before* the
//!   refused batch — and every later produce to it (`rd_kafka_msg_partitioner`,
//!   rdkafka_msg.c: `RD_KAFKA_TOPIC_S_ERROR` → the topic's error), which the publisher holds
//!   too (`Publisher::send_with_opaque` → `hold_refused`). The topic leaves the error state
//!   when a metadata refresh finds it whole (`rd_kafka_topic_metadata_update` →
//!   `rd_kafka_topic_set_exists`); the publisher's probe then finds it takes records, and the
//!   held ones go, in order.
//!
//! Refused records are put in order by their transaction's sequence number
//! (`HeldTopic::insert_refused` in `partition_counts_refused.rs`), so that the queue failed
//! first does not overtake the refused batch; [`Ties`] says how records of one transaction
//! are ordered among themselves.

use std::collections::VecDeque;

use super::world::Pending;

/// How the gate orders refused records that share a transaction's sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ties {
    /// In the order they were sent, as `HeldTopic::insert_refused` does by the record's place
    /// in its transaction, which its delivery opaque carries (`delivery::Opaque`).
    SendOrder,
    /// Defect: in the order their reports came, as `HeldTopic::insert_refused` did before the
    /// opaque carried the place: the records failed from the queue are reported before the
    /// refused batch, so a transaction's records split between the two swapped.
    ReportOrder,
    /// Defect: no ordering at all, each refusal appended as it is reported (what the
    /// publisher did before CI saw event 0 of an aggregate arrive after its event 93).
    Appended,
}

/// The records of one topic that wait.
#[derive(Default)]
pub(super) struct HeldTopic {
    /// Refused by the brokers when sent, in send order (see [`Ties`]).
    refused: VecDeque<(i32, Pending)>,
    /// Routed to the topic while it waited (or waiting for its first metadata read), in
    /// send order.
    pub later: VecDeque<(i32, Pending)>,
    /// Waiting for the topic's first metadata read (not refused when sent).
    pub first_read: bool,
}

impl HeldTopic {
    pub fn insert_refused(&mut self, partition: i32, pending: Pending, ties: Ties) {
        let at = match ties {
            Ties::Appended => self.refused.len(),
            Ties::ReportOrder => self.refused.partition_point(|(_, p)| p.seq <= pending.seq),
            Ties::SendOrder => self
                .refused
                .partition_point(|(_, p)| (p.seq, p.sent) <= (pending.seq, pending.sent)),
        };
        self.refused.insert(at, (partition, pending));
    }

    /// Every record, in the order the publisher sends them again: the refused, then the
    /// later ones.
    pub fn drain(self) -> impl Iterator<Item = (i32, Pending)> {
        self.refused.into_iter().chain(self.later)
    }

    pub fn len(&self) -> usize {
        self.refused.len() + self.later.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn retain(&mut self, keep: impl Fn(&Pending) -> bool) {
        self.refused.retain(|(_, p)| keep(p));
        self.later.retain(|(_, p)| keep(p));
    }
}
