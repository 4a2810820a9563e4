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
//! `relay` runs sessions that wire these together; `control` is the ordinary SQL connection used for
//! set-up and inspection; `config` loads and validates the TOML file and its environment
//! overrides; `ops` holds the operator commands (`check`, `status`, `slot`, `replay`), which
//! reuse `control`, `outbox` and `publisher` so that a replayed record equals the live one.

pub mod checkpoint;
pub mod config;
pub mod control;
pub mod dead_letter;
pub mod http;
pub mod lsn;
pub mod metrics;
pub mod ops;
pub mod outbox;
pub mod partition;
pub mod pgoutput;
pub mod publisher;
pub mod relay;
pub mod slot_watch;
pub mod sweeper;
pub mod tls;
pub mod walsender;
