//! The Kafka side: an idempotent producer with many records in flight, reporting each
//! delivery through a channel instead of awaiting sends one by one.
//!
//! Every record carries its transaction's sequence number as the delivery opaque; the
//! pipeline feeds the acknowledgements to the checkpoint ledger.
//!
//! Nothing here blocks the (single) runtime thread: sending is async, metadata requests run on
//! the blocking pool, a full librdkafka queue is waited out with the runtime's timer, and the
//! producer is torn down on a thread of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::ClientContext;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::blocked::{BlockReason, Blocked};
use super::kafka_latency::{KafkaLatency, STATISTICS_INTERVAL_MS};
use super::partition_counts::Topics;
use super::progress::{progress_value, Progress};
use super::topic_handles::TopicHandles;
use crate::config::{KafkaConfig, TopicCreation};
use crate::mapping::Record;
use crate::sink::TxnSeq;

/// Marks a dead-letter record in the delivery opaque (transaction numbers never get there).
pub(super) const DEAD_LETTER_BIT: usize = 1 << (usize::BITS - 1);
/// The opaque of a progress record (`exactly_once`): its delivery is not reported, since it
/// is no event; a failure shows in the transaction's commit instead.
const PROGRESS_OPAQUE: usize = usize::MAX;

/// What Kafka said about one record.
#[derive(Debug)]
pub struct Delivery {
    pub seq: TxnSeq,
    /// The record was a dead letter (sent with `send_dead_letter`).
    pub dead_letter: bool,
    /// Key + payload bytes of the record, to release from the in-flight count.
    pub bytes: usize,
    pub result: Result<(), DeliveryFailure>,
}

/// A record Kafka did not take, with the record itself so it can be dead-lettered.
#[derive(Debug)]
pub struct DeliveryFailure {
    pub error: KafkaError,
    pub message: OwnedMessage,
}

/// A record Kafka refused, named by topic and event id (never by payload).
#[derive(Debug)]
pub struct Rejection {
    pub topic: String,
    pub event_id: String,
    pub error: KafkaError,
}

impl std::fmt::Display for Rejection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "event {} for topic `{}`: {}",
            self.event_id, self.topic, self.error
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot create the Kafka producer: {0}")]
    Create(#[source] KafkaError),
    #[error("Kafka refused the record: {0}")]
    Rejected(Box<Rejection>),
    #[error("the Kafka producer hit a fatal error: {0}; it will be recreated")]
    Fatal(String),
    /// A Kafka transaction (`exactly_once`) could not be initialised, begun or committed.
    /// Nothing of it is visible to read_committed consumers; the session restarts from the
    /// slot and the progress record.
    #[error("kafka transaction: cannot {what}: {error}")]
    Transaction {
        what: &'static str,
        #[source]
        error: KafkaError,
    },
    /// The progress record (`exactly_once`) could not be read, or its topic made.
    #[error("kafka.progress_topic `{topic}`: {problem}")]
    Progress { topic: String, problem: String },
    /// The progress record says something this database's history contradicts: the relay
    /// cannot tell what Kafka has, so it stops.
    #[error("kafka.progress_topic `{topic}`: {problem}. Fix: if the transactions since the slot's position are to be published again (read_committed consumers then see some twice), delete this slot's progress: produce a tombstone (null value) with key {key} to `{topic}`; or use a new postgres.slot and re-send what the database committed before it with `outbox-relay replay --since <the time of the restore>`")]
    ProgressDiverged {
        topic: String,
        key: String,
        problem: String,
    },
}

impl PublishError {
    /// Transient errors heal by restarting from the slot; the others are about the record, or
    /// a setting. Deployment errors ([`BlockReason`]: a missing ACL) are transient: the
    /// session is retried with back-off until the operator fixed them.
    pub fn is_transient(&self) -> bool {
        match self {
            PublishError::Create(_) | PublishError::Fatal(_) | PublishError::Progress { .. } => {
                true
            }
            PublishError::Rejected(r) => !is_permanent(&r.error),
            PublishError::ProgressDiverged { .. } => false,
            // Fenced is transient too: the relay that fenced us holds the slot, so the next
            // session waits as a standby.
            PublishError::Transaction { error, .. } => !matches!(
                error.rdkafka_error_code(),
                Some(
                    RDKafkaErrorCode::InvalidTransactionTimeout
                        | RDKafkaErrorCode::UnsupportedVersion
                        | RDKafkaErrorCode::UnsupportedForMessageFormat
                )
            ),
        }
    }
}

