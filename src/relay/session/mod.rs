//! One session: frames from a [`FrameSource`] are decoded, mapped and handed to a
//! [`RecordSink`]; acknowledgements feed the ledger; the ledger's position is confirmed back to
//! the source. No I/O of its own: both ends are seams, so every rule here is unit-tested with
//! fakes (`tests.rs`). `rows.rs` turns the WAL's messages into ledger entries and records.
//!
//! The loop, by priority: shutdown → acknowledgements → a Kafka commit's outcome → a due
//! confirmation → the status timer → a due Kafka commit → the next frame (only while in-flight
//! work is under its caps) → an early Kafka commit when no frame is waiting. On shutdown the
//! session stops reading (after finishing a half-read transaction), waits for every
//! acknowledgement up to `shutdown_timeout`, confirms the last fully acknowledged commit and
//! closes.
//!
//! Exactly-once (`Settings::transactions`): records go into Kafka transactions that end at
//! PostgreSQL transaction boundaries; a Kafka transaction is committed (with the progress
//! record: the end LSN of its last PostgreSQL transaction) at such a boundary once it is old or
//! big enough, or sooner (but at least `min_age` old) when the stream has nothing more to read
//! at the moment. A PostgreSQL transaction that would keep one Kafka transaction open longer
//! than `split_after` (a third of `transaction.timeout.ms`, after which the broker would abort
//! it) is split: the Kafka transaction commits in its middle, with a progress record that says
//! how many of its records are in (`Progress::partial`). Records that come while a commit runs (librdkafka takes
//! none then) are held and sent in the next Kafka transaction, so reading never pauses for a
//! commit. An acknowledgement then is not yet a confirmation: the acknowledged records are kept
//! aside and fed to the ledger only once the Kafka commit succeeded (and every record's report
//! arrived), so the ledger confirms exactly what Kafka committed. A failed commit ends the
//! session; nothing of it was confirmed. PostgreSQL transactions committing below the progress
//! value read at the start (`skip_below`) are already in Kafka: they are skipped, and confirmed
//! like empty ones; of a split one, the records already in Kafka are skipped.

mod rows;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{Config, DeadLetterPolicy, Delivery as DeliveryMode};
use crate::lsn::Lsn;
use crate::mapping::{BoundTable, OutboxMapping, Record};
use crate::relay::ledger::{Ledger, TxnSeq};
use crate::relay::seams::{Catalog, CommitOutcome, Ends, FrameSource, RecordKind, RecordSink};
use crate::relay::{now_ms, RelayError};
use crate::serve::metrics::{Metrics, RelayState};
use crate::sink::dead_letter::{self, Reason};
use crate::sink::progress::Progress;
use crate::sink::publisher::{self, Delivery, DeliveryFailure, PublishError};
use crate::sink::window::InFlight;
use crate::source::pgoutput::{self, Relation};
use crate::source::walsender::ReplicationFrame;

/// What the session needs from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub max_in_flight_messages: usize,
    pub max_in_flight_bytes: usize,
    pub dead_letter_policy: DeadLetterPolicy,
    pub dead_letter_topic: String,
    pub shutdown_timeout: Duration,
    /// Status updates (asking for a reply) at least this often.
    pub status_interval: Duration,
    /// How long a newly confirmable position waits for company before it is reported.
    pub confirm_delay: Duration,
    /// The publication streamed, for the fixes an error suggests.
    pub publication: String,
    /// `Some` in `kafka.delivery = "exactly_once"`: when Kafka transactions are committed.
    pub transactions: Option<Transactions>,
    /// `kafka.batching = "adaptive"` (at-least-once): a record sent while no other is in
    /// flight skips the producer's linger, so that a trickle is not delayed by it.
    pub adaptive: bool,
}

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

impl Settings {
    pub fn from_config(config: &Config, status_interval: Duration) -> Settings {
        Settings {
            max_in_flight_messages: config.kafka.max_in_flight_messages,
            max_in_flight_bytes: config.kafka.max_in_flight_bytes,
            dead_letter_policy: config.dead_letter.policy,
            dead_letter_topic: config.dead_letter.topic.clone(),
            shutdown_timeout: Duration::from_millis(config.relay.shutdown_timeout_ms),
            status_interval,
            confirm_delay: Duration::from_millis(config.relay.confirm_delay_ms),
            publication: config.postgres.publication.clone(),
            transactions: (config.kafka.delivery == DeliveryMode::ExactlyOnce).then(|| {
                Transactions {
                    max_age: Duration::from_millis(config.kafka.transaction_max_ms),
                    min_age: Duration::from_millis(config.kafka.transaction_min_ms),
                    max_records: config.kafka.transaction_max_records,
                    split_after: Duration::from_millis(
                        publisher::transaction_timeout_ms(&config.kafka) / 3,
                    ),
                }
            }),
            adaptive: config.kafka.adaptive_batching(),
        }
    }
}

