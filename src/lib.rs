//! outbox-relay carries committed outbox rows from PostgreSQL to Kafka, at least once, in
//! commit order, confirming the replication slot only after Kafka acknowledged.
//!
//! ```text
//!  PostgreSQL ──WAL──▶ source     walsender connection: frames, keepalives, status updates;
//!                      │          pgoutput decoding (pure: bytes → messages)
//!                      ▼
//!                     mapping     outbox rows and logical messages → Kafka records (pure)
//!                      │
//!                      ▼
//!                     sink        idempotent producer, delivery reports, dead letters ──▶ Kafka
//!                      │
//!                      ▼
//!                     relay       session loop: ledger of acknowledged commits → confirm the
//!                                 slot; supervisor: reconnects, standby, shutdown drain
//! ```
//!
//! Around the data path: `config` (the TOML file and its environment overrides: plain data and
//! validation, a leaf), `postgres` (the control connection and TLS), `serve` (metrics and the
//! HTTP endpoints), `ops` (the operator commands, which reuse the same mapping and sink so that
//! a replayed record equals the live one), `lsn` (WAL positions), `clock` (Unix time, read in
//! one place), `signals` (SIGTERM and SIGINT, from the first line of `main`, to the shutdown
//! token).
//!
//! The folders stand on floors, each using only what stands below it, with no files using each
//! other round in a circle: `src/floors.rs` writes the order down, with why, and its test
//! (`cargo test --lib floors`) fails on an arrow up or a circle.

pub mod aws;
pub mod clock;
pub mod config;
#[cfg(test)]
mod docs_links;
#[cfg(test)]
mod floors;
pub mod lsn;
pub mod mapping;
pub mod ops;
pub mod postgres;
#[cfg(test)]
mod reference;
pub mod relay;
pub mod serve;
pub mod signals;
pub mod sink;
pub mod source;
