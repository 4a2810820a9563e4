//! `dead-letters redrive`: sends dead letters back where they belong (see `plan.rs` for
//! what happens to each), and remembers how far it got in its own consumer group.
//!
//! The group's committed offset per partition covers only dead letters that are dealt with:
//! their redriven record (or their new dead letter) acknowledged by Kafka, or passed over by
//! the filters, or left. It is committed in order and contiguously (`positions.rs`), every
//! [`COMMIT_INTERVAL`], every [`COMMIT_EVERY`] dead letters dealt with, and at the end, so an
//! interrupted redrive resumes where the last commit stood, sending again at most what was
//! acknowledged since and what was in flight: at most `COMMIT_EVERY` + [`MAX_IN_FLIGHT`]
//! (1,500) records, however fast it ran (at-least-once's window), and a
//! finished one, run again, sends nothing. Each run reads up to the end the topic had when it
//! started, so the dead letters it writes itself wait for the next run.
//!
//! Kafka's refusals are judged as the relay judges them (`plan::refused`, `sink::limits`): a
//! record refused with a batch over its topic's limit is sent again once every record in
//! flight is answered, by a producer made again whose `batch.size` fits what is now known of
//! the limit (the relay's [`Blocked`], shared by the producers of the run). Each such refusal
//! lowers that, halving it when it should have fitted, so a record is sent again at most until
//! it is alone in its batch, and then judged its own fault; [`MAX_PRODUCERS`] bounds it still.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sink::limits::SizeRefusal;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::from_row::{Found, Rows};
use super::plan::{again, plan, refused, set_count, Action, How, Letter, Refused};
use super::positions::Positions;
use super::report::RedriveReport;
use super::{dead_letter, partition_ends, Filter, REQUEST_TIMEOUT};
use crate::config::Config;
use crate::mapping::{OutboxMapping, Record};
use crate::ops::replay::progress::Progress;
use crate::ops::OpsError;
use crate::sink::blocked::Blocked;
use crate::sink::dead_letter::{Reason, HEADER_REASON};
use crate::sink::publisher::{self, Delivery, PublishError, Publisher};
use crate::sink::schema::{SerializeError, Serializers};
use crate::sink::window::InFlight;

/// The consumer group whose committed offsets say how far redrives got.
pub const REDRIVE_GROUP: &str = "outbox-relay-dead-letters-redrive";
/// `--max-redrives`: a dead letter redriven this often is left.
pub const DEFAULT_MAX_REDRIVES: u32 = 3;
/// How often acknowledged progress is committed.
const COMMIT_INTERVAL: Duration = Duration::from_millis(200);
/// ... and after how many dead letters dealt with, whichever comes first: what a killed
/// redrive sends again is bounded by a count, not by how fast it ran.
const COMMIT_EVERY: u64 = 500;
/// Dead letters read per turn.
const CHUNK: usize = 100;
/// Records in flight at most.
const MAX_IN_FLIGHT: usize = 1000;
/// How long the end waits for acknowledgements beyond `kafka.message_timeout_ms`.
const ACK_GRACE: Duration = Duration::from_secs(10);
/// Producers made in one run at most: each after a batch Kafka refused, with batches within a
/// lower limit (see the module's doc: the limit's halvings end well before).
const MAX_PRODUCERS: u32 = 64;
/// A test aid: milliseconds to wait after each record sent, so that a test can interrupt a
/// redrive halfway. Unset in production.
const PAUSE_ENV: &str = "OUTBOX_RELAY_REDRIVE_PAUSE_MS";

#[derive(Debug, Clone)]
pub struct RedriveOptions {
    /// Which dead letters; `limit`: redrive at most so many (the rest wait for the next run).
    pub filter: Filter,
    /// Decide and report, send and commit nothing.
    pub dry_run: bool,
    pub max_redrives: u32,
    pub group: String,
    /// Draw a progress bar on stderr.
    pub progress: bool,
}

/// A record in flight (or to be sent again), and the dead letter it stands for.
struct Sent {
    letter: Letter,
    /// `None`: the record is the dead letter again.
    how: Option<How>,
    record: Record,
}

