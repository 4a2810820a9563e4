//! Wires the data path: walsender frames → pgoutput → outbox mapping → Kafka → ledger →
//! status updates. No decoding and no policy lives here, only the order of things.
//!
//! One `Session` is one replication connection plus one producer. Any transient failure ends
//! the session; `run` starts a new one from the slot's confirmed position (at-least-once).

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::checkpoint::{Ledger, LedgerError};
use crate::config::Config;
use crate::control::{Control, ControlError};
use crate::lsn::Lsn;
use crate::outbox::{BoundTable, MappingError, OutboxEvent, OutboxMapping};
use crate::pgoutput::{self, DecodeError, LogicalMessage};
use crate::publisher::{self, Delivery, PublishError, Publisher, Rejection};
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
    #[error("replication stream out of order: {0}")]
    Protocol(String),
    #[error("cannot read postgres.password_file `{path}`: {source}")]
    PasswordFile {
        path: String,
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
            RelayError::Decode(_)
            | RelayError::Mapping(_)
            | RelayError::Ledger(_)
            | RelayError::Protocol(_)
            | RelayError::PasswordFile { .. } => false,
        }
    }
}

/// Runs the relay until `shutdown` is cancelled (Ok) or a permanent error (Err).
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), RelayError> {
    let mapping = OutboxMapping::new(&config.outbox)?;
    let mut backoff = Backoff::new(&config);
    loop {
        let started = Instant::now();
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            session = Session::start(&config, &mapping) => session,
        };
        let result = match outcome {
            Ok(session) => session.run(&shutdown).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() => {
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
            Err(e) => {
                error!(error = %e, "relay stopped: this needs an operator");
                return Err(e);
            }
        }
    }
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

/// The password from `postgres.password_file`, or `PGPASSWORD`, or none (the URL's is used).
pub fn configured_password(config: &Config) -> Result<Option<String>, RelayError> {
    let path = &config.postgres.password_file;
    if !path.is_empty() {
        let text = std::fs::read_to_string(path).map_err(|source| RelayError::PasswordFile {
            path: path.clone(),
            source,
        })?;
        return Ok(Some(text.trim().to_string()));
    }
    Ok(std::env::var("PGPASSWORD").ok())
}

/// Opens the control connection and makes sure publication and slot exist.
pub async fn prepare(config: &Config) -> Result<Control, RelayError> {
    let pg = &config.postgres;
    let password = configured_password(config)?;
    let timeout = Duration::from_millis(pg.connect_timeout_ms);
    let control = Control::connect(&pg.url, password.as_deref(), timeout).await?;
    if pg.create_publication {
        let (schema, table) = config.outbox.schema_and_table();
        control
            .ensure_publication(&pg.publication, &schema, &table)
            .await?;
    }
    control.prepare_slot(&pg.slot, pg.create_slot).await?;
    Ok(control)
}

/// The transaction being received.
struct OpenTxn {
    final_lsn: Lsn,
    commit_time_ms: i64,
    events: u64,
}

struct Session<'a> {
    mapping: &'a OutboxMapping,
    stream: ReplicationStream,
    publisher: Publisher,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
    ledger: Ledger,
    /// Relation id → the bound outbox table, or `None` for a published non-outbox table.
    relations: HashMap<u32, Option<BoundTable>>,
    txn: Option<OpenTxn>,
    in_flight_messages: usize,
    in_flight_bytes: usize,
    max_in_flight_messages: usize,
    max_in_flight_bytes: usize,
    /// Newest WAL position received (the status update's `write`).
    received: Lsn,
    status_interval: Duration,
    shutdown_timeout: Duration,
    slot: String,
    published: u64,
}

