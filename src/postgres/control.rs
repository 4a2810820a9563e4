//! The control connection: an ordinary tokio-postgres session for set-up and inspection
//! (publication, slot, settings, positions). Names are always quoted as identifiers or bound
//! as parameters; nothing is spliced into SQL unquoted.

use std::time::Duration;

use tokio_postgres::Client;
use tracing::{info, warn};

use crate::config::PostgresConfig;
use crate::lsn::Lsn;
use crate::postgres::conninfo::{
    ConnInfo, Endpoint, HostsError, NoHost, ServerState, SERVER_STATE_SQL,
};

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot connect to PostgreSQL ({target}): {}; check that the server is running and that postgres.url and the password are right", describe(.source))]
    Connect {
        target: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{what}: {}", describe(.source))]
    Query {
        what: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{0}")]
    Setup(String),
    #[error("slot `{slot}` is lost (wal_status = lost): PostgreSQL removed WAL it still needed, so events after {confirmed} may be missing. Recover with `outbox-relay slot drop --yes`, `outbox-relay slot create`, then `outbox-relay replay --since <time of the last good event>`")]
    SlotLost { slot: String, confirmed: Lsn },
    #[error("slot `{slot}` does not exist and postgres.create_slot is off: create it with `outbox-relay slot create`")]
    SlotMissing { slot: String },
    /// Several hosts, none usable.
    #[error(transparent)]
    Hosts(NoHost),
}

impl ControlError {
    pub fn is_transient(&self) -> bool {
        match self {
            // A refused login or a missing database will not heal by retrying.
            ControlError::Connect { source, .. } => source.as_db_error().is_none_or(|db| {
                !matches!(db.code().code(), "28P01" | "28000" | "3D000" | "42501")
            }),
            ControlError::Query { source, .. } => {
                source.is_closed()
                    || source
                        .as_db_error()
                        .is_none_or(|db| sqlstate_is_transient(db.code().code()))
            }
            ControlError::Hosts(all) => all.is_transient(),
            _ => false,
        }
    }
}

/// SQLSTATEs that heal by reconnecting: connection problems (08), operator intervention such
/// as a server shutdown or restart (57), insufficient resources (53), serialization failures.
pub fn sqlstate_is_transient(code: &str) -> bool {
    matches!(code.get(..2), Some("08" | "57" | "53")) || code == "40001" || code == "40P01"
}

/// A tokio-postgres error on one line with what the server said (its own Display is often just
/// "db error"): the server's message, SQLSTATE and hint, or the client error with its causes
/// ("connection refused"), which its Display leaves out.
pub fn describe(error: &tokio_postgres::Error) -> String {
    let text = match error.as_db_error() {
        Some(db) => {
            let mut text = format!("{} (SQLSTATE {})", db.message(), db.code().code());
            if let Some(hint) = db.hint() {
                text.push_str("; hint: ");
                text.push_str(hint);
            }
            text
        }
        None => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    };
    text.replace('\n', " ")
}

/// The SQLSTATE of a server error, if it is one.
pub fn sqlstate(error: &tokio_postgres::Error) -> Option<&str> {
    error.as_db_error().map(|db| db.code().code())
}

/// A slot as `pg_replication_slots` describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SlotInfo {
    pub name: String,
    pub plugin: Option<String>,
    pub slot_type: String,
    pub database: Option<String>,
    pub active: bool,
    pub active_pid: Option<i32>,
    pub restart_lsn: Option<Lsn>,
    pub confirmed_flush_lsn: Option<Lsn>,
    pub wal_status: Option<String>,
    pub safe_wal_size: Option<i64>,
    /// `failover` (PostgreSQL 17+; `None` before).
    pub failover: Option<bool>,
    /// `synced`: a copy kept by slot synchronization on a standby (17+).
    pub synced: Option<bool>,
    pub temporary: bool,
}

