//! The PostgreSQL items of `check`: server settings, role, receive timeout, slot, sweeper holds;
//! the outbox tables' are in [`super::outbox_table`], the publication's in [`super::publication`].

use std::collections::HashMap;
use std::time::Duration;

use super::{ok, problem, warning, Item};
use crate::config::Config;
use crate::ops::format::{self, quote_literal};
use crate::ops::rows::OutboxTable;
use crate::ops::OpsError;
use crate::postgres::control::{query_err, quote_ident, Control, SlotInfo};
use crate::relay::sweeper::hold::{HoldStore, HOLD_TABLE};
use crate::source::walsender::check_receive_timeout;

/// What the server is and who we are on it, read once.
struct Server {
    settings: HashMap<String, String>,
    role: String,
    superuser: bool,
    replication: bool,
    /// Amazon RDS / Aurora (which has the role `rds_replication`): whether we are a member.
    /// There the right to stream comes from that membership; `ALTER ROLE … REPLICATION` is
    /// refused.
    rds_replication: Option<bool>,
    database: String,
    version: String,
    slots_used: i64,
    senders_used: i64,
}

impl Server {
    async fn read(control: &Control) -> Result<Server, OpsError> {
        let client = control.client();
        let settings = client
            .query(
                "SELECT name, setting FROM pg_settings WHERE name = ANY($1)",
                &[&vec![
                    "wal_level",
                    "max_replication_slots",
                    "max_wal_senders",
                    "max_slot_wal_keep_size",
                    "server_version",
                    "DateStyle",
                    "TimeZone",
                    "wal_sender_timeout",
                    // Managed services' switch for wal_level = logical.
                    "rds.logical_replication",
                    "cloudsql.logical_decoding",
                    "azure.replication_support",
                ]],
            )
            .await
            .map_err(query_err("reading pg_settings"))?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let row = client
            .query_one(
                "SELECT current_user::text, r.rolsuper, r.rolreplication, current_database()::text,
                        (SELECT count(*) FROM pg_replication_slots),
                        (SELECT count(*) FROM pg_stat_replication),
                        (SELECT pg_has_role(current_user, oid, 'MEMBER') FROM pg_roles
                          WHERE rolname = 'rds_replication')
                 FROM pg_roles r WHERE r.rolname = current_user",
                &[],
            )
            .await
            .map_err(query_err("reading the role and replication usage"))?;
        let mut server = Server {
            settings,
            role: row.get(0),
            superuser: row.get(1),
            replication: row.get(2),
            database: row.get(3),
            version: String::new(),
            slots_used: row.get(4),
            senders_used: row.get(5),
            rds_replication: row.get(6),
        };
        server.version = server.setting("server_version").to_string();
        Ok(server)
    }

    fn setting(&self, name: &str) -> &str {
        self.settings.get(name).map_or("", String::as_str)
    }

    fn number(&self, name: &str) -> i64 {
        self.setting(name).parse().unwrap_or(0)
    }
}

/// Every PostgreSQL item, in the order an operator fixes them. Returns the outbox tables that
/// exist, described for the topic sample.
pub(super) async fn postgres(
    control: &Control,
    config: &Config,
    items: &mut Vec<Item>,
) -> Vec<OutboxTable> {
    match super::failover::version(control.server()) {
        Ok(item) => items.push(item),
        Err(refused) => {
            items.push(refused);
            return Vec::new();
        }
    }
    let server = match Server::read(control).await {
        Ok(server) => server,
        Err(e) => {
            items.push(problem(
                "postgres",
                format!("cannot inspect the server: {e}"),
                "connect as a role that can read pg_settings and pg_roles",
            ));
            return Vec::new();
        }
    };
    items.push(ok(
        "postgres connection",
        format!(
            "connected to database \"{}\" as role \"{}\" (PostgreSQL {})",
            server.database, server.role, server.version
        ),
    ));
    items.push(wal_level(&server));
    items.push(date_style(&server, config));
    let slot = control.slot(&config.postgres.slot).await;
    let slot = match slot {
        Ok(slot) => slot,
        Err(e) => {
            items.push(problem(
                "slot",
                format!("cannot read pg_replication_slots: {e}"),
                "grant the role access to pg_replication_slots",
            ));
            None
        }
    };
    items.push(slot_capacity(&server, slot.is_some()));
    let streaming = slot.as_ref().is_some_and(|s| s.active);
    items.push(sender_capacity(&server, streaming));
    items.push(role(&server));
    items.push(receive_timeout(&server, config.postgres.receive_timeout_ms));
    let tables = super::outbox_table::outbox_tables(control, config, &server.role, items).await;
    items.push(super::privileges::privileges(control, config, &server.role).await);
    items.extend(super::publication::publication(control, config).await);
    items.extend(slot_items(config, slot.as_ref(), &server));
    items.extend(sweeper_holds(control, config).await);
    items.extend(super::failover::failover(control, config, slot.as_ref()).await);
    tables
}