impl<'a> Session<'a> {
    async fn start(config: &Config, mapping: &'a OutboxMapping) -> Result<Session<'a>, RelayError> {
        let pg = &config.postgres;
        let control = prepare(config).await?;
        let status_interval = status_interval(config, control.wal_sender_timeout().await?);
        let (publisher, deliveries) = Publisher::new(&config.kafka)?;
        let params = ConnectParams::from_url(
            &pg.url,
            configured_password(config)?.as_deref(),
            Duration::from_millis(pg.connect_timeout_ms),
        )?;
        let stream = WalSender::connect(&params)
            .await?
            .start_replication(&pg.slot, &pg.publication, Lsn::ZERO, false)
            .await?;
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
        Ok(Session {
            mapping,
            stream,
            publisher,
            deliveries,
            ledger: Ledger::new(start),
            relations: HashMap::new(),
            txn: None,
            in_flight_messages: 0,
            in_flight_bytes: 0,
            max_in_flight_messages: config.kafka.max_in_flight_messages,
            max_in_flight_bytes: config.kafka.max_in_flight_bytes,
            received: start,
            status_interval,
            shutdown_timeout: Duration::from_millis(config.relay.shutdown_timeout_ms),
            slot: pg.slot.clone(),
            published: 0,
        })
    }

    /// The main loop, in priority order: shutdown, acknowledgements, feedback, more WAL.
    async fn run(mut self, shutdown: &CancellationToken) -> Result<(), RelayError> {
        let mut feedback = tokio::time::interval(self.status_interval);
        feedback.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return self.drain().await,
                Some(delivery) = self.deliveries.recv() => self.handle_deliveries(delivery)?,
                _ = feedback.tick() => self.send_status(false).await?,
                frame = self.stream.next_frame(), if self.has_room() => {
                    self.handle_frame(frame?).await?;
                }
            }
        }
    }

    fn has_room(&self) -> bool {
        self.in_flight_messages < self.max_in_flight_messages
            && self.in_flight_bytes < self.max_in_flight_bytes
    }

    /// Handles one delivery and every other one already waiting.
    fn handle_deliveries(&mut self, first: Delivery) -> Result<(), RelayError> {
        self.handle_delivery(first)?;
        while let Ok(delivery) = self.deliveries.try_recv() {
            self.handle_delivery(delivery)?;
        }
        Ok(())
    }

    fn handle_delivery(&mut self, delivery: Delivery) -> Result<(), RelayError> {
        self.in_flight_messages -= 1;
        self.in_flight_bytes = self.in_flight_bytes.saturating_sub(delivery.bytes);
        match delivery.result {
            Ok(()) => Ok(self.ledger.ack(delivery.seq)?),
            Err(failure) => {
                if let Some(fatal) = self.publisher.fatal_error() {
                    return Err(PublishError::Fatal(fatal).into());
                }
                Err(RelayError::Delivery(Box::new(failure.rejection())))
            }
        }
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
                self.ledger.begin()?;
                self.txn = Some(OpenTxn {
                    final_lsn: begin.final_lsn,
                    commit_time_ms: pg_time_to_unix_us(begin.commit_time_us) / 1000,
                    events: 0,
                });
            }
            LogicalMessage::Commit(commit) => self.handle_commit(commit)?,
            LogicalMessage::Relation(relation) => {
                let bound = self.mapping.bind(&relation).transpose()?;
                if bound.is_none() {
                    debug!(schema = %relation.namespace, table = %relation.name,
                        "publication includes a table that is not the outbox; its rows are ignored");
                }
                self.relations.insert(relation.id, bound);
            }
            LogicalMessage::Insert(insert) => self.handle_insert(insert)?,
            LogicalMessage::Truncate(_) => {
                warn!("the outbox table was truncated; nothing is published for a truncate")
            }
            LogicalMessage::Update(_)
            | LogicalMessage::Delete(_)
            | LogicalMessage::Origin(_)
            | LogicalMessage::Type(_)
            | LogicalMessage::Message(_) => {}
        }
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
        self.published += txn.events;
        Ok(())
    }

    fn handle_insert(&mut self, insert: pgoutput::Insert) -> Result<(), RelayError> {
        let commit_time_ms = self.open_txn()?.commit_time_ms;
        let bound = match self.relations.get(&insert.relation_id) {
            Some(Some(bound)) => bound,
            Some(None) => return Ok(()),
            None => {
                return Err(RelayError::Protocol(format!(
                    "INSERT for relation {} before its RELATION message",
                    insert.relation_id
                )))
            }
        };
        let event = bound.to_event(&insert.tuple, commit_time_ms);
        self.publish_event(event)
    }

    fn open_txn(&mut self) -> Result<&mut OpenTxn, RelayError> {
        self.txn
            .as_mut()
            .ok_or_else(|| RelayError::Protocol("change outside a transaction".into()))
    }

    /// Hands one mapped event of the open transaction to Kafka.
    fn publish_event(
        &mut self,
        event: Result<OutboxEvent, MappingError>,
    ) -> Result<(), RelayError> {
        let event = event?;
        let seq = self.ledger.record_sent()?;
        self.publisher.send(&event.record, seq, &event.id)?;
        self.open_txn()?.events += 1;
        self.in_flight_messages += 1;
        self.in_flight_bytes += event.record.size();
        Ok(())
    }

    async fn send_status(&mut self, reply: bool) -> Result<(), RelayError> {
        let flush = self.ledger.confirmed();
        self.stream
            .send_status(self.received.max(flush), flush, reply)
            .await?;
        Ok(())
    }

    /// Shutdown: stop reading, wait for in-flight deliveries (bounded), confirm, close.
    async fn drain(mut self) -> Result<(), RelayError> {
        info!(
            in_flight = self.in_flight_messages,
            "shutting down: draining in-flight deliveries"
        );
        let deadline = Instant::now() + self.shutdown_timeout;
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
        info!(slot = %self.slot, confirmed = %self.ledger.confirmed(), published = self.published,
            "final position confirmed; relay stopped");
        self.stream.close().await;
        Ok(())
    }
}

/// Status updates must come well within the server's `wal_sender_timeout`.
fn status_interval(config: &Config, wal_sender_timeout: Duration) -> Duration {
    let configured = Duration::from_millis(config.postgres.status_interval_ms);
    if wal_sender_timeout.is_zero() {
        return configured;
    }
    configured.min(wal_sender_timeout / 3)
}
