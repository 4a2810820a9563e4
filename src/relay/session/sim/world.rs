//! The simulated world: a workload of outbox transactions (what PostgreSQL committed and rolled
//! back), the slot's confirmed position, and "Kafka" (per-partition queues of records the
//! producer holds, the gate that holds a topic's refused records, and the logs of what the
//! brokers wrote; in exactly-once, the transaction coordinator of `coordinator.rs`, whose
//! commits make records visible). The invariants are checked here, as things happen and at
//! the end.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::OwnedMessage;
use rdkafka::Timestamp;
use tokio::sync::mpsc;

use super::coordinator::{progress_order, Coordinator, Written};
use super::gate::{HeldTopic, Ties};
use super::registry::{self, SimRegistry};
use super::timeline::Server;
use super::{Defect, Rng};
use crate::lsn::Lsn;
use crate::mapping::partition::partition_for_key;
use crate::mapping::Record;
use crate::relay::ledger::TxnSeq;
use crate::relay::seams::RecordKind;
use crate::sink::fault::KafkaFault;
use bytes::Bytes;

use crate::sink::limits::{RecordContent, TopicLimits};
use crate::sink::progress::{Covered, Progress, Stored};
use crate::sink::publisher::{waits_at_gate, Delivery, DeliveryFailure, PublishError};

pub(super) const DLQ: &str = "sim.dlq";
/// Where the slot was created: nothing before it is streamed.
pub(super) const SLOT_START: Lsn = Lsn(0x1000);
const AGGREGATE_TYPES: [&str; 3] = ["order", "invoice", "shipment"];
/// PostgreSQL's default `wal_sender_timeout`.
const WAL_SENDER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// Event numbers of rolled-back transactions start here (they must never be seen).
const ROLLED_BACK_BASE: u64 = 1_000_000;

/// A fault that is the record's own: it is dead-lettered, in every session that meets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OwnFault {
    /// The broker refuses the record itself (INVALID_RECORD in the delivery report).
    Invalid,
    /// Larger than its topic's `max.message.bytes`: refused whenever it is sent, alone too.
    TooLarge,
    /// Serialization on: its payload breaks its subject's schema (`registry.rs`).
    Schema,
}

pub(super) struct Event {
    pub id: String,
    pub aggregate_type: &'static str,
    pub aggregate_id: String,
    pub payload: String,
    pub topic: String,
    pub fault: Option<OwnFault>,
    /// The schema id its row names in the `schema_id_header` column (`registry.rs`).
    pub header: Option<String>,
}

pub(super) struct Txn {
    /// BEGIN's final LSN = the commit record's start (`Commit.commit_lsn`).
    pub final_lsn: Lsn,
    pub end_lsn: Lsn,
    /// The walsender's sent position once it has decoded this transaction: past its commit
    /// and the unpublished WAL after it (rolled-back work, other tables), before the next
    /// committed transaction.
    pub after: Lsn,
    pub events: Vec<usize>,
    /// A DDL on the outbox right before it: the relation is sent again (pgoutput.c,
    /// `rel_sync_cache_relation_cb` resets `schema_sent`), with one more column.
    pub ddl: bool,
    /// Columns added by DDL so far.
    pub extra_columns: usize,
}

/// `max.message.bytes` of every topic but the one with a small limit.
const LARGE_LIMIT: usize = 1_000_000;

/// An event's own fault and its payload's padding: 3% of the records the broker refuses as
/// invalid, and on the topic with a small `max.message.bytes` 8% of the others too large.
pub(super) fn draw_fault(rng: &mut Rng, topic: &TopicSpec) -> (Option<OwnFault>, usize) {
    let fault = if rng.chance(3) {
        Some(OwnFault::Invalid)
    } else if topic.limit < LARGE_LIMIT && rng.chance(8) {
        Some(OwnFault::TooLarge)
    } else {
        None
    };
    let pad = match fault {
        Some(OwnFault::TooLarge) => topic.limit + rng.below(200) as usize,
        _ => rng.below(100) as usize,
    };
    (fault, pad)
}

pub(super) struct TopicSpec {
    pub name: String,
    pub partitions: i32,
    /// `max.message.bytes`: the largest record batch the brokers take.
    pub limit: usize,
}

pub(super) struct Workload {
    pub txns: Vec<Txn>,
    pub events: Vec<Event>,
    /// Past the last transaction: unrelated WAL, reached only through keepalives.
    pub wal_end: Lsn,
    pub topics: Vec<TopicSpec>,
    /// Rows of rolled-back transactions (never streamed, never to be seen).
    pub rolled_back: usize,
    /// The outbox has a column before the DDL's (`added_0`) that the mapping makes the
    /// `schema_id_header` (`registry.rs`): each row's [`Event::header`], or NULL.
    pub header_column: bool,
    /// `key_column = "aggregateid"` (what `config --from-debezium` writes): every event of
    /// an aggregate has one key, so a refusal remembered by key would refuse its healthy
    /// later events too (`Defect::RefusalByKey`).
    pub key_by_aggregate: bool,
    /// The dead-letter topic's `max.message.bytes`, when it has a small one: above any one
    /// dead letter, below a batch of several (`Defect::DeadLetterBatchStops`).
    pub dlq_limit: Option<usize>,
}

