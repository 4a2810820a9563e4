//! What the relay does when a session ends: stop (for good, or because shutdown came), wait
//! as a standby while another process holds the slot, or reconnect after a back-off. The
//! decisions alone, taken by one [`Supervisor`] per process: `supervise` (relay/mod.rs) acts
//! on them against the real servers, and the simulation (`session/sim`) takes the same ones
//! after each simulated session.

use std::time::Duration;

use super::RelayError;
use crate::source::walsender::ReplicationError;

/// A session that ran this long was healthy: the next pause starts again from the shortest.
const HEALTHY_RUN: Duration = Duration::from_secs(30);

/// What to do after a session ended.
#[derive(Debug)]
pub(crate) enum Next {
    /// Stop: the session drained and closed on shutdown.
    Done,
    /// Stop: shutdown came and the session ended on a transient error meanwhile; its
    /// unconfirmed events are sent again after the restart.
    DoneUnconfirmed(RelayError),
    /// Stop: an error that needs an operator.
    Fail(RelayError),
    /// Another process streams the slot: wait as a standby, then try again.
    Standby,
    /// Reconnect and resume from the slot's confirmed position after `delay`.
    Retry { error: RelayError, delay: Duration },
}

/// The supervisor's memory across sessions: the back-off.
#[derive(Debug)]
pub(crate) struct Supervisor {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Supervisor {
    /// Pauses between sessions start at `initial` and double up to `max`
    /// (`postgres.reconnect_backoff_initial_ms`, `reconnect_backoff_max_ms`).
    pub(crate) fn new(initial: Duration, max: Duration) -> Supervisor {
        Supervisor {
            initial,
            max,
            next: initial,
        }
    }

    /// What follows a session that ended with `result` after running `ran_for`, with
    /// shutdown asked for or not.
    pub(crate) fn after(
        &mut self,
        result: Result<(), RelayError>,
        ran_for: Duration,
        shutting_down: bool,
    ) -> Next {
        let error = match result {
            Ok(()) => return Next::Done,
            Err(error) => error,
        };
        if shutting_down && error.is_transient() {
            return Next::DoneUnconfirmed(error);
        }
        if let RelayError::Replication(ReplicationError::SlotActive { .. }) = error {
            return Next::Standby;
        }
        if !error.is_transient() {
            return Next::Fail(error);
        }
        if ran_for > HEALTHY_RUN {
            self.next = self.initial;
        }
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        Next::Retry { error, delay }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::ledger::LedgerError;
    use crate::source::walsender::ServerError;

    fn transient() -> RelayError {
        RelayError::SchemaRegistry("the registry does not answer".into())
    }

    fn supervisor() -> Supervisor {
        Supervisor::new(Duration::from_millis(500), Duration::from_secs(30))
    }

    fn delay(next: Next) -> Duration {
        match next {
            Next::Retry { delay, .. } => delay,
            other => panic!("expected a retry, got {other:?}"),
        }
    }

    #[test]
    fn pauses_double_up_to_the_maximum_and_start_again_after_a_healthy_session() {
        let mut s = supervisor();
        let short = Duration::from_secs(1);
        let delays: Vec<_> = (0..8)
            .map(|_| delay(s.after(Err(transient()), short, false)).as_millis())
            .collect();
        assert_eq!(
            delays,
            [500, 1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000]
        );
        let healthy = HEALTHY_RUN + Duration::from_secs(1);
        assert_eq!(
            delay(s.after(Err(transient()), healthy, false)),
            Duration::from_millis(500)
        );
        assert_eq!(
            delay(s.after(Err(transient()), short, false)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn a_transient_error_during_shutdown_stops_and_a_permanent_one_fails() {
        let mut s = supervisor();
        let ran = Duration::from_secs(1);
        assert!(matches!(s.after(Ok(()), ran, true), Next::Done));
        assert!(matches!(
            s.after(Err(transient()), ran, true),
            Next::DoneUnconfirmed(_)
        ));
        let permanent = RelayError::Ledger(LedgerError::NoOpenTransaction("COMMIT"));
        assert!(!permanent.is_transient());
        assert!(matches!(s.after(Err(permanent), ran, false), Next::Fail(_)));
    }

    #[test]
    fn a_slot_held_elsewhere_makes_a_standby() {
        let mut s = supervisor();
        let held = RelayError::Replication(ReplicationError::SlotActive {
            slot: "outbox_relay".into(),
            server: Box::new(ServerError {
                code: "55006".into(),
                message: "replication slot \"outbox_relay\" is active for PID 42".into(),
                detail: None,
                hint: None,
            }),
        });
        assert!(matches!(
            s.after(Err(held), Duration::ZERO, false),
            Next::Standby
        ));
    }
}
