//! A deterministic simulation of the relay's sessions (issue 42: at-least-once and exactly-once).
//!
//! The real [`Session`] — its loop, the ledger, the delivery contract, the dead-letter and
//! size-refusal decisions — runs against simulated peers on tokio's paused clock: a walsender
//! streaming a seeded workload from the slot's confirmed position (`peers.rs`), and a Kafka
//! whose partitions are answered batch by batch in a seeded order, with the failures the relay
//! tells apart (`world.rs`). Everything is chosen by one `u64` seed through [`Rng`]: the
//! workload, the settings, each step's action, and the faults — a crash (the session is
//! dropped where it waits; the next one sees only the slot and what Kafka holds), a dropped
//! connection, a delivery timeout, a topic refusing WRITE for a while, a topic whose metadata
//! read is refused, batches too large for a topic, records Kafka refuses for good.
//!
//! Between sessions the relay's supervisor decides (`relay/supervisor.rs`, the same
//! [`Supervisor`] the relay's `supervise` asks): a session that ends on an error it would
//! stop on is a violation; otherwise the next session starts after its back-off, on the
//! paused clock. A crash starts a new process, with a new supervisor.
//!
//! A topic Kafka refuses for a deployment reason goes through the publisher's gate
//! (`gate.rs`): at-least-once, its refused records wait there, and so do the records sent to
//! it while librdkafka marks it errored; a topic whose first metadata read is refused keeps
//! its records waiting in both modes. A seeded share of the at-least-once runs ends its chaos
//! with a hold phase ([`Hold`]): one topic refuses while nothing else fails, and every event
//! of the other topics must reach Kafka meanwhile. The refusal is Kafka's (WRITE, or the
//! metadata read) or, in half the serialized runs that can have it (`auto_register` off), the
//! registry's: the topic's subject is missing until the phase ends, or the registry keeps
//! every request for it unanswered until then.
//!
//! After every step and at the end the invariants are checked (`World::check_slot`,
//! `World::land`, `World::check_end`): the slot never passes an event neither in Kafka nor
//! dead-lettered; only an event with a fault of its own is dead-lettered, with its content;
//! every committed event ends in its topic or the dead-letter topic; per aggregate, commit
//! order, re-sent only as a suffix after a restart; no duplicate within one session; a
//! session ends on an error only after a fault that ends sessions; all WAL is confirmed at
//! the end (no stall, idle WAL confirmed); while one topic refuses, the others progress
//! (`World::check_others_progress`).
//!
//! A seeded share of the runs ([`EXACTLY_ONCE_SHARE`]) is in exactly-once: the producer is
//! transactional and Kafka has a transaction coordinator (`coordinator.rs`): records are
//! visible only once their transaction commits with its progress value; a failed record
//! dooms the transaction; the commit fails as librdkafka's do (retriable — and then perhaps
//! committed all the same —, abortable, fatal when fenced); a crash while a commit runs may
//! leave it committed; each session's producer fences the one before, and another relay may
//! fence the running one; each session starts from the last committed progress value, the
//! slot often behind it. The invariants there: a read_committed reader sees every committed
//! event exactly once (never twice, whatever the restarts), in commit order per aggregate;
//! every committed progress value is true (what it says is in Kafka is) and never goes back;
//! the slot never passes what Kafka committed.
//!
//! A seeded share of the exactly-once runs decodes from a standby promoted in place
//! (`timeline.rs`): at a seeded point between two transactions its timeline moves on, and the
//! stream goes on across the switch. Progress values are labelled by the real `Timelines` (a
//! simulated watch answering for IDENTIFY_SYSTEM), and each session's start value goes through
//! the real `reconcile`; the invariants above hold across the switch, and every committed
//! progress value's timeline is the one its LSN lies on. A share of the other exactly-once
//! runs fails over to a standby that had not received the primary's last transactions: the
//! new timeline forks at an earlier LSN and new transactions follow (with faults and DDL of
//! their own), the slot there where its last sync left it; every event of the surviving
//! history reaches a read_committed reader exactly once, and events of the lost branch may be
//! in Kafka (counted, not a violation).
//! A seeded share of the runs serializes its records (JSON Schema) through the real
//! serializer against a simulated Schema Registry (`registry.rs`): it answers, 404s missing
//! subjects (registered by the relay with `auto_register`, else by the operator, the events
//! waiting meanwhile), has outages, gets a second version of a subject; `latest` schemas are
//! refreshed after their TTL and used stale while that fails; one topic's schema refuses some
//! payloads, and in some runs rows name their schema id (`schema_id_header`), some an id the
//! registry never had. Its checks: every record of such a run is framed with an id the
//! registry gave (the one its row names, if any); a refused payload's dead letter says
//! `schema`. And in every run, the walsender hears from the session at least
//! every `wal_sender_timeout` (`World::heard_from_relay`): feedback waits on nothing.
//!
//! [`Defect`] lists defects the invariants must catch (`injected_defects_are_caught`).
//!
//! `cargo test --lib sim` runs `OUTBOX_SIM_SEEDS` seeds (5,000 by default); a failure prints
//! its seed, its schedule and the command that replays it: `OUTBOX_SIM_SEED=<seed> cargo
//! test --lib sim -- --nocapture`.

mod coordinator;
mod gate;
mod peers;
mod registry;
mod timeline;
mod world;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::fakes::{self, FakeCatalog, OUTBOX};
use super::{Session, Settings, Transactions};
use crate::config::OutboxConfig;
use crate::mapping::OutboxMapping;
use crate::relay::seams::Ends;
use crate::relay::supervisor::{Next, Supervisor};
use crate::relay::RelayError;
use crate::serve::metrics::Metrics;
use peers::{Connection, SimSink, SimSource, Walsender};
use registry::RegistryChaos;
use world::{Workload, World, DLQ};

/// SplitMix64: small, fast, and the same on every machine.
pub(super) struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// `0..n` (0 when `n` is 0).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// `lo..=hi`.
    pub(super) fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    pub(super) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Sessions in a row the healing phase (no faults injected) may end without anything to
/// show for them (`World::progress_mark`) before it counts as a restart loop.
const MAX_IDLE_SESSIONS: u32 = 2;
/// Steps the healing phase may take to confirm everything before it counts as a stall.
const HEAL_STEPS: usize = 4_000;

/// Percent of seeds run in exactly-once.
const EXACTLY_ONCE_SHARE: u64 = 40;

/// Percent of at-least-once seeds with a hold phase after the chaos (`Hold`).
const HOLD_SHARE: u64 = 30;
/// Steps of the hold phase: many more than the largest workload needs to be streamed and
/// answered.
const HOLD_STEPS: usize = 200;

