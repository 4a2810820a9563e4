//! Exactly-once (`kafka.delivery = "exactly_once"`): the machinery behind the delivery
//! contract. In: the loop's calls at the points of `contract.rs`. Out: Kafka transactions begun
//! and committed on the sink, and acknowledgements handed back once they are durable.
//!
//! Records go into Kafka transactions that end at PostgreSQL transaction boundaries; a Kafka
//! transaction is committed (with the progress record: the end LSN of its last PostgreSQL
//! transaction) at such a boundary once it is old or big enough, or sooner (but at least
//! `min_age` old) when the stream has nothing more to read at the moment. A PostgreSQL
//! transaction that would keep one Kafka transaction open longer than `split_after` (a third
//! of `transaction.timeout.ms`, after which the broker would abort it) is split: the Kafka
//! transaction commits in its middle, with a progress record that says how many of its records
//! are in (`Progress::partial`). Records that come while a commit runs (librdkafka takes none
//! then) are held and sent in the next Kafka transaction, so reading never pauses for a commit.
//! An acknowledgement then is not yet a confirmation: the acknowledged records are kept aside
//! and handed to the ledger only once the Kafka commit succeeded (and every record's report
//! arrived), so the ledger confirms exactly what Kafka committed. A failed commit ends the
//! session; nothing of it was confirmed. PostgreSQL transactions committing below the progress
//! value read at the start (`skip_below`) are already in Kafka: they are skipped, and confirmed
//! like empty ones; of a split one, the records already in Kafka are skipped.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, info, warn};

use super::{Held, Reading, Settled};
use crate::lsn::Lsn;
use crate::relay::ledger::TxnSeq;
use crate::relay::seams::{CommitOutcome, RecordSink};
use crate::serve::metrics::Metrics;
use crate::sink::progress::{Covered, Progress};
use crate::sink::publisher::PublishError;

/// When a Kafka transaction is committed (at a PostgreSQL transaction boundary).
#[derive(Debug, Clone, Copy)]
pub struct Transactions {
    pub max_age: Duration,
    /// Committed sooner, once this old, when no frame is waiting.
    pub min_age: Duration,
    pub max_records: usize,
    /// A Kafka transaction this old commits even inside a PostgreSQL transaction.
    pub split_after: Duration,
}

/// The Kafka transaction.
enum KafkaTxn {
    Idle,
    Open {
        started: Instant,
        records: usize,
        /// End LSN of the last whole PostgreSQL transaction in it (`None`: none yet).
        end: Option<Lsn>,
    },
    /// The commit runs; records read meanwhile are held for the next transaction.
    Committing {
        started: std::time::Instant,
        records: usize,
        outcome: CommitOutcome,
    },
    /// Committed; waiting for the last delivery reports before confirming.
    Committed {
        records: usize,
    },
}

/// The state of exactly-once delivery within one session.
pub(super) struct ExactlyOnce {
    limits: Transactions,
    kafka: KafkaTxn,
    /// Successful deliveries of the Kafka transaction, `(seq, dead_letter)`: confirmations
    /// once it commits.
    acked: Vec<(TxnSeq, bool)>,
    /// What of the stream is already in Kafka.
    skip_below: Option<Progress>,
    /// Records read while a Kafka commit ran, for the next Kafka transaction.
    held: Vec<Held>,
    /// End LSN of the last PostgreSQL transaction whose records are all sent or held: the
    /// next Kafka transaction's progress value.
    held_end: Option<Lsn>,
    /// No frame was waiting and the open Kafka transaction is `min_age` old: commit it.
    idle_commit: bool,
}

/// How long a session's way out waits for a running Kafka commit before aborting it.
const COMMIT_WAIT_ON_EXIT: Duration = Duration::from_secs(5);

impl ExactlyOnce {
    pub(super) fn new(limits: Transactions) -> ExactlyOnce {
        ExactlyOnce {
            limits,
            kafka: KafkaTxn::Idle,
            acked: Vec::new(),
            skip_below: None,
            held: Vec::new(),
            held_end: None,
            idle_commit: false,
        }
    }

    /// PostgreSQL transactions committing below `progress` (what Kafka holds) are not
    /// published again.
    pub(super) fn skip_below(&mut self, progress: Option<Progress>) {
        self.skip_below = progress;
    }

    pub(super) fn covered(&self, final_lsn: Lsn) -> Covered {
        self.skip_below
            .map_or(Covered::Nothing, |p| p.covers(final_lsn))
    }