/// Errors that no retry of the same record will heal: the record itself is wrong for Kafka.
/// A missing ACL is not one of them: it is the deployment's, and heals once granted
/// ([`BlockReason`]).
pub fn is_permanent(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidTopic
                | RDKafkaErrorCode::InvalidRecord
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::MessageBatchTooLarge
        )
    )
}

/// Receives librdkafka callbacks on its polling thread and forwards deliveries.
pub struct DeliveryReporter {
    deliveries: mpsc::UnboundedSender<Delivery>,
    errors_logged: Mutex<ErrorLog>,
    latency: Arc<KafkaLatency>,
    blocked: Arc<Blocked>,
}

/// librdkafka reports a broker that is down every few tens of milliseconds: one line per
/// [`ERROR_LOG_INTERVAL`] says it, with how many were not logged.
#[derive(Default)]
struct ErrorLog {
    last: Option<Instant>,
    suppressed: u64,
}

const ERROR_LOG_INTERVAL: Duration = Duration::from_secs(10);

impl ClientContext for DeliveryReporter {
    // Only the latency is read, straight from the JSON: rust-rdkafka's full `Statistics`
    // (every partition of every topic) is not needed.
    fn stats_raw(&self, json: &[u8]) {
        if let Err(e) = self.latency.update(json) {
            debug!(error = %e, "cannot read librdkafka's statistics");
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // Broker connection problems are reported here; librdkafka retries by itself.
        // Cluster-wide refusals come here, with no topic: a refused login, no
        // IDEMPOTENT_WRITE for the idempotent producer.
        if let Some(block @ (BlockReason::Authentication | BlockReason::ClusterAuthorization)) =
            BlockReason::of(&error)
        {
            self.blocked.block(block, "", &format!("{error}: {reason}"));
        }
        let mut log = self
            .errors_logged
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if log.last.is_some_and(|at| at.elapsed() < ERROR_LOG_INTERVAL) {
            log.suppressed += 1;
            return;
        }
        let suppressed = std::mem::take(&mut log.suppressed);
        log.last = Some(Instant::now());
        warn!(error = %error, reason, suppressed,
            "kafka client error; the producer keeps retrying");
    }
}

impl ProducerContext for DeliveryReporter {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, seq: usize) {
        if seq == PROGRESS_OPAQUE {
            return;
        }
        let (bytes, result) = match result {
            Ok(m) => {
                self.blocked.delivered(m.topic());
                (m.payload_len() + m.key_len(), Ok(()))
            }
            Err((error, m)) => {
                if let Some(reason) = BlockReason::of(error) {
                    self.blocked.block(reason, m.topic(), error);
                }
                (
                    m.payload_len() + m.key_len(),
                    Err(DeliveryFailure {
                        error: error.clone(),
                        message: m.detach(),
                    }),
                )
            }
        };
        // The receiver is gone only when the pipeline has been torn down: nothing to tell.
        let _ = self.deliveries.send(Delivery {
            seq: (seq & !DEAD_LETTER_BIT) as TxnSeq,
            dead_letter: seq & DEAD_LETTER_BIT != 0,
            bytes,
            result,
        });
    }
}

/// How long one poll of librdkafka's event queue may wait. It returns at the first delivery
/// report, so this bounds only how quickly the poller notices it should stop.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

pub struct Publisher {
    shared: Arc<Shared>,
    /// Set in `exactly_once`: where the progress record of each transaction goes.
    progress: Option<Arc<ProgressRecord>>,
    /// Serves delivery callbacks. rdkafka's `ThreadedProducer` polls every 100 ms and then
    /// spins on 0 ms polls for the last millisecond (its timeout rounds down): ~1 % of a core
    /// forever on an idle relay. Our own thread polls with a long timeout instead.
    poller: Option<Poller>,
}

