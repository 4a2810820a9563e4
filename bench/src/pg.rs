//! The benchmark's PostgreSQL: connections, LSNs, and the databases and slots a phase makes
//! and drops.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

pub async fn pg_connect(url: &str) -> anyhow::Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connect to {url}"))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// `X/Y` (hex) → the 64-bit position.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    Some(u64::from_str_radix(hi, 16).ok()? << 32 | u64::from_str_radix(lo, 16).ok()?)
}

/// The benchmark cluster (`scripts/services.sh`'s, on 127.0.0.1).
#[derive(Clone)]
pub struct Cluster {
    pub port: u16,
}

impl Cluster {
    /// URL of database `db`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub async fn connect(&self, db: &str) -> anyhow::Result<Client> {
        let client = pg_connect(&self.url(db)).await?;
        client
            .batch_execute("SET client_min_messages = warning")
            .await?;
        Ok(client)
    }

    /// Drops database `db` and the slots that pin it (an interrupted run may leave some).
    pub async fn drop_database(&self, db: &str) -> anyhow::Result<()> {
        let admin = self.connect("postgres").await?;
        admin
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                 WHERE database = $1",
                &[&db],
            )
            .await
            .with_context(|| format!("drop the slots of {db}"))?;
        admin
            .batch_execute(&format!("DROP DATABASE IF EXISTS {db}"))
            .await
            .with_context(|| format!("drop database {db}"))?;
        Ok(())
    }

    /// A fresh database `db` with the outbox migration and the SQL files `scripts` (the
    /// preload procedures); returns a connection to it.
    pub async fn fresh_database(&self, db: &str, scripts: &[&Path]) -> anyhow::Result<Client> {
        self.drop_database(db).await?;
        let admin = self.connect("postgres").await?;
        admin
            .batch_execute(&format!("CREATE DATABASE {db}"))
            .await?;
        let client = self.connect(db).await?;
        for script in scripts {
            let text = std::fs::read_to_string(script)
                .with_context(|| format!("read {}", script.display()))?;
            client
                .batch_execute(&text)
                .await
                .with_context(|| format!("run {} on {db}", script.display()))?;
        }
        Ok(client)
    }
}

/// The first column of the first row of `query` (simple protocol, one statement), as text.
pub async fn scalar(client: &Client, query: &str) -> anyhow::Result<Option<String>> {
    let messages = client
        .simple_query(query)
        .await
        .with_context(|| format!("query `{query}`"))?;
    Ok(messages
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(row) => Some(row.get(0).map(str::to_string)),
            _ => None,
        })
        .flatten())
}

/// Creates logical slot `slot` (pgoutput).
pub async fn create_slot(client: &Client, slot: &str) -> anyhow::Result<()> {
    client
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await
        .with_context(|| format!("create slot {slot}"))?;
    Ok(())
}

pub async fn drop_slot(client: &Client, slot: &str) -> anyhow::Result<()> {
    client
        .execute("SELECT pg_drop_replication_slot($1)", &[&slot])
        .await
        .with_context(|| format!("drop slot {slot}"))?;
    Ok(())
}

/// The server's current WAL insert position.
pub async fn current_lsn(client: &Client) -> anyhow::Result<String> {
    scalar(client, "SELECT pg_current_wal_insert_lsn()")
        .await?
        .context("no current WAL position")
}

/// The pid of the walsender serving `slot`, if one does; an error if the slot is gone.
pub async fn slot_active_pid(client: &Client, slot: &str) -> anyhow::Result<Option<u32>> {
    let row = client
        .query_opt(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await?
        .with_context(|| format!("slot {slot} does not exist"))?;
    Ok(row.get::<_, Option<i32>>(0).map(|pid| pid as u32))
}

/// How often [`wait_slot_active`] asks: finely, since the moment it returns may start a
/// drain's clock (the Debezium peer's).
const ACTIVE_POLL: Duration = Duration::from_millis(10);

/// Waits up to `timeout` until a walsender serves `slot`; fails at once when `alive` says
/// that `who`, the client that should stream it, has exited.
pub async fn wait_slot_active(
    client: &Client,
    slot: &str,
    timeout: Duration,
    who: &str,
    mut alive: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while slot_active_pid(client, slot).await?.is_none() {
        if !alive() {
            bail!("{who} exited before it streamed slot {slot}");
        }
        if Instant::now() > deadline {
            bail!(
                "no walsender serves slot {slot} after {} s",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(ACTIVE_POLL).await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_parse_as_postgres_prints_them() {
        assert_eq!(parse_lsn("0/9F04550"), Some(0x9F0_4550));
        assert_eq!(parse_lsn("1/0"), Some(1 << 32));
        assert_eq!(parse_lsn("nope"), None);
    }
}
