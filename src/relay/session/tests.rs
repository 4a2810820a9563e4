//! The session loop against fakes: a scripted WAL and a sink whose acknowledgements the test
//! controls. Ordering, confirmation, caps, dead-letter policies, shutdown drain and the
//! errors that end a session, in milliseconds and without PostgreSQL or Kafka.
//!
//! Every timing here is logical (commit ages, the drain deadline, confirm delays), so the tests
//! run on tokio's paused clock: it moves only when the session and the test's driver both
//! wait, straight to the next timer. A wait is then exact (a 20 ms pause lets the session do
//! everything it can before the test looks) and costs no wall-clock time.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::Timestamp;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::fakes::{
    self, begin, commit, relation, text, ChannelSource, FakeCatalog, Upstream, OUTBOX,
};
use super::{Session, Settings, Transactions};
use crate::relay::ledger::TxnSeq;
use crate::relay::seams::{CommitOutcome, Ends, RecordKind, RecordSink};
use crate::relay::RelayError;
use crate::sink::limits::SizeRefusal;
use crate::sink::progress::Progress;

use crate::config::SchemaVersion;
use crate::config::{BreakerPolicy, DeadLetterPolicy, OutboxConfig};
use crate::lsn::Lsn;
use crate::mapping::OutboxMapping;
use crate::mapping::Record;
use crate::serve::metrics::Metrics;
use crate::sink::publisher::{Delivery, DeliveryFailure, PublishError, Rejection};
use crate::sink::schema::registry::{BoxFuture, Registered, RegistryError, SchemaRegistry};
use crate::source::pgoutput::{LogicalMessage, TupleValue};
use crate::source::walsender::{ReplicationError, ReplicationFrame};

const AUDIT: u32 = 16_500;
/// A partition of the outbox (`public.outbox_2026_11`), sent under its own name.
const LEAF: u32 = 16_600;
/// A relation that was dropped before the session asked about it.
const GONE: u32 = 16_700;
/// A partition of `public.audit` (not an outbox), sent under its own name.
const AUDIT_LEAF: u32 = 16_800;
const DLQ: &str = "test.dlq";

// ---------------------------------------------------------------------------------------
// The scripted WAL.

/// Builds frames as PostgreSQL would send them, with growing LSNs.
struct Wal {
    lsn: u64,
}

impl Wal {
    fn new() -> Wal {
        Wal { lsn: 0x1000 }
    }

    fn relation(id: u32, name: &str) -> ReplicationFrame {
        relation(id, "public", name, 0)
    }

    fn begin(&mut self, rows: usize) -> (ReplicationFrame, Lsn) {
        let final_lsn = Lsn(self.lsn + 0x100 * rows as u64 + 0x10);
        (begin(final_lsn, 1), final_lsn)
    }

    fn commit(&mut self, final_lsn: Lsn) -> (ReplicationFrame, Lsn) {
        let end_lsn = Lsn(final_lsn.0 + 0x30);
        self.lsn = end_lsn.0 + 0x10;
        (commit(final_lsn, end_lsn), end_lsn)
    }

    /// A whole transaction inserting `ids` into relation `relid` (`None`: a row whose
    /// aggregate type is null, which cannot be routed). Returns its frames and end LSN.
    fn txn(&mut self, relid: u32, ids: &[Option<&str>]) -> (Vec<ReplicationFrame>, Lsn) {
        let (begin, final_lsn) = self.begin(ids.len());
        let mut frames = vec![begin];
        frames.extend(ids.iter().map(|id| insert(relid, *id)));
        let (commit, end) = self.commit(final_lsn);
        frames.push(commit);
        (frames, end)
    }
}

fn insert(relid: u32, id: Option<&str>) -> ReplicationFrame {
    let aggregate_type = match id {
        Some(_) => text("order"),
        None => TupleValue::Null,
    };
    let id = id.unwrap_or("00000000-0000-0000-0000-000000000000");
    fakes::insert(
        relid,
        vec![
            text(id),
            aggregate_type,
            text("42"),
            text("OrderCreated"),
            text("{\"n\": 1}"),
        ],
    )
}

fn event_id(n: usize) -> String {
    format!("00000000-0000-0000-0000-{n:012}")
}

// ---------------------------------------------------------------------------------------
// The fakes.

/// What the session told PostgreSQL.
#[derive(Default)]
struct SourceLog {
    /// `flush` of every status update, in order.
    flushes: Vec<Lsn>,
    closed: bool,
    /// Frames the session took.
    frames_read: usize,
}

/// The session's end of the replication connection: frames from the test, status updates
/// into the log.
type FakeSource = ChannelSource<Arc<Mutex<SourceLog>>>;

impl Upstream for Arc<Mutex<SourceLog>> {
    fn taken(&mut self) {
        self.lock().unwrap().frames_read += 1;
    }

    fn status(&mut self, flush: Lsn, _reply: bool) -> Result<(), ReplicationError> {
        self.lock().unwrap().flushes.push(flush);
        Ok(())
    }

    fn closed(&mut self) {
        self.lock().unwrap().closed = true;
    }
}

/// One record the sink took.
#[derive(Debug, Clone)]
struct Sent {
    seq: TxnSeq,
    event_id: String,
    kind: RecordKind,
    topic: String,
    bytes: usize,
    /// The row image header of a dead letter (`outbox-relay.dlq.row`).
    row: Option<String>,
    /// A dead letter's reason (`outbox-relay.dlq.reason`).
    reason: Option<String>,
    /// The outbox row a dead letter names (`outbox-relay.dlq.outbox-row`).
    outbox_row: Option<String>,
}

/// What the sink did with Kafka transactions, in order (exactly-once).
#[derive(Debug, Clone, PartialEq, Eq)]
enum KafkaOp {
    Begin,
    /// A commit asked for, with the progress end LSN and how many records were sent by then.
    Commit {
        end: Lsn,
        sent: usize,
    },
    /// A commit inside a PostgreSQL transaction: its commit LSN and how many of its records
    /// the progress says are in.
    Split {
        final_lsn: Lsn,
        records: u64,
        sent: usize,
    },
    Abort,
}

/// A commit the test answers.
type CommitRequest = (Lsn, oneshot::Sender<Result<(), PublishError>>);

/// Takes records; acknowledges at once (`auto_ack`) or when the test says. Commits are handed
/// to the test (`Rig::commits`), which answers them.
struct FakeSink {
    sent: Arc<Mutex<Vec<Sent>>>,
    /// `skip_linger` calls.
    skips: Arc<Mutex<usize>>,
    deliveries: mpsc::UnboundedSender<Delivery>,
    auto_ack: bool,
    kafka: Arc<Mutex<Vec<KafkaOp>>>,
    commits: mpsc::UnboundedSender<CommitRequest>,
    /// An event refused at `send` (for good: too large), as librdkafka refuses some at once.
    refuse: Option<(String, RDKafkaErrorCode)>,
    /// The producer's `batch.size`: 1 (every record alone in its batch) unless a test batches.
    batch_size: usize,
    limits: Arc<crate::sink::limits::TopicLimits>,
}

impl RecordSink for FakeSink {
    async fn send(
        &mut self,
        record: &Record,
        seq: TxnSeq,
        event_id: &str,
        kind: RecordKind,
    ) -> Result<(), PublishError> {
        if let Some((_, code)) = self
            .refuse
            .as_ref()
            .filter(|(id, _)| kind == RecordKind::Event && id == event_id)
        {
            return Err(PublishError::Rejected(Box::new(Rejection::new(
                record.topic.clone(),
                event_id.to_string(),
                KafkaError::MessageProduction(*code),
            ))));
        }
        let header = |name: &str| {
            record
                .headers
                .iter()
                .find(|(k, _)| &**k == name)
                .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
        };
        let sent = Sent {
            seq,
            event_id: event_id.to_string(),
            kind,
            topic: record.topic.clone(),
            bytes: record.size(),
            row: header(crate::sink::dead_letter::HEADER_ROW),
            reason: header(crate::sink::dead_letter::HEADER_REASON),
            outbox_row: header(crate::sink::dead_letter::HEADER_OUTBOX_ROW),
        };
        if self.auto_ack {
            let _ = self.deliveries.send(ok(&sent));
        }
        self.sent.lock().unwrap().push(sent);
        Ok(())
    }

    fn fatal_error(&self) -> Option<String> {
        None
    }

    fn judge_size_refusal(&self, failure: &DeliveryFailure) -> SizeRefusal {
        let topic = failure.message.topic();
        self.limits.judge(topic, failure.content(), self.batch_size)
    }

    fn record_limit(&self, topic: &str) -> usize {
        let max = crate::sink::limits::DEFAULT_MESSAGE_MAX_BYTES;
        self.limits.record_limit(topic).map_or(max, |l| l.min(max))
    }

    fn refuses_timestamp(&self, topic: &str, timestamp_ms: Option<i64>) -> bool {
        self.limits
            .outside_window(topic, timestamp_ms, crate::clock::unix_ms)
    }

    fn begin(&mut self) -> Result<(), PublishError> {
        self.kafka.lock().unwrap().push(KafkaOp::Begin);
        Ok(())
    }

    fn commit(&mut self, at: Progress) -> CommitOutcome {
        let sent = self.sent.lock().unwrap().len();
        let op = match at.changes {
            None => KafkaOp::Commit { end: at.lsn, sent },
            Some(records) => KafkaOp::Split {
                final_lsn: at.lsn,
                records,
                sent,
            },
        };
        self.kafka.lock().unwrap().push(op);
        let (tx, rx) = oneshot::channel();
        self.commits.send((at.lsn, tx)).unwrap();
        rx
    }

    async fn abort(&mut self) {
        self.kafka.lock().unwrap().push(KafkaOp::Abort);
    }

    fn skip_linger(&mut self) {
        *self.skips.lock().unwrap() += 1;
    }
}

fn ok(sent: &Sent) -> Delivery {
    Delivery {
        seq: sent.seq,
        dead_letter: sent.kind == RecordKind::DeadLetter,
        bytes: sent.bytes,
        result: Ok(()),
    }
}

fn failed(sent: &Sent, code: RDKafkaErrorCode) -> Delivery {
    let message = OwnedMessage::new(
        Some(b"{}".to_vec()),
        Some(sent.event_id.clone().into_bytes()),
        sent.topic.clone(),
        Timestamp::NotAvailable,
        0,
        -1,
        None,
    );
    Delivery {
        seq: sent.seq,
        dead_letter: sent.kind == RecordKind::DeadLetter,
        bytes: sent.bytes,
        result: Err(DeliveryFailure::new(
            KafkaError::MessageProduction(code),
            message,
        )),
    }
}

/// The catalog: partitions of the outbox resolve to it; everything else to itself; `GONE`
/// to nothing.
fn catalog() -> FakeCatalog {
    FakeCatalog::new(&[
        (OUTBOX, "public", "outbox"),
        (AUDIT, "public", "audit"),
        (LEAF, "public", "outbox"),
        (AUDIT_LEAF, "public", "audit"),
    ])
}

/// A session wired to fakes, and the test's handles on them.
struct Rig {
    frames: mpsc::UnboundedSender<Result<ReplicationFrame, ReplicationError>>,
    acks: mpsc::UnboundedSender<Delivery>,
    log: Arc<Mutex<SourceLog>>,
    sent: Arc<Mutex<Vec<Sent>>>,
    skips: Arc<Mutex<usize>>,
    kafka: Arc<Mutex<Vec<KafkaOp>>>,
    /// Taken by an exactly-once test's driver.
    commits: Option<mpsc::UnboundedReceiver<CommitRequest>>,
    shutdown: CancellationToken,
    ends: Option<Ends<FakeSource, FakeSink, FakeCatalog>>,
}

impl Rig {
    fn new(auto_ack: bool) -> Rig {
        let (frames, frames_rx) = mpsc::unbounded_channel();
        let (acks, acks_rx) = mpsc::unbounded_channel();
        let log = Arc::new(Mutex::new(SourceLog::default()));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let skips = Arc::new(Mutex::new(0));
        let kafka = Arc::new(Mutex::new(Vec::new()));
        let (commits_tx, commits) = mpsc::unbounded_channel();
        let source = FakeSource {
            frames: frames_rx,
            upstream: log.clone(),
        };
        let sink = FakeSink {
            sent: sent.clone(),
            skips: skips.clone(),
            deliveries: acks.clone(),
            auto_ack,
            kafka: kafka.clone(),
            commits: commits_tx,
            refuse: None,
            batch_size: 1,
            limits: Arc::default(),
        };
        Rig {
            frames,
            acks,
            log,
            sent,
            skips,
            kafka,
            commits: Some(commits),
            shutdown: CancellationToken::new(),
            ends: Some(Ends {
                source,
                sink,
                deliveries: acks_rx,
                catalog: catalog(),
            }),
        }
    }