/// Quotes an SQL identifier: `"` doubled, wrapped in `"`.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `ALTER_REPLICATION_SLOT "slot" ( FAILOVER true )`: the replication command that turns
/// failover on for an existing slot (PostgreSQL 17+). The relay runs it; `check` prints it.
pub fn alter_failover_command(slot: &str) -> String {
    format!(
        "ALTER_REPLICATION_SLOT {} ( FAILOVER true )",
        quote_ident(slot)
    )
}

pub struct Control {
    client: Client,
    /// The host it reached, and what that server said about itself at connect time.
    endpoint: Endpoint,
    server: ServerState,
}

/// A certificate verification failure somewhere in the error chain: a set-up problem that
/// retrying will not fix.
fn certificate_problem(error: &tokio_postgres::Error) -> Option<String> {
    let mut source: Option<&dyn std::error::Error> = Some(error);
    while let Some(e) = source {
        let text = e.to_string();
        if text.contains("certificate verify failed") {
            return Some(text);
        }
        source = e.source();
    }
    None
}

/// Maps a query error to [`ControlError::Query`], naming what was being done.
pub fn query_err(what: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> ControlError {
    let what = what.into();
    move |source| ControlError::Query { what, source }
}

fn parse_lsn(text: Option<String>) -> Option<Lsn> {
    text.and_then(|t| t.parse().ok())
}

impl Control {
    /// Connects as `[postgres]` says (see [`ConnInfo`]).
    pub async fn connect(pg: &PostgresConfig) -> Result<Control, ControlError> {
        let info = ConnInfo::from_config(pg).map_err(|e| ControlError::Setup(e.to_string()))?;
        Control::open(&info).await
    }

    /// Connects to the first host of `info` whose server satisfies its
    /// `target_session_attrs`.
    pub async fn open(info: &ConnInfo) -> Result<Control, ControlError> {
        let make_tls = info
            .tls
            .make_tls()
            .map_err(|e| ControlError::Setup(e.to_string()))?;
        let opened = info
            .connect_first(
                |endpoint| open_one(info, endpoint, make_tls.clone()),
                ControlError::is_transient,
            )
            .await;
        match opened {
            Ok((client, endpoint, server)) => Ok(Control {
                client,
                endpoint,
                server,
            }),
            Err(HostsError::One(e)) => Err(e),
            Err(HostsError::All(all)) => Err(ControlError::Hosts(all)),
        }
    }

    /// The host this connection reached.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The server's role and version as seen at connect time.
    pub fn server(&self) -> ServerState {
        self.server
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The cluster's system identifier and the connection's database: with the slot's name,
    /// who writes an exactly-once progress value.
    pub async fn system_identity(&self) -> Result<(String, String), ControlError> {
        let row = self
            .client
            .query_one(
                "SELECT system_identifier::text, current_database()::text FROM pg_control_system()",
                &[],
            )
            .await
            .map_err(query_err("reading the database's system identifier"))?;
        Ok((row.get(0), row.get(1)))
    }

    /// `pg_current_wal_insert_lsn()`; `None` where it cannot be read (a standby).
    pub async fn wal_insert_lsn(&self) -> Option<Lsn> {
        let row = self
            .client
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .ok()?;
        row.get::<_, String>(0).parse().ok()
    }

    pub async fn slot(&self, slot: &str) -> Result<Option<SlotInfo>, ControlError> {
        let row = self
            .client
            .query_opt(
                "SELECT slot_name::text, plugin::text, slot_type, database::text, active, active_pid,
                        restart_lsn::text, confirmed_flush_lsn::text, wal_status, safe_wal_size,
                        (to_jsonb(s) ->> 'failover')::bool, (to_jsonb(s) ->> 'synced')::bool,
                        temporary
                 FROM pg_replication_slots s WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(query_err("reading pg_replication_slots"))?;
        Ok(row.map(|r| SlotInfo {
            name: r.get(0),
            plugin: r.get(1),
            slot_type: r.get(2),
            database: r.get(3),
            active: r.get(4),
            active_pid: r.get(5),
            restart_lsn: parse_lsn(r.get(6)),
            confirmed_flush_lsn: parse_lsn(r.get(7)),
            wal_status: r.get(8),
            safe_wal_size: r.get(9),
            failover: r.get(10),
            synced: r.get(11),
            temporary: r.get(12),
        }))
    }

    /// Creates the logical slot (pgoutput) when missing, as a failover slot (PostgreSQL 17+)
    /// when `failover`; returns whether it was created.
    pub async fn create_slot(&self, slot: &str, failover: bool) -> Result<bool, ControlError> {
        if self.slot(slot).await?.is_some() {
            return Ok(false);
        }
        if failover {
            self.require_failover_slots()?;
            self.client
                .execute(
                    "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)",
                    &[&slot],
                )
                .await
                .map_err(query_err(format!("creating failover slot `{slot}`")))?;
        } else {
            self.client
                .execute(
                    "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                    &[&slot],
                )
                .await
                .map_err(query_err(format!("creating slot `{slot}`")))?;
        }
        info!(
            slot,
            failover, "created logical replication slot (pgoutput)"
        );
        Ok(true)
    }

    /// Failover slots need PostgreSQL 17.
    pub fn require_failover_slots(&self) -> Result<(), ControlError> {
        if self.server.version_num < 170000 {
            return Err(ControlError::Setup(format!(
                "postgres.failover_slot = true needs PostgreSQL 17 or newer, and {} runs {}: set failover_slot = \"auto\" or \"false\"",
                self.endpoint.target(),
                crate::postgres::conninfo::version_name(self.server.version_num)
            )));
        }
        Ok(())
    }

    /// Checks the slot can be streamed by us and returns it; creates it when allowed (as a
    /// failover slot when `failover`).
    pub async fn prepare_slot(
        &self,
        slot: &str,
        create: bool,
        failover: bool,
    ) -> Result<SlotInfo, ControlError> {
        if create {
            self.create_slot(slot, failover).await?;
        }
        let info = self
            .slot(slot)
            .await?
            .ok_or_else(|| ControlError::SlotMissing { slot: slot.into() })?;
        check_slot_usable(&info)?;
        Ok(info)
    }

    /// Whether a relay recorded (with [`Control::mark_streamed`]) that it streamed `slot`
    /// through `publication`: the mark lives in the publication's comment, which travels with
    /// the database to a promoted standby, so a relay restarted after a failover knows that a
    /// missing slot means lost events rather than a first start.
    pub async fn streamed_before(
        &self,
        publication: &str,
        slot: &str,
    ) -> Result<bool, ControlError> {
        let comment = self.publication_comment(publication).await?;
        Ok(comment
            .as_deref()
            .is_some_and(|c| c.lines().any(|l| l == streamed_mark(slot))))
    }

    /// Records that `slot` is streamed through `publication` (see
    /// [`Control::streamed_before`]). Leaves a comment someone else wrote alone: returns false
    /// then, or when the role may not comment on the publication.
    pub async fn mark_streamed(&self, publication: &str, slot: &str) -> Result<bool, ControlError> {
        let mark = streamed_mark(slot);
        let comment = self.publication_comment(publication).await?;
        let lines: Vec<&str> = comment.as_deref().unwrap_or("").lines().collect();
        if lines.contains(&mark.as_str()) {
            return Ok(true);
        }
        if lines.iter().any(|l| !l.starts_with(STREAMED_MARK_PREFIX)) {
            return Ok(false);
        }
        let mut text = lines.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&mark);
        let sql = format!(
            "COMMENT ON PUBLICATION {} IS '{}'",
            quote_ident(publication),
            text.replace('\'', "''")
        );
        Ok(self.client.batch_execute(&sql).await.is_ok())
    }

    async fn publication_comment(&self, publication: &str) -> Result<Option<String>, ControlError> {
        let row = self
            .client
            .query_opt(
                "SELECT obj_description(oid, 'pg_publication') FROM pg_publication WHERE pubname = $1",
                &[&publication],
            )
            .await
            .map_err(query_err("reading the publication's comment"))?;
        Ok(row.and_then(|r| r.get(0)))
    }

    /// The server's `wal_sender_timeout`, which bounds our status update interval.
    pub async fn wal_sender_timeout(&self) -> Result<Duration, ControlError> {
        let row = self
            .client
            .query_one(
                "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'",
                &[],
            )
            .await
            .map_err(query_err("reading wal_sender_timeout"))?;
        let ms: i64 = row.get(0);
        Ok(Duration::from_millis(ms.max(0) as u64))
    }

    /// The client, mutable: for transactions and portals (`outbox-relay replay` pages through
    /// the outbox table in one snapshot).
    pub fn client_mut(&mut self) -> &mut Client {
        &mut self.client
    }

    /// Makes the publication cover every outbox table (`(schema, table)`; may be empty for a
    /// message-only outbox): creates it `WITH (publish = 'insert')` when missing, or adds the
    /// tables it lacks (unless it is `FOR ALL TABLES`). Returns the tables added.
    pub async fn ensure_publication_tables(
        &self,
        publication: &str,
        tables: &[(String, String)],
    ) -> Result<Vec<(String, String)>, ControlError> {
        let all_tables: Option<bool> = self
            .client
            .query_opt(
                "SELECT puballtables FROM pg_publication WHERE pubname = $1",
                &[&publication],
            )
            .await
            .map_err(query_err("checking the publication"))?
            .map(|r| r.get(0));
        let Some(all_tables) = all_tables else {
            self.create_publication(publication, tables).await?;
            return Ok(tables.to_vec());
        };
        if all_tables {
            return Ok(Vec::new());
        }
        let published = self.publication_tables(publication).await?;
        let missing: Vec<(String, String)> = tables
            .iter()
            .filter(|t| !published.contains(t))
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(missing);
        }
        let sql = format!(
            "ALTER PUBLICATION {} ADD TABLE {}",
            quote_ident(publication),
            quoted_tables(&missing)
        );
        self.client
            .batch_execute(&sql)
            .await
            .map_err(query_err(format!(
                "adding outbox tables to publication `{publication}`"
            )))?;
        info!(publication, tables = %quoted_tables(&missing), "added outbox tables to the publication");
        Ok(missing)
    }

    /// `CREATE PUBLICATION … FOR TABLE <tables>` with the relay's options (inserts only), or
    /// for no table yet when the outbox is message-only.
    async fn create_publication(
        &self,
        publication: &str,
        tables: &[(String, String)],
    ) -> Result<(), ControlError> {
        let target = if tables.is_empty() {
            String::new()
        } else {
            format!(" FOR TABLE {}", quoted_tables(tables))
        };
        let sql = format!(
            "CREATE PUBLICATION {}{target} WITH ({})",
            quote_ident(publication),
            self.publication_options().await?
        );
        self.client
            .batch_execute(&sql)
            .await
            .map_err(query_err(format!("creating publication `{publication}`")))?;
        info!(publication, tables = %quoted_tables(tables), "created publication (inserts only)");
        Ok(())
    }

    /// The tables the publication names, as `(schema, table)`. pg_publication_tables lists the
    /// leaves instead of a partitioned table when the publication does not publish via the
    /// root; pg_publication_rel names what was added: both count.
    async fn publication_tables(
        &self,
        publication: &str,
    ) -> Result<Vec<(String, String)>, ControlError> {
        Ok(self
            .client
            .query(
                "SELECT schemaname::text, tablename::text FROM pg_publication_tables WHERE pubname = $1
                 UNION
                 SELECT n.nspname::text, c.relname::text
                 FROM pg_publication_rel r
                 JOIN pg_publication p ON p.oid = r.prpubid
                 JOIN pg_class c ON c.oid = r.prrelid
                 JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE p.pubname = $1",
                &[&publication],
            )
            .await
            .map_err(query_err("listing the publication's tables"))?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect())
    }
}

/// `schema.table, …`, each name quoted: the table list of a publication statement.
fn quoted_tables(tables: &[(String, String)]) -> String {
    tables
        .iter()
        .map(|(s, t)| format!("{}.{}", quote_ident(s), quote_ident(t)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `WITH (...)` options of a publication the relay creates: inserts only and, from
/// PostgreSQL 13 on, changes of a partitioned outbox under the partitioned table's own name
/// (otherwise pgoutput names the leaf partition the row was routed to).
pub fn publication_options(server_version_num: i32) -> &'static str {
    if server_version_num >= 130000 {
        "publish = 'insert', publish_via_partition_root = true"
    } else {
        "publish = 'insert'"
    }
}

impl Control {
    /// [`publication_options`] for the connected server.
    pub async fn publication_options(&self) -> Result<&'static str, ControlError> {
        let version: i32 = self
            .client
            .query_one("SELECT current_setting('server_version_num')::int4", &[])
            .await
            .map_err(query_err("reading server_version_num"))?
            .get(0);
        Ok(publication_options(version))
    }

    /// The table a relation is published as: for a partition (at any depth) the root of its
    /// partition tree, else the relation itself, as `(schema, table)`. `relid` is the pg_class
    /// OID, which is what a pgoutput Relation message carries. `None` when no relation has
    /// that OID any more (dropped since the change was written).
    ///
    /// This reads the *current* catalog: a partition detached after the change was written
    /// resolves to itself.
    pub async fn partition_root(
        &self,
        relid: u32,
    ) -> Result<Option<(String, String)>, ControlError> {
        let row = self
            .client
            .query_opt(
                "SELECT n.nspname::text, c.relname::text
                 FROM (SELECT $1::oid AS relid) r
                 JOIN pg_class c
                   ON c.oid = COALESCE(pg_partition_root(r.relid::regclass)::oid, r.relid)
                 JOIN pg_namespace n ON n.oid = c.relnamespace",
                &[&relid],
            )
            .await
            .map_err(query_err(format!(
                "resolving relation {relid} to its partition root"
            )))?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }
}

/// The slot's health as sampled for metrics: lag, retained WAL, wal_status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotSample {
    pub lag_bytes: Option<i64>,
    pub retained_bytes: Option<i64>,
    pub wal_status: Option<String>,
    pub confirmed_flush_lsn: Option<Lsn>,
}

/// Who holds an active slot, from `pg_replication_slots` and `pg_stat_replication`.
#[derive(Debug, Clone, PartialEq)]
pub struct SlotHolder {
    pub pid: i32,
    pub application_name: Option<String>,
    pub client_addr: Option<String>,
    /// Seconds since PostgreSQL last heard a status update from the holder.
    pub reply_age_secs: Option<f64>,
}

/// Queries the relay itself needs while running (sampling, standby).
impl Control {
    /// `None` when the slot does not exist. On a standby (decoding there, PostgreSQL 16+)
    /// the lag is measured from what it replayed: it has no WAL insert position.
    pub async fn sample_slot(&self, slot: &str) -> Result<Option<SlotSample>, ControlError> {
        let row = self
            .client
            .query_opt(
                "WITH head AS (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
                                           ELSE pg_current_wal_insert_lsn() END AS lsn)
                 SELECT (head.lsn - confirmed_flush_lsn)::bigint,
                        (head.lsn - restart_lsn)::bigint,
                        wal_status, confirmed_flush_lsn::text
                 FROM pg_replication_slots, head WHERE slot_name = $1",
                &[&slot],
            )
            .await
            .map_err(query_err("sampling the slot"))?;
        Ok(row.map(|r| SlotSample {
            lag_bytes: r.get(0),
            retained_bytes: r.get(1),
            wal_status: r.get(2),
            confirmed_flush_lsn: parse_lsn(r.get(3)),
        }))
    }

    /// The backend streaming the slot, if any.
    pub async fn slot_holder(&self, slot: &str) -> Result<Option<SlotHolder>, ControlError> {
        let row = self
            .client
            .query_opt(
                "SELECT s.active_pid, r.application_name, r.client_addr::text,
                        EXTRACT(EPOCH FROM now() - COALESCE(r.reply_time, r.backend_start))::float8
                 FROM pg_replication_slots s
                 LEFT JOIN pg_stat_replication r ON r.pid = s.active_pid
                 WHERE s.slot_name = $1 AND s.active_pid IS NOT NULL",
                &[&slot],
            )
            .await
            .map_err(query_err("finding the slot's holder"))?;
        Ok(row.map(|r| SlotHolder {
            pid: r.get(0),
            application_name: r.get(1),
            client_addr: r.get(2),
            reply_age_secs: r.get(3),
        }))
    }

    /// Ends a backend (`pg_terminate_backend`); true when it was signalled.
    pub async fn terminate_backend(&self, pid: i32) -> Result<bool, ControlError> {
        let row = self
            .client
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .await
            .map_err(query_err(format!("terminating backend {pid}")))?;
        Ok(row.get(0))
    }
}

