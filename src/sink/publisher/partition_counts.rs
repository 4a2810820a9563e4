//! Partition counts of the topics the publisher writes to, read from the brokers without ever
//! making a sender wait: a record whose topic's count is not known yet waits in that topic's
//! queue (with every later record of the topic, so that none overtakes it in its partition)
//! while a background task reads the count; the queue is then produced in order, or failed as
//! librdkafka fails its own queue. Known counts are refreshed in the background.
//!
//! This first metadata read is also the gate of every new topic: a topic that does not exist
//! is created first (`kafka.topic_creation`), and one the brokers refuse for a deployment
//! reason (no ACL, missing, creation refused) keeps its records waiting, retried with
//! back-off and reported as [`Blocked`](super::blocked::Blocked), for as long as it takes —
//! never failed, so never dead-lettered, and the slot is never confirmed past them. Records of
//! other topics go on meanwhile.
//!
//! First reads are batched: one task reads the counts of every topic waiting for one at that
//! moment in ONE metadata request (and creates the missing ones in one CreateTopics request),
//! so that a burst of new topics (1,000 aggregate types) is not a thousand requests at once,
//! each on a blocking thread of its own, timing out under load.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};

use super::login::{KafkaLogin, LoginContext};
use super::login_admin::{admin_client, LoggedInAdmin};
use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::producer::Producer;
use rdkafka::Timestamp;
use tracing::{info, warn};

use super::delivery::{owned_headers, Delivery, DeliveryFailure, Opaque};
use super::producer::Shared;
use super::topic_handles::TopicCounts;
use crate::config::TopicCreation;
use crate::mapping::{partition, Record};
use crate::sink::blocked::BlockReason;
use crate::sink::fault::KafkaFault;
use crate::sink::limits::{RecordContent, TimestampWindow};

/// Partition counts of the topics written to, and the records waiting for one.
#[derive(Default)]
struct Topics {
    /// Partition count per topic with the time it was read, for `Record::partition_key`.
    counts: HashMap<String, (i32, Instant)>,
    /// Records of topics whose count is being read for the first time, in send order.
    waiting: HashMap<String, VecDeque<Waiting>>,
    /// Topics whose count is being read again; their records use the known count meanwhile.
    refreshing: HashSet<String>,
    /// Topics whose first count is not read yet (their records are in `waiting`), with when
    /// to read it.
    first_reads: HashMap<String, FirstRead>,
    /// The task that reads first counts runs (there is at most one).
    reader: bool,
    /// Topics that refused records when they were sent (`refused`): their records wait there.
    held: HashMap<String, refused::HeldTopic>,
}

/// When a topic's first count is read next, and what its earlier reads found.
struct FirstRead {
    started: Instant,
    due: Instant,
    pause: Duration,
    /// When a failed read was last logged.
    warned: Option<Instant>,
}

impl FirstRead {
    fn new(now: Instant) -> FirstRead {
        FirstRead {
            started: now,
            due: now,
            pause: METADATA_RETRY,
            warned: None,
        }
    }

    /// A failed read at `now` is logged: the first, then one per [`STILL_WAITING_LOG`] for
    /// as long as they fail (one line, then silence, would read as recovered).
    fn log_failure(&mut self, now: Instant) -> bool {
        if self
            .warned
            .is_some_and(|at| now.duration_since(at) < STILL_WAITING_LOG)
        {
            return false;
        }
        self.warned = Some(now);
        true
    }

    /// The read failed: the next one after the pause, which doubles up to the maximum.
    fn retry(&mut self, now: Instant) {
        self.due = now + self.pause;
        self.pause = (self.pause * 2).min(METADATA_RETRY_MAX);
    }
}

/// What the first-count reader does next.
#[derive(Debug, PartialEq, Eq)]
enum Turn {
    /// Read the counts of these topics (one request).
    Read(Vec<String>),
    /// Nothing is due before then.
    Sleep(Instant),
    /// No topic waits for a first count: the reader ends.
    Done,
}

impl Topics {
    /// Queues `topic`'s first read, and says whether a reader must be started for it.
    fn queue_first_read(&mut self, topic: &str, now: Instant) -> bool {
        self.first_reads
            .entry(topic.to_string())
            .or_insert_with(|| FirstRead::new(now));
        !std::mem::replace(&mut self.reader, true)
    }