fn wal_level(server: &Server) -> Item {
    let level = server.setting("wal_level");
    if level == "logical" {
        return ok("wal_level", "wal_level = logical");
    }
    problem(
        "wal_level",
        format!("wal_level = {level}: logical decoding is off, so no logical slot can be created or streamed"),
        wal_level_fix(server),
    )
}

/// How wal_level becomes logical here: each managed service has its own switch.
fn wal_level_fix(server: &Server) -> &'static str {
    let has = |name: &str| server.settings.contains_key(name);
    if has("rds.logical_replication") {
        "Amazon RDS / Aurora: set rds.logical_replication = 1 in the DB (cluster) parameter group, then reboot the instance"
    } else if has("cloudsql.logical_decoding") {
        "Cloud SQL: set the database flag cloudsql.logical_decoding = on (the instance restarts)"
    } else if has("azure.replication_support") {
        "Azure Database for PostgreSQL: set the server parameter azure.replication_support = logical (and wal_level = logical where offered), then restart the server"
    } else {
        "ALTER SYSTEM SET wal_level = 'logical'; then restart PostgreSQL (on a managed service: its parameter for it, e.g. rds.logical_replication = 1 on RDS)"
    }
}

/// pgoutput prints timestamps in the walsender's DateStyle, which neither the relay nor this
/// connection sets: both get the server's (or the database's, or the role's) default. The
/// relay reads `timestamp_column` values in the ISO style only.
fn date_style(server: &Server, config: &Config) -> Item {
    let style = server.setting("DateStyle");
    let zone = server.setting("TimeZone");
    let detail = format!("DateStyle = {style}, TimeZone = {zone}");
    if style.trim_start().to_ascii_uppercase().starts_with("ISO") {
        return ok(
            "DateStyle",
            format!("{detail}: timestamps arrive in ISO form"),
        );
    }
    let order = style.split_once(',').map_or("MDY", |(_, o)| o.trim());
    let fix = format!(
        "ALTER DATABASE {} SET DateStyle = 'ISO, {order}'; then restart the relay",
        quote_ident(&server.database)
    );
    let detail = format!("{detail}: pgoutput sends date and time values in this style, not ISO");
    let timestamps = config
        .outbox
        .table_configs()
        .iter()
        .any(|t| t.timestamp_column.is_some());
    if timestamps {
        problem(
            "DateStyle",
            format!("{detail}, and the relay reads timestamp_column values only in the ISO style"),
            fix,
        )
    } else {
        warning("DateStyle", detail, fix)
    }
}

fn slot_capacity(server: &Server, slot_exists: bool) -> Item {
    let max = server.number("max_replication_slots");
    let free = max - server.slots_used;
    let detail = format!(
        "{} of max_replication_slots = {max} in use, {free} free",
        server.slots_used
    );
    if slot_exists || free > 0 {
        return ok("replication slots", detail);
    }
    problem(
        "replication slots",
        format!("{detail}: the relay's slot cannot be created"),
        format!(
            "ALTER SYSTEM SET max_replication_slots = {}; then restart PostgreSQL (or drop an unused slot: SELECT pg_drop_replication_slot('<name>');)",
            max + 1
        ),
    )
}