/// One host: connect, then ask the server its role and version.
async fn open_one(
    info: &ConnInfo,
    endpoint: Endpoint,
    make_tls: postgres_openssl::MakeTlsConnector,
) -> Result<(Client, ServerState), ControlError> {
    let config = info.tokio_config(&endpoint, "outbox-relay control");
    let target = endpoint.target();
    let (client, connection) =
        config
            .connect(make_tls)
            .await
            .map_err(|source| match certificate_problem(&source) {
                Some(why) => ControlError::Setup(format!(
                    "TLS to PostgreSQL ({target}) failed: {why}; check postgres.ssl_root_cert (the CA that signed the server's certificate) and that the host name matches it"
                )),
                None => ControlError::Connect { target: target.clone(), source },
            })?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            warn!(error = %error, "control connection closed");
        }
    });
    let row = client
        .query_one(SERVER_STATE_SQL, &[])
        .await
        .map_err(query_err(format!(
            "asking {target} for its role and version"
        )))?;
    let state = ServerState::from_row(row.get(0), row.get(1), row.get(2)).ok_or_else(|| {
        ControlError::Setup(format!(
            "{target} returned an unreadable server_version_num"
        ))
    })?;
    Ok((client, state))
}

const STREAMED_MARK_PREFIX: &str = "outbox-relay streams slot ";