    fn push(&self, frames: impl IntoIterator<Item = ReplicationFrame>) {
        for f in frames {
            self.frames.send(Ok(f)).unwrap();
        }
    }

    fn session<'a>(
        &mut self,
        settings: Settings,
        mapping: &'a OutboxMapping,
        metrics: &'a Metrics,
    ) -> Session<'a, FakeSource, FakeSink, FakeCatalog> {
        let ends = self.ends.take().expect("one session per rig");
        Session::new(settings, mapping, metrics, ends, Lsn(0x100))
    }

    /// The sink batches records up to `batch_size` bytes, and judges size refusals by it.
    fn batching(&mut self, batch_size: usize) {
        let ends = self.ends.as_mut().expect("before the session starts");
        ends.sink.batch_size = batch_size;
    }

    /// The sink refuses event `id` at `send`, for good.
    fn refuse_at_send(&mut self, id: &str) {
        self.refuse_at_send_with(id, RDKafkaErrorCode::MessageSizeTooLarge);
    }

    /// The sink refuses event `id` at `send` with `code`.
    fn refuse_at_send_with(&mut self, id: &str, code: RDKafkaErrorCode) {
        let ends = self.ends.as_mut().expect("before the session starts");
        ends.sink.refuse = Some((id.to_string(), code));
    }

    fn kafka_ops(&self) -> Vec<KafkaOp> {
        self.kafka.lock().unwrap().clone()
    }

    fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }

    fn skips(&self) -> usize {
        *self.skips.lock().unwrap()
    }

    fn last_flush(&self) -> Lsn {
        self.log
            .lock()
            .unwrap()
            .flushes
            .last()
            .copied()
            .unwrap_or(Lsn::ZERO)
    }

    fn max_flush(&self) -> Lsn {
        let log = self.log.lock().unwrap();
        log.flushes.iter().copied().max().unwrap_or(Lsn::ZERO)
    }

    /// Answers a commit request, which must end at `end`, with success; waits until `end`
    /// is confirmed.
    async fn confirm_commit(&self, request: CommitRequest, end: Lsn) {
        let (at, answer) = request;
        assert_eq!(at, end, "the commit's progress value");
        answer.send(Ok(())).unwrap();
        self.until("confirmed", |r| r.last_flush() == end).await;
    }

    /// Runs `session` beside the test's `driver` (which stops it, or waits for it to end):
    /// the session's outcome once both are done. Fails (rather than hangs) when they are not
    /// done within 10 logical minutes: a broken session that never confirms keeps a driver
    /// waiting for its confirmation forever.
    async fn run(
        &self,
        session: Session<'_, FakeSource, FakeSink, FakeCatalog>,
        driver: impl Future<Output = ()>,
    ) -> Result<(), RelayError> {
        let both = async { tokio::join!(session.run(&self.shutdown), driver) };
        let (result, ()) = tokio::time::timeout(Duration::from_secs(600), both)
            .await
            .expect("the session and the test's driver still ran after 10 logical minutes");
        result
    }

    /// Runs `session` to its end; fails (rather than hangs) when it still runs after 10
    /// logical minutes.
    async fn ended(
        &self,
        session: Session<'_, FakeSource, FakeSink, FakeCatalog>,
    ) -> Result<(), RelayError> {
        tokio::time::timeout(Duration::from_secs(600), session.run(&self.shutdown))
            .await
            .expect("the session still ran after 10 logical minutes")
    }

    /// Pushes `frames` and waits until the session has read them all.
    async fn read_all(&self, frames: Vec<ReplicationFrame>) {
        let pushed = self.log.lock().unwrap().frames_read + frames.len();
        self.push(frames);
        self.until("the frames read", |r| {
            r.log.lock().unwrap().frames_read == pushed
        })
        .await;
    }

    /// Waits until `check` holds, looking after each logical millisecond (the paused clock
    /// moves only once the session has nothing left to do): fails after 2 logical seconds.
    async fn until(&self, what: &str, check: impl Fn(&Rig) -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
        while !check(self) {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

/// The next Kafka commit the session asks for: the test fails (rather than hangs) when none
/// comes within 5 logical seconds.
async fn next_commit(commits: &mut mpsc::UnboundedReceiver<CommitRequest>) -> CommitRequest {
    tokio::time::timeout(Duration::from_secs(5), commits.recv())
        .await
        .expect("no kafka commit within 5 s")
        .expect("the session dropped its sink")
}

fn settings() -> Settings {
    fakes::settings(DLQ)
}

/// Exactly-once settings: commit when `max_age` old or `max_records` big (no early commit).
fn exactly_once(max_age: Duration, max_records: usize) -> Settings {
    exactly_once_early(max_age, max_age, max_records)
}

/// ... and early, once `min_age` old, when no frame is waiting.
fn exactly_once_early(max_age: Duration, min_age: Duration, max_records: usize) -> Settings {
    Settings {
        transactions: Some(Transactions {
            max_age,
            min_age,
            max_records,
            split_after: Duration::from_secs(3600),
        }),
        ..settings()
    }
}

/// Exactly-once whose Kafka transactions commit inside a PostgreSQL transaction once
/// `split_after` old.
fn exactly_once_split(split_after: Duration) -> Settings {
    let mut settings = exactly_once(Duration::from_millis(1), 1_000_000);
    if let Some(t) = &mut settings.transactions {
        t.split_after = split_after;
    }
    settings
}

fn mapping() -> OutboxMapping {
    OutboxMapping::new(&OutboxConfig::default()).unwrap()
}

/// `count` transactions of 1 to 4 rows each; returns (frames, end LSN and row count per txn).
fn transactions(
    wal: &mut Wal,
    count: usize,
    rng: &mut impl Rng,
) -> (Vec<ReplicationFrame>, Vec<(Lsn, usize)>) {
    let mut frames = vec![Wal::relation(OUTBOX, "outbox")];
    let mut txns = Vec::new();
    let mut n = 0;
    for _ in 0..count {
        let rows = rng.gen_range(1..=4);
        let ids: Vec<String> = (n..n + rows).map(event_id).collect();
        n += rows;
        let ids: Vec<Option<&str>> = ids.iter().map(|s| Some(s.as_str())).collect();
        let (f, end) = wal.txn(OUTBOX, &ids);
        frames.extend(f);
        txns.push((end, rows));
    }
    (frames, txns)
}

// ---------------------------------------------------------------------------------------
// The tests.

#[tokio::test(start_paused = true)]
async fn confirms_in_commit_order_whatever_the_ack_order() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (frames, txns) = transactions(&mut wal, 60, &mut rng);
    let total: usize = txns.iter().map(|t| t.1).sum();
    rig.push(frames);
    let session = rig.session(settings(), &mapping, &metrics);

    let driver = async {
        rig.until("every record sent", |r| r.sent().len() == total)
            .await;
        let mut order = rig.sent();
        order.shuffle(&mut rng);
        let mut pending: Vec<usize> = txns.iter().map(|t| t.1).collect();
        // The ledger numbers transactions from 0 in commit order.
        for record in order {
            rig.acks.send(ok(&record)).unwrap();
            pending[record.seq as usize] -= 1;
            tokio::time::sleep(Duration::from_micros(200)).await;
            let bound = match pending.iter().position(|&p| p > 0) {
                Some(first_unacked) => txns[first_unacked].0,
                None => Lsn(u64::MAX),
            };
            assert!(
                rig.max_flush() < bound,
                "confirmed {} past an unacknowledged commit ending at {bound}",
                rig.max_flush()
            );
        }
        let last = txns.last().unwrap().0;
        rig.until("the last commit confirmed", |r| r.last_flush() == last)
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    let log = rig.log.lock().unwrap();
    assert!(
        log.flushes.windows(2).all(|w| w[0] <= w[1]),
        "confirmed went backwards"
    );
    assert!(log.closed);
}

#[tokio::test(start_paused = true)]
async fn reading_pauses_at_the_in_flight_cap() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let mut frames = vec![Wal::relation(OUTBOX, "outbox")];
    for n in 0..20 {
        frames.extend(wal.txn(OUTBOX, &[Some(&event_id(n))]).0);
    }
    rig.push(frames);
    let mut capped = settings();
    capped.max_in_flight_messages = 5;
    let session = rig.session(capped, &mapping, &metrics);

    let driver = async {
        rig.until("the cap reached", |r| r.sent().len() == 5).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(rig.sent().len(), 5, "read past the in-flight cap");
        let mut acked = 0;
        while acked < 20 {
            let sent = rig.sent();
            assert!(sent.len() - acked <= 5, "{} in flight", sent.len() - acked);
            for record in &sent[acked..] {
                rig.acks.send(ok(record)).unwrap();
            }
            acked = sent.len();
            let more = acked;
            rig.until("more read after the acks", |r| {
                r.sent().len() > more || more == 20
            })
            .await;
        }
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
}

/// A row that cannot be routed, and a record Kafka refuses for good, under both policies.
#[tokio::test(start_paused = true)]
async fn poison_records_are_dead_lettered_under_policy_dead_letter() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (unroutable, end_a) = wal.txn(OUTBOX, &[None]);
    let (too_large, end_b) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    rig.push(unroutable.into_iter().chain(too_large));
    let session = rig.session(settings(), &mapping, &metrics);

    let driver = async {
        rig.until("two records", |r| r.sent().len() == 2).await;
        let sent = rig.sent();
        assert_eq!(sent[0].kind, RecordKind::DeadLetter);
        assert_eq!(sent[0].topic, DLQ);
        assert_eq!(sent[1].kind, RecordKind::Event);
        rig.acks.send(ok(&sent[0])).unwrap();
        rig.until("the dead letter confirms its transaction", |r| {
            r.last_flush() == end_a
        })
        .await;
        rig.acks
            .send(failed(&sent[1], RDKafkaErrorCode::MessageSizeTooLarge))
            .unwrap();
        rig.until("the refused record dead-lettered", |r| r.sent().len() == 3)
            .await;
        let dead = rig.sent()[2].clone();
        assert_eq!(
            (dead.kind, dead.topic.as_str()),
            (RecordKind::DeadLetter, DLQ)
        );
        assert_eq!(
            dead.seq, sent[1].seq,
            "the dead letter stands in for the record"
        );
        assert!(
            rig.max_flush() < end_b,
            "confirmed before the dead letter was acknowledged"
        );
        rig.acks.send(ok(&dead)).unwrap();
        rig.until("confirmed past the dead letter", |r| {
            r.last_flush() == end_b
        })
        .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    assert_eq!(
        metrics
            .events_dead_lettered
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

/// An event refused at `send` for a reason that is not its own (here the queue is full) is
/// no poison: it is not dead-lettered, the session ends (the next one sends it again) and
/// nothing is confirmed past it.
#[tokio::test(start_paused = true)]
async fn an_event_refused_at_send_for_no_fault_of_its_own_is_not_dead_lettered() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (frames, end) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    rig.push(frames);
    rig.refuse_at_send_with(&event_id(1), RDKafkaErrorCode::QueueFull);
    let session = rig.session(settings(), &mapping, &metrics);
    let result = rig.ended(session).await;
    assert!(result.is_err(), "{result:?}");
    assert!(
        rig.sent().iter().all(|s| s.kind != RecordKind::DeadLetter),
        "a healthy event dead-lettered: {:?}",
        rig.sent()
    );
    assert!(rig.max_flush() < end, "confirmed past the refused event");
}

/// A row whose topic name Kafka cannot take is dead-lettered with reason `invalid_topic`
/// (not `mapping`): what a redrive's operator filters by.
#[tokio::test(start_paused = true)]
async fn a_row_with_an_invalid_topic_name_is_dead_lettered_as_such() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (begin, final_lsn) = wal.begin(1);
    let row = fakes::insert(
        OUTBOX,
        vec![
            text(&event_id(1)),
            text("bad name!"),
            text("42"),
            text("OrderCreated"),
            text("{\"n\": 1}"),
        ],
    );
    let (commit, end) = wal.commit(final_lsn);
    rig.push([begin, row, commit]);
    let session = rig.session(settings(), &mapping, &metrics);
    let driver = async {
        rig.until("confirmed past the row", |r| r.last_flush() == end)
            .await;
        rig.shutdown.cancel();
    };
    rig.run(session, driver).await.unwrap();
    let sent = rig.sent();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(sent[0].kind, RecordKind::DeadLetter);
    assert_eq!(sent[0].reason.as_deref(), Some("invalid_topic"));
}

/// Settings with a breaker of 2 dead letters a minute.
fn breaker(on_breaker: BreakerPolicy) -> Settings {
    Settings {
        dead_letter_max_per_minute: 2,
        on_breaker,
        ..settings()
    }
}

/// Three unroutable rows, one transaction each: the third trips a breaker of 2.
fn three_poison_txns(rig: &mut Rig) -> (Lsn, Lsn) {
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (a, _) = wal.txn(OUTBOX, &[None]);
    let (b, end_b) = wal.txn(OUTBOX, &[None]);
    let (c, end_c) = wal.txn(OUTBOX, &[Some(&event_id(9)), None]);
    rig.push(a.into_iter().chain(b).chain(c));
    (end_b, end_c)
}

#[tokio::test(start_paused = true)]
async fn the_breaker_stops_the_session_before_confirming_the_transaction_that_tripped_it() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let (end_b, _) = three_poison_txns(&mut rig);
    let session = rig.session(breaker(BreakerPolicy::Stop), &mapping, &metrics);
    let result = tokio::time::timeout(Duration::from_secs(30), session.run(&rig.shutdown))
        .await
        .expect("the session did not stop");
    assert!(matches!(result, Err(RelayError::Breaker(_))), "{result:?}");
    assert_eq!(result.unwrap_err().exit_code(), 1);
    assert_eq!(
        rig.max_flush(),
        end_b,
        "confirmed up to the last good transaction"
    );
    let dead = rig
        .sent()
        .iter()
        .filter(|s| s.kind == RecordKind::DeadLetter)
        .count();
    assert_eq!(dead, 2, "the third dead letter was sent");
    assert_eq!(
        metrics
            .dead_letter_breaker_trips
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn an_unready_breaker_holds_the_slot_reads_nothing_more_and_stops_cleanly() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let (end_b, _) = three_poison_txns(&mut rig);
    let mut wal = Wal::new();
    let (later, _) = wal.txn(OUTBOX, &[Some(&event_id(10))]);
    let session = rig.session(breaker(BreakerPolicy::Unready), &mapping, &metrics);
    let driver = async {
        rig.until("the breaker holds", |_| {
            metrics
                .dead_letter_breaker_open
                .load(std::sync::atomic::Ordering::Relaxed)
                == 1
        })
        .await;
        let sent = rig.sent().len();
        rig.push(later);
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(rig.sent().len(), sent, "read on while the breaker holds");
        assert!(!rig.log.lock().unwrap().closed, "gave up the slot");
        assert!(metrics.readiness(Duration::from_secs(3600)).is_err());
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    assert_eq!(
        rig.max_flush(),
        end_b,
        "confirmed past the tripping transaction"
    );
}

#[tokio::test(start_paused = true)]
async fn unroutable_row_stops_the_session_under_policy_stop() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    let (good, end_good) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    let (bad, _) = wal.txn(OUTBOX, &[None]);
    rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(good));
    let mut stop = settings();
    stop.dead_letter_policy = DeadLetterPolicy::Stop;
    let session = rig.session(stop, &mapping, &metrics);
    let driver = async {
        rig.until("the good row confirmed", |r| r.last_flush() == end_good)
            .await;
        rig.push(bad);
    };
    let result = rig.run(session, driver).await;
    let err = result.unwrap_err();
    assert!(matches!(err, RelayError::Poison(_)), "{err}");
    assert!(!err.is_transient());
    assert_eq!(rig.max_flush(), end_good, "confirmed past the poison row");
    assert!(rig.sent().iter().all(|s| s.kind == RecordKind::Event));
}

/// Stopping on a poison row still delivers and confirms what came before it.
#[tokio::test(start_paused = true)]
async fn a_stop_lets_earlier_records_be_acknowledged_and_confirmed_first() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (good, end_good) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    let (bad, _) = wal.txn(OUTBOX, &[Some(&event_id(2)), None]);
    let frames = std::iter::once(Wal::relation(OUTBOX, "outbox"));
    rig.push(frames.chain(good).chain(bad));
    let mut stop = settings();
    stop.dead_letter_policy = DeadLetterPolicy::Stop;
    let session = rig.session(stop, &mapping, &metrics);
    let driver = async {
        // The good row and the bad transaction's first row were sent before the poison row.
        rig.until("two records sent", |r| r.sent().len() == 2).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !rig.log.lock().unwrap().closed,
            "stopped with records in flight"
        );
        for record in rig.sent() {
            rig.acks.send(ok(&record)).unwrap();
        }
    };
    let result = rig.run(session, driver).await;
    assert!(matches!(result, Err(RelayError::Poison(_))), "{result:?}");
    assert_eq!(
        rig.last_flush(),
        end_good,
        "the transaction before the poison row is confirmed"
    );
    assert_eq!(rig.sent().len(), 2, "read past the poison row");
}

