//! What Kafka says no with, classified once, where it enters: a [`KafkaFault`] is made from
//! librdkafka's error code in the delivery callback (and at produce time, and in the
//! metadata reads), and every later decision is an exhaustive `match` on it — [`verdict`]
//! (retry, hold, judge the size, the record's own fault) — so that a fault added here does not
//! compile until each decision about it is made.
//!
//! [`CODES`] is the one list of the codes that mean something other than "send again from
//! the slot"; the book's table (`docs/src/reference/kafka-refusals.md`) is generated from it
//! and from [`KafkaFault::describe`], and a test fails when the committed page drifts.
//!
//! [`verdict`]: KafkaFault::verdict

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode as C;

use crate::sink::blocked::BlockReason;
use crate::sink::dead_letter::Reason;

/// One refusal of Kafka, by what it means for the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum KafkaFault {
    /// The deployment refuses the relay now (a missing ACL or topic, a refused login): nothing
    /// is wrong with the record, and it goes through once the operator fixed it.
    Deployment(BlockReason),
    /// The record, or the batch it was in, is larger than the topic or the producer takes
    /// (librdkafka fails every record of a refused batch with it, without splitting).
    TooLarge,
    /// The broker named this record invalid (with KIP-467's record errors, only the records
    /// at fault get it).
    InvalidRecord,
    /// librdkafka's `_INVALID_DIFFERENT_RECORD`: a healthy record of a batch the broker
    /// refused for another record in it.
    Neighbour,
    /// The record's topic name is not one Kafka can have: its routing's fault.
    InvalidTopic,
    /// The record's timestamp lies outside its topic's window (a CreateTime topic's
    /// `message.timestamp.before.max.ms`/`after.max.ms`).
    Timestamp,
    /// Anything else (the broker or the network, a timeout, a fenced epoch): heals by sending
    /// again from the slot.
    Transient,
}

/// Where a record's timestamp came from, which decides whose fault a timestamp refusal is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stamp {
    /// The row's own (`outbox.timestamp_column`): a time outside the window is the row's.
    Row,
    /// The commit time, or not known (a failed delivery report carries no timestamp): a time
    /// outside the window is the topic's setting against a backlog or a clock — the
    /// deployment's.
    CommitOrUnknown,
}

/// What the relay does about a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send again from the slot: the session restarts (at once, or with back-off).
    Retry,
    /// The deployment's: what waits for it is held (never dead-lettered, never confirmed
    /// past), `/readyz` is red and `outbox_relay_kafka_blocked` names it, with the fix.
    Hold(BlockReason),
    /// Whose fault depends on the record's batch: the record's own only when it was alone in
    /// it (`sink::limits::TopicLimits::judge`).
    JudgeSize,
    /// The record's own: dead-lettered with this reason (and remembered, so that it is
    /// refused before it is sent again).
    OwnFault(Reason),
}

/// The codes that mean something other than [`KafkaFault::Transient`]: the one list.
pub const CODES: &[(C, KafkaFault)] = &[
    (
        C::TopicAuthorizationFailed,
        KafkaFault::Deployment(BlockReason::TopicAuthorization),
    ),
    (
        C::ClusterAuthorizationFailed,
        KafkaFault::Deployment(BlockReason::ClusterAuthorization),
    ),
    (
        C::TransactionalIdAuthorizationFailed,
        KafkaFault::Deployment(BlockReason::TransactionalIdAuthorization),
    ),
    (
        C::Authentication,
        KafkaFault::Deployment(BlockReason::Authentication),
    ),
    (
        C::SaslAuthenticationFailed,
        KafkaFault::Deployment(BlockReason::Authentication),
    ),
    (
        C::UnknownTopicOrPartition,
        KafkaFault::Deployment(BlockReason::UnknownTopic),
    ),
    (
        C::UnknownTopic,
        KafkaFault::Deployment(BlockReason::UnknownTopic),
    ),
    (C::MessageSizeTooLarge, KafkaFault::TooLarge),
    (C::InvalidMessageSize, KafkaFault::TooLarge),
    (C::MessageBatchTooLarge, KafkaFault::TooLarge),
    (C::InvalidRecord, KafkaFault::InvalidRecord),
    (C::InvalidDifferentRecord, KafkaFault::Neighbour),
    (C::InvalidTopic, KafkaFault::InvalidTopic),
    (C::InvalidTimestamp, KafkaFault::Timestamp),
];

impl KafkaFault {
    /// The fault an error means.
    pub fn of(error: &KafkaError) -> KafkaFault {
        error
            .rdkafka_error_code()
            .map_or(KafkaFault::Transient, KafkaFault::of_code)
    }

    /// The fault a code means: [`CODES`], or else transient.
    pub fn of_code(code: C) -> KafkaFault {
        CODES
            .iter()
            .find(|(c, _)| *c == code)
            .map_or(KafkaFault::Transient, |(_, fault)| *fault)
    }

    /// What the relay does about it, for a record whose timestamp came from `stamp`.
    pub fn verdict(self, stamp: Stamp) -> Verdict {
        match self {
            KafkaFault::Deployment(reason) => Verdict::Hold(reason),
            KafkaFault::TooLarge => Verdict::JudgeSize,
            KafkaFault::InvalidRecord => Verdict::OwnFault(Reason::Rejected),
            KafkaFault::Neighbour | KafkaFault::Transient => Verdict::Retry,
            KafkaFault::InvalidTopic => Verdict::OwnFault(Reason::InvalidTopic),
            KafkaFault::Timestamp => match stamp {
                Stamp::Row => Verdict::OwnFault(Reason::Timestamp),
                Stamp::CommitOrUnknown => Verdict::Hold(BlockReason::RecordTimestamp),
            },
        }
    }

