//! What a replay did: counts per table and topic, failures, and why it stopped; printed for a
//! human or as JSON.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

use super::holds::HoldOutcome;
use super::COMMIT_TIME_CREATED_AT;
use crate::ops::{format, Report};

#[derive(Debug, Serialize)]
pub struct ReplayReport {
    pub ok: bool,
    pub dry_run: bool,
    /// Rows the selection matched.
    pub matched: u64,
    /// Records handed to Kafka.
    pub sent: u64,
    pub acknowledged: u64,
    pub failed: u64,
    /// Rows matched per outbox table (`schema.table`).
    pub tables: BTreeMap<String, u64>,
    /// Events per topic (sent, or that would be sent in a dry run).
    pub topics: BTreeMap<String, u64>,
    /// The header every replayed record carries, `name: value`.
    pub header: String,
    /// What stands in for the commit time (the record timestamp unless
    /// `outbox.timestamp_column` gives one): `commit_timestamp` (the row's own, with
    /// `track_commit_timestamp = on`: as live) or `created_at`.
    pub commit_time: String,
    pub seconds: f64,
    /// The first failed deliveries: event id, topic, error.
    pub failures: Vec<String>,
    /// Why the replay stopped before the end of the selection, if it did.
    pub stopped: Option<String>,
    /// The retention sweeper's holds on the replayed tables, and whether this replay released
    /// them (it covered the gap before the slot's creation).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sweeper_holds: Vec<HoldOutcome>,
}

impl Report for ReplayReport {
    fn succeeded(&self) -> bool {
        self.ok
    }
}

impl fmt::Display for ReplayReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.matched == 0 && self.stopped.is_none() {
            writeln!(f, "no events match the selection: nothing to replay")?;
            return self.write_holds(f);
        }
        self.write_headline(f)?;
        self.write_holds(f)?;
        if self.tables.len() > 1 {
            let tables: Vec<String> = self
                .tables
                .iter()
                .map(|(table, n)| format!("{table} ({n})"))
                .collect();
            writeln!(f, "  from {}", tables.join(", "))?;
        }
        let width = self.topics.keys().map(String::len).max().unwrap_or(0);
        for (topic, n) in &self.topics {
            writeln!(f, "  {topic:<width$}  {n}")?;
        }
        if self.commit_time == COMMIT_TIME_CREATED_AT {
            writeln!(f, "  record timestamps: outbox.timestamp_column where set, else created_at (the original commit time is not known: track_commit_timestamp is off)")?;
        }
        for failure in &self.failures {
            writeln!(f, "  failed: {failure}")?;
        }
        if self.stopped.is_some() {
            writeln!(f, "fix the cause, then run the same replay again: it re-sends all {} (consumers deduplicate by event id)", self.matched)?;
        } else if !self.ok {
            writeln!(f, "the acknowledged events are in Kafka; running the same replay again re-sends all {} (consumers deduplicate by event id)", self.matched)?;
        }
        Ok(())
    }
}

impl ReplayReport {
    fn write_holds(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for hold in &self.sweeper_holds {
            match &hold.kept_because {
                None => writeln!(f, "  released the sweeper hold on {}: its rows committed before the slot's creation ({}) are swept from now on as confirmed", hold.table, hold.armed_at)?,
                Some(why) => writeln!(f, "  the sweeper still holds the rows of {} committed before the slot's creation ({}): {why}; a replay that selects every row it keeps (an earlier --since, no id or type filter, no --until) releases it", hold.table, hold.armed_at)?,
            }
        }
        Ok(())
    }

    fn write_headline(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let topics = format::count(self.topics.len() as u64, "topic");
        if let Some(reason) = &self.stopped {
            let done = if self.dry_run {
                self.topics.values().sum()
            } else {
                self.acknowledged
            };
            return writeln!(
                f,
                "replay STOPPED after {done} of {} events: {reason}",
                self.matched
            );
        }
        if self.dry_run {
            return writeln!(
                f,
                "dry run: {} match and would be re-published to {topics}; nothing was sent",
                format::count(self.matched, "event")
            );
        }
        if !self.ok {
            return writeln!(
                f,
                "replay FAILED: {} of {} events were not acknowledged by Kafka ({} acknowledged)",
                self.failed, self.matched, self.acknowledged
            );
        }
        let rate = self.acknowledged as f64 / self.seconds.max(0.001);
        writeln!(
            f,
            "replayed {} to {topics} in {:.1} s ({rate:.0} events/s), each with header {}",
            format::count(self.acknowledged, "event"),
            self.seconds,
            self.header
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{COMMIT_TIME_TRACKED, REPLAY_HEADER, REPLAY_HEADER_VALUE};
    use super::*;

    #[test]
    fn summary_names_the_header_and_failures() {
        let mut report = ReplayReport {
            ok: true,
            dry_run: false,
            matched: 3,
            sent: 3,
            acknowledged: 3,
            failed: 0,
            tables: BTreeMap::from([("app.a".to_string(), 1), ("public.outbox".to_string(), 2)]),
            topics: BTreeMap::from([("a".to_string(), 2), ("bb".to_string(), 1)]),
            header: format!("{REPLAY_HEADER}: {REPLAY_HEADER_VALUE}"),
            commit_time: COMMIT_TIME_TRACKED.into(),
            seconds: 1.0,
            failures: Vec::new(),
            stopped: None,
            sweeper_holds: Vec::new(),
        };
        let text = report.to_string();
        assert!(text.starts_with("replayed 3 events to 2 topics"), "{text}");
        assert!(text.contains("outbox-relay-replay: true"), "{text}");
        assert!(text.contains("from app.a (1), public.outbox (2)"), "{text}");
        assert!(!text.contains("record timestamps"), "{text}");
        report.commit_time = COMMIT_TIME_CREATED_AT.into();
        assert!(
            report.to_string().contains("track_commit_timestamp is off"),
            "{report}"
        );
        report.ok = false;
        report.acknowledged = 2;
        report.failed = 1;
        report.failures = vec!["event x for topic `a`: timed out".into()];
        let text = report.to_string();
        assert!(text.starts_with("replay FAILED: 1 of 3 events"), "{text}");
        assert!(text.contains("failed: event x"), "{text}");
    }
}