/// Stopping on a poison row while the records before it are never acknowledged: at the drain
/// deadline (`shutdown_timeout`) the session ends with the poison row's error, not as if it
/// had shut down cleanly, and confirms nothing it did not see acknowledged (cargo mutants:
/// `deadline_reached` returning `Ok(())` went unseen).
#[tokio::test(start_paused = true)]
async fn a_stop_whose_records_are_never_acknowledged_ends_with_its_error_at_the_deadline() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (good, end_good) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    let (bad, _) = wal.txn(OUTBOX, &[Some(&event_id(2)), None]);
    let frames = std::iter::once(Wal::relation(OUTBOX, "outbox"));
    rig.push(frames.chain(good).chain(bad));
    let mut stop = settings();
    stop.dead_letter_policy = DeadLetterPolicy::Stop;
    let shutdown_timeout = stop.shutdown_timeout;
    let session = rig.session(stop, &mapping, &metrics);
    let started = tokio::time::Instant::now();
    let result = rig.ended(session).await;
    assert!(matches!(result, Err(RelayError::Poison(_))), "{result:?}");
    assert!(
        started.elapsed() >= shutdown_timeout,
        "ended {:?} after the start, before the drain deadline",
        started.elapsed()
    );
    assert_eq!(rig.sent().len(), 2, "read past the poison row");
    assert!(
        rig.max_flush() < end_good,
        "confirmed what was not acknowledged"
    );
}

/// A topic refused a whole batch as too large (its `max.message.bytes` is below the
/// producer's `batch.size`): the small records of it are not at fault, so none is
/// dead-lettered and the slot stays before them; the session restarts, and the next producer
/// batches within the limit learned.
#[tokio::test(start_paused = true)]
async fn a_refused_batch_dead_letters_none_of_its_small_records() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    rig.batching(1_000_000);
    let mut wal = Wal::new();
    let (first, end_first) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    let (batch, _) = wal.txn(OUTBOX, &[Some(&event_id(2)), Some(&event_id(3))]);
    rig.push(
        std::iter::once(Wal::relation(OUTBOX, "outbox"))
            .chain(first)
            .chain(batch),
    );
    let session = rig.session(settings(), &mapping, &metrics);
    let driver = async {
        rig.until("three records", |r| r.sent().len() == 3).await;
        let sent = rig.sent();
        rig.acks.send(ok(&sent[0])).unwrap();
        rig.acks
            .send(failed(&sent[1], RDKafkaErrorCode::MessageSizeTooLarge))
            .unwrap();
        rig.acks
            .send(failed(&sent[2], RDKafkaErrorCode::MessageSizeTooLarge))
            .unwrap();
    };
    let result = rig.run(session, driver).await;
    assert!(
        matches!(
            result,
            Err(RelayError::Publish(PublishError::SizeRefused {
                what: "a batch",
                limit: 500_000,
                ..
            }))
        ),
        "{result:?}"
    );
    let dead = rig
        .sent()
        .iter()
        .filter(|s| s.kind == RecordKind::DeadLetter)
        .count();
    assert_eq!(dead, 0, "a healthy record was dead-lettered");
    assert_eq!(
        rig.max_flush(),
        end_first,
        "confirmed past a refused record"
    );
    assert!(RelayError::from(PublishError::SizeRefused {
        topic: String::new(),
        what: "a batch",
        limit: 1
    })
    .is_transient());
}

/// Exactly-once: a size refusal ends the session whatever its cause (the transaction is
/// doomed), but never as a poison record: a record refused alone is remembered, so the next
/// session refuses it before it is sent (and dead-letters it), and batches the others within
/// the limit learned.
#[tokio::test(start_paused = true)]
async fn exactly_once_learns_the_limit_from_a_refused_record_and_restarts() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    rig.batching(64);
    let mut wal = Wal::new();
    let (frames, end) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(frames));
    let eos = exactly_once(Duration::from_secs(3600), 1_000_000);
    let session = rig.session(eos, &mapping, &metrics);
    let driver = async {
        rig.until("the record sent", |r| r.sent().len() == 1).await;
        let sent = rig.sent()[0].clone();
        let mut refused = failed(&sent, RDKafkaErrorCode::MessageSizeTooLarge);
        if let Err(f) = &mut refused.result {
            f.message = f.message.clone().set_payload(Some(vec![b'x'; 100]));
        }
        rig.acks.send(refused).unwrap();
    };
    let result = rig.run(session, driver).await;
    match &result {
        Err(
            e @ RelayError::Publish(PublishError::SizeRefused {
                what: "a record",
                limit,
                ..
            }),
        ) => {
            assert!(e.is_transient());
            assert!(*limit < 100 + event_id(1).len(), "{result:?}");
        }
        other => panic!("{other:?}"),
    }
    assert!(rig.max_flush() < end);
}

/// An event too large for Kafka and for its dead letter (1.2 MB, refused at `send`: payload
/// and row image above what the dead-letter topic and the producer take): the dead letter
/// names its outbox row, which is kept from the sweeper first, and the stream goes on past
/// it — unless the row is gone already (deleted in its transaction), when nothing could bring
/// the event back: then the session stops before confirming past it.
#[tokio::test(start_paused = true)]
async fn an_event_its_dead_letter_cannot_keep_is_named_by_its_kept_row() {
    for gone in [false, true] {
        let (mapping, metrics) = (mapping(), Metrics::default());
        let mut rig = Rig::new(true);
        rig.refuse_at_send(&event_id(2));
        let huge = event_id(2);
        let catalog = &mut rig.ends.as_mut().unwrap().catalog;
        let kept = catalog.1.clone();
        if gone {
            catalog.2.push(huge.clone());
        }
        let mut wal = Wal::new();
        let (first, end_first) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
        let (begin, final_lsn) = wal.begin(1);
        let big = "x".repeat(1_200_000);
        let row = vec![
            text(&huge),
            text("order"),
            text("42"),
            text("Huge"),
            text(&format!("{{\"blob\": \"{big}\"}}")),
        ];
        let (commit, end_huge) = wal.commit(final_lsn);
        let (last, end) = wal.txn(OUTBOX, &[Some(&event_id(3))]);
        rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(first));
        rig.push([begin, fakes::insert(OUTBOX, row), commit]);
        rig.push(last);
        let session = rig.session(settings(), &mapping, &metrics);
        let driver = async {
            if !gone {
                rig.until("confirmed", |r| r.last_flush() == end).await;
                rig.shutdown.cancel();
            }
        };
        let result = rig.run(session, driver).await;
        let sent = rig.sent();
        let dead: Vec<&Sent> = sent
            .iter()
            .filter(|s| s.kind == RecordKind::DeadLetter)
            .collect();
        if gone {
            assert!(
                matches!(result, Err(RelayError::TooLargeToKeep(ref m)) if m.contains("gone")),
                "{result:?}"
            );
            assert!(dead.is_empty(), "a dead letter naming no row was sent");
            assert!(rig.max_flush() >= end_first && rig.max_flush() < end_huge);
            continue;
        }
        result.unwrap();
        assert_eq!(dead.len(), 1, "{sent:?}");
        assert!(dead[0].bytes < 1_000_000, "{} bytes", dead[0].bytes);
        assert_eq!(dead[0].row, None, "the row image is left out");
        let named: serde_json::Value =
            serde_json::from_str(dead[0].outbox_row.as_deref().expect("names its row")).unwrap();
        assert_eq!(
            named,
            serde_json::json!({"table": "public.outbox", "id": huge})
        );
        let kept = kept.lock().unwrap().clone();
        assert_eq!(kept.len(), 1);
        assert_eq!(
            (
                kept[0].table.as_str(),
                kept[0].id_column.as_str(),
                kept[0].id.as_str()
            ),
            ("public.outbox", "id", huge.as_str())
        );
        let events: Vec<&str> = sent
            .iter()
            .filter(|s| s.kind == RecordKind::Event)
            .map(|s| s.event_id.as_str())
            .collect();
        assert_eq!(events, [event_id(1), event_id(3)], "the stream went on");
        assert!(end_huge < end);
    }
}

