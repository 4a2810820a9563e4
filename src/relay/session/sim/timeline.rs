//! Timeline changes inside the exactly-once simulation (issue 42: "a timeline switch"): a
//! standby promoted in place while the relay decodes from it, and a failover to a standby
//! that had not received the primary's last transactions.
//!
//! What is modelled, and where it comes from:
//! - The relay decodes from a standby on timeline `N` (the slot lives there; logical decoding
//!   on a standby, PostgreSQL 16+). At a seeded point between two transactions of the workload
//!   (`Switch::at`: the end of the WAL the old primary sent) the standby is promoted: its
//!   timeline becomes `N + 1` and its history `[…, (N, at)]` (`StartupXLOG`, xlog.c, calls
//!   `writeTimeLineHistory`, access/transam/timeline.c, with the end of the WAL it replayed).
//!   Transactions after the switch point are written on the new timeline, after the promotion.
//! - The walsender goes on decoding across the switch (walsender.c, `logical_read_xlog_page`:
//!   "to also cover the promotion or timeline change cases"): before the promotion it cannot
//!   decode past the switch point (the standby has replayed no more, [`Server::may_decode`]),
//!   after it the stream goes on unbroken.
//! - The relay reads the server's timeline and history when a session starts
//!   (`server_history`, relay/timelines.rs) and labels each committed progress value with a
//!   [`Timelines`] (`timelines`, relay/timelines.rs): on a standby `Watched`, which asks the
//!   server again at each commit (`StandbyTimelines::current`: IDENTIFY_SYSTEM, then
//!   TIMELINE_HISTORY when the timeline moved) — here [`SimWatch`], answering from the
//!   simulated server; on a primary `Fixed`. The label goes into the value
//!   (`progress_value`, sink/publisher/progress.rs, called by `commit` in
//!   sink/publisher/mod.rs, after every record of the commit was decoded).
//! - A session's start value goes through the real [`reconcile`] with the server's history and
//!   WAL insert position (`pg_current_wal_insert_lsn()`, none on a standby), as `sink::open`
//!   (sink/mod.rs) does: a value labelled with a timeline the server left before its LSN is cut
//!   back to the switch point.
//!
//! A failover that loses the old timeline's tail ([`Failover`]): the relay decodes
//! from a primary whose last transactions never reached its standby; the primary is gone and
//! the standby promoted, its new timeline forking at an earlier LSN (`Failover::fork`, the end
//! of the WAL it received), and new transactions take LSNs after the fork — some the lost ones
//! had. The relay's connection breaks; the next session connects to the new primary, whose
//! slot (a failover slot synced from the old primary) is at most at the fork: the slot sync
//! worker does not move a synced slot past the WAL the standby has flushed
//! (`synchronize_one_slot`, replication/logical/slotsync.c, PostgreSQL 17). Nor is it
//! newer than the last sync: the worker copies the primary's `confirmed_flush` each round
//! (`synchronize_slots`, then sleeps 200 ms to 30 s, `wait_for_slot_activity`), so in half the
//! failover seeds the new slot is one of the old slot's last few positions
//! (`Failover::synced_behind`) and the stream starts further back: below a progress value
//! the relay committed, whose events it must skip, not send again. A progress
//! value of the lost branch is cut back to the fork by `reconcile`. Invariants: every event of
//! the surviving history reaches a read_committed reader exactly once, in order per aggregate;
//! events of the lost branch may be in Kafka (counted, `Outcome::lost_in_kafka`, not a
//! violation); every value's timeline is the one its LSN lies on, on its branch.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::world::{draw_fault, Event, Txn, Workload, World};
use super::{Defect, Rng};
use crate::lsn::Lsn;
use crate::sink::progress::{
    reconcile, BoxFuture, Progress, ServerHistory, Stored, Timelines, WatchTimelines,
};