impl Workload {
    /// Some records are refused by the broker as invalid (INVALID_RECORD), in both modes.
    pub fn generate(rng: &mut Rng) -> Workload {
        let small = rng.below(AGGREGATE_TYPES.len() as u64) as usize;
        let topics: Vec<TopicSpec> = AGGREGATE_TYPES
            .iter()
            .enumerate()
            .map(|(i, t)| TopicSpec {
                name: format!("outbox.event.{t}"),
                partitions: 1 + rng.below(3) as i32,
                limit: if i == small {
                    600 + rng.below(400) as usize
                } else {
                    LARGE_LIMIT
                },
            })
            .collect();
        let count = rng.range(1, 60) as usize;
        let max_rows = rng.range(1, 6);
        let mut lsn = SLOT_START.0 + 0x100;
        let (mut txns, mut events, mut rolled_back) = (Vec::new(), Vec::new(), 0);
        let mut extra_columns = 0;
        for _ in 0..count {
            if rng.chance(20) {
                // Rolled back: its WAL is decoded and dropped; pgoutput never sends it.
                let rows = rng.range(1, 3);
                rolled_back += rows as usize;
                lsn += 0x100 * rows + 0x40;
            }
            let ddl = rng.chance(5);
            extra_columns += usize::from(ddl);
            let rows = rng.range(1, max_rows);
            let final_lsn = Lsn(lsn + 0x100 * rows + 0x10);
            let end_lsn = Lsn(final_lsn.0 + 0x30);
            let mut ids = Vec::new();
            for _ in 0..rows {
                let n = events.len();
                let t = rng.below(AGGREGATE_TYPES.len() as u64) as usize;
                let (fault, pad) = draw_fault(rng, &topics[t]);
                events.push(Event {
                    id: format!("00000000-0000-4000-8000-{n:012}"),
                    aggregate_type: AGGREGATE_TYPES[t],
                    aggregate_id: format!("a{}", rng.below(4)),
                    payload: format!("{{\"e\":{n},\"p\":\"{}\"}}", "x".repeat(pad)),
                    topic: topics[t].name.clone(),
                    fault,
                    header: None,
                });
                ids.push(n);
            }
            lsn = end_lsn.0 + 0x10 + rng.below(0x200);
            txns.push(Txn {
                final_lsn,
                end_lsn,
                after: Lsn(lsn),
                events: ids,
                ddl,
                extra_columns,
            });
        }
        Workload {
            txns,
            events,
            wal_end: Lsn(lsn + rng.below(0x1000)),
            topics,
            rolled_back,
            header_column: false,
            key_by_aggregate: false,
            dlq_limit: None,
        }
    }

    pub fn topic(&self, name: &str) -> Option<&TopicSpec> {
        self.topics.iter().find(|t| t.name == name)
    }

    fn partitions(&self, topic: &str) -> i32 {
        self.topic(topic).map_or(1, |t| t.partitions)
    }

    fn limit(&self, topic: &str) -> usize {
        match self.topic(topic) {
            Some(t) => t.limit,
            None if topic == DLQ => self.dlq_limit.unwrap_or(usize::MAX),
            None => usize::MAX,
        }
    }

    /// The event a record stands for, from the number in its payload (`{"e":N,…}`): dead
    /// letters keep the payload, which is how their content is recoverable.
    fn event_of(&self, record: &Record) -> Result<usize, String> {
        let payload = record.payload.as_deref().unwrap_or_default();
        let text = String::from_utf8_lossy(registry::unframed(payload));
        let n = text
            .strip_prefix("{\"e\":")
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse::<u64>().ok())
            .ok_or_else(|| {
                format!(
                    "a record in `{}` whose content names no event: {:?}",
                    record.topic,
                    text.chars().take(60).collect::<String>()
                )
            })?;
        if n >= ROLLED_BACK_BASE {
            return Err(format!(
                "an event of a rolled-back transaction in `{}`",
                record.topic
            ));
        }
        usize::try_from(n)
            .ok()
            .filter(|&n| n < self.events.len())
            .ok_or_else(|| format!("an event never committed ({n}) in `{}`", record.topic))
    }
}

/// What a commit the coordinator answers does.
enum Fate {
    Commits,
    Aborts,
    /// Its EndTxn is still on its way: answered when the next producer initialises the id.
    InFlight,
}

/// A record the producer holds, not yet answered by the brokers.
pub(super) struct Pending {
    pub record: Record,
    pub seq: TxnSeq,
    pub kind: RecordKind,
    /// The session (and so the producer) that sent it.
    pub producer: u32,
    pub reports: mpsc::UnboundedSender<Delivery>,
    /// Exactly-once: the Kafka transaction it was sent in.
    pub txn: Option<u64>,
    /// Its place in the order the producer was handed records (set by `World::route`).
    pub sent: u64,
}

impl Pending {
    fn report(&self, result: Result<(), KafkaError>, partition: i32) {
        let result = result.map_err(|error| {
            let message = OwnedMessage::new(
                self.record.payload.as_ref().map(|p| p.to_vec()),
                Some(self.record.key.to_vec()),
                self.record.topic.clone(),
                Timestamp::NotAvailable,
                partition,
                -1,
                None,
            );
            DeliveryFailure::new(error, message)
        });
        // A report to a session that ended is lost with its producer.
        let _ = self.reports.send(Delivery {
            seq: self.seq,
            dead_letter: self.kind == RecordKind::DeadLetter,
            bytes: self.record.size(),
            result,
        });
    }
}

/// A record the brokers wrote.
struct Landed {
    event: usize,
    producer: u32,
}