/// What the publisher shares with its background topic readers.
pub(super) struct Shared {
    pub(super) producer: Arc<BaseProducer<DeliveryReporter>>,
    /// What records are produced through, so that librdkafka need not look their topic up
    /// by name. It holds a producer reference of its own and destroys its topic handles
    /// before dropping it, as librdkafka's destroy requires.
    pub(super) handles: TopicHandles<DeliveryReporter>,
    pub(super) topics: Mutex<Topics>,
    /// Where failures of records that never reached librdkafka are reported.
    pub(super) deliveries: mpsc::UnboundedSender<Delivery>,
    /// How long a record may wait for its topic's partition count while the brokers cannot
    /// be reached: librdkafka's own `message.timeout.ms` for records in its queue.
    pub(super) message_timeout: Duration,
    /// Cancelled when the publisher goes: background readers stop.
    pub(super) stop: CancellationToken,
    /// What Kafka refuses for deployment reasons (missing ACLs, topics), shared with the
    /// metrics; records it stops wait.
    pub(super) blocked: Arc<Blocked>,
    /// `kafka.topic_creation`, and the settings of the admin client that creates topics.
    pub(super) creation: TopicCreation,
    pub(super) admin_config: ClientConfig,
    pub(super) admin:
        Mutex<Option<Arc<rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext>>>>,
    /// A record of the open Kafka transaction failed before librdkafka saw it
    /// (`exactly_once`): the transaction must abort, never commit.
    pub(super) doomed: AtomicBool,
    /// A `skip_linger` runs.
    skipping_linger: AtomicBool,
}

/// The longest `skip_linger` keeps librdkafka's flushing flag up: time for its broker threads
/// to wake up, short because every record handed over meanwhile skips the linger too (more,
/// smaller produce requests). A broker thread that misses it only means the usual linger.
/// The flush ends sooner once nothing is outstanding.
const SKIP_LINGER_WINDOW: Duration = Duration::from_millis(1);
/// How long a record waits for room in a full librdkafka queue before it is refused.
const QUEUE_FULL_WAIT: Duration = Duration::from_secs(1);
/// The progress record written into every Kafka transaction (`exactly_once`).
#[derive(Debug, Clone)]
pub struct ProgressRecord {
    pub topic: String,
    pub partition: i32,
    pub key: Vec<u8>,
    /// The server's timeline, written into each value.
    pub timeline: u32,
}

/// `transaction.timeout.ms` unless `kafka.properties` sets it (librdkafka's default).
const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;

/// How long committing (or initialising) a Kafka transaction may take before it fails and
/// the session restarts. Above a short broker outage; below `transaction.timeout.ms`.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a session's way out waits for an abort.
const ABORT_TIMEOUT: Duration = Duration::from_secs(5);

impl Publisher {
    /// Creates the producer; deliveries arrive on the returned channel.
    pub fn new(
        config: &KafkaConfig,
    ) -> Result<(Publisher, mpsc::UnboundedReceiver<Delivery>), PublishError> {
        Publisher::reporting_blocks(config, Arc::new(Blocked::new(config)))
    }

    /// [`Publisher::new`], keeping what Kafka refuses in `blocked` (which outlives sessions).
    pub fn reporting_blocks(
        config: &KafkaConfig,
        blocked: Arc<Blocked>,
    ) -> Result<(Publisher, mpsc::UnboundedReceiver<Delivery>), PublishError> {
        Publisher::with_client_config(config, client_config(config), None, blocked)
    }

