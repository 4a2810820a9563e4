//! The `privileges` item of `check`: what the configured set-up needs of the relay's role
//! beyond `REPLICATION` and `SELECT` on the outbox tables (items of their own), read from the
//! server, each missing one with the exact statement that grants it.
//!
//! - the retention sweeper (`[outbox.sweeper] enabled`): `SELECT, DELETE` on every table it
//!   deletes from (a partitioned outbox's partitions, which it sweeps one by one), the sweeper
//!   hold table (`SELECT, INSERT, UPDATE, DELETE`) and the kept-rows table (`SELECT, INSERT,
//!   DELETE`), or `CREATE` on their schema to make them;
//! - `drop_partitions`: ownership of each partitioned outbox table (DETACH and DROP);
//! - with `postgres.create_slot`: ownership of the publication, whose comment records that the
//!   slot was streamed (without it a relay restarted after a failover without failover slots
//!   creates a new slot instead of stopping).

use tokio_postgres::Client;

use super::{ok, problem, warning, Item};
use crate::config::Config;
use crate::postgres::control::{quote_ident, Control};
use crate::relay::sweeper::hold::{HoldStore, HOLD_TABLE};
use crate::relay::sweeper::kept::{KeptRows, KEPT_TABLE};

const CHECK: &str = "privileges";

/// One privilege the set-up needs and the role lacks.
#[derive(Debug, Clone, PartialEq)]
struct Missing {
    /// What needs it.
    why: String,
    /// The statement that grants it.
    fix: String,
    /// Whether the relay still works without it (a warning, not a problem).
    optional: bool,
}

pub(super) async fn privileges(control: &Control, config: &Config, role: &str) -> Item {
    match missing(control.client(), config, role).await {
        Ok(missing) => item(missing),
        Err(e) => warning(
            CHECK,
            format!("cannot read the role's privileges: {e}"),
            "connect as the relay's role and run `outbox-relay check` again",
        ),
    }
}

/// The item for what is missing: ok when nothing is, a problem when the relay needs any of it.
fn item(missing: Vec<Missing>) -> Item {
    if missing.is_empty() {
        return ok(
            CHECK,
            "the role has what the configured sweeper, partitions and publication need",
        );
    }
    let why: Vec<&str> = missing.iter().map(|m| m.why.as_str()).collect();
    let fix: Vec<&str> = missing.iter().map(|m| m.fix.as_str()).collect();
    let detail = format!("the role lacks: {}", why.join("; "));
    if missing.iter().all(|m| m.optional) {
        warning(CHECK, detail, fix.join("\n"))
    } else {
        problem(CHECK, detail, fix.join("\n"))
    }
}

async fn missing(
    client: &Client,
    config: &Config,
    role: &str,
) -> Result<Vec<Missing>, tokio_postgres::Error> {
    let grantee = quote_ident(role);
    let mut missing = Vec::new();
    let sweeper = &config.outbox.sweeper;
    if sweeper.enabled {
        for (schema, table) in config.outbox.publication_tables() {
            // The table itself, or each partition of a partitioned one (the sweeper deletes
            // from the partitions directly); no row for a table that does not exist (the
            // outbox table item says so).
            let rows = client
                .query(
                    "WITH t AS (SELECT c.oid, c.relkind FROM pg_class c
                                JOIN pg_namespace n ON n.oid = c.relnamespace
                                WHERE n.nspname = $1 AND c.relname = $2)
                     SELECT p.relid::regclass::text,
                            has_table_privilege(p.relid, 'SELECT') AND has_table_privilege(p.relid, 'DELETE')
                     FROM t, pg_partition_tree(t.oid) p WHERE t.relkind = 'p' AND p.isleaf
                     UNION ALL
                     SELECT t.oid::regclass::text,
                            has_table_privilege(t.oid, 'SELECT') AND has_table_privilege(t.oid, 'DELETE')
                     FROM t WHERE t.relkind <> 'p'",
                    &[&schema, &table],
                )
                .await?;
            for row in rows {
                let (relation, allowed): (String, bool) = (row.get(0), row.get(1));
                if !allowed {
                    missing.push(Missing {
                        why: format!("SELECT and DELETE on {relation} (the sweeper)"),
                        fix: format!("GRANT SELECT, DELETE ON {relation} TO {grantee};"),
                        optional: false,
                    });
                }
            }
            if sweeper.drop_partitions {
                let owner: Option<bool> = client
                    .query_opt(
                        "SELECT pg_has_role(c.relowner, 'USAGE') FROM pg_class c
                         JOIN pg_namespace n ON n.oid = c.relnamespace
                         WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind = 'p'",
                        &[&schema, &table],
                    )
                    .await?
                    .map(|r| r.get(0));
                if owner == Some(false) {
                    let relation = format!("{}.{}", quote_ident(&schema), quote_ident(&table));
                    missing.push(Missing {
                        why: format!("ownership of {relation} and its partitions (drop_partitions)"),
                        fix: format!(
                            "ALTER TABLE {relation} OWNER TO {grantee}; (and each partition), or [outbox.sweeper] drop_partitions = false"
                        ),
                        optional: false,
                    });
                }
            }
        }
        let hold = SideTable {
            relation: HoldStore::new(config).relation().map(str::to_string),
            name: HOLD_TABLE,
            what: "sweeper hold table",
            privileges: &["SELECT", "INSERT", "UPDATE", "DELETE"],
            migration: "migrations/002_sweeper_hold.sql",
        };
        let kept = SideTable {
            relation: KeptRows::new(config).relation().map(str::to_string),
            name: KEPT_TABLE,
            what: "kept-rows table",
            privileges: &["SELECT", "INSERT", "DELETE"],
            migration: "migrations/003_kept_rows.sql",
        };
        for table in [hold, kept] {
            if let Some(lacking) = side_table(client, config, table, &grantee).await? {
                missing.push(lacking);
            }
        }
    }
    if config.postgres.create_slot {
        let owner: Option<bool> = client
            .query_opt(
                "SELECT pg_has_role(pubowner, 'USAGE') FROM pg_publication WHERE pubname = $1",
                &[&config.postgres.publication],
            )
            .await?
            .map(|r| r.get(0));
        if owner == Some(false) {
            let publication = quote_ident(&config.postgres.publication);
            missing.push(Missing {
                why: format!(
                    "ownership of publication {publication} (its comment records that the slot was streamed, so that a relay restarted after a failover stops instead of creating a new slot)"
                ),
                fix: format!(
                    "ALTER PUBLICATION {publication} OWNER TO {grantee}; (the new owner needs CREATE on the database), or create the slot beforehand and set postgres.create_slot = false"
                ),
                optional: true,
            });
        }
    }
    Ok(missing)
}