    /// The reader's next turn: every topic due now, in one batch. `Done` marks the reader
    /// stopped, under the same lock as `queue_first_read` starts one: none is lost.
    fn next_turn(&mut self, now: Instant) -> Turn {
        let mut due: Vec<String> = self
            .first_reads
            .iter()
            .filter(|(_, r)| r.due <= now)
            .map(|(t, _)| t.clone())
            .collect();
        if !due.is_empty() {
            due.sort();
            return Turn::Read(due);
        }
        match self.first_reads.values().map(|r| r.due).min() {
            Some(next) => Turn::Sleep(next),
            None => {
                self.reader = false;
                Turn::Done
            }
        }
    }
}

/// What a failed first read of a topic leads to.
enum AfterFailure {
    /// Read again after the pause.
    Retry,
    /// Create the topic (reporting a refusal as a block when `report`), then read again.
    Create { report: bool },
    /// Fail its records with this error.
    Fail(KafkaError),
}

/// A record that waits for its topic's partition count.
struct Waiting {
    record: Record,
    opaque: usize,
}

/// How long a topic's partition count is trusted before it is read again (a topic may grow).
const PARTITION_COUNT_TTL: Duration = Duration::from_secs(60);
/// Per metadata request.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a topic the brokers answer for, but without partitions (maybe being
/// auto-created, or refused), may take to get them before its records fail.
const METADATA_WAIT: Duration = Duration::from_secs(10);
/// One attempt to refresh a known count; on failure the known count is kept.
const METADATA_REFRESH_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause between metadata requests for a topic whose first count is not known yet; doubled
/// after each try up to [`METADATA_RETRY_MAX`].
const METADATA_RETRY: Duration = Duration::from_millis(200);
const METADATA_RETRY_MAX: Duration = Duration::from_secs(5);
/// How long a deployment error must last before the topic counts as blocked: a topic being
/// created (by the brokers or by us) is missing for a moment.
const BLOCK_GRACE: Duration = Duration::from_secs(2);
/// Per CreateTopics request.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);
/// While a topic's first read keeps failing, it is logged again this often.
const STILL_WAITING_LOG: Duration = Duration::from_secs(30);

/// The gate of every topic the publisher writes to: partition counts, the records waiting
/// for one, and the admin client that creates missing topics. Produces through [`Shared`].
pub(super) struct PartitionCounts {
    shared: Arc<Shared>,
    topics: Mutex<Topics>,
    /// `kafka.topic_creation`, and the settings of the admin client that creates topics.
    creation: TopicCreation,
    admin_config: ClientConfig,
    login: KafkaLogin,
    admin: Mutex<Option<Arc<LoggedInAdmin<LoginContext>>>>,
    /// At-least-once: what a topic's first record and a held topic's probes go through
    /// (`partition_counts_refused.rs`), made on first use.
    probe: Mutex<Option<Arc<rdkafka::producer::FutureProducer<LoginContext>>>>,
    /// First-count metadata requests made (batches read), for the tests.
    #[cfg(test)]
    pub(super) metadata_requests: std::sync::atomic::AtomicUsize,
}

impl PartitionCounts {
    pub(super) fn new(
        shared: Arc<Shared>,
        creation: TopicCreation,
        admin_config: ClientConfig,
        login: KafkaLogin,
    ) -> Self {
        PartitionCounts {
            shared,
            topics: Mutex::default(),
            creation,
            admin_config,
            login,
            admin: Mutex::new(None),
            probe: Mutex::new(None),
            #[cfg(test)]
            metadata_requests: Default::default(),
        }
    }

    fn topics(&self) -> MutexGuard<'_, Topics> {
        self.topics.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Some record still waits for its topic's partition count, or for a topic that refused
    /// it to take records again.
    pub(super) fn any_waiting(&self) -> bool {
        let topics = self.topics();
        !topics.waiting.is_empty() || !topics.held.is_empty()
    }

