//! Exactly-once progress: which PostgreSQL transactions Kafka already holds.
//!
//! In `kafka.delivery = "exactly_once"` every Kafka transaction carries, besides its records,
//! one progress record on the compacted `kafka.progress_topic`: key = the slot's identity
//! (the database's system identifier, the database, the slot), value = the end LSN of the last
//! PostgreSQL transaction in it. Both commit or abort together, so the last committed value
//! says exactly which PostgreSQL transactions are in Kafka. The slot's own confirmation lags
//! (it is sent after the Kafka commit), so after a crash PostgreSQL re-sends transactions
//! already committed to Kafka: a session skips every transaction that commits below the value.
//!
//! Why the cases an operator can cause stay safe:
//! - `slot advance --to X` moves the slot forward: transactions below X are not re-sent, and
//!   everything after X commits above the progress value (LSNs only grow), so nothing new is
//!   skipped.
//! - `slot drop` + `slot create`: the new slot starts at the current WAL position, above every
//!   committed progress value of this cluster, so nothing new is skipped.
//! - Another cluster (or `initdb` again) has another system identifier, hence another key.
//! - A failover or a point-in-time restore puts the server on a new timeline: each value
//!   records the timeline it was written on, and a value past the point where the server's
//!   history left that timeline holds only up to that point ([`reconcile`]), so what the new
//!   timeline committed after the fork is published. A standby promoted in place goes on
//!   streaming to the relay, so a session on a standby reads the timeline again at each commit
//!   ([`Timelines`]): a value past the switch point carries the new timeline and holds whole.
//! - A copy of an earlier data directory started as it was stays on the same timeline but
//!   writes LSNs below the progress value again, for other transactions: a session whose
//!   server's WAL position is below the value stops with the fix (delete the key with a
//!   tombstone, or use a new slot name). Writes past the old value before the relay starts
//!   cannot be told apart.
//! - `replay` publishes again on purpose with its own (idempotent, non-transactional) producer;
//!   read_committed consumers see those records, and the progress record is untouched.
//!
//! The transactional id is built from the same identity, so every relay on the slot (a
//! standby, a zombie after a network split) shares it: the one that starts a session fences
//! the others, whose open transaction is aborted and whose commits fail from then on.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::{Message, Offset, TopicPartitionList};
use tracing::{info, warn};

use super::client::{client_config, consumer_config};
use super::delivery::PublishError;
use super::login::{self, ClientLogin, KafkaLogin, LoginContext, LogsIn};
use super::login_admin::{admin_client, LoggedInAdmin};
use crate::config::KafkaConfig;
use crate::lsn::Lsn;
use crate::sink::blocked::{BlockReason, Blocked};

/// Who writes the progress: one key (and one transactional id) per slot of a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotIdentity {
    pub system_identifier: String,
    pub database: String,
    pub slot: String,
}

impl SlotIdentity {
    /// The progress record's key.
    pub fn key(&self) -> Vec<u8> {
        serde_json::json!({
            "system_identifier": self.system_identifier,
            "database": self.database,
            "slot": self.slot,
        })
        .to_string()
        .into_bytes()
    }

    /// The producer's `transactional.id`: stable across restarts, shared by every relay on the
    /// slot.
    pub fn transactional_id(&self) -> String {
        format!(
            "outbox-relay/{}/{}/{}",
            self.system_identifier, self.database, self.slot
        )
    }
}

/// The progress record written into every Kafka transaction (`exactly_once`).
#[derive(Debug, Clone)]
pub struct ProgressRecord {
    pub topic: String,
    pub partition: i32,
    pub key: Vec<u8>,
    /// The timeline each value's LSN lies on, written into it.
    pub timelines: Timelines,
}

