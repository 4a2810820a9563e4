//! Kafka's transactions, as the exactly-once simulation models them: the transaction
//! coordinator of the relay's `transactional.id` (its producer epoch, the one open transaction,
//! its commit) and the progress values it committed. Plain data: `world.rs` drives it as the
//! brokers answer.
//!
//! Modelled on Kafka's protocol (KIP-98) and librdkafka 2.12's transaction manager:
//! - Records of an open transaction are written to their partitions but invisible to a
//!   read_committed reader until the commit marker; an abort (or a fence) drops them all.
//! - `InitProducerId` by a new producer of the same id bumps the epoch: the older producer is
//!   fenced (its requests fail with PRODUCER_FENCED / INVALID_PRODUCER_EPOCH, fatal for it:
//!   `rd_kafka_txn_handle_EndTxn`, rdkafka_txnmgr.c) and its open transaction is aborted.
//! - A record of the transaction that fails makes the transaction abortable: any permanent
//!   produce failure of a transactional producer raises an abortable error
//!   (`rd_kafka_handle_Produce_error` → `rd_kafka_txn_set_abortable_error`, rdkafka_request.c),
//!   and `commit_transaction` fails with it.
//! - `commit_transaction` first flushes every outstanding record (its phase 1,
//!   `rd_kafka_commit_transaction`, rdkafka_txnmgr.c; the publisher also waits for them,
//!   `commit` in sink/publisher/mod.rs), then sends EndTxn. An EndTxn that times out is
//!   retriable (`RD_KAFKA_RESP_ERR__TIMED_OUT` in `rd_kafka_txn_handle_EndTxn`): the
//!   coordinator may have written the commit all the same, only its answer was lost.

use rdkafka::error::RDKafkaErrorCode;
use tokio::sync::oneshot;

use crate::mapping::Record;
use crate::relay::seams::RecordKind;
use crate::sink::progress::{Progress, Stored};
use crate::sink::publisher::PublishError;

/// A record the brokers wrote into an open transaction.
pub(super) struct Written {
    pub record: Record,
    pub kind: RecordKind,
    pub producer: u32,
    pub partition: i32,
}

/// The one open transaction of the relay's transactional id.
pub(super) struct KafkaTxn {
    pub id: u64,
    /// The session (producer) that began it.
    pub producer: u32,
    /// Records handed to the producer in it, and how many of them the brokers answered.
    pub sent: usize,
    pub answered: usize,
    /// Written, visible once it commits.
    pub written: Vec<Written>,
    /// A record of it failed: the abortable error its commit fails with.
    pub doomed: Option<RDKafkaErrorCode>,
    /// The commit asked for: its progress value (with its timeline) and where its outcome goes.
    pub commit: Option<(Stored, oneshot::Sender<Result<(), PublishError>>)>,
}

impl KafkaTxn {
    /// Every record of it answered: librdkafka's flush is over, EndTxn goes out.
    pub fn flushed(&self) -> bool {
        self.answered >= self.sent
    }
}

pub(super) struct Coordinator {
    /// The producer epoch: the session whose producer last initialised the id.
    pub epoch: u32,
    /// Another relay initialised the id while this session ran: the session's producer is
    /// the zombie, fenced.
    pub fenced: bool,
    pub open: Option<KafkaTxn>,
    /// A commit of a producer that is gone (or a zombie): its EndTxn is on its way, to be
    /// answered when the next producer initialises the id.
    pub zombie: Option<(Stored, Vec<Written>)>,
    next_id: u64,
    /// The progress values committed, in commit order: the progress topic's partition as a
    /// read_committed reader sees it.
    pub committed: Vec<Stored>,
}

impl Coordinator {
    pub fn new() -> Coordinator {
        Coordinator {
            epoch: 0,
            fenced: false,
            open: None,
            zombie: None,
            next_id: 0,
            committed: Vec::new(),
        }
    }

    /// `begin_transaction` by `producer`.
    pub fn begin(&mut self, producer: u32) {
        self.next_id += 1;
        self.open = Some(KafkaTxn {
            id: self.next_id,
            producer,
            sent: 0,
            answered: 0,
            written: Vec::new(),
            doomed: None,
            commit: None,
        });
    }

    /// The open transaction, if `txn` is it (records of an aborted or committed one are
    /// answered too, into nothing).
    pub fn txn(&mut self, txn: u64) -> Option<&mut KafkaTxn> {
        self.open.as_mut().filter(|t| t.id == txn)
    }

    /// Whether `producer` may still write: the newest epoch, not fenced by a zombie fault.
    pub fn is_current(&self, producer: u32) -> bool {
        producer == self.epoch && !self.fenced
    }
}

/// Progress values in the order they may follow each other: a split transaction's partial
/// values (at its commit LSN) come before the whole value at its end LSN.
pub(super) fn progress_order(p: &Progress) -> (u64, u64) {
    (p.lsn.0, p.changes.unwrap_or(u64::MAX))
}