/// The transaction being received.
struct OpenTxn {
    final_lsn: Lsn,
    commit_time_ms: i64,
    events: u64,
    /// Records of it handed to the sink.
    sent: u64,
    /// Already in Kafka (below the progress record): nothing of it is published.
    skip: bool,
    /// Its first records already in Kafka (a split transaction): so many are not published.
    in_kafka: u64,
    /// Of those, how many are still to come (and be skipped).
    skip_left: u64,
}

/// The Kafka transaction (exactly-once only).
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

/// A record read while a Kafka commit runs (exactly-once), sent in the next transaction.
pub(super) struct Held {
    pub record: Record,
    pub seq: TxnSeq,
    pub event_id: String,
    pub kind: RecordKind,
}

/// A relation from the stream, and its outbox binding when it is an outbox table or a
/// partition of one.
struct RelationEntry {
    relation: Arc<Relation>,
    bound: Option<BoundTable>,
    /// The configured outbox `(schema, table)` a partition was bound as; `None` when bound
    /// under its own name or not bound.
    bound_as: Option<(String, String)>,
    /// For an unbound relation: its partition root as the catalog said when it arrived
    /// (`None`: no relation has its OID any more).
    root: Option<(String, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Streaming,
    /// Shutdown requested: finish the open transaction, wait for acknowledgements.
    Draining {
        deadline: Instant,
    },
    /// An error the relay must stop on (`stop_error`): read nothing more, let what was sent
    /// before it be acknowledged and confirmed, then end with the error.
    Stopping {
        deadline: Instant,
    },
}

pub struct Session<'a, S, K, C> {
    settings: Settings,
    mapping: &'a OutboxMapping,
    metrics: &'a Metrics,
    source: S,
    sink: K,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    catalog: C,
    ledger: Ledger,
    relations: HashMap<u32, RelationEntry>,
    txn: Option<OpenTxn>,
    /// Records sent and not yet reported, against the in-flight caps.
    in_flight: InFlight,
    /// Newest WAL position received (the status update's `write`).
    received: Lsn,
    /// The confirmed position at the last status update.
    last_reported: Lsn,
    /// When the newly confirmable position is to be reported.
    confirm_due: Option<Instant>,
    phase: Phase,
    stop_error: Option<RelayError>,
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

impl<'a, S: FrameSource, K: RecordSink, C: Catalog> Session<'a, S, K, C> {
    /// A session whose slot stands at `start`.
    pub fn new(
        settings: Settings,
        mapping: &'a OutboxMapping,
        metrics: &'a Metrics,
        ends: Ends<S, K, C>,
        start: Lsn,
    ) -> Self {
        let in_flight = InFlight::new(
            settings.max_in_flight_messages,
            settings.max_in_flight_bytes,
        );
        Session {
            settings,
            mapping,
            metrics,
            source: ends.source,
            sink: ends.sink,
            deliveries: ends.deliveries,
            catalog: ends.catalog,
            ledger: Ledger::new(start),
            relations: HashMap::new(),
            txn: None,
            in_flight,
            received: start,
            last_reported: start,
            confirm_due: None,
            phase: Phase::Streaming,
            stop_error: None,
            kafka: KafkaTxn::Idle,
            acked: Vec::new(),
            skip_below: None,
            held: Vec::new(),
            held_end: None,
            idle_commit: false,
        }
    }

    /// Exactly-once: PostgreSQL transactions committing below `progress` (the end LSN of the
    /// last one committed to Kafka) are not published again.
    pub fn skipping_below(mut self, progress: Option<Progress>) -> Self {
        self.skip_below = progress;
        self
    }