    /// The record's partition (`Some(None)`: the partitioner hashes the key), or `None` when
    /// the record was queued to wait for its topic's partition count.
    pub(super) fn route(self: &Arc<Self>, record: &Record, opaque: usize) -> Option<Option<i32>> {
        let mut topics = self.topics();
        if let Some(held) = topics.held.get_mut(&record.topic) {
            held.later.push_back(Waiting {
                record: record.clone(),
                opaque,
            });
            return None;
        }
        if let Some(queue) = topics.waiting.get_mut(&record.topic) {
            // Behind the records already waiting, whether or not this one needs the count: a
            // record that went straight to librdkafka could overtake them in its partition.
            queue.push_back(Waiting {
                record: record.clone(),
                opaque,
            });
            return None;
        }
        // Every topic's first record waits for its metadata, whether or not it needs the
        // partition count: that read is where a missing topic is created and a refused one
        // found, before librdkafka could fail records of it.
        match topics.counts.get(&record.topic).copied() {
            Some((count, read_at)) => {
                let Some(key) = needs_count(record) else {
                    return Some(record.partition);
                };
                if read_at.elapsed() >= PARTITION_COUNT_TTL
                    && topics.refreshing.insert(record.topic.clone())
                {
                    tokio::spawn(self.clone().refresh_count(record.topic.clone(), count));
                }
                Some(Some(partition::partition_for_key(key, count)))
            }
            None => {
                let first = Waiting {
                    record: record.clone(),
                    opaque,
                };
                topics
                    .waiting
                    .insert(record.topic.clone(), VecDeque::from([first]));
                if topics.queue_first_read(&record.topic, Instant::now()) {
                    tokio::spawn(self.clone().read_first_counts());
                }
                None
            }
        }
    }

    /// Reads the first partition counts of the topics waiting for one, every topic due at
    /// that moment in one request, until none waits: creates the missing ones (when
    /// `kafka.topic_creation` says so), produces each topic's waiting records in order once
    /// its count is known, or fails them. Brokers that cannot be reached are waited for as
    /// long as librdkafka waits for the records in its own queue (`message.timeout.ms`); a
    /// deployment error for as long as it lasts.
    async fn read_first_counts(self: Arc<Self>) {
        loop {
            let turn = self.topics().next_turn(Instant::now());
            let batch = match turn {
                Turn::Read(batch) => batch,
                Turn::Sleep(until) => {
                    tokio::select! {
                        _ = self.shared.stop.cancelled() => return,
                        _ = tokio::time::sleep_until(until.into()) => continue,
                    }
                }
                Turn::Done => return,
            };
            let counts = self.fetch_counts(&batch, METADATA_TIMEOUT).await;
            if let Ok(counts) = &counts {
                let found: Vec<String> = batch
                    .iter()
                    .filter(|t| counts.get(*t).is_some_and(Result::is_ok))
                    .cloned()
                    .collect();
                // Before the waiting records go, so that the producer made next batches
                // within the limit.
                if !found.is_empty() {
                    self.read_limits(found, true).await;
                }
            }
            let mut create = Vec::new();
            for topic in batch {
                let count = match &counts {
                    Ok(counts) => counts
                        .get(&topic)
                        .cloned()
                        .unwrap_or(Err(RDKafkaErrorCode::UnknownTopicOrPartition))
                        .map_err(KafkaError::MetadataFetch),
                    Err(error) => Err(error.clone()),
                };
                match count {
                    Ok(count) => self.first_count_read(&topic, Ok(count)).await,
                    Err(error) => match self.first_count_failed(&topic, &error) {
                        AfterFailure::Fail(give_up) => {
                            self.first_count_read(&topic, Err(give_up)).await
                        }
                        AfterFailure::Create { report } => create.push((topic, report)),
                        AfterFailure::Retry => {}
                    },
                }
                if self.shared.stop.is_cancelled() {
                    return;
                }
            }
            self.create_topics(&create).await;
        }
    }

    /// A topic's first read ended: with its count (its blocks end), or with the error its
    /// waiting records fail with. Its records go, oldest first.
    async fn first_count_read(self: &Arc<Self>, topic: &str, outcome: Result<i32, KafkaError>) {
        {
            let mut topics = self.topics();
            topics.first_reads.remove(topic);
            if let Ok(count) = outcome {
                topics
                    .counts
                    .insert(topic.to_string(), (count, Instant::now()));
            }
        }
        if outcome.is_ok() {
            self.shared.blocked.clear(BlockReason::UnknownTopic, topic);
            self.shared.blocked.clear(BlockReason::TopicCreation, topic);
        }
        self.release_waiting(topic, outcome).await;
    }

    /// What a failed first read of `topic`'s count means (a block is reported here, once it
    /// lasted [`BLOCK_GRACE`]); unless its records fail, its next read is scheduled.
    fn first_count_failed(&self, topic: &str, error: &KafkaError) -> AfterFailure {
        let now = Instant::now();
        let (waited, warn_now) = {
            let mut topics = self.topics();
            let Some(read) = topics.first_reads.get_mut(topic) else {
                return AfterFailure::Retry;
            };
            read.retry(now);
            (now.duration_since(read.started), read.log_failure(now))
        };
        let next = self.after_failure(topic, error, waited);
        if warn_now && !matches!(next, AfterFailure::Fail(_)) {
            warn!(topic, error = %error, waited_s = waited.as_secs(),
                "cannot read the topic's partition count yet; its records wait");
        }
        next
    }

