//! The publication items of `check`: the publication exists, publishes inserts only, covers
//! exactly the outbox tables (a partitioned outbox through its root or all its leaves), and
//! each problem comes with the SQL that fixes it.

use std::collections::BTreeMap;

use super::outbox_table::Table;
use super::{ok, problem, warning, Item};
use crate::config::Config;
use crate::ops::OpsError;
use crate::postgres::control::{describe, query_err, quote_ident, Control};

/// The publication exists, covers exactly the outbox tables and publishes inserts.
pub(super) async fn publication(control: &Control, config: &Config) -> Vec<Item> {
    let name = &config.postgres.publication;
    let wanted: Vec<Table> = config
        .outbox
        .publication_tables()
        .into_iter()
        .map(Table::new)
        .collect();
    let create = match create_statement(control, name, &wanted).await {
        Ok(create) => create,
        Err(problem) => return vec![problem],
    };
    let flags = match publication_flags(control, config, &create).await {
        Ok(flags) => flags,
        Err(problem) => return vec![problem],
    };
    let published = match published_tables(control, name).await {
        Ok(tables) => tables,
        Err(e) => {
            return vec![problem(
                "publication",
                format!("cannot read pg_publication_tables: {e}"),
                "check the role's access to the catalog",
            )]
        }
    };
    let all_tables: bool = flags.get(4);
    let mut items = vec![
        publication_tables(name, &wanted, &published, all_tables, &create),
        publication_operations(
            name,
            [flags.get(0), flags.get(1), flags.get(2), flags.get(3)],
        ),
    ];
    match partitioned_tables(control, &wanted).await {
        Ok(partitioned) => items.extend(publication_partitions(name, &partitioned, flags.get(5))),
        Err(e) => items.push(problem(
            "publication partitions",
            format!("cannot tell which outbox tables are partitioned: {e}"),
            "check the role's access to the catalog",
        )),
    }
    items
}

/// The `CREATE PUBLICATION` a fix prints: for the outbox tables, with the options the relay
/// would create it with. A message-only outbox needs a publication, but no table in it.
async fn create_statement(control: &Control, name: &str, wanted: &[Table]) -> Result<String, Item> {
    let target = if wanted.is_empty() {
        String::new()
    } else {
        format!(" FOR TABLE {}", quoted_list(wanted))
    };
    let options = control.publication_options().await.map_err(|e| {
        problem(
            "publication",
            format!("cannot read the server version: {e}"),
            "check the connection",
        )
    })?;
    Ok(format!(
        "CREATE PUBLICATION {}{target} WITH ({options});",
        quote_ident(name)
    ))
}

/// The publication's row of pg_publication: `pubinsert`, `pubupdate`, `pubdelete`,
/// `pubtruncate`, `puballtables` and `pubviaroot` (read through `to_jsonb`, so that a server
/// before PostgreSQL 13, which lacks the column, gives NULL). A missing publication is a
/// problem whose fix is `create`.
async fn publication_flags(
    control: &Control,
    config: &Config,
    create: &str,
) -> Result<tokio_postgres::Row, Item> {
    let name = &config.postgres.publication;
    let flags = control
        .client()
        .query_opt(
            "SELECT pubinsert, pubupdate, pubdelete, pubtruncate, puballtables,
                    (to_jsonb(p) ->> 'pubviaroot')::bool
             FROM pg_publication p WHERE pubname = $1",
            &[name],
        )
        .await;
    match flags {
        Ok(Some(row)) => Ok(row),
        Ok(None) => {
            let mut fix = create.to_string();
            if config.postgres.create_publication {
                fix.push_str(" (or let `outbox-relay run` create it: postgres.create_publication = true, which needs ownership of the table)");
            }
            Err(problem(
                "publication",
                format!("publication `{name}` does not exist"),
                fix,
            ))
        }
        Err(e) => Err(problem(
            "publication",
            format!("cannot read pg_publication: {}", describe(&e)),
            "check the role's access to the catalog",
        )),
    }
}

/// The outbox tables that are partitioned (relkind `p`).
async fn partitioned_tables<'t>(
    control: &Control,
    tables: &'t [Table],
) -> Result<Vec<&'t Table>, OpsError> {
    let mut partitioned = Vec::new();
    for table in tables {
        let kind: Option<String> = control
            .client()
            .query_opt(
                "SELECT c.relkind::text FROM pg_class c
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = $2",
                &[&table.schema, &table.name],
            )
            .await
            .map_err(query_err("reading pg_class"))?
            .map(|r| r.get(0));
        if kind.as_deref() == Some("p") {
            partitioned.push(table);
        }
    }
    Ok(partitioned)
}

