//! The simulated peers the real session talks to through its seams: a walsender (frames out,
//! status updates in) and a Kafka producer (records in, delivery reports out), both reading
//! and writing the shared [`World`].

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use tokio::sync::{mpsc, oneshot};

use super::timeline;
use super::world::{Pending, World, DLQ};
use super::Defect;
use crate::lsn::Lsn;
use crate::mapping::Record;
use crate::relay::ledger::TxnSeq;
use crate::relay::seams::{CommitOutcome, RecordKind, RecordSink};
use crate::relay::session::fakes::{
    self, begin, commit, insert, relation, text, Frames, Upstream, OUTBOX,
};
use crate::sink::limits::{RecordContent, SizeRefusal};
use crate::sink::progress::{Progress, Timelines};
use crate::sink::publisher::{Delivery, DeliveryFailure, PublishError, Rejection};
use crate::source::pgoutput::TupleValue;
use crate::source::walsender::{ReplicationError, ReplicationFrame};

/// The walsender's side of one replication connection.
pub(super) struct Walsender {
    tx: Frames,
    /// The next transaction to decode.
    next_txn: usize,
    /// Frames of the transaction being sent, not yet written to the connection.
    staged: VecDeque<ReplicationFrame>,
    /// pgoutput sends a relation before its first change in each connection
    /// (`maybe_send_schema`, pgoutput.c).
    relation_sent: bool,
    /// `sentPtr`: what has been decoded (and sent).
    sent: Lsn,
    /// The server itself is gone (a failover, `timeline.rs`): nothing more reaches it.
    gone: Cell<bool>,
}

impl Walsender {
    /// START_REPLICATION from the slot: the server starts at its `confirmed_flush_lsn` and
    /// skips every transaction whose commit starts before it (`SnapBuildXactNeedsSkip`,
    /// replication/logical/snapbuild.c).
    pub fn start(world: &World, tx: Frames) -> Walsender {
        let next_txn = world
            .workload
            .txns
            .iter()
            .position(|t| t.final_lsn >= world.slot)
            .unwrap_or(world.workload.txns.len());
        Walsender {
            tx,
            next_txn,
            staged: VecDeque::new(),
            relation_sent: false,
            sent: world.slot,
            gone: Cell::new(false),
        }
    }

    /// Writes up to `n` more frames; `false` when the workload is all sent.
    pub fn send(&mut self, world: &World, n: usize) -> bool {
        for _ in 0..n {
            if self.staged.is_empty() && !self.stage(world) {
                return false;
            }
            if let Some(frame) = self.staged.pop_front() {
                let _ = self.tx.send(Ok(frame));
            }
        }
        true
    }

    pub fn keepalive(&self, reply_requested: bool) {
        let _ = self.tx.send(Ok(ReplicationFrame::Keepalive {
            wal_end: self.sent,
            reply_requested,
        }));
    }

    /// The server is gone (the primary of a failover): the connection breaks, and no status
    /// update of this session reaches any server any more.
    pub fn server_gone(&self) {
        self.gone.set(true);
        self.drop_connection();
    }

    /// The connection breaks.
    pub fn drop_connection(&self) {
        let _ = self.tx.send(Err(ReplicationError::Closed));
    }

    pub fn is_done(&self, world: &World) -> bool {
        self.staged.is_empty() && self.next_txn >= world.workload.txns.len()
    }

    /// Decodes the next committed transaction (whole: `streaming` is off, so pgoutput sends
    /// it at its commit, `ReorderBufferCommit`, reorderbuffer.c) into frames.
    fn stage(&mut self, world: &World) -> bool {
        let txns = &world.workload.txns;
        let Some(txn) = txns.get(self.next_txn) else {
            self.sent = self.sent.max(world.workload.wal_end);
            return false;
        };
        // A standby decodes only what it replayed: nothing past a switch not yet reached
        // (`timeline.rs`).
        if !world.server.may_decode(txn.final_lsn) {
            return false;
        }
        self.next_txn += 1;
        self.sent = self.sent.max(if self.next_txn == txns.len() {
            world.workload.wal_end
        } else {
            txn.after
        });
        self.staged
            .push_back(begin(txn.final_lsn, self.next_txn as u32));
        if txn.ddl {
            self.relation_sent = false;
        }
        let header_column = world.workload.header_column;
        let columns = txn.extra_columns + usize::from(header_column);
        for &e in &txn.events {
            if !self.relation_sent {
                self.staged
                    .push_back(relation(OUTBOX, "public", "outbox", columns));
                self.relation_sent = true;
            }
            let ev = &world.workload.events[e];
            let mut values = vec![
                text(&ev.id),
                text(ev.aggregate_type),
                text(&ev.aggregate_id),
                text("Happened"),
                text(&ev.payload),
            ];
            if header_column {
                values.push(ev.header.as_deref().map_or(TupleValue::Null, text));
            }
            values.extend((0..txn.extra_columns).map(|_| text("x")));
            self.staged.push_back(insert(OUTBOX, values));
        }
        self.staged.push_back(commit(txn.final_lsn, txn.end_lsn));
        true
    }
}

