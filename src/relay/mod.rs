//! The relay proper: sessions that stream the slot into Kafka, and the supervisor that runs
//! them one after another.
//!
//! In: the validated `Config`, a shutdown token. Out: records in Kafka, the slot confirmed up
//! to the newest commit whose records Kafka acknowledged, metrics.
//!
//! - `session`: one replication connection plus one producer; the loop that decodes frames,
//!   maps rows, sends records, feeds acknowledgements to the ledger and confirms. It depends on
//!   the two traits of `seams` only, so its unit tests run with fakes.
//! - `ledger`: which position may be confirmed (pure).
//! - `slot_watch` samples the slot's lag and notices when it is lost; `sweeper` deletes rows
//!   (or drops partitions) the slot has confirmed.
//! - this module: connecting a session, restarting it after transient errors (at-least-once:
//!   resume from the slot), waiting as a standby while another relay holds the slot.

pub mod breaker;
pub mod ledger;
mod seams;
mod session;
pub mod slot_watch;
mod supervisor;
pub mod sweeper;
mod timelines;

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use crate::config::{Config, Delivery as DeliveryMode, PostgresConfig};
use crate::lsn::Lsn;
use crate::mapping::{MappingError, OutboxMapping};
use crate::postgres::conninfo::ConnInfo;
use crate::postgres::control::{alter_failover_command, Control, ControlError, SlotInfo};
use crate::relay::ledger::LedgerError;
use crate::serve::metrics::{Metrics, RelayState};
use crate::sink::progress::SlotIdentity;
use crate::sink::publisher::{PublishError, Publisher, Rejection};
use crate::sink::{OpenedSink, SlotFacts};
use crate::source::pgoutput::DecodeError;
use crate::source::walsender::{
    check_receive_timeout, receive_timeout, ConnectParams, ReplicationError, ReplicationStream,
    WalSender,
};
use slot_watch::{SlotGone, Standby};
use supervisor::{Next, Supervisor};
use sweeper::hold::{HoldStore, ARMED_BY_RELAY};

