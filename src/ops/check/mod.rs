//! `check`: the pre-flight a new user runs first. Every item is ok, a warning (works, but look
//! at it) or a problem (the relay will not work, or will lose the guarantee), and a problem
//! comes with the exact fix: the SQL to run or the setting to change.
//!
//! A failing item never stops the check: every item is reported, so that one run lists
//! everything to fix. Only reading is done; nothing is created or changed. The PostgreSQL items
//! live in [`postgres`], [`outbox_table`], [`privileges`] and [`publication`], the Kafka ones in
//! [`kafka`].

mod access;
mod failover;
mod kafka;
mod outbox_table;
mod postgres;
mod privileges;
mod publication;
mod schema;

use std::fmt;

use serde::Serialize;

use super::{connect, format, Report};
use crate::config::Config;
use kafka::TopicPlan;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Warning,
    Problem,
}

/// One checked item.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    pub check: String,
    pub status: Status,
    pub detail: String,
    /// For a warning or problem: the SQL to run or the setting to change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct CheckReport {
    /// No problems (warnings allowed).
    pub ok: bool,
    pub problems: usize,
    pub warnings: usize,
    pub items: Vec<Item>,
}

impl Report for CheckReport {
    fn succeeded(&self) -> bool {
        self.ok
    }
}

fn item(check: &str, status: Status, detail: impl Into<String>, fix: Option<String>) -> Item {
    Item {
        check: check.to_string(),
        status,
        detail: detail.into(),
        fix,
    }
}

fn ok(check: &str, detail: impl Into<String>) -> Item {
    item(check, Status::Ok, detail, None)
}

fn warning(check: &str, detail: impl Into<String>, fix: impl Into<String>) -> Item {
    item(check, Status::Warning, detail, Some(fix.into()))
}

fn problem(check: &str, detail: impl Into<String>, fix: impl Into<String>) -> Item {
    item(check, Status::Problem, detail, Some(fix.into()))
}

/// Runs every check. Never fails: what cannot be checked is itself a problem item.
pub async fn run(config: &Config) -> CheckReport {
    let mut items = Vec::new();
    let control = match connect(config).await {
        Ok(control) => Some(control),
        Err(e) => {
            items.push(problem(
                "postgres connection",
                e.to_string(),
                format!(
                    "start PostgreSQL or correct postgres.url (now `{}`)",
                    config.postgres.redacted_url()
                ),
            ));
            None
        }
    };
    let tables = match &control {
        Some(control) => postgres::postgres(control, config, &mut items).await,
        None => Vec::new(),
    };
    let topics = TopicPlan::find(control.as_ref(), config, &tables, &mut items).await;
    kafka::kafka(&config.kafka, &topics, &mut items).await;
    items.push(access::access_item(config, &topics).await);
    schema::registry(config, &topics, &mut items).await;
    let problems = count(&items, Status::Problem);
    let warnings = count(&items, Status::Warning);
    CheckReport {
        ok: problems == 0,
        problems,
        warnings,
        items,
    }
}

fn count(items: &[Item], status: Status) -> usize {
    items.iter().filter(|i| i.status == status).count()
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = self.items.iter().map(|i| i.check.len()).max().unwrap_or(0);
        for item in &self.items {
            let status = match item.status {
                Status::Ok => "ok",
                Status::Warning => "warning",
                Status::Problem => "PROBLEM",
            };
            writeln!(f, "{status:<8} {:<width$}  {}", item.check, item.detail)?;
            if let Some(fix) = &item.fix {
                let indent = " ".repeat(8 + 1 + width + 2);
                for (i, line) in fix.lines().enumerate() {
                    let label = if i == 0 { "fix: " } else { "     " };
                    writeln!(f, "{indent}{label}{line}")?;
                }
            }
        }
        writeln!(f)?;
        let warnings = format::count(self.warnings as u64, "warning");
        if self.ok {
            writeln!(f, "check passed ({warnings})")
        } else {
            writeln!(
                f,
                "check FAILED: {}, {warnings}; fix the problems above, then run `outbox-relay check` again",
                format::count(self.problems as u64, "problem")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_prints_fixes_under_their_item() {
        let report = CheckReport {
            ok: false,
            problems: 1,
            warnings: 0,
            items: vec![
                ok("wal_level", "wal_level = logical"),
                problem(
                    "role",
                    "no REPLICATION",
                    "ALTER ROLE \"x\" WITH REPLICATION;",
                ),
            ],
        };
        let text = report.to_string();
        assert!(
            text.contains("ok       wal_level  wal_level = logical"),
            "{text}"
        );
        assert!(
            text.contains("PROBLEM  role       no REPLICATION"),
            "{text}"
        );
        assert!(
            text.contains("fix: ALTER ROLE \"x\" WITH REPLICATION;"),
            "{text}"
        );
        assert!(
            text.contains("check FAILED: 1 problem, 0 warnings"),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["items"][1]["status"], "problem");
        assert!(json["items"][0].get("fix").is_none());
    }
}