fn sender_capacity(server: &Server, streaming: bool) -> Item {
    let max = server.number("max_wal_senders");
    let free = max - server.senders_used;
    let detail = format!(
        "{} of max_wal_senders = {max} in use, {free} free",
        server.senders_used
    );
    // A relay already streaming holds its sender; otherwise the relay needs one free.
    if streaming || free > 0 {
        return ok("wal senders", detail);
    }
    problem(
        "wal senders",
        format!("{detail}: the relay cannot open its replication connection"),
        format!(
            "ALTER SYSTEM SET max_wal_senders = {}; then restart PostgreSQL",
            max + 1
        ),
    )
}

/// One warning per sweeper hold on the slot: rows the sweeper keeps until a replay covers
/// them (see `relay::sweeper::hold`).
async fn sweeper_holds(control: &Control, config: &Config) -> Vec<Item> {
    let store = HoldStore::new(config);
    let holds = match store.list(control.client()).await {
        Ok(holds) => holds,
        Err(e) => {
            return vec![warning(
                "sweeper hold",
                format!("cannot read the sweeper holds: {e}"),
                "grant the role SELECT on outbox_relay_sweeper_hold",
            )]
        }
    };
    holds
        .iter()
        .map(|h| {
            if h.keeps_every_row {
                return warning(
                    "sweeper hold",
                    format!(
                        "the sweeper keeps every row of {}: a hold was armed before slot `{}` was created, and the creation did not finish ({}, {})",
                        h.table, h.slot, h.armed_at, h.reason
                    ),
                    "start the relay (it completes the hold once the slot exists) or run `outbox-relay slot create`; then replay the gap as for any hold",
                );
            }
            warning(
                "sweeper hold",
                format!(
                    "the sweeper keeps the rows of {} committed before slot `{}` was created ({}, {})",
                    h.table, h.slot, h.armed_at, h.reason
                ),
                format!(
                    "`outbox-relay replay --since <start of the gap>` (no id or type filter) releases it; or, if the gap needs no replay, DELETE FROM {} WHERE slot = {}",
                    store.relation().unwrap_or(HOLD_TABLE),
                    quote_literal(&h.slot)
                ),
            )
        })
        .collect()
}

/// An explicit `postgres.receive_timeout_ms` the server's `wal_sender_timeout` allows (the
/// relay refuses to connect otherwise; see [`check_receive_timeout`]).
fn receive_timeout(server: &Server, configured_ms: u64) -> Item {
    let check = "receive_timeout";
    let wal_sender_timeout =
        Duration::from_millis(server.number("wal_sender_timeout").max(0) as u64);
    match check_receive_timeout(configured_ms, wal_sender_timeout) {
        Err(too_low) => problem(
            check,
            too_low.to_string(),
            format!(
                "set postgres.receive_timeout_ms = 0 (derived) or at least {}",
                too_low.minimum_ms
            ),
        ),
        Ok(()) if configured_ms == 0 => ok(
            check,
            format!(
                "postgres.receive_timeout_ms = 0: derived from wal_sender_timeout = {} ms",
                wal_sender_timeout.as_millis()
            ),
        ),
        Ok(()) => ok(
            check,
            format!(
                "postgres.receive_timeout_ms = {configured_ms} outlasts half of wal_sender_timeout = {} ms",
                wal_sender_timeout.as_millis()
            ),
        ),
    }
}

fn role(server: &Server) -> Item {
    let role = &server.role;
    if server.superuser {
        return ok("role", format!("role \"{role}\" is a superuser"));
    }
    if server.replication {
        return ok("role", format!("role \"{role}\" has REPLICATION"));
    }
    match server.rds_replication {
        Some(true) => ok(
            "role",
            format!("role \"{role}\" is a member of rds_replication (Amazon RDS / Aurora)"),
        ),
        Some(false) => problem(
            "role",
            format!("role \"{role}\" is not a member of rds_replication: on Amazon RDS / Aurora it cannot stream from a replication slot without it"),
            format!("GRANT rds_replication TO {};", quote_ident(role)),
        ),
        None => problem(
            "role",
            format!("role \"{role}\" has neither REPLICATION nor superuser: it cannot stream from a replication slot"),
            format!("ALTER ROLE {} WITH REPLICATION;", quote_ident(role)),
        ),
    }
}