pub(super) struct World {
    pub workload: Workload,
    /// The slot's `confirmed_flush_lsn`.
    pub slot: Lsn,
    /// Its position as of the last checkpoint: where it stands after PostgreSQL restarts.
    pub slot_persisted: Lsn,
    /// Every position it moved to, oldest first: what a standby's slot sync may have copied
    /// last before a failover (`timeline.rs`).
    pub confirmed: Vec<Lsn>,
    /// The next status update fails (the connection broke while it was written).
    pub status_fails: bool,
    /// PostgreSQL restarted during the run: duplicates are allowed then, even with one
    /// session.
    postgres_restarted: bool,
    /// The session running now (0, 1, …): also its producer's identity.
    pub incarnation: u32,
    /// Faults injected in this session that end it (a dropped connection, a transient
    /// delivery failure, a batch refused as too large): a session may end on an error only
    /// after one.
    pub restart_causes: u32,
    /// Transient failures (delivery timeout) the next answered batches get.
    pub transient: u32,
    /// Topics that refuse WRITE (DESCRIBE allowed): refused when records are sent.
    pub acl_denied: BTreeSet<String>,
    /// Topics whose metadata read is refused (no DESCRIBE, or missing and not created).
    pub metadata_refused: BTreeSet<String>,
    /// Topics this producer read the metadata of (its partition count known).
    read: BTreeSet<String>,
    /// Topics this producer's librdkafka marked errored (`rd_kafka_topic_set_error`): every
    /// produce to them fails at once until a metadata refresh finds them whole.
    errored: BTreeSet<String>,
    /// Records handed to the producer so far (for `Pending::sent`).
    sent: u64,
    pub queues: BTreeMap<(String, i32), VecDeque<Pending>>,
    /// Records held by the publisher's gate, per topic (`gate.rs`).
    pub gate: BTreeMap<String, HeldTopic>,
    /// Partitions where a batch of this producer failed, so that the session ends: what is
    /// still queued there when the producer goes is not written (the batches in flight behind
    /// the failed one are refused as out of sequence, OUT_OF_ORDER_SEQUENCE_NUMBER, Kafka's
    /// `ProducerAppendInfo.checkSequence`). Until it goes, a batch refused as too large does
    /// not stop the later ones (librdkafka's idempotent producer sends them on after an epoch
    /// bump, `rd_kafka_idemp_drain_epoch_bump`): the session must end at once.
    broken: BTreeSet<(String, i32)>,
    logs: BTreeMap<(String, i32), Vec<Landed>>,
    /// Per event: (in its topic, dead-lettered) landings, for the checks.
    pub landed: Vec<(u32, u32)>,
    /// Events Kafka refused as too large or invalid, with their record's topic and key (what
    /// the producer's limits remember a refusal by): `World::progress_mark`.
    refused_events: BTreeMap<usize, Record>,
    /// Transactions known to be safely behind the slot.
    pub verified: usize,
    /// Limits known to the producer, which outlive sessions (`sink::limits`).
    pub limits: Arc<TopicLimits>,
    /// The producer's configured `batch.size`.
    pub batch_size_configured: usize,
    pub violations: Vec<String>,
    /// What happened, for a failing run's report.
    pub schedule: Vec<String>,
    pub step: usize,
    /// How long (ms) the driver lets the paused clock run after this step.
    pub pending_pause: u64,
    /// Exactly-once: Kafka's transactions (`None`: at-least-once).
    pub eos: Option<Coordinator>,
    /// The defect injected into this run, if any (see `Defect`).
    pub defect: Defect,
    /// `Defect::RefusalByKey`: the refusals remembered by `(topic, key)`, as the relay did.
    pub refused_keys: HashSet<(String, Bytes)>,
    /// Exactly-once: Kafka transactions committed, and commits that failed.
    pub commits: (u32, u32),
    /// The server decoded from: its timeline, and a promotion in place or a failover
    /// (`timeline.rs`).
    pub server: Server,
    /// Serialization on: the registry (`registry.rs`), which checks each record that lands.
    pub registry: Option<SimRegistry>,
    /// The last status update: by which session, when (`World::heard_from_relay`).
    last_status: Option<(u32, tokio::time::Instant)>,
}

impl World {
    pub fn new(workload: Workload, rng: &mut Rng, exactly_once: bool, defect: Defect) -> World {
        let limits = Arc::new(TopicLimits::default());
        for topic in &workload.topics {
            // `partition_counts` reads `max.message.bytes` with DescribeConfigs when allowed;
            // otherwise the limit is learned from refusals.
            if rng.chance(60) {
                limits.read(&topic.name, topic.limit);
            }
        }
        let landed = vec![(0, 0); workload.events.len()];
        let wal_end = workload.wal_end;
        World {
            workload,
            slot: SLOT_START,
            slot_persisted: SLOT_START,
            confirmed: vec![SLOT_START],
            status_fails: false,
            postgres_restarted: false,
            incarnation: 0,
            restart_causes: 0,
            transient: 0,
            acl_denied: BTreeSet::new(),
            metadata_refused: BTreeSet::new(),
            read: BTreeSet::new(),
            errored: BTreeSet::new(),
            sent: 0,
            queues: BTreeMap::new(),
            gate: BTreeMap::new(),
            broken: BTreeSet::new(),
            logs: BTreeMap::new(),
            landed,
            refused_events: BTreeMap::new(),
            verified: 0,
            limits,
            batch_size_configured: [1_000_000, 4096, 1024][rng.below(3) as usize],
            violations: Vec::new(),
            schedule: Vec::new(),
            step: 0,
            pending_pause: 0,
            eos: exactly_once.then(Coordinator::new),
            defect,
            refused_keys: HashSet::new(),
            commits: (0, 0),
            server: Server::primary(wal_end),
            registry: None,
            last_status: None,
        }
    }

    pub fn note(&mut self, what: String) {
        self.schedule.push(format!("step {}: {what}", self.step));
    }

    pub fn violation(&mut self, what: String) {
        let step = self.step;
        self.violations.push(format!("step {step}: {what}"));
    }

    /// The producer of this session batches up to this many bytes (`TopicLimits::batch_size`).
    pub fn batch_size(&self) -> usize {
        self.limits.batch_size(self.batch_size_configured)
    }

    /// The partition librdkafka's `murmur2_random` partitioner picks (the aggregate id, as
    /// the outbox sets `partition_key`).
    pub fn partition_of(&self, record: &Record) -> i32 {
        let key = record.partition_key.as_ref().unwrap_or(&record.key);
        partition_for_key(key, self.workload.partitions(&record.topic))
    }

    /// A status update: PostgreSQL moves `confirmed_flush_lsn` forward only
    /// (`LogicalConfirmReceivedLocation`, replication/logical/logical.c).
    pub fn confirm(&mut self, flush: Lsn) {
        if flush > self.slot {
            self.slot = flush;
            self.confirmed.push(flush);
        }
        self.check_slot();
        self.heard_from_relay();
    }

    /// The walsender hears from the session (a status update): never more than
    /// `wal_sender_timeout` after the last time in the same session, or PostgreSQL would have
    /// ended the stream (`WalSndCheckTimeOut`, replication/walsender.c) — the relay's
    /// feedback must not wait on anything (Kafka, the registry).
    fn heard_from_relay(&mut self) {
        let now = tokio::time::Instant::now();
        if let Some((incarnation, at)) = self.last_status {
            let silence = now - at;
            if incarnation == self.incarnation && silence > WAL_SENDER_TIMEOUT {
                let what = format!(
                    "the walsender heard nothing from the session for {silence:?}, past wal_sender_timeout ({WAL_SENDER_TIMEOUT:?})"
                );
                self.violation(what);
            }
        }
        self.last_status = Some((self.incarnation, now));
    }