struct Run<'a> {
    config: &'a Config,
    options: &'a RedriveOptions,
    mapping: OutboxMapping,
    /// `[outbox.serialization]` and each table's own: what is mapped again is encoded as the
    /// live relay encodes it, by its table's serializer.
    serializers: Serializers,
    publisher: Option<(Publisher, tokio::sync::mpsc::UnboundedReceiver<Delivery>)>,
    /// What Kafka refused and what is known of each topic's limit, kept by every producer
    /// of the run (its `batch.size` is taken from it).
    blocked: Arc<Blocked>,
    /// Producers made so far.
    producers: u32,
    /// A batch was refused: the producer is made again before anything more is sent.
    remake: bool,
    window: InFlight,
    in_flight: BTreeMap<u64, Sent>,
    next_seq: u64,
    positions: Positions,
    /// Records to hand over again, before new ones: those Kafka refused with their batch, and
    /// the dead letters of those it refused for their own fault.
    again: Vec<Sent>,
    report: RedriveReport,
    pause: Option<Duration>,
    /// Set while the walk runs: the consumer whose group is committed.
    consumer: Option<Arc<DeadLetterConsumer>>,
    last_commit: Instant,
    /// The outbox rows read for dead letters that named them (connected at the first).
    rows: Option<Rows>,
    /// Rows whose record was acknowledged, to be released before the next commit.
    to_release: Vec<(String, String)>,
}

/// `dead-letters redrive`.
pub async fn redrive(config: &Config, options: RedriveOptions) -> Result<RedriveReport, OpsError> {
    let topic = config.dead_letter.topic.clone();
    let failed = |problem: String| OpsError::DeadLetters {
        topic: topic.clone(),
        problem,
    };
    let mut client = crate::sink::publisher::client_config(&config.kafka);
    client
        .set("group.id", &options.group)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true");
    let client = crate::sink::publisher::consumer_config(client);
    let login = publisher::KafkaLogin::from_config(&config.kafka);
    let t = topic.clone();
    let opened = tokio::task::spawn_blocking(move || open(client, &login, &t))
        .await
        .map_err(|e| failed(e.to_string()))?
        .map_err(failed)?;
    let Some((consumer, starts, total)) = opened else {
        return Ok(RedriveReport::new(&topic, &options.group, options.dry_run));
    };
    let mut run = Run::new(config, &options, &starts)?;
    let mut progress = Progress::new(options.progress, total);
    let result = run.walk(consumer, &starts, &mut progress).await;
    progress.clear();
    if let Err(problem) = result {
        run.report.failures.push(problem);
    }
    Ok(run.report)
}

/// The consumer assigned from the group's committed offsets (or each partition's beginning),
/// and each open partition's end; `None` when there is nothing to read.
type Opened = Option<(DeadLetterConsumer, BTreeMap<i32, (i64, i64)>, u64)>;

/// The redrive's consumer: it logs in with the relay's tokens (AWS_MSK_IAM).
type DeadLetterConsumer = BaseConsumer<publisher::LoginContext>;

fn open(
    client: rdkafka::ClientConfig,
    login: &publisher::KafkaLogin,
    topic: &str,
) -> Result<Opened, String> {
    let context = publisher::LoginContext::new(login);
    let consumer = publisher::login::consumer(&client, context)
        .map_err(|e| format!("cannot create a consumer: {e}"))?;
    let ends = partition_ends(&consumer, topic)?;
    let mut asked = TopicPartitionList::new();
    for &p in ends.keys() {
        asked.add_partition(topic, p);
    }
    let committed = consumer
        .committed_offsets(asked, REQUEST_TIMEOUT)
        .map_err(|e| format!("cannot read the redrive group's offsets: {e}"))?;
    let mut starts = BTreeMap::new();
    let mut assignment = TopicPartitionList::new();
    let mut total = 0;
    for (&p, &(low, high)) in &ends {
        let at = match committed.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o.max(low),
            _ => low,
        };
        if at < high {
            assignment
                .add_partition_offset(topic, p, Offset::Offset(at))
                .map_err(|e| e.to_string())?;
            starts.insert(p, (at, high));
            total += (high - at) as u64;
        }
    }
    if starts.is_empty() {
        return Ok(None);
    }
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    Ok(Some((consumer, starts, total)))
}