    /// Keeps a record read while a commit runs (librdkafka takes none then) for the next
    /// Kafka transaction; any other is given back to be sent now.
    pub(super) fn hold(&mut self, record: Held) -> Option<Held> {
        if matches!(
            self.kafka,
            KafkaTxn::Committing { .. } | KafkaTxn::Committed { .. }
        ) {
            self.held.push(record);
            return None;
        }
        Some(record)
    }

    /// Opens a Kafka transaction for the next record unless one is open. After a commit it
    /// starts with the held records, and so with the progress value of the last whole
    /// PostgreSQL transaction among them.
    pub(super) fn begin(&mut self, sink: &mut impl RecordSink) -> Result<(), PublishError> {
        if !matches!(self.kafka, KafkaTxn::Idle) {
            return Ok(());
        }
        sink.begin()?;
        self.kafka = KafkaTxn::Open {
            started: Instant::now(),
            records: 0,
            end: self.held_end.take(),
        };
        Ok(())
    }

    /// A record went into the open Kafka transaction.
    pub(super) fn sent(&mut self) {
        if let KafkaTxn::Open { records, .. } = &mut self.kafka {
            *records += 1;
        }
    }

    /// Kafka has the record, in a transaction that has yet to commit.
    pub(super) fn acknowledged(&mut self, seq: TxnSeq, dead_letter: bool) {
        self.acked.push((seq, dead_letter));
    }

    /// A PostgreSQL transaction ended at `end` with all its records sent or held.
    pub(super) fn postgres_committed(&mut self, end: Lsn) {
        match &mut self.kafka {
            KafkaTxn::Open { end: last, .. } => *last = Some(end),
            // Its records (if any) are held: the next Kafka transaction ends with it.
            KafkaTxn::Committing { .. } | KafkaTxn::Committed { .. } if !self.held.is_empty() => {
                self.held_end = Some(end)
            }
            _ => {}
        }
    }

    /// When the open Kafka transaction is to be committed by the timer (`max_age` old), and
    /// when early if no frame is waiting (`min_age` old). `None` while it may not commit,
    /// and while a PostgreSQL transaction is being read (its commit comes first).
    pub(super) fn commit_times(&self, reading: Reading) -> (Option<Instant>, Option<Instant>) {
        let KafkaTxn::Open { started, .. } = self.kafka else {
            return (None, None);
        };
        if let Reading::Inside(_) = reading {
            return (Some(started + self.limits.split_after), None);
        }
        if reading != Reading::Between || self.commit_end(reading).is_none() {
            return (None, None);
        }
        (
            Some(started + self.limits.max_age),
            Some(started + self.limits.min_age),
        )
    }

    /// No frame is waiting: a Kafka transaction `min_age` old may commit.
    pub(super) fn nothing_to_read(&mut self) {
        self.idle_commit = true;
    }

    /// Starts a due commit (any at a boundary when the session is `ending`); once a commit
    /// succeeded and every report of it arrived, hands its acknowledgements back as durable,
    /// with the records held meanwhile.
    pub(super) fn settle(
        &mut self,
        sink: &mut impl RecordSink,
        reading: Reading,
        ending: bool,
        metrics: &Metrics,
    ) -> Settled {
        let idle = std::mem::take(&mut self.idle_commit);
        match self.kafka {
            KafkaTxn::Open {
                started, records, ..
            } => {
                if let Some(at) = self.due_commit(reading, ending, idle, started, records) {
                    debug!(records, at = %at, "committing the kafka transaction");
                    self.kafka = KafkaTxn::Committing {
                        started: std::time::Instant::now(),
                        records,
                        outcome: sink.commit(at),
                    };
                }
                Settled::default()
            }
            KafkaTxn::Committed { records } if self.acked.len() >= records => {
                self.kafka = KafkaTxn::Idle;
                metrics
                    .kafka_transaction_records
                    .fetch_add(records as u64, Relaxed);
                Settled {
                    durable: std::mem::take(&mut self.acked),
                    held: std::mem::take(&mut self.held),
                }
            }
            _ => Settled::default(),
        }
    }