/// After the chaos, one topic refuses records (WRITE at produce time, or its metadata read)
/// for `HOLD_STEPS` steps in which nothing else fails: at its end every event of the other
/// topics must be in Kafka (the issue's "no stall while a fault that concerns one topic
/// lasts"). At-least-once only: exactly-once's Kafka transaction spans every topic, so a
/// topic it cannot write holds the commit (`commit` in sink/publisher/mod.rs waits for the
/// records waiting for a partition count), by design.
struct Hold {
    topic: String,
    /// The metadata read is refused (else WRITE, when records are sent).
    metadata: bool,
    /// Serialization on, `auto_register` off: the refusal is the registry's instead (the
    /// topic's subject stays missing, or silent, until the hold phase ends; Kafka refuses
    /// nothing).
    registry: bool,
}

/// A defect injected on purpose, to prove the invariants catch it (`injected_defects_are_caught`):
/// each is a throwaway switch of the simulated peers standing for a mistake the relay (or its
/// producer) could make. Measured on the whole model — the supervisor's back-off, the restart-loop
/// check by progress marks, the registry (1,490 seeds serialized, 51 of them with a hold phase
/// the registry refuses; TTL refreshes, stale schemas, second versions, named schema ids), the
/// timeline changes (771 standbys promoted in place, 488 failovers, 80 of them to a slot whose
/// sync lagged) — over seeds 1..=5,000, of which 1,973 in exactly-once
/// (`OUTBOX_SIM_DEFECT_SEEDS=5000`; the earlier tables are in the git history):
///
/// | defect | first caught at seed | seeds of 5,000 that catch it | by |
/// |---|---|---|---|
/// | `StaleProgress` | 5 | 951 (all exactly-once) | an event seen twice |
/// | `ForgetDoom` | 8 | 1,527 (all exactly-once) | a progress value committed past a missing event |
/// | `CommitBeforeAcks` | 5 | 1,684 (all exactly-once) | a progress value committed past a missing event |
/// | `ReadBeforeFence` | 9 | 95 (all exactly-once) | an event seen twice |
/// | `AclRefusalToSession` | 1 | 1,721 (all at-least-once) | a session ended with no fault that ends sessions |
/// | `GateAppends` | 236 | 19 (all at-least-once) | an aggregate out of commit order |
/// | `GateHoldsAll` | 1 | 440 (all at-least-once) | another topic's event not in Kafka at the end of the hold phase |
/// | `MetadataRefusalFails` | 2 | 1,881 (735 exactly-once) | a session ended with no fault that ends sessions |
/// | `FixedTimeline` | 2 | 190 (all promoted in place) | a value labelled with a timeline its LSN does not lie on |
/// | `NoReconcile` | 50 | 105 (all failing over) | the slot confirmed past a new-timeline event not in Kafka |
/// | `RegistryErrorDeadLetters` | 4 | 1,159 of the 1,490 serialized (463 exactly-once) | a healthy event dead-lettered |
/// | `SendsUnserialized` | 4 | 1,228 of the 1,490 serialized (571 exactly-once) | a record without the wire framing |
/// | `ForgetsInvalid` | 5 | 1,398 (all exactly-once) | sessions in a row that move nothing on |
/// | `RefusalByKey` | 7 | 1,122 (456 exactly-once) | a healthy event dead-lettered |
/// | `DeadLetterBatchStops` | 91 | 11 (all at-least-once) | the relay stopping for good |
/// | `RegistryRequestsInLine` | 207 | 24 (all at-least-once) | another topic's event not in Kafka at the end of the hold phase |
///
/// `RefusalByKey` needs `key_column = "aggregateid"`, drawn in 30% of the seeds;
/// `DeadLetterBatchStops` a dead-letter topic whose limit takes any one dead letter but not
/// always two, drawn in 30% (each from a generator of its own, so the rows above keep their
/// first seeds; their counts were measured before these were drawn).
///
/// `RegistryRequestsInLine` was measured once a hold phase's subject could be silent (half the
/// registry's holds; `registry.rs`). The defect that model was made for is no switch of the
/// peers: the relay of before issue 50's one loop, which awaited a registry request in a
/// `select!` of its own (`Session::ask`) reading no frame, fails 17 of these 5,000 seeds, the
/// first at 460 (`a_subject_the_registry_keeps_silent_holds_only_its_topic`).
///
/// `FixedTimeline` with the label invariant switched off (a throwaway change): 20 seeds of
/// 5,000 catch it, first 24, by what it does downstream — the next session's `reconcile` cuts
/// the value back to the switch point, and the events after it are seen twice.
///
/// `GateTiesInReportOrder` (the relay's tie-break until the place in the opaque; found by the
/// simulation) fails 1 seed of 5,000: 1,805
/// (`the_gates_tie_break_in_report_order_can_swap_a_transactions_records`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Defect {
    None,
    /// Exactly-once: a session starts from the progress value before the last committed one
    /// (a reader that does not wait for the last stable offset, or reads an older replica).
    StaleProgress,
    /// Exactly-once: a record of the transaction failed and the transaction commits all the
    /// same (the publisher's `doomed` flag, or librdkafka's abortable error, lost).
    ForgetDoom,
    /// Exactly-once: the commit goes out before every record of the transaction was
    /// acknowledged (the publisher's wait for `in_flight_count` and librdkafka's flush skipped).
    CommitBeforeAcks,
    /// Exactly-once: the progress value is read before the producer is initialised (fencing
    /// the previous one), so a zombie's commit can land after the read.
    ReadBeforeFence,
    /// At-least-once: a record refused for authorization when sent (TOPIC_AUTHORIZATION_FAILED
    /// in its delivery report) goes to the session instead of the publisher's gate (as if
    /// `waits_at_gate` said no): the session restarts on a deployment fault of one topic.
    AclRefusalToSession,
    /// At-least-once: the gate appends refusals in the order they are reported, not by
    /// transaction: librdkafka reports a topic's queued records before the refused batch
    /// (`rd_kafka_topic_set_error`), which then go out first once the topic takes records.
    GateAppends,
    /// At-least-once: while any topic waits at the gate, records of every topic wait (a
    /// block taken for the whole producer).
    GateHoldsAll,
    /// A topic's refused first metadata read fails its waiting records (as `after_failure`,
    /// sink/publisher/partition_counts.rs, does for an error it does not know as the
    /// deployment's) instead of keeping them waiting: the session sees a failure of a topic
    /// Kafka refuses, and restarts (exactly-once: its transaction is doomed).
    MetadataRefusalFails,
    /// The relay's tie-break until the record's place in its transaction went into the
    /// opaque (`delivery::Opaque`): `HeldTopic::insert_refused`
    /// (sink/publisher/partition_counts_refused.rs) ordered refusals of one transaction in
    /// report order, so a transaction's records of one partition split between the refused
    /// batch and the queue failed before it swapped (see `gate::Ties::ReportOrder`). The
    /// default model's send order is what the relay does now.
    GateTiesInReportOrder,
    /// Exactly-once on a standby promoted in place (`timeline.rs`): progress values are
    /// labelled with the timeline the session started on (`Timelines::Fixed` on a standby, as
    /// before `Timelines::Watched`), so a value past the switch point carries the old timeline
    /// and the next session's `reconcile` cuts it back to the switch point.
    FixedTimeline,
    /// Exactly-once: a session starts from the stored progress value as it is (`sink::open`
    /// without `reconcile`): after a failover that lost the old timeline's tail
    /// (`timeline.rs`), a value of the lost branch skips the new timeline's transactions below
    /// it.
    NoReconcile,
    /// Serialization on: a registry failure is taken for the payload's fault — modelled by
    /// the registry answering, during an outage, with a schema no payload fits (as a relay
    /// would that judged the payload by what a failing registry gave it): healthy events
    /// are dead-lettered with reason `schema`.
    RegistryErrorDeadLetters,
    /// Serialization on: a restarted session is built without the serialization settings
    /// (`Settings::serializers` left at its default by whoever rebuilds the settings): its
    /// records go to Kafka as the row's JSON, unframed.
    SendsUnserialized,
    /// A record Kafka refused as invalid is not remembered (`TopicLimits::remember_invalid`,
    /// called by `DeliveryReporter::delivery`, sink/publisher/delivery.rs): exactly-once, it
    /// is sent again in the next session's transaction, which it aborts again — a restart
    /// loop (at-least-once dead-letters it on its first refusal).
    ForgetsInvalid,
    /// The refusal memory keyed by `(topic, key)`, as `sink/limits.rs` was until the one
    /// fault model: with `key_column = "aggregateid"` a record refused for its own fault
    /// (too large alone, invalid) makes every later event of its aggregate on that topic be
    /// refused at `send`, and dead-lettered for no fault of its own.
    RefusalByKey,
    /// A dead letters' batch refused as too large is taken for the dead letters' own fault,
    /// as `handle_failed_delivery` did (`was_dead_letter`: a permanent error): with a small
    /// dead-letter topic, a burst of dead letters stops the relay for good.
    DeadLetterBatchStops,
    /// Serialization on: registry requests go one at a time, each waiting for the one before
    /// (a client with one connection, or a lock held across the request): a request a silent
    /// registry keeps holds every topic whose schema needs a request meanwhile (a `latest`
    /// refresh too), not only its own (issue 50, point 7).
    RegistryRequestsInLine,
}