/// Percent of exactly-once seeds whose server is a standby promoted in place.
const SWITCH_SHARE: u64 = 40;
/// Percent of the other exactly-once seeds whose primary fails over to a standby that had not
/// received its last transactions.
const FAILOVER_SHARE: u64 = 40;
/// Where the timeline before the seeded start timeline was left (below the slot's creation,
/// `SLOT_START`): a server that starts on timeline 2 has been promoted once before.
const EARLIER_SWITCH: Lsn = Lsn(0x800);

/// The promotion of a standby in place.
pub(super) struct Switch {
    /// The last LSN of the old timeline: every transaction committing at or below it was
    /// written there, every later one on the new timeline.
    pub at: Lsn,
    /// The driver's step at which the standby is promoted, at the latest (the chaos over).
    promote_at: usize,
}

/// A failover to a standby that had not received the primary's last transactions.
pub(super) struct Failover {
    /// Where the new timeline forks from the old one: the end of the WAL the standby received.
    pub fork: Lsn,
    /// The driver's step at which the primary fails, at the latest (the chaos over).
    at_step: usize,
    /// The workload's transactions that survive (the later ones are the lost branch).
    survivors: usize,
    /// The new timeline's transactions after the fork (moved into the workload at the
    /// failover), and the WAL end after them.
    branch: Vec<Txn>,
    branch_end: Lsn,
    /// Commit and end LSNs of the lost branch's transactions, and of the new branch's.
    lost_lsns: BTreeSet<Lsn>,
    branch_lsns: BTreeSet<Lsn>,
    /// The lost branch: its transactions (commit LSN, events), and its events.
    lost: Vec<(Lsn, Vec<usize>)>,
    lost_events: BTreeSet<usize>,
    /// How many of the old slot's positions the slot sync's last copy is behind its latest
    /// (0: it copied the latest).
    synced_behind: usize,
}

/// The server the relay decodes from: a primary, or (exactly-once, [`SWITCH_SHARE`]) a standby
/// promoted in place during the run, or (exactly-once, [`FAILOVER_SHARE`] of the others) a
/// primary that fails over, losing its tail.
pub(super) struct Server {
    /// Shared with the watch of each session on it (a `WatchTimelines` is `Send + Sync`).
    history: Arc<Mutex<ServerHistory>>,
    switch: Option<Switch>,
    pub failover: Option<Failover>,
    /// The promotion (in place, or the failover's) happened.
    promoted: bool,
    /// Sessions whose start value `reconcile` cut back.
    pub cut_back: u32,
    /// A failover's slot started behind both the old slot and the fork (its sync lagged).
    pub sync_lagged: bool,
    /// The end of the workload's WAL: the WAL insert position once the server is a primary.
    wal_end: Lsn,
}

impl Server {
    /// A primary on timeline 1 that stays there: no randomness drawn, so seeds without a
    /// switch keep their schedules.
    pub fn primary(wal_end: Lsn) -> Server {
        Server {
            history: Arc::new(Mutex::new(ServerHistory {
                timeline: 1,
                history: Some(Vec::new()),
            })),
            switch: None,
            failover: None,
            promoted: false,
            cut_back: 0,
            sync_lagged: false,
            wal_end,
        }
    }

    /// The seed's server (`rng`: the timeline's own, so the other draws stay as they were;
    /// `later`: a failover's draws added since — its branch's faults and DDL, its slot sync's
    /// lag — so that they left the rest of each schedule as it was). A failover seed appends
    /// the new branch's events to the workload.
    pub fn generate(
        rng: &mut Rng,
        later: &mut Rng,
        workload: &mut Workload,
        exactly_once: bool,
    ) -> Server {
        let mut server = Server::primary(workload.wal_end);
        let txns = &workload.txns;
        if !exactly_once || txns.len() < 2 {
            return server;
        }
        if !rng.chance(SWITCH_SHARE) {
            if rng.chance(FAILOVER_SHARE) {
                server.failover = Some(Failover::generate(rng, later, workload));
            }
            return server;
        }
        // Between transaction `k` and `k + 1`: where the walsender's sent position stands once
        // it decoded `k` (its commit and the unpublished WAL after it).
        let k = rng.below(txns.len() as u64 - 1) as usize;
        let timeline = rng.range(1, 2) as u32;
        let earlier = if timeline == 2 {
            vec![(1, EARLIER_SWITCH)]
        } else {
            Vec::new()
        };
        server.history = Arc::new(Mutex::new(ServerHistory {
            timeline,
            history: Some(earlier),
        }));
        server.switch = Some(Switch {
            at: txns[k].after,
            promote_at: rng.range(1, 600) as usize,
        });
        server
    }

