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

/// `ExactlyOnce` on its own: the loop's calls made by hand, in the order the session makes
/// them (`hold`, `begin`, the send, `sent`; `postgres_committed` at a COMMIT; `settle` at the
/// top of each turn), against a sink that only records what it was asked to do with Kafka
/// transactions. Ages are on tokio's paused clock.
#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;

    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    use tokio::sync::oneshot;
    use tokio::time::{advance, Instant};

    use super::{ExactlyOnce, Transactions};
    use crate::lsn::Lsn;
    use crate::mapping::Record;
    use crate::relay::ledger::TxnSeq;
    use crate::relay::seams::{CommitOutcome, RecordKind, RecordSink};
    use crate::relay::session::{Held, Reading};
    use crate::serve::metrics::Metrics;
    use crate::sink::limits::SizeRefusal;
    use crate::sink::progress::{Covered, Progress};
    use crate::sink::publisher::{DeliveryFailure, PublishError};

    const LIMITS: Transactions = Transactions {
        max_age: Duration::from_millis(100),
        min_age: Duration::from_millis(10),
        max_records: 5,
        split_after: Duration::from_secs(1),
    };

    /// What `ExactlyOnce` asked of the Kafka producer.
    #[derive(Debug, PartialEq, Eq)]
    enum Op {
        Begin,
        Commit(Progress),
        Abort,
    }

    /// A producer that records the transaction calls; the test answers each commit.
    #[derive(Default)]
    struct Producer {
        ops: Vec<Op>,
        commits: Vec<oneshot::Sender<Result<(), PublishError>>>,
        /// Fenced by a newer producer: `begin` fails.
        fenced: bool,
    }

    impl Producer {
        fn begins(&self) -> usize {
            self.ops.iter().filter(|op| **op == Op::Begin).count()
        }

        fn commits(&self) -> Vec<Progress> {
            let commit = |op: &Op| match op {
                Op::Commit(at) => Some(*at),
                _ => None,
            };
            self.ops.iter().filter_map(commit).collect()
        }

        fn aborts(&self) -> usize {
            self.ops.iter().filter(|op| **op == Op::Abort).count()
        }

        /// Answers the last commit asked for.
        fn answer(&mut self, outcome: Result<(), PublishError>) {
            let answer = self.commits.pop().expect("a commit was asked for");
            answer
                .send(outcome)
                .expect("the commit's outcome is awaited");
        }
    }

    impl RecordSink for Producer {
        async fn send(
            &mut self,
            _record: &Record,
            _seq: TxnSeq,
            _event_id: &str,
            _kind: RecordKind,
        ) -> Result<(), PublishError> {
            Ok(())
        }

        fn fatal_error(&self) -> Option<String> {
            self.fenced.then(|| "fenced".into())
        }

        fn judge_size_refusal(&self, _failure: &DeliveryFailure) -> SizeRefusal {
            SizeRefusal::Batch { limit: usize::MAX }
        }

        fn record_limit(&self, _topic: &str) -> usize {
            crate::sink::limits::DEFAULT_MESSAGE_MAX_BYTES
        }

        fn refuses_timestamp(&self, _topic: &str, _timestamp_ms: Option<i64>) -> bool {
            false
        }

        fn begin(&mut self) -> Result<(), PublishError> {
            if self.fenced {
                return Err(fenced("begin"));
            }
            self.ops.push(Op::Begin);
            Ok(())
        }

        fn commit(&mut self, at: Progress) -> CommitOutcome {
            self.ops.push(Op::Commit(at));
            let (tx, rx) = oneshot::channel();
            self.commits.push(tx);
            rx
        }

        async fn abort(&mut self) {
            self.ops.push(Op::Abort);
        }

        fn skip_linger(&mut self) {}
    }

    fn fenced(what: &'static str) -> PublishError {
        PublishError::Transaction {
            what,
            error: KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
        }
    }

    fn held(seq: TxnSeq) -> Held {
        Held {
            record: Record::default(),
            seq,
            event_id: format!("event-{seq}"),
            kind: RecordKind::Event,
            row: None,
        }
    }

    /// Exactly-once state and its producer, and the loop's calls on them.
    struct Loop {
        eos: ExactlyOnce,
        kafka: Producer,
        metrics: Metrics,
    }

    impl Loop {
        fn new(limits: Transactions) -> Loop {
            Loop {
                eos: ExactlyOnce::new(limits),
                kafka: Producer::default(),
                metrics: Metrics::default(),
            }
        }

        /// One PostgreSQL transaction of `records` records (seq 1…), ending at 0x100, whose
        /// Kafka transaction's commit (at `max_age`) runs.
        async fn committing(records: u64) -> Loop {
            let mut l = Loop::new(LIMITS);
            l.postgres_txn(1, records, 0x100);
            advance(LIMITS.max_age).await;
            l.settle(Reading::Between);
            assert_eq!(l.kafka.commits(), vec![Progress::whole(Lsn(0x100))]);
            l
        }

        /// Hands a record over as the loop does; false when it was held.
        fn send(&mut self, seq: TxnSeq) -> bool {
            if self.eos.hold(held(seq)).is_none() {
                return false;
            }
            self.eos.begin(&mut self.kafka).expect("begin");
            self.eos.sent();
            true
        }

        /// A whole PostgreSQL transaction of `records` records (from `first`), ending at `end`.
        fn postgres_txn(&mut self, first: TxnSeq, records: u64, end: u64) {
            for seq in first..first + records {
                self.send(seq);
            }
            self.eos.postgres_committed(Lsn(end));
        }

        fn settle(&mut self, reading: Reading) -> (Vec<(TxnSeq, bool)>, Vec<TxnSeq>) {
            self.settle_as(reading, false)
        }

        fn settle_as(
            &mut self,
            reading: Reading,
            ending: bool,
        ) -> (Vec<(TxnSeq, bool)>, Vec<TxnSeq>) {
            let settled = self
                .eos
                .settle(&mut self.kafka, reading, ending, &self.metrics);
            let held = settled.held.iter().map(|h| h.seq).collect();
            (settled.durable, held)
        }

        /// Answers the running commit and hands its outcome to `ExactlyOnce`, as the loop's
        /// outcome arm does.
        async fn commit_answered(
            &mut self,
            outcome: Result<(), PublishError>,
        ) -> Result<(), PublishError> {
            self.kafka.answer(outcome);
            let outcome = self.eos.commit_outcome().await;
            self.eos.commit_ended(outcome, &self.metrics)
        }

        fn ack(&mut self, seqs: impl IntoIterator<Item = TxnSeq>) {
            for seq in seqs {
                self.eos.acknowledged(seq, false);
            }
        }
    }

    fn durable(seqs: impl IntoIterator<Item = TxnSeq>) -> Vec<(TxnSeq, bool)> {
        seqs.into_iter().map(|seq| (seq, false)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn one_kafka_transaction_opens_for_many_records_and_none_before_the_first() {
        let mut l = Loop::new(LIMITS);
        assert_eq!(l.kafka.begins(), 0, "no record, no Kafka transaction");
        assert!(l.eos.is_settled(Reading::Between));
        l.postgres_txn(1, 3, 0x100);
        l.postgres_txn(4, 1, 0x200);
        assert_eq!(l.kafka.ops, vec![Op::Begin]);
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_commits_before_a_postgres_transaction_ended_in_it() {
        let mut l = Loop::new(LIMITS);
        for seq in 1..=LIMITS.max_records as u64 {
            l.send(seq);
        }
        advance(LIMITS.max_age).await;
        l.eos.nothing_to_read();
        let at = Progress::partial(Lsn(0x100), LIMITS.max_records as u64, None);
        l.settle(Reading::Inside(at));
        l.settle(Reading::Between);
        assert!(l.kafka.commits().is_empty(), "{:?}", l.kafka.ops);
        assert_eq!(l.eos.commit_times(Reading::Between), (None, None));
        assert!(
            l.eos.is_settled(Reading::Between),
            "nothing it holds can commit"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_carries_the_end_of_the_last_whole_postgres_transaction() {
        let mut l = Loop::new(LIMITS);
        l.postgres_txn(1, 2, 0x100);
        l.postgres_txn(3, 2, 0x200);
        advance(LIMITS.max_age).await;
        l.settle(Reading::Between);
        assert_eq!(l.kafka.commits(), vec![Progress::whole(Lsn(0x200))]);
    }

    #[tokio::test(start_paused = true)]
    async fn commit_times_are_the_max_and_min_age_between_and_split_after_inside() {
        let mut l = Loop::new(LIMITS);
        assert_eq!(l.eos.commit_times(Reading::Between), (None, None), "idle");
        let started = Instant::now();
        l.postgres_txn(1, 1, 0x100);
        assert_eq!(
            l.eos.commit_times(Reading::Between),
            (
                Some(started + LIMITS.max_age),
                Some(started + LIMITS.min_age)
            )
        );
        let inside = Reading::Inside(Progress::partial(Lsn(0x200), 1, None));
        assert_eq!(
            l.eos.commit_times(inside),
            (Some(started + LIMITS.split_after), None)
        );
        assert_eq!(
            l.eos.commit_times(Reading::Starting),
            (None, None),
            "the commit of the PostgreSQL transaction just begun comes first"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickle_commits_early_once_min_age_old_with_nothing_to_read() {
        let mut l = Loop::new(LIMITS);
        l.postgres_txn(1, 1, 0x100);
        l.eos.nothing_to_read();
        l.settle(Reading::Between);
        assert!(l.kafka.commits().is_empty(), "younger than min_age");
        advance(LIMITS.min_age).await;
        l.settle(Reading::Between);
        assert!(
            l.kafka.commits().is_empty(),
            "min_age old, but a frame may be waiting: the early wake-up is taken once"
        );
        l.eos.nothing_to_read();
        l.settle(Reading::Between);
        assert_eq!(l.kafka.commits(), vec![Progress::whole(Lsn(0x100))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_backlog_stays_in_one_transaction_until_max_records() {
        let mut l = Loop::new(LIMITS);
        let mut seq = 1;
        for end in 1..LIMITS.max_records as u64 {
            l.postgres_txn(seq, 1, end * 0x100);
            seq += 1;
            l.settle(Reading::Between);
        }
        assert!(l.kafka.commits().is_empty(), "{} records", seq - 1);
        l.postgres_txn(seq, 1, 0x900);
        l.settle(Reading::Between);
        assert_eq!(
            l.kafka.ops,
            vec![Op::Begin, Op::Commit(Progress::whole(Lsn(0x900)))]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_transaction_commits_at_the_next_postgres_begin_but_an_old_one_waits_for_its_end(
    ) {
        let mut l = Loop::new(LIMITS);
        l.postgres_txn(1, 1, 0x100);
        advance(LIMITS.max_age).await;
        l.settle(Reading::Starting);
        assert!(
            l.kafka.commits().is_empty(),
            "max_age commits between transactions only"
        );
        l.postgres_txn(2, LIMITS.max_records as u64 - 1, 0x200);
        l.settle(Reading::Starting);
        assert_eq!(l.kafka.commits(), vec![Progress::whole(Lsn(0x200))]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_postgres_transaction_older_than_split_after_commits_with_a_partial_progress() {
        let mut l = Loop::new(LIMITS);
        for seq in 1..=LIMITS.max_records as u64 + 2 {
            l.send(seq);
        }
        let at = Progress::partial(Lsn(0x500), 7, None);
        advance(LIMITS.split_after - Duration::from_millis(1)).await;
        l.settle(Reading::Inside(at));
        assert!(l.kafka.commits().is_empty(), "younger than split_after");
        advance(Duration::from_millis(1)).await;
        l.settle(Reading::Inside(at));
        assert_eq!(l.kafka.commits(), vec![at]);
    }

    #[tokio::test(start_paused = true)]
    async fn ending_commits_at_any_boundary_and_never_inside_a_postgres_transaction() {
        let mut l = Loop::new(LIMITS);
        l.postgres_txn(1, 1, 0x100);
        l.settle_as(
            Reading::Inside(Progress::partial(Lsn(0x200), 1, None)),
            true,
        );
        assert!(l.kafka.commits().is_empty());
        l.settle_as(Reading::Starting, true);
        assert_eq!(l.kafka.commits(), vec![Progress::whole(Lsn(0x100))]);
    }

    #[tokio::test(start_paused = true)]
    async fn acknowledgements_are_durable_only_once_committed_and_every_report_is_in() {
        let mut l = Loop::new(LIMITS);
        l.postgres_txn(1, 3, 0x100);
        l.ack([1, 2]);
        assert_eq!(
            l.settle(Reading::Between),
            (vec![], vec![]),
            "not committed"
        );
        advance(LIMITS.max_age).await;
        l.settle(Reading::Between);
        l.ack([3]);
        assert_eq!(l.settle(Reading::Between), (vec![], vec![]), "committing");
        assert!(!l.eos.is_settled(Reading::Between));
        l.commit_answered(Ok(())).await.expect("committed");
        assert_eq!(l.metrics.kafka_transactions_committed.load(Relaxed), 1);
        assert_eq!(l.settle(Reading::Between), (durable([1, 2, 3]), vec![]));
        assert_eq!(l.metrics.kafka_transaction_records.load(Relaxed), 3);
        assert!(l.eos.is_settled(Reading::Between));
        assert_eq!(
            l.settle(Reading::Between),
            (vec![], vec![]),
            "handed back once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn reports_arriving_after_the_commit_are_durable_once_all_are_in() {
        let mut l = Loop::committing(3).await;
        l.commit_answered(Ok(())).await.expect("committed");
        l.ack([2, 1]);
        assert_eq!(
            l.settle(Reading::Between),
            (vec![], vec![]),
            "one report missing"
        );
        assert!(!l.eos.is_settled(Reading::Between));
        l.ack([3]);
        assert_eq!(
            l.settle(Reading::Between),
            (vec![(2, false), (1, false), (3, false)], vec![])
        );
    }

    #[tokio::test(start_paused = true)]
    async fn records_read_while_a_commit_runs_are_held_for_the_next_transaction_and_its_progress() {
        let mut l = Loop::committing(1).await;
        assert!(!l.send(2), "held while the commit runs");
        l.eos.postgres_committed(Lsn(0x200));
        l.commit_answered(Ok(())).await.expect("committed");
        assert!(!l.send(3), "held until the last report of the commit is in");
        l.eos.postgres_committed(Lsn(0x300));
        l.ack([1]);
        assert_eq!(l.settle(Reading::Between), (durable([1]), vec![2, 3]));
        assert_eq!(
            l.kafka.begins(),
            1,
            "the next transaction opens with its first record"
        );
        // The loop sends what was handed back: the next transaction holds both PostgreSQL
        // transactions whole, so it may commit at once, at the end of the second.
        assert!(l.send(2));
        assert!(l.send(3));
        l.settle_as(Reading::Between, true);
        assert_eq!(l.kafka.begins(), 2);
        assert_eq!(
            l.kafka.commits(),
            vec![Progress::whole(Lsn(0x100)), Progress::whole(Lsn(0x300))]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_commit_confirms_nothing_and_is_aborted_on_the_way_out() {
        let mut l = Loop::committing(2).await;
        assert!(!l.send(3), "held while the commit runs");
        l.ack([1, 2]);
        let failed = l.commit_answered(Err(fenced("commit"))).await;
        assert!(failed.is_err(), "a failed commit ends the session");
        assert_eq!(
            l.settle(Reading::Between),
            (vec![], vec![]),
            "nothing durable, nothing held"
        );
        assert_eq!(l.metrics.kafka_transactions_committed.load(Relaxed), 0);
        l.eos.finish(&mut l.kafka, &l.metrics).await;
        assert_eq!(l.kafka.aborts(), 1);
        assert_eq!(l.metrics.kafka_transactions_aborted.load(Relaxed), 1);
        assert!(l.eos.is_settled(Reading::Between));
    }

    #[tokio::test(start_paused = true)]
    async fn a_fenced_producer_opens_no_transaction_and_leaves_nothing_to_abort() {
        let mut l = Loop::new(LIMITS);
        l.kafka.fenced = true;
        assert!(l.eos.begin(&mut l.kafka).is_err());
        assert!(l.eos.is_settled(Reading::Between));
        assert_eq!(l.eos.commit_times(Reading::Between), (None, None));
        l.eos.finish(&mut l.kafka, &l.metrics).await;
        assert!(l.kafka.ops.is_empty(), "{:?}", l.kafka.ops);
    }

    #[tokio::test(start_paused = true)]
    async fn a_commit_whose_task_ended_is_a_failed_commit() {
        let mut l = Loop::committing(1).await;
        l.kafka.commits.clear();
        let outcome = l.eos.commit_outcome().await;
        assert!(l.eos.commit_ended(outcome, &l.metrics).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn the_way_out_waits_for_a_running_commit_and_aborts_it_only_if_it_fails_or_hangs() {
        for (outcome, aborts) in [
            (Some(Ok(())), 0),
            (Some(Err(fenced("commit"))), 1),
            (None, 1),
        ] {
            let mut l = Loop::committing(1).await;
            let answer = l.kafka.commits.pop().expect("a commit");
            // `None`: the commit hangs, its answer kept unsent past the wait.
            let _hanging = match outcome {
                Some(outcome) => answer.send(outcome).map(|()| None).expect("awaited"),
                None => Some(answer),
            };
            l.eos.finish(&mut l.kafka, &l.metrics).await;
            assert_eq!(l.kafka.aborts(), aborts, "{:?}", l.kafka.ops);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_open_transaction_is_aborted_on_the_way_out_and_a_committed_one_is_not() {
        let mut l = Loop::committing(1).await;
        l.ack([1]);
        l.commit_answered(Ok(())).await.expect("committed");
        l.settle(Reading::Between);
        l.postgres_txn(2, 1, 0x200);
        l.eos.finish(&mut l.kafka, &l.metrics).await;
        assert_eq!(
            l.kafka.ops,
            vec![
                Op::Begin,
                Op::Commit(Progress::whole(Lsn(0x100))),
                Op::Begin,
                Op::Abort
            ]
        );
    }

    #[test]
    fn postgres_transactions_below_the_progress_value_are_covered_and_none_above() {
        let mut eos = ExactlyOnce::new(LIMITS);
        assert_eq!(
            eos.covered(Lsn(0x100)),
            Covered::Nothing,
            "no progress record"
        );
        eos.skip_below(Some(Progress::whole(Lsn(0x200))));
        assert_eq!(eos.covered(Lsn(0x1f0)), Covered::All);
        assert_eq!(eos.covered(Lsn(0x200)), Covered::Nothing);
        assert_eq!(eos.covered(Lsn(0x300)), Covered::Nothing);
        eos.skip_below(Some(Progress::partial(Lsn(0x200), 3, None)));
        assert_eq!(eos.covered(Lsn(0x100)), Covered::All);
        assert_eq!(
            eos.covered(Lsn(0x200)),
            Covered::First {
                changes: 3,
                through: None
            },
            "split: its first records"
        );
        assert_eq!(eos.covered(Lsn(0x300)), Covered::Nothing);
    }
}