/// An event too large for Kafka and for its dead letter (payload above what the dead-letter
/// topic and the producer take), refused in a delivery report, when the session no longer
/// has its row to keep and name: dead-lettering it would leave the outbox row as its only
/// copy, which the sweeper deletes. The session stops before confirming past it instead.
#[tokio::test(start_paused = true)]
async fn an_event_its_dead_letter_cannot_keep_stops_the_session() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (first, end_first) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    let (huge, end_huge) = wal.txn(OUTBOX, &[Some(&event_id(2))]);
    rig.push(
        std::iter::once(Wal::relation(OUTBOX, "outbox"))
            .chain(first)
            .chain(huge),
    );
    let session = rig.session(settings(), &mapping, &metrics);
    let driver = async {
        rig.until("two records", |r| r.sent().len() == 2).await;
        let sent = rig.sent();
        rig.acks.send(ok(&sent[0])).unwrap();
        let mut refused = failed(&sent[1], RDKafkaErrorCode::MessageSizeTooLarge);
        if let Err(f) = &mut refused.result {
            let payload = vec![b'x'; crate::sink::limits::DEFAULT_MESSAGE_MAX_BYTES + 1];
            f.message = f.message.clone().set_payload(Some(payload));
        }
        rig.acks.send(refused).unwrap();
    };
    let result = rig.run(session, driver).await;
    assert!(
        matches!(result, Err(RelayError::TooLargeToKeep(_))),
        "{result:?}"
    );
    assert!(!result.as_ref().unwrap_err().is_transient());
    let dead = rig
        .sent()
        .iter()
        .filter(|s| s.kind == RecordKind::DeadLetter)
        .count();
    assert_eq!(dead, 0, "a dead letter without its content was sent");
    assert_eq!(rig.max_flush(), end_first);
    assert!(rig.max_flush() < end_huge);
}

#[tokio::test(start_paused = true)]
async fn refused_record_stops_the_session_under_policy_stop() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (frames, end) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(frames));
    let mut stop = settings();
    stop.dead_letter_policy = DeadLetterPolicy::Stop;
    let session = rig.session(stop, &mapping, &metrics);
    let driver = async {
        rig.until("the record sent", |r| r.sent().len() == 1).await;
        let sent = rig.sent()[0].clone();
        rig.acks
            .send(failed(&sent, RDKafkaErrorCode::MessageSizeTooLarge))
            .unwrap();
    };
    let result = rig.run(session, driver).await;
    assert!(matches!(result, Err(RelayError::Poison(_))), "{result:?}");
    assert!(rig.max_flush() < end);
}

#[tokio::test(start_paused = true)]
async fn unmappable_insert_stops_the_session_without_confirming() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    let (good, end_good) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    let (audit, _) = wal.txn(AUDIT, &[Some(&event_id(2))]);
    rig.push([
        Wal::relation(OUTBOX, "outbox"),
        Wal::relation(AUDIT, "audit"),
    ]);
    rig.push(good);
    let session = rig.session(settings(), &mapping, &metrics);
    let driver = async {
        rig.until("the outbox row confirmed", |r| r.last_flush() == end_good)
            .await;
        rig.push(audit);
        // A keepalive past the insert: confirming it would skip the row.
        rig.push([ReplicationFrame::Keepalive {
            wal_end: Lsn(u64::MAX / 2),
            reply_requested: true,
        }]);
    };
    let result = rig.run(session, driver).await;
    let err = result.unwrap_err();
    assert!(
        matches!(&err, RelayError::Unmapped(u) if u.oid == AUDIT && u.relation == "public.audit" && !u.dropped && u.root.is_none()),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("public.audit")
            && message.contains("ALTER PUBLICATION \"outbox_relay_pub\" DROP TABLE"),
        "{message}"
    );
    assert!(!err.is_transient());
    assert_eq!(err.exit_code(), 1);
    assert_eq!(
        rig.max_flush(),
        end_good,
        "confirmed past the unmapped insert"
    );
    assert_eq!(rig.sent().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_partition_sent_under_its_own_name_is_published_as_its_outbox() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    let (frames, end) = wal.txn(LEAF, &[Some(&event_id(1)), Some(&event_id(2))]);
    rig.push(std::iter::once(Wal::relation(LEAF, "outbox_2026_11")).chain(frames));
    let session = rig.session(settings(), &mapping, &metrics);
    let driver = async {
        rig.until("the partition's rows confirmed", |r| r.last_flush() == end)
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    let sent = rig.sent();
    assert_eq!(sent.len(), 2);
    assert!(sent
        .iter()
        .all(|s| s.kind == RecordKind::Event && s.topic == "outbox.event.order"));
}

/// A partition of a table that is no outbox either: the message names both, so that the
/// operator knows which table the publication really sends.
#[tokio::test(start_paused = true)]
async fn an_insert_from_a_partition_of_another_table_names_its_root() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    let (frames, _) = wal.txn(AUDIT_LEAF, &[Some(&event_id(1))]);
    rig.push(std::iter::once(Wal::relation(AUDIT_LEAF, "audit_2026_11")).chain(frames));
    let session = rig.session(settings(), &mapping, &metrics);
    let err = rig.ended(session).await.unwrap_err();
    assert!(
        matches!(&err, RelayError::Unmapped(u) if u.oid == AUDIT_LEAF
            && u.relation == "public.audit_2026_11"
            && u.root.as_deref() == Some("public.audit")
            && !u.dropped),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("a partition of public.audit, which is not one either"),
        "{err}"
    );
    assert!(rig.sent().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_insert_from_a_dropped_relation_stops_with_its_own_fix() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    let (frames, _) = wal.txn(GONE, &[Some(&event_id(1))]);
    rig.push(std::iter::once(Wal::relation(GONE, "outbox_2025_01")).chain(frames));
    let session = rig.session(settings(), &mapping, &metrics);
    let err = rig.ended(session).await.unwrap_err();
    assert!(
        matches!(&err, RelayError::Unmapped(u) if u.dropped && u.oid == GONE),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("publish_via_partition_root = true"),
        "{err}"
    );
    assert!(rig.sent().is_empty());
}

#[tokio::test(start_paused = true)]
async fn shutdown_finishes_the_open_transaction_and_drains_before_confirming() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (frames, txns) = transactions(&mut wal, 10, &mut rand::rngs::StdRng::seed_from_u64(1));
    rig.push(frames);
    // Half a transaction: BEGIN and one row, its COMMIT still on the way.
    let (begin, final_lsn) = wal.begin(1);
    rig.push([begin, insert(OUTBOX, Some(&event_id(999)))]);
    let session = rig.session(settings(), &mapping, &metrics);
    let total: usize = txns.iter().map(|t| t.1).sum::<usize>() + 1;

    let driver = async {
        rig.until("every record sent", |r| r.sent().len() == total)
            .await;
        rig.shutdown.cancel();
        tokio::time::sleep(Duration::from_millis(10)).await;
        // The rest of the half-read transaction, then one that must not be read any more.
        let (commit, end_open) = wal.commit(final_lsn);
        let (after, _) = wal.txn(OUTBOX, &[Some(&event_id(1000))]);
        rig.push(std::iter::once(commit).chain(after));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !rig.log.lock().unwrap().closed,
            "closed with records in flight"
        );
        for record in rig.sent() {
            rig.acks.send(ok(&record)).unwrap();
        }
        end_open
    };
    let (result, end_open) = tokio::join!(rig.ended(session), driver);
    result.unwrap();
    assert_eq!(
        rig.sent().len(),
        total,
        "read a new transaction while draining"
    );
    assert_eq!(
        rig.last_flush(),
        end_open,
        "the final status confirms every acknowledged commit"
    );
    assert!(rig.log.lock().unwrap().closed);
}

#[tokio::test(start_paused = true)]
async fn shutdown_deadline_confirms_only_what_was_acknowledged() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (first, end_first) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    let (second, _) = wal.txn(OUTBOX, &[Some(&event_id(2))]);
    rig.push(
        std::iter::once(Wal::relation(OUTBOX, "outbox"))
            .chain(first)
            .chain(second),
    );
    let mut short = settings();
    short.shutdown_timeout = Duration::from_millis(50);
    let session = rig.session(short, &mapping, &metrics);
    let driver = async {
        rig.until("both sent", |r| r.sent().len() == 2).await;
        rig.acks.send(ok(&rig.sent()[0])).unwrap();
        rig.shutdown.cancel();
    };
    let started = tokio::time::Instant::now();
    let result = rig.run(session, driver).await;
    result.unwrap();
    // Logical time: the session ends at the deadline, not before and not later.
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(50) && waited < Duration::from_millis(55),
        "ended after {waited:?}"
    );
    assert_eq!(rig.last_flush(), end_first);
}

#[tokio::test(start_paused = true)]
async fn transient_delivery_error_ends_the_session_without_confirming() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (frames, end) = wal.txn(OUTBOX, &[Some(&event_id(1)), Some(&event_id(2))]);
    rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(frames));
    let session = rig.session(settings(), &mapping, &metrics);
    let driver = async {
        rig.until("both sent", |r| r.sent().len() == 2).await;
        let sent = rig.sent();
        rig.acks.send(ok(&sent[0])).unwrap();
        rig.acks
            .send(failed(&sent[1], RDKafkaErrorCode::MessageTimedOut))
            .unwrap();
    };
    let result = rig.run(session, driver).await;
    let err = result.unwrap_err();
    assert!(matches!(err, RelayError::Delivery(_)), "{err}");
    assert!(
        err.is_transient(),
        "a timed-out delivery must restart the session: {err}"
    );
    assert!(rig.max_flush() < end);
    assert!(rig.log.lock().unwrap().closed);
}

#[tokio::test(start_paused = true)]
async fn source_error_ends_the_session_as_transient() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    rig.frames.send(Err(ReplicationError::Closed)).unwrap();
    let session = rig.session(settings(), &mapping, &metrics);
    let err = rig.ended(session).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn acknowledged_commits_are_confirmed_without_waiting_for_the_timer() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    let (frames, end) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(frames));
    let mut coalesced = settings();
    coalesced.confirm_delay = Duration::from_millis(20);
    let session = rig.session(coalesced, &mapping, &metrics);
    let driver = async {
        // The status timer is 60 s: only the confirmation after the ack can get there.
        rig.until("confirmed after the ack", |r| r.last_flush() == end)
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
}

/// Acknowledgements that come within `confirm_delay` of the first are confirmed together, by
/// one status update `confirm_delay` after it (cargo mutants: the update scheduled
/// `confirm_delay` before now, so at once, went unseen).
#[tokio::test(start_paused = true)]
async fn confirmations_within_confirm_delay_go_out_in_one_status_update() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (first, _) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    let (second, end_2) = wal.txn(OUTBOX, &[Some(&event_id(2))]);
    let frames = std::iter::once(Wal::relation(OUTBOX, "outbox"));
    rig.push(frames.chain(first).chain(second));
    let mut coalesced = settings();
    coalesced.confirm_delay = Duration::from_millis(20);
    let session = rig.session(coalesced, &mapping, &metrics);
    let flushes = |rig: &Rig| rig.log.lock().unwrap().flushes.clone();
    let driver = async {
        rig.until("two records sent", |r| r.sent().len() == 2).await;
        let before = flushes(&rig).len();
        let sent = rig.sent();
        rig.acks.send(ok(&sent[0])).unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            flushes(&rig).len(),
            before,
            "a status update before confirm_delay"
        );
        rig.acks.send(ok(&sent[1])).unwrap();
        tokio::time::sleep(Duration::from_millis(15)).await;
        assert_eq!(flushes(&rig)[before..], [end_2], "one update, for both");
        rig.shutdown.cancel();
    };
    rig.run(session, driver).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn empty_transactions_do_not_grow_the_ledger_while_kafka_is_down() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (frames, first_end) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(frames));
    let mut last_end = Lsn::ZERO;
    for _ in 0..10_000 {
        let (empty, end) = wal.txn(OUTBOX, &[]);
        rig.push(empty);
        last_end = end;
    }
    let mut short = settings();
    short.shutdown_timeout = Duration::from_millis(1);
    let session = rig.session(short, &mapping, &metrics);
    let driver = async {
        rig.until("the record sent", |r| r.sent().len() == 1).await;
        // Let the session read every empty transaction behind the unacknowledged one.
        rig.push([ReplicationFrame::Keepalive {
            wal_end: last_end,
            reply_requested: true,
        }]);
        rig.until("the keepalive answered", |r| {
            r.log.lock().unwrap().flushes.len() >= 2
        })
        .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    let held = metrics
        .ledger_transactions
        .load(std::sync::atomic::Ordering::Relaxed);
    assert!(held <= 1, "the ledger holds {held} transactions");
    assert!(
        rig.max_flush() < first_end,
        "confirmed past the unacknowledged record"
    );
}

