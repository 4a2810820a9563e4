//! The wall clock, read in one place: Unix time in microseconds and milliseconds, for what is
//! compared with times from PostgreSQL and Kafka (a commit's age, a status update's send time,
//! a record timestamp's window). Waiting and deadlines use tokio's clock, not this one.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch by this machine's clock (0 if it reads before 1970).
pub fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Milliseconds since the Unix epoch by this machine's clock.
pub fn unix_ms() -> i64 {
    unix_us() / 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_and_microseconds_read_the_same_clock() {
        let (before, ms, after) = (unix_us(), unix_ms(), unix_us());
        assert!(before / 1000 <= ms && ms <= after / 1000);
        // 2020-01-01 in ms: a clock read as 0 or in seconds fails here.
        assert!(ms > 1_577_836_800_000);
    }
}
