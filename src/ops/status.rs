//! `status`: where the relay stands. The slot (who holds it, how far it confirmed, how much WAL
//! it keeps), the publication, and every outbox table (`outbox.table` and `[[outbox.tables]]`).
//! Read-only; safe while the relay runs.

use std::fmt;

use serde::Serialize;

use super::rows::created_at_column;
use super::{connect, format, OpsError, Report};
use crate::config::{Config, OutboxConfig};
use crate::lsn::Lsn;
use crate::postgres::control::{describe, query_err, quote_ident, sqlstate, Control, SlotInfo};
use crate::relay::sweeper::hold::{Hold, HoldStore, HOLD_TABLE};

#[derive(Debug, Serialize)]
pub struct StatusReport {
    /// False when the slot is missing or lost.
    pub ok: bool,
    /// The server's current WAL position.
    pub server_wal_lsn: Lsn,
    pub slot: SlotStatus,
    pub publication: PublicationStatus,
    /// Every configured outbox table, in configuration order (none for a message-only outbox).
    pub outbox: Vec<OutboxStatus>,
    /// `outbox.message_prefix`, when `pg_logical_emit_message` events are relayed too.
    pub message_prefix: Option<String>,
    /// The retention sweeper's holds on this slot: rows committed before the slot was created,
    /// kept until a replay covers them.
    pub sweeper_holds: Vec<HoldStatus>,
}

#[derive(Debug, Serialize)]
pub struct HoldStatus {
    #[serde(flatten)]
    pub hold: Hold,
    /// Rows the hold keeps now; `None` when the table could not be read.
    pub held_rows: Option<i64>,
    /// The statement that releases it by hand.
    pub release_sql: String,
}