// ---------------------------------------------------------------------------------------
// Exactly-once.

fn fenced() -> PublishError {
    PublishError::Transaction {
        what: "commit",
        error: KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced),
    }
}

#[tokio::test(start_paused = true)]
async fn kafka_transactions_end_only_at_postgres_commits() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let (frames, txns) = transactions(&mut wal, 80, &mut rng);
    let total: usize = txns.iter().map(|t| t.1).sum();
    // Three records per Kafka transaction at most, but PostgreSQL transactions hold up to 4:
    // the boundary must still fall between them.
    let session = rig.session(exactly_once(Duration::from_secs(60), 3), &mapping, &metrics);
    // Frames arrive in small bursts, so that commits come from the record cap mid-stream.
    let driver = async {
        for chunk in frames.chunks(7) {
            rig.push(chunk.to_vec());
            while let Ok((_, answer)) = commits.try_recv() {
                answer.send(Ok(())).unwrap();
            }
            tokio::time::sleep(Duration::from_micros(300)).await;
        }
        let last = txns.last().unwrap().0;
        while rig.last_flush() != last {
            if let Ok((_, answer)) = commits.try_recv() {
                answer.send(Ok(())).unwrap();
            }
            if rig.sent().len() == total && !rig.shutdown.is_cancelled() {
                // The last transaction is younger than max_age: shutdown commits it.
                rig.shutdown.cancel();
            }
            tokio::time::sleep(Duration::from_micros(300)).await;
        }
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    // Records sent before each commit: exactly those of whole PostgreSQL transactions.
    let boundaries: Vec<(Lsn, usize)> = txns
        .iter()
        .scan(0, |n, &(end, rows)| {
            *n += rows;
            Some((end, *n))
        })
        .collect();
    let ops = rig.kafka_ops();
    let commits: Vec<_> = ops
        .iter()
        .filter_map(|op| match op {
            KafkaOp::Commit { end, sent } => Some((*end, *sent)),
            KafkaOp::Begin | KafkaOp::Abort | KafkaOp::Split { .. } => None,
        })
        .collect();
    assert!(commits.len() > 10, "only {} commits", commits.len());
    for (end, sent) in &commits {
        assert!(
            boundaries.contains(&(*end, *sent)),
            "a commit at {end} after {sent} records is not at a PostgreSQL boundary"
        );
    }
    assert_eq!(commits.last().unwrap().1, total);
    assert_eq!(
        ops.iter().filter(|op| **op == KafkaOp::Begin).count(),
        commits.len(),
        "one begin per commit"
    );
    assert_eq!(
        metrics
            .kafka_transactions_committed
            .load(std::sync::atomic::Ordering::Relaxed),
        commits.len() as u64
    );
}

#[tokio::test(start_paused = true)]
async fn nothing_is_confirmed_before_the_kafka_commit() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let mut frames = vec![Wal::relation(OUTBOX, "outbox")];
    let mut ends = Vec::new();
    for n in 0..3 {
        let (f, end) = wal.txn(
            OUTBOX,
            &[Some(&event_id(2 * n)), Some(&event_id(2 * n + 1))],
        );
        frames.extend(f);
        ends.push(end);
    }
    rig.push(frames);
    let session = rig.session(
        exactly_once(Duration::from_millis(30), 1000),
        &mapping,
        &metrics,
    );
    let driver = async {
        rig.until("every record sent", |r| r.sent().len() == 6)
            .await;
        for record in rig.sent() {
            rig.acks.send(ok(&record)).unwrap();
        }
        // Acknowledged, but not committed: nothing may be confirmed.
        let (end, answer) = next_commit(&mut commits).await;
        assert_eq!(
            end, ends[2],
            "the commit carries the last transaction's end"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            rig.max_flush() < ends[0],
            "confirmed {} before the kafka commit",
            rig.max_flush()
        );
        answer.send(Ok(())).unwrap();
        rig.until("confirmed after the commit", |r| r.last_flush() == ends[2])
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
}