    fn after_failure(&self, topic: &str, error: &KafkaError, waited: Duration) -> AfterFailure {
        match KafkaFault::of(error).block() {
            Some(BlockReason::UnknownTopic) if self.creation.enabled => {
                return AfterFailure::Create {
                    report: waited >= BLOCK_GRACE,
                };
            }
            // Reported by librdkafka's error callback; waited for like an unreachable broker.
            Some(BlockReason::Authentication) | None => {}
            Some(reason) => {
                if waited >= BLOCK_GRACE {
                    self.shared.blocked.block(reason, topic, error);
                }
                return AfterFailure::Retry;
            }
        }
        let unreachable = matches!(
            error.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::BrokerTransportFailure
                    | RDKafkaErrorCode::AllBrokersDown
                    | RDKafkaErrorCode::OperationTimedOut
                    | RDKafkaErrorCode::Authentication
            )
        );
        if !unreachable && waited >= METADATA_WAIT {
            return AfterFailure::Fail(error.clone());
        }
        if waited >= self.shared.message_timeout {
            return AfterFailure::Fail(KafkaError::MessageProduction(
                RDKafkaErrorCode::MessageTimedOut,
            ));
        }
        AfterFailure::Retry
    }

    /// Creates `topics` as `kafka.topic_creation` says, in one request (a topic that exists
    /// by now is fine). A refusal is a block (for a topic whose `report` is set); a request
    /// that failed as a whole is tried again with the next metadata read.
    async fn create_topics(&self, topics: &[(String, bool)]) {
        if topics.is_empty() {
            return;
        }
        let admin = match self.admin() {
            Ok(admin) => admin,
            Err(e) => {
                return warn!(topics = topics.len(), error = %e, "cannot create an admin client to create topics")
            }
        };
        let specs: Vec<_> = topics
            .iter()
            .map(|(topic, _)| self.creation.spec_for(topic))
            .collect();
        let new: Vec<NewTopic<'_>> = topics
            .iter()
            .zip(&specs)
            .map(|((topic, _), spec)| {
                let mut new = NewTopic::new(
                    topic,
                    spec.partitions,
                    TopicReplication::Fixed(spec.replication_factor),
                );
                for (key, value) in &spec.configs {
                    new = new.set(key, value);
                }
                new
            })
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(CREATE_TIMEOUT));
        let results = match admin.create_topics(&new, &options).await {
            Ok(results) => results,
            Err(e) => {
                return warn!(topics = topics.len(), error = %e, "cannot create the topics; trying again")
            }
        };
        for result in results {
            let (topic, code) = match result {
                Ok(topic) => {
                    if let Some(spec) = topics
                        .iter()
                        .position(|(t, _)| *t == topic)
                        .map(|i| &specs[i])
                    {
                        info!(topic, partitions = spec.partitions,
                            replication_factor = spec.replication_factor, configs = ?spec.configs,
                            "created the topic (kafka.topic_creation)");
                    }
                    continue;
                }
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => continue,
                Err((topic, code)) => (topic, code),
            };
            let report = topics.iter().any(|(t, report)| *t == topic && *report);
            if report {
                self.shared
                    .blocked
                    .block(BlockReason::TopicCreation, &topic, &code);
            } else {
                warn!(topic, error = %code, "the brokers refused to create the topic; trying again")
            }
        }
    }

    /// Reads the record limit (`max.message.bytes`) of topics met for the first time, in one
    /// DescribeConfigs request: every batch must fit it (`sink::limits`;
    /// a producer whose `batch.size` is above it is made again after the first refusal).
    /// When that is not allowed (no DESCRIBE_CONFIGS on the topic) or not answered, the limit
    /// is learned from refusals instead (logged when `warn`: not for a topic read ahead of
    /// its first record, which may not exist yet).
    pub(super) async fn read_limits(&self, topics: Vec<String>, warn: bool) {
        let admin = match self.admin() {
            Ok(admin) => admin,
            Err(e) => {
                return warn!(error = %e, "cannot create an admin client to read the topics' max.message.bytes")
            }
        };
        let resources: Vec<ResourceSpecifier<'_>> =
            topics.iter().map(|t| ResourceSpecifier::Topic(t)).collect();
        let options = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
        let results = match admin.describe_configs(&resources, &options).await {
            Ok(results) => results,
            Err(e) if warn => {
                return warn!(topics = topics.len(), error = %e,
                    "cannot read the topics' max.message.bytes; record limits are learned from Kafka's refusals instead")
            }
            Err(_) => return,
        };
        let limits = self.shared.blocked.limits();
        for (topic, result) in topics.iter().zip(results) {
            if let Ok(config) = &result {
                let value = |name: &str| config.get(name).and_then(|e| e.value.as_deref());
                let window = TimestampWindow::from_config(value);
                tracing::debug!(topic, ?window, "the topic's timestamp window");
                limits.read_window(topic, window);
            }
            let limit = result.as_ref().ok().and_then(|config| {
                config
                    .get("max.message.bytes")
                    .and_then(|e| e.value.as_deref())
                    .and_then(|v| v.parse::<usize>().ok())
            });
            match (limit, result) {
                (Some(limit), _) => limits.read(topic, limit),
                (None, Err(code)) if warn => warn!(topic, error = %code,
                    "cannot read the topic's max.message.bytes (grant the relay DescribeConfigs on it to know it before a refusal); its record limit is learned from Kafka's refusals instead"),
                (None, Err(_)) | (None, Ok(_)) => {}
            }
        }
    }

    /// The admin client that creates topics, made on first use.
    fn admin(&self) -> Result<Arc<LoggedInAdmin<LoginContext>>, KafkaError> {
        let mut admin = self
            .admin
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(admin) = admin.as_ref() {
            return Ok(admin.clone());
        }
        let context = LoginContext::new(&self.login);
        let created = Arc::new(admin_client(&self.admin_config, context, &self.login)?);
        *admin = Some(created.clone());
        Ok(created)
    }

    /// Produces (or fails) the records waiting for `topic`, oldest first; the queue goes
    /// only once empty, so a record sent meanwhile still lines up behind them.
    ///
    /// At-least-once, the first of them goes through the probe producer, and the rest wait
    /// until Kafka wrote it: the producer they go through may not meet a WRITE refusal (it
    /// would be fatal, see `Publisher::with_client_config`). Refused so, all of them are
    /// held. A record that fails for a reason not its own (a transient error, a timestamp
    /// window) fails the rest with it, unsent: the session sends them again in order.
    async fn release_waiting(self: &Arc<Self>, topic: &str, outcome: Result<i32, KafkaError>) {
        let mut probing = self.shared.holds_refusals;
        loop {
            if self.shared.stop.is_cancelled() {
                return;
            }
            let next = {
                let mut topics = self.topics();
                match topics.waiting.get_mut(topic).and_then(VecDeque::pop_front) {
                    Some(next) => next,
                    None => {
                        topics.waiting.remove(topic);
                        return;
                    }
                }
            };
            let partition = partition_of(&next.record, &outcome);
            let refused_before = self
                .shared
                .blocked
                .limits()
                .refused(&next.record.topic, RecordContent::of_record(&next.record));
            let target = partition.as_ref().ok().copied().flatten();
            let result = match (partition, refused_before) {
                // Refused for its own fault before: refused again, not sent.
                (Ok(_), Some(refusal)) => Err(KafkaError::MessageProduction(refusal)),
                (Ok(partition), None) if probing => {
                    let sent = self.probe(&next, partition).await;
                    probing = sent.is_err();
                    sent
                }
                (Ok(partition), None) => {
                    self.shared
                        .produce(&next.record, next.opaque, partition)
                        .await
                }
                (Err(error), _) => Err(error),
            };
            match result {
                Ok(()) => {}
                // The topic refuses us for authorization: held, not failed; what waits behind
                // it is held too (never sent by a producer that has not met the refusal).
                Err(error) if self.shared.holds_refusal(&error) => {
                    self.hold_refused(&next.record, target, next.opaque, &error);
                    self.hold_waiting(topic, &outcome);
                }
                Err(error) => {
                    let own = KafkaFault::of(&error).may_be_own();
                    self.fail(next, error.clone());
                    if !own {
                        self.fail_waiting(topic, &error);
                    }
                }
            }
        }
    }

    /// Fails every record still waiting for `topic` with `error`, unsent.
    fn fail_waiting(&self, topic: &str, error: &KafkaError) {
        let rest = self.topics().waiting.remove(topic).unwrap_or_default();
        for waiting in rest {
            self.fail(waiting, error.clone());
        }
    }

    /// Refreshes a known count in the background; on failure the known one stays, for
    /// another TTL.
    async fn refresh_count(self: Arc<Self>, topic: String, known: i32) {
        let count = self
            .fetch_count(&topic, METADATA_REFRESH_TIMEOUT)
            .await
            .unwrap_or(known);
        let mut topics = self.topics();
        topics.counts.insert(topic.clone(), (count, Instant::now()));
        topics.refreshing.remove(&topic);
    }

    /// The counts of `topics` in one metadata request: for a single topic, a request for it
    /// alone; for more, one for every topic the producer knows (see
    /// `TopicHandles::fetch_counts`). Runs on the blocking pool, as [`Self::fetch_count`].
    async fn fetch_counts(
        &self,
        topics: &[String],
        timeout: Duration,
    ) -> Result<TopicCounts, KafkaError> {
        #[cfg(test)]
        self.metadata_requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let [topic] = topics {
            let count = match self.fetch_count(topic, timeout).await {
                Ok(count) => Ok(count),
                Err(KafkaError::MetadataFetch(code)) => Err(code),
                Err(other) => return Err(other),
            };
            return Ok(TopicCounts::from([(topic.clone(), count)]));
        }
        let shared = self.shared.clone();
        let topics = topics.to_vec();
        tokio::task::spawn_blocking(move || shared.handles.fetch_counts(&topics, timeout))
            .await
            // Only a panic or a runtime shutting down get here.
            .map_err(|_| KafkaError::MetadataFetch(RDKafkaErrorCode::Fail))?
    }

    /// One metadata request for `topic` (which creates it when the brokers auto-create
    /// topics). librdkafka's request blocks its caller, so it runs on the blocking pool.
    async fn fetch_count(&self, topic: &str, timeout: Duration) -> Result<i32, KafkaError> {
        let producer = self.shared.producer.clone();
        let name = topic.to_string();
        let fetched = tokio::task::spawn_blocking(move || {
            producer.client().fetch_metadata(Some(&name), timeout)
        })
        .await
        // Only a panic or a runtime shutting down get here.
        .map_err(|_| KafkaError::MetadataFetch(RDKafkaErrorCode::Fail))?;
        let metadata = fetched?;
        match metadata.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                Ok(t.partitions().len() as i32)
            }
            Some(t) => Err(KafkaError::MetadataFetch(
                t.error()
                    .map_or(RDKafkaErrorCode::UnknownTopicOrPartition, Into::into),
            )),
            None => Err(KafkaError::MetadataFetch(
                RDKafkaErrorCode::UnknownTopicOrPartition,
            )),
        }
    }

    /// Reports a record that never reached librdkafka as a failed delivery, as librdkafka
    /// would have: the session then decides (dead letter, or restart from the slot).
    fn fail(&self, waiting: Waiting, error: KafkaError) {
        self.shared
            .doomed
            .store(true, std::sync::atomic::Ordering::Release);
        let record = &waiting.record;
        warn!(topic = %record.topic, error = %error, "a record waiting for its topic's partition count failed");
        let message = OwnedMessage::new(
            record.payload.as_ref().map(|p| p.to_vec()),
            Some(record.key.to_vec()),
            record.topic.clone(),
            record
                .timestamp_ms
                .map_or(Timestamp::NotAvailable, Timestamp::CreateTime),
            -1,
            -1,
            Some(owned_headers(record)),
        );
        let opaque = Opaque::decode(waiting.opaque);
        let _ = self.shared.deliveries.send(Delivery {
            seq: opaque.seq,
            dead_letter: opaque.dead_letter,
            bytes: record.size(),
            result: Err(DeliveryFailure::new(error, message)),
        });
    }
}

/// The partition a waiting record goes to once its topic's count is read (`outcome`):
/// `Ok(None)` when librdkafka's partitioner takes it as is.
fn partition_of(
    record: &Record,
    outcome: &Result<i32, KafkaError>,
) -> Result<Option<i32>, KafkaError> {
    match (needs_count(record), outcome) {
        (None, _) => Ok(record.partition),
        (Some(key), Ok(count)) => Ok(Some(partition::partition_for_key(key, *count))),
        (Some(_), Err(error)) => Err(error.clone()),
    }
}

/// The bytes a record's partition is hashed from, when that needs the topic's partition
/// count (no explicit partition, a partition key); `None` when librdkafka can take it as is.
fn needs_count(record: &Record) -> Option<&[u8]> {
    record
        .partition_key
        .as_deref()
        .filter(|_| record.partition.is_none())
}

#[path = "partition_counts_refused.rs"]
mod refused;
#[cfg(test)]
#[path = "partition_counts_tests.rs"]
mod tests;