#[derive(Debug, Serialize)]
pub struct SlotStatus {
    pub name: String,
    pub exists: bool,
    pub active: bool,
    pub active_pid: Option<i32>,
    /// The holding backend as `pg_stat_activity` shows it (hidden from unprivileged roles).
    pub holder: Option<Holder>,
    pub plugin: Option<String>,
    pub wal_status: Option<String>,
    /// Bytes of WAL that can still be written before the slot is invalidated; `None`: no
    /// limit (`max_slot_wal_keep_size = -1`).
    pub safe_wal_size_bytes: Option<i64>,
    pub confirmed_flush_lsn: Option<Lsn>,
    pub restart_lsn: Option<Lsn>,
    /// WAL between the confirmed position and the server's position: what the relay has yet
    /// to go through.
    pub lag_bytes: Option<u64>,
    /// WAL the server keeps for this slot (from `restart_lsn`).
    pub retained_wal_bytes: Option<u64>,
    /// A failover slot (PostgreSQL 17+; `None` before).
    pub failover: Option<bool>,
    /// A copy kept by slot synchronization (on a standby, or after its promotion).
    pub synced: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct Holder {
    pub application_name: Option<String>,
    pub client_addr: Option<String>,
    pub backend_start: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct PublicationStatus {
    pub name: String,
    pub exists: bool,
    /// Operations published: insert, update, delete, truncate.
    pub publishes: Vec<String>,
    /// `schema.table` of every published table (the leaf partitions of a partitioned table
    /// unless the publication publishes via the root).
    pub tables: Vec<String>,
    /// `schema.table` of the partition root of every published table (the table itself when
    /// it is not a partition): what the relay maps inserts by.
    pub roots: Vec<String>,
    /// `publish_via_partition_root` (PostgreSQL 13+; `None` before).
    pub via_partition_root: Option<bool>,
}

#[derive(Debug, Serialize)]
pub struct OutboxStatus {
    /// `schema.table`.
    pub table: String,
    pub exists: bool,
    /// The publication includes the table or its partitions (else its inserts are not
    /// streamed).
    pub published: bool,
    /// Its leaf partitions when it is a partitioned table; `None` for a plain table.
    pub partitions: Option<i64>,
    pub rows: Option<i64>,
    pub oldest_created_at: Option<String>,
    pub oldest_age_seconds: Option<f64>,
    /// Why the table could not be read, if it could not.
    pub error: Option<String>,
}

impl Report for StatusReport {
    fn succeeded(&self) -> bool {
        self.ok
    }
}

/// Collects the status; fails only when PostgreSQL cannot be reached or queried at all.
pub async fn run(config: &Config) -> Result<StatusReport, OpsError> {
    let control = connect(config).await?;
    let server_wal_lsn = server_lsn(&control).await?;
    let info = control.slot(&config.postgres.slot).await?;
    let holder = match info.as_ref().and_then(|i| i.active_pid) {
        Some(pid) => holder(&control, pid).await?,
        None => None,
    };
    let slot = slot_status(&config.postgres.slot, info, holder, server_wal_lsn);
    let publication = publication(&control, &config.postgres.publication).await?;
    let mut outbox = Vec::new();
    for table in config.outbox.table_configs() {
        outbox.push(outbox_table(&control, config, &table, &publication).await);
    }
    let sweeper_holds = sweeper_holds(&control, config).await?;
    let ok = slot.exists && slot.wal_status.as_deref() != Some("lost");
    Ok(StatusReport {
        ok,
        server_wal_lsn,
        slot,
        publication,
        outbox,
        message_prefix: config.outbox.message_prefix.clone(),
        sweeper_holds,
    })
}

async fn sweeper_holds(control: &Control, config: &Config) -> Result<Vec<HoldStatus>, OpsError> {
    let store = HoldStore::new(config);
    let holds = store.list(control.client()).await?;
    let hold_table = store.relation().unwrap_or(HOLD_TABLE).to_string();
    let mut statuses = Vec::with_capacity(holds.len());
    for hold in holds {
        let held_rows = store.held_rows(control.client(), &hold).await.ok();
        let release_sql = format!(
            "DELETE FROM {hold_table} WHERE slot = '{}'",
            hold.slot.replace('\'', "''")
        );
        statuses.push(HoldStatus {
            hold,
            held_rows,
            release_sql,
        });
    }
    Ok(statuses)
}

/// The current WAL position: inserted on a primary (PostgreSQL 17+ may keep a whole
/// transaction in WAL buffers after an asynchronous commit, so the written position lags),
/// replayed on a standby.
async fn server_lsn(control: &Control) -> Result<Lsn, OpsError> {
    let row = control
        .client()
        .query_one(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                          ELSE pg_current_wal_insert_lsn() END)::text",
            &[],
        )
        .await
        .map_err(query_err("reading the server's WAL position"))?;
    let text: Option<String> = row.get(0);
    Ok(text.and_then(|t| t.parse().ok()).unwrap_or_default())
}

async fn holder(control: &Control, pid: i32) -> Result<Option<Holder>, OpsError> {
    let row = control
        .client()
        .query_opt(
            "SELECT application_name, client_addr::text, date_trunc('second', backend_start)::text
             FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .map_err(query_err("reading pg_stat_activity"))?;
    Ok(row.map(|r| Holder {
        application_name: r.get::<_, Option<String>>(0).filter(|a| !a.is_empty()),
        client_addr: r.get(1),
        backend_start: r.get(2),
    }))
}

fn slot_status(
    name: &str,
    info: Option<SlotInfo>,
    holder: Option<Holder>,
    server: Lsn,
) -> SlotStatus {
    let Some(info) = info else {
        return SlotStatus {
            name: name.to_string(),
            exists: false,
            active: false,
            active_pid: None,
            holder: None,
            plugin: None,
            wal_status: None,
            safe_wal_size_bytes: None,
            confirmed_flush_lsn: None,
            restart_lsn: None,
            lag_bytes: None,
            retained_wal_bytes: None,
            failover: None,
            synced: None,
        };
    };
    SlotStatus {
        name: info.name,
        exists: true,
        active: info.active,
        active_pid: info.active_pid,
        holder,
        plugin: info.plugin,
        wal_status: info.wal_status,
        safe_wal_size_bytes: info.safe_wal_size,
        lag_bytes: info.confirmed_flush_lsn.map(|c| c.bytes_until(server)),
        retained_wal_bytes: info.restart_lsn.map(|r| r.bytes_until(server)),
        confirmed_flush_lsn: info.confirmed_flush_lsn,
        restart_lsn: info.restart_lsn,
        failover: info.failover,
        synced: info.synced,
    }
}

async fn publication(control: &Control, name: &str) -> Result<PublicationStatus, OpsError> {
    let client = control.client();
    let flags = client
        .query_opt(
            "SELECT pubinsert, pubupdate, pubdelete, pubtruncate,
                    (to_jsonb(p) ->> 'pubviaroot')::bool
             FROM pg_publication p WHERE pubname = $1",
            &[&name],
        )
        .await
        .map_err(query_err("reading pg_publication"))?;
    let Some(flags) = flags else {
        return Ok(PublicationStatus {
            name: name.to_string(),
            exists: false,
            publishes: Vec::new(),
            tables: Vec::new(),
            roots: Vec::new(),
            via_partition_root: None,
        });
    };
    let publishes = ["insert", "update", "delete", "truncate"]
        .iter()
        .enumerate()
        .filter(|(i, _)| flags.get::<_, bool>(*i))
        .map(|(_, op)| op.to_string())
        .collect();
    let rows = client
        .query(
            "SELECT pt.schemaname::text || '.' || pt.tablename::text,
                    COALESCE(rn.nspname::text || '.' || rc.relname::text,
                             pt.schemaname::text || '.' || pt.tablename::text)
             FROM pg_publication_tables pt
             LEFT JOIN pg_class rc ON rc.oid = pg_partition_root(
                 format('%I.%I', pt.schemaname, pt.tablename)::regclass)
             LEFT JOIN pg_namespace rn ON rn.oid = rc.relnamespace
             WHERE pt.pubname = $1 ORDER BY 1",
            &[&name],
        )
        .await
        .map_err(query_err("reading pg_publication_tables"))?;
    let tables = rows.iter().map(|r| r.get(0)).collect();
    let mut roots: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
    roots.sort();
    roots.dedup();
    Ok(PublicationStatus {
        name: name.to_string(),
        exists: true,
        publishes,
        tables,
        roots,
        via_partition_root: flags.get(4),
    })
}

/// One outbox table's row count and oldest row; a missing table or column is reported, not an
/// error.
async fn outbox_table(
    control: &Control,
    config: &Config,
    table_config: &OutboxConfig,
    publication: &PublicationStatus,
) -> OutboxStatus {
    let (schema, table) = table_config.schema_and_table();
    let display = format!("{schema}.{table}");
    let mut status = OutboxStatus {
        published: publication.roots.contains(&display),
        table: display,
        partitions: None,
        exists: true,
        rows: None,
        oldest_created_at: None,
        oldest_age_seconds: None,
        error: None,
    };
    let relation = format!("{}.{}", quote_ident(&schema), quote_ident(&table));
    // count(*) and min() read every partition of a partitioned table; this only says how many.
    let partitions = control
        .client()
        .query_opt(
            "SELECT CASE WHEN c.relkind = 'p' THEN
                        (SELECT count(*) FROM pg_partition_tree(c.oid) t WHERE t.isleaf)
                    END
             FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
             WHERE n.nspname = $1 AND c.relname = $2",
            &[&schema, &table],
        )
        .await;
    status.partitions = partitions.ok().flatten().and_then(|r| r.get(0));
    let created_at = quote_ident(created_at_column(&config.outbox));
    let with_age = format!(
        "SELECT count(*), min({created_at})::text,
                extract(epoch FROM now() - min({created_at}))::float8
         FROM {relation}"
    );
    let result = match control.client().query_one(&with_age, &[]).await {
        // No created_at column: count only.
        Err(e) if sqlstate(&e) == Some("42703") => {
            let count_only = format!("SELECT count(*), NULL::text, NULL::float8 FROM {relation}");
            control.client().query_one(&count_only, &[]).await
        }
        other => other,
    };
    match result {
        Ok(row) => {
            status.rows = Some(row.get(0));
            status.oldest_created_at = row.get(1);
            status.oldest_age_seconds = row.get(2);
        }
        Err(e) => {
            status.exists = sqlstate(&e) != Some("42P01");
            status.error = Some(describe(&e));
        }
    }
    status
}

impl fmt::Display for StatusReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_slot(f, &self.slot, self.server_wal_lsn)?;
        write_publication(f, &self.publication)?;
        for outbox in &self.outbox {
            write_outbox(f, outbox, &self.publication)?;
        }
        for hold in &self.sweeper_holds {
            write_hold(f, hold)?;
        }
        if let Some(prefix) = &self.message_prefix {
            writeln!(
                f,
                "messages: pg_logical_emit_message(true, '{prefix}', …) events are relayed too"
            )?;
        }
        Ok(())
    }
}