    /// Runs until drained after `shutdown` (Ok) or an error. Whatever the ending, the last
    /// fully acknowledged commit is confirmed on the way out (best effort on errors). An error
    /// about the stream's content (an unmapped relation, a poison event) first lets the records
    /// sent before it be acknowledged, so that the slot stops right before the bad transaction.
    pub async fn run(mut self, shutdown: &CancellationToken) -> Result<(), RelayError> {
        let mut feedback = tokio::time::interval(self.settings.status_interval);
        feedback.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let result = loop {
            let settled = self.settle_kafka().await;
            self.schedule_confirm();
            if settled.is_ok() && self.is_drained() {
                break self.stop_error.take().map_or(Ok(()), Err);
            }
            let (commit_at, idle_commit_at) = self.kafka_commit_times();
            let step = if settled.is_err() {
                settled
            } else {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled(), if self.phase == Phase::Streaming => {
                        self.start_draining();
                        Ok(())
                    }
                    _ = sleep_until(self.drain_deadline()), if self.drain_deadline().is_some() => {
                        warn!(in_flight = self.in_flight.messages(),
                            "drain deadline reached; unacknowledged events will be sent again on restart");
                        break self.stop_error.take().map_or(Ok(()), Err);
                    }
                    Some(delivery) = self.deliveries.recv() => self.handle_deliveries(delivery).await,
                    outcome = commit_outcome(&mut self.kafka) => self.handle_commit_outcome(outcome),
                    _ = sleep_until(self.confirm_due), if self.confirm_due.is_some() => {
                        self.send_status(false).await
                    }
                    // Asking for a reply makes the server answer with a keepalive carrying its WAL
                    // end, which an idle relay confirms: unrelated traffic never piles up WAL.
                    _ = feedback.tick() => self.send_status(true).await,
                    // A Kafka transaction gets old while no PostgreSQL transaction is open: the
                    // top of the loop commits it.
                    _ = sleep_until(commit_at), if commit_at.is_some() => Ok(()),
                    frame = self.source.next_frame(), if self.wants_frames() => match frame {
                        Ok(frame) => {
                            self.metrics.mark_received(std::time::Instant::now());
                            self.handle_frame(frame).await
                        }
                        Err(e) => Err(e.into()),
                    },
                    // Below the frames: polled only when no frame is waiting.
                    _ = sleep_until(idle_commit_at), if idle_commit_at.is_some() => {
                        self.idle_commit = true;
                        Ok(())
                    }
                }
            };
            if let Err(e) = step {
                match self.stop_error {
                    None if e.drains_before_stopping() => self.start_stopping(e),
                    None => break Err(e),
                    Some(_) => {
                        warn!(error = %e, "a second error while stopping");
                        break Err(self.stop_error.take().unwrap_or(e));
                    }
                }
            }
            self.schedule_confirm();
        };
        self.finish(&result).await;
        result
    }

    fn start_draining(&mut self) {
        self.metrics.set_state(RelayState::Draining);
        info!(
            in_flight = self.in_flight.messages(),
            open_transaction = self.txn.is_some(),
            "shutting down: finishing the open transaction and draining in-flight deliveries"
        );
        // Records Kafka refuses for a deployment reason will not be acknowledged however long
        // the drain waits: a short wait for the others, then out (they are sent again).
        let wait = if self.metrics.kafka_blocked() {
            info!(
                "kafka refuses some records (see the kafka block above): draining for at most 5 s"
            );
            self.settings.shutdown_timeout.min(BLOCKED_DRAIN)
        } else {
            self.settings.shutdown_timeout
        };
        self.phase = Phase::Draining {
            deadline: Instant::now() + wait,
        };
    }

    fn start_stopping(&mut self, error: RelayError) {
        warn!(error = %error, in_flight = self.in_flight.messages(),
            "stopping: waiting for the records sent before this error to be acknowledged");
        self.phase = Phase::Stopping {
            deadline: Instant::now() + self.settings.shutdown_timeout,
        };
        self.stop_error = Some(error);
    }

    fn drain_deadline(&self) -> Option<Instant> {
        match self.phase {
            Phase::Draining { deadline } | Phase::Stopping { deadline } => Some(deadline),
            Phase::Streaming => None,
        }
    }