/// The session's end of the replication connection.
pub(super) type SimSource = fakes::ChannelSource<Connection>;

/// What the walsender does with the session's status updates.
pub(super) struct Connection {
    pub world: Rc<RefCell<World>>,
    pub walsender: Rc<RefCell<Walsender>>,
}

impl Upstream for Connection {
    fn status(&mut self, flush: Lsn, reply: bool) -> Result<(), ReplicationError> {
        if self.walsender.borrow().gone.get() {
            return Err(ReplicationError::Closed);
        }
        let mut world = self.world.borrow_mut();
        if std::mem::take(&mut world.status_fails) {
            return Err(ReplicationError::Closed);
        }
        world.confirm(flush);
        drop(world);
        // The walsender answers a status update that asks for a reply with a keepalive
        // (`ProcessStandbyReplyMessage` → `WalSndKeepalive`, walsender.c).
        if reply {
            self.walsender.borrow().keepalive(false);
        }
        Ok(())
    }
}

/// The session's producer over the world's partitions: idempotent (at-least-once), or
/// transactional (exactly-once, when the world has a coordinator), as the `Publisher` is.
pub(super) struct SimSink {
    pub world: Rc<RefCell<World>>,
    pub reports: mpsc::UnboundedSender<Delivery>,
    pub producer: u32,
    /// `batch.size` this producer was made with.
    pub batch_size: usize,
    /// How its progress values get their timeline (`ProgressRecord::timelines`).
    pub timelines: Timelines,
}

impl RecordSink for SimSink {
    async fn send(
        &mut self,
        record: &Record,
        seq: TxnSeq,
        event_id: &str,
        kind: RecordKind,
    ) -> Result<(), PublishError> {
        let mut guard = self.world.borrow_mut();
        let world = &mut *guard;
        let rejected = |error| {
            Err(PublishError::Rejected(Box::new(Rejection::new(
                record.topic.clone(),
                event_id.to_string(),
                KafkaError::MessageProduction(error),
            ))))
        };
        let mut txn = None;
        if let Some(coordinator) = &mut world.eos {
            // After a fatal error librdkafka takes nothing more (`rd_kafka_producev`,
            // rdkafka_msg.c, answers `RD_KAFKA_RESP_ERR__FATAL`).
            if !coordinator.is_current(self.producer) {
                return rejected(RDKafkaErrorCode::Fatal);
            }
            let producer = self.producer;
            let Some(open) = coordinator.open.as_mut().filter(|t| t.producer == producer) else {
                world.violation("a record sent with no Kafka transaction open".into());
                return rejected(RDKafkaErrorCode::State);
            };
            // librdkafka takes no record while a commit runs (`rd_kafka_txn_may_enq_msg`,
            // rdkafka_txnmgr.c): the session holds them for the next transaction.
            if open.commit.is_some() {
                world.violation("a record sent while the Kafka commit runs".into());
                return rejected(RDKafkaErrorCode::State);
            }
            txn = Some(open.id);
        }
        // A record its topic refused alone before is refused before it is sent
        // (`Publisher::send_with_opaque`, sink/publisher/mod.rs), in both modes: at-least-once
        // so that it does not take a batch of healthy neighbours down with it again,
        // exactly-once so that it is dead-lettered inside the transaction.
        if kind == RecordKind::Event {
            if let Some(refusal) = world
                .limits
                .refused(&record.topic, RecordContent::of_record(record))
            {
                return rejected(refusal);
            }
            // The defect: the memory keyed by `(topic, key)`, which the key of another event
            // of the aggregate matches under `key_column = "aggregateid"`.
            let by_key = (record.topic.clone(), record.key.clone());
            if world.defect == Defect::RefusalByKey && world.refused_keys.contains(&by_key) {
                return rejected(RDKafkaErrorCode::MessageSizeTooLarge);
            }
        }
        let pending = Pending {
            record: record.clone(),
            seq,
            kind,
            producer: self.producer,
            reports: self.reports.clone(),
            txn,
            sent: 0,
        };
        if let Err(refusal) = world.route(pending) {
            return rejected(refusal);
        }
        if let Some(open) = txn.and_then(|id| world.eos.as_mut().and_then(|c| c.txn(id))) {
            open.sent += 1;
        }
        Ok(())
    }