    pub fn switch(&self) -> Option<&Switch> {
        self.switch.as_ref()
    }

    /// The server's timeline and history now (what IDENTIFY_SYSTEM and TIMELINE_HISTORY say).
    pub fn now(&self) -> ServerHistory {
        lock(&self.history).clone()
    }

    /// Still a standby that will be promoted (`pg_is_in_recovery()`).
    fn in_recovery(&self) -> bool {
        self.switch.is_some() && !self.promoted
    }

    /// Whether the walsender can decode the transaction committing at `final_lsn` yet: a
    /// standby decodes only what it has replayed, and the old primary wrote nothing past the
    /// switch point.
    pub fn may_decode(&self, final_lsn: Lsn) -> bool {
        match &self.switch {
            Some(switch) if !self.promoted => final_lsn <= switch.at,
            _ => true,
        }
    }

    /// A step of the driver: the standby is promoted at its seeded step, or once the chaos is
    /// over (so that the healing phase can stream everything). Returns what to note.
    pub fn step(&mut self, step: usize, chaos_over: bool) -> Option<String> {
        let switch = self.switch.as_ref()?;
        if self.promoted || (step < switch.promote_at && !chaos_over) {
            return None;
        }
        self.promoted = true;
        let mut history = lock(&self.history);
        let old = history.timeline;
        history.timeline = old + 1;
        history
            .history
            .get_or_insert_with(Vec::new)
            .push((old, switch.at));
        drop(history);
        Some(format!(
            "the standby is promoted in place: timeline {old} -> {} at {}; the stream goes on",
            old + 1,
            switch.at
        ))
    }

    /// How the session starting now labels its progress values (`timelines`,
    /// relay/timelines.rs): watched on a standby, fixed on a primary. `FixedTimeline`: fixed on
    /// a standby too.
    pub fn timelines(&self, defect: Defect) -> Timelines {
        let now = self.now();
        if self.in_recovery() && defect != Defect::FixedTimeline {
            Timelines::Watched(Arc::new(SimWatch {
                history: self.history.clone(),
            }))
        } else {
            Timelines::Fixed(now)
        }
    }

    /// What of the stored value holds on this server, by the real [`reconcile`] with its
    /// history and WAL insert position (none on a standby), as `sink::open` (sink/mod.rs) does.
    pub fn open(&self, stored: Option<Stored>) -> Result<Option<Progress>, String> {
        let wal = (!self.in_recovery()).then_some(self.wal_end);
        stored
            .map(|stored| reconcile(stored, &self.now(), wal))
            .transpose()
    }

    /// The timelines `lsn` lies on in the server's whole history (the change included,
    /// whether it happened yet or not): one, or past a failover's fork the old timeline for an
    /// LSN of the lost branch and the new one for an LSN of the new branch.
    pub fn lies_on(&self, lsn: Lsn) -> Vec<u32> {
        let mut whole = self.now();
        let change = match (&self.switch, &self.failover) {
            (Some(switch), _) => Some(switch.at),
            (_, Some(failover)) => Some(failover.fork),
            _ => None,
        };
        if let Some(at) = change.filter(|_| !self.promoted) {
            whole
                .history
                .get_or_insert_with(Vec::new)
                .push((whole.timeline, at));
            whole.timeline += 1;
        }
        let Some(failover) = self.failover.as_ref().filter(|f| lsn > f.fork) else {
            return vec![whole.timeline_of(lsn)];
        };
        let mut timelines = Vec::new();
        if failover.lost_lsns.contains(&lsn) {
            timelines.push(whole.timeline - 1);
        }
        if failover.branch_lsns.contains(&lsn) {
            timelines.push(whole.timeline);
        }
        timelines
    }