/// Which timeline a progress value lies on. A primary's timeline cannot change while a
/// session streams from it. A standby's can: promoted in place (or following its upstream's
/// promotion), it moves to a new timeline and its walsender goes on decoding across the switch
/// (walsender.c, `logical_read_xlog_page`: "to also cover the promotion or timeline change
/// cases"). A value past the switch point labelled with the old timeline would be cut back to
/// the switch point by the next session ([`reconcile`]), which would publish again what
/// Kafka already has.
///
/// A primary promoted earlier decodes WAL of its older timelines too (a slot behind the switch
/// point): a value there lies on the older timeline, which is what it is labelled with — not
/// the server's own, whose label would make a later server that branched off the older
/// timeline before the value refuse it ("not in the history") instead of cutting it back to
/// its fork (found by the simulation, `sim/timeline.rs`).
#[derive(Clone)]
pub enum Timelines {
    /// The session's server is a primary: its timeline and history, read when the session
    /// started.
    Fixed(ServerHistory),
    /// The session's server is a standby: its history is read again at each commit.
    Watched(Arc<dyn WatchTimelines>),
}

/// What [`WatchTimelines::current`] returns (a trait object's async method).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A standby's timeline history, as of now.
pub trait WatchTimelines: Send + Sync {
    /// The server's timeline and history now. Asked after the records of a commit were
    /// decoded, so every switch below them is in it: timelines only move forward.
    fn current(&self) -> BoxFuture<'_, Result<ServerHistory, String>>;
}

impl Timelines {
    /// The timeline `lsn` lies on.
    pub async fn of(&self, lsn: Lsn) -> Result<u32, String> {
        match self {
            Timelines::Fixed(server) => Ok(server.timeline_of(lsn)),
            Timelines::Watched(watch) => Ok(watch.current().await?.timeline_of(lsn)),
        }
    }
}

impl std::fmt::Debug for Timelines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Timelines::Fixed(server) => write!(f, "Fixed({})", server.timeline),
            Timelines::Watched(_) => write!(f, "Watched"),
        }
    }
}

/// The consumer group of the progress reader (it only assigns; see `read_last`).
pub const PROGRESS_GROUP: &str = "outbox-relay-progress";