    /// PostgreSQL restarts: the slot goes back to its persisted position (duplicates, not
    /// loss, as long as what was confirmed was safe when it was).
    pub fn postgres_restarts(&mut self) {
        self.note(format!(
            "PostgreSQL restarts: the slot goes back from {} to {}",
            self.slot, self.slot_persisted
        ));
        self.slot = self.slot_persisted;
        self.postgres_restarted = true;
        let slot = self.slot;
        self.verified = self
            .workload
            .txns
            .iter()
            .position(|t| t.final_lsn >= slot)
            .unwrap_or(self.workload.txns.len());
    }

    /// The slot never passes an event that is neither in its topic nor dead-lettered: on a
    /// restart, decoding skips every transaction whose commit record starts before the
    /// confirmed position (`SnapBuildXactNeedsSkip`, replication/logical/snapbuild.c).
    pub fn check_slot(&mut self) {
        while let Some(txn) = self.workload.txns.get(self.verified) {
            if txn.final_lsn >= self.slot {
                break;
            }
            let missing: Vec<usize> = txn
                .events
                .iter()
                .copied()
                .filter(|&e| self.landed[e] == (0, 0))
                .collect();
            if let Some(&e) = missing.first() {
                let what = format!(
                    "the slot was confirmed at {} past event {e} (transaction committing at {}), which is neither in Kafka nor dead-lettered",
                    self.slot, txn.final_lsn
                );
                self.violation(what);
                return;
            }
            self.verified += 1;
        }
    }

    /// The brokers write `pending` to `partition`: checked as it lands.
    fn land(&mut self, pending: &Pending, partition: i32) {
        self.land_record(&pending.record, pending.kind, pending.producer, partition);
    }

    /// A record becomes visible to a read_committed reader (at-least-once: as it is written;
    /// exactly-once: as its transaction commits).
    fn land_record(&mut self, record: &Record, kind: RecordKind, producer: u32, partition: i32) {
        let event = match self.workload.event_of(record) {
            Ok(e) => e,
            Err(what) => return self.violation(what),
        };
        let ev = &self.workload.events[event];
        let dead = kind == RecordKind::DeadLetter;
        if !dead && record.topic != ev.topic {
            let what = format!("event {event} written to `{}`", record.topic);
            return self.violation(what);
        }
        let (has_fault, topic) = (ev.fault.is_some(), ev.topic.clone());
        if let Some(registry) = &self.registry {
            if let Err(what) = registry.check(record, kind, ev.fault) {
                return self.violation(format!("event {event}: {what}"));
            }
        }
        if self.eos.is_some() && !dead {
            // Exactly-once, as it becomes visible: the aggregate's previous event (in commit
            // order) is visible already.
            // (A failover's lost branch is no one's predecessor: `timeline.rs`.)
            let previous = (0..event).rev().find(|&p| {
                let p_ev = &self.workload.events[p];
                p_ev.fault.is_none()
                    && !self.server.is_lost(p)
                    && p_ev.aggregate_type == ev.aggregate_type
                    && p_ev.aggregate_id == ev.aggregate_id
            });
            if let Some(p) = previous.filter(|&p| self.landed[p].0 == 0) {
                let what = format!(
                    "event {event} of aggregate {}/{} visible before event {p}, committed before it",
                    ev.aggregate_type, ev.aggregate_id
                );
                self.violation(what);
            }
        }
        if self.eos.is_some() && self.landed[event] != (0, 0) {
            let what = format!(
                "event {event} of `{topic}` seen twice by a read_committed reader (exactly-once), now in `{}`",
                record.topic
            );
            self.violation(what);
        }
        if dead && !has_fault {
            let what = format!("event {event} of `{topic}` dead-lettered for no fault of its own");
            self.violation(what);
        }
        let key = (record.topic.clone(), partition);
        let log = self.logs.entry(key).or_default();
        if log
            .iter()
            .any(|l| l.event == event && l.producer == producer)
        {
            let what = format!(
                "event {event} written twice to `{}` by one session",
                record.topic
            );
            self.violation(what);
        }
        let log = self.logs.entry((record.topic.clone(), partition));
        log.or_default().push(Landed { event, producer });
        let counts = &mut self.landed[event];
        if dead {
            counts.1 += 1;
        } else {
            counts.0 += 1;
        }
    }

    /// Whether a record would be written if its partition were answered now.
    fn landable(&self, pending: &Pending) -> bool {
        let topic = &pending.record.topic;
        let own_fault = self
            .workload
            .event_of(&pending.record)
            .ok()
            .and_then(|e| self.workload.events[e].fault);
        !self.acl_denied.contains(topic)
            && pending.record.size() <= self.workload.limit(topic)
            && (pending.kind == RecordKind::DeadLetter || own_fault.is_none())
    }

