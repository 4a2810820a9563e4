//! The session's two seams: where replication frames come from (and status updates go), and
//! where records go (and acknowledgements come from). Production wires the walsender
//! connection and the Kafka publisher; the unit tests wire in-memory fakes: a scripted WAL, a
//! sink that acknowledges late, out of order, or fails on a chosen record.

use crate::checkpoint::TxnSeq;
use crate::lsn::Lsn;
use crate::publisher::{PublishError, Publisher, Record};
use crate::walsender::{ReplicationError, ReplicationFrame, ReplicationStream};

/// A replication stream: frames in, status updates out.
// Only ever a generic bound (never `dyn`), so the futures' auto traits are those of the
// concrete type and `async fn` is fine here.
#[allow(async_fn_in_trait)]
pub trait FrameSource {
    /// The next frame. Must be cancel-safe: the session races it against other work.
    async fn next_frame(&mut self) -> Result<ReplicationFrame, ReplicationError>;
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
}

impl FrameSource for ReplicationStream {
    async fn next_frame(&mut self) -> Result<ReplicationFrame, ReplicationError> {
        ReplicationStream::next_frame(self).await
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
}
