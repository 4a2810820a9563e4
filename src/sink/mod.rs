//! Where records go: the Kafka producer, which reports every record's outcome as a delivery,
//! and the dead-letter records that stand in for events that cannot be published.
//!
//! In: [`crate::mapping::Record`]s tagged with their transaction's sequence number. Out:
//! [`publisher::Delivery`] reports on a channel. [`window::InFlight`] counts what is sent and
//! not yet reported, against the in-flight caps. In `kafka.delivery = "exactly_once"` the
//! producer is transactional and `progress` keeps, per slot, where Kafka stands.
//!
//! [`open`] makes a session's producer: idempotent, or transactional with its progress read.

pub mod blocked;
pub mod dead_letter;
pub mod fault;
pub mod kafka_latency;
pub mod limits;
pub mod preflight;
pub mod publisher;
pub mod schema;
pub mod traces;
pub mod window;

pub use publisher::progress;

use std::sync::Arc;

use tokio::sync::mpsc;
use tracing::info;

use crate::config::{Delivery as DeliveryMode, KafkaConfig};
use crate::lsn::Lsn;
use crate::mapping::partition;
use blocked::Blocked;
use progress::{
    ensure_topic, read_last, reconcile, Progress, ProgressRecord, ServerHistory, SlotIdentity,
    Timelines,
};
use publisher::{Delivery, PublishError, Publisher};

/// What a session sends with.
pub struct OpenedSink {
    pub publisher: Publisher,
    /// Its delivery reports.
    pub deliveries: mpsc::UnboundedReceiver<Delivery>,
    /// `exactly_once`: the end LSN below which PostgreSQL transactions are already in Kafka
    /// (none in at-least-once, or before the first commit).
    pub skip_below: Option<Progress>,
}

/// What exactly-once needs from PostgreSQL, read by the relay: the sink never queries it.
#[derive(Debug, Clone)]
pub struct SlotFacts {
    pub identity: SlotIdentity,
    /// `pg_current_wal_insert_lsn()` read with the slot held (none on a standby): a progress
    /// value past it means the data directory went back in time.
    pub wal_insert: Option<Lsn>,
}

/// Opens the session's producer. In `exactly_once` (which requires `facts`): the progress
/// topic made when missing, the transactional producer initialised (fencing older ones), and
/// then the last committed progress value read. Call only while holding the slot: starting
/// fences whoever held it before.
pub async fn open(
    config: &KafkaConfig,
    facts: Option<SlotFacts>,
    blocked: Arc<Blocked>,
    server: &ServerHistory,
    timelines: Timelines,
) -> Result<OpenedSink, PublishError> {
    if config.delivery == DeliveryMode::AtLeastOnce {
        let (publisher, deliveries) = Publisher::reporting_blocks(config, blocked)?;
        return Ok(OpenedSink {
            publisher,
            deliveries,
            skip_below: None,
        });
    }
    let topic = &config.progress_topic;
    // Never a quiet fall back to at-least-once: without the slot's identity there is no
    // progress key and no transactional id to fence with.
    let Some(SlotFacts {
        identity,
        wal_insert,
    }) = facts
    else {
        return Err(PublishError::Progress {
            topic: topic.clone(),
            problem: "exactly-once needs the slot's identity, which was not read".into(),
        });
    };
    let partitions = ensure_topic(config, &blocked).await?;
    let key = identity.key();
    let progress = ProgressRecord {
        topic: topic.clone(),
        partition: partition::partition_for_key(&key, partitions),
        key,
        timelines,
    };
    let partition = progress.partition;
    let (publisher, deliveries) = Publisher::transactional(
        config,
        &identity.transactional_id(),
        progress.clone(),
        blocked,
    )
    .await?;
    let last = read_last(config, &progress).await?;
    let skip_below = match last {
        Some(stored) => Some(reconcile(stored, server, wal_insert).map_err(|problem| {
            PublishError::ProgressDiverged {
                topic: topic.clone(),
                key: String::from_utf8_lossy(&progress.key).into_owned(),
                problem,
            }
        })?),
        None => None,
    };
    info!(transactional_id = %identity.transactional_id(), topic = %topic, partition,
        progress = ?skip_below.map(|p| p.to_string()),
        "exactly-once: producer initialised; transactions below the progress record are skipped");
    Ok(OpenedSink {
        publisher,
        deliveries,
        skip_below,
    })
}

/// Identifies a PostgreSQL transaction in the relay's ledger; travels with each record as the
/// delivery opaque, so that a delivery report says which transaction it settles.
pub type TxnSeq = u64;