    pub fn partitions_waiting(&self) -> Vec<(String, i32)> {
        self.queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The brokers answer the oldest batch of a partition. One batch per ProduceRequest and
    /// partition (`rd_kafka_toppar_producer_serve`, rdkafka_broker.c); a batch holds the queued records up to
    /// `batch.size` (`rd_kafka_msgset_writer_write_msgq`, rdkafka_msgset_writer.c, starts a new batch before a record
    /// that would pass it). Partitions are answered in any order, each in order.
    pub fn answer(&mut self, key: &(String, i32), rng: &mut Rng) {
        let batch_size = self.batch_size();
        let Some(queue) = self.queues.get_mut(key) else {
            return;
        };
        let mut batch = Vec::new();
        let mut bytes = 0;
        while let Some(next) = queue.front() {
            if !batch.is_empty() && bytes + next.record.size() > batch_size {
                break;
            }
            bytes += next.record.size();
            batch.extend(queue.pop_front());
        }
        let (topic, partition) = (key.0.clone(), key.1);
        let eos = self.eos.is_some();
        if self.acl_denied.contains(&topic) {
            // TOPIC_AUTHORIZATION_FAILED: librdkafka marks the topic errored, which fails the
            // records still queued for it (every partition) before the refused batch is
            // reported (`gate.rs`).
            let error = KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
            let partitions: Vec<(String, i32)> = self
                .queues
                .range((topic.clone(), i32::MIN)..=(topic.clone(), i32::MAX))
                .map(|(k, _)| k.clone())
                .collect();
            let mut refused = Vec::new();
            for k in partitions {
                let queued = self.queues.get_mut(&k).map(std::mem::take);
                refused.extend(queued.into_iter().flatten().map(|p| (k.1, p)));
            }
            refused.extend(batch.into_iter().map(|p| (partition, p)));
            self.note(format!(
                "{topic}/{partition} refused a batch for authorization: {} records of {topic} fail",
                refused.len()
            ));
            self.errored.insert(topic);
            for (partition, pending) in refused {
                self.refuse(partition, pending, &error);
            }
            return;
        }
        if self.transient > 0 {
            // message.timeout.ms expired (`rd_kafka_msgq_age_scan`, rdkafka_msg.c): the request may have
            // been written and its answer lost, so a prefix of the batch may be in Kafka.
            self.transient -= 1;
            self.restart_causes += 1;
            self.broken.insert(key.clone());
            let written = rng.below(batch.len() as u64 + 1) as usize;
            self.note(format!(
                "delivery timeout for a batch of {} in {topic}/{partition} ({written} written)",
                batch.len()
            ));
            // The younger records of the partition fail with it (modelled so: librdkafka's
            // idempotent producer without `enable.gapless.guarantee` may instead send them
            // on after an epoch bump, `rd_kafka_idemp_drain_epoch_bump` in rdkafka_idempotence.c, leaving a gap).
            let rest = self.queues.get_mut(key).map(std::mem::take);
            for (i, pending) in batch.iter().chain(rest.iter().flatten()).enumerate() {
                if i < written && self.landable(pending) {
                    self.write(pending, partition);
                }
                let error = KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut);
                self.fail(pending, error, partition);
            }
            return;
        }
        if bytes > self.workload.limit(&topic) {
            // MESSAGE_TOO_LARGE for the partition: every record of the batch fails with it,
            // none is split off (`rd_kafka_handle_Produce_error`, rdkafka_request.c, librdkafka 2.12).
            // Exactly-once: the failure dooms the transaction, whatever the batch held.
            if batch.len() > 1 || bytes < batch_size || eos {
                self.restart_causes += 1;
                self.broken.insert(key.clone());
            }
            self.note(format!(
                "{topic}/{partition} refused a batch of {} ({bytes} bytes) as too large",
                batch.len()
            ));
            for pending in batch {
                self.note_refused(&pending);
                let error = KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge);
                self.fail(&pending, error, partition);
            }
            return;
        }
        for pending in batch {
            let invalid = pending.kind == RecordKind::Event
                && self
                    .workload
                    .event_of(&pending.record)
                    .is_ok_and(|e| self.workload.events[e].fault == Some(OwnFault::Invalid));
            let fenced = self
                .eos
                .as_ref()
                .is_some_and(|c| !c.is_current(pending.producer));
            if fenced {
                // A zombie's produce: "transactional producer fenced by newer producer
                // instance" (`rd_kafka_handle_Produce_error`, rdkafka_request.c).
                let error = KafkaError::MessageProduction(RDKafkaErrorCode::ProducerFenced);
                self.fail(&pending, error, partition);
            } else if invalid {
                // Modelled per record: only the record at fault fails, the others of its
                // batch are written. UNVERIFIED: the broker rejects the whole batch
                // (KIP-467 names the records at fault in `record_errors`); if librdkafka
                // 2.12 fails every record of it with INVALID_RECORD
                // (`rd_kafka_handle_Produce_error`, rdkafka_request.c), the session dead-letters the healthy
                // ones too: with that model the simulation fails at seed 1.
                self.restart_causes += u32::from(eos);
                // The reporter remembers it, so that it is refused before it is sent again
                // (`DeliveryReporter::delivery`, sink/publisher/delivery.rs).
                self.note_refused(&pending);
                let record = &pending.record;
                if self.defect != Defect::ForgetsInvalid {
                    self.limits
                        .remember_invalid(&record.topic, RecordContent::of_record(record));
                }
                self.refused_keys
                    .insert((record.topic.clone(), record.key.clone()));
                let error = KafkaError::MessageProduction(RDKafkaErrorCode::InvalidRecord);
                self.fail(&pending, error, partition);
            } else {
                self.write(&pending, partition);
                self.answered(&pending, None);
                pending.report(Ok(()), partition);
            }
        }
    }

    fn note_refused(&mut self, pending: &Pending) {
        if pending.kind == RecordKind::Event {
            if let Ok(e) = self.workload.event_of(&pending.record) {
                self.refused_events.insert(e, pending.record.clone());
            }
        }
    }

    /// The brokers wrote `pending`: visible now (at-least-once), or once its Kafka
    /// transaction commits — into nothing when that one was aborted (its records carry the
    /// abort marker) or is already committed.
    fn write(&mut self, pending: &Pending, partition: i32) {
        let Some(txn) = pending.txn else {
            return self.land(pending, partition);
        };
        if let Some(open) = self.eos.as_mut().and_then(|c| c.txn(txn)) {
            open.written.push(Written {
                record: pending.record.clone(),
                kind: pending.kind,
                producer: pending.producer,
                partition,
            });
        }
    }

    /// A record refused for authorization when it was sent: back to the publisher's gate
    /// (at-least-once: the reporter sends it there when `waits_at_gate`, never to the
    /// session); exactly-once has no gate (`Publisher::with_client_config`): the failure
    /// dooms the transaction and ends the session.
    fn refuse(&mut self, partition: i32, pending: Pending, error: &KafkaError) {
        let eos = self.eos.is_some();
        if waits_at_gate(KafkaFault::of(error))
            && !eos
            && self.defect != Defect::AclRefusalToSession
        {
            let ties = self.ties();
            let held = self.gate.entry(pending.record.topic.clone()).or_default();
            held.insert_refused(partition, pending, ties);
        } else {
            self.restart_causes += u32::from(eos);
            self.fail(&pending, error.clone(), partition);
        }
    }

    /// How the gate orders a transaction's refused records among themselves.
    fn ties(&self) -> Ties {
        match self.defect {
            Defect::GateAppends => Ties::Appended,
            Defect::GateTiesInReportOrder => Ties::ReportOrder,
            _ => Ties::SendOrder,
        }
    }

    /// The producer takes a record (`Publisher::send_with_opaque` after its refusal check):
    /// behind its topic's waiting records if any wait; waiting for its topic's first metadata
    /// read, refused (`gate.rs`); refused at once when librdkafka marked its topic errored —
    /// held (at-least-once, `hold_refused`) or failed (exactly-once: the error returned);
    /// else queued for its partition.
    pub fn route(&mut self, mut pending: Pending) -> Result<(), RDKafkaErrorCode> {
        self.sent += 1;
        pending.sent = self.sent;
        let topic = pending.record.topic.clone();
        let partition = self.partition_of(&pending.record);
        let holds_all = self.defect == Defect::GateHoldsAll && !self.gate.is_empty();
        if let Some(held) = self.gate.get_mut(&topic) {
            held.later.push_back((partition, pending));
            return Ok(());
        }
        if holds_all {
            self.gate
                .entry(topic)
                .or_default()
                .later
                .push_back((partition, pending));
            return Ok(());
        }
        if !self.read.contains(&topic) {
            if self.metadata_refused.contains(&topic) && self.defect == Defect::MetadataRefusalFails
            {
                self.note(format!(
                    "the first metadata read of {topic} is refused: its record fails"
                ));
                let error =
                    KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed);
                self.fail(&pending, error, partition);
                return Ok(());
            }
            if self.metadata_refused.contains(&topic) {
                self.note(format!(
                    "the first metadata read of {topic} is refused: its records wait"
                ));
                let held = self.gate.entry(topic).or_default();
                held.first_read = true;
                held.later.push_back((partition, pending));
                return Ok(());
            }
            self.read.insert(topic.clone());
        }
        if self.errored.contains(&topic) {
            if self.eos.is_some() {
                self.restart_causes += 1;
                return Err(RDKafkaErrorCode::TopicAuthorizationFailed);
            }
            let ties = self.ties();
            let held = self.gate.entry(topic).or_default();
            held.insert_refused(partition, pending, ties);
            return Ok(());
        }
        let queue = self.queues.entry((topic, partition));
        queue.or_default().push_back(pending);
        Ok(())
    }

    /// Whether the brokers still refuse what `held` waits for: its first metadata read, or
    /// (refused when sent) WRITE — the probe is refused — or DESCRIBE (librdkafka's metadata
    /// keeps the topic errored).
    fn still_refused(&self, topic: &str, held: &HeldTopic) -> bool {
        self.metadata_refused.contains(topic)
            || (!held.first_read && self.acl_denied.contains(topic))
    }

    /// The publisher's retries, as the clock moves (the first read's back-off, the held
    /// topic's probe after `PROBE_PAUSE`, librdkafka's metadata refresh): a topic the
    /// brokers take again has its records produced, in order.
    pub fn retry_gate(&mut self) {
        let free: Vec<String> = self
            .gate
            .iter()
            .filter(|(t, held)| !self.still_refused(t, held))
            .map(|(t, _)| t.clone())
            .collect();
        if self.defect == Defect::GateHoldsAll && free.len() < self.gate.len() {
            return;
        }
        for topic in free {
            let Some(held) = self.gate.remove(&topic) else {
                continue;
            };
            self.read.insert(topic.clone());
            self.errored.remove(&topic);
            if !held.is_empty() {
                self.note(format!(
                    "{topic} takes records again: its {} held records go",
                    held.len()
                ));
            }
            for (partition, pending) in held.drain() {
                let queue = self.queues.entry((topic.clone(), partition));
                queue.or_default().push_back(pending);
            }
        }
    }

    /// Records of `topic` the producer holds (queued or in the gate).
    pub fn holding(&self, topic: &str) -> usize {
        let queued: usize = self
            .queues
            .iter()
            .filter(|((t, _), _)| t == topic)
            .map(|(_, q)| q.len())
            .sum();
        queued + self.gate.get(topic).map_or(0, HeldTopic::len)
    }

    /// Events of `topic` neither in Kafka nor dead-lettered (those waiting in the session
    /// for the registry among them).
    pub fn not_landed(&self, topic: &str) -> usize {
        (0..self.workload.events.len())
            .filter(|&e| self.workload.events[e].topic == topic && self.landed[e] == (0, 0))
            .count()
    }

    /// Every committed event of a topic other than `refused` is in Kafka (or dead-lettered):
    /// a fault that concerns one topic does not stall the others. `held` of its records wait,
    /// against `cap`, the session's in-flight cap (a stall once they fill it is the cap's, by
    /// design).
    pub fn check_others_progress(&mut self, refused: &str, held: usize, cap: usize, steps: usize) {
        if held >= cap {
            return;
        }
        let stalled = (0..self.workload.events.len())
            .find(|&e| self.workload.events[e].topic != refused && self.landed[e] == (0, 0));
        if let Some(e) = stalled {
            let what = format!(
                "event {e} of `{}` is not in Kafka after {steps} steps in which only `{refused}` refused records ({held} held, in-flight cap {cap}): one topic's fault stalls the others",
                self.workload.events[e].topic,
            );
            self.violation(what);
        }
    }

    /// A record failed: its report, and (exactly-once) its transaction is doomed.
    fn fail(&mut self, pending: &Pending, error: KafkaError, partition: i32) {
        self.answered(pending, error.rdkafka_error_code());
        pending.report(Err(error), partition);
    }

    /// Exactly-once: one more record of its transaction answered (`failed`: with this error,
    /// which makes the transaction abortable).
    fn answered(&mut self, pending: &Pending, failed: Option<RDKafkaErrorCode>) {
        let defect = self.defect;
        let Some(open) = pending
            .txn
            .and_then(|txn| self.eos.as_mut().and_then(|c| c.txn(txn)))
        else {
            return;
        };
        open.answered += 1;
        if defect != Defect::ForgetDoom {
            open.doomed = open.doomed.or(failed);
        }
    }

    /// Exactly-once: the commit asked for may be answered (every record of its transaction
    /// was answered: the flush is over).
    pub fn commit_ready(&self) -> bool {
        self.eos
            .as_ref()
            .and_then(|c| c.open.as_ref())
            .is_some_and(|t| {
                t.commit.is_some() && (t.flushed() || self.defect == Defect::CommitBeforeAcks)
            })
    }

    /// Exactly-once: the coordinator answers the commit (`fault`: with a failure of a class
    /// the seed picks, if the transaction would otherwise commit).
    pub fn answer_commit(&mut self, rng: &mut Rng, fault: bool) {
        let Some(coordinator) = self.eos.as_mut() else {
            return;
        };
        let Some(mut txn) = coordinator.open.take() else {
            return;
        };
        let Some((stored, outcome)) = txn.commit.take() else {
            coordinator.open = Some(txn);
            return;
        };
        let failed = |code| {
            Err(PublishError::Transaction {
                what: "commit",
                error: KafkaError::MessageProduction(code),
            })
        };
        use Fate::*;
        let at = stored.at;
        let (fate, result, what) = if !coordinator.is_current(txn.producer) {
            // The coordinator aborted it when the newer producer initialised the id.
            (Aborts, failed(RDKafkaErrorCode::ProducerFenced), "fenced")
        } else if let Some(code) = txn.doomed {
            (Aborts, failed(code), "abortable: a record of it failed")
        } else if fault {
            let timed_out = failed(RDKafkaErrorCode::OperationTimedOut);
            match rng.below(5) {
                // Retriable: EndTxn timed out. The coordinator may have committed it, or
                // not, or the request may still be on its way (answered when the next
                // producer initialises the id: before its fence, or fenced).
                0 => (Commits, timed_out, "timed out, committed all the same"),
                1 => (InFlight, timed_out, "timed out, EndTxn still on its way"),
                2 => (Aborts, timed_out, "timed out"),
                // Abortable: a permanent EndTxn error (`rd_kafka_txn_set_abortable_error0`).
                3 => (
                    Aborts,
                    failed(RDKafkaErrorCode::UnknownProducerId),
                    "abortable",
                ),
                // Fatal: the producer was fenced meanwhile.
                _ => {
                    coordinator.fenced = true;
                    (
                        Aborts,
                        failed(RDKafkaErrorCode::InvalidProducerEpoch),
                        "fatal (fenced)",
                    )
                }
            }
        } else {
            (Commits, Ok(()), "committed")
        };
        let records = txn.written.len();
        let written = match fate {
            Commits => std::mem::take(&mut txn.written),
            InFlight => {
                coordinator.zombie = Some((stored, std::mem::take(&mut txn.written)));
                Vec::new()
            }
            Aborts => {
                // Still open on the broker, until the session aborts it or the next
                // producer initialises the id.
                coordinator.open = Some(txn);
                Vec::new()
            }
        };
        if result.is_err() {
            self.restart_causes += 1;
            self.commits.1 += 1;
        }
        self.note(format!(
            "kafka commit at {at} of {records} written records: {what}"
        ));
        let _ = outcome.send(result);
        if let Commits = fate {
            self.apply(stored, written);
        }
    }

    /// A Kafka transaction commits: its records become visible, with its progress value.
    fn apply(&mut self, stored: Stored, written: Vec<Written>) {
        let at = stored.at;
        self.commits.0 += 1;
        for w in &written {
            self.land_record(&w.record, w.kind, w.producer, w.partition);
        }
        let Some(coordinator) = self.eos.as_mut() else {
            return;
        };
        let previous = coordinator.committed.last().map(|s| self.server.holds(s));
        coordinator.committed.push(stored);
        self.check_label(&stored);
        if let Some(previous) = previous.filter(|p| progress_order(p) > progress_order(&at)) {
            self.violation(format!(
                "the progress value went back: {at} committed after {previous}"
            ));
        }
        // What the value says is in Kafka must be: the next session skips all of it. (A value
        // of a failover's lost branch, by that branch's transactions: `timeline.rs`.)
        let lost_history = self.server.lost_history_of(&stored, &self.workload);
        let history: Vec<(Lsn, &[usize])> = match &lost_history {
            Some(txns) => txns.iter().map(|(l, e)| (*l, &e[..])).collect(),
            None => self
                .workload
                .txns
                .iter()
                .map(|t| (t.final_lsn, &t.events[..]))
                .collect(),
        };
        let mut missing = None;
        for (final_lsn, events) in history {
            let first = match at.covers(final_lsn) {
                Covered::Nothing => break,
                Covered::All => events.len(),
                Covered::First { changes: n, .. } => (n as usize).min(events.len()),
            };
            if let Some(&e) = events[..first].iter().find(|&&e| self.landed[e] == (0, 0)) {
                missing = Some((e, final_lsn));
                break;
            }
        }
        if let Some((e, final_lsn)) = missing {
            let what = format!(
                "the progress value {at} was committed though event {e} (transaction committing at {final_lsn}) is not in Kafka"
            );
            self.violation(what);
        }
    }

    /// Exactly-once: a session starts; its producer initialises the transactional id
    /// (`init_transactions`: fences older producers and aborts their open transaction,
    /// KIP-98), and then the progress value is read (`read_last`, sink/publisher/progress.rs:
    /// the last committed value of the key, read_committed) — in that order, as `sink::open`
    /// does, so that a zombie's commit cannot land after the read.
    pub fn init_transactions(&mut self, rng: &mut Rng) -> Option<Progress> {
        let incarnation = self.incarnation;
        let defect = self.defect;
        let coordinator = self.eos.as_mut()?;
        let zombie = coordinator.zombie.take();
        let mut read = None;
        if defect == Defect::ReadBeforeFence {
            read = Some(self.read_progress());
        }
        if let Some((stored, written)) = zombie {
            let at = stored.at;
            // The zombie's EndTxn reaches the coordinator before the fence (then the read
            // below sees it), or after it (then it fails with PRODUCER_FENCED).
            if defect == Defect::ReadBeforeFence || rng.chance(50) {
                self.note(format!(
                    "the previous producer's commit at {at} reaches the coordinator"
                ));
                self.apply(stored, written);
            } else {
                self.note(format!("the previous producer's commit at {at} is fenced"));
            }
        }
        let coordinator = self.eos.as_mut()?;
        coordinator.epoch = incarnation;
        coordinator.fenced = false;
        coordinator.open = None;
        let read = read.unwrap_or_else(|| self.read_progress());
        self.open_progress(read)
    }

    /// The last committed progress value, as a read_committed reader reads it.
    fn read_progress(&mut self) -> Option<Stored> {
        let stale = self.defect == Defect::StaleProgress;
        let committed = &self.eos.as_ref()?.committed;
        let read = if stale {
            // The defect: the value before the last.
            committed.len().checked_sub(2).map(|i| committed[i])
        } else {
            committed.last().copied()
        };
        self.note(format!(
            "the progress value read: {}",
            read.map_or("none".into(), |p| p.at.to_string())
        ));
        read
    }

    /// The producer goes (a crash, or its session ended: rust-rdkafka's `BaseProducer` purges
    /// its queues when dropped, producer/base_producer.rs): of each partition's queue, a
    /// seeded prefix had been sent and is written; the rest, and whatever the gate held, is
    /// lost with the process. No report reaches anyone. Exactly-once: what it wrote is in its
    /// open transaction, which the next producer's `init_transactions` aborts — unless its
    /// commit was asked and flushed: its EndTxn may be on its way (a zombie's, after a
    /// network split), to reach the coordinator before or after the next producer fences it.
    pub fn producer_gone(&mut self, rng: &mut Rng) {
        let queues = std::mem::take(&mut self.queues);
        if let Some(coordinator) = self.eos.as_mut() {
            let committing = coordinator.open.as_ref().is_some_and(|t| {
                t.commit.is_some()
                    && t.flushed()
                    && t.doomed.is_none()
                    && coordinator.is_current(t.producer)
            });
            if committing {
                let txn = coordinator.open.take();
                coordinator.zombie =
                    txn.and_then(|mut t| t.commit.take().map(|(stored, _)| (stored, t.written)));
            }
        } else {
            for (key, queue) in queues {
                if self.broken.contains(&key) {
                    continue;
                }
                let written = rng.below(queue.len() as u64 + 1) as usize;
                for pending in queue.iter().take(written) {
                    if !self.landable(pending) {
                        break;
                    }
                    self.land(pending, key.1);
                }
            }
        }
        self.broken.clear();
        self.gate.clear();
        self.read.clear();
        self.errored.clear();
        self.transient = 0;
    }

    /// The topic's WRITE is granted again: its held records go at the publisher's next
    /// probe (`retry_gate`).
    pub fn grant(&mut self, topic: &str) {
        self.acl_denied.remove(topic);
    }

    /// What a session can move on: the slot, the events landed (in their topic or
    /// dead-lettered), the batch size the limits allow (a size refusal lowers it), the Kafka
    /// transactions committed, the events Kafka refused so far and of those the ones the
    /// producer's limits remember as refused for their own fault (exactly-once: a refused
    /// record aborts its transaction, and the next session, which dead-letters it, may meet
    /// the next refusal first). Equal at the end of two sessions: the second did nothing.
    pub fn progress_mark(&self) -> (Lsn, u64, usize, u32, usize, usize) {
        let landed = self
            .landed
            .iter()
            .map(|&(kafka, dead)| u64::from(kafka) + u64::from(dead))
            .sum();
        (
            self.slot,
            landed,
            self.batch_size(),
            self.commits.0,
            self.refused_events.len(),
            self.refused_events
                .values()
                .filter(|r| {
                    self.limits
                        .refused(&r.topic, RecordContent::of_record(r))
                        .is_some()
                })
                .count(),
        )
    }

    pub fn is_quiet(&self) -> bool {
        self.queues.values().all(VecDeque::is_empty) && self.gate.is_empty()
    }

    /// The end: every committed event is in its topic or dead-lettered for a fault of its
    /// own; per aggregate, the topic holds the events in commit order, re-sent only as a
    /// suffix after a restart; nothing is duplicated unless a session restarted.
    pub fn check_end(&mut self) {
        let restarts = self.incarnation + u32::from(self.postgres_restarted);
        for e in 0..self.workload.events.len() {
            // A failover's lost branch may be in Kafka, or not (`World::lost_in_kafka`).
            if self.server.is_lost(e) {
                continue;
            }
            let (topic, dead) = self.landed[e];
            let ev = &self.workload.events[e];
            let what = match ev.fault {
                None if topic == 0 => Some("is missing from its topic"),
                Some(_) if dead == 0 => Some("has a fault of its own but was not dead-lettered"),
                _ if topic + dead > 1 && restarts == 0 => {
                    Some("is duplicated though no session restarted")
                }
                _ => None,
            };
            if let Some(what) = what {
                let what = format!("event {e} ({}, `{}`) {what}", ev.id, ev.topic);
                self.violation(what);
            }
        }
        self.check_order();
    }

    fn check_order(&mut self) {
        // Per aggregate: its events in commit order (the workload's order), as indexes.
        let mut order: HashMap<(&str, &str), Vec<usize>> = HashMap::new();
        for (e, ev) in self.workload.events.iter().enumerate() {
            if ev.fault.is_none() && !self.server.is_lost(e) {
                order
                    .entry((ev.aggregate_type, ev.aggregate_id.as_str()))
                    .or_default()
                    .push(e);
            }
        }
        // Exactly-once: one run per aggregate, whatever the restarts.
        let runs_allowed = if self.eos.is_some() {
            1
        } else {
            self.incarnation + 1
        };
        let mut problems = Vec::new();
        for ((topic, partition), log) in &self.logs {
            if topic == DLQ {
                continue;
            }
            // (next new index, previous index, runs) per aggregate.
            let mut state: HashMap<(&str, &str), (usize, Option<usize>, u32)> = HashMap::new();
            for landed in log {
                let ev = &self.workload.events[landed.event];
                let key = (ev.aggregate_type, ev.aggregate_id.as_str());
                let Some(at) = order
                    .get(&key)
                    .and_then(|o| o.iter().position(|&e| e == landed.event))
                else {
                    continue;
                };
                let (next, prev, runs) = state.entry(key).or_insert((0, None, 0));
                if at > *next {
                    problems.push(format!(
                        "{topic}/{partition}: aggregate {}/{} has event {} before event {} (out of commit order)",
                        key.0, key.1, landed.event, order[&key][*next]
                    ));
                    break;
                }
                if prev.is_none_or(|p| at != p + 1) {
                    *runs += 1;
                }
                if *runs > runs_allowed {
                    problems.push(format!(
                        "{topic}/{partition}: aggregate {}/{} re-sent {} times in {} sessions (not a re-sent suffix)",
                        key.0, key.1, *runs - 1, self.incarnation + 1
                    ));
                    break;
                }
                *next = (*next).max(at + 1);
                *prev = Some(at);
            }
        }
        for p in problems {
            self.violation(p);
        }
    }
}