    /// Draining with nothing open and nothing in flight, or stopping with nothing in flight.
    /// Exactly-once: and no Kafka transaction left to commit or confirm (when stopping, one
    /// that holds part of the open PostgreSQL transaction is dropped: it can never commit).
    fn is_drained(&self) -> bool {
        let kafka_done = match self.kafka {
            KafkaTxn::Idle => true,
            KafkaTxn::Open { .. } => self.commit_end().is_none(),
            KafkaTxn::Committing { .. } | KafkaTxn::Committed { .. } => false,
        };
        match self.phase {
            Phase::Streaming => false,
            Phase::Draining { .. } => self.txn.is_none() && self.in_flight.is_empty() && kafka_done,
            Phase::Stopping { .. } => self.in_flight.is_empty() && kafka_done,
        }
    }

    /// The end LSN the open Kafka transaction may commit with now: it holds whole
    /// PostgreSQL transactions only (the open one, if any, sent nothing yet).
    fn commit_end(&self) -> Option<Lsn> {
        match self.kafka {
            KafkaTxn::Open { end: Some(end), .. }
                if self.txn.as_ref().is_none_or(|t| t.sent == 0) =>
            {
                Some(end)
            }
            _ => None,
        }
    }

    /// Where the open Kafka transaction may commit inside the PostgreSQL transaction being
    /// read: after its records handed over so far (all of them in Kafka transactions by now).
    fn split_point(&self) -> Option<Progress> {
        let txn = self.txn.as_ref().filter(|t| t.sent > 0 && !t.skip)?;
        Some(Progress::partial(txn.final_lsn, txn.in_kafka + txn.sent))
    }

    /// When the open Kafka transaction is to be committed by the timer (`max_age` old), and
    /// when early if no frame is waiting (`min_age` old). `None` while it may not commit,
    /// and while a PostgreSQL transaction is being read (its commit comes first).
    fn kafka_commit_times(&self) -> (Option<Instant>, Option<Instant>) {
        let (KafkaTxn::Open { started, .. }, Some(t)) = (&self.kafka, self.settings.transactions)
        else {
            return (None, None);
        };
        if self.split_point().is_some() {
            return (Some(*started + t.split_after), None);
        }
        if self.txn.is_some() || self.commit_end().is_none() {
            return (None, None);
        }
        (Some(*started + t.max_age), Some(*started + t.min_age))
    }

    /// Exactly-once bookkeeping at the top of the loop: starts a due commit, feeds a
    /// committed transaction's acknowledgements to the ledger once all have arrived, and then
    /// sends the records held meanwhile in a new transaction.
    async fn settle_kafka(&mut self) -> Result<(), RelayError> {
        let Some(limits) = self.settings.transactions else {
            return Ok(());
        };
        let idle = std::mem::take(&mut self.idle_commit);
        match self.kafka {
            KafkaTxn::Open {
                started, records, ..
            } => {
                let age = started.elapsed();
                let at = match self.commit_end() {
                    Some(end) => {
                        let due = self.phase != Phase::Streaming
                            || records >= limits.max_records
                            || (self.txn.is_none()
                                && (age >= limits.max_age || (idle && age >= limits.min_age)));
                        if !due {
                            return Ok(());
                        }
                        Progress::whole(end)
                    }
                    None => match self.split_point() {
                        Some(at) if age >= limits.split_after => at,
                        _ => return Ok(()),
                    },
                };
                debug!(records, at = %at, "committing the kafka transaction");
                self.kafka = KafkaTxn::Committing {
                    started: std::time::Instant::now(),
                    records,
                    outcome: self.sink.commit(at),
                };
            }
            KafkaTxn::Committed { records } if self.acked.len() >= records => {
                self.kafka = KafkaTxn::Idle;
                self.metrics
                    .kafka_transaction_records
                    .fetch_add(records as u64, Relaxed);
                for (seq, dead_letter) in std::mem::take(&mut self.acked) {
                    self.confirm_delivered(seq, dead_letter)?;
                }
                self.send_held().await?;
            }
            _ => {}
        }
        Ok(())
    }

    fn handle_commit_outcome(
        &mut self,
        outcome: Result<(), PublishError>,
    ) -> Result<(), RelayError> {
        let KafkaTxn::Committing {
            started, records, ..
        } = self.kafka
        else {
            return Ok(());
        };
        match outcome {
            Ok(()) => {
                self.metrics
                    .kafka_transactions_committed
                    .fetch_add(1, Relaxed);
                self.metrics.kafka_commit_latency.observe(started.elapsed());
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
                Err(e.into())
            }
        }
    }