fn write_slot(f: &mut fmt::Formatter<'_>, s: &SlotStatus, server: Lsn) -> fmt::Result {
    if !s.exists {
        writeln!(
            f,
            "slot `{}`: MISSING: create it with `outbox-relay slot create` (or let `outbox-relay run` create it)",
            s.name
        )?;
        return writeln!(f, "  server WAL    {server}");
    }
    match s.active_pid.filter(|_| s.active) {
        Some(pid) => writeln!(
            f,
            "slot `{}`: active in backend {pid}{}",
            s.name,
            describe_holder(s.holder.as_ref())
        )?,
        None => writeln!(
            f,
            "slot `{}`: inactive (no relay is streaming from it)",
            s.name
        )?,
    }
    let safe = match s.safe_wal_size_bytes {
        Some(n) if n < 0 => "exceeded".to_string(),
        Some(n) => format::bytes(n as u64),
        None => "unlimited".to_string(),
    };
    let wal_status = s.wal_status.as_deref().unwrap_or("unknown");
    writeln!(
        f,
        "  plugin {}, wal_status {wal_status}{}, safe_wal_size {safe}",
        s.plugin.as_deref().unwrap_or("none"),
        if wal_status == "lost" {
            " (events were lost: see `outbox-relay check`)"
        } else {
            ""
        }
    )?;
    let flag = |b: Option<bool>| {
        b.map_or(
            "n/a (before PostgreSQL 17)",
            |b| if b { "yes" } else { "no" },
        )
    };
    writeln!(
        f,
        "  failover      {}, synced {}",
        flag(s.failover),
        flag(s.synced)
    )?;
    let lsn = |l: Option<Lsn>| l.map_or("-".to_string(), |l| l.to_string());
    writeln!(f, "  confirmed     {}", lsn(s.confirmed_flush_lsn))?;
    writeln!(f, "  restart       {}", lsn(s.restart_lsn))?;
    writeln!(f, "  server WAL    {server}")?;
    let size = |b: Option<u64>| b.map_or("-".to_string(), format::bytes_exact);
    writeln!(f, "  lag           {}", size(s.lag_bytes))?;
    writeln!(f, "  retained WAL  {}", size(s.retained_wal_bytes))
}

