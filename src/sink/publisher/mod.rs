//! The Kafka side: an idempotent producer with many records in flight, reporting each
//! delivery through a channel instead of awaiting sends one by one.
//!
//! Every record carries its transaction's sequence number as the delivery opaque; the
//! pipeline feeds the acknowledgements to the checkpoint ledger.
//!
//! Nothing here blocks the (single) runtime thread: sending is async, metadata requests run on
//! the blocking pool, a full librdkafka queue is waited out with the runtime's timer, and the
//! producer is torn down on a thread of its own.
//!
//! The parts, each depending only on those listed before it: `client` (librdkafka
//! settings), `delivery` (what comes back: deliveries, errors, the callback context),
//! `topic_handles` (the FFI fast path), `producer` (the producer every part sends through),
//! `partition_counts` (the gate of each new topic), [`progress`] (the exactly-once progress
//! record). This file is the [`Publisher`] that wires them, and nothing below imports it.

mod client;
mod delivery;
pub mod login;
mod login_admin;
#[allow(
    unsafe_code,
    reason = "FFI: rd_kafka_oauthbearer_set_token for the admin client, whose rust-rdkafka wrapper never delivers the token request (fede1024/rust-rdkafka#757), and for a new token after a lost connection; the admin client's main queue, for its errors"
)]
mod login_ffi;
mod partition_counts;
mod producer;
pub mod progress;
#[cfg(test)]
mod tests;
#[allow(
    unsafe_code,
    reason = "FFI: cached librdkafka topic handles and rd_kafka_producev, which rust-rdkafka does not expose"
)]
mod topic_handles;
#[cfg(test)]
mod topic_handles_tests;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, Producer};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::blocked::{BlockReason, Blocked};
use super::fault::KafkaFault;
use super::kafka_latency::{KafkaLatency, STATISTICS_INTERVAL_MS};
use super::limits::{RecordContent, SizeRefusal, DEFAULT_BATCH_SIZE, DEFAULT_MESSAGE_MAX_BYTES};
use crate::config::KafkaConfig;
use crate::mapping::Record;
use crate::sink::traces;
use crate::sink::TxnSeq;
use client::admin_config;
pub use client::{client_config, consumer_config, transaction_timeout_ms};
pub use delivery::{
    waits_at_gate, Delivery, DeliveryFailure, DeliveryReporter, PublishError, Rejection,
};
use delivery::{Opaque, PROGRESS_OPAQUE};
pub use login::{KafkaLogin, LoginContext};
pub use login_admin::{admin_client, LoggedInAdmin};
use partition_counts::PartitionCounts;
use producer::Shared;
use progress::{progress_value, Progress, ProgressRecord};
use topic_handles::TopicHandles;

/// How long one poll of librdkafka's event queue may wait. It returns at the first delivery
/// report, so this bounds only how quickly the poller notices it should stop.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

pub struct Publisher {
    shared: Arc<Shared>,
    /// Routes each record to its partition, holding back those of a topic whose partition
    /// count is not known yet.
    counts: Arc<PartitionCounts>,
    /// Set in `exactly_once`: where the progress record of each transaction goes.
    progress: Option<Arc<ProgressRecord>>,
    /// The place of the next record among those sent for its transaction: (the transaction,
    /// records sent for it so far). Carried in the opaque ([`Opaque`]).
    places: Mutex<(TxnSeq, usize)>,
    /// Serves delivery callbacks. rdkafka's `ThreadedProducer` polls every 100 ms and then
    /// spins on 0 ms polls for the last millisecond (its timeout rounds down): ~1 % of a core
    /// forever on an idle relay. Our own thread polls with a long timeout instead.
    poller: Option<Poller>,
}