    /// The progress value the open Kafka transaction commits with now, if it is due: at a
    /// PostgreSQL boundary once old or big enough (or the session ends), inside a PostgreSQL
    /// transaction once `split_after` old.
    fn due_commit(
        &self,
        reading: Reading,
        ending: bool,
        idle: bool,
        started: Instant,
        records: usize,
    ) -> Option<Progress> {
        let limits = &self.limits;
        let age = started.elapsed();
        match (self.commit_end(reading), reading) {
            (Some(end), _) => {
                let between = reading == Reading::Between;
                let due = ending
                    || records >= limits.max_records
                    || (between && (age >= limits.max_age || (idle && age >= limits.min_age)));
                due.then_some(Progress::whole(end))
            }
            (None, Reading::Inside(at)) if age >= limits.split_after => Some(at),
            (None, _) => None,
        }
    }

    /// The end LSN the open Kafka transaction may commit with now: it holds whole
    /// PostgreSQL transactions only (the open one, if any, sent nothing yet).
    fn commit_end(&self, reading: Reading) -> Option<Lsn> {
        match (&self.kafka, reading) {
            (_, Reading::Inside(_)) => None,
            (KafkaTxn::Open { end, .. }, _) => *end,
            _ => None,
        }
    }

    /// The outcome of the running Kafka commit; never, when none runs.
    pub(super) async fn commit_outcome(&mut self) -> Result<(), PublishError> {
        match &mut self.kafka {
            KafkaTxn::Committing { outcome, .. } => match outcome.await {
                Ok(result) => result,
                Err(_) => Err(PublishError::Transaction {
                    what: "commit (the committing task ended)",
                    error: rdkafka::error::KafkaError::Canceled,
                }),
            },
            _ => std::future::pending().await,
        }
    }

    pub(super) fn commit_ended(
        &mut self,
        outcome: Result<(), PublishError>,
        metrics: &Metrics,
    ) -> Result<(), PublishError> {
        let KafkaTxn::Committing {
            started, records, ..
        } = self.kafka
        else {
            return Ok(());
        };
        match outcome {
            Ok(()) => {
                metrics.kafka_transactions_committed.fetch_add(1, Relaxed);
                metrics.kafka_commit_latency.observe(started.elapsed());
                self.kafka = KafkaTxn::Committed { records };
                Ok(())
            }
            Err(e) => {
                // Still open on the broker: `finish` aborts it on the way out, so that
                // read_committed consumers need not wait for transaction.timeout.ms (and the
                // next producer need not abort it first).
                self.kafka = KafkaTxn::Open {
                    started: Instant::now(),
                    records,
                    end: None,
                };
                self.acked.clear();
                self.held.clear();
                warn!(error = %e, records,
                    "the kafka transaction did not commit; nothing of it is confirmed, the session restarts from the slot and the progress record");
                Err(e)
            }
        }
    }

    /// No Kafka transaction left to commit or confirm (one that holds part of the open
    /// PostgreSQL transaction counts as done: when stopping it is dropped, it can never
    /// commit).
    pub(super) fn is_settled(&self, reading: Reading) -> bool {
        match self.kafka {
            KafkaTxn::Idle => true,
            KafkaTxn::Open { .. } => self.commit_end(reading).is_none(),
            KafkaTxn::Committing { .. } | KafkaTxn::Committed { .. } => false,
        }
    }

    /// On the session's way out: a Kafka transaction that will never commit (an error, the
    /// drain deadline) is aborted, so that read_committed consumers of its partitions need
    /// not wait until the broker ends it.
    pub(super) async fn finish(&mut self, sink: &mut impl RecordSink, metrics: &Metrics) {
        self.settle_running_commit().await;
        if let KafkaTxn::Open { records, .. } = self.kafka {
            info!(records, "aborting the open kafka transaction");
            sink.abort().await;
            metrics.kafka_transactions_aborted.fetch_add(1, Relaxed);
            self.kafka = KafkaTxn::Idle;
        }
    }

    /// Ending while a Kafka commit runs (an error elsewhere): waits for its outcome, bounded,
    /// and treats a commit that failed or did not end in time as open, so that `finish`
    /// aborts it; read_committed consumers would otherwise wait `transaction.timeout.ms`.
    async fn settle_running_commit(&mut self) {
        let KafkaTxn::Committing { records, .. } = self.kafka else {
            return;
        };
        let outcome = tokio::time::timeout(COMMIT_WAIT_ON_EXIT, self.commit_outcome()).await;
        self.kafka = match outcome {
            Ok(Ok(())) => KafkaTxn::Committed { records },
            _ => KafkaTxn::Open {
                started: Instant::now(),
                records,
                end: None,
            },
        };
    }
}
