//! The delivery contract: what the loop asks of the delivery mode, at the few points where
//! the modes differ. In: the loop's events (a record about to be handed over, an
//! acknowledgement, a PostgreSQL commit, a due timer, the way out). Out: whether a record is
//! sent now, and when an acknowledgement is durable, so that the ledger counts it.
//!
//! As in supabase/etl's destinations, an acknowledgement is `Durable` (the ledger counts it
//! now) or only `Accepted` (it counts once the contract hands it back from `settle`); the loop
//! asks and never looks at the mode. At-least-once: every acknowledgement is durable, and
//! every other point is nothing. Exactly-once: `exactly_once.rs`.

use tokio::time::Instant;

use super::exactly_once::{ExactlyOnce, Transactions};
use super::{Held, Reading, Settled};
use crate::lsn::Lsn;
use crate::relay::ledger::TxnSeq;
use crate::relay::seams::RecordSink;
use crate::serve::metrics::Metrics;
use crate::sink::progress::{Covered, Progress};
use crate::sink::publisher::PublishError;

pub(super) enum Contract {
    /// Kafka's acknowledgement is the end of the matter.
    AtLeastOnce,
    /// Records go into Kafka transactions; acknowledgements count once those commit.
    ExactlyOnce(Box<ExactlyOnce>),
}

/// What an acknowledgement is worth when it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ack {
    /// In Kafka for good: the ledger counts it now.
    Durable,
    /// Taken, not yet for good: `settle` hands it back once it is.
    Accepted,
}

impl Contract {
    /// Exactly-once when `transactions` says when Kafka transactions commit.
    pub(super) fn new(transactions: Option<Transactions>) -> Contract {
        match transactions {
            Some(limits) => Contract::ExactlyOnce(Box::new(ExactlyOnce::new(limits))),
            None => Contract::AtLeastOnce,
        }
    }

    fn exactly_once(&mut self) -> Option<&mut ExactlyOnce> {
        match self {
            Contract::ExactlyOnce(eos) => Some(eos),
            Contract::AtLeastOnce => None,
        }
    }

    /// What of the stream is already in Kafka, read at the start (exactly-once only: at-least-
    /// once has no progress record and is never given one).
    pub(super) fn skip_below(&mut self, progress: Option<Progress>) {
        if let Some(eos) = self.exactly_once() {
            eos.skip_below(progress);
        }
    }

    /// At BEGIN: how much of the transaction committing at `final_lsn` Kafka has already.
    pub(super) fn covered(&self, final_lsn: Lsn) -> Covered {
        match self {
            Contract::ExactlyOnce(eos) => eos.covered(final_lsn),
            Contract::AtLeastOnce => Covered::Nothing,
        }
    }

    /// A record about to be handed over: given back to be sent now, or kept (`None`) to be
    /// handed back by `settle`.
    pub(super) fn hold(&mut self, record: Held) -> Option<Held> {
        match self.exactly_once() {
            Some(eos) => eos.hold(record),
            None => Some(record),
        }
    }

    /// Right before a record goes to the sink.
    pub(super) fn begin(&mut self, sink: &mut impl RecordSink) -> Result<(), PublishError> {
        self.exactly_once().map_or(Ok(()), |eos| eos.begin(sink))
    }

    /// Right after the sink took a record.
    pub(super) fn sent(&mut self) {
        if let Some(eos) = self.exactly_once() {
            eos.sent();
        }
    }

    /// Kafka acknowledged record `seq`.
    pub(super) fn acknowledged(&mut self, seq: TxnSeq, dead_letter: bool) -> Ack {
        match self.exactly_once() {
            Some(eos) => {
                eos.acknowledged(seq, dead_letter);
                Ack::Accepted
            }
            None => Ack::Durable,
        }
    }

    /// Whether a record Kafka failed takes its companions with it: in a Kafka transaction it
    /// does (the transaction can never commit), so no dead letter can stand in for it there.
    pub(super) fn failure_dooms(&self) -> bool {
        matches!(self, Contract::ExactlyOnce(_))
    }

    /// A PostgreSQL transaction ended at `end`, all its records handed over.
    pub(super) fn postgres_committed(&mut self, end: Lsn) {
        if let Some(eos) = self.exactly_once() {
            eos.postgres_committed(end);
        }
    }

    /// When the loop must wake up for the contract: `(due, early)`, where `early` is polled
    /// only while no frame is waiting (then `nothing_to_read` is called).
    pub(super) fn wake_times(&self, reading: Reading) -> (Option<Instant>, Option<Instant>) {
        match self {
            Contract::ExactlyOnce(eos) => eos.commit_times(reading),
            Contract::AtLeastOnce => (None, None),
        }
    }

    /// The early wake-up came: no frame was waiting.
    pub(super) fn nothing_to_read(&mut self) {
        if let Some(eos) = self.exactly_once() {
            eos.nothing_to_read();
        }
    }

    /// At the top of every loop turn (`ending`: draining or stopping).
    pub(super) fn settle(
        &mut self,
        sink: &mut impl RecordSink,
        reading: Reading,
        ending: bool,
        metrics: &Metrics,
    ) -> Settled {
        match self.exactly_once() {
            Some(eos) => eos.settle(sink, reading, ending, metrics),
            None => Settled::default(),
        }
    }

    /// The outcome of background work the contract started; never, when none runs.
    pub(super) async fn outcome(&mut self) -> Result<(), PublishError> {
        match self.exactly_once() {
            Some(eos) => eos.commit_outcome().await,
            None => std::future::pending().await,
        }
    }

    /// That outcome arrived.
    pub(super) fn outcome_arrived(
        &mut self,
        outcome: Result<(), PublishError>,
        metrics: &Metrics,
    ) -> Result<(), PublishError> {
        self.exactly_once()
            .map_or(Ok(()), |eos| eos.commit_ended(outcome, metrics))
    }

    /// Nothing left for the contract to finish before the session may end.
    pub(super) fn is_settled(&self, reading: Reading) -> bool {
        match self {
            Contract::ExactlyOnce(eos) => eos.is_settled(reading),
            Contract::AtLeastOnce => true,
        }
    }

    /// On the session's way out, before the final status update.
    pub(super) async fn finish(&mut self, sink: &mut impl RecordSink, metrics: &Metrics) {
        if let Some(eos) = self.exactly_once() {
            eos.finish(sink, metrics).await;
        }
    }
}