pub use seams::{Catalog, Ends, FrameSource, RecordKind, RecordSink};
pub use session::{Session, Settings};

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
    /// A Kafka setting this librdkafka refuses: definite, retrying cannot help.
    #[error("Kafka setting {0}")]
    KafkaSetting(#[from] crate::sink::preflight::Refused),
    #[error("replication stream out of order: {0}")]
    Ledger(#[from] LedgerError),
    #[error("kafka did not acknowledge {0}")]
    Delivery(Box<Rejection>),
    #[error("stopped on an event that cannot be published (dead_letter.policy = stop); the slot is not confirmed past it: {0}")]
    Poison(String),
    /// An event Kafka refuses as too large whose dead letter could keep neither its payload
    /// nor its row: dead-lettering it would leave its outbox row as its only copy.
    #[error("stopped on an event too large for Kafka and for its dead letter; the slot is not confirmed past it: {0}. Fix: raise the topic's max.message.bytes (and kafka.properties message.max.bytes) above it and restart, or republish it yourself and skip it; see docs/src/operations/runbooks.md#too-large-to-keep")]
    TooLargeToKeep(String),
    /// More dead letters in a minute than `dead_letter.max_per_minute`: the slot is not
    /// confirmed past the transaction of the one that tripped the breaker.
    #[error("the dead-letter breaker tripped: {0}; the slot is not confirmed past this event. Fix the producer or the configuration (see `outbox-relay dead-letters list`), then restart; see docs/src/operations/runbooks.md#dead-letter-breaker")]
    Breaker(String),
    /// An insert from a relation that is not a configured outbox table (nor a partition of
    /// one): never skipped, because the slot would be confirmed past it.
    #[error("{0}")]
    Unmapped(Box<Unmapped>),
    #[error(transparent)]
    SlotGone(#[from] SlotGone),
    #[error("replication stream out of order: {0}")]
    Protocol(String),
    /// Shut down while records waited for the schema registry (they are sent again on restart).
    #[error("stopped while waiting for the schema registry: {0}")]
    SchemaRegistry(String),
    #[error(transparent)]
    Tracing(#[from] crate::sink::traces::TraceError),
    #[error("cannot listen on http.listen `{addr}`: {source}")]
    Http {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// The details of [`RelayError::Unmapped`]: which relation, and what the operator can do.
#[derive(Debug)]
pub struct Unmapped {
    pub relation: String,
    pub oid: u32,
    /// Its partition root when that differs from the relation itself.
    pub root: Option<String>,
    /// The relation no longer exists in the catalog.
    pub dropped: bool,
    pub publication: String,
}

impl std::fmt::Display for Unmapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Unmapped {
            relation,
            oid,
            publication,
            ..
        } = self;
        let publication = crate::postgres::control::quote_ident(publication);
        write!(f, "received an insert from {relation} (oid {oid}), which is not a configured outbox table")?;
        if let Some(root) = &self.root {
            write!(f, " but a partition of {root}, which is not one either")?;
        }
        if self.dropped {
            return write!(f, " and no longer exists (a dropped partition?): the relay stops. Fix: ALTER PUBLICATION {publication} SET (publish_via_partition_root = true), then skip past it; see docs/src/operations/runbooks.md#unmapped-relation");
        }
        write!(f, ": the relay stops. Fix: configure it as an outbox table, or ALTER PUBLICATION {publication} DROP TABLE it; see docs/src/operations/runbooks.md#unmapped-relation")
    }
}

/// How the relay goes on after a session ended with an error: decided once per error, by
/// [`RelayError::ending`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionEnd {
    /// Reconnect and resume from the slot's confirmed position, with back-off.
    Retry,
    /// An error about the stream's content: what was sent before it is acknowledged and
    /// confirmed, then the relay stops (exit 1) without confirming past it.
    DrainThenStop,
    /// Stop and tell the operator (exit 1).
    Stop,
    /// The slot is lost or gone: events may be missing (exit 3).
    SlotGone,
}

impl RelayError {
    /// How a session that ended with this error goes on: one exhaustive decision, from which
    /// [`is_transient`](Self::is_transient), [`drains_before_stopping`](Self::drains_before_stopping)
    /// and [`exit_code`](Self::exit_code) follow.
    pub fn ending(&self) -> SessionEnd {
        let retry_if = |transient: bool| {
            if transient {
                SessionEnd::Retry
            } else {
                SessionEnd::Stop
            }
        };
        match self {
            RelayError::Control(ControlError::SlotLost { .. }) | RelayError::SlotGone(_) => {
                SessionEnd::SlotGone
            }
            RelayError::Control(e) => retry_if(e.is_transient()),
            RelayError::Replication(e) => retry_if(e.is_transient()),
            RelayError::Publish(e) => retry_if(e.is_transient()),
            RelayError::Delivery(r) => retry_if(r.is_transient()),
            RelayError::SchemaRegistry(_) => SessionEnd::Retry,
            RelayError::Unmapped(_)
            | RelayError::Poison(_)
            | RelayError::TooLargeToKeep(_)
            | RelayError::Breaker(_)
            | RelayError::Mapping(_)
            | RelayError::Decode(_)
            | RelayError::Protocol(_) => SessionEnd::DrainThenStop,
            RelayError::KafkaSetting(_)
            | RelayError::Ledger(_)
            | RelayError::Tracing(_)
            | RelayError::Http { .. } => SessionEnd::Stop,
        }
    }

    /// Transient: reconnect and resume from the slot. Otherwise stop and tell the operator.
    pub fn is_transient(&self) -> bool {
        self.ending() == SessionEnd::Retry
    }

    /// Errors about the stream's content: the records sent before it are still worth
    /// delivering and confirming before the session ends.
    pub fn drains_before_stopping(&self) -> bool {
        self.ending() == SessionEnd::DrainThenStop
    }

    /// The process exit code: 3 when the slot is lost or gone (events may be missing), else 1.
    pub fn exit_code(&self) -> u8 {
        match self.ending() {
            SessionEnd::SlotGone => 3,
            SessionEnd::Retry | SessionEnd::DrainThenStop | SessionEnd::Stop => 1,
        }
    }
}

/// Runs the relay until `shutdown` is cancelled (Ok, after draining) or a permanent error.
pub async fn run(config: Config, shutdown: CancellationToken) -> Result<(), RelayError> {
    run_with_metrics(config, shutdown, Arc::new(Metrics::default())).await
}

/// [`run`], updating `metrics` (and serving them when `http.listen` is set).
pub async fn run_with_metrics(
    config: Config,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
) -> Result<(), RelayError> {
    let mapping = OutboxMapping::new(&config.outbox)?.with_binary(config.postgres.binary);
    metrics.set_info(&config.postgres.slot, &config.postgres.publication);
    let librdkafka = crate::sink::preflight::check(&config.kafka).await?;
    info!(librdkafka = %librdkafka.describe(), "the Kafka settings are valid for this librdkafka");
    metrics.watch_blocked(Arc::new(crate::sink::blocked::Blocked::new(&config.kafka)));
    let serializers = crate::sink::schema::Serializers::new(&config.outbox)
        .map_err(|e| RelayError::SchemaRegistry(e.to_string()))?;
    if let Some(health) = serializers.health() {
        metrics.watch_registry(health);
    }
    let mapping = Mapped {
        mapping: &mapping,
        serializers,
    };
    let transactional = config.kafka.delivery == crate::config::Delivery::ExactlyOnce;
    let counter = metrics.trace_export_failures.clone();
    let failures: crate::sink::traces::FailureCount =
        Arc::new(move || counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1);
    crate::sink::traces::install(&config.tracing, transactional, failures)?;
    // The helpers stop after the session has drained, not when the signal arrives.
    let helpers = CancellationToken::new();
    start_http(&config, &metrics, &helpers).await?;
    let (gone_tx, gone_rx) = mpsc::channel(1);
    tokio::spawn(slot_watch::sample_forever(
        config.clone(),
        metrics.clone(),
        gone_tx,
        helpers.clone(),
    ));
    if config.outbox.sweeper.enabled {
        tokio::spawn(crate::relay::sweeper::run(
            config.clone(),
            metrics.clone(),
            helpers.clone(),
        ));
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
    helpers.cancel();
    crate::sink::traces::shutdown().await;
    result
}

async fn start_http(
    config: &Config,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
) -> Result<(), RelayError> {
    let Some(addr) = &config.http.listen else {
        return Ok(());
    };
    let listener = crate::serve::http::bind(addr)
        .await
        .map_err(|source| RelayError::Http {
            addr: addr.clone(),
            source,
        })?;
    let staleness = Duration::from_millis(config.http.ready_staleness_ms);
    tokio::spawn(crate::serve::http::serve(
        listener,
        metrics.clone(),
        staleness,
        shutdown.clone(),
    ));
    Ok(())
}

/// Starts sessions one after another: reconnects after transient errors, waits as a standby
/// while the slot is held elsewhere, stops on errors that need an operator. A session is
/// never dropped on shutdown: it drains and confirms itself, and only then returns.
async fn supervise(
    config: &Config,
    mapping: &Mapped<'_>,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
    mut gone: mpsc::Receiver<SlotGone>,
) -> Result<(), RelayError> {
    let pg = &config.postgres;
    let mut supervisor = Supervisor::new(
        Duration::from_millis(pg.reconnect_backoff_initial_ms),
        Duration::from_millis(pg.reconnect_backoff_max_ms),
    );
    let mut standby = Standby::new();
    // Once streamed, a slot that vanishes means lost events: never silently recreate it.
    let mut slot_seen = false;
    loop {
        let started = Instant::now();
        let result = tokio::select! {
            Some(g) = gone.recv() => return Err(g.into()),
            result = run_session(config, mapping, metrics, shutdown, &mut slot_seen) => result,
        };
        match supervisor.after(result, started.elapsed(), shutdown.is_cancelled()) {
            Next::Done => return Ok(()),
            Next::DoneUnconfirmed(e) => {
                warn!(error = %e, "session ended while shutting down; unconfirmed events will be sent again on restart");
                return Ok(());
            }
            Next::Fail(e) => return Err(e),
            Next::Standby => {
                metrics.set_state(RelayState::Standby);
                standby.wait(config, shutdown).await;
            }
            Next::Retry { error, delay } => {
                metrics.set_state(RelayState::Reconnecting);
                metrics.reconnects.fetch_add(1, Relaxed);
                warn!(error = %error, retry_in_ms = delay.as_millis() as u64,
                    "relay session ended; reconnecting and resuming from the slot's confirmed position");
                tokio::select! {
                    _ = shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
}

/// Connects a session (unless shutdown comes first) and runs it to its end.
async fn run_session(
    config: &Config,
    mapping: &Mapped<'_>,
    metrics: &Arc<Metrics>,
    shutdown: &CancellationToken,
    slot_seen: &mut bool,
) -> Result<(), RelayError> {
    let session = tokio::select! {
        _ = shutdown.cancelled() => return Ok(()),
        session = connect(config, mapping, metrics, *slot_seen) => session?,
    };
    *slot_seen = true;
    session.run(shutdown).await
}

/// The mapping and the serializers of every session (their schema caches outlive them).
struct Mapped<'a> {
    mapping: &'a OutboxMapping,
    serializers: crate::sink::schema::Serializers,
}

/// Opens the control connection to the first server of `info` that satisfies
/// `target_session_attrs`, refuses an unsupported version, and makes sure publication and slot
/// exist. A slot is created only when `create_slot` is set and it has never been streamed by
/// this process; on PostgreSQL 17+ (or as `postgres.failover_slot` says) as a failover slot.
///
/// "Streamed before" is this process's memory (`slot_seen`) or the mark a relay leaves in the
/// publication's comment (which a promoted standby has too): then a missing slot means lost
/// events, and the relay stops (exit 3) instead of creating a new one.
async fn prepare_slot(
    config: &Config,
    info: &ConnInfo,
    slot_seen: bool,
    metrics: &Metrics,
) -> Result<(Control, SlotInfo), RelayError> {
    let pg = &config.postgres;
    let control = Control::open(info).await?;
    let server = control.server();
    if let Some(why) = server.unsupported() {
        return Err(ControlError::Setup(why).into());
    }
    let failover = wants_failover(config, &control)?;
    if pg.create_publication && !server.in_recovery {
        control
            .ensure_publication_tables(&pg.publication, &config.outbox.publication_tables())
            .await?;
    }
    let missing = control.slot(&pg.slot).await?.is_none();
    let streamed =
        slot_seen || (missing && control.streamed_before(&pg.publication, &pg.slot).await?);
    if missing && streamed {
        return Err(slot_missing_after_streaming(&pg.slot, &control, metrics).into());
    }
    let create = pg.create_slot && !streamed;
    // A slot created here starts at "now": the sweeper keeps the rows committed before it.
    let hold = (missing && create && !server.in_recovery).then(|| HoldStore::new(config));
    if let Some(hold) = &hold {
        hold.before_creation(control.client(), ARMED_BY_RELAY)
            .await?;
    }
    let slot = control.prepare_slot(&pg.slot, create, failover).await?;
    if let Some(hold) = &hold {
        let start = slot.confirmed_flush_lsn;
        hold.after_creation(control.client(), start, ARMED_BY_RELAY)
            .await?;
    } else if !server.in_recovery {
        // A creation that stopped between its steps (a crash of this relay or of `slot
        // create`) left a hold that keeps every row: completed here once provably safe.
        HoldStore::new(config)
            .resolve_interrupted(control.client(), None)
            .await;
    }
    Ok((control, slot))
}

/// Whether the slot should be a failover slot here: never on a standby (decoding on a standby
/// keeps its own slot); refuses `failover_slot = true` on a server older than 17.
fn wants_failover(config: &Config, control: &Control) -> Result<bool, ControlError> {
    let wanted = config
        .postgres
        .failover_slot
        .wanted(control.server().version_num);
    if wanted {
        control.require_failover_slots()?;
    }
    Ok(wanted && !control.server().in_recovery)
}

/// A session on the real servers: the slot prepared, the walsender streaming from the slot's
/// confirmed position, a fresh producer. Both connections reach the same server: the control
/// connection picks the first host that satisfies `target_session_attrs`, the replication
/// connection is pinned to it (and checks the attributes again).
async fn connect<'a>(
    config: &Config,
    mapping: &Mapped<'a>,
    metrics: &'a Metrics,
    slot_seen: bool,
) -> Result<Session<'a, ReplicationStream, Publisher, Control>, RelayError> {
    let pg = &config.postgres;
    // Resolved at every session so that a rotated password file is read again.
    let info = ConnInfo::from_config(pg).map_err(|e| ControlError::Setup(e.to_string()))?;
    let (control, slot) = prepare_slot(config, &info, slot_seen, metrics).await?;
    let wal_sender_timeout = control.wal_sender_timeout().await?;
    check_receive_timeout(pg.receive_timeout_ms, wal_sender_timeout)
        .map_err(ReplicationError::from)?;
    let status_interval = status_interval(config, wal_sender_timeout);
    let mut params = ConnectParams::new(info.pinned(control.endpoint()));
    params.receive_timeout =
        receive_timeout(pg.receive_timeout_ms, wal_sender_timeout, status_interval);
    let mut sender = WalSender::connect(&params).await?;
    if wants_failover(config, &control)? && slot.failover == Some(false) {
        enable_failover(&mut sender, &pg.slot).await?;
    }
    let server = timelines::server_history(&mut sender, config).await?;
    let mut stream = sender
        .start_replication(
            &pg.slot,
            &pg.publication,
            Lsn::ZERO,
            mapping.mapping.messages_enabled(),
            pg.binary,
        )
        .await?;
    if !slot_seen && !control.server().in_recovery {
        record_streamed(&control, pg).await?;
    }
    // Exactly-once: fences older producers of this slot, reads where Kafka stands. Only once
    // the slot is ours (fencing the relay that streams it would stop it), so the walsender
    // is told meanwhile that we are alive: this can take longer than wal_sender_timeout.
    let timelines =
        timelines::timelines(config, control.server().in_recovery, &params, &server).await?;
    let facts = slot_facts(config, &control, &pg.slot).await?;
    let opening = crate::sink::open(&config.kafka, facts, metrics.blocked(), &server, timelines);
    let OpenedSink {
        publisher,
        deliveries,
        skip_below,
    } = keep_alive_while(&mut stream, status_interval, opening).await??;
    // Dead letters are cut to what their topic takes: its limit is read before the first.
    if config.dead_letter.policy == crate::config::DeadLetterPolicy::DeadLetter {
        let reading = publisher.read_limit(&config.dead_letter.topic);
        keep_alive_while(&mut stream, status_interval, reading).await?;
    }
    metrics.watch_kafka(publisher.kafka_latency());
    // The slot is ours now, so its position cannot move under us: start the ledger there,
    // so that no status update ever reports less than the slot already confirmed.
    let slot = streamed_slot(config, &control, &stream, metrics).await?;
    let start = slot.confirmed_flush_lsn.unwrap_or_default();
    info!(slot = %pg.slot, publication = %pg.publication, start = %start,
        server = %control.endpoint().target(), failover = ?slot.failover,
        backend_pid = stream.backend_pid(), status_interval_ms = status_interval.as_millis() as u64,
        "streaming from the slot's confirmed position");
    metrics.set_lsns(start, start);
    metrics.set_receive_timeout(stream.receive_timeout());
    metrics.set_state(RelayState::Streaming);
    let mut settings = Settings::from_config(config, status_interval);
    settings.serializers = mapping.serializers.clone();
    let ends = Ends {
        source: stream,
        sink: publisher,
        deliveries,
        catalog: control,
    };
    Ok(Session::new(settings, mapping.mapping, metrics, ends, start).skipping_below(skip_below))
}

/// Records in the publication's comment that this slot is streamed, so that a relay restarted
/// after a failover without a failover slot stops instead of creating a new slot; a comment
/// that cannot be written is a warning, not a reason not to stream.
async fn record_streamed(control: &Control, pg: &PostgresConfig) -> Result<(), RelayError> {
    let marked = control.mark_streamed(&pg.publication, &pg.slot).await?;
    if !marked {
        warn!(publication = %pg.publication, slot = %pg.slot,
            "cannot record in the publication's comment that this slot is streamed (it has another comment, or the role does not own the publication): a relay restarted after a failover without a failover slot would create a new slot instead of stopping");
    }
    Ok(())
}

/// The slot as read once our stream holds it. Gone already (dropped right after
/// START_REPLICATION): it was streamed, so events may be missing; never to be recreated.
/// Held by our stream, it has surely finished its creation: a hold its interrupted creation
/// left keeping every row is completed now, not at the next session.
async fn streamed_slot(
    config: &Config,
    control: &Control,
    stream: &ReplicationStream,
    metrics: &Metrics,
) -> Result<SlotInfo, RelayError> {
    let pg = &config.postgres;
    let slot = control
        .slot(&pg.slot)
        .await?
        .ok_or_else(|| slot_missing_after_streaming(&pg.slot, control, metrics))?;
    if slot.active_pid != Some(stream.backend_pid()) {
        warn!(slot = %pg.slot, active_pid = ?slot.active_pid, our_pid = stream.backend_pid(),
            "slot is not reported as held by our connection");
    } else if !control.server().in_recovery {
        HoldStore::new(config)
            .resolve_interrupted(control.client(), Some(stream.backend_pid()))
            .await;
    }
    Ok(slot)
}

/// Runs `work` while sending the walsender a status update every `interval` that confirms
/// nothing (flush 0/0 is ignored), so that it does not end the stream at `wal_sender_timeout`.
async fn keep_alive_while<T>(
    stream: &mut ReplicationStream,
    interval: Duration,
    work: impl std::future::Future<Output = T>,
) -> Result<T, ReplicationError> {
    tokio::pin!(work);
    let mut tick = tokio::time::interval_at(Instant::now() + interval, interval);
    loop {
        tokio::select! {
            out = &mut work => return Ok(out),
            _ = tick.tick() => stream.send_status(Lsn::ZERO, Lsn::ZERO, false).await?,
        }
    }
}

/// Exactly-once: who writes the slot's progress, and how far the WAL goes, read with the slot
/// held (a relay that lost the slot can decode nothing past this position any more). `None` in
/// at-least-once, which needs neither.
async fn slot_facts(
    config: &Config,
    control: &Control,
    slot: &str,
) -> Result<Option<SlotFacts>, RelayError> {
    if config.kafka.delivery != DeliveryMode::ExactlyOnce {
        return Ok(None);
    }
    let (system_identifier, database) = control.system_identity().await?;
    Ok(Some(SlotFacts {
        identity: SlotIdentity {
            system_identifier,
            database,
            slot: slot.to_string(),
        },
        wal_insert: control.wal_insert_lsn().await,
    }))
}

/// The slot vanished after this process streamed it: most likely a failover to a server that
/// has no copy of it (no failover slot, or not synchronized yet). Never recreated silently.
fn slot_missing_after_streaming(slot: &str, control: &Control, metrics: &Metrics) -> SlotGone {
    let server = control.endpoint().target();
    slot_watch::slot_gone(slot, slot_watch::GoneCause::Missing { server }, metrics)
}

/// Turns failover on for an existing slot (PostgreSQL 17+), over the replication connection.
async fn enable_failover(sender: &mut WalSender, slot: &str) -> Result<(), RelayError> {
    let command = alter_failover_command(slot);
    match sender.simple_query(&command).await {
        Ok(_) => {
            info!(slot, "turned failover on for the existing slot");
            Ok(())
        }
        Err(ReplicationError::Server(e)) => Err(ControlError::Setup(format!(
            "cannot turn failover on for slot `{slot}`: {e}; run `{command}` over a replication connection (psql \"dbname=... replication=database\"), or set postgres.failover_slot = \"false\""
        ))
        .into()),
        Err(e) => Err(e.into()),
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