/// The throwaway defects `injected_defects_are_caught` injects, one at a time.
const INJECTED: &[Defect] = &[
    Defect::StaleProgress,
    Defect::ForgetDoom,
    Defect::CommitBeforeAcks,
    Defect::ReadBeforeFence,
    Defect::AclRefusalToSession,
    Defect::GateAppends,
    Defect::GateHoldsAll,
    Defect::MetadataRefusalFails,
    Defect::FixedTimeline,
    Defect::NoReconcile,
    Defect::RegistryErrorDeadLetters,
    Defect::SendsUnserialized,
    Defect::ForgetsInvalid,
    Defect::RefusalByKey,
    Defect::DeadLetterBatchStops,
    Defect::RegistryRequestsInLine,
];

/// Mixed into the seed for the draw of `key_column`.
const KEY_SALT: u64 = 0x4B45_595F_434F_4C55;
/// Mixed into the seed for the draw of the dead-letter topic's limit.
const DLQ_SALT: u64 = 0x444C_515F_4C49_4D54;

/// A relay process's supervisor, with the default back-off (`postgres.reconnect_backoff_*`).
fn new_supervisor() -> Supervisor {
    let pg = crate::config::PostgresConfig::default();
    Supervisor::new(
        Duration::from_millis(pg.reconnect_backoff_initial_ms),
        Duration::from_millis(pg.reconnect_backoff_max_ms),
    )
}

/// How a session ended.
enum Ending {
    Ended(Result<(), RelayError>),
    Crashed,
    /// The run cannot go on (a violation found, or a stall).
    Abandoned,
}

/// What one seed found.
pub(super) struct Outcome {
    pub violations: Vec<String>,
    pub schedule: Vec<String>,
    pub sessions: u32,
    pub exactly_once: bool,
    /// Exactly-once: Kafka transactions committed, and commits that failed.
    pub commits: (u32, u32),
    /// The server was a standby promoted in place (`timeline.rs`).
    pub switched: bool,
    /// The primary failed over losing its tail: events of the lost branch a read_committed
    /// reader sees in Kafka (`timeline.rs`).
    pub failed_over: bool,
    pub lost_in_kafka: u32,
    /// Sessions whose start value `reconcile` cut back to a switch point or fork.
    pub cut_back: u32,
    /// A failover's slot started behind the old slot and the fork: its sync had lagged.
    pub sync_lagged: bool,
    /// The hold phase's refusal was the registry's (a topic's subject missing).
    pub registry_hold: bool,
    /// Serialized: steps that ended with a stale `latest` schema in use (its refresh failing),
    /// and records that landed framed with a version older than their subject's latest.
    pub registry_stale: u32,
    pub older_landed: u32,
}

fn settings(rng: &mut Rng, exactly_once: bool) -> Settings {
    // Commit early and late, small and large, and sometimes inside a PostgreSQL transaction
    // (`split_after`): the three ways `exactly_once.rs` ends a Kafka transaction.
    let transactions = exactly_once.then(|| {
        let max_age = Duration::from_millis([5, 50, 500, 5_000][rng.below(4) as usize]);
        Transactions {
            max_age,
            min_age: max_age / [1, 5][rng.below(2) as usize],
            max_records: [1, 3, 20, 100_000][rng.below(4) as usize],
            split_after: Duration::from_millis([20, 300, 3_600_000][rng.below(3) as usize]),
        }
    });
    Settings {
        max_in_flight_messages: [2, 5, 50, 10_000][rng.below(4) as usize],
        status_interval: Duration::from_secs(10),
        confirm_delay: Duration::from_millis([0, 10, 100][rng.below(3) as usize]),
        publication: "sim_pub".into(),
        transactions,
        adaptive: rng.chance(50),
        ..fakes::settings(DLQ)
    }
}