/// The slot exists (or will be created), uses pgoutput in this database, and keeps its WAL.
fn slot_items(config: &Config, slot: Option<&SlotInfo>, server: &Server) -> Vec<Item> {
    let name = &config.postgres.slot;
    let create_sql = format!(
        "SELECT pg_create_logical_replication_slot({}, 'pgoutput');",
        quote_literal(name)
    );
    let Some(slot) = slot else {
        let detail = format!("slot `{name}` does not exist yet");
        return vec![if config.postgres.create_slot {
            warning("slot", format!("{detail}; `outbox-relay run` creates it at start-up (postgres.create_slot = true), and rows committed before that are not relayed"), "create it now: `outbox-relay slot create`")
        } else {
            problem(
                "slot",
                format!("{detail} and postgres.create_slot is off"),
                format!("`outbox-relay slot create` (or {create_sql})"),
            )
        }];
    };
    let drop_sql = format!("SELECT pg_drop_replication_slot({});", quote_literal(name));
    if slot.slot_type != "logical" || slot.plugin.as_deref() != Some("pgoutput") {
        return vec![problem(
            "slot",
            format!("slot `{name}` is a {} slot with plugin {}; the relay needs a logical slot using pgoutput", slot.slot_type, slot.plugin.as_deref().unwrap_or("none")),
            format!("{drop_sql} then {create_sql} (or set postgres.slot to another name)"),
        )];
    }
    if slot.database.as_deref() != Some(server.database.as_str()) {
        return vec![problem(
            "slot",
            format!(
                "slot `{name}` belongs to database \"{}\", not \"{}\"",
                slot.database.as_deref().unwrap_or("?"),
                server.database
            ),
            "point postgres.url at that database, or set postgres.slot to a new name",
        )];
    }
    let holder = match slot.active_pid.filter(|_| slot.active) {
        Some(pid) => format!("active in backend {pid}"),
        None => "inactive".to_string(),
    };
    let confirmed = slot.confirmed_flush_lsn.unwrap_or_default();
    vec![
        ok(
            "slot",
            format!("slot `{name}` uses pgoutput, {holder}, confirmed up to {confirmed}"),
        ),
        slot_wal(name, slot, server),
    ]
}

