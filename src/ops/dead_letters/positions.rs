//! Where a redrive may commit its consumer group: per partition of the dead-letter topic, the
//! offset after the last dead letter handled, held back by the lowest one whose redriven
//! record Kafka has not acknowledged yet. So the committed position only ever covers dead
//! letters that are dealt with (redriven and acknowledged, dead-lettered again and
//! acknowledged, passed over, or left), in order and contiguously, as in rust-rdkafka's
//! at-least-once example. Pure.

use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, Default)]
struct Part {
    /// The offset after the last dead letter handled (read and decided).
    next: i64,
    /// Offsets whose record is in flight.
    pending: BTreeSet<i64>,
    /// The offset committed last (or the start).
    committed: i64,
}

#[derive(Debug, Default)]
pub(super) struct Positions {
    parts: BTreeMap<i32, Part>,
}

impl Positions {
    /// Partition `partition` is read from `start` (its committed offset, or its beginning).
    pub(super) fn start(&mut self, partition: i32, start: i64) {
        self.parts.insert(
            partition,
            Part {
                next: start,
                pending: BTreeSet::new(),
                committed: start,
            },
        );
    }

    /// The dead letter at `offset` is decided; `in_flight`: a record for it was sent.
    pub(super) fn handled(&mut self, partition: i32, offset: i64, in_flight: bool) {
        let part = self.parts.entry(partition).or_default();
        part.next = part.next.max(offset + 1);
        if in_flight {
            part.pending.insert(offset);
        }
    }

    /// The record for the dead letter at `offset` was acknowledged.
    pub(super) fn acknowledged(&mut self, partition: i32, offset: i64) {
        if let Some(part) = self.parts.get_mut(&partition) {
            part.pending.remove(&offset);
        }
    }

    /// Partitions whose committable offset moved since the last commit, with that offset;
    /// they count as committed from now on (call [`Positions::uncommit`] if the commit fails).
    pub(super) fn due(&mut self) -> Vec<(i32, i64)> {
        let mut due = Vec::new();
        for (&partition, part) in &mut self.parts {
            let at = part.pending.first().copied().unwrap_or(part.next);
            if at > part.committed {
                part.committed = at;
                due.push((partition, at));
            }
        }
        due
    }

    /// Dead letters dealt with (committable) but not committed yet: what a redrive killed now
    /// would send again on top of those in flight.
    pub(super) fn uncommitted(&self) -> u64 {
        self.parts
            .values()
            .map(|part| {
                let at = part.pending.first().copied().unwrap_or(part.next);
                (at - part.committed).max(0) as u64
            })
            .sum()
    }

    /// A commit of `due` failed: those partitions are due again.
    pub(super) fn uncommit(&mut self, due: &[(i32, i64)], previous: &BTreeMap<i32, i64>) {
        for (partition, _) in due {
            if let (Some(part), Some(&at)) =
                (self.parts.get_mut(partition), previous.get(partition))
            {
                part.committed = at;
            }
        }
    }

    /// The committed offset of every partition.
    pub(super) fn committed(&self) -> BTreeMap<i32, i64> {
        self.parts
            .iter()
            .map(|(&p, part)| (p, part.committed))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unacknowledged_record_holds_its_partition_back() {
        let mut p = Positions::default();
        p.start(0, 10);
        p.start(1, 0);
        p.handled(0, 10, true);
        p.handled(0, 11, false);
        p.handled(0, 12, true);
        p.handled(1, 0, false);
        assert_eq!(p.due(), vec![(1, 1)], "partition 0 waits for offset 10");
        p.acknowledged(0, 12);
        assert_eq!(p.due(), vec![], "10 still in flight");
        p.acknowledged(0, 10);
        assert_eq!(p.due(), vec![(0, 13)]);
        assert_eq!(p.due(), vec![], "nothing new");
    }

    #[test]
    fn uncommitted_counts_what_is_dealt_with_and_not_committed() {
        let mut p = Positions::default();
        p.start(0, 10);
        p.start(1, 0);
        for offset in 10..20 {
            p.handled(0, offset, true);
        }
        p.handled(1, 0, false);
        assert_eq!(p.uncommitted(), 1, "in flight is not dealt with");
        for offset in 10..15 {
            p.acknowledged(0, offset);
        }
        assert_eq!(p.uncommitted(), 6);
        p.due();
        assert_eq!(p.uncommitted(), 0);
    }

    #[test]
    fn a_failed_commit_is_due_again() {
        let mut p = Positions::default();
        p.start(0, 5);
        let before = p.committed();
        p.handled(0, 5, false);
        let due = p.due();
        assert_eq!(due, vec![(0, 6)]);
        p.uncommit(&due, &before);
        assert_eq!(p.due(), vec![(0, 6)]);
    }
}