/// What a run injects besides the seed's own choices.
#[derive(Debug, Clone, Copy)]
pub(super) struct Injected {
    pub defect: Defect,
}

impl Injected {
    const NOTHING: Injected = Injected {
        defect: Defect::None,
    };
}

/// Runs one seed on a paused clock of its own.
pub(super) fn run_seed(seed: u64) -> Outcome {
    run_seed_with(seed, Injected::NOTHING)
}

/// Runs one seed with `injected`.
pub(super) fn run_seed_with(seed: u64, injected: Injected) -> Outcome {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(simulate(seed, injected))
}

async fn simulate(seed: u64, injected: Injected) -> Outcome {
    let mut rng = Rng::new(seed);
    let exactly_once = rng.chance(EXACTLY_ONCE_SHARE);
    let mut workload = Workload::generate(&mut rng);
    let defect = injected.defect;
    // The timeline draws from a generator of its own: the other draws stay as they were.
    let mut timeline_rng = Rng::new(seed ^ 0x7469_6D65_6C69_6E65);
    let mut later_rng = Rng::new(seed ^ 0x4641_494C_4F56_4552);
    let server = timeline::Server::generate(
        &mut timeline_rng,
        &mut later_rng,
        &mut workload,
        exactly_once,
    );
    // `key_column = "aggregateid"` in 30% of the seeds, from a generator of its own.
    workload.key_by_aggregate = Rng::new(seed ^ KEY_SALT).chance(30);
    // A small dead-letter topic in 30% of the seeds: any one dead letter fits (its key and
    // payload: the id at most, and the event's payload, with room for a schema's framing and
    // encoding: any event may be dead-lettered, by the registry's refusals too), a batch of
    // two may not.
    let mut dlq_rng = Rng::new(seed ^ DLQ_SALT);
    let largest = (workload.events.iter())
        .map(|e| e.id.len() + e.payload.len() + 64)
        .max();
    workload.dlq_limit = largest
        .filter(|_| dlq_rng.chance(30))
        .map(|largest| largest + dlq_rng.below(largest as u64) as usize);
    let mut world = World::new(workload, &mut rng, exactly_once, defect);
    world.server = server;
    let world = Rc::new(RefCell::new(world));
    let settings = settings(&mut rng, exactly_once);
    let metrics = Metrics::default();
    let hold = (!exactly_once && rng.chance(HOLD_SHARE)).then(|| {
        let w = world.borrow();
        let topics = &w.workload.topics;
        Hold {
            topic: topics[rng.below(topics.len() as u64) as usize].name.clone(),
            metadata: rng.chance(30),
            registry: false,
        }
    });
    let mut driver = Driver {
        cap: settings.max_in_flight_messages,
        hold,
        world: world.clone(),
        steps: rng.range(10, 600) as usize,
        chaos: [0, 3, 10, 25][rng.below(4) as usize],
        step: 0,
        rng,
        registry: None,
    };
    {
        let mut w = world.borrow_mut();
        let summary = format!(
            "{}; {} transactions, {} events ({} with a fault of their own), {} rolled-back rows; topics {}; batch.size {}; in-flight cap {}; confirm_delay {:?}; {} chaos steps at {}%{}",
            match &settings.transactions {
                Some(t) => format!("exactly-once ({t:?})"),
                None => "at-least-once".into(),
            },
            w.workload.txns.len(),
            w.workload.events.len(),
            w.workload.events.iter().filter(|e| e.fault.is_some()).count(),
            w.workload.rolled_back,
            w.workload
                .topics
                .iter()
                .map(|t| format!("{} ({} partitions, max.message.bytes {})", t.name, t.partitions, t.limit))
                .collect::<Vec<_>>()
                .join(", "),
            w.batch_size_configured,
            settings.max_in_flight_messages,
            settings.confirm_delay,
            driver.steps,
            driver.chaos,
            match &driver.hold {
                Some(h) => format!(
                    "; then {HOLD_STEPS} steps in which only {} refuses ({})",
                    h.topic,
                    if h.metadata { "its metadata read" } else { "WRITE" }
                ),
                None => String::new(),
            },
        );
        w.note(summary);
        w.note_server();
        let held = driver.hold.as_ref().map(|h| h.topic.as_str());
        driver.registry = RegistryChaos::draw(seed, &mut w, defect, driver.steps, held);
        if let (Some(hold), Some(registry)) = (&mut driver.hold, &driver.registry) {
            hold.registry = registry.holds_a_subject();
        }
    }
    // With `schema_id_header` on (`registry.rs`) the mapping makes a column that header.
    let mut outbox = OutboxConfig::default();
    if world.borrow().workload.header_column {
        let (column, header) = (registry::SCHEMA_ID_COLUMN, registry::SCHEMA_ID_HEADER);
        outbox.header_columns.insert(column.into(), header.into());
    }
    if world.borrow().workload.key_by_aggregate {
        outbox.key_column = Some("aggregateid".into());
    }
    let mapping = OutboxMapping::new(&outbox).expect("the simulation's mapping");
    let (mut idle_sessions, mut last_mark) = (0, None);
    let mut supervisor = new_supervisor();
    let mut pause = Duration::ZERO;
    loop {
        // The supervisor's back-off before this session (none before the first, nor after a
        // crash).
        tokio::time::sleep(std::mem::take(&mut pause)).await;
        let (frames_tx, frames) = mpsc::unbounded_channel();
        let (reports, deliveries) = mpsc::unbounded_channel();
        let (walsender, sink, start) = {
            let w = world.borrow();
            let sink = SimSink {
                world: world.clone(),
                reports,
                producer: w.incarnation,
                batch_size: w.batch_size(),
                timelines: w.server.timelines(w.defect),
            };
            let walsender = Rc::new(RefCell::new(Walsender::start(&w, frames_tx)));
            (walsender, sink, w.slot)
        };
        let source = SimSource {
            frames,
            upstream: Connection {
                world: world.clone(),
                walsender: walsender.clone(),
            },
        };
        let ends = Ends {
            source,
            sink,
            deliveries,
            // Every relation is the outbox itself.
            catalog: FakeCatalog::new(&[(OUTBOX, "public", "outbox")]),
        };
        let progress = world.borrow_mut().init_transactions(&mut driver.rng);
        let session_settings = match &driver.registry {
            Some(registry) => registry.settings(&settings, world.borrow().incarnation, defect),
            None => settings.clone(),
        };
        let session = Session::new(session_settings, &mapping, &metrics, ends, start)
            .skipping_below(progress);
        let shutdown = CancellationToken::new();
        world
            .borrow_mut()
            .note(format!("session starts at {start}"));
        let started = tokio::time::Instant::now();
        // Biased: an unbiased `select!` polls its branches in a random order, and the run
        // would no longer be a function of the seed.
        let ending = tokio::select! {
            biased;
            result = session.run(&shutdown) => Ending::Ended(result),
            ending = driver.drive(&walsender, &shutdown) => ending,
        };
        let mut w = world.borrow_mut();
        // What the relay's supervisor decides (relay/supervisor.rs), and the pause it takes
        // before the next session; a crash or a stop starts a new process.
        let mut new_process = false;
        match ending {
            Ending::Ended(result) => {
                let failed = result.as_ref().err().map(ToString::to_string);
                if let Some(e) = &failed {
                    w.note(format!("session ended: {e}"));
                }
                match supervisor.after(result, started.elapsed(), shutdown.is_cancelled()) {
                    Next::Done => {
                        w.note("session drained and closed".into());
                        w.check_slot();
                        w.check_end();
                        break;
                    }
                    Next::Fail(e) => {
                        w.violation(format!("the relay would stop for good: {e}"));
                        break;
                    }
                    Next::Standby => {
                        w.violation("a standby: no other relay holds the slot here".into());
                        break;
                    }
                    Next::DoneUnconfirmed(_) => {
                        w.note("stopped on shutdown, unconfirmed: started again".into());
                        new_process = true;
                    }
                    Next::Retry { delay, .. } => {
                        w.note(format!("reconnecting in {delay:?}"));
                        pause = delay;
                    }
                }
                let e = failed.unwrap_or_default();
                if w.restart_causes == 0 {
                    w.violation(format!(
                        "a session ended with no fault injected that ends sessions: {e}"
                    ));
                }
            }
            Ending::Crashed => {
                w.note("crash".into());
                new_process = true;
            }
            Ending::Abandoned => break,
        }
        if new_process {
            // A new supervisor, and the serializers' cache is gone.
            supervisor = new_supervisor();
            if let Some(registry) = &mut driver.registry {
                registry.new_process();
            }
        }
        if !w.violations.is_empty() {
            break;
        }
        w.producer_gone(&mut driver.rng);
        w.incarnation += 1;
        w.restart_causes = 0;
        w.status_fails = false;
        if driver.step > driver.steps {
            // Each healing session must move something on: a restart loop otherwise.
            let mark = w.progress_mark();
            idle_sessions = if last_mark == Some(mark) {
                idle_sessions + 1
            } else {
                0
            };
            last_mark = Some(mark);
            if idle_sessions >= MAX_IDLE_SESSIONS {
                w.violation(format!(
                    "{idle_sessions} sessions in a row after the faults stopped moved nothing on (slot, events landed, batch size, Kafka commits, refusals met and remembered): the relay restarts in a loop"
                ));
                break;
            }
        }
    }
    let mut w = world.borrow_mut();
    Outcome {
        violations: std::mem::take(&mut w.violations),
        schedule: std::mem::take(&mut w.schedule),
        sessions: w.incarnation + 1,
        exactly_once: w.eos.is_some(),
        commits: w.commits,
        switched: w.server.switch().is_some(),
        failed_over: w.server.failover.is_some(),
        lost_in_kafka: w.lost_in_kafka(),
        cut_back: w.server.cut_back,
        sync_lagged: w.server.sync_lagged,
        registry_hold: driver.hold.as_ref().is_some_and(|h| h.registry),
        registry_stale: driver.registry.as_ref().map_or(0, |r| r.stale_steps),
        older_landed: driver.registry.as_ref().map_or(0, |r| r.older_landed()),
    }
}