const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long reading the progress record may take (other slots' open transactions hold the
/// read_committed end back for a moment).
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Creates the progress topic (one partition, compacted) when missing; returns its partition
/// count.
pub(in crate::sink) async fn ensure_topic(
    config: &KafkaConfig,
    blocked: &Blocked,
) -> Result<i32, PublishError> {
    let topic = config.progress_topic.clone();
    let problem = |p: String| PublishError::Progress {
        topic: topic.clone(),
        problem: p,
    };
    let login = KafkaLogin::from_config(config);
    let context = LoginContext::new(&login);
    let admin = Arc::new(
        admin_client(&client_config(config), context, &login)
            .map_err(|e| problem(format!("cannot create an admin client: {e}")))?,
    );
    if let Some(count) = partition_count(&admin, &topic).await? {
        blocked.clear(BlockReason::TopicAuthorization, &topic);
        return Ok(count);
    }
    let new =
        NewTopic::new(&topic, 1, TopicReplication::Fixed(-1)).set("cleanup.policy", "compact");
    let options = AdminOptions::new().operation_timeout(Some(ADMIN_TIMEOUT));
    let created = admin
        .create_topics([&new], &options)
        .await
        .map_err(|e| problem(format!("cannot create it: {e}")))?;
    for result in created {
        match result {
            Ok(_) => info!(topic = %topic, "created the progress topic (cleanup.policy=compact)"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => {
                // A topic the relay may not DESCRIBE looks missing, and its creation is
                // refused: a deployment error, retried by the session's back-off.
                if crate::sink::fault::KafkaFault::of_code(code)
                    .block()
                    .is_some()
                {
                    blocked.block(BlockReason::TopicAuthorization, &topic, &code);
                }
                return Err(problem(format!(
                    "cannot create it: {code:?}; {}",
                    blocked.fix(BlockReason::TopicAuthorization, &topic)
                )));
            }
        }
    }
    let started = Instant::now();
    loop {
        if let Some(count) = partition_count(&admin, &topic).await? {
            return Ok(count);
        }
        if started.elapsed() > ADMIN_TIMEOUT {
            return Err(problem("created, but it has no partitions yet".into()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The topic's partition count, `None` when it does not exist (yet). The metadata request
/// blocks, so it runs on the blocking pool; it asks for all topics, since asking for one by
/// name may auto-create it, uncompacted.
async fn partition_count(
    admin: &Arc<LoggedInAdmin<LoginContext>>,
    topic: &str,
) -> Result<Option<i32>, PublishError> {
    let problem = |p: String| PublishError::Progress {
        topic: topic.to_string(),
        problem: p,
    };
    let admin = admin.clone();
    let metadata =
        tokio::task::spawn_blocking(move || admin.inner().fetch_metadata(None, ADMIN_TIMEOUT))
            .await
            .map_err(|e| problem(format!("the metadata request stopped: {e}")))?
            .map_err(|e| problem(format!("cannot read its metadata: {e}")))?;
    Ok(metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
        .map(|t| t.partitions().len() as i32))
}

/// The last committed progress value for our key: a read_committed consumer reads the key's
/// partition from the beginning to its end (compaction keeps it short).
pub(in crate::sink) async fn read_last(
    config: &KafkaConfig,
    progress: &ProgressRecord,
) -> Result<Option<Stored>, PublishError> {
    let mut client = client_config(config);
    // Producer settings librdkafka's consumer would warn about are harmless; these matter.
    // librdkafka's assign needs a group.id (without one: "Unknown group"), although the
    // reader commits nothing; so the relay's principal needs READ on this group.
    client
        .set("group.id", PROGRESS_GROUP)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    let progress = progress.clone();
    let topic = progress.topic.clone();
    let login = KafkaLogin::from_config(config);
    tokio::task::spawn_blocking(move || read_last_blocking(client, &login, &progress))
        .await
        .map_err(|e| PublishError::Progress {
            topic: topic.clone(),
            problem: format!("the reader stopped: {e}"),
        })?
        .map_err(|problem| PublishError::Progress { topic, problem })
}

fn read_last_blocking(
    client: rdkafka::ClientConfig,
    login: &KafkaLogin,
    progress: &ProgressRecord,
) -> Result<Option<Stored>, String> {
    let (topic, partition) = (progress.topic.as_str(), progress.partition);
    let high = true_end(&client, login, topic, partition)?;
    let consumer = quiet_consumer(client, login)?;
    let low = wait_stable(&consumer, topic, partition, high)?;
    if high <= low {
        return Ok(None);
    }
    let mut assignment = TopicPartitionList::new();
    assignment
        .add_partition_offset(topic, partition, Offset::Beginning)
        .map_err(|e| e.to_string())?;
    consumer.assign(&assignment).map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut last = None;
    loop {
        if started.elapsed() > READ_TIMEOUT {
            return Err(format!(
                "not read to its end (offset {high}) within {READ_TIMEOUT:?}"
            ));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(message)) => {
                if message.key() == Some(&progress.key[..]) {
                    last = match message.payload() {
                        Some(value) => parse_progress_value(value).or(last),
                        // A tombstone: an operator reset the progress.
                        None => None,
                    };
                }
                if message.offset() + 1 >= high {
                    return Ok(last);
                }
            }
            // Every transaction below `high` is decided (`wait_stable`), so the read_committed
            // end is past every committed record there: what was read is the last value.
            Some(Err(KafkaError::PartitionEOF(_))) => return Ok(last),
            Some(Err(e)) => return Err(format!("cannot read it: {e}")),
            None => {}
        }
    }
}

/// The partition's true end, open transactions included: a read_uncommitted consumer's high
/// watermark (a read_committed one sees only the last stable offset).
fn true_end(
    client: &rdkafka::ClientConfig,
    login: &KafkaLogin,
    topic: &str,
    partition: i32,
) -> Result<i64, String> {
    let mut client = client.clone();
    client.set("isolation.level", "read_uncommitted");
    let consumer = quiet_consumer(client, login)?;
    let (_, high) = consumer
        .fetch_watermarks(topic, partition, ADMIN_TIMEOUT)
        .map_err(|e| format!("cannot read its offsets: {e}"))?;
    Ok(high)
}

/// Waits until every transaction below `high` is committed or aborted (the last stable
/// offset reached it); returns the low watermark. Reading before that could miss a newer
/// value behind another relay's open transaction (shared progress topics) and publish again
/// what Kafka already has; so a stable offset that stays below fails the session instead.
fn wait_stable(
    consumer: &BaseConsumer<QuietEof>,
    topic: &str,
    partition: i32,
    high: i64,
) -> Result<i64, String> {
    let started = Instant::now();
    loop {
        let (low, stable) = consumer
            .fetch_watermarks(topic, partition, ADMIN_TIMEOUT)
            .map_err(|e| format!("cannot read its offsets: {e}"))?;
        if stable >= high {
            return Ok(low);
        }
        if started.elapsed() > READ_TIMEOUT {
            return Err(format!("an open Kafka transaction holds its stable end at offset {stable}, below its end {high}, for over {READ_TIMEOUT:?}: retrying; see docs/src/operations/runbooks.md#exactly-once-progress"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The reader's client context: reaching the end of the partition is how it knows it is
/// done, not an error to log.
struct QuietEof {
    login: ClientLogin,
}

fn quiet_consumer(
    client: rdkafka::ClientConfig,
    login: &KafkaLogin,
) -> Result<BaseConsumer<QuietEof>, String> {
    let context = QuietEof {
        login: ClientLogin::new(login.clone()),
    };
    login::consumer(&consumer_config(client), context)
        .map_err(|e| format!("cannot create a consumer: {e}"))
}

impl rdkafka::ClientContext for QuietEof {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn generate_oauth_token(
        &self,
        _config: Option<&str>,
    ) -> Result<rdkafka::client::OAuthToken, Box<dyn std::error::Error>> {
        self.login.generate()
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, line: &str) {
        self.login.on_log(fac);
        login::forward_log(level, fac, line);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.login.on_error(&error);
        let eof = matches!(error, KafkaError::PartitionEOF(_))
            || error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF);
        if !eof {
            warn!(error = %error, reason, "kafka client error while reading the progress record");
        }
    }
}

impl rdkafka::consumer::ConsumerContext for QuietEof {}

impl LogsIn for QuietEof {
    fn client_login(&self) -> &ClientLogin {
        &self.login
    }
}

/// The server's timeline and how it got there, read on the replication connection before
/// streaming: a progress value written on another timeline is checked against it.
#[derive(Debug, Clone, Default)]
pub struct ServerHistory {
    pub timeline: u32,
    /// `(timeline, the LSN where the server left it)` for each earlier timeline; `None` when
    /// it could not be read.
    pub history: Option<Vec<(u32, Lsn)>>,
}

impl ServerHistory {
    /// The timeline `lsn` lies on: the oldest timeline of the history left at or after it,
    /// else the server's own. A value ending exactly where a timeline was left lies on it
    /// (its commit record is the last of that timeline).
    pub fn timeline_of(&self, lsn: Lsn) -> u32 {
        self.history
            .iter()
            .flatten()
            .find(|(_, left_at)| lsn <= *left_at)
            .map_or(self.timeline, |(timeline, _)| *timeline)
    }
}

/// A progress value as read back: where, and on which timeline (none: written by a relay
/// that did not record it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub at: Progress,
    pub timeline: Option<u32>,
}

/// What of a stored progress value holds on this server.
///
/// - Written on the server's own timeline: all of it, as long as the server's WAL has
///   reached it. A WAL position below it means the database went back in time on the same
///   timeline (a copy of an earlier data directory started as it was): the transactions
///   after the copy were lost, and new ones take their LSNs, so which of the stream Kafka has
///   cannot be told. Refused (`Err`), with the fix.
/// - Written on an earlier timeline of the server's history (a promotion, a point-in-time
///   restore): the two share everything before the fork, so the value holds up to the LSN
///   where the server left that timeline and is void past it — transactions of the new
///   timeline after the fork are published, whatever Kafka has of the old one.
/// - Written on a timeline that is not in the server's history: refused.
pub fn reconcile(
    stored: Stored,
    server: &ServerHistory,
    wal: Option<Lsn>,
) -> Result<Progress, String> {
    let at = stored.at;
    let written_on = stored.timeline.unwrap_or(server.timeline);
    if written_on == server.timeline {
        return match wal {
            Some(wal) if wal < at.lsn => Err(format!("the progress value {at} is ahead of the database's WAL ({wal}) on the same timeline {written_on}: the database went back in time")),
            _ => Ok(at),
        };
    }
    let Some(history) = &server.history else {
        return Err(format!("the progress value was written on timeline {written_on}, the server is on {}, and its timeline history cannot be read", server.timeline));
    };
    match history.iter().find(|(tli, _)| *tli == written_on) {
        Some((_, left_at)) if at.lsn <= *left_at => Ok(at),
        Some((_, left_at)) => {
            warn!(progress = %at, timeline = written_on, left_at = %left_at, server_timeline = server.timeline,
                "the progress value lies past the point where this server left its timeline (a failover or restore lost those transactions here): it holds up to that point only, and what the new timeline committed after it is published");
            Ok(Progress::whole(*left_at))
        }
        None => Err(format!("the progress value was written on timeline {written_on}, which is not in the history of this server's timeline {} (another branch of the cluster's history, e.g. a restore of an older backup)", server.timeline)),
    }
}

/// Where Kafka stands for a slot: every PostgreSQL transaction that commits below `lsn` is in
/// Kafka; with `changes`, also what the first that many changes (inserts and logical
/// messages, in WAL order) of the transaction that commits *at* `lsn` made — a transaction too
/// big for one Kafka transaction, split across several. Changes, not records: the WAL fixes
/// them, so a mapping changed between a crash and the restart (a message prefix now ignored,
/// say) cannot shift the count. With `through` (written since 2026-12-07), the last of those
/// changes by its place in the WAL: what a restart skips, whatever the stream then carries —
/// a count shifts when the stream's options change between a crash and the restart
/// (`[outbox.messages]` turning pgoutput's messages on or off, a publication's tables), and
/// would skip changes that never reached Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    pub lsn: Lsn,
    pub changes: Option<u64>,
    pub through: Option<ChangeAt>,
}

/// A change's place in the WAL, in WAL order. pgoutput sends a row change with the start of
/// its WAL record and a logical message with the *end* of its own (so a message and the insert
/// after it share the LSN: the message first); a multi-insert's rows share their record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ChangeAt {
    pub lsn: Lsn,
    pub kind: ChangeKind,
    /// Which of the changes of this kind at `lsn` it is, from 1.
    pub nth: u64,
}

/// What a change is, in the order pgoutput sends a message and a row change at one LSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    Message,
    Row,
}

impl ChangeAt {
    /// The place of a change of `kind` that came at `lsn`, after `previous` (the transaction's
    /// change before it, if any).
    pub fn next(previous: Option<ChangeAt>, lsn: Lsn, kind: ChangeKind) -> ChangeAt {
        let nth = match previous {
            Some(p) if p.lsn == lsn && p.kind == kind => p.nth + 1,
            _ => 1,
        };
        ChangeAt { lsn, kind, nth }
    }
}

/// What a session skips of a PostgreSQL transaction, by [`Progress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Covered {
    Nothing,
    All,
    /// Its first changes (a split transaction): those up to `through` where the value says
    /// it, else the first `changes`.
    First {
        changes: u64,
        through: Option<ChangeAt>,
    },
}

impl Progress {
    /// Every transaction up to the one that ends at `end` is in Kafka.
    pub fn whole(end: Lsn) -> Progress {
        Progress {
            lsn: end,
            changes: None,
            through: None,
        }
    }

    /// What the first `changes` changes of the transaction committing at `final_lsn` made is
    /// in Kafka (and every transaction before it); the last of them is at `through`.
    pub fn partial(final_lsn: Lsn, changes: u64, through: Option<ChangeAt>) -> Progress {
        Progress {
            lsn: final_lsn,
            changes: Some(changes),
            through,
        }
    }

    /// How much of the transaction that commits at `final_lsn` (BEGIN's final LSN) is in Kafka.
    pub fn covers(&self, final_lsn: Lsn) -> Covered {
        match self.changes {
            _ if final_lsn < self.lsn => Covered::All,
            Some(changes) if final_lsn == self.lsn => Covered::First {
                changes,
                through: self.through,
            },
            _ => Covered::Nothing,
        }
    }
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.changes {
            None => write!(f, "{}", self.lsn),
            Some(n) => write!(
                f,
                "{} (first {n} changes of the transaction there)",
                self.lsn
            ),
        }
    }
}

/// The progress record's value, as JSON so that operators can read it:
/// `{"end_lsn":"0/16B3748"}`, or for a split transaction `{"end_lsn":"0/16B3748","changes":500,
/// "through":{"lsn":"0/16A0F10","kind":"row","nth":1}}` with its commit LSN and the place of
/// its last change in Kafka ([`ChangeAt`]; a relay that knows only `changes` counts). A relay that knows only `end_lsn` then publishes that transaction
/// again whole (duplicates, never loss). Relays before this counted `records` (what the
/// changes made): read as changes, the same number unless the transaction carried logical
/// messages the mapping ignores.
///
/// `timeline` is the timeline its LSN lies on ([`Timelines::of`]; see [`reconcile`]).
pub fn progress_value(progress: Progress, timeline: u32) -> String {
    let mut value = serde_json::json!({ "end_lsn": progress.lsn.to_string() });
    if let Some(n) = progress.changes {
        value["changes"] = n.into();
    }
    if let Some(at) = progress.through {
        value["through"] = serde_json::json!({
            "lsn": at.lsn.to_string(),
            "kind": match at.kind {
                ChangeKind::Message => "message",
                ChangeKind::Row => "row",
            },
            "nth": at.nth,
        });
    }
    if timeline > 0 {
        value["timeline"] = timeline.into();
    }
    value.to_string()
}

/// [`progress_value`] read back; `None` when it is not one (or a tombstone).
pub fn parse_progress_value(value: &[u8]) -> Option<Stored> {
    let v: serde_json::Value = serde_json::from_slice(value).ok()?;
    let at = Progress {
        lsn: v.get("end_lsn")?.as_str()?.parse().ok()?,
        changes: ["changes", "records"]
            .into_iter()
            .find_map(|field| v.get(field).and_then(serde_json::Value::as_u64)),
        through: v.get("through").and_then(|t| {
            Some(ChangeAt {
                lsn: t.get("lsn")?.as_str()?.parse().ok()?,
                kind: match t.get("kind")?.as_str()? {
                    "message" => ChangeKind::Message,
                    "row" => ChangeKind::Row,
                    _ => return None,
                },
                nth: t.get("nth")?.as_u64()?,
            })
        }),
    };
    let timeline = v
        .get("timeline")
        .and_then(serde_json::Value::as_u64)
        .and_then(|t| u32::try_from(t).ok());
    Some(Stored { at, timeline })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(lsn: u64, changes: Option<u64>, timeline: Option<u32>) -> Stored {
        Stored {
            at: Progress {
                lsn: Lsn(lsn),
                changes,
                through: None,
            },
            timeline,
        }
    }

    fn server(timeline: u32, history: &[(u32, u64)]) -> ServerHistory {
        ServerHistory {
            timeline,
            history: Some(history.iter().map(|(t, l)| (*t, Lsn(*l))).collect()),
        }
    }

    #[test]
    fn values_round_trip_with_their_timeline_and_older_values_still_parse() {
        let split = Progress::partial(Lsn(0x16B3748), 500, None);
        let value = progress_value(split, 3);
        assert_eq!(
            value,
            r#"{"changes":500,"end_lsn":"0/16B3748","timeline":3}"#
        );
        assert_eq!(
            parse_progress_value(value.as_bytes()),
            Some(stored(0x16B3748, Some(500), Some(3)))
        );
        // Written by a relay that counted records.
        assert_eq!(
            parse_progress_value(br#"{"end_lsn":"0/16B3748","records":500}"#),
            Some(stored(0x16B3748, Some(500), None))
        );
        assert_eq!(
            parse_progress_value(br#"{"end_lsn":"0/10"}"#),
            Some(stored(0x10, None, None))
        );
        assert_eq!(parse_progress_value(b"not json"), None);
        // With the place of its last change in Kafka.
        let row = ChangeAt {
            lsn: Lsn(0x16A0F10),
            kind: ChangeKind::Row,
            nth: 2,
        };
        let value = progress_value(Progress::partial(Lsn(0x16B3748), 500, Some(row)), 0);
        assert_eq!(
            value,
            r#"{"changes":500,"end_lsn":"0/16B3748","through":{"kind":"row","lsn":"0/16A0F10","nth":2}}"#
        );
        let read = parse_progress_value(value.as_bytes()).unwrap();
        assert_eq!(read.at.through, Some(row));
    }

    #[test]
    fn changes_are_ordered_by_their_place_in_the_wal() {
        let message = ChangeAt::next(None, Lsn(0x140), ChangeKind::Message);
        let row = ChangeAt::next(Some(message), Lsn(0x140), ChangeKind::Row);
        let second = ChangeAt::next(Some(row), Lsn(0x140), ChangeKind::Row);
        assert_eq!((row.nth, second.nth), (1, 2), "a multi-insert's rows");
        assert!(message < row && row < second);
        assert!(second < ChangeAt::next(Some(second), Lsn(0x141), ChangeKind::Message));
    }

    #[test]
    fn a_split_value_covers_the_first_changes_of_its_transaction_only() {
        let at = Progress::partial(Lsn(0x100), 7, None);
        assert_eq!(at.covers(Lsn(0xFF)), Covered::All);
        assert_eq!(
            at.covers(Lsn(0x100)),
            Covered::First {
                changes: 7,
                through: None
            }
        );
        assert_eq!(at.covers(Lsn(0x101)), Covered::Nothing);
        let whole = Progress::whole(Lsn(0x100));
        assert_eq!(whole.covers(Lsn(0xFF)), Covered::All);
        assert_eq!(whole.covers(Lsn(0x100)), Covered::Nothing);
    }

    #[test]
    fn the_same_timeline_holds_unless_the_wal_went_back() {
        let s = server(2, &[(1, 0x500)]);
        let value = stored(0x900, None, Some(2));
        assert_eq!(
            reconcile(value, &s, Some(Lsn(0x1000))),
            Ok(Progress::whole(Lsn(0x900)))
        );
        let e = reconcile(value, &s, Some(Lsn(0x800))).unwrap_err();
        assert!(e.contains("went back in time"), "{e}");
        // Written before timelines were recorded: taken as the server's own.
        assert!(reconcile(stored(0x900, None, None), &s, Some(Lsn(0x1000))).is_ok());
    }

    #[test]
    fn a_value_past_the_fork_of_a_timeline_left_holds_up_to_the_fork() {
        let s = server(3, &[(1, 0x500), (2, 0x900)]);
        // Before timeline 2 was left: all of it holds.
        assert_eq!(
            reconcile(stored(0x800, Some(4), Some(2)), &s, Some(Lsn(0x2000))),
            Ok(Progress::partial(Lsn(0x800), 4, None))
        );
        // Past it: only up to the fork.
        assert_eq!(
            reconcile(stored(0xA00, None, Some(2)), &s, Some(Lsn(0x2000))),
            Ok(Progress::whole(Lsn(0x900)))
        );
        assert_eq!(
            reconcile(stored(0x600, None, Some(1)), &s, Some(Lsn(0x2000))),
            Ok(Progress::whole(Lsn(0x500)))
        );
    }

    #[test]
    fn an_lsn_lies_on_the_timeline_that_was_left_at_or_after_it() {
        let s = server(3, &[(1, 0x500), (2, 0x900)]);
        assert_eq!(s.timeline_of(Lsn(0x100)), 1);
        assert_eq!(
            s.timeline_of(Lsn(0x500)),
            1,
            "the last record of timeline 1"
        );
        assert_eq!(s.timeline_of(Lsn(0x501)), 2);
        assert_eq!(s.timeline_of(Lsn(0x900)), 2);
        assert_eq!(s.timeline_of(Lsn(0x901)), 3);
        assert_eq!(server(1, &[]).timeline_of(Lsn(0x901)), 1);
    }

    /// A standby on timeline 1 decoded from 0x100 on, promoted at 0x500, goes on streaming.
    /// A value written at 0x800 with the timeline the session opened with is cut back to the
    /// switch point by the next session (which publishes 0x500..0x800 again); with the
    /// timeline its LSN lies on, it holds whole.
    #[tokio::test]
    async fn a_value_written_after_a_promotion_in_place_holds_whole_on_the_promoted_server() {
        struct Promoted;
        impl WatchTimelines for Promoted {
            fn current(&self) -> BoxFuture<'_, Result<ServerHistory, String>> {
                Box::pin(async { Ok(server(2, &[(1, 0x500)])) })
            }
        }
        let promoted = server(2, &[(1, 0x500)]);
        let at = Progress::whole(Lsn(0x800));
        let read_back = |timeline| parse_progress_value(progress_value(at, timeline).as_bytes());

        let opened_with = Timelines::Fixed(server(1, &[])).of(at.lsn).await.unwrap();
        let stale = reconcile(read_back(opened_with).unwrap(), &promoted, Some(Lsn(0x900)));
        assert_eq!(
            stale,
            Ok(Progress::whole(Lsn(0x500))),
            "the defect the watch fixes"
        );

        let watched = Timelines::Watched(Arc::new(Promoted));
        assert_eq!(watched.of(Lsn(0x400)).await, Ok(1));
        let timeline = watched.of(at.lsn).await.unwrap();
        assert_eq!(timeline, 2);
        let held = reconcile(read_back(timeline).unwrap(), &promoted, Some(Lsn(0x900)));
        assert_eq!(held, Ok(at));
    }

    /// Found by the simulation (`sim/timeline.rs`): a primary promoted at 0x500, decoding from
    /// a slot behind it, labelled a value at 0x400 with its own timeline 2. A server restored
    /// later from timeline 1 to 0x300 (timeline 3, history `[(1, 0x300)]`) then refused the
    /// value ("not in the history") and the relay stopped; labelled with the timeline its LSN
    /// lies on, it is cut back to the fork.
    #[tokio::test]
    async fn a_primary_labels_a_value_before_its_switch_point_with_the_timeline_it_lies_on() {
        let promoted = Timelines::Fixed(server(2, &[(1, 0x500)]));
        assert_eq!(promoted.of(Lsn(0x400)).await, Ok(1));
        assert_eq!(promoted.of(Lsn(0x800)).await, Ok(2));
        let restored = server(3, &[(1, 0x300)]);
        assert_eq!(
            reconcile(stored(0x400, None, Some(1)), &restored, Some(Lsn(0x900))),
            Ok(Progress::whole(Lsn(0x300)))
        );
        let e = reconcile(stored(0x400, None, Some(2)), &restored, Some(Lsn(0x900))).unwrap_err();
        assert!(e.contains("not in the history"), "{e}");
    }

    #[test]
    fn a_timeline_outside_the_history_or_an_unreadable_history_is_refused() {
        let s = server(2, &[(1, 0x500)]);
        let e = reconcile(stored(0x400, None, Some(4)), &s, None).unwrap_err();
        assert!(e.contains("not in the history"), "{e}");
        let unknown = ServerHistory {
            timeline: 2,
            history: None,
        };
        assert!(reconcile(stored(0x400, None, Some(1)), &unknown, None).is_err());
    }
}