fn slot_wal(name: &str, slot: &SlotInfo, server: &Server) -> Item {
    let status = slot.wal_status.as_deref().unwrap_or("unknown");
    let safe = match slot.safe_wal_size {
        Some(n) => format!("safe_wal_size {}", format::bytes(n.max(0) as u64)),
        None => {
            "no max_slot_wal_keep_size limit: a stopped relay lets WAL grow until the disk fills"
                .to_string()
        }
    };
    let detail = format!("slot `{name}`: wal_status {status}, {safe}");
    match status {
        "reserved" => ok("slot WAL", detail),
        "extended" => warning("slot WAL", format!("{detail}: the slot holds more WAL than max_wal_size, the relay is behind"), "start the relay or let it catch up; `outbox-relay status` shows the lag"),
        "unreserved" => problem("slot WAL", format!("{detail}: WAL the slot needs is about to be removed (max_slot_wal_keep_size = {})", server.setting("max_slot_wal_keep_size")), "start the relay now so it catches up, or raise max_slot_wal_keep_size: ALTER SYSTEM SET max_slot_wal_keep_size = '<larger>'; SELECT pg_reload_conf();"),
        "lost" => problem("slot WAL", format!("{detail}: the slot was invalidated and events were lost"), "`outbox-relay slot drop --yes`, `outbox-relay slot create`, then `outbox-relay replay --since <time of the last event consumers got>`"),
        _ => warning("slot WAL", detail, "see `outbox-relay status`"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::OutboxConfig;
    use crate::ops::check::Status;

    fn server(superuser: bool, replication: bool) -> Server {
        Server {
            settings: HashMap::from([
                ("wal_level".to_string(), "replica".to_string()),
                ("max_replication_slots".to_string(), "10".to_string()),
                ("max_wal_senders".to_string(), "10".to_string()),
            ]),
            role: "app\"user".into(),
            superuser,
            replication,
            rds_replication: None,
            database: "db".into(),
            version: "15".into(),
            slots_used: 10,
            senders_used: 3,
        }
    }
    #[test]
    fn a_receive_timeout_under_half_the_wal_sender_timeout_is_a_problem() {
        let mut s = server(true, true);
        s.settings
            .insert("wal_sender_timeout".into(), "60000".into());
        let item = receive_timeout(&s, 20_000);
        assert_eq!(item.status, Status::Problem);
        assert!(
            item.detail.contains("postgres.receive_timeout_ms"),
            "{}",
            item.detail
        );
        assert!(item.fix.unwrap().contains("31000"));
        assert_eq!(receive_timeout(&s, 31_000).status, Status::Ok);
        assert_eq!(receive_timeout(&s, 0).status, Status::Ok);
    }

    #[test]
    fn wal_level_replica_names_the_setting() {
        let item = wal_level(&server(true, true));
        assert_eq!(item.status, Status::Problem);
        assert!(item
            .fix
            .unwrap()
            .contains("ALTER SYSTEM SET wal_level = 'logical'"));
    }
    #[test]
    fn role_fix_quotes_the_role() {
        let item = role(&server(false, false));
        assert_eq!(item.status, Status::Problem);
        assert_eq!(
            item.fix.as_deref(),
            Some("ALTER ROLE \"app\"\"user\" WITH REPLICATION;")
        );
        assert_eq!(role(&server(false, true)).status, Status::Ok);
        assert_eq!(role(&server(true, false)).status, Status::Ok);
    }
    #[test]
    fn on_rds_the_right_comes_from_rds_replication_and_the_fix_is_a_grant() {
        let mut s = server(false, false);
        s.rds_replication = Some(true);
        assert_eq!(role(&s).status, Status::Ok);
        s.rds_replication = Some(false);
        let item = role(&s);
        assert_eq!(item.status, Status::Problem);
        assert_eq!(
            item.fix.as_deref(),
            Some("GRANT rds_replication TO \"app\"\"user\";")
        );
        s.settings
            .insert("rds.logical_replication".into(), "0".into());
        assert!(wal_level(&s)
            .fix
            .unwrap()
            .contains("rds.logical_replication = 1"));
        s.settings.remove("rds.logical_replication");
        s.settings
            .insert("cloudsql.logical_decoding".into(), "off".into());
        assert!(wal_level(&s)
            .fix
            .unwrap()
            .contains("cloudsql.logical_decoding = on"));
    }
    #[test]
    fn full_slots_are_a_problem_only_without_our_slot() {
        assert_eq!(
            slot_capacity(&server(true, true), false).status,
            Status::Problem
        );
        assert_eq!(slot_capacity(&server(true, true), true).status, Status::Ok);
        assert_eq!(
            sender_capacity(&server(true, true), false).status,
            Status::Ok
        );
    }
    fn config_with(outbox: OutboxConfig) -> Config {
        Config {
            outbox,
            ..Config::default()
        }
    }

    #[test]
    fn date_style_must_be_iso_for_timestamp_columns() {
        let mut s = server(true, true);
        s.settings.insert("DateStyle".into(), "ISO, MDY".into());
        s.settings.insert("TimeZone".into(), "Europe/Berlin".into());
        let mut outbox = OutboxConfig::default();
        assert_eq!(
            date_style(&s, &config_with(outbox.clone())).status,
            Status::Ok
        );
        s.settings.insert("DateStyle".into(), "SQL, DMY".into());
        assert_eq!(
            date_style(&s, &config_with(outbox.clone())).status,
            Status::Warning
        );
        outbox.tables.push(crate::config::OutboxTableConfig {
            table: "app.events".into(),
            timestamp_column: Some("at".into()),
            ..Default::default()
        });
        let item = date_style(&s, &config_with(outbox));
        assert_eq!(item.status, Status::Problem);
        assert_eq!(
            item.fix.as_deref(),
            Some(r#"ALTER DATABASE "db" SET DateStyle = 'ISO, DMY'; then restart the relay"#)
        );
    }
}
