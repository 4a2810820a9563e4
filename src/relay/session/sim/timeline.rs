//! A timeline switch inside the exactly-once simulation: a standby promoted in place while the
//! relay decodes from it (issue 42, point 1).
//!
//! What is modelled, and where it comes from:
//! - The relay decodes from a standby on timeline `N` (the slot lives there; logical decoding
//!   on a standby, PostgreSQL 16+). At a seeded point between two transactions of the workload
//!   (`Switch::at`: the end of the WAL the old primary sent) the standby is promoted: its
//!   timeline becomes `N + 1` and its history `[…, (N, at)]` (`writeTimeLineHistory`,
//!   access/transam/timeline.c, written at the end of recovery by `StartupXLOG`, xlog.c).
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

use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use super::world::{Workload, World};
use super::{Defect, Rng};
use crate::lsn::Lsn;
use crate::sink::progress::{
    reconcile, BoxFuture, Progress, ServerHistory, Stored, Timelines, WatchTimelines,
};

/// Percent of exactly-once seeds whose server is a standby promoted in place.
const SWITCH_SHARE: u64 = 40;
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

/// The server the relay decodes from: a primary, or (exactly-once, [`SWITCH_SHARE`]) a standby
/// promoted in place during the run.
pub(super) struct Server {
    /// Shared with the watch of each session on it (a `WatchTimelines` is `Send + Sync`).
    history: Arc<Mutex<ServerHistory>>,
    switch: Option<Switch>,
    promoted: bool,
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
            promoted: false,
            wal_end,
        }
    }

    /// The seed's server (`rng`: the timeline's own, so the other draws stay as they were).
    pub fn generate(rng: &mut Rng, workload: &Workload, exactly_once: bool) -> Server {
        let mut server = Server::primary(workload.wal_end);
        let txns = &workload.txns;
        if !exactly_once || txns.len() < 2 || !rng.chance(SWITCH_SHARE) {
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

    /// The timeline `lsn` lies on in the server's whole history (the switch included, whether
    /// it happened yet or not).
    pub fn lies_on(&self, lsn: Lsn) -> u32 {
        let mut whole = self.now();
        if let Some(switch) = self.switch.as_ref().filter(|_| !self.promoted) {
            whole
                .history
                .get_or_insert_with(Vec::new)
                .push((whole.timeline, switch.at));
            whole.timeline += 1;
        }
        whole.timeline_of(lsn)
    }

    /// The invariant: a stored value's timeline is the one its LSN lies on (`None`: it is).
    pub fn check_label(&self, stored: &Stored) -> Option<String> {
        let lies_on = self.lies_on(stored.at.lsn);
        (stored.timeline != Some(lies_on)).then(|| {
            format!(
                "the progress value {} was committed labelled with timeline {:?}, but its LSN lies on timeline {lies_on}",
                stored.at, stored.timeline
            )
        })
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

    /// A step of the driver begins: the standby may be promoted (`Server::step`).
    pub fn timeline_step(&mut self, chaos_over: bool) {
        if let Some(what) = self.server.step(self.step, chaos_over) {
            self.note(what);
        }
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
        match self.server.open(read) {
            Ok(progress) => {
                if let (Some(read), Some(held)) = (read, progress) {
                    if held != read.at {
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