fn write_hold(f: &mut fmt::Formatter<'_>, s: &HoldStatus) -> fmt::Result {
    let h = &s.hold;
    let rows = s
        .held_rows
        .map_or("its".to_string(), |n| format::count(n.max(0) as u64, "row"));
    writeln!(
        f,
        "sweeper hold on {}: {rows} committed before slot `{}` was created ({}, {}) are not deleted",
        h.table, h.slot, h.armed_at, h.reason
    )?;
    if h.keeps_every_row {
        // Armed before a creation that never finished (see `relay::sweeper::hold`).
        writeln!(f, "  the slot's creation did not finish, so every row is kept and none is swept: the relay completes the hold at its next session once the slot exists (its log says why not), or run `outbox-relay slot create`")?;
    }
    writeln!(f, "  release: `outbox-relay replay --since <start of the gap>` (every row since then, no id or type filter), or when the gap needs no replay `outbox-relay slot release-hold --yes` (SQL: {})", s.release_sql)
}

fn describe_holder(holder: Option<&Holder>) -> String {
    let Some(h) = holder else {
        return String::new();
    };
    let mut parts = Vec::new();
    if let Some(app) = &h.application_name {
        parts.push(format!("\"{app}\""));
    }
    if let Some(addr) = &h.client_addr {
        parts.push(format!("from {addr}"));
    }
    if let Some(start) = &h.backend_start {
        parts.push(format!("since {start}"));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(", "))
    }
}

fn write_publication(f: &mut fmt::Formatter<'_>, p: &PublicationStatus) -> fmt::Result {
    if !p.exists {
        return writeln!(
            f,
            "publication `{}`: MISSING: see `outbox-relay check` for the SQL",
            p.name
        );
    }
    let tables = if p.tables.is_empty() {
        "no tables".to_string()
    } else {
        p.tables.join(", ")
    };
    let publishes = if p.publishes.is_empty() {
        "nothing".to_string()
    } else {
        p.publishes.join(", ")
    };
    writeln!(
        f,
        "publication `{}`: publishes {publishes}; tables {tables}",
        p.name
    )
}

