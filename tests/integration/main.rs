//! The integration tests, one binary: each module is one area, all share `common/` (the
//! harness) and the services `scripts/test.sh` starts. One binary links the crate once, where
//! sixteen did it sixteen times. `cargo test --test integration relay_e2e::` runs one area.
//!
//! `exclusive::` stops and restarts the broker and PostgreSQL: `scripts/test.sh` runs it in a
//! process of its own, on services of its own (see `exclusive/mod.rs`).

#[path = "../common/mod.rs"]
mod common;

mod binary_mode;
mod cloudevents;
mod dead_letters;
mod exactly_once;
mod exactly_once_edges;
mod exclusive;
mod failover;
mod from_debezium;
mod hardening;
mod inbox;
mod kafka_faults;
mod kafka_oauth;
mod kafka_security;
mod network;
mod ops;
mod partitions;
mod refusals;
mod relay_e2e;
mod routing;
mod schema_registry;
mod standby;
mod traces;
