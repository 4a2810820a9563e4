//! The dead-letter breaker: counts dead letters in a sliding minute and says when one more
//! would exceed `dead_letter.max_per_minute`. One bad deploy of a producer must not send a
//! million events to the dead-letter topic before anyone looks. Pure (the clock is tokio's,
//! so tests pause it).

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The window the limit applies to.
pub const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug)]
pub struct Breaker {
    max: usize,
    /// When each dead letter of the last [`WINDOW`] was admitted, oldest first.
    admitted: VecDeque<Instant>,
}

impl Breaker {
    /// `None` when `max_per_minute` is 0 (off).
    pub fn new(max_per_minute: u32) -> Option<Breaker> {
        (max_per_minute > 0).then(|| Breaker {
            max: max_per_minute as usize,
            admitted: VecDeque::new(),
        })
    }

    /// A dead letter is about to be sent at `now`: true when it is within the limit (and is
    /// counted), false when it would be one more than the limit in the last minute (the
    /// breaker trips; it is not sent).
    pub fn admit(&mut self, now: Instant) -> bool {
        while self
            .admitted
            .front()
            .is_some_and(|&at| now.duration_since(at) >= WINDOW)
        {
            self.admitted.pop_front();
        }
        if self.admitted.len() >= self.max {
            return false;
        }
        self.admitted.push_back(now);
        true
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_off() {
        assert!(Breaker::new(0).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_one_past_the_limit_within_a_minute_trips_it() {
        let mut b = Breaker::new(3).unwrap();
        for _ in 0..3 {
            assert!(b.admit(Instant::now()));
            tokio::time::advance(Duration::from_secs(10)).await;
        }
        assert!(!b.admit(Instant::now()), "the 4th within 30 s");
        // The first leaves the window 60 s after it was admitted.
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(
            b.admit(Instant::now()),
            "a minute after the first, room for one"
        );
        assert!(!b.admit(Instant::now()));
    }
}
