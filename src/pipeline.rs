//! Wires the data path: walsender frames → pgoutput → outbox mapping → Kafka → ledger →
//! status updates. No decoding and no record building lives here, only the order of things
//! and what happens on failure.
//!
//! One `Session` is one replication connection plus one producer. Any transient failure ends
//! the session; `run` starts a new one from the slot's confirmed position (at-least-once).
//! When another relay streams the slot, this one waits as a standby.

use std::collections::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::checkpoint::{Ledger, LedgerError, TxnSeq};
use crate::config::{Config, DeadLetterPolicy};
use crate::control::{Control, ControlError};
use crate::dead_letter::{self, Reason};
use crate::lsn::Lsn;
use crate::metrics::{Metrics, RelayState};
use crate::outbox::{self, BoundTable, MappingError, MessageRoute, OutboxEvent, OutboxMapping};
use crate::pgoutput::{self, DecodeError, LogicalMessage, Relation, Tuple};
use crate::publisher::{
    self, Delivery, DeliveryFailure, PublishError, Publisher, Record, Rejection,
};
use crate::slot_watch::{self, SlotGone, Standby};
use crate::walsender::{
    pg_time_to_unix_us, ConnectParams, ReplicationError, ReplicationFrame, ReplicationStream,
    WalSender,
};

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error(transparent)]
    Replication(#[from] ReplicationError),
    #[error("cannot decode the replication stream: {0}")]
    Decode(#[from] DecodeError),
    #[error(transparent)]
    Mapping(#[from] MappingError),
    #[error(transparent)]
    Publish(#[from] PublishError),
    #[error("replication stream out of order: {0}")]
    Ledger(#[from] LedgerError),
    #[error("kafka did not acknowledge {0}")]
    Delivery(Box<Rejection>),
    #[error("stopped on an event that cannot be published (dead_letter.policy = stop); the slot is not confirmed past it: {0}")]
    Poison(String),
    #[error(transparent)]
    SlotGone(#[from] SlotGone),
    #[error("replication stream out of order: {0}")]
    Protocol(String),
    #[error("cannot listen on http.listen `{addr}`: {source}")]
    Http {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

impl RelayError {
    /// Transient: reconnect and resume from the slot. Otherwise stop and tell the operator.
    pub fn is_transient(&self) -> bool {
        match self {
            RelayError::Control(e) => e.is_transient(),
            RelayError::Replication(e) => e.is_transient(),
            RelayError::Publish(e) => e.is_transient(),
            RelayError::Delivery(r) => !publisher::is_permanent(&r.error),
            _ => false,
        }
    }

    /// The process exit code: 3 when the slot is lost or gone (events may be missing), else 1.
    pub fn exit_code(&self) -> u8 {
        match self {
            RelayError::SlotGone(_) | RelayError::Control(ControlError::SlotLost { .. }) => 3,
            _ => 1,
        }
    }
}

/// Runs the relay until `shutdown` is cancelled (Ok) or a permanent error (Err).
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), RelayError> {
    run_with_metrics(config, shutdown, Arc::new(Metrics::default())).await
}

/// [`run`], updating `metrics` (and serving them when `http.listen` is set).
pub async fn run_with_metrics(
    config: Config,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
) -> Result<(), RelayError> {
    let mapping = OutboxMapping::new(&config.outbox)?;
    let watch = shutdown.child_token();
    start_http(&config, &metrics, &watch).await?;
    let (gone_tx, gone_rx) = mpsc::channel(1);
    tokio::spawn(slot_watch::sample_forever(
        config.clone(),
        metrics.clone(),
        gone_tx,
        watch.clone(),
    ));
    if config.outbox.sweeper.enabled {
        tokio::spawn(crate::sweeper::run(config.clone(), watch.clone()));
    }
    let result = supervise(&config, &mapping, &metrics, &shutdown, gone_rx).await;
    metrics.set_state(if result.is_ok() {
        RelayState::Stopped
    } else {
        RelayState::Failed
    });
    if let Err(e) = &result {
        error!(error = %e, "relay stopped: this needs an operator");
    }
    watch.cancel();
    result
}

async fn start_http(
    config: &Config,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> Result<(), RelayError> {
    let addr = &config.http.listen;
    if addr.is_empty() {
        return Ok(());
    }
    let listener = crate::http::bind(addr)
        .await
        .map_err(|source| RelayError::Http {
            addr: addr.clone(),
            source,
        })?;
    let staleness = Duration::from_millis(config.http.ready_staleness_ms);
    tokio::spawn(crate::http::serve(
        listener,
        metrics.clone(),
        staleness,
        shutdown.clone(),
    ));
    Ok(())
}

/// Starts sessions one after another: reconnects after transient errors, waits as a standby
/// while the slot is held elsewhere, stops on errors that need an operator.
async fn supervise(
    config: &Config,
    mapping: &OutboxMapping,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
    mut gone: mpsc::Receiver<SlotGone>,
) -> Result<(), RelayError> {
    let mut backoff = Backoff::new(config);
    let mut standby = Standby::new();
    // Once streamed, a slot that vanishes means lost events: never silently recreate it.
    let mut slot_seen = false;
    loop {
        let started = Instant::now();
        let result = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            Some(g) = gone.recv() => return Err(g.into()),
            result = run_session(config, mapping, metrics, shutdown, &mut slot_seen) => result,
        };
        match result {
            Ok(()) => return Ok(()),
            Err(RelayError::Replication(ReplicationError::SlotActive { .. })) => {
                metrics.set_state(RelayState::Standby);
                standby.wait(config, shutdown).await;
            }
            Err(e) if e.is_transient() => {
                metrics.set_state(RelayState::Reconnecting);
                metrics.reconnects.fetch_add(1, Relaxed);
                if started.elapsed() > Duration::from_secs(30) {
                    backoff.reset();
                }
                let delay = backoff.next();
                warn!(error = %e, retry_in_ms = delay.as_millis() as u64,
                    "relay session ended; reconnecting and resuming from the slot's confirmed position");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            Err(e) => return Err(e),
        }
    }
}

async fn run_session(
    config: &Config,
    mapping: &OutboxMapping,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
    slot_seen: &mut bool,
) -> Result<(), RelayError> {
    let session = Session::start(config, mapping, metrics, *slot_seen).await?;
    *slot_seen = true;
    session.run(shutdown).await
}

/// Exponential backoff between sessions.
struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(config: &Config) -> Self {
        let initial = Duration::from_millis(config.postgres.reconnect_backoff_initial_ms);
        Backoff {
            initial,
            max: Duration::from_millis(config.postgres.reconnect_backoff_max_ms),
            next: initial,
        }
    }

    fn next(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// Opens the control connection and makes sure publication and slot exist. A slot is created
/// only when `create_slot` is set and it has never been streamed by this process.
pub async fn prepare(config: &Config) -> Result<Control, RelayError> {
    prepare_slot(config, config.postgres.create_slot).await
}

async fn prepare_slot(config: &Config, create_slot: bool) -> Result<Control, RelayError> {
    let pg = &config.postgres;
    let control = slot_watch::connect(config).await?;
    if pg.create_publication {
        control
            .ensure_publication_tables(&pg.publication, &config.outbox.publication_tables())
            .await?;
    }
    control.prepare_slot(&pg.slot, create_slot).await?;
    Ok(control)
}

/// The transaction being received.
struct OpenTxn {
    final_lsn: Lsn,
    commit_time_ms: i64,
    events: u64,
}

/// A relation from the stream, and its outbox binding when it is an outbox table.
struct RelationEntry {
    relation: Arc<Relation>,
    bound: Option<BoundTable>,
}

/// Where a dead letter's content comes from when an event cannot be mapped.
pub enum Origin<'a> {
    Row {
        relation: &'a Relation,
        tuple: &'a Tuple,
    },
}

struct Session<'a> {
    config: &'a Config,
    mapping: &'a OutboxMapping,
    metrics: &'a Metrics,
    stream: ReplicationStream,
    publisher: Publisher,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    ledger: Ledger,
    relations: HashMap<u32, RelationEntry>,
    txn: Option<OpenTxn>,
    in_flight_messages: usize,
    in_flight_bytes: usize,
    /// Newest WAL position received (the status update's `write`).
    received: Lsn,
    /// The confirmed position at the last status update, to see progress.
    last_reported: Lsn,
    status_interval: Duration,
}

impl<'a> Session<'a> {
    async fn start(
        config: &'a Config,
        mapping: &'a OutboxMapping,
        metrics: &'a Metrics,
        slot_seen: bool,
    ) -> Result<Session<'a>, RelayError> {
        let pg = &config.postgres;
        let control = match prepare_slot(config, pg.create_slot && !slot_seen).await {
            Err(RelayError::Control(ControlError::SlotMissing { slot })) if slot_seen => {
                let what = "was dropped while the relay ran".to_string();
                return Err(slot_watch::slot_gone(&slot, what, metrics).into());
            }
            other => other?,
        };
        let status_interval = status_interval(config, control.wal_sender_timeout().await?);
        let params = ConnectParams::from_config(pg)?;
        let stream = WalSender::connect(&params)
            .await?
            .start_replication(
                &pg.slot,
                &pg.publication,
                Lsn::ZERO,
                mapping.messages_enabled(),
            )
            .await?;
        let (publisher, deliveries) = Publisher::new(&config.kafka)?;
        // The slot is ours now, so its position cannot move under us: start the ledger there,
        // so that no status update ever reports less than the slot already confirmed.
        let slot = control
            .slot(&pg.slot)
            .await?
            .ok_or_else(|| ControlError::SlotMissing {
                slot: pg.slot.clone(),
            })?;
        let start = slot.confirmed_flush_lsn.unwrap_or_default();
        if slot.active_pid != Some(stream.backend_pid()) {
            warn!(slot = %pg.slot, active_pid = ?slot.active_pid, our_pid = stream.backend_pid(),
                "slot is not reported as held by our connection");
        }
        info!(slot = %pg.slot, publication = %pg.publication, start = %start,
            backend_pid = stream.backend_pid(), status_interval_ms = status_interval.as_millis() as u64,
            "streaming from the slot's confirmed position");
        metrics.set_lsns(start, start);
        metrics.set_state(RelayState::Streaming);
        Ok(Session {
            config,
            mapping,
            metrics,
            stream,
            publisher,
            deliveries,
            ledger: Ledger::new(start),
            relations: HashMap::new(),
            txn: None,
            in_flight_messages: 0,
            in_flight_bytes: 0,
            received: start,
            last_reported: start,
            status_interval,
        })
    }

    /// The main loop, in priority order: shutdown, acknowledgements, feedback, more WAL.
    async fn run(mut self, shutdown: &CancellationToken) -> Result<(), RelayError> {
        let mut feedback = tokio::time::interval(self.status_interval);
        feedback.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let result = loop {
            let step = tokio::select! {
                biased;
                _ = shutdown.cancelled() => break self.drain().await,
                Some(delivery) = self.deliveries.recv() => self.handle_deliveries(delivery),
                // Asking for a reply makes the server answer with a keepalive carrying its WAL
                // end, which an idle relay confirms: unrelated traffic never piles up WAL.
                _ = feedback.tick() => self.send_status(true).await,
                frame = self.stream.next_frame(), if self.has_room() => match frame {
                    Ok(frame) => self.handle_frame(frame).await,
                    Err(e) => Err(e.into()),
                },
            };
            if let Err(e) = step {
                break Err(e);
            }
        };
        self.metrics.records_in_flight.store(0, Relaxed);
        result
    }

    fn has_room(&self) -> bool {
        self.in_flight_messages < self.config.kafka.max_in_flight_messages
            && self.in_flight_bytes < self.config.kafka.max_in_flight_bytes
    }

    /// Handles one delivery and every other one already waiting.
    fn handle_deliveries(&mut self, first: Delivery) -> Result<(), RelayError> {
        self.handle_delivery(first)?;
        while let Ok(delivery) = self.deliveries.try_recv() {
            self.handle_delivery(delivery)?;
        }
        self.metrics
            .records_in_flight
            .store(self.in_flight_messages as i64, Relaxed);
        Ok(())
    }

    fn handle_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        self.in_flight_messages -= 1;
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(delivery.bytes);
        match delivery.result {
            Ok(()) => {
                let commit_time_ms = self.ledger.ack(delivery.seq)?;
                let counter = if delivery.dead_letter {
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
            Err(failure) => {
                self.handle_failed_delivery(delivery.seq, delivery.dead_letter, failure)
            }
        }
    }

    /// A record Kafka did not take. Permanent problems of the record itself are dead-lettered
    /// (same transaction: the slot waits for the dead letter instead); everything else ends the
    /// session so that it restarts from the slot.
    fn handle_failed_delivery(
        &mut self,
        seq: TxnSeq,
        was_dead_letter: bool,
        failure: DeliveryFailure,
    ) -> Result<(), RelayError> {
        let kind = failure
            .error
            .rdkafka_error_code()
            .map(|c| format!("{c:?}"))
            .unwrap_or_else(|| "Other".into());
        self.metrics.count_delivery_error(&kind);
        let rejection = failure.rejection();
        if let Some(fatal) = self.publisher.fatal_error() {
            return Err(PublishError::Fatal(fatal).into());
        }
        if !publisher::is_permanent(&failure.error) || was_dead_letter {
            return Err(RelayError::Delivery(Box::new(rejection)));
        }
        let reason = Reason::for_kafka_error(&failure.error);
        let dlq = &self.config.dead_letter.topic;
        let record =
            dead_letter::from_failed(dlq, &failure.message, reason, &rejection.to_string());
        self.dead_letter(seq, record, &rejection.event_id, &rejection.to_string())
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
                self.handle_message(pgoutput::decode(data)?)?;
            }
        }
        Ok(())
    }

    fn handle_message(&mut self, message: LogicalMessage) -> Result<(), RelayError> {
        match message {
            LogicalMessage::Begin(begin) => {
                let commit_time_ms = pg_time_to_unix_us(begin.commit_time_us) / 1000;
                self.ledger.begin(commit_time_ms)?;
                self.txn = Some(OpenTxn {
                    final_lsn: begin.final_lsn,
                    commit_time_ms,
                    events: 0,
                });
            }
            LogicalMessage::Commit(commit) => self.handle_commit(commit)?,
            LogicalMessage::Relation(relation) => self.handle_relation(relation)?,
            LogicalMessage::Insert(insert) => self.handle_insert(insert)?,
            LogicalMessage::Truncate(_) => {
                warn!("the outbox table was truncated; nothing is published for a truncate")
            }
            LogicalMessage::Update(_)
            | LogicalMessage::Delete(_)
            | LogicalMessage::Origin(_)
            | LogicalMessage::Type(_) => {}
            LogicalMessage::Message(message) => match self.mapping.route_message(&message) {
                MessageRoute::Event => {
                    let commit_time_ms = self.open_txn()?.commit_time_ms;
                    let event = self.mapping.message_event(&message, commit_time_ms);
                    let (relation, tuple) = outbox::message_as_row(&message);
                    let origin = Origin::Row {
                        relation: &relation,
                        tuple: &tuple,
                    };
                    self.publish_event(event, origin)?;
                }
                MessageRoute::NonTransactional { rejected_total } => warn!(
                    prefix = %message.prefix, lsn = %message.lsn, rejected_total,
                    "skipped a non-transactional logical message with the outbox prefix: only pg_logical_emit_message(true, ...) is published"
                ),
                MessageRoute::Ignored => {}
            },
        }
        Ok(())
    }

    fn handle_relation(&mut self, relation: Relation) -> Result<(), RelayError> {
        let bound = self.mapping.bind(&relation).transpose()?;
        if bound.is_none() {
            debug!(schema = %relation.namespace, table = %relation.name,
                "publication includes a table that is not the outbox; its rows are ignored");
        }
        let entry = RelationEntry {
            relation: Arc::new(relation),
            bound,
        };
        self.relations.insert(entry.relation.id, entry);
        Ok(())
    }

    fn handle_commit(&mut self, commit: pgoutput::Commit) -> Result<(), RelayError> {
        let txn = self
            .txn
            .take()
            .ok_or_else(|| RelayError::Protocol("COMMIT without BEGIN".into()))?;
        if txn.final_lsn != commit.commit_lsn {
            return Err(RelayError::Protocol(format!(
                "COMMIT at {} does not match BEGIN's final LSN {}",
                commit.commit_lsn, txn.final_lsn
            )));
        }
        self.ledger.commit(commit.end_lsn)?;
        debug!(end_lsn = %commit.end_lsn, events = txn.events, "transaction handed to kafka");
        Ok(())
    }

    fn handle_insert(&mut self, insert: pgoutput::Insert) -> Result<(), RelayError> {
        let commit_time_ms = self.open_txn()?.commit_time_ms;
        let Some(entry) = self.relations.get(&insert.relation_id) else {
            return Err(RelayError::Protocol(format!(
                "INSERT for relation {} before its RELATION message",
                insert.relation_id
            )));
        };
        let Some(bound) = &entry.bound else {
            return Ok(());
        };
        let event = bound.to_event(&insert.tuple, commit_time_ms);
        let relation = entry.relation.clone();
        self.publish_event(
            event,
            Origin::Row {
                relation: &relation,
                tuple: &insert.tuple,
            },
        )
    }

    fn open_txn(&mut self) -> Result<&mut OpenTxn, RelayError> {
        self.txn
            .as_mut()
            .ok_or_else(|| RelayError::Protocol("change outside a transaction".into()))
    }

    /// Hands one mapped event of the open transaction to Kafka; an event that cannot be
    /// published goes to the dead-letter topic (or stops the relay, by policy).
    fn publish_event(
        &mut self,
        event: Result<OutboxEvent, MappingError>,
        origin: Origin<'_>,
    ) -> Result<(), RelayError> {
        self.open_txn()?.events += 1;
        let seq = self.ledger.record_sent()?;
        let event = match event {
            Ok(event) => event,
            Err(e) => return self.dead_letter_unmapped(seq, &e, origin),
        };
        match self.publisher.send(&event.record, seq, &event.id) {
            Ok(()) => {
                self.count_in_flight(&event.record);
                Ok(())
            }
            Err(PublishError::Rejected(r)) if publisher::is_permanent(&r.error) => {
                self.metrics
                    .count_delivery_error(&format!("{:?}", r.error.rdkafka_error_code()));
                let reason = Reason::for_kafka_error(&r.error);
                let dlq = &self.config.dead_letter.topic;
                let record = dead_letter::from_record(dlq, &event.record, reason, &r.to_string());
                self.dead_letter(seq, record, &event.id, &r.to_string())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn dead_letter_unmapped(
        &mut self,
        seq: TxnSeq,
        error: &MappingError,
        origin: Origin<'_>,
    ) -> Result<(), RelayError> {
        let reason = match error {
            MappingError::InvalidTopic { .. } => Reason::InvalidTopic,
            _ => Reason::Mapping,
        };
        let event_id = error.event_id();
        let dlq = &self.config.dead_letter.topic;
        let record = match origin {
            Origin::Row { relation, tuple } => {
                dead_letter::from_row(dlq, relation, tuple, reason, &error.to_string(), event_id)
            }
        };
        self.dead_letter(seq, record, event_id.unwrap_or("?"), &error.to_string())
    }

    /// Sends a dead letter in place of the event (policy `dead_letter`), or stops.
    fn dead_letter(
        &mut self,
        seq: TxnSeq,
        record: Record,
        event_id: &str,
        why: &str,
    ) -> Result<(), RelayError> {
        if self.config.dead_letter.policy == DeadLetterPolicy::Stop {
            return Err(RelayError::Poison(format!("event {event_id}: {why}")));
        }
        warn!(event_id, topic = %record.topic, reason = why, "event sent to the dead-letter topic");
        self.publisher.send_dead_letter(&record, seq, event_id)?;
        self.count_in_flight(&record);
        Ok(())
    }

    fn count_in_flight(&mut self, record: &Record) {
        self.in_flight_messages += 1;
        self.in_flight_bytes += record.size();
    }

    async fn send_status(&mut self, reply: bool) -> Result<(), RelayError> {
        let flush = self.ledger.confirmed();
        self.stream
            .send_status(self.received.max(flush), flush, reply)
            .await?;
        if flush > self.last_reported || self.in_flight_messages == 0 {
            self.metrics.mark_progress();
        }
        self.last_reported = flush;
        self.metrics.set_lsns(self.received, flush);
        self.metrics
            .messages_rejected
            .store(self.mapping.non_transactional_messages(), Relaxed);
        self.metrics
            .records_in_flight
            .store(self.in_flight_messages as i64, Relaxed);
        Ok(())
    }

    /// Shutdown: stop reading, wait for in-flight deliveries (bounded), confirm, close.
    async fn drain(&mut self) -> Result<(), RelayError> {
        self.metrics.set_state(RelayState::Draining);
        info!(
            in_flight = self.in_flight_messages,
            "shutting down: draining in-flight deliveries"
        );
        let timeout = Duration::from_millis(self.config.relay.shutdown_timeout_ms);
        let deadline = Instant::now() + timeout;
        let mut feedback = tokio::time::interval(self.status_interval);
        while self.in_flight_messages > 0 {
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {
                    warn!(in_flight = self.in_flight_messages,
                        "shutdown deadline reached; unacknowledged events will be sent again on restart");
                    break;
                }
                Some(delivery) = self.deliveries.recv() => {
                    if let Err(e) = self.handle_deliveries(delivery) {
                        warn!(error = %e, "delivery failed during shutdown; it will be sent again on restart");
                        break;
                    }
                }
                _ = feedback.tick() => self.send_status(false).await?,
            }
        }
        self.send_status(false).await?;
        info!(slot = %self.config.postgres.slot, confirmed = %self.ledger.confirmed(),
            published = self.metrics.events_published.load(Relaxed),
            "final position confirmed; relay stopped");
        self.stream.close().await;
        Ok(())
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Status updates must come well within the server's `wal_sender_timeout`.
fn status_interval(config: &Config, wal_sender_timeout: Duration) -> Duration {
    let configured = Duration::from_millis(config.postgres.status_interval_ms);
    if wal_sender_timeout.is_zero() {
        return configured;
    }
    configured.min(wal_sender_timeout / 3)
}