#[tokio::test(start_paused = true)]
async fn reports_arriving_after_the_commit_are_confirmed_then() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let mut frames = vec![Wal::relation(OUTBOX, "outbox")];
    let (f, end) = wal.txn(OUTBOX, &[Some(&event_id(0)), Some(&event_id(1))]);
    frames.extend(f);
    rig.push(frames);
    let session = rig.session(
        exactly_once(Duration::from_millis(5), 1000),
        &mapping,
        &metrics,
    );
    let driver = async {
        let (_, answer) = next_commit(&mut commits).await;
        answer.send(Ok(())).unwrap();
        let sent = rig.sent();
        rig.acks.send(ok(&sent[0])).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(rig.max_flush() < end, "confirmed with a report missing");
        rig.acks.send(ok(&sent[1])).unwrap();
        rig.until("confirmed with every report", |r| r.last_flush() == end)
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_commit_waits_for_the_open_postgres_transaction() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let (begin, final_lsn) = wal.begin(3);
    rig.push([Wal::relation(OUTBOX, "outbox"), begin]);
    rig.push((0..3).map(|n| insert(OUTBOX, Some(&event_id(n)))));
    // One record is enough for a commit, and 1 ms old: but the transaction is open.
    let session = rig.session(
        exactly_once(Duration::from_millis(1), 1),
        &mapping,
        &metrics,
    );
    let driver = async {
        rig.until("the open transaction's records sent", |r| {
            r.sent().len() == 3
        })
        .await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            commits.try_recv().is_err(),
            "committed in the middle of a PostgreSQL transaction"
        );
        let (commit, end) = wal.commit(final_lsn);
        rig.push([commit]);
        rig.confirm_commit(next_commit(&mut commits).await, end)
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    assert_eq!(
        rig.kafka_ops(),
        [
            KafkaOp::Begin,
            KafkaOp::Commit {
                end: Lsn(0x1000 + 0x310 + 0x30),
                sent: 3
            }
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn records_read_while_a_commit_runs_go_into_the_next_kafka_transaction() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let (first, end_a) = wal.txn(OUTBOX, &[Some(&event_id(0)), Some(&event_id(1))]);
    rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(first));
    let session = rig.session(
        exactly_once(Duration::from_millis(1), 1000),
        &mapping,
        &metrics,
    );
    let driver = async {
        let (at, answer) = next_commit(&mut commits).await;
        assert_eq!(at, end_a);
        // The commit runs; the next transaction arrives meanwhile.
        let (second, end_b) = wal.txn(OUTBOX, &[Some(&event_id(2)), Some(&event_id(3))]);
        rig.read_all(second).await;
        assert_eq!(rig.sent().len(), 2, "a record was sent while a commit ran");
        answer.send(Ok(())).unwrap();
        // The held transaction's end is the next progress value.
        rig.confirm_commit(next_commit(&mut commits).await, end_b)
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    assert_eq!(
        rig.kafka_ops(),
        [
            KafkaOp::Begin,
            KafkaOp::Commit {
                end: end_a,
                sent: 2
            },
            KafkaOp::Begin,
            KafkaOp::Commit {
                end: rig.last_flush(),
                sent: 4
            },
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn a_trickle_is_committed_early_and_a_backlog_in_one_transaction() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    // A backlog: every frame is waiting before the session starts.
    let (frames, txns) = transactions(&mut wal, 50, &mut rng);
    let total: usize = txns.iter().map(|t| t.1).sum();
    rig.push(frames);
    // max_age is far away: only the early commit can end a transaction within the test.
    let session = rig.session(
        exactly_once_early(Duration::from_secs(60), Duration::ZERO, 100_000),
        &mapping,
        &metrics,
    );
    let driver = async {
        let (at, answer) = next_commit(&mut commits).await;
        assert_eq!(at, txns.last().unwrap().0, "the backlog was split");
        answer.send(Ok(())).unwrap();
        // A trickle: one transaction and then nothing.
        let (single, end) = wal.txn(OUTBOX, &[Some(&event_id(total))]);
        rig.push(single);
        let request = tokio::time::timeout(Duration::from_secs(2), commits.recv())
            .await
            .expect("no early commit of a lone transaction")
            .unwrap();
        rig.confirm_commit(request, end).await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    assert_eq!(
        rig.kafka_ops(),
        [
            KafkaOp::Begin,
            KafkaOp::Commit {
                end: txns.last().unwrap().0,
                sent: total
            },
            KafkaOp::Begin,
            KafkaOp::Commit {
                end: rig.last_flush(),
                sent: total + 1
            },
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn adaptive_batching_has_a_lone_record_skip_the_linger_and_no_other() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    let (first, _) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(first));
    let settings = Settings {
        adaptive: true,
        ..settings()
    };
    let session = rig.session(settings, &mapping, &metrics);
    let driver = async {
        rig.until("the lone record sent", |r| r.sent().len() == 1)
            .await;
        assert_eq!(rig.skips(), 1, "the lone record waits for the linger");
        // Sent behind one in flight: they batch with it, as librdkafka lingers.
        let (second, end_second) = wal.txn(OUTBOX, &[Some(&event_id(1)), Some(&event_id(2))]);
        rig.read_all(second).await;
        assert_eq!(rig.sent().len(), 3);
        assert_eq!(rig.skips(), 1, "a record behind others skipped the linger");
        for sent in rig.sent() {
            rig.acks.send(ok(&sent)).unwrap();
        }
        rig.until("all acknowledged", |r| r.last_flush() == end_second)
            .await;
        let (third, end) = wal.txn(OUTBOX, &[Some(&event_id(3))]);
        rig.read_all(third).await;
        assert_eq!(
            rig.skips(),
            2,
            "alone again once the others were acknowledged"
        );
        rig.acks.send(ok(&rig.sent()[3])).unwrap();
        rig.until("confirmed", |r| r.last_flush() == end).await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
}

#[tokio::test(start_paused = true)]
async fn linger_batching_never_skips_the_linger() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    let (first, end) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(first));
    let session = rig.session(settings(), &mapping, &metrics);
    let driver = async {
        rig.until("confirmed", |r| r.last_flush() == end).await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    assert_eq!(rig.skips(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_failed_kafka_commit_ends_the_session_without_confirming() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let mut frames = vec![Wal::relation(OUTBOX, "outbox")];
    let (f, end) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    frames.extend(f);
    rig.push(frames);
    let session = rig.session(
        exactly_once(Duration::from_millis(1), 1000),
        &mapping,
        &metrics,
    );
    let driver = async {
        let (_, answer) = next_commit(&mut commits).await;
        answer.send(Err(fenced())).unwrap();
    };
    let result = rig.run(session, driver).await;
    let error = result.expect_err("a failed commit must end the session");
    assert!(error.is_transient(), "{error}");
    assert!(rig.max_flush() < end, "confirmed an aborted transaction");
    assert!(
        matches!(rig.kafka_ops().last(), Some(KafkaOp::Abort)),
        "the failed transaction was not aborted: {:?}",
        rig.kafka_ops()
    );
    assert!(rig.log.lock().unwrap().closed);
    assert_eq!(
        metrics
            .kafka_transactions_aborted
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn transactions_below_the_progress_record_are_skipped_and_confirmed() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let mut frames = vec![Wal::relation(OUTBOX, "outbox")];
    let mut ends = Vec::new();
    for n in 0..5 {
        let (f, end) = wal.txn(OUTBOX, &[Some(&event_id(n))]);
        frames.extend(f);
        ends.push(end);
    }
    rig.push(frames);
    // Kafka holds the first three (the progress record says the third's end).
    let session = rig
        .session(
            exactly_once(Duration::from_millis(1), 1000),
            &mapping,
            &metrics,
        )
        .skipping_below(Some(Progress::whole(ends[2])));
    let driver = async {
        loop {
            tokio::select! {
                Some((_, answer)) = commits.recv() => answer.send(Ok(())).unwrap(),
                _ = tokio::time::sleep(Duration::from_millis(1)) => {}
            }
            if rig.last_flush() == ends[4] {
                break;
            }
        }
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    let ids: Vec<String> = rig.sent().into_iter().map(|s| s.event_id).collect();
    assert_eq!(
        ids,
        [event_id(3), event_id(4)],
        "published again what Kafka holds"
    );
    assert_eq!(
        metrics
            .transactions_skipped
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

#[tokio::test(start_paused = true)]
async fn a_session_ending_with_an_open_kafka_transaction_aborts_it_unconfirmed() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    let mut frames = vec![Wal::relation(OUTBOX, "outbox")];
    let (f, end) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    frames.extend(f);
    rig.push(frames);
    // The connection drops while the Kafka transaction is young (not due yet).
    rig.frames.send(Err(ReplicationError::Closed)).unwrap();
    let session = rig.session(
        exactly_once(Duration::from_secs(60), 1000),
        &mapping,
        &metrics,
    );
    let err = rig.ended(session).await.unwrap_err();
    assert!(err.is_transient(), "{err}");
    assert_eq!(rig.kafka_ops(), [KafkaOp::Begin, KafkaOp::Abort]);
    assert!(rig.max_flush() < end, "confirmed an aborted transaction");
}

#[tokio::test(start_paused = true)]
async fn a_session_ending_while_a_kafka_commit_runs_aborts_it() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let mut frames = vec![Wal::relation(OUTBOX, "outbox")];
    let (f, end) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    frames.extend(f);
    rig.push(frames);
    let session = rig.session(
        exactly_once(Duration::from_millis(1), 1000),
        &mapping,
        &metrics,
    );
    let frames = rig.frames.clone();
    let driver = async {
        // The commit starts and never answers; then the connection drops.
        let (_, answer) = next_commit(&mut commits).await;
        frames.send(Err(ReplicationError::Closed)).unwrap();
        answer
    };
    let (result, _unanswered) = tokio::join!(rig.ended(session), driver);
    assert!(result.unwrap_err().is_transient());
    let ops = rig.kafka_ops();
    assert!(
        matches!(
            ops[..],
            [KafkaOp::Begin, KafkaOp::Commit { .. }, KafkaOp::Abort]
        ),
        "{ops:?}"
    );
    assert!(rig.max_flush() < end, "confirmed an unfinished commit");
}

#[tokio::test(start_paused = true)]
async fn a_postgres_transaction_older_than_split_after_is_split_across_kafka_transactions() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let (begin, final_lsn) = wal.begin(5);
    rig.push([Wal::relation(OUTBOX, "outbox"), begin]);
    rig.push((0..2).map(|n| insert(OUTBOX, Some(&event_id(n)))));
    let session = rig.session(
        exactly_once_split(Duration::from_millis(30)),
        &mapping,
        &metrics,
    );
    let driver = async {
        // The first two records commit in the middle, with a partial progress value.
        let (at, answer) = tokio::time::timeout(Duration::from_secs(5), commits.recv())
            .await
            .expect("no commit inside the PostgreSQL transaction")
            .unwrap();
        assert_eq!(at, final_lsn);
        answer.send(Ok(())).unwrap();
        rig.push((2..5).map(|n| insert(OUTBOX, Some(&event_id(n)))));
        let (commit, end) = wal.commit(final_lsn);
        rig.push([commit]);
        rig.confirm_commit(next_commit(&mut commits).await, end)
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    let ops = rig.kafka_ops();
    assert_eq!(
        ops[..2],
        [
            KafkaOp::Begin,
            KafkaOp::Split {
                final_lsn,
                records: 2,
                sent: 2
            }
        ],
        "{ops:?}"
    );
    assert!(
        matches!(ops[2..], [KafkaOp::Begin, KafkaOp::Commit { sent: 5, .. }]),
        "{ops:?}"
    );
}

/// Records held while a Kafka commit runs count in flight once: when held, not again (nor
/// settled) when they are sent after it; only their acknowledgements settle them. Counted
/// short, the window would let more than `max_in_flight_messages` out.
#[tokio::test(start_paused = true)]
async fn held_records_count_in_flight_once() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let (begin, _) = wal.begin(4);
    rig.push([Wal::relation(OUTBOX, "outbox"), begin]);
    rig.push((0..2).map(|n| insert(OUTBOX, Some(&event_id(n)))));
    let session = rig.session(
        exactly_once_split(Duration::from_millis(30)),
        &mapping,
        &metrics,
    );
    let in_flight = || {
        metrics
            .records_in_flight
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let driver = async {
        let (_, answer) = next_commit(&mut commits).await;
        for record in rig.sent() {
            rig.acks.send(ok(&record)).unwrap();
        }
        rig.read_all((2..4).map(|n| insert(OUTBOX, Some(&event_id(n)))).collect())
            .await;
        answer.send(Ok(())).unwrap();
        rig.until("the held records sent", |r| r.sent().len() == 4)
            .await;
        // The next status update sets the gauge: the two sent after the commit, unanswered.
        tokio::time::sleep(Duration::from_secs(61)).await;
        assert_eq!(in_flight(), 2, "records in flight");
        rig.shutdown.cancel();
    };
    // How the session ends with two records never answered is another test's.
    let _ = rig.run(session, driver).await;
}

/// A held event Kafka refuses at once is dead-lettered when sent after the commit; the dead
/// letter stands in for it, so the next split's progress counts that event once (counting it
/// twice would have a restart skip an event Kafka does not have).
#[tokio::test(start_paused = true)]
async fn a_dead_letter_for_a_held_record_counts_once_in_the_split_progress() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    rig.refuse_at_send(&event_id(2));
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let (begin, final_lsn) = wal.begin(4);
    rig.push([Wal::relation(OUTBOX, "outbox"), begin]);
    rig.push((0..2).map(|n| insert(OUTBOX, Some(&event_id(n)))));
    let session = rig.session(
        exactly_once_split(Duration::from_millis(30)),
        &mapping,
        &metrics,
    );
    let driver = async {
        let (_, answer) = next_commit(&mut commits).await;
        // Read while the split commit runs: held, then sent in the next Kafka transaction.
        rig.read_all((2..4).map(|n| insert(OUTBOX, Some(&event_id(n)))).collect())
            .await;
        answer.send(Ok(())).unwrap();
        let (_, answer) = next_commit(&mut commits).await;
        answer.send(Ok(())).unwrap();
        let (commit, end) = wal.commit(final_lsn);
        rig.push([commit]);
        rig.until("confirmed", |r| r.last_flush() == end).await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    let dead = rig
        .sent()
        .into_iter()
        .find(|s| s.kind == RecordKind::DeadLetter);
    let row = dead
        .and_then(|d| d.row)
        .expect("the dead letter carries the row image");
    let image: serde_json::Value = serde_json::from_str(&row).unwrap();
    assert_eq!(
        image["columns"]["id"],
        event_id(2),
        "the held row travelled with it"
    );
    let kinds: Vec<(String, RecordKind)> = rig
        .sent()
        .into_iter()
        .map(|s| (s.event_id, s.kind))
        .collect();
    assert_eq!(
        kinds,
        [
            (event_id(0), RecordKind::Event),
            (event_id(1), RecordKind::Event),
            (event_id(2), RecordKind::DeadLetter),
            (event_id(3), RecordKind::Event),
        ]
    );
    let splits: Vec<u64> = rig
        .kafka_ops()
        .into_iter()
        .filter_map(|op| match op {
            KafkaOp::Split { records, .. } => Some(records),
            _ => None,
        })
        .collect();
    assert_eq!(splits, [2, 4], "the split progress values");
}

#[tokio::test(start_paused = true)]
async fn a_split_transaction_resumes_after_the_records_kafka_has() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let mut frames = vec![Wal::relation(OUTBOX, "outbox")];
    let (f, first_end) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    frames.extend(f);
    let ids: Vec<String> = (1..6).map(event_id).collect();
    let ids: Vec<Option<&str>> = ids.iter().map(|s| Some(s.as_str())).collect();
    let (f, end) = wal.txn(OUTBOX, &ids);
    let final_lsn = Lsn(end.0 - 0x30);
    frames.extend(f);
    rig.push(frames);
    // Kafka has the first transaction and the first two records of the second.
    let session = rig
        .session(
            exactly_once(Duration::from_millis(1), 1000),
            &mapping,
            &metrics,
        )
        .skipping_below(Some(Progress::partial(final_lsn, 2, None)));
    let driver = async {
        rig.confirm_commit(next_commit(&mut commits).await, end)
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    assert!(first_end < final_lsn);
    let sent: Vec<String> = rig.sent().into_iter().map(|s| s.event_id).collect();
    assert_eq!(sent, [event_id(3), event_id(4), event_id(5)]);
    assert_eq!(rig.last_flush(), end);
}

/// The split progress counts the transaction's changes, not the records they made: here the
/// relay that wrote it mapped a logical message to a record (first 2 = the first row and the
/// message), and the restarted one ignores that prefix. Counted in records, it would skip the
/// first two rows and lose the second.
#[tokio::test(start_paused = true)]
async fn a_split_transaction_resumes_after_its_changes_in_kafka_whatever_the_mapping_makes_of_them()
{
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let (begin, final_lsn) = wal.begin(4);
    let message = fakes::frame(LogicalMessage::Message(crate::source::pgoutput::Message {
        transactional: true,
        lsn: Lsn(final_lsn.0 - 0x200),
        prefix: "outbox".into(),
        content: Bytes::from_static(b"{}"),
    }));
    let (commit, end) = wal.commit(final_lsn);
    rig.push([
        Wal::relation(OUTBOX, "outbox"),
        begin,
        insert(OUTBOX, Some(&event_id(1))),
        message,
        insert(OUTBOX, Some(&event_id(2))),
        insert(OUTBOX, Some(&event_id(3))),
        commit,
    ]);
    let session = rig
        .session(
            exactly_once(Duration::from_millis(1), 1000),
            &mapping,
            &metrics,
        )
        .skipping_below(Some(Progress::partial(final_lsn, 2, None)));
    let driver = async {
        rig.confirm_commit(next_commit(&mut commits).await, end)
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    let sent: Vec<String> = rig.sent().into_iter().map(|s| s.event_id).collect();
    assert_eq!(sent, [event_id(2), event_id(3)]);
    assert_eq!(rig.last_flush(), end);
}

#[test]
fn fake_wal_is_well_formed() {
    let mut wal = Wal::new();
    let (frames, end) = wal.txn(OUTBOX, &[Some("a"), Some("b")]);
    assert_eq!(frames.len(), 4);
    let (_, end2) = wal.txn(OUTBOX, &[]);
    assert!(end2 > end);
}

/// `[outbox.serialization]` with a registry that does not answer: the record waits, nothing
/// is sent or confirmed past it, status updates go on (the walsender hears from the relay),
/// the block shows; shutdown gives the waiting record up (at-least-once: it is read again
/// after the restart, its transaction unconfirmed) and the session ends cleanly.
#[tokio::test(start_paused = true)]
async fn a_registry_that_gives_no_schema_blocks_the_record_and_confirms_nothing_past_it() {
    use crate::config::{SerializationConfig, SerializationFormat};
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (txn, end) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    rig.push(txn);
    let serializer = crate::sink::schema::Serializer::new(&SerializationConfig {
        format: SerializationFormat::Avro,
        registry_url: "http://127.0.0.1:1".into(),
        request_timeout_ms: 100,
        ..SerializationConfig::default()
    })
    .unwrap()
    .unwrap();
    let health = serializer.health();
    let settings = Settings {
        serializers: crate::sink::schema::Serializers::single(serializer),
        status_interval: Duration::from_secs(1),
        ..settings()
    };
    let session = rig.session(settings, &mapping, &metrics);
    let driver = async {
        rig.until("blocked", |_| health.readiness().is_err()).await;
        let updates = rig.log.lock().unwrap().flushes.len();
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert!(
            rig.sent().is_empty(),
            "sent while the registry gave no schema"
        );
        assert!(rig.max_flush() < end, "confirmed past the waiting record");
        assert!(
            rig.log.lock().unwrap().flushes.len() > updates,
            "no status update while blocked"
        );
        let why = health.readiness().unwrap_err();
        assert!(why.contains("outbox.event.order-value"), "{why}");
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    assert!(
        rig.sent().is_empty(),
        "sent while the registry gave no schema"
    );
    assert!(rig.max_flush() < end, "confirmed past the given-up record");
}

/// Exactly-once, while an event waits for the registry, the session's one loop goes on
/// serving its other arms: PostgreSQL hears from the relay every status interval (not only
/// after each back-off pause, which grows to 10 s), nothing after the event is read (a Kafka
/// commit would put it below the progress value), and a shutdown ends the session at once
/// instead of at the next retry.
#[tokio::test(start_paused = true)]
async fn while_an_event_waits_for_the_registry_status_updates_flow_and_shutdown_is_prompt() {
    use crate::config::{SerializationConfig, SerializationFormat};
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (first, _) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    let (second, _) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    rig.push(first.into_iter().chain(second));
    let serializer = crate::sink::schema::Serializer::new(&SerializationConfig {
        format: SerializationFormat::Avro,
        registry_url: "http://127.0.0.1:1".into(),
        request_timeout_ms: 100,
        ..SerializationConfig::default()
    })
    .unwrap()
    .unwrap();
    let health = serializer.health();
    let status_interval = Duration::from_secs(1);
    let settings = Settings {
        serializers: crate::sink::schema::Serializers::single(serializer),
        status_interval,
        ..exactly_once(Duration::from_millis(100), 1_000)
    };
    let session = rig.session(settings, &mapping, &metrics);
    let run = async {
        let result = rig.ended(session).await;
        (result, tokio::time::Instant::now())
    };
    let driver = async {
        rig.until("blocked", |_| health.readiness().is_err()).await;
        // Long enough for the back-off to reach its 10 s pause.
        tokio::time::sleep(Duration::from_secs(40)).await;
        let updates = rig.log.lock().unwrap().flushes.len();
        tokio::time::sleep(status_interval * 9).await;
        let log = rig.log.lock().unwrap();
        assert!(
            log.flushes.len() - updates >= 8,
            "{} status updates in 9 status intervals while waiting",
            log.flushes.len() - updates
        );
        assert_eq!(
            log.frames_read, 3,
            "read past the event waiting for the registry"
        );
        drop(log);
        assert!(
            rig.sent().is_empty(),
            "sent while the registry gave no schema"
        );
        rig.shutdown.cancel();
        tokio::time::Instant::now()
    };
    let ((result, ended), cancelled) = tokio::join!(run, driver);
    assert!(
        matches!(&result, Err(RelayError::SchemaRegistry(_))),
        "{result:?}"
    );
    assert!(
        ended - cancelled < Duration::from_secs(1),
        "the session ended {:?} after shutdown",
        ended - cancelled
    );
}

/// A registry that knows the subjects in `present`; any schema it gives accepts every
/// payload.
#[derive(Debug, Default)]
struct Subjects {
    present: Mutex<std::collections::HashSet<String>>,
    /// How long each answer takes.
    delay: Mutex<Duration>,
    /// How long the answers for these subjects take instead.
    slow: Mutex<std::collections::HashMap<String, Duration>>,
    /// Requests for a subject it did not know.
    missed: std::sync::atomic::AtomicUsize,
}
impl SchemaRegistry for Subjects {
    fn version<'a>(
        &'a self,
        subject: &'a str,
        _: SchemaVersion,
    ) -> BoxFuture<'a, Result<Registered, RegistryError>> {
        let known = self.present.lock().unwrap().contains(subject);
        if !known {
            self.missed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let slow = self.slow.lock().unwrap().get(subject).copied();
        let delay = slow.unwrap_or(*self.delay.lock().unwrap());
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            if !known {
                return Err(RegistryError::NotFound {
                    what: format!("subject `{subject}`"),
                    body: "Subject not found".into(),
                    code: Some(40401),
                });
            }
            Ok(Registered {
                id: 7,
                schema: "{}".into(),
                schema_type: Some("JSON".into()),
            })
        })
    }
    fn by_id(&self, _: u32) -> BoxFuture<'_, Result<Registered, RegistryError>> {
        unreachable!("the serializer asks by subject")
    }
    fn register<'a>(
        &'a self,
        _: &'a str,
        _: &'a str,
        _: &'a str,
    ) -> BoxFuture<'a, Result<u32, RegistryError>> {
        unreachable!("auto_register is off")
    }
    fn subjects(&self) -> BoxFuture<'_, Result<Vec<String>, RegistryError>> {
        unreachable!("only check lists subjects")
    }
}

impl Subjects {
    /// Session settings serializing with JSON Schema against this registry
    /// (`auto_register` off), and the registry's health (what `/readyz` reads).
    fn settings(self: &Arc<Self>) -> (Settings, Arc<crate::sink::schema::RegistryHealth>) {
        use crate::config::{SerializationConfig, SerializationFormat};
        use crate::sink::schema::{RegistryHealth, Serializer, Serializers, MAX_STALE};
        let config = SerializationConfig {
            format: SerializationFormat::JsonSchema,
            registry_url: "http://registry".into(),
            ..SerializationConfig::default()
        };
        let health = Arc::new(RegistryHealth::new(&config.registry_url));
        let serializer = Serializer::with_registry(
            &config,
            "outbox.serialization",
            health.clone(),
            self.clone(),
            MAX_STALE,
        );
        let settings = Settings {
            serializers: Serializers::single(serializer),
            ..settings()
        };
        (settings, health)
    }
}

/// A transaction of one event of aggregate type `payment` (topic `outbox.event.payment`).
fn payment(wal: &mut Wal, n: usize) -> (Vec<ReplicationFrame>, Lsn) {
    let (begin, final_lsn) = wal.begin(1);
    let row = fakes::insert(
        OUTBOX,
        vec![
            text(&event_id(n)),
            text("payment"),
            text("7"),
            text("PaymentMade"),
            text("{\"n\": 1}"),
        ],
    );
    let (commit, end) = wal.commit(final_lsn);
    (vec![begin, row, commit], end)
}

/// At-least-once, a subject missing for one topic (`auto_register` off) holds only that
/// topic: its events wait in order, the other topic's events are sent and acknowledged
/// meanwhile, the slot stays below the first waiting event (and /readyz names the subject);
/// once the subject is registered the waiting events go, oldest first, and the slot moves on.
#[tokio::test(start_paused = true)]
async fn a_subject_missing_for_one_topic_holds_only_that_topic() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (order_0, end_0) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    let (payment_1, _) = payment(&mut wal, 1);
    let (order_2, _) = wal.txn(OUTBOX, &[Some(&event_id(2))]);
    let (payment_3, end_3) = payment(&mut wal, 3);
    for frames in [order_0, payment_1, order_2, payment_3] {
        rig.push(frames);
    }
    let registry = Arc::new(Subjects::default());
    registry
        .present
        .lock()
        .unwrap()
        .insert("outbox.event.payment-value".into());
    let (settings, health) = registry.settings();
    let session = rig.session(settings, &mapping, &metrics);
    let topics = |rig: &Rig| -> Vec<(String, String)> {
        rig.sent()
            .iter()
            .map(|s| (s.topic.clone(), s.event_id.clone()))
            .collect()
    };
    let driver = async {
        rig.until("the other topic's events sent", |r| r.sent().len() == 2)
            .await;
        let asked = registry.missed.load(std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(60)).await;
        // Retried with back-off: 200 ms doubling to 10 s is at most 11 tries in 60 s.
        let retries = registry.missed.load(std::sync::atomic::Ordering::Relaxed) - asked;
        assert!((1..=11).contains(&retries), "{retries} tries in 60 s");
        let payments = [event_id(1), event_id(3)].map(|id| ("outbox.event.payment".into(), id));
        assert_eq!(
            topics(&rig),
            payments.to_vec(),
            "only the other topic's events"
        );
        assert!(rig.max_flush() < end_0, "confirmed past the waiting event");
        let why = health.readiness().unwrap_err();
        assert!(why.contains("outbox.event.order-value"), "{why}");
        registry
            .present
            .lock()
            .unwrap()
            .insert("outbox.event.order-value".into());
        // The next try comes within the back-off's longest pause.
        tokio::time::sleep(super::serialize::MAX_BACKOFF).await;
        rig.until("every event confirmed", |r| r.last_flush() == end_3)
            .await;
        rig.shutdown.cancel();
    };
    rig.run(session, driver).await.unwrap();
    let orders: Vec<_> = topics(&rig)
        .into_iter()
        .filter(|(topic, _)| topic == "outbox.event.order")
        .map(|(_, id)| id)
        .collect();
    assert_eq!(
        orders,
        [event_id(0), event_id(2)],
        "the waiting topic's events, in order"
    );
    assert!(health.readiness().is_ok(), "still blocked once registered");
}

/// A registry silent for one subject holds only its topic: while the request for the
/// `order` subject waits (120 s, as a silent registry keeps one up to `request_timeout_ms`),
/// the `payment` events read after it are sent and acknowledged, and the slot is confirmed
/// up to them — never past the waiting event; once the registry answers, the waiting topic's
/// events go, in order, and the slot moves on. Before the registry request was an arm of the
/// loop, it was awaited in a loop of its own that read no frame: nothing behind the waiting
/// event went out for 120 s.
#[tokio::test(start_paused = true)]
async fn a_registry_silent_for_one_subject_holds_only_its_topic() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (payment_0, end_0) = payment(&mut wal, 0);
    let (order_1, end_1) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    let (payment_2, _) = payment(&mut wal, 2);
    let (order_3, _) = wal.txn(OUTBOX, &[Some(&event_id(3))]);
    let (payment_4, end_4) = payment(&mut wal, 4);
    for frames in [payment_0, order_1, payment_2, order_3, payment_4] {
        rig.push(frames);
    }
    let registry = Arc::new(Subjects::default());
    for subject in ["outbox.event.payment-value", "outbox.event.order-value"] {
        registry.present.lock().unwrap().insert(subject.into());
    }
    let silent = Duration::from_secs(120);
    registry
        .slow
        .lock()
        .unwrap()
        .insert("outbox.event.order-value".into(), silent);
    let (settings, _) = registry.settings();
    let session = rig.session(settings, &mapping, &metrics);
    let ids = |rig: &Rig, topic: &str| -> Vec<String> {
        rig.sent()
            .iter()
            .filter(|s| s.topic == topic)
            .map(|s| s.event_id.clone())
            .collect()
    };
    let driver = async {
        let started = tokio::time::Instant::now();
        rig.until("the other topic's events sent", |r| {
            ids(r, "outbox.event.payment").len() == 3
        })
        .await;
        rig.until("the other topic's first event confirmed", |r| {
            r.max_flush() >= end_0
        })
        .await;
        assert!(
            started.elapsed() < silent,
            "the other topic waited for the silent subject's request"
        );
        assert!(
            ids(&rig, "outbox.event.order").is_empty(),
            "sent without a schema"
        );
        assert!(rig.max_flush() < end_1, "confirmed past the waiting event");
        tokio::time::sleep(silent).await;
        rig.until("every event confirmed", |r| r.last_flush() == end_4)
            .await;
        rig.shutdown.cancel();
    };
    rig.run(session, driver).await.unwrap();
    assert_eq!(
        ids(&rig, "outbox.event.order"),
        [event_id(1), event_id(3)],
        "the waiting topic's events, in order"
    );
}

/// A delivery report that ends the session ends it while a registry request is under way:
/// here the report of a record sent before (a delivery timeout) arrives while the next
/// event's request waits on a slow registry (120 s). Waiting for the request first would
/// leave librdkafka that long to write the partition's later records past the failed one (an
/// idempotent producer goes on after an epoch bump): a gap in per-aggregate order that the
/// simulation found (seed 162,567, once `latest` refreshes made registry waits mid-stream).
/// The first event's schema comes at once, the next event's request is the slow one (the two
/// requests run side by side since registry requests are arms of the loop).
#[tokio::test(start_paused = true)]
async fn a_delivery_report_that_ends_the_session_is_not_held_by_a_registry_request() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(false);
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (payment_0, _) = payment(&mut wal, 0);
    let (order_1, _) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    rig.push(payment_0);
    let registry = Arc::new(Subjects::default());
    for subject in ["outbox.event.payment-value", "outbox.event.order-value"] {
        registry.present.lock().unwrap().insert(subject.into());
    }
    let slow = Duration::from_secs(120);
    let (settings, _) = registry.settings();
    let session = rig.session(settings, &mapping, &metrics);
    let run = async {
        let result = rig.ended(session).await;
        (result, tokio::time::Instant::now())
    };
    let driver = async {
        rig.until("the first event sent", |r| r.sent().len() == 1)
            .await;
        *registry.delay.lock().unwrap() = slow;
        // The next event's request begins once its frames are read.
        rig.read_all(order_1).await;
        tokio::task::yield_now().await;
        let sent = rig.sent();
        rig.acks
            .send(failed(&sent[0], RDKafkaErrorCode::MessageTimedOut))
            .unwrap();
        tokio::time::Instant::now()
    };
    let ((result, ended), reported) = tokio::join!(run, driver);
    assert!(result.is_err(), "{result:?}");
    assert!(
        ended - reported < Duration::from_secs(1),
        "the session ended {:?} after the report (the registry request takes {slow:?})",
        ended - reported
    );
    assert_eq!(rig.sent().len(), 1, "sent after the failed record");
}

/// Shutdown while a topic waits for its subject: its waiting events are given up (read again
/// after the restart), and so are its events read while the open transaction is finished —
/// even once the registry answers — or one could reach Kafka before its aggregate's earlier,
/// given-up one. The session ends cleanly, nothing of the topic sent or confirmed.
#[tokio::test(start_paused = true)]
async fn after_shutdown_a_waiting_topic_sends_nothing_more() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (first, end_first) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    rig.push(first);
    // A transaction of two events of the waiting topic, open when shutdown comes.
    let (open, _) = wal.txn(OUTBOX, &[Some(&event_id(1)), Some(&event_id(2))]);
    let (open_head, open_tail) = open.split_at(2);
    rig.push(open_head.to_vec());
    let registry = Arc::new(Subjects::default());
    let (settings, health) = registry.settings();
    let session = rig.session(settings, &mapping, &metrics);
    let driver = async {
        rig.until("blocked", |_| health.readiness().is_err()).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        registry
            .present
            .lock()
            .unwrap()
            .insert("outbox.event.order-value".into());
        rig.shutdown.cancel();
        tokio::time::sleep(Duration::from_millis(1)).await;
        rig.push(open_tail.to_vec());
    };
    rig.run(session, driver).await.unwrap();
    assert!(
        rig.sent().is_empty(),
        "sent after shutdown: {:?}",
        rig.sent()
    );
    assert!(
        rig.max_flush() < end_first,
        "confirmed past a given-up event"
    );
}

/// Exactly-once, shutdown gives the event waiting for the registry one last try, which may
/// take up to `shutdown_timeout`: a registry that answers within it (here after 1 s, the
/// subject registered meanwhile) gets the event sent and committed, and the session ends
/// cleanly instead of at once with the registry's error.
#[tokio::test(start_paused = true)]
async fn exactly_once_the_last_try_at_shutdown_waits_for_a_slow_registry() {
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (frames, end) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    rig.push(frames);
    let registry = Arc::new(Subjects::default());
    let (settings, health) = registry.settings();
    let settings = Settings {
        transactions: exactly_once(Duration::from_millis(100), 1_000).transactions,
        ..settings
    };
    assert!(Duration::from_secs(1) < settings.shutdown_timeout);
    let session = rig.session(settings, &mapping, &metrics);
    let driver = async {
        rig.until("blocked", |_| health.readiness().is_err()).await;
        *registry.delay.lock().unwrap() = Duration::from_secs(1);
        registry
            .present
            .lock()
            .unwrap()
            .insert("outbox.event.order-value".into());
        rig.shutdown.cancel();
        let (_, answer) = next_commit(&mut commits).await;
        answer.send(Ok(())).unwrap();
    };
    rig.run(session, driver).await.unwrap();
    assert_eq!(rig.sent().len(), 1, "{:?}", rig.sent());
    assert_eq!(rig.max_flush(), end);
}

/// The session's settings are the config's: exactly-once gets its Kafka transaction bounds
/// and splits a PostgreSQL transaction a third of the way to `transaction.timeout.ms`;
/// at-least-once has none.
#[test]
fn settings_come_from_the_config_and_exactly_once_splits_at_a_third_of_the_timeout() {
    use crate::config::{Config, Delivery};
    let mut config = Config::default();
    config.kafka.max_in_flight_messages = 123;
    config.kafka.max_in_flight_bytes = 4 << 20;
    config.relay.confirm_delay_ms = 70;
    config.relay.shutdown_timeout_ms = 9_000;
    let status = Duration::from_secs(7);
    let at_least_once = Settings::from_config(&config, status);
    assert!(at_least_once.transactions.is_none());
    assert_eq!(at_least_once.max_in_flight_messages, 123);
    assert_eq!(at_least_once.max_in_flight_bytes, 4 << 20);
    assert_eq!(at_least_once.confirm_delay, Duration::from_millis(70));
    assert_eq!(at_least_once.shutdown_timeout, Duration::from_secs(9));
    assert_eq!(at_least_once.status_interval, status);

    config.kafka.delivery = Delivery::ExactlyOnce;
    config.kafka.transaction_max_ms = 2_000;
    config.kafka.transaction_min_ms = 100;
    config.kafka.transaction_max_records = 500;
    config
        .kafka
        .properties
        .insert("transaction.timeout.ms".into(), "90000".into());
    let t = Settings::from_config(&config, status)
        .transactions
        .expect("exactly-once has Kafka transactions");
    assert_eq!(t.max_age, Duration::from_secs(2));
    assert_eq!(t.min_age, Duration::from_millis(100));
    assert_eq!(t.max_records, 500);
    assert_eq!(t.split_after, Duration::from_secs(30));
}

/// A registry that does not answer keeps each request up to `request_timeout_ms` (here 120 s,
/// which the config allows), and the request is awaited inside an arm of the session's loop:
/// meanwhile status updates still go out every status interval (so that `wal_sender_timeout`
/// does not end the stream), and a shutdown ends the session within `shutdown_timeout`, not
/// when the request times out. Found while modelling a silent registry for the simulation
/// (`sim/registry.rs`): before, neither happened until the request's timeout.
#[tokio::test(start_paused = true)]
async fn while_a_silent_registry_keeps_a_request_status_updates_flow_and_shutdown_is_bounded() {
    use crate::config::{SchemaVersion, SerializationConfig, SerializationFormat};
    use crate::sink::schema::registry::{BoxFuture, Registered, RegistryError, SchemaRegistry};
    use crate::sink::schema::{RegistryHealth, Serializer, Serializers, MAX_STALE};
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Answers every request after `REQUEST_TIMEOUT`, as reqwest's timeout does.
    #[derive(Debug, Default)]
    struct Silent {
        asked: AtomicUsize,
    }
    const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
    impl Silent {
        fn request<T: Send + 'static>(&self) -> BoxFuture<'static, Result<T, RegistryError>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                tokio::time::sleep(REQUEST_TIMEOUT).await;
                Err(RegistryError::Unreachable {
                    url: "http://silent".into(),
                    reason: "operation timed out".into(),
                })
            })
        }
    }
    impl SchemaRegistry for Silent {
        fn version<'a>(
            &'a self,
            _: &'a str,
            _: SchemaVersion,
        ) -> BoxFuture<'a, Result<Registered, RegistryError>> {
            self.request()
        }
        fn by_id(&self, _: u32) -> BoxFuture<'_, Result<Registered, RegistryError>> {
            self.request()
        }
        fn register<'a>(
            &'a self,
            _: &'a str,
            _: &'a str,
            _: &'a str,
        ) -> BoxFuture<'a, Result<u32, RegistryError>> {
            self.request()
        }
        fn subjects(&self) -> BoxFuture<'_, Result<Vec<String>, RegistryError>> {
            self.request()
        }
    }

    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    rig.push([Wal::relation(OUTBOX, "outbox")]);
    let (txn, end) = wal.txn(OUTBOX, &[Some(&event_id(0))]);
    rig.push(txn);
    let registry = Arc::new(Silent::default());
    let config = SerializationConfig {
        format: SerializationFormat::JsonSchema,
        registry_url: "http://silent".into(),
        request_timeout_ms: REQUEST_TIMEOUT.as_millis() as u64,
        ..SerializationConfig::default()
    };
    let health = Arc::new(RegistryHealth::new(&config.registry_url));
    let serializer = Serializer::with_registry(
        &config,
        "outbox.serialization",
        health,
        registry.clone(),
        MAX_STALE,
    );
    let status_interval = Duration::from_secs(1);
    let settings = Settings {
        serializers: Serializers::single(serializer),
        status_interval,
        ..settings()
    };
    let shutdown_timeout = settings.shutdown_timeout;
    let session = rig.session(settings, &mapping, &metrics);
    let run = async {
        let result = rig.ended(session).await;
        (result, tokio::time::Instant::now())
    };
    let driver = async {
        rig.until("the registry asked", |_| {
            registry.asked.load(Ordering::SeqCst) > 0
        })
        .await;
        let updates = rig.log.lock().unwrap().flushes.len();
        tokio::time::sleep(status_interval * 9).await;
        let flushes = rig.log.lock().unwrap().flushes.clone();
        assert!(
            flushes.len() - updates >= 8,
            "{} status updates in 9 status intervals of one registry request",
            flushes.len() - updates
        );
        assert!(
            flushes.iter().all(|f| *f < end),
            "confirmed past the event being serialized"
        );
        rig.shutdown.cancel();
        tokio::time::Instant::now()
    };
    let ((result, ended), cancelled) = tokio::join!(run, driver);
    assert!(
        matches!(&result, Err(RelayError::SchemaRegistry(why)) if why.contains("shutdown_timeout")),
        "{result:?}"
    );
    assert!(
        ended - cancelled <= shutdown_timeout,
        "the session ended {:?} after shutdown (shutdown_timeout {shutdown_timeout:?})",
        ended - cancelled
    );
    assert!(rig.sent().is_empty(), "sent without a schema");
}