/// Plays the peers' side, a step at a time: each step one action, then the session runs until
/// it waits again (the paused clock moves only then), then the invariants are checked.
struct Driver {
    world: Rc<RefCell<World>>,
    rng: Rng,
    /// Steps with faults; then the healing phase.
    steps: usize,
    /// Percent of steps that inject a fault.
    chaos: u64,
    step: usize,
    /// After the chaos, before healing: one topic refuses.
    hold: Option<Hold>,
    /// The session's in-flight cap (records).
    cap: usize,
    /// Serialization on: the registry's chaos (`registry.rs`).
    registry: Option<RegistryChaos>,
}

impl Driver {
    /// Drives one session; returns only when it crashes it or gives up (otherwise the session
    /// ends first).
    async fn drive(
        &mut self,
        walsender: &RefCell<Walsender>,
        shutdown: &CancellationToken,
    ) -> Ending {
        let held_until = self.steps + if self.hold.is_some() { HOLD_STEPS } else { 0 };
        let healing_until = held_until.max(self.step) + HEAL_STEPS;
        loop {
            self.step += 1;
            self.world.borrow_mut().step = self.step;
            if self
                .world
                .borrow_mut()
                .timeline_step(self.step > self.steps)
            {
                walsender.borrow().server_gone();
            }
            self.registry_step();
            if self.step <= self.steps {
                if let Some(ending) = self.chaos_step(walsender) {
                    return ending;
                }
            } else if self.step <= held_until {
                self.hold_step(walsender);
            } else if self.step > healing_until {
                let mut w = self.world.borrow_mut();
                let what = format!(
                    "stalled: after {HEAL_STEPS} healing steps the slot is at {} of {}, {} records wait in the producer",
                    w.slot,
                    w.workload.wal_end,
                    w.queues.values().map(|q| q.len()).sum::<usize>()
                );
                w.violation(what);
                return Ending::Abandoned;
            } else {
                self.heal_step(walsender, shutdown);
            }
            let pause = std::mem::take(&mut self.world.borrow_mut().pending_pause).max(1);
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let mut w = self.world.borrow_mut();
            w.check_slot();
            if let Some(hold) = self.hold.as_ref().filter(|_| self.step == held_until) {
                // Events waiting for the registry wait in the session (counted in flight),
                // those Kafka refuses in the producer: either way against the cap.
                let held = match hold.registry {
                    true => w.not_landed(&hold.topic),
                    false => w.holding(&hold.topic),
                };
                w.check_others_progress(&hold.topic, held, self.cap, HOLD_STEPS);
            }
            if !w.violations.is_empty() {
                return Ending::Abandoned;
            }
        }
    }

