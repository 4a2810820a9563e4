//! Where records go: the Kafka producer, which reports every record's outcome as a delivery,
//! and the dead-letter records that stand in for events that cannot be published.
//!
//! In: [`crate::mapping::Record`]s tagged with their transaction's sequence number. Out:
//! [`publisher::Delivery`] reports on a channel. [`window::InFlight`] counts what is sent and
//! not yet reported, against the in-flight caps. In `kafka.delivery = "exactly_once"` the
//! producer is transactional and `progress` keeps, per slot, where Kafka stands.

pub mod blocked;
pub mod dead_letter;
pub mod kafka_latency;
mod partition_counts;
pub mod preflight;
pub mod progress;
#[allow(
    unsafe_code,
    reason = "FFI: `skip_linger` calls librdkafka's rd_kafka_flush, which rust-rdkafka does not expose without waiting on its events"
)]
pub mod publisher;
#[cfg(test)]
mod publisher_tests;
#[allow(
    unsafe_code,
    reason = "FFI: cached librdkafka topic handles and rd_kafka_producev, which rust-rdkafka does not expose"
)]
mod topic_handles;
#[cfg(test)]
mod topic_handles_tests;
pub mod window;

pub use progress::open;

/// Identifies a PostgreSQL transaction in the relay's ledger; travels with each record as the
/// delivery opaque, so that a delivery report says which transaction it settles.
pub type TxnSeq = u64;