    /// The invariant: a stored value's timeline is the one its LSN lies on (`None`: it is).
    pub fn check_label(&self, stored: &Stored) -> Option<String> {
        let lies_on = self.lies_on(stored.at.lsn);
        let labelled = stored.timeline.is_some_and(|t| lies_on.contains(&t));
        (!labelled).then(|| {
            format!(
                "the progress value {} was committed labelled with timeline {:?}, but its LSN lies on timeline {lies_on:?}",
                stored.at, stored.timeline
            )
        })
    }
}

impl Server {
    /// An event of a failover's lost branch.
    pub fn is_lost(&self, event: usize) -> bool {
        self.failover
            .as_ref()
            .is_some_and(|f| f.lost_events.contains(&event))
    }

    /// The old timeline's number once a failover happened.
    fn left_behind(&self) -> Option<(&Failover, u32)> {
        let failover = self.failover.as_ref().filter(|_| self.promoted)?;
        Some((failover, self.now().timeline - 1))
    }

    /// Written on the lost branch of a failover that happened: past the fork, on the old
    /// timeline.
    fn on_lost_branch(&self, stored: &Stored) -> Option<&Failover> {
        let (failover, old) = self.left_behind()?;
        (stored.at.lsn > failover.fork && stored.timeline == Some(old)).then_some(failover)
    }

    /// The transactions (commit LSN, events) of the history `stored` was written on when it is
    /// the lost branch of a failover: the surviving ones, then the lost ones. `None`: the
    /// workload's history.
    pub fn lost_history_of(
        &self,
        stored: &Stored,
        workload: &Workload,
    ) -> Option<Vec<(Lsn, Vec<usize>)>> {
        let failover = self.on_lost_branch(stored)?;
        let survivors = workload.txns[..failover.survivors]
            .iter()
            .map(|t| (t.final_lsn, t.events.clone()));
        Some(survivors.chain(failover.lost.iter().cloned()).collect())
    }

    /// Where a committed value stands on the server's history now: one of a failover's lost
    /// branch only up to the fork (what "never goes back" compares against).
    pub fn holds(&self, stored: &Stored) -> Progress {
        match self.on_lost_branch(stored) {
            Some(failover) => Progress::whole(failover.fork),
            None => stored.at,
        }
    }
}