    /// The hold phase: only `Hold::topic` refuses; the walsender streams, every partition
    /// is answered, the publisher retries.
    fn hold_step(&mut self, walsender: &RefCell<Walsender>) {
        let Some(hold) = &self.hold else {
            return;
        };
        let mut w = self.world.borrow_mut();
        if self.step == self.steps + 1 {
            w.note(format!(
                "from now on only {} refuses, for {HOLD_STEPS} steps",
                hold.topic
            ));
        }
        w.acl_denied.clear();
        w.metadata_refused.clear();
        if !hold.registry {
            let refused = if hold.metadata {
                &mut w.metadata_refused
            } else {
                &mut w.acl_denied
            };
            refused.insert(hold.topic.clone());
        }
        w.transient = 0;
        walsender.borrow_mut().send(&w, 16);
        for key in w.partitions_waiting() {
            w.answer(&key, &mut self.rng);
        }
        w.retry_gate();
        // At least 100 ms (more on its first step: `Driver::registry_step`).
        w.pending_pause = w.pending_pause.max(100);
    }

    /// One seeded action, or a fault.
    fn chaos_step(&mut self, walsender: &RefCell<Walsender>) -> Option<Ending> {
        let rng = &mut self.rng;
        let mut w = self.world.borrow_mut();
        let exactly_once = w.eos.is_some();
        if rng.chance(self.chaos) {
            match rng.below(if exactly_once { 10 } else { 9 }) {
                0 => {
                    return Some(Ending::Crashed);
                }
                8 => {
                    // A topic's metadata read is refused (DESCRIBE revoked, or the topic
                    // deleted with creation off) — which only a producer that has not read
                    // it yet meets —, or allowed again.
                    if rng.chance(50) {
                        let topics = &w.workload.topics;
                        let topic = topics[rng.below(topics.len() as u64) as usize].name.clone();
                        w.note(format!("{topic}'s metadata read is refused"));
                        w.metadata_refused.insert(topic);
                    } else if let Some(topic) = w.metadata_refused.pop_first() {
                        w.note(format!("{topic}'s metadata read is allowed again"));
                    }
                }
                9 => {
                    // Another relay on the slot's transactional id initialised its producer
                    // (a standby, or this one after a network split): this session's
                    // producer is the zombie, fenced (KIP-98).
                    if let Some(coordinator) = &mut w.eos {
                        coordinator.fenced = true;
                    }
                    w.restart_causes += 1;
                    w.note("another producer initialises the transactional id: fenced".into());
                }
                6 => {
                    // PostgreSQL restarts: the slot falls back to the position its last
                    // checkpoint persisted (`CheckPointReplicationSlots`, slot.c), and the
                    // connection is gone.
                    w.restart_causes += 1;
                    w.postgres_restarts();
                    walsender.borrow().drop_connection();
                }
                7 => {
                    // A checkpoint persists the slot's position.
                    w.slot_persisted = w.slot;
                }
                1 => {
                    w.restart_causes += 1;
                    w.note("the replication connection drops".into());
                    walsender.borrow().drop_connection();
                    // Or only the next status update notices it.
                    w.status_fails = rng.chance(50);
                }
                2 => {
                    w.transient += 1;
                }
                3 | 4 => {
                    let topics = &w.workload.topics;
                    let topic = topics[rng.below(topics.len() as u64) as usize].name.clone();
                    w.note(format!("{topic} refuses WRITE"));
                    w.acl_denied.insert(topic);
                }
                _ => {
                    if let Some(topic) = w.acl_denied.iter().next().cloned() {
                        w.note(format!("{topic} takes records again"));
                        w.grant(&topic);
                    }
                }
            }
            return None;
        }
        match rng.below(100) {
            0..=34 => {
                let n = rng.range(1, 6) as usize;
                walsender.borrow_mut().send(&w, n);
            }
            35..=74 if w.commit_ready() && rng.chance(40) => {
                let fault = rng.chance(self.chaos);
                w.answer_commit(rng, fault);
            }
            35..=74 => {
                let waiting = w.partitions_waiting();
                if !waiting.is_empty() {
                    let key = waiting[rng.below(waiting.len() as u64) as usize].clone();
                    w.answer(&key, rng);
                }
            }
            75..=84 => walsender.borrow().keepalive(rng.chance(30)),
            // The paused clock jumps: status timers, confirm delays, and (a second or
            // more) the publisher's retries of the topics it holds.
            _ => {
                w.pending_pause = rng.range(1, 3_000);
                if w.pending_pause >= 1_000 {
                    w.retry_gate();
                }
            }
        }
        None
    }

    /// After the chaos: every topic takes records, the whole workload is sent and answered,
    /// and once all WAL is confirmed the session is shut down.
    fn heal_step(&mut self, walsender: &RefCell<Walsender>, shutdown: &CancellationToken) {
        let mut w = self.world.borrow_mut();
        for topic in std::mem::take(&mut w.acl_denied) {
            w.grant(&topic);
        }
        w.metadata_refused.clear();
        w.retry_gate();
        walsender.borrow_mut().send(&w, 16);
        for key in w.partitions_waiting() {
            w.answer(&key, &mut self.rng);
        }
        if w.commit_ready() {
            w.answer_commit(&mut self.rng, false);
        }
        let done = walsender.borrow().is_done(&w) && w.is_quiet();
        if done && w.slot >= w.workload.wal_end {
            if !shutdown.is_cancelled() {
                w.note("everything confirmed: shutdown".into());
                shutdown.cancel();
            }
        } else if done {
            // Idle: the status timer asks for a reply, whose keepalive carries the WAL end.
            w.pending_pause = 1_000;
        }
    }
}

fn describe(seed: u64, outcome: &Outcome) -> String {
    format!(
        "simulation seed {seed} failed ({} sessions):\n  {}\nschedule:\n  {}\nreplay: OUTBOX_SIM_SEED={seed} cargo test --lib sim -- --nocapture",
        outcome.sessions,
        outcome.violations.join("\n  "),
        outcome.schedule.join("\n  "),
    )
}

/// `OUTBOX_SIM_DEFECT=<name>`: the replay runs with that defect (`Defect`'s variant name).
fn env_defect() -> Defect {
    let Ok(name) = std::env::var("OUTBOX_SIM_DEFECT") else {
        return Defect::None;
    };
    INJECTED
        .iter()
        .copied()
        .chain([Defect::GateTiesInReportOrder])
        .find(|d| format!("{d:?}") == name)
        .unwrap_or_else(|| panic!("OUTBOX_SIM_DEFECT={name}: no such defect"))
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    Some(
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name}={value}: expected an unsigned integer")),
    )
}

/// `OUTBOX_SIM_SEED=<seed>` replays one seed (printing its schedule; `OUTBOX_SIM_DEFECT=<name>`
/// with a defect switched on); otherwise
/// `OUTBOX_SIM_SEEDS` seeds (5,000 by default) from `OUTBOX_SIM_FIRST` (1 by default) run, and
/// the first failure is reported in full.
/// Failed seeds after which a run stops.
const MAX_FAILED: usize = 20;

