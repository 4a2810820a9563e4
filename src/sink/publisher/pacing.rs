//! The per-partition gate in front of librdkafka: a record goes to librdkafka only while its
//! partition has fewer than [`PARTITION_LIMIT`] records there; the rest wait here, in order,
//! and go on the delivery report that makes room, at most one produce request's worth at a
//! time.
//!
//! Why: the idempotent producer sends nothing more to a partition while
//! `RD_KAFKA_IDEMP_MAX_INFLIGHT` (5) of its *messages* are in flight (librdkafka 2.12,
//! `rd_kafka_toppar_producer_serve`), yet a queued record older than `linger.ms` wakes the
//! broker thread at once, every time: it polls with a zero timeout until an acknowledgement
//! arrives. At a steady rate that spin took most of a core from the broker and the
//! walsender (bench/README.md, issue 25). Held here, the records wait without anything
//! waking up, and those that pile up while the partition is busy leave as one batch: the
//! batching a linger would give, without its delay when the partition is idle.
//!
//! Pure bookkeeping: the sends go through a [`Sender`] (the producer, or a test's fake).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError, Weak};

use rdkafka::error::{KafkaError, RDKafkaErrorCode};

use super::client::RequestSize;
use crate::mapping::Record;

/// Marks a paced record in the delivery opaque: its report makes room in its partition.
pub(super) const PACED_BIT: usize = 1 << (usize::BITS - 2);
/// Records of one partition in librdkafka at most: its idempotent producer's in-flight
/// window, counted in messages as librdkafka counts it.
pub(super) const PARTITION_LIMIT: usize = 5;

/// Where paced records go: librdkafka, or a test's fake.
pub(super) trait Sender: Send + Sync {
    /// Hands `record` to librdkafka for `partition` (`opaque` has [`PACED_BIT`]).
    fn send(&self, record: &Record, partition: i32, opaque: usize) -> Result<(), KafkaError>;
    /// Reports a held record that could not be handed over as a failed delivery.
    fn fail(&self, record: Record, opaque: usize, error: KafkaError);
}

/// One partition: its records in librdkafka, and those waiting here.
#[derive(Default)]
struct Gate {
    outstanding: usize,
    held: VecDeque<(Record, usize)>,
}

/// The gates of every partition written to.
pub(super) struct Pacer {
    gates: Mutex<HashMap<String, HashMap<i32, Gate>>>,
    /// Records held in all gates (read without the lock by a Kafka commit's wait).
    held: AtomicUsize,
    request: RequestSize,
    /// The producer, set once it exists: the delivery callback that frees room sends through
    /// it. Weak, since the producer owns the callback's context, which owns this.
    sender: OnceLock<Weak<dyn Sender>>,
    /// Records ever held, for the tests: proof that the pacing path ran.
    #[cfg(test)]
    pub(super) ever_held: AtomicUsize,
}

impl Pacer {
    pub(super) fn new(request: RequestSize) -> Pacer {
        Pacer {
            gates: Mutex::default(),
            held: AtomicUsize::new(0),
            // At least one record per request, or a release would never end.
            request: RequestSize {
                messages: request.messages.max(1),
                ..request
            },
            sender: OnceLock::new(),
            #[cfg(test)]
            ever_held: AtomicUsize::new(0),
        }
    }

    /// Sets where released records go (once; later calls are ignored).
    pub(super) fn attach(&self, sender: Weak<dyn Sender>) {
        let _ = self.sender.set(sender);
    }

    /// Some record waits for room in its partition.
    pub(super) fn holds_any(&self) -> bool {
        self.held.load(Ordering::Acquire) > 0
    }

    fn gates(&self) -> MutexGuard<'_, HashMap<String, HashMap<i32, Gate>>> {
        self.gates.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `record` through `sender` now if its partition has room and nothing waits in
    /// it, else holds it behind the others. A send's error is returned and changes nothing.
    /// The send happens under the lock: a release on the delivery thread cannot slip in
    /// between the check and the send, so a partition's records keep their order.
    pub(super) fn offer(
        &self,
        sender: &dyn Sender,
        record: &Record,
        opaque: usize,
        partition: i32,
    ) -> Result<(), KafkaError> {
        let mut gates = self.gates();
        let gate = match gates.get_mut(&record.topic) {
            Some(partitions) => partitions.entry(partition).or_default(),
            None => gates
                .entry(record.topic.clone())
                .or_default()
                .entry(partition)
                .or_default(),
        };
        if gate.held.is_empty() && gate.outstanding < PARTITION_LIMIT {
            sender.send(record, partition, opaque | PACED_BIT)?;
            gate.outstanding += 1;
        } else {
            gate.held.push_back((record.clone(), opaque | PACED_BIT));
            self.held.fetch_add(1, Ordering::AcqRel);
            #[cfg(test)]
            self.ever_held.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// A paced record of `topic`'s `partition` was delivered (or failed): its room goes to
    /// the records waiting there, one request's worth at a time while there is room. A
    /// record librdkafka refuses for itself (too large) fails alone, as it would have when
    /// sent at once, and the session dead-letters it; when librdkafka's queue is full, it
    /// fails with every record behind it (none may overtake it), and the session restarts
    /// from the slot for them.
    pub(super) fn delivered(&self, topic: &str, partition: i32) {
        let Some(sender) = self.sender.get().and_then(Weak::upgrade) else {
            return;
        };
        let failed = {
            let mut gates = self.gates();
            let Some(gate) = gates.get_mut(topic).and_then(|g| g.get_mut(&partition)) else {
                return;
            };
            gate.outstanding = gate.outstanding.saturating_sub(1);
            self.release(gate, sender.as_ref(), partition)
        };
        for (record, opaque, error) in failed {
            sender.fail(record, opaque, error);
        }
    }

    /// Hands held records over while the gate has room; returns those that failed.
    fn release(
        &self,
        gate: &mut Gate,
        sender: &dyn Sender,
        partition: i32,
    ) -> Vec<(Record, usize, KafkaError)> {
        let mut failed = Vec::new();
        while gate.outstanding < PARTITION_LIMIT && !gate.held.is_empty() {
            let (mut messages, mut bytes) = (0, 0);
            while let Some((record, opaque)) = gate.held.pop_front() {
                let fits = messages < self.request.messages
                    && (messages == 0 || bytes + record.size() <= self.request.bytes);
                if !fits {
                    gate.held.push_front((record, opaque));
                    break;
                }
                self.held.fetch_sub(1, Ordering::AcqRel);
                match sender.send(&record, partition, opaque) {
                    Ok(()) => {
                        gate.outstanding += 1;
                        messages += 1;
                        bytes += record.size();
                    }
                    Err(error) if is_queue_full(&error) => {
                        failed.extend(self.fail_all(gate, (record, opaque), error));
                        return failed;
                    }
                    Err(error) => failed.push((record, opaque, error)),
                }
            }
        }
        failed
    }

    /// `first` and everything still held in `gate`, failed with `error`.
    fn fail_all(
        &self,
        gate: &mut Gate,
        first: (Record, usize),
        error: KafkaError,
    ) -> Vec<(Record, usize, KafkaError)> {
        let rest = std::mem::take(&mut gate.held);
        self.held.fetch_sub(rest.len(), Ordering::AcqRel);
        std::iter::once(first)
            .chain(rest)
            .map(|(record, opaque)| (record, opaque, error.clone()))
            .collect()
    }
}

/// librdkafka's queue is full: a refusal of every record, not of this one.
fn is_queue_full(error: &KafkaError) -> bool {
    error.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull)
}

#[cfg(test)]
#[path = "pacing_tests.rs"]
mod tests;