/// A partitioned outbox should be published via its root (`via_root`: `pubviaroot`, `None`
/// before PostgreSQL 13): otherwise pgoutput names the leaf partition of every change.
fn publication_partitions(
    name: &str,
    partitioned: &[&Table],
    via_root: Option<bool>,
) -> Option<Item> {
    let names: Vec<&str> = partitioned.iter().map(|t| t.display.as_str()).collect();
    if names.is_empty() {
        return None;
    }
    let names = names.join(", ");
    Some(match via_root {
        Some(true) => ok(
            "publication partitions",
            format!("publication `{name}` sends the changes of partitioned {names} under the table's own name (publish_via_partition_root)"),
        ),
        Some(false) => warning(
            "publication partitions",
            format!("publication `{name}` sends the changes of partitioned {names} under each leaf partition's name: the relay maps a leaf to its root while it is attached, but stops (without confirming past them) on changes of a partition that was detached or dropped before the relay read them"),
            format!("ALTER PUBLICATION {} SET (publish_via_partition_root = true);", quote_ident(name)),
        ),
        None => warning(
            "publication partitions",
            format!("{names} is partitioned, and this PostgreSQL (before 13) cannot publish via the partition root: the relay maps each leaf to its root while it is attached, but stops on changes of a partition detached or dropped before the relay read them"),
            "detach or drop a partition only after `outbox-relay status` shows the slot confirmed past its last insert",
        ),
    })
}

/// `"s"."a", "s"."b"`.
fn quoted_list(tables: &[Table]) -> String {
    let quoted: Vec<&str> = tables.iter().map(|t| t.quoted.as_str()).collect();
    quoted.join(", ")
}

/// What the publication holds, `schema.table` → the `schema.table` of its partition root (of
/// itself when it is not a partition): the tables pg_publication_tables lists (the leaves of
/// a partitioned table unless the publication publishes via the root) and its explicit
/// members (a partitioned table without partitions is listed nowhere else).
async fn published_tables(
    control: &Control,
    publication: &str,
) -> Result<BTreeMap<String, String>, OpsError> {
    let rows = control
        .client()
        .query(
            "WITH published AS (
                 SELECT format('%I.%I', schemaname, tablename)::regclass AS relid
                 FROM pg_publication_tables WHERE pubname = $1
                 UNION
                 SELECT r.prrelid::regclass FROM pg_publication_rel r
                 JOIN pg_publication p ON p.oid = r.prpubid WHERE p.pubname = $1
             )
             SELECT n.nspname::text || '.' || c.relname::text,
                    rn.nspname::text || '.' || rc.relname::text
             FROM published pb
             JOIN pg_class c ON c.oid = pb.relid
             JOIN pg_namespace n ON n.oid = c.relnamespace
             JOIN pg_class rc ON rc.oid = COALESCE(pg_partition_root(pb.relid), pb.relid)
             JOIN pg_namespace rn ON rn.oid = rc.relnamespace",
            &[&publication],
        )
        .await
        .map_err(query_err("reading pg_publication_tables"))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

fn publication_tables(
    name: &str,
    wanted: &[Table],
    published: &BTreeMap<String, String>,
    all_tables: bool,
    create: &str,
) -> Item {
    let quoted = quote_ident(name);
    let missing: Vec<&Table> = wanted
        .iter()
        .filter(|t| {
            !published
                .iter()
                .any(|(table, root)| *table == t.display || *root == t.display)
        })
        .collect();
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|t| t.display.as_str()).collect();
        let list: Vec<&str> = missing.iter().map(|t| t.quoted.as_str()).collect();
        return problem(
            "publication tables",
            format!(
                "publication `{name}` does not include {}: its inserts are never streamed",
                names.join(", ")
            ),
            format!("ALTER PUBLICATION {quoted} ADD TABLE {};", list.join(", ")),
        );
    }
    if all_tables {
        return problem(
            "publication tables",
            format!("publication `{name}` is FOR ALL TABLES: every table's inserts are sent, and the relay stops at the first insert into a table that is not a configured outbox (it never skips one silently)"),
            format!("DROP PUBLICATION {quoted}; {create}"),
        );
    }
    let others: Vec<&String> = published
        .iter()
        .filter(|(table, root)| {
            !wanted
                .iter()
                .any(|t| &t.display == *table || &t.display == *root)
        })
        .map(|(table, _)| table)
        .collect();
    if !others.is_empty() {
        let names: Vec<&str> = others.iter().map(|t| t.as_str()).collect();
        let fix = match wanted {
            [] => format!("DROP PUBLICATION {quoted}; {create}"),
            _ => format!(
                "ALTER PUBLICATION {quoted} SET TABLE {};",
                quoted_list(wanted)
            ),
        };
        return problem(
            "publication tables",
            format!("publication `{name}` also includes {}, which are not configured outbox tables: the relay stops at the first insert into one of them (it never skips one silently)", names.join(", ")),
            fix,
        );
    }
    if wanted.is_empty() {
        return ok(
            "publication tables",
            format!("publication `{name}` has no tables, as a message-only outbox needs"),
        );
    }
    let names: Vec<&str> = wanted.iter().map(|t| t.display.as_str()).collect();
    ok(
        "publication tables",
        format!("publication `{name}` covers exactly {}", names.join(", ")),
    )
}

