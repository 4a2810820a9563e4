//! outbox-relay carries committed outbox rows from PostgreSQL to Kafka, at least once, in
//! commit order, confirming the replication slot only after Kafka acknowledged.
//!
//! ```text
//! WAL bytes ─▶ walsender (frames, keepalives, status updates)
//!           ─▶ pgoutput::decode            (pure: bytes → messages)
//!           ─▶ outbox::BoundTable::to_event (pure: row → Kafka record)
//!           ─▶ publisher                   (idempotent producer, delivery callbacks)
//!           ─▶ checkpoint::Ledger          (pure: newest fully acknowledged commit)
//!           ─▶ walsender status update     (flush = that commit's end LSN)
//! ```
//!
//! `pipeline` only wires these together; `control` is the ordinary SQL connection used for
//! set-up and inspection; `config` loads and validates the TOML file and its environment
//! overrides.

pub mod checkpoint;
pub mod config;
pub mod control;
pub mod lsn;
pub mod outbox;
pub mod pgoutput;
pub mod pipeline;
pub mod publisher;
pub mod walsender;