    /// A transactional producer (`exactly_once`) with `transactional_id`, initialised: older
    /// producers with the same id are fenced and their open transaction aborted. Every
    /// transaction it commits carries `progress`.
    pub async fn transactional(
        config: &KafkaConfig,
        transactional_id: &str,
        progress: ProgressRecord,
        blocked: Arc<Blocked>,
    ) -> Result<(Publisher, mpsc::UnboundedReceiver<Delivery>), PublishError> {
        let mut client = client_config(config);
        // How long the broker keeps a transaction of a vanished relay open (blocking
        // read_committed consumers of its partitions) unless a new session fences it first.
        // librdkafka refuses message.timeout.ms above it, so that one is capped.
        let txn_timeout = transaction_timeout_ms(config);
        client
            .set("transactional.id", transactional_id)
            .set("transaction.timeout.ms", txn_timeout.to_string())
            .set(
                "message.timeout.ms",
                config.message_timeout_ms.min(txn_timeout).to_string(),
            );
        let (publisher, rx) = Publisher::with_client_config(
            config,
            client,
            Some(Arc::new(progress)),
            blocked.clone(),
        )?;
        let producer = publisher.shared.producer.clone();
        let initialised =
            tokio::task::spawn_blocking(move || producer.init_transactions(TRANSACTION_TIMEOUT))
                .await
                // Only a panic or a runtime shutting down get here.
                .map_err(|_| KafkaError::Canceled)
                .and_then(|r| r);
        let id_refused = BlockReason::TransactionalIdAuthorization;
        match initialised {
            Ok(()) => blocked.clear(id_refused, transactional_id),
            Err(error) => {
                if let Some(reason) = BlockReason::of(&error) {
                    let subject = if reason == id_refused {
                        transactional_id
                    } else {
                        ""
                    };
                    blocked.block(reason, subject, &error);
                }
                return Err(PublishError::Transaction {
                    what: "initialise (init_transactions)",
                    error,
                });
            }
        }
        Ok((publisher, rx))
    }