    fn fatal_error(&self) -> Option<String> {
        let world = self.world.borrow();
        let coordinator = world.eos.as_ref()?;
        (!coordinator.is_current(self.producer))
            .then(|| "fenced by a newer producer with the same transactional.id".into())
    }

    fn judge_size_refusal(&self, failure: &DeliveryFailure) -> SizeRefusal {
        use rdkafka::message::Message;
        let mut world = self.world.borrow_mut();
        let judged =
            world
                .limits
                .judge(failure.message.topic(), failure.content(), self.batch_size);
        if world.defect == Defect::DeadLetterBatchStops && failure.message.topic() == DLQ {
            return SizeRefusal::Record { limit: 0 };
        }
        if let SizeRefusal::Record { .. } = judged {
            let key = bytes::Bytes::copy_from_slice(failure.message.key().unwrap_or_default());
            world
                .refused_keys
                .insert((failure.message.topic().to_string(), key));
        }
        judged
    }

    /// What the `Publisher` knows: the topic's limit when read, within the producer's
    /// default `message.max.bytes`. (The relay reads the dead-letter topic's limit when a
    /// session starts; the world does not model that read: its small dead-letter topic is one
    /// the relay may not describe.)
    fn record_limit(&self, topic: &str) -> usize {
        let max = crate::sink::limits::DEFAULT_MESSAGE_MAX_BYTES;
        let world = self.world.borrow();
        world.limits.record_limit(topic).map_or(max, |l| l.min(max))
    }

    /// Not modelled: the simulated topics have no timestamp window.
    fn refuses_timestamp(&self, _topic: &str, _timestamp_ms: Option<i64>) -> bool {
        false
    }

    /// A local state change in librdkafka (`rd_kafka_begin_transaction`, rdkafka_txnmgr.c),
    /// refused once the producer is fenced (a fatal error).
    fn begin(&mut self) -> Result<(), PublishError> {
        let mut world = self.world.borrow_mut();
        let Some(coordinator) = &mut world.eos else {
            return Err(PublishError::Transaction {
                what: "begin (not modelled: at-least-once)",
                error: KafkaError::Canceled,
            });
        };
        if !coordinator.is_current(self.producer) {
            return Err(PublishError::Transaction {
                what: "begin",
                error: KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
            });
        }
        if coordinator.open.is_some() {
            world.violation("a Kafka transaction begun while one is open".into());
            return Err(PublishError::Transaction {
                what: "begin",
                error: KafkaError::MessageProduction(RDKafkaErrorCode::State),
            });
        }
        coordinator.begin(self.producer);
        Ok(())
    }

    /// The coordinator answers in a later step of the driver, once every record of the
    /// transaction was answered (`World::answer_commit`).
    fn commit(&mut self, at: Progress) -> CommitOutcome {
        let (tx, rx) = oneshot::channel();
        let mut world = self.world.borrow_mut();
        let producer = self.producer;
        match world
            .eos
            .as_mut()
            .and_then(|c| c.open.as_mut())
            .filter(|t| t.producer == producer && t.commit.is_none())
        {
            Some(open) => open.commit = Some((timeline::label(&self.timelines, at), tx)),
            None => world.violation(format!("a commit at {at} with no Kafka transaction open")),
        }
        rx
    }

    /// `abort_transaction`: the open transaction's records are dropped, written or not
    /// (librdkafka purges what it still queues, `rd_kafka_txn_op_begin_abort`, rdkafka_txnmgr.c).
    async fn abort(&mut self) {
        let mut world = self.world.borrow_mut();
        let producer = self.producer;
        let Some(coordinator) = &mut world.eos else {
            return;
        };
        let Some(id) = coordinator
            .open
            .as_ref()
            .filter(|t| t.producer == producer)
            .map(|t| t.id)
        else {
            return;
        };
        coordinator.open = None;
        for queue in world.queues.values_mut() {
            queue.retain(|p| p.txn != Some(id));
        }
        for held in world.gate.values_mut() {
            held.retain(|p| p.txn != Some(id));
        }
        world.note("the session aborts its Kafka transaction".into());
    }

    fn skip_linger(&mut self) {}
}