fn write_outbox(
    f: &mut fmt::Formatter<'_>,
    o: &OutboxStatus,
    publication: &PublicationStatus,
) -> fmt::Result {
    let unpublished = if o.published || !publication.exists {
        String::new()
    } else {
        format!(
            "; NOT in publication `{}`, so its inserts are not streamed (see `outbox-relay check`)",
            publication.name
        )
    };
    let unpublished = match o.partitions {
        Some(_) if o.published && publication.via_partition_root == Some(false) => format!(
            "{unpublished}; publication `{}` sends its partitions under their own names (the relay maps them to the table; `outbox-relay check` shows how to publish via the root)",
            publication.name
        ),
        _ => unpublished,
    };
    if let Some(error) = &o.error {
        return writeln!(f, "outbox {}: cannot read: {error}{unpublished}", o.table);
    }
    let rows = o.rows.unwrap_or(0);
    let rows = match o.partitions {
        Some(n) => format!("{rows} rows in {n} partitions"),
        None => format!("{rows} rows"),
    };
    match (&o.oldest_created_at, o.oldest_age_seconds) {
        (Some(oldest), Some(age)) => writeln!(
            f,
            "outbox {}: {rows}, oldest {oldest} ({} ago){unpublished}",
            o.table,
            format::duration(age)
        ),
        _ => writeln!(f, "outbox {}: {rows}{unpublished}", o.table),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> SlotInfo {
        SlotInfo {
            name: "s".into(),
            plugin: Some("pgoutput".into()),
            slot_type: "logical".into(),
            database: Some("db".into()),
            active: true,
            active_pid: Some(4211),
            restart_lsn: Some(Lsn(0x1000)),
            confirmed_flush_lsn: Some(Lsn(0x2000)),
            wal_status: Some("reserved".into()),
            safe_wal_size: None,
            failover: None,
            synced: None,
            temporary: false,
        }
    }

    #[test]
    fn lag_and_retained_wal_are_measured_from_the_server_position() {
        let s = slot_status("s", Some(info()), None, Lsn(0x2000 + 18_624));
        assert_eq!(s.lag_bytes, Some(18_624));
        assert_eq!(s.retained_wal_bytes, Some(0x1000 + 18_624));
        let missing = slot_status("s", None, None, Lsn(5));
        assert!(!missing.exists);
        assert_eq!(missing.lag_bytes, None);
    }

    #[test]
    fn text_shows_holder_sizes_and_lag() {
        let holder = Holder {
            application_name: Some("outbox-relay replication".into()),
            client_addr: Some("127.0.0.1/32".into()),
            backend_start: None,
        };
        let report = StatusReport {
            ok: true,
            server_wal_lsn: Lsn(0x2000 + 18_624),
            slot: slot_status("s", Some(info()), Some(holder), Lsn(0x2000 + 18_624)),
            publication: PublicationStatus {
                name: "p".into(),
                exists: true,
                publishes: vec!["insert".into()],
                tables: vec!["public.outbox".into()],
                roots: vec!["public.outbox".into()],
                via_partition_root: Some(true),
            },
            outbox: vec![
                OutboxStatus {
                    table: "public.outbox".into(),
                    exists: true,
                    published: true,
                    partitions: None,
                    rows: Some(12),
                    oldest_created_at: Some("2026-01-01 00:00:00+00".into()),
                    oldest_age_seconds: Some(185.0),
                    error: None,
                },
                OutboxStatus {
                    table: "app.events".into(),
                    exists: true,
                    published: false,
                    partitions: None,
                    rows: Some(0),
                    oldest_created_at: None,
                    oldest_age_seconds: None,
                    error: None,
                },
            ],
            message_prefix: Some("outbox".into()),
            sweeper_holds: vec![HoldStatus {
                hold: Hold {
                    slot: "s".into(),
                    table: "public.outbox".into(),
                    below_xid: 900,
                    slot_start: Some(Lsn(0x2000)),
                    armed_at: "2026-01-01 00:00:00+00".into(),
                    reason: "outbox-relay slot create".into(),
                    age_seconds: 60,
                    keeps_every_row: false,
                },
                held_rows: Some(7),
                release_sql:
                    "DELETE FROM \"public\".\"outbox_relay_sweeper_hold\" WHERE slot = 's'".into(),
            }],
        };
        let text = report.to_string();
        assert!(
            text.contains(
                "sweeper hold on public.outbox: 7 rows committed before slot `s` was created"
            ),
            "{text}"
        );
        assert!(
            text.contains("`outbox-relay slot release-hold --yes` (SQL: DELETE FROM"),
            "{text}"
        );
        assert!(
            text.contains(
                "active in backend 4211 (\"outbox-relay replication\", from 127.0.0.1/32)"
            ),
            "{text}"
        );
        assert!(
            text.contains("lag           18.2 KiB (18624 bytes)"),
            "{text}"
        );
        assert!(text.contains("safe_wal_size unlimited"), "{text}");
        assert!(
            text.contains("publishes insert; tables public.outbox"),
            "{text}"
        );
        assert!(
            text.contains("12 rows, oldest 2026-01-01 00:00:00+00 (3 min 5 s ago)"),
            "{text}"
        );
        assert!(
            text.contains("outbox app.events: 0 rows; NOT in publication `p`"),
            "{text}"
        );
        assert!(
            text.contains("pg_logical_emit_message(true, 'outbox', …)"),
            "{text}"
        );
        let json: serde_json::Value = serde_json::to_value(&report).unwrap();
        assert_eq!(json["outbox"][1]["table"], "app.events");
        assert_eq!(json["outbox"][1]["published"], false);
        assert_eq!(json["slot"]["lag_bytes"], 18_624);
        assert_eq!(json["slot"]["confirmed_flush_lsn"], "0/2000");
    }
}
