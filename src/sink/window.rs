//! The in-flight window: records handed to Kafka and not yet acknowledged (or failed), counted
//! in messages and bytes against `kafka.max_in_flight_messages` and
//! `kafka.max_in_flight_bytes`. Whoever sends stops reading more work while the window is
//! full and settles one record per delivery report. Plain counting, no I/O.

/// Messages and bytes in flight, and their caps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlight {
    max_messages: usize,
    max_bytes: usize,
    messages: usize,
    bytes: usize,
}

impl InFlight {
    /// An empty window. Caps below 1 are taken as 1, so that one record can always be sent.
    pub fn new(max_messages: usize, max_bytes: usize) -> InFlight {
        InFlight {
            max_messages: max_messages.max(1),
            max_bytes: max_bytes.max(1),
            messages: 0,
            bytes: 0,
        }
    }

    /// Another record may be sent: both counts are under their caps. The record that crosses
    /// the byte cap is still sent (a record larger than the cap must go through too).
    pub fn has_room(&self) -> bool {
        self.messages < self.max_messages && self.bytes < self.max_bytes
    }

    /// A record of `bytes` was handed to the producer.
    pub fn sent(&mut self, bytes: usize) {
        self.messages += 1;
        self.bytes += bytes;
    }

    /// The delivery report of a record of `bytes` arrived (acknowledged or failed).
    pub fn settled(&mut self, bytes: usize) {
        self.messages = self.messages.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(bytes);
    }

    /// Forgets everything in flight (the producer went away, or its reports will not come);
    /// returns how many records that was.
    pub fn clear(&mut self) -> usize {
        let abandoned = self.messages;
        self.messages = 0;
        self.bytes = 0;
        abandoned
    }

    pub fn messages(&self) -> usize {
        self.messages
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.messages == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_at_either_cap_and_open_again_when_settled() {
        let mut window = InFlight::new(2, 100);
        assert!(window.has_room() && window.is_empty());
        window.sent(10);
        window.sent(10);
        assert!(!window.has_room(), "two messages fill a window of two");
        window.settled(10);
        assert!(window.has_room());
        window.sent(150);
        assert!(!window.has_room(), "the byte cap is reached");
        assert_eq!((window.messages(), window.bytes()), (2, 160));
        window.settled(150);
        window.settled(10);
        assert!(window.is_empty() && window.has_room());
    }

    #[test]
    fn a_record_larger_than_the_byte_cap_still_goes_alone() {
        let mut window = InFlight::new(10, 5);
        assert!(window.has_room());
        window.sent(1_000);
        assert!(!window.has_room());
    }

    #[test]
    fn settling_more_than_was_sent_never_underflows_and_clear_counts() {
        let mut window = InFlight::new(0, 0);
        assert!(window.has_room(), "caps of 0 still let one record through");
        window.settled(7);
        assert_eq!((window.messages(), window.bytes()), (0, 0));
        window.sent(3);
        window.sent(4);
        assert_eq!(window.clear(), 2);
        assert!(window.is_empty());
    }
}