#[test]
fn every_seed_keeps_the_invariants() {
    let injected = Injected {
        defect: env_defect(),
    };
    if let Some(seed) = env_u64("OUTBOX_SIM_SEED") {
        let outcome = run_seed_with(seed, injected);
        println!(
            "seed {seed}: {} sessions\n  {}",
            outcome.sessions,
            outcome.schedule.join("\n  ")
        );
        assert!(
            outcome.violations.is_empty(),
            "{}",
            describe(seed, &outcome)
        );
        return;
    }
    let count = env_u64("OUTBOX_SIM_SEEDS").unwrap_or(5_000);
    let first = env_u64("OUTBOX_SIM_FIRST").unwrap_or(1);
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    let mut sessions = 0u64;
    let (mut eos_seeds, mut committed, mut commits_failed) = (0u64, 0u64, 0u64);
    let (mut switched, mut failed_over, mut lost_in_kafka) = (0u64, 0u64, 0u64);
    let (mut cut_back, mut sync_lagged, mut registry_holds) = (0u64, 0u64, 0u64);
    let (mut stale_seeds, mut older_landed) = (0u64, 0u64);
    // `OUTBOX_SIM_TRACE=1`: each seed is named before it runs, so that a seed that never
    // ends (a session that spins without waiting) is found in a long run.
    let trace = std::env::var_os("OUTBOX_SIM_TRACE").is_some();
    for seed in first..first + count {
        if trace {
            eprintln!("seed {seed}");
        }
        let outcome = run_seed_with(seed, injected);
        sessions += u64::from(outcome.sessions);
        eos_seeds += u64::from(outcome.exactly_once);
        committed += u64::from(outcome.commits.0);
        commits_failed += u64::from(outcome.commits.1);
        switched += u64::from(outcome.switched);
        failed_over += u64::from(outcome.failed_over);
        lost_in_kafka += u64::from(outcome.lost_in_kafka);
        cut_back += u64::from(outcome.cut_back);
        sync_lagged += u64::from(outcome.sync_lagged);
        stale_seeds += u64::from(outcome.registry_stale > 0);
        older_landed += u64::from(outcome.older_landed);
        registry_holds += u64::from(outcome.registry_hold);
        if !outcome.violations.is_empty() {
            if failed.is_empty() {
                eprintln!("{}", describe(seed, &outcome));
            }
            failed.push(seed);
            // A broken relay fails seed after seed, each only at the end of its healing
            // phase: twenty are proof enough, and waiting for the rest would look like a hang.
            if failed.len() == MAX_FAILED {
                eprintln!("stopped after {MAX_FAILED} failed seeds");
                break;
            }
        }
    }
    println!(
        "{count} seeds ({sessions} sessions; {eos_seeds} in exactly-once, {switched} of them on a standby promoted in place, {failed_over} failing over ({sync_lagged} to a slot whose sync lagged) with {lost_in_kafka} events of lost branches in Kafka, {cut_back} start values cut back by reconcile; {committed} Kafka transactions committed, {commits_failed} commits failed; {registry_holds} hold phases refused by the registry, {stale_seeds} seeds serving a stale schema while the registry failed, {older_landed} records framed with an older version) in {:.1} s; {} failed",
        started.elapsed().as_secs_f64(),
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {count} seeds failed{} (first {:?}); replay one with OUTBOX_SIM_SEED=<seed> cargo test --lib sim -- --nocapture",
        failed.len(),
        if failed.len() == MAX_FAILED { ", then the run stopped" } else { "" },
        &failed[..failed.len().min(20)]
    );
}

/// Found by a long run (seed 156,909 of 200,000): exactly-once, a topic whose limit the relay
/// learns by halving (ten sessions) and 22 events with a fault of their own (each aborting a
/// Kafka transaction, dead-lettered by the next session) needed more than the 30 healing
/// sessions the simulation then allowed, and passed for a restart loop though every session
/// moved something on. A loop is now sessions in a row that move nothing on
/// (`World::progress_mark`; `ForgetsInvalid` is one). Replay:
/// `OUTBOX_SIM_SEED=156909 cargo test --lib sim -- --nocapture`.
#[test]
fn many_sessions_that_each_move_on_are_no_restart_loop() {
    let outcome = run_seed(156_909);
    assert!(
        outcome.violations.is_empty(),
        "{}",
        describe(156_909, &outcome)
    );
    assert!(outcome.sessions > 30, "{} sessions", outcome.sessions);
}

/// Found by the long mode (seeds 162,567 and 171,358 of 100,000, once `latest` schemas were
/// refreshed after their TTL, so that records wait for the registry mid-stream): at-least-once,
/// a batch of healthy records of `outbox.event.shipment/0` refused as too large (a limit not
/// yet known) while the session waited in a request to a silent registry (10 s) for another
/// event; its delivery report waited with it, so the session did not end and its producer
/// wrote the partition's later records (events 78 and 89) past the refused ones (38 among
/// them), re-sent only by the next session: event 78 of aggregate shipment/a2 in Kafka before
/// event 38. A delivery report is now handled during a registry request (once in
/// `Session::ask`, now by the loop's own arm: the request is another arm; session test `a_delivery_report_that_ends_the_session_is_not_held_by_a_registry_request`).
/// Replay: `OUTBOX_SIM_SEED=162567 cargo test --lib sim -- --nocapture`.
#[test]
fn a_refused_batch_ends_the_session_during_a_registry_request() {
    for seed in [162_567, 171_358] {
        let outcome = run_seed(seed);
        assert!(
            outcome.violations.is_empty(),
            "{}",
            describe(seed, &outcome)
        );
    }
}

/// Seed 207: at-least-once, serialized, `auto_register` off, a hold phase in which the
/// registry lacks one topic's subject (`outbox.event.order-value`). The session read nothing
/// past that topic's first event then, so the other topics stalled with it (the simulation had
/// left registry faults out of the hold phase for that reason); only the topic waits now
/// (`serialize.rs`, `Parked`). With the old wait, 20 of the first 3,271 seeds fail, the first
/// at 207. Replay: `OUTBOX_SIM_SEED=207 cargo test --lib sim -- --nocapture`.
#[test]
fn a_subject_missing_for_one_topic_does_not_stall_the_others() {
    let outcome = run_seed(207);
    assert!(
        outcome.registry_hold,
        "seed 207 no longer draws a registry hold"
    );
    assert!(outcome.violations.is_empty(), "{}", describe(207, &outcome));
}

