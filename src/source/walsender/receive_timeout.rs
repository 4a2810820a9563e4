//! The replication receive deadline: how long the stream may stay silent before the path
//! counts as dead, derived from the server's `wal_sender_timeout` (or configured), and the
//! least explicit deadline that server allows.

use std::time::Duration;

use crate::config::FALLBACK_RECEIVE_TIMEOUT_MS;

/// The replication receive deadline: `configured_ms` when set; else three quarters of the
/// server's `wal_sender_timeout` (which sends a keepalive at least every half of it while
/// idle), or [`FALLBACK_RECEIVE_TIMEOUT_MS`] when that is 0 (disabled). Never under two
/// status intervals: the relay's own status updates ask for a reply, so a live server answers
/// within one.
pub fn receive_timeout(
    configured_ms: u64,
    wal_sender_timeout: Duration,
    status_interval: Duration,
) -> Duration {
    if configured_ms != 0 {
        return Duration::from_millis(configured_ms);
    }
    let derived = if wal_sender_timeout.is_zero() {
        Duration::from_millis(FALLBACK_RECEIVE_TIMEOUT_MS)
    } else {
        wal_sender_timeout * 3 / 4
    };
    derived.max(status_interval * 2)
}

/// How much longer than half of `wal_sender_timeout` an explicit receive deadline must be: the
/// server's keepalive timer is checked between decoded changes, and the frame still has to
/// travel.
pub const RECEIVE_TIMEOUT_MARGIN: Duration = Duration::from_secs(1);

/// An explicit `postgres.receive_timeout_ms` shorter than the server's longest silence.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("postgres.receive_timeout_ms = {configured_ms} is below the minimum of {minimum_ms} ms for this server (wal_sender_timeout = {wal_sender_timeout_ms} ms): set it to 0 (derived) or at least {minimum_ms}; see docs/src/operations/runbooks.md#receive-deadline-refused")]
pub struct ReceiveTimeoutTooLow {
    pub configured_ms: u64,
    pub wal_sender_timeout_ms: u64,
    pub minimum_ms: u64,
}

/// The least explicit receive deadline that `wal_sender_timeout` allows: half of it plus
/// [`RECEIVE_TIMEOUT_MARGIN`]. `None` when the server's timeout is 0 (disabled: the server
/// then promises no keepalives at all, and no deadline is safe from a long decode).
///
/// Why half: while the walsender decodes a transaction that touches no published table it
/// sends nothing of it, and reads the relay's status updates (and answers them) only when half
/// of `wal_sender_timeout` has passed since the last one it read. Frames then come that far
/// apart, however often the relay asks.
pub fn minimum_receive_timeout(wal_sender_timeout: Duration) -> Option<Duration> {
    if wal_sender_timeout.is_zero() {
        return None;
    }
    Some(wal_sender_timeout / 2 + RECEIVE_TIMEOUT_MARGIN)
}

/// Refuses an explicit `configured_ms` (0 is derived, always fine) below
/// [`minimum_receive_timeout`].
pub fn check_receive_timeout(
    configured_ms: u64,
    wal_sender_timeout: Duration,
) -> Result<(), ReceiveTimeoutTooLow> {
    let Some(minimum) = minimum_receive_timeout(wal_sender_timeout) else {
        return Ok(());
    };
    let minimum_ms = minimum.as_millis() as u64;
    if configured_ms == 0 || configured_ms >= minimum_ms {
        return Ok(());
    }
    Err(ReceiveTimeoutTooLow {
        configured_ms,
        wal_sender_timeout_ms: wal_sender_timeout.as_millis() as u64,
        minimum_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::walsender::ReplicationError;

    #[test]
    fn receive_deadline_derives_from_wal_sender_timeout() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // Default server: 60 s; the server keepalives every 30 s, we ask every second.
        assert_eq!(receive_timeout(0, s(60), s(1)), s(45));
        assert_eq!(receive_timeout(0, s(4), s(1)), s(3));
        // Never under two status intervals.
        assert_eq!(receive_timeout(0, ms(1_000), ms(333)), ms(750));
        assert_eq!(receive_timeout(0, ms(400), ms(300)), ms(600));
        // wal_sender_timeout = 0 disables the server's timeout: our fallback.
        assert_eq!(
            receive_timeout(0, Duration::ZERO, s(1)),
            ms(FALLBACK_RECEIVE_TIMEOUT_MS)
        );
        // Configured: as is.
        assert_eq!(receive_timeout(5_000, s(60), s(1)), s(5));
    }

    #[test]
    fn an_explicit_receive_deadline_must_outlast_half_the_wal_sender_timeout() {
        let s = Duration::from_secs;
        // 60 s on the server: frames may be 30 s apart while it decodes a large transaction.
        let err = check_receive_timeout(20_000, s(60)).unwrap_err();
        assert_eq!(
            err,
            ReceiveTimeoutTooLow {
                configured_ms: 20_000,
                wal_sender_timeout_ms: 60_000,
                minimum_ms: 31_000,
            }
        );
        let message = err.to_string();
        for part in [
            "postgres.receive_timeout_ms = 20000",
            "31000 ms",
            "wal_sender_timeout = 60000 ms",
        ] {
            assert!(message.contains(part), "{message}");
        }
        // Exactly half is still too short: the keepalive would race the deadline.
        assert!(check_receive_timeout(30_000, s(60)).is_err());
        assert!(check_receive_timeout(31_000, s(60)).is_ok());
        assert!(check_receive_timeout(45_000, s(60)).is_ok());
        // 0 is derived (three quarters), and a disabled server timeout promises nothing.
        assert!(check_receive_timeout(0, s(60)).is_ok());
        assert!(check_receive_timeout(1_000, Duration::ZERO).is_ok());
        assert!(!ReplicationError::from(err).is_transient());
    }
}