    fn with_client_config(
        config: &KafkaConfig,
        mut client: ClientConfig,
        progress: Option<Arc<ProgressRecord>>,
        blocked: Arc<Blocked>,
    ) -> Result<(Publisher, mpsc::UnboundedReceiver<Delivery>), PublishError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let reporter = DeliveryReporter {
            deliveries: tx.clone(),
            errors_logged: Mutex::new(ErrorLog::default()),
            latency: Arc::default(),
            blocked: blocked.clone(),
        };
        if !config.properties.contains_key("statistics.interval.ms") {
            client.set("statistics.interval.ms", STATISTICS_INTERVAL_MS.to_string());
        }
        let producer: Arc<BaseProducer<DeliveryReporter>> = Arc::new(
            client
                .create_with_context(reporter)
                .map_err(PublishError::Create)?,
        );
        let poller = Poller::start(producer.clone()).map_err(|e| {
            PublishError::Create(KafkaError::ClientCreation(format!(
                "cannot start the delivery thread: {e}"
            )))
        })?;
        let shared = Arc::new(Shared {
            handles: TopicHandles::new(producer.clone()),
            producer,
            topics: Mutex::new(Topics::default()),
            deliveries: tx,
            message_timeout: Duration::from_millis(config.message_timeout_ms),
            stop: CancellationToken::new(),
            skipping_linger: AtomicBool::new(false),
            blocked,
            creation: config.topic_creation.clone(),
            admin_config: admin_config(config),
            admin: Mutex::new(None),
            doomed: AtomicBool::new(false),
        });
        Ok((
            Publisher {
                shared,
                progress,
                poller: Some(poller),
            },
            rx,
        ))
    }

    /// Hands a record to librdkafka; the outcome arrives later as a `Delivery`.
    ///
    /// Never waits for the brokers: a record whose topic's partition count is not known yet
    /// waits in that topic's queue (in order) while the count is read in the background, and
    /// counts as sent. It waits (without blocking the thread) only while librdkafka's queue is
    /// full, which the relay's in-flight caps make rare.
    pub async fn send(
        &self,
        record: &Record,
        seq: TxnSeq,
        event_id: &str,
    ) -> Result<(), PublishError> {
        self.send_with_opaque(record, seq as usize, event_id).await
    }

    /// Sends a dead letter for transaction `seq`; its `Delivery` has `dead_letter` set.
    pub async fn send_dead_letter(
        &self,
        record: &Record,
        seq: TxnSeq,
        event_id: &str,
    ) -> Result<(), PublishError> {
        self.send_with_opaque(record, seq as usize | DEAD_LETTER_BIT, event_id)
            .await
    }

    async fn send_with_opaque(
        &self,
        record: &Record,
        opaque: usize,
        event_id: &str,
    ) -> Result<(), PublishError> {
        let Some(partition) = self.shared.route(record, opaque) else {
            return Ok(());
        };
        self.shared
            .produce(record, opaque, partition)
            .await
            .map_err(|error| {
                PublishError::Rejected(Box::new(Rejection {
                    topic: record.topic.clone(),
                    event_id: event_id.to_string(),
                    error,
                }))
            })
    }

    /// Opens a Kafka transaction (`exactly_once`): a local state change in librdkafka.
    pub fn begin_transaction(&self) -> Result<(), PublishError> {
        self.shared.doomed.store(false, Ordering::Release);
        self.shared
            .producer
            .begin_transaction()
            .map_err(|error| PublishError::Transaction {
                what: "begin",
                error,
            })
    }

    /// Commits the open transaction with its progress record (`at`: where the stream stands
    /// once it is in), in the background; the outcome arrives on the channel.
    /// Records still waiting for their topic's partition count are produced first, so that
    /// each goes into this transaction. When it succeeds, every record of the transaction is
    /// in Kafka, and (commit flushes) its delivery report is on its way.
    pub fn commit_transaction(&self, at: Progress) -> oneshot::Receiver<Result<(), PublishError>> {
        let (tx, rx) = oneshot::channel();
        let shared = self.shared.clone();
        let progress = self.progress.clone();
        tokio::spawn(async move {
            let result = match progress {
                Some(progress) => shared.commit(&progress, at).await,
                None => Err(PublishError::Transaction {
                    what: "commit",
                    // A wiring error: the session asks only in `exactly_once`.
                    error: KafkaError::Canceled,
                }),
            };
            let _ = tx.send(result);
        });
        rx
    }

    /// Aborts the open transaction (best effort, on a session's way out), so that
    /// read_committed consumers need not wait for `transaction.timeout.ms`.
    pub async fn abort_transaction(&self) {
        let producer = self.shared.producer.clone();
        let aborted =
            tokio::task::spawn_blocking(move || producer.abort_transaction(ABORT_TIMEOUT)).await;
        if let Ok(Err(e)) = aborted {
            warn!(error = %e, "cannot abort the kafka transaction; the broker ends it after transaction.timeout.ms, or the next session does");
        }
    }

    /// How many topic handles the producer holds (one per topic written to).
    #[cfg(test)]
    pub(super) fn topic_handle_count(&self) -> usize {
        self.shared.handles.len()
    }

    /// Kafka's share of the latency, per broker (librdkafka's statistics).
    pub fn kafka_latency(&self) -> Arc<KafkaLatency> {
        self.shared.producer.context().latency.clone()
    }

    /// Has librdkafka send the records it holds now rather than after `linger.ms` (adaptive
    /// batching: the record just sent was the only one in flight).
    ///
    /// librdkafka's flush raises a flag that makes its broker threads treat the linger as
    /// over, and wakes them; flushing for up to [`SKIP_LINGER_WINDOW`] keeps the flag up until
    /// they saw it. It runs on the blocking pool, one at a time. The delivery reports still
    /// come through the poller (rust-rdkafka's producer takes them as events, which flush
    /// only waits for).
    pub fn skip_linger(&self) {
        if self.shared.skipping_linger.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            let window = SKIP_LINGER_WINDOW.as_millis() as i32;
            // SAFETY: the producer is alive (`shared` holds it) for the whole call; flush is
            // thread safe and only waits (for the outstanding count, or the timeout).
            unsafe {
                rdkafka::bindings::rd_kafka_flush(shared.producer.client().native_ptr(), window)
            };
            shared.skipping_linger.store(false, Ordering::Release);
        });
    }

    /// What Kafka refuses for deployment reasons now (shared with the metrics).
    pub fn blocked(&self) -> Arc<Blocked> {
        self.shared.blocked.clone()
    }

    /// The producer's fatal error, after which every send fails and it must be recreated.
    pub fn fatal_error(&self) -> Option<String> {
        self.shared
            .producer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code:?}: {reason}"))
    }
}

