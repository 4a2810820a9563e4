//! The Kafka record the mapping builds and the sink sends.

use std::sync::Arc;

use bytes::Bytes;

/// One Kafka record, built from an outbox event. Payload and key are shared, not copied,
/// until librdkafka copies them into its queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub key: Bytes,
    /// `None` is a tombstone.
    pub payload: Option<Bytes>,
    pub headers: Vec<(Arc<str>, Bytes)>,
    /// Milliseconds since the Unix epoch; `None` lets the producer stamp it.
    pub timestamp_ms: Option<i64>,
    /// An explicit partition; `None` lets the partitioner choose from the key.
    pub partition: Option<i32>,
    /// When `partition` is `None`: bytes to choose the partition from instead of the key,
    /// exactly as the Java client's default partitioner would for a record keyed by them
    /// (`toPositive(murmur2(bytes)) % partitions`). The outbox puts the aggregate id here.
    pub partition_key: Option<Bytes>,
}

impl Record {
    /// Bytes this record holds while in flight (what the in-flight cap counts).
    pub fn size(&self) -> usize {
        self.key.len() + self.payload.as_ref().map_or(0, Bytes::len)
    }
}