/// A table of the relay's own beside the outbox (the sweeper hold table, the kept-rows table):
/// usable if it exists, else creatable in its schema. (Each privilege is asked on its own:
/// `has_table_privilege` with a list answers whether *any* is held.)
struct SideTable {
    /// Its quoted `schema.table`; `None` without an outbox table.
    relation: Option<String>,
    name: &'static str,
    what: &'static str,
    privileges: &'static [&'static str],
    migration: &'static str,
}

async fn side_table(
    client: &Client,
    config: &Config,
    table: SideTable,
    grantee: &str,
) -> Result<Option<Missing>, tokio_postgres::Error> {
    let (Some(relation), Some((schema, _))) = (
        table.relation,
        config.outbox.publication_tables().first().cloned(),
    ) else {
        return Ok(None);
    };
    let granted: Vec<String> = table
        .privileges
        .iter()
        .map(|p| format!("has_table_privilege(to_regclass($1), '{p}')"))
        .collect();
    let row = client
        .query_one(
            &format!(
                "SELECT to_regclass($1) IS NOT NULL, {},
                        (SELECT has_schema_privilege(oid, 'CREATE') FROM pg_namespace WHERE nspname = $2)",
                granted.join(" AND ")
            ),
            &[&relation, &schema],
        )
        .await?;
    let (exists, usable, creatable): (bool, Option<bool>, Option<bool>) =
        (row.get(0), row.get(1), row.get(2));
    let grant = format!(
        "GRANT {} ON {relation} TO {grantee};",
        table.privileges.join(", ")
    );
    Ok(match (exists, usable, creatable) {
        (true, Some(false), _) => Some(Missing {
            why: format!("the use of the {} {relation}", table.what),
            fix: grant,
            optional: false,
        }),
        (false, _, Some(false)) => Some(Missing {
            why: format!(
                "CREATE on schema {} for the {} {}",
                quote_ident(&schema),
                table.what,
                table.name
            ),
            fix: format!(
                "as the schema's owner, with search_path = {}: psql -f {}; then {grant}",
                quote_ident(&schema),
                table.migration
            ),
            optional: false,
        }),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::check::Status;

    fn lacking(why: &str, optional: bool) -> Missing {
        Missing {
            why: why.into(),
            fix: format!("GRANT {why};"),
            optional,
        }
    }

    #[test]
    fn nothing_missing_is_ok() {
        assert_eq!(item(Vec::new()).status, Status::Ok);
    }

    #[test]
    fn every_missing_grant_is_in_the_fix() {
        let found = item(vec![lacking("a", false), lacking("b", true)]);
        assert_eq!(found.status, Status::Problem);
        assert_eq!(found.fix.as_deref(), Some("GRANT a;\nGRANT b;"));
        assert!(found.detail.contains("a; b"), "{}", found.detail);
    }

    #[test]
    fn only_optional_ones_missing_is_a_warning() {
        assert_eq!(item(vec![lacking("b", true)]).status, Status::Warning);
    }
}