impl Shared {
    async fn commit(&self, progress: &ProgressRecord, at: Progress) -> Result<(), PublishError> {
        let failed = |what, error| PublishError::Transaction { what, error };
        let give_up = Instant::now() + self.message_timeout;
        self.wait_while(give_up, || self.topics().any_waiting())
            .await
            .map_err(|e| failed("commit (records wait for a partition count)", e))?;
        let value = progress_value(at, progress.timeline);
        let record = Record {
            topic: progress.topic.clone(),
            key: progress.key.clone().into(),
            payload: Some(value.into_bytes().into()),
            headers: Vec::new(),
            timestamp_ms: None,
            partition: Some(progress.partition),
            partition_key: None,
        };
        self.produce(&record, PROGRESS_OPAQUE, Some(progress.partition))
            .await
            .map_err(|e| failed("send the progress record", e))?;
        // Every record acknowledged and its report handed to the session before committing:
        // rust-rdkafka's `commit_transaction` flushes by polling the report queue for up to
        // 100 ms at a time, and the reports go to our poller thread instead, so every commit
        // with a record still in flight (the progress record always is) took 100 ms more.
        // With nothing outstanding, its flush returns at once.
        self.wait_while(give_up, || self.producer.in_flight_count() > 0)
            .await
            .map_err(|e| failed("commit", e))?;
        // A record that never reached librdkafka failed (its failure is on its way to the
        // session): librdkafka would commit without it, so the transaction is aborted.
        if self.doomed.load(Ordering::Acquire) {
            return Err(failed(
                "commit (a record of the transaction failed)",
                KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut),
            ));
        }
        let producer = self.producer.clone();
        tokio::task::spawn_blocking(move || producer.commit_transaction(TRANSACTION_TIMEOUT))
            .await
            // Only a panic or a runtime shutting down get here.
            .map_err(|_| KafkaError::Canceled)
            .and_then(|r| r)
            .map_err(|e| failed("commit", e))
    }

    /// Waits (1 ms steps, on the runtime's timer) while `busy` holds; fails as a timed-out
    /// message at `give_up` or when the publisher goes.
    async fn wait_while(
        &self,
        give_up: Instant,
        busy: impl Fn() -> bool,
    ) -> Result<(), KafkaError> {
        while busy() {
            if Instant::now() >= give_up || self.stop.is_cancelled() {
                return Err(KafkaError::MessageProduction(
                    RDKafkaErrorCode::MessageTimedOut,
                ));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }

    pub(super) fn topics(&self) -> std::sync::MutexGuard<'_, Topics> {
        self.topics.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Hands one record to librdkafka, waiting out a full queue on the runtime's timer.
    pub(super) async fn produce(
        &self,
        record: &Record,
        opaque: usize,
        partition: Option<i32>,
    ) -> Result<(), KafkaError> {
        let give_up = Instant::now() + QUEUE_FULL_WAIT;
        loop {
            match self.handles.send(record, partition, opaque) {
                Ok(()) => return Ok(()),
                Err(KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull))
                    if Instant::now() < give_up =>
                {
                    // Our in-flight cap sits below librdkafka's queue limit, so this is rare:
                    // give the polling thread a moment to drain callbacks.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

pub(super) fn owned_headers(record: &Record) -> OwnedHeaders {
    record.headers.iter().fold(
        OwnedHeaders::new_with_capacity(record.headers.len()),
        |h, (k, v)| {
            h.insert(Header {
                key: k,
                value: Some(&v[..]),
            })
        },
    )
}

/// librdkafka settings: ours first, then the user's pass-through properties (validated by
/// the config so that none of them weakens the delivery guarantee).
pub fn client_config(config: &KafkaConfig) -> ClientConfig {
    let mut c = ClientConfig::new();
    let queue_kbytes = (config.max_in_flight_bytes * 4 / 1024).max(64 * 1024);
    c.set("bootstrap.servers", &config.brokers)
        .set("client.id", &config.client_id)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", config.linger_ms.to_string())
        .set("batch.num.messages", config.batch_num_messages.to_string())
        .set("compression.type", config.compression.as_str())
        .set("message.timeout.ms", config.message_timeout_ms.to_string())
        .set("partitioner", "murmur2_random")
        // A broker connection that died without a FIN/RST is noticed by the kernel.
        .set("socket.keepalive.enable", "true")
        .set(
            "queue.buffering.max.messages",
            (config.max_in_flight_messages * 2).to_string(),
        )
        .set("queue.buffering.max.kbytes", queue_kbytes.to_string());
    set_security(&mut c, config);
    for (key, value) in &config.properties {
        c.set(key, value);
    }
    c
}

/// `transaction.timeout.ms` as the producer gets it: from `kafka.properties`, else 60000.
pub fn transaction_timeout_ms(config: &KafkaConfig) -> u64 {
    config
        .properties
        .get("transaction.timeout.ms")
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(DEFAULT_TRANSACTION_TIMEOUT_MS)
}

/// The settings of the admin client that creates topics: the producer's connection and
/// security, without idempotence (an admin client sends no records).
fn admin_config(config: &KafkaConfig) -> ClientConfig {
    let mut c = client_config(config);
    c.set("enable.idempotence", "false");
    c
}

/// TLS and SASL settings from their dedicated fields.
fn set_security(c: &mut ClientConfig, config: &KafkaConfig) {
    let protocol = config.security_protocol;
    c.set("security.protocol", protocol.as_str());
    if let Some(ca) = config.ssl_ca_file.as_ref().filter(|_| protocol.uses_tls()) {
        c.set("ssl.ca.location", ca.display().to_string());
    }
    if config.uses_oauthbearer() {
        for (key, value) in config.oauthbearer.librdkafka_properties() {
            c.set(key, value);
        }
    } else if protocol.uses_sasl() {
        let password = config.sasl_password().unwrap_or_else(|e| {
            warn!(error = %e, "cannot read kafka.sasl_password_file; authenticating without a password");
            crate::config::Secret::new("")
        });
        c.set(
            "sasl.mechanism",
            config.sasl_mechanism.clone().unwrap_or_default(),
        )
        .set(
            "sasl.username",
            config.sasl_username.clone().unwrap_or_default(),
        )
        .set("sasl.password", password.expose());
    }
}

impl DeliveryFailure {
    /// The failure as a rejection: topic and event id (the key), without the payload.
    pub fn rejection(&self) -> Rejection {
        Rejection {
            topic: self.message.topic().to_string(),
            event_id: self
                .message
                .key()
                .map(|k| String::from_utf8_lossy(k).into_owned())
                .unwrap_or_default(),
            error: self.error.clone(),
        }
    }
}

/// How long the teardown thread waits to hold the producer's last reference.
const TEARDOWN_WAIT: Duration = Duration::from_secs(1);

/// The thread that serves librdkafka's delivery callbacks until stopped.
struct Poller {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Poller {
    fn start(producer: Arc<BaseProducer<DeliveryReporter>>) -> std::io::Result<Poller> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("kafka-deliveries".into())
            .spawn(move || {
                while !stopping.load(Ordering::Relaxed) {
                    producer.poll(POLL_INTERVAL);
                }
            })?;
        Ok(Poller { stop, thread })
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        // Stop polling first; the producer itself purges and flushes (up to 500 ms) when its
        // last Arc goes. The poll in progress ends within POLL_INTERVAL. Both would stall the
        // runtime thread, so inside a runtime they are waited out on a thread of their own.
        let Some(poller) = self.poller.take() else {
            return;
        };
        poller.stop.store(true, Ordering::Relaxed);
        self.shared.stop.cancel();
        let producer = self.shared.producer.clone();
        let teardown = move || {
            let _ = poller.thread.join();
            // Let `self.shared` go first (it is dropped right after this function), so that
            // librdkafka's destroy runs here and not on the runtime thread. `Shared` holds two
            // references (its own and its topic handles'); the handles are destroyed before
            // their reference goes, so none is alive at the destroy.
            let waited = Instant::now();
            while Arc::strong_count(&producer) > 1 && waited.elapsed() < TEARDOWN_WAIT {
                std::thread::sleep(Duration::from_millis(1));
            }
            drop(producer);
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return teardown();
        }
        if let Err(e) = std::thread::Builder::new()
            .name("kafka-teardown".into())
            .spawn(teardown)
        {
            warn!(error = %e, "cannot start the producer teardown thread; the producer is leaked");
        }
    }
}
