//! What `dead-letters redrive` says it did: for a human (a summary, the dead letters left and
//! why) and as JSON.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::plan::{How, Letter};
use crate::ops::Report;
use crate::sink::dead_letter::HEADER_REASON;

/// Dead letters left that the report lists; the rest are counted.
const MAX_LISTED: usize = 20;

/// A dead letter not redriven, and why.
#[derive(Debug, Serialize)]
pub struct Left {
    pub partition: i32,
    pub offset: i64,
    pub event_id: String,
    pub reason: Option<String>,
    pub why: String,
}

/// The outcome of `dead-letters redrive`.
#[derive(Debug, Serialize)]
pub struct RedriveReport {
    pub topic: String,
    pub group: String,
    /// Nothing was sent or committed; the counts say what would have been.
    pub dry_run: bool,
    /// Dead letters read (from the group's position up to the end at the start).
    pub scanned: u64,
    /// Passed over by the filters (the group's position moves past them).
    pub not_selected: u64,
    /// Redriven and acknowledged: mapped again, or re-sent as they were.
    pub redriven: u64,
    pub remapped: u64,
    pub resent: u64,
    /// Read from the outbox row their dead letter named (and that row no longer kept).
    pub from_row: u64,
    /// Still unpublishable: dead-lettered again with the redrive count raised.
    pub dead_lettered_again: u64,
    /// Redriven records per target topic.
    pub by_topic: BTreeMap<String, u64>,
    /// Not redriven (past --max-redrives, nothing to send); listed up to 20.
    pub left: u64,
    pub left_letters: Vec<Left>,
    /// The group's committed offset per partition at the end.
    pub committed: BTreeMap<i32, i64>,
    pub failures: Vec<String>,
}

impl RedriveReport {
    pub(super) fn new(topic: &str, group: &str, dry_run: bool) -> RedriveReport {
        RedriveReport {
            topic: topic.to_string(),
            group: group.to_string(),
            dry_run,
            scanned: 0,
            not_selected: 0,
            redriven: 0,
            remapped: 0,
            resent: 0,
            from_row: 0,
            dead_lettered_again: 0,
            by_topic: BTreeMap::new(),
            left: 0,
            left_letters: Vec::new(),
            committed: BTreeMap::new(),
            failures: Vec::new(),
        }
    }

    pub(super) fn leave(&mut self, letter: &Letter, why: String) {
        self.left += 1;
        if self.left_letters.len() < MAX_LISTED {
            self.left_letters.push(Left {
                partition: letter.partition,
                offset: letter.offset,
                event_id: letter.event_id(),
                reason: letter.header(HEADER_REASON),
                why,
            });
        }
    }

    /// A record Kafka acknowledged (or, in a dry run, would have been sent).
    pub(super) fn acknowledged(&mut self, topic: &str, how: Option<How>) {
        match how {
            None => self.dead_lettered_again += 1,
            Some(how) => {
                self.redriven += 1;
                match how {
                    How::Remapped => self.remapped += 1,
                    How::Resent => self.resent += 1,
                    How::FromRow => self.from_row += 1,
                }
                *self.by_topic.entry(topic.to_string()).or_default() += 1;
            }
        }
    }
}

impl Report for RedriveReport {
    fn succeeded(&self) -> bool {
        self.failures.is_empty()
    }
}

impl fmt::Display for RedriveReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for l in &self.left_letters {
            writeln!(
                f,
                "left {}/{}  {}  {}  {}",
                l.partition,
                l.offset,
                l.reason.as_deref().unwrap_or("?"),
                l.event_id,
                l.why
            )?;
        }
        let verb = if self.dry_run {
            "would redrive"
        } else {
            "redrove"
        };
        let topics: Vec<String> = self
            .by_topic
            .iter()
            .map(|(t, n)| format!("{t} {n}"))
            .collect();
        writeln!(
            f,
            "{verb} {} of {} dead letters read from {} (group {}): {} mapped again, {} re-sent as they were, {} read from their outbox row{}",
            self.redriven,
            self.scanned,
            self.topic,
            self.group,
            self.remapped,
            self.resent,
            self.from_row,
            if topics.is_empty() { String::new() } else { format!(" ({})", topics.join(", ")) }
        )?;
        writeln!(
            f,
            "{} dead-lettered again, {} left, {} not selected",
            self.dead_lettered_again, self.left, self.not_selected
        )?;
        for failure in &self.failures {
            writeln!(f, "FAILED: {failure}")?;
        }
        if !self.failures.is_empty() {
            writeln!(
                f,
                "run it again: it resumes after the last acknowledged dead letter"
            )?;
        }
        Ok(())
    }
}