/// The longest `skip_linger` keeps librdkafka's flushing flag up: time for its broker threads
/// to wake up, short because every record handed over meanwhile skips the linger too (more,
/// smaller produce requests). A broker thread that misses it only means the usual linger.
/// The flush ends sooner once nothing is outstanding.
const SKIP_LINGER_WINDOW: Duration = Duration::from_millis(1);

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
                if let Some(reason) = KafkaFault::of(&error).block() {
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
        let login = KafkaLogin::from_config(config);
        // At-least-once: a topic that refuses records when they are sent holds them in the
        // gate (`partition_counts_refused.rs`). Exactly-once: such a failure dooms the Kafka
        // transaction, which the session aborts and starts again.
        let runtime = tokio::runtime::Handle::try_current().ok();
        let (refusals, refused) = match (&progress, &runtime) {
            (None, Some(_)) => {
                let (tx, rx) = mpsc::unbounded_channel();
                (Some(tx), Some(rx))
            }
            _ => (None, None),
        };
        let holds_refusals = refusals.is_some();
        // At-least-once: a batch refused for good (too large, invalid, a timestamp) makes the
        // producer fatal rather than bump its epoch and write the partition's later batches
        // ahead of the refused records' re-send (`rd_kafka_handle_Produce_error`,
        // rdkafka_request.c, librdkafka 2.12): the session restarts from the slot with what
        // the refusal taught (`sink::limits`), so no event reaches Kafka after a later one of
        // its partition. A WRITE refusal would be fatal too, so a topic's first record of a
        // session and a held topic's probes go through the gate's probe producer instead
        // (`partition_counts_refused.rs`), and a refusal in a delivery report (WRITE revoked
        // mid-stream) goes to the session, which restarts: its records are held by the next
        // session's gate as they were made, not as the report gives them back (without their
        // timestamp). A transactional producer aborts instead.
        let gapless = holds_refusals && !config.properties.contains_key("enable.gapless.guarantee");
        let (refusals, refused) = if gapless {
            client.set("enable.gapless.guarantee", "true");
            (None, None)
        } else {
            (refusals, refused)
        };
        let reporter = DeliveryReporter::new(tx.clone(), refusals, blocked.clone(), login.clone());
        if !config.properties.contains_key("statistics.interval.ms") {
            client.set("statistics.interval.ms", STATISTICS_INTERVAL_MS.to_string());
        }
        let batch_size = capped_batch_size(config, &mut client, &blocked);
        let producer: Arc<BaseProducer<DeliveryReporter>> = Arc::new(
            client
                .create_with_context(reporter)
                .map_err(PublishError::Create)?,
        );
        login::attach(producer.client());
        let poller = Poller::start(producer.clone()).map_err(|e| {
            PublishError::Create(KafkaError::ClientCreation(format!(
                "cannot start the delivery thread: {e}"
            )))
        })?;
        let shared = Arc::new(Shared {
            handles: TopicHandles::new(producer.clone()),
            producer,
            deliveries: tx,
            message_timeout: effective_message_timeout(&client, config),
            stop: CancellationToken::new(),
            skipping_linger: AtomicBool::new(false),
            blocked,
            doomed: AtomicBool::new(false),
            holds_refusals,
            batch_size,
            message_max_bytes: message_max_bytes(config),
        });
        let counts = Arc::new(PartitionCounts::new(
            shared.clone(),
            config.topic_creation.clone(),
            admin_config(config),
            login,
        ));
        if let (Some(runtime), Some(refused)) = (runtime, refused) {
            runtime.spawn(counts.clone().serve_refusals(refused));
        }
        Ok((
            Publisher {
                shared,
                counts,
                progress,
                places: Mutex::new((0, 0)),
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
        let opaque = self.opaque(seq, false)?;
        self.send_with_opaque(record, opaque, event_id).await
    }

    /// Sends a dead letter for transaction `seq`; its `Delivery` has `dead_letter` set.
    pub async fn send_dead_letter(
        &self,
        record: &Record,
        seq: TxnSeq,
        event_id: &str,
    ) -> Result<(), PublishError> {
        let opaque = self.opaque(seq, true)?;
        self.send_with_opaque(record, opaque, event_id).await
    }

    /// The opaque of the next record sent for transaction `seq` (sends come in order, from one
    /// session at a time).
    fn opaque(&self, seq: TxnSeq, dead_letter: bool) -> Result<usize, PublishError> {
        let mut places = self.places.lock().unwrap_or_else(PoisonError::into_inner);
        let place = if places.0 == seq { places.1 } else { 0 };
        *places = (seq, place + 1);
        Opaque {
            seq,
            place,
            dead_letter,
        }
        .encode()
        .ok_or_else(|| {
            PublishError::Fatal(format!(
                "transaction number {seq} is past what a delivery report can carry; a new session numbers from 0"
            ))
        })
    }

    async fn send_with_opaque(
        &self,
        record: &Record,
        opaque: usize,
        event_id: &str,
    ) -> Result<(), PublishError> {
        // A record its topic refused for its own fault before (too large alone, invalid) is
        // refused again before it is sent: at-least-once, so that it does not take a batch of
        // healthy neighbours down with it again; exactly-once, so that it is dead-lettered
        // inside the Kafka transaction.
        if let Some(refusal) = self
            .shared
            .blocked
            .limits()
            .refused(&record.topic, RecordContent::of_record(record))
        {
            return Err(PublishError::Rejected(Box::new(Rejection::new(
                record.topic.clone(),
                event_id.to_string(),
                KafkaError::MessageProduction(refusal),
            ))));
        }
        // Over the producer's `message.max.bytes` by its bytes alone: librdkafka refuses it when
        // it is produced (`rd_kafka_msg_new0`), which for a record waiting for its topic's
        // first read comes after the session let go of its row, which the record's dead letter
        // may need (`sink::dead_letter`). Refused here, as librdkafka would.
        if record.wire_bytes() > self.shared.message_max_bytes {
            return Err(PublishError::Rejected(Box::new(Rejection::new(
                record.topic.clone(),
                event_id.to_string(),
                KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge),
            ))));
        }
        let Some(partition) = self.counts.route(record, opaque) else {
            return Ok(());
        };
        match self.shared.produce(record, opaque, partition).await {
            Ok(()) => Ok(()),
            // librdkafka knows the topic refuses us (its metadata says so): held like a
            // refusal in a delivery report, not failed.
            Err(error) if self.shared.holds_refusal(&error) => {
                self.counts.hold_refused(record, partition, opaque, &error);
                Ok(())
            }
            Err(error) => Err(PublishError::Rejected(Box::new(Rejection::new(
                record.topic.clone(),
                event_id.to_string(),
                error,
            )))),
        }
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
        let counts = self.counts.clone();
        let progress = self.progress.clone();
        tokio::spawn(async move {
            let result = match progress {
                Some(progress) => commit(&shared, &counts, &progress, at).await,
                None => Err(PublishError::Transaction {
                    what: "commit",
                    // A wiring error: the session asks only in `exactly_once`.
                    error: KafkaError::Canceled,
                }),
            };
            if let Some(traces) = traces::active() {
                match &result {
                    Ok(()) => traces.committed(),
                    Err(_) => traces.aborted(),
                }
            }
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
        if let Some(traces) = traces::active() {
            traces.aborted();
        }
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
        self.shared.producer.context().latency()
    }

    /// Has librdkafka send the records it holds now rather than after `linger.ms` (adaptive
    /// batching: the record just sent was the only one in flight).
    ///
    /// librdkafka's flush raises a flag that makes its broker threads treat the linger as
    /// over, and wakes them; flushing for up to [`SKIP_LINGER_WINDOW`] keeps the flag up until
    /// they saw it. It runs on the blocking pool, one at a time. The delivery reports still
    /// come through the poller (rust-rdkafka's producer takes them as events, which flush
    /// only waits for).
    #[allow(
        unsafe_code,
        reason = "FFI: librdkafka's rd_kafka_flush, which rust-rdkafka does not expose without waiting on its events"
    )]
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

    /// Judges a record Kafka refused as too large (see `sink::limits`): its own fault, or
    /// its batch's (what is learned of the topic's limit then shapes the next producer).
    pub fn judge_size_refusal(&self, failure: &DeliveryFailure) -> SizeRefusal {
        use rdkafka::message::Message;
        self.shared.blocked.limits().judge(
            failure.message.topic(),
            failure.content(),
            self.shared.batch_size,
        )
    }

    /// The most a record of `topic` may hold: the topic's `max.message.bytes` when read, and
    /// the producer's `message.max.bytes`.
    pub fn record_limit(&self, topic: &str) -> usize {
        let topic_limit = self.shared.blocked.limits().record_limit(topic);
        topic_limit.map_or(self.shared.message_max_bytes, |l| {
            l.min(self.shared.message_max_bytes)
        })
    }

    /// Reads `topic`'s record limit (DescribeConfigs) unless it is known; a topic the relay
    /// may not describe keeps it unknown (learned from refusals instead). The dead-letter
    /// topic's, read before the first dead letter is cut to it.
    pub async fn read_limit(&self, topic: &str) {
        if self.shared.blocked.limits().record_limit(topic).is_none() {
            self.counts
                .read_limits(vec![topic.to_string()], false)
                .await;
        }
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

/// Commits the open transaction with its progress record: first the records still waiting for
/// a partition count, then the progress record, then every delivery report, then the commit.
async fn commit(
    shared: &Shared,
    counts: &PartitionCounts,
    progress: &ProgressRecord,
    at: Progress,
) -> Result<(), PublishError> {
    let failed = |what, error| PublishError::Transaction { what, error };
    let give_up = Instant::now() + shared.message_timeout;
    shared
        .wait_while(give_up, || counts.any_waiting())
        .await
        .map_err(|e| failed("commit (records wait for a partition count)", e))?;
    // Read after every record of the transaction was decoded: a standby promoted meanwhile
    // is seen, and a value past its switch point carries the new timeline.
    let timeline =
        progress
            .timelines
            .of(at.lsn)
            .await
            .map_err(|problem| PublishError::Progress {
                topic: progress.topic.clone(),
                problem: format!("cannot tell which timeline {at} lies on: {problem}"),
            })?;
    let value = progress_value(at, timeline);
    let record = Record {
        topic: progress.topic.clone(),
        key: progress.key.clone().into(),
        payload: Some(value.into_bytes().into()),
        headers: Vec::new(),
        timestamp_ms: None,
        partition: Some(progress.partition),
        partition_key: None,
    };
    shared
        .produce(&record, PROGRESS_OPAQUE, Some(progress.partition))
        .await
        .map_err(|e| failed("send the progress record", e))?;
    // Every record acknowledged and its report handed to the session before committing:
    // rust-rdkafka's `commit_transaction` flushes by polling the report queue for up to
    // 100 ms at a time, and the reports go to our poller thread instead, so every commit
    // with a record still in flight (the progress record always is) took 100 ms more.
    // With nothing outstanding, its flush returns at once.
    shared
        .wait_while(give_up, || shared.producer.in_flight_count() > 0)
        .await
        .map_err(|e| failed("commit", e))?;
    // A record that never reached librdkafka failed (its failure is on its way to the
    // session): librdkafka would commit without it, so the transaction is aborted.
    if shared.doomed.load(Ordering::Acquire) {
        return Err(failed(
            "commit (a record of the transaction failed)",
            KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut),
        ));
    }
    let producer = shared.producer.clone();
    tokio::task::spawn_blocking(move || producer.commit_transaction(TRANSACTION_TIMEOUT))
        .await
        // Only a panic or a runtime shutting down get here.
        .map_err(|_| KafkaError::Canceled)
        .and_then(|r| r)
        .map_err(|e| failed("commit", e))
}

/// `message.timeout.ms` as the producer got it: in `exactly_once` capped by the
/// transaction timeout, so that a commit never waits for records longer than the broker keeps
/// the transaction open.
fn effective_message_timeout(client: &ClientConfig, config: &KafkaConfig) -> Duration {
    let ms = client
        .get("message.timeout.ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or(config.message_timeout_ms);
    Duration::from_millis(ms)
}

/// The batch size the producer gets (set in `client`) and the one a record is measured
/// against. Batches are never larger than the smallest topic limit known: a refused batch fails
/// every record in it (see `sink::limits`). librdkafka also keeps a batch within the producer's
/// `message.max.bytes`: a record at least the smaller of the two large is alone in its batch.
fn capped_batch_size(config: &KafkaConfig, client: &mut ClientConfig, blocked: &Blocked) -> usize {
    let configured = config
        .properties
        .get("batch.size")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_BATCH_SIZE);
    let batch_size = blocked.limits().batch_size(configured);
    if batch_size < configured {
        info!(
            batch_size,
            configured,
            "batch.size lowered below the smallest record limit of the topics written to"
        );
    }
    client.set("batch.size", batch_size.to_string());
    config
        .properties
        .get("message.max.bytes")
        .and_then(|v| v.parse().ok())
        .map_or(batch_size, |max: usize| batch_size.min(max))
}

/// `kafka.properties` `message.max.bytes`, or librdkafka's default.
fn message_max_bytes(config: &KafkaConfig) -> usize {
    config
        .properties
        .get("message.max.bytes")
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_MESSAGE_MAX_BYTES)
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
            // Let `self.shared` and `self.counts` (which holds it too) go first (they are
            // dropped right after this function), so that librdkafka's destroy runs here and
            // not on the runtime thread. `Shared` holds two
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