    /// More frames are read while under the caps; when draining, only to finish the open
    /// transaction (so that its records need not be sent again after the restart).
    fn wants_frames(&self) -> bool {
        let room = self.in_flight.has_room();
        match self.phase {
            Phase::Streaming => room,
            Phase::Draining { .. } => room && self.txn.is_some(),
            Phase::Stopping { .. } => false,
        }
    }

    /// A position newer than the last reported one gets reported after `confirm_delay`.
    fn schedule_confirm(&mut self) {
        if self.confirm_due.is_none() && self.ledger.confirmed() > self.last_reported {
            self.confirm_due = Some(Instant::now() + self.settings.confirm_delay);
        }
    }

    /// The final status update (best effort after an error: the connection may be gone), then
    /// the stream is closed.
    async fn finish(&mut self, result: &Result<(), RelayError>) {
        self.settle_running_commit().await;
        if let KafkaTxn::Open { records, .. } = self.kafka {
            // Ending with records that will never commit (an error, the drain deadline):
            // read_committed consumers of their partitions wait until the transaction ends.
            info!(records, "aborting the open kafka transaction");
            self.sink.abort().await;
            self.metrics
                .kafka_transactions_aborted
                .fetch_add(1, Relaxed);
            self.kafka = KafkaTxn::Idle;
        }
        let confirmed = self.send_status(false).await;
        if result.is_ok() {
            if let Err(e) = &confirmed {
                warn!(error = %e, "the final status update failed; the slot keeps its previous position");
            }
            info!(confirmed = %self.ledger.confirmed(),
                published = self.metrics.events_published.load(Relaxed),
                "final position confirmed; session closed");
        }
        self.source.close().await;
        self.metrics.records_in_flight.store(0, Relaxed);
    }

    /// Ending while a Kafka commit runs (an error elsewhere): waits for its outcome, bounded,
    /// and treats a commit that failed or did not end in time as open, so that `finish`
    /// aborts it; read_committed consumers would otherwise wait `transaction.timeout.ms`.
    async fn settle_running_commit(&mut self) {
        let KafkaTxn::Committing { records, .. } = self.kafka else {
            return;
        };
        let outcome =
            tokio::time::timeout(COMMIT_WAIT_ON_EXIT, commit_outcome(&mut self.kafka)).await;
        self.kafka = match outcome {
            Ok(Ok(())) => KafkaTxn::Committed { records },
            _ => KafkaTxn::Open {
                started: Instant::now(),
                records,
                end: None,
            },
        };
    }

    /// Handles one delivery and every other one already waiting.
    async fn handle_deliveries(&mut self, first: Delivery) -> Result<(), RelayError> {
        self.handle_delivery(first).await?;
        while let Ok(delivery) = self.deliveries.try_recv() {
            self.handle_delivery(delivery).await?;
        }
        self.metrics
            .records_in_flight
            .store(self.in_flight.messages() as i64, Relaxed);
        Ok(())
    }

