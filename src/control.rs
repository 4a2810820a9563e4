//! The control connection: an ordinary tokio-postgres session for set-up and inspection
//! (publication, slot, settings, positions). Names are always quoted as identifiers or bound
//! as parameters; nothing is spliced into SQL unquoted.

use std::time::Duration;

use tokio_postgres::{Client, NoTls};
use tracing::{info, warn};

use crate::lsn::Lsn;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot connect to PostgreSQL ({target}): {source}")]
    Connect {
        target: String,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{what}: {source}")]
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
}

impl ControlError {
    pub fn is_transient(&self) -> bool {
        match self {
            ControlError::Connect { .. } => true,
            ControlError::Query { source, .. } => {
                source.is_closed() || source.as_db_error().is_none()
            }
            _ => false,
        }
    }
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
}

/// Quotes an SQL identifier: `"` doubled, wrapped in `"`.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

pub struct Control {
    client: Client,
}

fn query_err(what: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> ControlError {
    let what = what.into();
    move |source| ControlError::Query { what, source }
}

fn parse_lsn(text: Option<String>) -> Option<Lsn> {
    text.and_then(|t| t.parse().ok())
}

impl Control {
    /// Connects; `password` (from a file or the environment) wins over the URL's.
    pub async fn connect(
        url: &str,
        password: Option<&str>,
        timeout: Duration,
    ) -> Result<Control, ControlError> {
        let mut config: tokio_postgres::Config =
            url.parse().map_err(|source| ControlError::Connect {
                target: "the configured URL".into(),
                source,
            })?;
        if let Some(p) = password {
            config.password(p);
        }
        config.connect_timeout(timeout);
        config.application_name("outbox-relay control");
        let target = describe_target(&config);
        let (client, connection) = config
            .connect(NoTls)
            .await
            .map_err(|source| ControlError::Connect { target, source })?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                warn!(error = %error, "control connection closed");
            }
        });
        Ok(Control { client })
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Creates the publication for the outbox table when it does not exist.
    pub async fn ensure_publication(
        &self,
        publication: &str,
        schema: &str,
        table: &str,
    ) -> Result<bool, ControlError> {
        let exists = self
            .client
            .query_opt(
                "SELECT 1 FROM pg_publication WHERE pubname = $1",
                &[&publication],
            )
            .await
            .map_err(query_err("checking the publication"))?
            .is_some();
        if exists {
            return Ok(false);
        }
        let sql = format!(
            "CREATE PUBLICATION {} FOR TABLE {}.{} WITH (publish = 'insert')",
            quote_ident(publication),
            quote_ident(schema),
            quote_ident(table)
        );
        self.client
            .batch_execute(&sql)
            .await
            .map_err(query_err(format!("creating publication `{publication}`")))?;
        info!(
            publication,
            schema, table, "created publication (inserts only)"
        );
        Ok(true)
    }

    pub async fn slot(&self, slot: &str) -> Result<Option<SlotInfo>, ControlError> {
        let row = self
            .client
            .query_opt(
                "SELECT slot_name::text, plugin::text, slot_type, database::text, active, active_pid,
                        restart_lsn::text, confirmed_flush_lsn::text, wal_status, safe_wal_size
                 FROM pg_replication_slots WHERE slot_name = $1",
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
        }))
    }

    /// Creates the logical slot (pgoutput) when missing; returns whether it was created.
    pub async fn create_slot(&self, slot: &str) -> Result<bool, ControlError> {
        if self.slot(slot).await?.is_some() {
            return Ok(false);
        }
        self.client
            .execute(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&slot],
            )
            .await
            .map_err(query_err(format!("creating slot `{slot}`")))?;
        info!(slot, "created logical replication slot (pgoutput)");
        Ok(true)
    }

    /// Checks the slot can be streamed by us and returns it; creates it when allowed.
    pub async fn prepare_slot(&self, slot: &str, create: bool) -> Result<SlotInfo, ControlError> {
        if create {
            self.create_slot(slot).await?;
        }
        let info = self
            .slot(slot)
            .await?
            .ok_or_else(|| ControlError::SlotMissing { slot: slot.into() })?;
        check_slot_usable(&info)?;
        Ok(info)
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

    /// The server's current WAL write position.
    pub async fn current_wal_lsn(&self) -> Result<Lsn, ControlError> {
        let row = self
            .client
            .query_one("SELECT pg_current_wal_lsn()::text", &[])
            .await
            .map_err(query_err("reading the current WAL position"))?;
        let text: String = row.get(0);
        text.parse()
            .map_err(|e| ControlError::Setup(format!("server returned a bad LSN: {e}")))
    }
}

fn describe_target(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
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
        }
    }

    #[test]
    fn only_live_pgoutput_slots_are_usable() {
        assert!(check_slot_usable(&slot("pgoutput", "reserved")).is_ok());
        assert!(check_slot_usable(&slot("test_decoding", "reserved")).is_err());
        let lost = check_slot_usable(&slot("pgoutput", "lost")).unwrap_err();
        assert!(lost.to_string().contains("replay"), "{lost}");
    }
}