/// A seed is a replay: the same schedule, step for step, every time (nothing of the run
/// depends on the machine's speed, a hash seed, or the order an unbiased `select!` picks).
#[test]
fn a_seed_replays_the_same_schedule() {
    for seed in 1..=300 {
        let first = run_seed(seed);
        let again = run_seed(seed);
        assert!(first.violations.is_empty(), "{}", describe(seed, &first));
        assert_eq!(first.schedule, again.schedule, "seed {seed}");
        assert_eq!(first.sessions, again.sessions, "seed {seed}");
        assert!(first.schedule.len() > 2, "seed {seed} did nothing");
    }
}

/// The injected-defect table: each defect, switched on alone, must make some seed fail within
/// `SEEDS_TO_CATCH`; the seed that first catches it and what it found are printed (`--nocapture`).
/// `OUTBOX_SIM_DEFECT_SEEDS=<n>`: also counts how many of the first `n` seeds catch each, and
/// how many of their exactly-once ones.
#[test]
fn injected_defects_are_caught() {
    const SEEDS_TO_CATCH: u64 = 2_000;
    for &defect in INJECTED {
        let caught = (1..=SEEDS_TO_CATCH).find_map(|seed| {
            let outcome = run_seed_with(seed, Injected { defect });
            (!outcome.violations.is_empty()).then(|| (seed, outcome.violations[0].clone()))
        });
        let Some((seed, found)) = caught else {
            panic!("{defect:?} went unnoticed in {SEEDS_TO_CATCH} seeds");
        };
        println!("{defect:?}: caught at seed {seed}: {found}");
        if let Some(n) = env_u64("OUTBOX_SIM_DEFECT_SEEDS") {
            let (mut eos, mut caught, mut caught_eos) = (0, 0, 0);
            for seed in 1..=n {
                let outcome = run_seed_with(seed, Injected { defect });
                let found = u32::from(!outcome.violations.is_empty());
                eos += u32::from(outcome.exactly_once);
                caught += found;
                caught_eos += found * u32::from(outcome.exactly_once);
            }
            println!(
                "{defect:?}: caught by {caught} of the first {n} seeds ({caught_eos} of their {eos} exactly-once ones)"
            );
        }
    }
}

/// Found by the simulation (seed 5): a record the broker refuses as invalid (INVALID_RECORD)
/// in exactly-once ended the session with `RelayError::Delivery`, which `is_transient` calls
/// permanent, so the relay stopped for good — though the publisher remembers the record
/// (`remember_invalid`) so that the next session refuses it at `send` and dead-letters it
/// inside the transaction. The session now ends with the transient `InvalidRecordRefused`
/// (`handle_delivery`, the `failure_dooms` branch). Replay: `OUTBOX_SIM_SEED=5 cargo test
/// --lib sim -- --nocapture`.
#[test]
fn an_invalid_record_in_exactly_once_is_dead_lettered_after_a_restart() {
    let outcome = run_seed_with(5, Injected::NOTHING);
    assert!(outcome.violations.is_empty(), "{}", describe(5, &outcome));
}

/// Found by the simulation (seed 11, a standby promoted in place): a session that started on
/// the promoted server, from a slot behind the switch point, labelled a progress value below
/// it with the server's own timeline (`Timelines::Fixed` held the timeline alone), which is
/// not the one its LSN lies on; a server restored later from the older timeline to before the
/// value would refuse it and stop the relay, instead of cutting it back to its fork. `Fixed`
/// now carries the server's history and labels by `timeline_of` (unit test
/// `a_primary_labels_a_value_before_its_switch_point_with_the_timeline_it_lies_on`). Replay:
/// `OUTBOX_SIM_SEED=11 cargo test --lib sim -- --nocapture`.
#[test]
fn a_promoted_server_labels_a_value_before_its_switch_point_with_the_older_timeline() {
    let outcome = run_seed_with(11, Injected::NOTHING);
    assert!(outcome.switched, "seed 11 no longer switches timelines");
    assert!(outcome.violations.is_empty(), "{}", describe(11, &outcome));
}

/// The timeline models reach what they are for (`timeline.rs`): among the first 500 seeds
/// some decode across a promotion in place, some fail over with events of the lost branch in
/// Kafka, some from a slot whose sync lagged behind the old one, and some sessions start
/// from a value `reconcile` cut back — all keeping the invariants.
#[test]
fn timeline_changes_reach_a_cut_back_start_value_and_keep_the_invariants() {
    let (mut switched, mut lost_in_kafka, mut cut_back, mut sync_lagged) = (0, 0, 0, 0);
    for seed in 1..=500 {
        let outcome = run_seed(seed);
        assert!(
            outcome.violations.is_empty(),
            "{}",
            describe(seed, &outcome)
        );
        switched += u32::from(outcome.switched);
        lost_in_kafka += outcome.lost_in_kafka;
        cut_back += outcome.cut_back;
        sync_lagged += u32::from(outcome.sync_lagged);
    }
    assert!(
        switched > 0 && lost_in_kafka > 0 && cut_back > 0 && sync_lagged > 0,
        "{switched} seeds switched in place, {lost_in_kafka} lost events in Kafka, {cut_back} start values cut back, {sync_lagged} failovers from a slot whose sync lagged"
    );
}

/// Found by the simulation (seed 1,805, with the relay's own tie-break switched on: the
/// default model breaks ties in send order): the publisher's gate orders the records a topic
/// refused for authorization by their transaction's sequence number, and records of one
/// transaction in the order their reports came (`HeldTopic::insert_refused`,
/// sink/publisher/partition_counts_refused.rs). librdkafka reports the topic's queued records
/// before the refused batch (`rd_kafka_topic_set_error` → `rd_kafka_topic_assign_uas`), so a
/// transaction whose records of one partition were split between the batch and the queue has
/// them swapped once the topic takes records again: an aggregate's later event lands before
/// its earlier one. Fixed: the opaque carries the record's place in its transaction
/// (`delivery::Opaque`), and the gate orders by transaction, then place (unit test
/// `a_transactions_records_reported_queue_first_wait_in_send_order`); this seed stays to show
/// the old rule caught. Replay:
/// `OUTBOX_SIM_DEFECT=GateTiesInReportOrder OUTBOX_SIM_SEED=1805 cargo test --lib sim -- --nocapture`.
#[test]
fn the_gates_tie_break_in_report_order_can_swap_a_transactions_records() {
    let outcome = run_seed_with(
        1_805,
        Injected {
            defect: Defect::GateTiesInReportOrder,
        },
    );
    assert!(
        outcome
            .violations
            .iter()
            .any(|v| v.contains("out of commit order")),
        "seed 1805 no longer shows the swap: {:?}",
        outcome.violations
    );
}