impl Failover {
    /// The fork after a seeded transaction `k` (the standby received it and the unpublished
    /// WAL after it; every later one is lost), and a new branch of transactions after it,
    /// whose events are appended to the workload. In half the seeds the slot sync lags 1 to 4
    /// of the old slot's positions behind its latest.
    fn generate(rng: &mut Rng, later: &mut Rng, workload: &mut Workload) -> Failover {
        let txns = &workload.txns;
        let k = rng.below(txns.len() as u64 - 1) as usize;
        let fork = txns[k].after;
        let mut extra_columns = txns[k].extra_columns;
        let lost_txns = &txns[k + 1..];
        let lost_lsns = lost_txns
            .iter()
            .flat_map(|t| [t.final_lsn, t.end_lsn])
            .collect();
        let lost: Vec<(Lsn, Vec<usize>)> = lost_txns
            .iter()
            .map(|t| (t.final_lsn, t.events.clone()))
            .collect();
        let lost_events = lost.iter().flat_map(|(_, e)| e.iter().copied()).collect();
        // New transactions after the fork, laid out as `Workload::generate` does: 1..=3 rows
        // of the workload's aggregates and topics, with faults of their own drawn as there,
        // and a DDL before 5% of them (the lost branch's DDL is lost with it: the columns
        // count from the fork's).
        let mut lsn = fork.0 + 0x10 + rng.below(0x100);
        let mut branch = Vec::new();
        let mut branch_lsns = BTreeSet::new();
        for _ in 0..rng.range(1, 10) {
            let rows = rng.range(1, 3);
            let final_lsn = Lsn(lsn + 0x100 * rows + 0x10);
            let end_lsn = Lsn(final_lsn.0 + 0x30);
            let ddl = later.chance(5);
            extra_columns += usize::from(ddl);
            let mut events = Vec::new();
            for _ in 0..rows {
                let n = workload.events.len();
                let like = &workload.events[rng.below(n as u64) as usize];
                let topic = workload.topic(&like.topic).expect("an event's topic");
                let (fault, pad) = draw_fault(later, topic);
                let event = Event {
                    id: format!("00000000-0000-4000-8000-{n:012}"),
                    aggregate_type: like.aggregate_type,
                    aggregate_id: format!("a{}", rng.below(4)),
                    payload: format!(r#"{{"e":{n},"p":"branch{}"}}"#, "x".repeat(pad)),
                    topic: like.topic.clone(),
                    fault,
                    header: None,
                };
                workload.events.push(event);
                events.push(n);
            }
            lsn = end_lsn.0 + 0x10 + rng.below(0x200);
            branch_lsns.extend([final_lsn, end_lsn]);
            branch.push(Txn {
                final_lsn,
                end_lsn,
                after: Lsn(lsn),
                events,
                ddl,
                extra_columns,
            });
        }
        Failover {
            fork,
            at_step: rng.range(1, 600) as usize,
            survivors: k + 1,
            branch,
            branch_end: Lsn(lsn + rng.below(0x1000)),
            lost_lsns,
            branch_lsns,
            lost,
            lost_events,
            synced_behind: if later.chance(50) {
                later.range(1, 4) as usize
            } else {
                0
            },
        }
    }
}

/// A session's progress value labelled as the publisher's `commit` (sink/publisher/mod.rs)
/// labels it: `Timelines::of` its LSN, read when the commit is asked.
pub(super) fn label(timelines: &Timelines, at: Progress) -> Stored {
    // The simulated watch answers at once (its future never waits), so one poll ends it.
    let mut of = pin!(timelines.of(at.lsn));
    let timeline = match of.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Ok(timeline)) => timeline,
        Poll::Ready(Err(e)) => panic!("the simulated watch failed: {e}"),
        Poll::Pending => panic!("the simulated watch waited"),
    };
    Stored {
        at,
        timeline: Some(timeline),
    }
}

/// The standby's watch (`StandbyTimelines`, relay/timelines.rs), answering from the simulated
/// server instead of IDENTIFY_SYSTEM and TIMELINE_HISTORY on a connection of its own.
struct SimWatch {
    history: Arc<Mutex<ServerHistory>>,
}

impl WatchTimelines for SimWatch {
    fn current(&self) -> BoxFuture<'_, Result<ServerHistory, String>> {
        let now = lock(&self.history).clone();
        Box::pin(async move { Ok(now) })
    }
}

fn lock(history: &Mutex<ServerHistory>) -> std::sync::MutexGuard<'_, ServerHistory> {
    // Nothing panics while holding it: a poisoned lock still holds a whole history.
    history
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The world's side: the promotion as the driver steps, the label invariant, the start value.
impl World {
    /// Notes the seed's server in the schedule.
    pub fn note_server(&mut self) {
        if let Some(f) = &self.server.failover {
            let what = format!(
                "the server is a primary on timeline {}, to fail over (by step {}) to a standby that has WAL up to {} only: {} transactions after it lost, {} new ones",
                self.server.now().timeline,
                f.at_step,
                f.fork,
                self.workload.txns.len() - f.survivors,
                f.branch.len()
            );
            self.note(what);
        }
        if let Some(switch) = self.server.switch() {
            let what = format!(
                "the server is a standby on timeline {}, to be promoted in place at {} (by step {})",
                self.server.now().timeline,
                switch.at,
                switch.promote_at
            );
            self.note(what);
        }
    }