fn publication_operations(name: &str, [insert, update, delete, truncate]: [bool; 4]) -> Item {
    let fix = format!(
        "ALTER PUBLICATION {} SET (publish = 'insert');",
        quote_ident(name)
    );
    if !insert {
        return problem(
            "publication operations",
            format!("publication `{name}` does not publish inserts: no event is ever streamed"),
            fix,
        );
    }
    let extra: Vec<&str> = [
        (update, "update"),
        (delete, "delete"),
        (truncate, "truncate"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, op)| *op)
    .collect();
    if !extra.is_empty() {
        return warning(
            "publication operations",
            format!("publication `{name}` also publishes {}: the relay ignores them, and a published update or delete needs a replica identity on the table", extra.join(", ")),
            fix,
        );
    }
    ok(
        "publication operations",
        format!("publication `{name}` publishes inserts only"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OutboxConfig;
    use crate::ops::check::Status;

    #[test]
    fn publication_must_publish_inserts_and_only_the_outbox() {
        let table = [Table::from_config(&OutboxConfig::default())];
        let table = &table[..];
        let only = published(&[("public.outbox", "public.outbox")]);
        assert_eq!(
            publication_tables("p", table, &only, false, "").status,
            Status::Ok
        );
        let none = BTreeMap::new();
        let item = publication_tables("p", table, &none, false, "");
        assert_eq!(item.status, Status::Problem);
        assert_eq!(
            item.fix.as_deref(),
            Some("ALTER PUBLICATION \"p\" ADD TABLE \"public\".\"outbox\";")
        );
        let more = published(&[
            ("public.outbox", "public.outbox"),
            ("public.orders", "public.orders"),
        ]);
        assert_eq!(
            publication_tables("p", table, &more, false, "").status,
            Status::Problem
        );
        assert_eq!(
            publication_tables("p", table, &only, true, "").status,
            Status::Problem
        );
        assert_eq!(
            publication_operations("p", [false, true, true, true]).status,
            Status::Problem
        );
        assert_eq!(
            publication_operations("p", [true, true, false, false]).status,
            Status::Warning
        );
        assert_eq!(
            publication_operations("p", [true, false, false, false]).status,
            Status::Ok
        );
    }

    fn published(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(t, r)| (t.to_string(), r.to_string()))
            .collect()
    }

    #[test]
    fn leaves_of_a_partitioned_outbox_cover_it() {
        let table = [Table::from_config(&OutboxConfig::default())];
        let leaves = published(&[
            ("public.outbox_2026_01", "public.outbox"),
            ("public.outbox_default", "public.outbox"),
        ]);
        assert_eq!(
            publication_tables("p", &table, &leaves, false, "").status,
            Status::Ok
        );
        let foreign = published(&[
            ("public.outbox_2026_01", "public.outbox"),
            ("public.orders_2026_01", "public.orders"),
        ]);
        let item = publication_tables("p", &table, &foreign, false, "");
        assert_eq!(item.status, Status::Problem, "{item:?}");
        assert!(item.detail.contains("public.orders_2026_01"), "{item:?}");
    }

    #[test]
    fn a_partitioned_outbox_wants_publish_via_partition_root() {
        let table = Table::from_config(&OutboxConfig::default());
        assert!(publication_partitions("p", &[], Some(false)).is_none());
        let item = publication_partitions("p", &[&table], Some(false)).unwrap();
        assert_eq!(item.status, Status::Warning);
        assert_eq!(
            item.fix.as_deref(),
            Some(r#"ALTER PUBLICATION "p" SET (publish_via_partition_root = true);"#)
        );
        assert_eq!(
            publication_partitions("p", &[&table], Some(true))
                .unwrap()
                .status,
            Status::Ok
        );
    }

    #[test]
    fn a_message_only_outbox_wants_a_publication_without_tables() {
        let none = BTreeMap::new();
        assert_eq!(
            publication_tables("p", &[], &none, false, "").status,
            Status::Ok
        );
        let extra = published(&[("public.orders", "public.orders")]);
        let item = publication_tables(
            "p",
            &[],
            &extra,
            false,
            r#"CREATE PUBLICATION "p" WITH (publish = 'insert');"#,
        );
        assert_eq!(item.status, Status::Problem);
        assert_eq!(
            item.fix.as_deref(),
            Some(r#"DROP PUBLICATION "p"; CREATE PUBLICATION "p" WITH (publish = 'insert');"#)
        );
    }
}