    /// The deployment block the fault means where the record's timestamp is not known (a
    /// delivery report, a metadata read), if any.
    pub fn block(self) -> Option<BlockReason> {
        match self.verdict(Stamp::CommitOrUnknown) {
            Verdict::Hold(reason) => Some(reason),
            Verdict::Retry | Verdict::JudgeSize | Verdict::OwnFault(_) => None,
        }
    }

    /// Whether the fault may be the record's own: a refused record of this kind is not sent
    /// again as it is without a judgement (its size, its timestamp's origin).
    pub fn may_be_own(self) -> bool {
        match self.verdict(Stamp::Row) {
            Verdict::JudgeSize | Verdict::OwnFault(_) => true,
            Verdict::Retry | Verdict::Hold(_) => false,
        }
    }

    /// For the book: whose fault it is, and what the relay does.
    pub fn describe(self) -> (&'static str, &'static str) {
        match self {
            KafkaFault::Deployment(BlockReason::TopicAuthorization) => (
                "the deployment's",
                "records of that topic wait at the publisher's gate (at-least-once) or the session restarts with back-off (exactly-once); other topics go on",
            ),
            KafkaFault::Deployment(
                BlockReason::ClusterAuthorization | BlockReason::TransactionalIdAuthorization,
            ) => (
                "the deployment's",
                "the session restarts with back-off until it is granted",
            ),
            KafkaFault::Deployment(BlockReason::Authentication) => (
                "the deployment's",
                "librdkafka logs in again; records wait",
            ),
            KafkaFault::Deployment(BlockReason::UnknownTopic | BlockReason::TopicCreation) => (
                "the deployment's",
                "records of that topic wait until it exists; other topics go on",
            ),
            KafkaFault::Deployment(BlockReason::RecordTimestamp) | KafkaFault::Timestamp => (
                "the row's, when its timestamp is the row's own (`timestamp_column`); else the deployment's",
                "the row's own: dead-lettered (reason `timestamp`), stamped anew, its own time in a header; a commit time outside the window: the topic blocks `record_timestamp` and the session restarts with back-off",
            ),
            KafkaFault::TooLarge => (
                "the record's when it was alone in its batch; else the producer's",
                "alone: dead-lettered (reason `too_large`); in a batch: the limit is learned, the producer is made again with batches within it, and the records are sent again from the slot (a dead letter's batch too)",
            ),
            KafkaFault::InvalidRecord => (
                "the record's",
                "dead-lettered (reason `rejected`) and remembered by its content, so that it is refused before it is sent again",
            ),
            KafkaFault::Neighbour => (
                "another record's",
                "sent again from the slot; the invalid record of its batch is refused before it",
            ),
            KafkaFault::InvalidTopic => ("the record's", "dead-lettered (reason `invalid_topic`)"),
            KafkaFault::Transient => (
                "nobody's",
                "sent again from the slot: the session restarts",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_listed_code_is_classified_as_listed_and_any_other_is_transient() {
        for (code, fault) in CODES {
            assert_eq!(KafkaFault::of_code(*code), *fault, "{code:?}");
            assert_eq!(
                KafkaFault::of(&KafkaError::MessageProduction(*code)),
                *fault
            );
        }
        assert_eq!(
            KafkaFault::of_code(C::MessageTimedOut),
            KafkaFault::Transient
        );
        assert_eq!(KafkaFault::of(&KafkaError::Canceled), KafkaFault::Transient);
    }

    #[test]
    fn a_timestamp_outside_the_window_is_the_rows_only_when_it_is_the_rows_own() {
        assert_eq!(
            KafkaFault::Timestamp.verdict(Stamp::Row),
            Verdict::OwnFault(Reason::Timestamp)
        );
        assert_eq!(
            KafkaFault::Timestamp.verdict(Stamp::CommitOrUnknown),
            Verdict::Hold(BlockReason::RecordTimestamp)
        );
        assert_eq!(
            KafkaFault::Timestamp.block(),
            Some(BlockReason::RecordTimestamp)
        );
    }

    #[test]
    fn a_neighbour_and_a_deployment_fault_are_never_the_records_own() {
        assert!(!KafkaFault::Neighbour.may_be_own());
        assert!(!KafkaFault::Transient.may_be_own());
        assert!(!KafkaFault::Deployment(BlockReason::TopicAuthorization).may_be_own());
        assert!(KafkaFault::TooLarge.may_be_own());
        assert!(KafkaFault::InvalidRecord.may_be_own());
        assert!(KafkaFault::InvalidTopic.may_be_own());
    }

    #[test]
    fn deployment_errors_are_blocks_and_record_errors_are_not() {
        for (code, reason) in [
            (C::TopicAuthorizationFailed, "topic_authorization"),
            (C::ClusterAuthorizationFailed, "cluster_authorization"),
            (
                C::TransactionalIdAuthorizationFailed,
                "transactional_id_authorization",
            ),
            (C::SaslAuthenticationFailed, "authentication"),
            (C::Authentication, "authentication"),
            (C::UnknownTopicOrPartition, "unknown_topic"),
            (C::UnknownTopic, "unknown_topic"),
        ] {
            let error = KafkaError::MessageProduction(code);
            assert_eq!(
                KafkaFault::of(&error).block().map(BlockReason::name),
                Some(reason)
            );
        }
        for code in [
            C::MessageSizeTooLarge,
            C::InvalidTopic,
            C::MessageTimedOut,
            C::InvalidRecord,
        ] {
            assert_eq!(
                KafkaFault::of(&KafkaError::MessageProduction(code)).block(),
                None
            );
        }
    }
}