/// Up to [`CHUNK`] dead letters below each partition's end; `open` loses the partitions read
/// to their end.
fn read_chunk(
    consumer: &DeadLetterConsumer,
    open: &mut BTreeMap<i32, (i64, i64)>,
) -> Result<Vec<Letter>, String> {
    let mut letters = Vec::new();
    while letters.len() < CHUNK && !open.is_empty() {
        let message = match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => m,
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(p))) => {
                open.remove(&p);
                continue;
            }
            Some(Err(e)) => return Err(format!("cannot read it: {e}")),
            None if letters.is_empty() => continue,
            None => break,
        };
        let Some(&(_, end)) = open.get(&message.partition()) else {
            continue;
        };
        if message.offset() + 1 >= end {
            open.remove(&message.partition());
        }
        if message.offset() < end {
            letters.push(Letter::from_message(&message));
        }
    }
    Ok(letters)
}

impl<'a> Run<'a> {
    fn new(
        config: &'a Config,
        options: &'a RedriveOptions,
        starts: &BTreeMap<i32, (i64, i64)>,
    ) -> Result<Run<'a>, OpsError> {
        let blocked = Arc::new(Blocked::new(&config.kafka));
        let publisher = match options.dry_run {
            true => None,
            false => Some(Publisher::reporting_blocks(&config.kafka, blocked.clone())?),
        };
        let mut positions = Positions::default();
        for (&p, &(at, _)) in starts {
            positions.start(p, at);
        }
        let pause = std::env::var(PAUSE_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis);
        Ok(Run {
            mapping: OutboxMapping::new(&config.outbox)?,
            serializers: Serializers::new(&config.outbox)?,
            window: InFlight::new(
                config.kafka.max_in_flight_messages.clamp(1, MAX_IN_FLIGHT),
                config.kafka.max_in_flight_bytes,
            ),
            config,
            options,
            publisher,
            blocked,
            producers: 1,
            remake: false,
            in_flight: BTreeMap::new(),
            next_seq: 0,
            positions,
            again: Vec::new(),
            report: RedriveReport::new(&config.dead_letter.topic, &options.group, options.dry_run),
            pause,
            consumer: None,
            last_commit: Instant::now(),
            rows: None,
            to_release: Vec::new(),
        })
    }

    async fn walk(
        &mut self,
        consumer: DeadLetterConsumer,
        starts: &BTreeMap<i32, (i64, i64)>,
        progress: &mut Progress,
    ) -> Result<(), String> {
        let mut open = starts.clone();
        let consumer = Arc::new(consumer);
        self.consumer = Some(consumer.clone());
        let outcome = loop {
            if open.is_empty() || self.limit_reached() {
                break Ok(());
            }
            let (c, mut o) = (consumer.clone(), std::mem::take(&mut open));
            let (o, chunk) = tokio::task::spawn_blocking(move || {
                let chunk = read_chunk(&c, &mut o);
                (o, chunk)
            })
            .await
            .map_err(|e| e.to_string())?;
            open = o;
            let letters = match chunk {
                Ok(letters) => letters,
                Err(e) => break Err(e),
            };
            if let Err(e) = self.handle_chunk(letters, progress).await {
                break Err(e);
            }
        };
        let waited = self.finish(progress).await;
        self.commit().await;
        outcome.and(waited)
    }

    fn limit_reached(&self) -> bool {
        let acted = self.report.redriven
            + self.report.dead_lettered_again
            + (self.in_flight.len() + self.again.len()) as u64;
        self.options.filter.limit.is_some_and(|n| acted >= n as u64)
    }

    async fn handle_chunk(
        &mut self,
        letters: Vec<Letter>,
        progress: &mut Progress,
    ) -> Result<(), String> {
        for letter in letters {
            if self.limit_reached() {
                break;
            }
            self.report.scanned += 1;
            self.handle(letter).await?;
            progress.update(self.report.scanned);
            if self.last_commit.elapsed() >= COMMIT_INTERVAL
                || self.positions.uncommitted() >= COMMIT_EVERY
            {
                self.commit().await;
            }
        }
        Ok(())
    }

    async fn handle(&mut self, letter: Letter) -> Result<(), String> {
        let (partition, offset) = (letter.partition, letter.offset);
        if !self.options.filter.matches(&dead_letter(&letter)) {
            self.report.not_selected += 1;
            self.positions.handled(partition, offset, false);
            return Ok(());
        }
        let dlq = &self.config.dead_letter.topic;
        let action = plan(&letter, &self.mapping, dlq, self.options.max_redrives);
        let action = self.read_named_row(action, &letter).await?;
        let action = self.serialize(action, &letter).await?;
        let (record, how) = match action {
            Action::Leave(why) => {
                self.report.leave(&letter, why);
                self.positions.handled(partition, offset, false);
                return Ok(());
            }
            Action::Send(record, how, _) => (record, Some(how)),
            Action::DeadLetterAgain(record) => (record, None),
            // Made a `Send` or a `Leave` by `read_named_row`.
            Action::FromRow(..) => return Err("a named outbox row was not read".into()),
        };
        if self.publisher.is_none() {
            self.report.acknowledged(&record.topic, how);
            return Ok(());
        }
        self.send(record, letter, how).await?;
        self.positions.handled(partition, offset, true);
        if let Some(pause) = self.pause {
            tokio::time::sleep(pause).await;
        }
        Ok(())
    }

    /// Reads the outbox row a dead letter names (it kept neither payload nor row image) and
    /// maps it: the record goes to its topic like one mapped again. A row gone, or one that
    /// does not map, is left (and stays kept: nothing is released but what was sent).
    async fn read_named_row(&mut self, action: Action, letter: &Letter) -> Result<Action, String> {
        let Action::FromRow((table, id), count) = action else {
            return Ok(action);
        };
        if self.rows.is_none() {
            let rows = Rows::connect(self.config)
                .await
                .map_err(|e| format!("cannot read the outbox rows dead letters name: {e}"))?;
            self.rows = Some(rows);
        }
        let Some(rows) = self.rows.as_mut() else {
            return Err("no connection to PostgreSQL".into());
        };
        let time_ms = letter.timestamp_ms.unwrap_or_else(crate::clock::unix_ms);
        let found = rows
            .read(self.config, &self.mapping, &table, &id, time_ms)
            .await
            .map_err(|e| format!("dead letter at offset {}: {e}", letter.offset))?;
        Ok(match found {
            Found::Event(event) => {
                let mut record = event.record;
                set_count(&mut record.headers, count);
                Action::Send(record, How::FromRow, Some(event.profile))
            }
            Found::Leave(why) => Action::Leave(why),
        })
    }

    /// Encodes a record mapped again, or a `schema` dead letter sent again, with the schema
    /// (a refused payload is dead-lettered again; a registry that gives no schema stops the
    /// redrive, committing nothing past this dead letter). A record Kafka refused was encoded
    /// before it was refused, so it goes as it was.
    async fn serialize(&self, action: Action, letter: &Letter) -> Result<Action, String> {
        let Action::Send(mut record, how, profile) = action else {
            return Ok(action);
        };
        let unencoded = letter.header(HEADER_REASON).as_deref() == Some(Reason::Schema.code());
        if how == How::Resent && !unencoded {
            return Ok(Action::Send(record, how, profile));
        }
        // A `schema` dead letter re-sent as it was (no row image) names no table: with one
        // section in force it is that one's; with several it cannot be told.
        let profile = match profile {
            Some(profile) => profile,
            None if !self.serializers.several() => 0,
            None => return Ok(Action::Leave(
                "a `schema` dead letter without its row image names no table, and the tables are encoded by different [outbox.tables.serialization] sections; re-send it with the application".into(),
            )),
        };
        let Some(serializer) = self.serializers.get(profile) else {
            return Ok(Action::Send(record, how, Some(profile)));
        };
        match serializer.serialize(&mut record).await {
            Ok(()) => Ok(Action::Send(record, how, Some(profile))),
            Err(SerializeError::Payload(why)) => {
                let dlq = &self.config.dead_letter.topic;
                let code = Some(Reason::Schema.code());
                Ok(Action::DeadLetterAgain(again(letter, dlq, code, &why)))
            }
            Err(e) => Err(format!("dead letter at offset {}: {e}", letter.offset)),
        }
    }

    /// Waits for room in the window, then hands the record over.
    async fn send(
        &mut self,
        record: Record,
        letter: Letter,
        how: Option<How>,
    ) -> Result<(), String> {
        while !self.window.has_room() {
            self.next_delivery().await?;
        }
        self.drain_ready()?;
        self.send_again().await?;
        self.hand_over(record, letter, how).await
    }

    /// Hands one record to the producer and keeps it in flight (nothing on a dry run).
    async fn hand_over(
        &mut self,
        record: Record,
        letter: Letter,
        how: Option<How>,
    ) -> Result<(), String> {
        let Some((publisher, _)) = &self.publisher else {
            return Ok(());
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        match publisher.send(&record, seq, &letter.event_id()).await {
            Ok(()) => {}
            // Refused before it was sent: its topic refused it alone earlier in this run (a
            // dead letter of the same event read again), as a delivery report would.
            Err(PublishError::Rejected(rejection)) => {
                // At `send`, a size refusal is the record's alone.
                let alone = || SizeRefusal::Record { limit: 0 };
                match refused(rejection.fault, how.is_none(), alone) {
                    Refused::DeadLetterAgain(reason) => {
                        self.dead_letter_again(letter, reason, &rejection.to_string());
                        return Ok(());
                    }
                    Refused::SendAgain | Refused::Stop => return Err(rejection.to_string()),
                }
            }
            Err(e) => return Err(e.to_string()),
        }
        self.window.sent(record.size());
        self.in_flight.insert(
            seq,
            Sent {
                letter,
                how,
                record,
            },
        );
        Ok(())
    }

    async fn next_delivery(&mut self) -> Result<(), String> {
        let Some((_, deliveries)) = &mut self.publisher else {
            return Ok(());
        };
        match deliveries.recv().await {
            Some(delivery) => self.delivered(delivery),
            None => Err("the Kafka producer went away".into()),
        }
    }

    fn drain_ready(&mut self) -> Result<(), String> {
        while let Some(Ok(delivery)) = self.publisher.as_mut().map(|(_, d)| d.try_recv()) {
            self.delivered(delivery)?;
        }
        Ok(())
    }

    /// An acknowledgement moves the position; a refusal is judged (`plan::refused`): the
    /// record goes again (with its batch, no fault of its own), or is dead-lettered again
    /// (kept uncommitted until what is sent for it is acknowledged), or the redrive stops.
    fn delivered(&mut self, delivery: Delivery) -> Result<(), String> {
        self.window.settled(delivery.bytes);
        let Some(sent) = self.in_flight.remove(&delivery.seq) else {
            return Ok(());
        };
        let failure = match delivery.result {
            Ok(()) => {
                self.report.acknowledged(&sent.record.topic, sent.how);
                self.positions
                    .acknowledged(sent.letter.partition, sent.letter.offset);
                if sent.how == Some(How::FromRow) {
                    if let Some(row) = sent.letter.outbox_row() {
                        self.to_release.push(row);
                    }
                }
                return Ok(());
            }
            Err(failure) => failure,
        };
        let Some((publisher, _)) = &self.publisher else {
            return Err("the Kafka producer went away".into());
        };
        let judged = refused(failure.fault, sent.how.is_none(), || {
            publisher.judge_size_refusal(&failure)
        });
        let rejection = failure.rejection().to_string();
        match judged {
            Refused::SendAgain => {
                self.remake = true;
                self.again.push(sent);
                Ok(())
            }
            Refused::DeadLetterAgain(reason) => {
                self.dead_letter_again(sent.letter, reason, &rejection);
                Ok(())
            }
            Refused::Stop => Err(format!("Kafka did not take a record: {rejection}")),
        }
    }

    /// Queues the dead letter again for a record Kafka refused for its own fault.
    fn dead_letter_again(&mut self, letter: Letter, reason: Reason, why: &str) {
        let record = again(
            &letter,
            &self.config.dead_letter.topic,
            Some(reason.code()),
            why,
        );
        self.again.push(Sent {
            letter,
            how: None,
            record,
        });
    }

    /// Hands over again what Kafka refused on the redrive: after a refused batch, once every
    /// record in flight is answered (each of that batch is judged), through a producer made
    /// again, whose batches fit what is known of the limits now.
    async fn send_again(&mut self) -> Result<(), String> {
        if self.remake {
            self.settle().await?;
            self.remake_publisher()?;
        }
        for Sent {
            letter,
            how,
            record,
        } in std::mem::take(&mut self.again)
        {
            self.hand_over(record, letter, how).await?;
        }
        Ok(())
    }

    /// Drops the producer (every record it was given is answered) and makes a new one with
    /// the run's limits (`Publisher::reporting_blocks`: its `batch.size` within the smallest
    /// known, as the relay's next session's).
    fn remake_publisher(&mut self) -> Result<(), String> {
        self.remake = false;
        if self.producers >= MAX_PRODUCERS {
            return Err(format!(
                "Kafka refused batches of {MAX_PRODUCERS} producers, each made again with smaller batches; check the target topics' max.message.bytes"
            ));
        }
        self.publisher = None;
        let made = Publisher::reporting_blocks(&self.config.kafka, self.blocked.clone())
            .map_err(|e| format!("cannot make the Kafka producer again: {e}"))?;
        self.publisher = Some(made);
        self.producers += 1;
        Ok(())
    }

    /// Waits until every record in flight is answered; librdkafka reports each within
    /// `kafka.message_timeout_ms`.
    async fn settle(&mut self) -> Result<(), String> {
        let deadline = Instant::now()
            + Duration::from_millis(self.config.kafka.message_timeout_ms)
            + ACK_GRACE;
        while !self.in_flight.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "{} records got no answer from Kafka within kafka.message_timeout_ms",
                    self.in_flight.len()
                ));
            }
            match tokio::time::timeout(left, self.next_delivery()).await {
                Ok(result) => result?,
                Err(_) => continue,
            }
        }
        Ok(())
    }

    /// Sends what is to be sent again and waits for every record, until nothing is left.
    async fn finish(&mut self, progress: &mut Progress) -> Result<(), String> {
        loop {
            self.send_again().await?;
            if self.in_flight.is_empty() && self.again.is_empty() {
                return Ok(());
            }
            self.settle().await?;
            progress.update(self.report.scanned);
        }
    }

    /// Commits what is due (nothing in a dry run), after releasing the outbox rows whose
    /// records were acknowledged: a redrive that stops in between leaves a row kept (released
    /// by hand, or by a redrive of its dead letter again), never one released unsent.
    async fn commit(&mut self) {
        self.last_commit = Instant::now();
        if let Some(rows) = &self.rows {
            for (table, id) in std::mem::take(&mut self.to_release) {
                if let Err(e) = rows.release(&table, &id).await {
                    self.report.failures.push(format!(
                        "cannot release outbox row {id} of {table} (it stays kept from the sweeper): {e}"
                    ));
                }
            }
        }
        let Some(consumer) = self.consumer.clone() else {
            return;
        };
        let previous = self.positions.committed();
        let due = self.positions.due();
        if self.options.dry_run || due.is_empty() {
            return;
        }
        let topic = self.config.dead_letter.topic.clone();
        let offsets = due.clone();
        let result =
            tokio::task::spawn_blocking(move || commit_offsets(&consumer, &topic, &offsets))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
        if let Err(e) = result {
            self.positions.uncommit(&due, &previous);
            self.report
                .failures
                .push(format!("cannot commit the redrive group's offsets: {e}"));
        }
        self.report.committed = self.positions.committed();
    }
}

fn commit_offsets(
    consumer: &DeadLetterConsumer,
    topic: &str,
    due: &[(i32, i64)],
) -> Result<(), String> {
    let mut offsets = TopicPartitionList::new();
    for &(partition, offset) in due {
        offsets
            .add_partition_offset(topic, partition, Offset::Offset(offset))
            .map_err(|e| e.to_string())?;
    }
    consumer
        .commit(&offsets, CommitMode::Sync)
        .map_err(|e| e.to_string())
}
