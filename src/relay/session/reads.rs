//! How many buffered frames the loop takes in a row without a turn of its `select!`, as plain
//! state (no I/O).
//!
//! Why: a 1-row transaction is three walsender messages. The futures of a `select!` turn
//! (the shutdown token, the delivery channel, the timers) cost more than decoding a small
//! frame, so frames that a read already brought in are handled straight away while nothing
//! ranked above them is due.

/// At most this many buffered frames are handled in a row before the loop goes through its
/// `select!` again, so that the status timer and a Kafka commit's outcome (not checked
/// between buffered frames) wait at most that long.
const BUFFERED_RUN: u32 = 64;

#[derive(Debug)]
pub(super) struct Reads {
    /// Buffered frames taken since the last turn through `select!`.
    run: u32,
}

impl Reads {
    /// The first turn goes through `select!` (its status timer fires at once).
    pub fn new() -> Reads {
        Reads { run: BUFFERED_RUN }
    }

    /// The loop turns through `select!`.
    pub fn turn(&mut self) {
        self.run = 0;
    }

    /// Whether another buffered frame may be taken before the next `select!` turn.
    pub fn may_take_buffered(&self) -> bool {
        self.run < BUFFERED_RUN
    }

    /// A buffered frame was taken.
    pub fn took_buffered(&mut self) {
        self.run += 1;
    }

    /// Nothing whole is buffered: the next frame needs a read, through `select!`.
    pub fn buffer_empty(&mut self) {
        self.run = BUFFERED_RUN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffered_frames_run_at_most_the_limit_between_turns() {
        let mut reads = Reads::new();
        assert!(
            !reads.may_take_buffered(),
            "the first turn goes through select!"
        );
        reads.turn();
        for _ in 0..BUFFERED_RUN {
            assert!(reads.may_take_buffered());
            reads.took_buffered();
        }
        assert!(!reads.may_take_buffered());
        reads.turn();
        assert!(reads.may_take_buffered());
        reads.buffer_empty();
        assert!(
            !reads.may_take_buffered(),
            "an empty buffer sends the loop to select!"
        );
    }
}