    async fn handle_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        self.in_flight.settled(delivery.bytes);
        match delivery.result {
            // Exactly-once: confirmed when (if) its Kafka transaction commits.
            Ok(()) if self.settings.transactions.is_some() => {
                self.acked.push((delivery.seq, delivery.dead_letter));
                Ok(())
            }
            Ok(()) => self.confirm_delivered(delivery.seq, delivery.dead_letter),
            // Exactly-once: a failed record dooms its Kafka transaction (it cannot commit),
            // so no dead letter can stand in for it there: the session ends.
            Err(failure) if self.settings.transactions.is_some() => {
                self.metrics.count_delivery_error(&failure.error);
                Err(RelayError::Delivery(Box::new(failure.rejection())))
            }
            Err(failure) => {
                self.handle_failed_delivery(delivery.seq, delivery.dead_letter, failure)
                    .await
            }
        }
    }

    /// A record Kafka has (in exactly-once: committed): the ledger counts it.
    fn confirm_delivered(&mut self, seq: TxnSeq, dead_letter: bool) -> Result<(), RelayError> {
        let commit_time_ms = self.ledger.ack(seq)?;
        let counter = if dead_letter {
            &self.metrics.events_dead_lettered
        } else {
            &self.metrics.events_published
        };
        counter.fetch_add(1, Relaxed);
        let latency_ms = (now_ms() - commit_time_ms).max(0) as u64;
        self.metrics
            .commit_to_ack
            .observe(Duration::from_millis(latency_ms));
        Ok(())
    }

    /// A record Kafka did not take. Permanent problems of the record itself are dead-lettered
    /// (same transaction: the slot waits for the dead letter instead); everything else ends the
    /// session so that it restarts from the slot.
    async fn handle_failed_delivery(
        &mut self,
        seq: TxnSeq,
        was_dead_letter: bool,
        failure: DeliveryFailure,
    ) -> Result<(), RelayError> {
        self.metrics.count_delivery_error(&failure.error);
        let rejection = failure.rejection();
        if let Some(fatal) = self.sink.fatal_error() {
            return Err(PublishError::Fatal(fatal).into());
        }
        if !publisher::is_permanent(&failure.error) || was_dead_letter {
            return Err(RelayError::Delivery(Box::new(rejection)));
        }
        let reason = Reason::for_kafka_error(&failure.error);
        let dlq = &self.settings.dead_letter_topic;
        let record =
            dead_letter::from_failed(dlq, &failure.message, reason, &rejection.to_string());
        self.dead_letter(seq, record, &rejection.event_id, &rejection.to_string())
            .await
    }

    async fn handle_frame(&mut self, frame: ReplicationFrame) -> Result<(), RelayError> {
        match frame {
            ReplicationFrame::Keepalive {
                wal_end,
                reply_requested,
            } => {
                self.received = self.received.max(wal_end);
                self.ledger.observe_wal_end(wal_end);
                if reply_requested {
                    self.send_status(false).await?;
                }
            }
            ReplicationFrame::XLogData { wal_end, data, .. } => {
                self.received = self.received.max(wal_end);
                self.handle_message(pgoutput::decode(data)?).await?;
            }
        }
        Ok(())
    }

    /// Exactly-once: opens a Kafka transaction for the next record unless one is open.
    fn begin_kafka_txn(&mut self) -> Result<(), RelayError> {
        if self.settings.transactions.is_none() || !matches!(self.kafka, KafkaTxn::Idle) {
            return Ok(());
        }
        self.sink.begin()?;
        self.kafka = KafkaTxn::Open {
            started: Instant::now(),
            records: 0,
            end: None,
        };
        Ok(())
    }

    /// Exactly-once, after a commit: the records held while it ran go into a new Kafka
    /// transaction, with the progress value of the last whole PostgreSQL transaction among them.
    async fn send_held(&mut self) -> Result<(), RelayError> {
        if self.held.is_empty() {
            return Ok(());
        }
        self.begin_kafka_txn()?;
        if let KafkaTxn::Open { end, .. } = &mut self.kafka {
            *end = self.held_end.take();
        }
        let mut held = std::mem::take(&mut self.held).into_iter();
        while let Some(record) = held.next() {
            if let Err(e) = self.send_now(record, true).await {
                // Never sent: no report will settle them.
                for rest in held {
                    self.in_flight.settled(rest.record.size());
                }
                return Err(e);
            }
        }
        Ok(())
    }

    async fn send_status(&mut self, reply: bool) -> Result<(), RelayError> {
        self.confirm_due = None;
        let flush = self.ledger.confirmed();
        self.source
            .send_status(self.received.max(flush), flush, reply)
            .await?;
        if flush > self.last_reported || self.in_flight.is_empty() {
            self.metrics.mark_progress();
        }
        self.last_reported = flush;
        self.metrics.set_lsns(self.received, flush);
        self.metrics
            .messages_rejected
            .store(self.mapping.non_transactional_messages(), Relaxed);
        self.metrics
            .records_in_flight
            .store(self.in_flight.messages() as i64, Relaxed);
        self.metrics
            .ledger_transactions
            .store(self.ledger.transactions_held() as i64, Relaxed);
        Ok(())
    }
}

/// How long a shutdown waits for acknowledgements while Kafka refuses some records.
const BLOCKED_DRAIN: Duration = Duration::from_secs(5);
/// How long a session's way out waits for a running Kafka commit before aborting it.
const COMMIT_WAIT_ON_EXIT: Duration = Duration::from_secs(5);

/// The outcome of the running Kafka commit; never, when none runs.
async fn commit_outcome(kafka: &mut KafkaTxn) -> Result<(), PublishError> {
    match kafka {
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

/// Sleeps until `at`, or forever when there is nothing to wait for.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
