//! `slot release-hold --yes [--table T]`: ends the sweeper's hold on the rows a new slot never
//! streamed, for when the gap was re-sent some other way (a `replay` with filters, a script)
//! or is not wanted. A `replay` that covers the gap releases the hold by itself; this is the
//! explicit way, which says what it lets go: the held rows are then swept as confirmed once
//! they are older than the retention (see `relay::sweeper::hold`).

use std::fmt;

use serde::Serialize;

use super::slot::SlotError;
use super::{connect, format, OpsError, Report};
use crate::config::Config;
use crate::relay::sweeper::hold::{Hold, HoldStore};

/// The outcome of `slot release-hold`.
#[derive(Debug, Serialize)]
pub struct ReleaseReport {
    pub slot: String,
    /// The holds deleted, with the rows each kept when it went.
    pub released: Vec<ReleasedHold>,
    /// Holds armed again while this ran (a new `slot create`): they stay.
    pub rearmed: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct ReleasedHold {
    #[serde(flatten)]
    pub hold: Hold,
    /// Rows the hold kept; `None` when they could not be counted.
    pub held_rows: Option<i64>,
}

impl Report for ReleaseReport {}

impl fmt::Display for ReleaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.released.is_empty() && self.rearmed.is_empty() {
            return writeln!(f, "slot `{}` has no sweeper hold", self.slot);
        }
        for r in &self.released {
            writeln!(
                f,
                "released the sweeper hold on {} (armed {}, {}): {}",
                r.hold.table,
                r.hold.armed_at,
                r.hold.reason,
                held_rows(r.held_rows)
            )?;
        }
        for table in &self.rearmed {
            writeln!(f, "the hold on {table} was armed again meanwhile (a new slot); it stays: run `outbox-relay status`")?;
        }
        Ok(())
    }
}

fn held_rows(rows: Option<i64>) -> String {
    match rows {
        Some(n) => format!(
            "its {} committed before the slot was created are swept once older than the retention",
            format::count(n.max(0) as u64, "row")
        ),
        None => {
            "its rows committed before the slot was created are swept once older than the retention"
                .into()
        }
    }
}

/// Releases the slot's holds (on `table` only, when given). Refuses without `yes`, naming
/// what would be let go.
pub async fn run(
    config: &Config,
    table: Option<&str>,
    yes: bool,
) -> Result<ReleaseReport, OpsError> {
    let wanted = table.map(|t| qualified(config, t)).transpose()?;
    let control = connect(config).await?;
    let store = HoldStore::new(config);
    let holds: Vec<Hold> = store
        .list(control.client())
        .await?
        .into_iter()
        .filter(|h| wanted.as_ref().is_none_or(|t| &h.table == t))
        .collect();
    let mut counted = Vec::with_capacity(holds.len());
    for hold in holds {
        let held_rows = store.held_rows(control.client(), &hold).await.ok();
        counted.push(ReleasedHold { hold, held_rows });
    }
    if !yes && !counted.is_empty() {
        let what: Vec<String> = counted
            .iter()
            .map(|r| format!("{} ({})", r.hold.table, row_count(r.held_rows)))
            .collect();
        return Err(SlotError::ReleaseNeedsYes {
            slot: config.postgres.slot.clone(),
            holds: what.join(", "),
        }
        .into());
    }
    let mut report = ReleaseReport {
        slot: config.postgres.slot.clone(),
        released: Vec::new(),
        rearmed: Vec::new(),
    };
    for r in counted {
        if store.release(control.client(), &r.hold).await? {
            report.released.push(r);
        } else {
            report.rearmed.push(r.hold.table);
        }
    }
    Ok(report)
}

fn row_count(rows: Option<i64>) -> String {
    rows.map_or("rows not counted".into(), |n| {
        format::count(n.max(0) as u64, "row") + " kept"
    })
}

/// `--table` as the holds name it (`schema.table`; a bare name is in `public`), if it is a
/// configured outbox table.
fn qualified(config: &Config, table: &str) -> Result<String, OpsError> {
    let name = if table.contains('.') {
        table.to_string()
    } else {
        format!("public.{table}")
    };
    let tables: Vec<String> = config
        .outbox
        .publication_tables()
        .into_iter()
        .map(|(schema, table)| format!("{schema}.{table}"))
        .collect();
    if tables.contains(&name) {
        Ok(name)
    } else {
        Err(SlotError::NotAnOutboxTable {
            table: table.to_string(),
            configured: tables.join(", "),
        }
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_named_as_the_holds_name_it() {
        let mut config = Config::default();
        config.outbox.table = "app.events".into();
        assert_eq!(qualified(&config, "app.events").unwrap(), "app.events");
        let err = qualified(&config, "events").unwrap_err().to_string();
        assert!(
            err.contains("`events` is not a configured outbox table"),
            "{err}"
        );
        assert!(err.contains("app.events"), "{err}");
    }
}
