//! The integration tests, one binary: each module is one area, all share `common/` (the
//! harness) and the services `scripts/test.sh` starts. One binary links the crate once, where
//! sixteen did it sixteen times. `cargo test --test integration relay_e2e::` runs one area.
//!
//! `tests/exclusive/` stays a binary of its own: its tests stop and restart the shared broker
//! and PostgreSQL, so they must not overlap with these (cargo runs test binaries one after
//! the other).

#[path = "../common/mod.rs"]
mod common;

mod binary_mode;
mod cloudevents;
mod dead_letters;
mod exactly_once;
mod exactly_once_edges;
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
mod relay_e2e;
mod routing;
mod schema_registry;
mod standby;
mod traces;