    /// A step of the driver begins: the standby may be promoted (`Server::step`), or the
    /// primary fail over (`true`: the replication connection is gone).
    pub fn timeline_step(&mut self, chaos_over: bool) -> bool {
        if let Some(what) = self.server.step(self.step, chaos_over) {
            self.note(what);
        }
        let step = self.step;
        let due = !self.server.promoted
            && self
                .server
                .failover
                .as_ref()
                .is_some_and(|f| step >= f.at_step || chaos_over);
        if due {
            self.fail_over();
        }
        due
    }

    /// The primary is gone; the standby, which has WAL up to the fork only, is promoted: the
    /// workload's history becomes the surviving transactions and the new branch; the slot on
    /// the new primary is where the last slot sync left it, at most at the fork (see the
    /// module doc); the
    /// replication connection breaks (`Walsender::server_gone`: a status update the old
    /// session still sends goes nowhere).
    fn fail_over(&mut self) {
        let Some(failover) = self.server.failover.as_mut() else {
            return;
        };
        let fork = failover.fork;
        let synced_behind = failover.synced_behind;
        let branch = std::mem::take(&mut failover.branch);
        let (survivors, branch_end) = (failover.survivors, failover.branch_end);
        self.server.promoted = true;
        self.server.wal_end = branch_end;
        let old = {
            let mut history = lock(&self.server.history);
            let old = history.timeline;
            history.timeline = old + 1;
            history
                .history
                .get_or_insert_with(Vec::new)
                .push((old, fork));
            old
        };
        let lost = self.workload.txns.len() - survivors;
        let new = branch.len();
        self.workload.txns.truncate(survivors);
        self.workload.txns.extend(branch);
        self.workload.wal_end = branch_end;
        let slot = self.slot;
        let synced = self.confirmed.iter().rev().nth(synced_behind);
        let at = synced.map_or(slot, |&synced| synced.min(slot)).min(fork);
        self.server.sync_lagged = at < slot.min(fork);
        self.slot = at;
        self.slot_persisted = self.slot_persisted.min(at);
        self.verified = self
            .workload
            .txns
            .iter()
            .position(|t| t.final_lsn >= at)
            .unwrap_or(self.workload.txns.len());
        self.restart_causes += 1;
        self.note(format!(
            "the primary fails over: {lost} transactions past {fork} are lost; the standby is promoted, timeline {old} -> {}, {new} new transactions; the slot there is at {at} (was {slot}; its last sync {synced_behind} positions behind); the connection breaks",
            old + 1,
        ));
    }

    /// Events of a failover's lost branch that a read_committed reader sees in Kafka.
    pub fn lost_in_kafka(&self) -> u32 {
        let Some(failover) = &self.server.failover else {
            return 0;
        };
        let seen = failover
            .lost_events
            .iter()
            .filter(|&&e| self.landed[e].0 > 0);
        seen.count() as u32
    }

    /// A progress value commits: its timeline must be the one its LSN lies on.
    pub fn check_label(&mut self, stored: &Stored) {
        if let Some(what) = self.server.check_label(stored) {
            self.violation(what);
        }
    }

    /// A session opens the sink with the value read (`sink::open`, sink/mod.rs): what of it
    /// holds on this server. A value `reconcile` refuses stops the relay
    /// (`PublishError::ProgressDiverged`): a violation, since every value here is true.
    pub fn open_progress(&mut self, read: Option<Stored>) -> Option<Progress> {
        if self.defect == Defect::NoReconcile {
            return read.map(|stored| stored.at);
        }
        match self.server.open(read) {
            Ok(progress) => {
                if let (Some(read), Some(held)) = (read, progress) {
                    if held != read.at {
                        self.server.cut_back += 1;
                        self.note(format!(
                            "reconcile: the progress value {} (timeline {:?}) holds up to {held} only on timeline {}",
                            read.at,
                            read.timeline,
                            self.server.now().timeline
                        ));
                    }
                }
                progress
            }
            Err(problem) => {
                self.violation(format!("the relay would stop: {problem}"));
                None
            }
        }
    }
}