/// The publication comment line that records a streamed slot.
fn streamed_mark(slot: &str) -> String {
    format!("{STREAMED_MARK_PREFIX}{slot}")
}

/// A slot we can stream: logical, pgoutput, not lost.
pub fn check_slot_usable(info: &SlotInfo) -> Result<(), ControlError> {
    if info.slot_type != "logical" || info.plugin.as_deref() != Some("pgoutput") {
        return Err(ControlError::Setup(format!(
            "slot `{}` is a {} slot with plugin {:?}; outbox-relay needs a logical slot using pgoutput: drop it or configure another postgres.slot",
            info.name, info.slot_type, info.plugin
        )));
    }
    if info.wal_status.as_deref() == Some("lost") {
        return Err(ControlError::SlotLost {
            slot: info.name.clone(),
            confirmed: info.confirmed_flush_lsn.unwrap_or_default(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(quote_ident("outbox"), "\"outbox\"");
        assert_eq!(quote_ident("we\"ird; drop"), "\"we\"\"ird; drop\"");
    }

    fn slot(plugin: &str, status: &str) -> SlotInfo {
        SlotInfo {
            name: "s".into(),
            plugin: Some(plugin.into()),
            slot_type: "logical".into(),
            database: Some("db".into()),
            active: false,
            active_pid: None,
            restart_lsn: None,
            confirmed_flush_lsn: Some(Lsn(7)),
            wal_status: Some(status.into()),
            safe_wal_size: None,
            failover: None,
            synced: None,
            temporary: false,
        }
    }

    #[test]
    fn publications_publish_via_the_partition_root_where_possible() {
        assert_eq!(
            publication_options(150004),
            "publish = 'insert', publish_via_partition_root = true"
        );
        assert_eq!(publication_options(120010), "publish = 'insert'");
    }

    #[test]
    fn only_live_pgoutput_slots_are_usable() {
        assert!(check_slot_usable(&slot("pgoutput", "reserved")).is_ok());
        assert!(check_slot_usable(&slot("test_decoding", "reserved")).is_err());
        let lost = check_slot_usable(&slot("pgoutput", "lost")).unwrap_err();
        assert!(lost.to_string().contains("replay"), "{lost}");
    }
}