/// `outbox_relay_commit_to_read_seconds` and `outbox_relay_commit_to_ack_seconds` observe
/// how long after its commit a transaction was read and its record acknowledged: here one
/// committed 5 s before (the wall clock; the bound above is loose, since only the sign and
/// the scale matter).
#[tokio::test(start_paused = true)]
async fn commit_latencies_are_the_time_since_the_commit() {
    use crate::source::pgoutput::Begin;
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut wal = Wal::new();
    let (mut frames, end) = wal.txn(OUTBOX, &[Some(&event_id(1))]);
    // PostgreSQL's clock counts from 2000-01-01.
    let five_seconds_ago = crate::clock::unix_us() - 946_684_800_000_000 - 5_000_000;
    frames[0] = fakes::frame(LogicalMessage::Begin(Begin {
        final_lsn: Lsn(end.0 - 0x30),
        commit_time_us: five_seconds_ago,
        xid: 1,
    }));
    rig.push(std::iter::once(Wal::relation(OUTBOX, "outbox")).chain(frames));
    let session = rig.session(settings(), &mapping, &metrics);
    let driver = async {
        rig.until("confirmed", |r| r.last_flush() == end).await;
        rig.shutdown.cancel();
    };
    rig.run(session, driver).await.unwrap();
    let text = metrics.render(Duration::from_secs(60));
    for histogram in ["commit_to_read", "commit_to_ack"] {
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("outbox_relay_{histogram}_seconds_sum ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {histogram} sum in:\n{text}"));
        assert!((5.0..65.0).contains(&sum), "{histogram}: {sum} s");
    }
}

