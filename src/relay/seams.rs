//! The session's seams: where replication frames come from (and status updates go), where
//! records go (and acknowledgements come from), and the catalog it asks about relations it
//! does not know. Production wires the walsender connection, the Kafka publisher and the
//! control connection; the unit tests wire in-memory fakes: a scripted WAL, a sink that
//! acknowledges late, out of order, or fails on a chosen record, a map of partitions.

use tokio::sync::{mpsc, oneshot};

use crate::lsn::Lsn;
use crate::mapping::Record;
use crate::postgres::control::{Control, ControlError};
use crate::relay::ledger::TxnSeq;
use crate::relay::sweeper::kept::{Kept, KeptRow, KeptRows};
use crate::sink::limits::SizeRefusal;
use crate::sink::progress::Progress;
use crate::sink::publisher::{Delivery, DeliveryFailure, PublishError, Publisher};
use crate::source::walsender::{ReplicationError, ReplicationFrame, ReplicationStream};

/// A replication stream: frames in, status updates out.
// Only ever a generic bound (never `dyn`), so the futures' auto traits are those of the
// concrete type and `async fn` is fine here.
#[allow(async_fn_in_trait)]
pub trait FrameSource {
    /// The next frame. Must be cancel-safe: the session races it against other work.
    async fn next_frame(&mut self) -> Result<ReplicationFrame, ReplicationError>;
    /// A frame already received, if a whole one is waiting: no I/O, no waiting. Lets the
    /// session take a run of buffered frames without a turn of its `select!` for each.
    fn buffered_frame(&mut self) -> Result<Option<ReplicationFrame>, ReplicationError>;
    /// A standby status update: the slot may confirm `flush`.
    async fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        reply: bool,
    ) -> Result<(), ReplicationError>;
    /// Ends the stream politely; errors no longer matter then.
    async fn close(&mut self);
}

/// What a record stands for, which decides what its acknowledgement counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    Event,
    /// Sent in place of an event that cannot be published.
    DeadLetter,
}

/// A broker: records in, `Delivery` reports out (on the channel handed over with the sink).
#[allow(async_fn_in_trait)]
pub trait RecordSink {
    /// Hands one record of transaction `seq` over; the outcome arrives later as a `Delivery`.
    async fn send(
        &mut self,
        record: &Record,
        seq: TxnSeq,
        event_id: &str,
        kind: RecordKind,
    ) -> Result<(), PublishError>;
    /// Set once the producer can no longer send anything (it must be recreated).
    fn fatal_error(&self) -> Option<String>;
    /// Judges a record Kafka refused as too large: its own fault, or its batch's
    /// (`sink::limits`).
    fn judge_size_refusal(&self, failure: &DeliveryFailure) -> SizeRefusal;
    /// Whether `topic`'s known timestamp window refuses a record stamped `timestamp_ms` now.
    fn refuses_timestamp(&self, topic: &str, timestamp_ms: Option<i64>) -> bool;
    /// The most a record of `topic` may hold (its `max.message.bytes` when known, the
    /// producer's `message.max.bytes`): what a dead letter is cut to.
    fn record_limit(&self, topic: &str) -> usize;
    /// `exactly_once`: opens a Kafka transaction; the records sent until `commit` belong to it.
    fn begin(&mut self) -> Result<(), PublishError>;
    /// `exactly_once`: commits the open transaction together with a progress record saying
    /// what of the stream is in Kafka once it commits (`at`). Runs in the
    /// background; the outcome arrives on the returned channel. Once it succeeded, the delivery
    /// report of each record of the transaction is on the delivery channel or on its way.
    fn commit(&mut self, at: Progress) -> CommitOutcome;
    /// `exactly_once`: aborts the open transaction (best effort, on the session's way out).
    async fn abort(&mut self);
    /// Adaptive batching: the record just sent was the only one in flight, so have it sent
    /// now rather than after the producer's linger.
    fn skip_linger(&mut self);
}

/// Where the outcome of a Kafka commit arrives.
pub type CommitOutcome = oneshot::Receiver<Result<(), PublishError>>;

/// The database's catalog, asked when the stream names a relation that does not bind by name:
/// a partition of an outbox, sent under its own name by a publication that does not publish
/// via the partition root.
#[allow(async_fn_in_trait)]
pub trait Catalog {
    /// The partition root `(schema, table)` of relation `relid` (itself when it is not a
    /// partition); `None` when no relation has that OID any more.
    async fn partition_root(
        &mut self,
        relid: u32,
    ) -> Result<Option<(String, String)>, ControlError>;
    /// Keeps outbox row `row` from the sweeper in `store` (`relay::sweeper::kept`), if it
    /// exists: the row is the only copy of an event its dead letter could not keep.
    async fn keep_row(&mut self, store: &KeptRows, row: &KeptRow) -> Result<Kept, ControlError>;
}

/// Everything a session talks to.
pub struct Ends<S, K, C> {
    pub source: S,
    pub sink: K,
    /// The sink's delivery reports.
    pub deliveries: mpsc::UnboundedReceiver<Delivery>,
    pub catalog: C,
}

impl Catalog for Control {
    async fn partition_root(
        &mut self,
        relid: u32,
    ) -> Result<Option<(String, String)>, ControlError> {
        Control::partition_root(self, relid).await
    }

    async fn keep_row(&mut self, store: &KeptRows, row: &KeptRow) -> Result<Kept, ControlError> {
        store.keep(self.client(), row).await
    }
}

impl FrameSource for ReplicationStream {
    async fn next_frame(&mut self) -> Result<ReplicationFrame, ReplicationError> {
        ReplicationStream::next_frame(self).await
    }

    fn buffered_frame(&mut self) -> Result<Option<ReplicationFrame>, ReplicationError> {
        ReplicationStream::buffered_frame(self)
    }

    async fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        reply: bool,
    ) -> Result<(), ReplicationError> {
        ReplicationStream::send_status(self, write, flush, reply).await
    }

    async fn close(&mut self) {
        ReplicationStream::close(self).await
    }
}

impl RecordSink for Publisher {
    async fn send(
        &mut self,
        record: &Record,
        seq: TxnSeq,
        event_id: &str,
        kind: RecordKind,
    ) -> Result<(), PublishError> {
        match kind {
            RecordKind::Event => Publisher::send(self, record, seq, event_id).await,
            RecordKind::DeadLetter => self.send_dead_letter(record, seq, event_id).await,
        }
    }

    fn fatal_error(&self) -> Option<String> {
        Publisher::fatal_error(self)
    }

    fn judge_size_refusal(&self, failure: &DeliveryFailure) -> SizeRefusal {
        Publisher::judge_size_refusal(self, failure)
    }

    fn refuses_timestamp(&self, topic: &str, timestamp_ms: Option<i64>) -> bool {
        self.blocked()
            .limits()
            .outside_window(topic, timestamp_ms, crate::clock::unix_ms)
    }

    fn record_limit(&self, topic: &str) -> usize {
        Publisher::record_limit(self, topic)
    }

    fn begin(&mut self) -> Result<(), PublishError> {
        self.begin_transaction()
    }

    fn commit(&mut self, at: Progress) -> CommitOutcome {
        self.commit_transaction(at)
    }

    async fn abort(&mut self) {
        self.abort_transaction().await
    }

    fn skip_linger(&mut self) {
        Publisher::skip_linger(self)
    }
}