/// `frame` as a walsender sends it: at `lsn` (pgoutput: a row change at the start of its WAL
/// record, a logical message at the end of its own).
fn at_lsn(frame: ReplicationFrame, lsn: u64) -> ReplicationFrame {
    match frame {
        ReplicationFrame::XLogData { data, .. } => ReplicationFrame::XLogData {
            wal_start: Lsn(lsn),
            wal_end: Lsn(lsn),
            data,
        },
        keepalive => keepalive,
    }
}

/// Issue 50, point 8: a split transaction's progress counted its changes, and the stream's
/// options can change between a crash and the restart. Written with pgoutput's messages on
/// (row 1 and a message in Kafka: 2 changes), the restart streams without messages: a count of
/// 2 skipped rows 1 and 2 and lost row 2, never in Kafka. By the place of the last change in
/// Kafka (the message, ending where row 2's record starts), only row 1 is skipped.
#[tokio::test(start_paused = true)]
async fn a_split_transaction_resumes_after_its_last_change_in_kafka_when_messages_were_turned_off()
{
    use crate::sink::progress::{ChangeAt, ChangeKind};
    let (mapping, metrics) = (mapping(), Metrics::default());
    let mut rig = Rig::new(true);
    let mut commits = rig.commits.take().unwrap();
    let mut wal = Wal::new();
    let (begin, final_lsn) = wal.begin(4);
    let (commit, end) = wal.commit(final_lsn);
    // Row 1's record at 0x100; the message's ended at 0x140, where row 2's record starts.
    rig.push([
        Wal::relation(OUTBOX, "outbox"),
        begin,
        at_lsn(insert(OUTBOX, Some(&event_id(1))), 0x100),
        at_lsn(insert(OUTBOX, Some(&event_id(2))), 0x140),
        at_lsn(insert(OUTBOX, Some(&event_id(3))), 0x180),
        at_lsn(insert(OUTBOX, Some(&event_id(4))), 0x1c0),
        commit,
    ]);
    let message = ChangeAt {
        lsn: Lsn(0x140),
        kind: ChangeKind::Message,
        nth: 1,
    };
    let session = rig
        .session(
            exactly_once(Duration::from_millis(1), 1000),
            &mapping,
            &metrics,
        )
        .skipping_below(Some(Progress::partial(final_lsn, 2, Some(message))));
    let driver = async {
        rig.confirm_commit(next_commit(&mut commits).await, end)
            .await;
        rig.shutdown.cancel();
    };
    let result = rig.run(session, driver).await;
    result.unwrap();
    let sent: Vec<String> = rig.sent().into_iter().map(|s| s.event_id).collect();
    assert_eq!(sent, [event_id(2), event_id(3), event_id(4)]);
    assert_eq!(rig.last_flush(), end);
}
