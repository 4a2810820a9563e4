//! The version and high-availability items of `check`: which PostgreSQL the relay reached and
//! what that version enables; whether the slot will survive a failover (failover slot on the
//! primary, `synchronized_standby_slots`) and, for every other host of `postgres.url` it can
//! reach, whether that standby keeps a synchronized, persistent copy of the slot.

use super::{ok, problem, warning, Item};
use crate::config::{Config, FailoverSlot};
use crate::postgres::conninfo::{version_name, ConnInfo, ServerState, SessionAttrs};
use crate::postgres::control::{Control, SlotInfo};

/// `Err` with the one-line refusal when the server is too old (the other items then stop).
pub(super) fn version(server: ServerState) -> Result<Item, Item> {
    if let Some(why) = server.unsupported() {
        return Err(problem(
            "postgres version",
            why,
            "upgrade PostgreSQL to 14 or newer (14 to 18 are supported)",
        ));
    }
    let major = server.version_num / 10000;
    let mut enables = vec!["logical messages (pg_logical_emit_message)"];
    enables.push(if major >= 15 {
        "empty transactions skipped by pgoutput"
    } else {
        "no skipping of empty transactions (every transaction of the database is streamed as BEGIN/COMMIT)"
    });
    if major >= 16 {
        enables.push("logical decoding on a standby");
    }
    if major >= 17 {
        enables.push("failover slots");
    }
    Ok(ok(
        "postgres version",
        format!(
            "PostgreSQL {}{}: {}",
            version_name(server.version_num),
            if server.in_recovery {
                " (a standby)"
            } else {
                ""
            },
            enables.join(", ")
        ),
    ))
}

/// Failover items: the slot's flag and `synchronized_standby_slots` on the primary, then each
/// reachable standby of the URL.
pub(super) async fn failover(
    control: &Control,
    config: &Config,
    slot: Option<&SlotInfo>,
) -> Vec<Item> {
    let server = control.server();
    let name = &config.postgres.slot;
    let mut items = Vec::new();
    if server.in_recovery {
        items.push(ok(
            "failover slot",
            format!("connected to a standby ({}): the relay decodes from a slot of the standby itself (PostgreSQL 16+, needs hot_standby_feedback = on); that slot is not synchronized anywhere, see docs/src/guides/high-availability.md#decoding-on-a-standby-postgresql-16", control.endpoint().target()),
        ));
        return items;
    }
    let wanted = config.postgres.failover_slot.wanted(server.version_num);
    if server.version_num < 170000 {
        let item = if config.postgres.failover_slot == FailoverSlot::True {
            problem(
                "failover slot",
                format!(
                    "postgres.failover_slot = true, but PostgreSQL {} has no failover slots (17+)",
                    version_name(server.version_num)
                ),
                "upgrade to PostgreSQL 17, or set postgres.failover_slot = \"auto\"",
            )
        } else {
            warning(
                "failover slot",
                format!("PostgreSQL {} has no failover slots: a promoted standby has no copy of slot `{name}`, and the relay stops (exit 3) after a failover", version_name(server.version_num)),
                "PostgreSQL 17+ keeps the slot across a failover; until then see docs/src/guides/high-availability.md#without-failover-slots for the recovery",
            )
        };
        items.push(item);
        return items;
    }
    if !wanted {
        items.push(warning(
            "failover slot",
            format!("postgres.failover_slot = false: slot `{name}` is not synchronized to standbys; a failover loses it"),
            "set postgres.failover_slot = \"auto\"",
        ));
        return items;
    }
    items.push(match slot.map(|s| s.failover) {
        None => ok(
            "failover slot",
            format!("slot `{name}` will be created with FAILOVER by `outbox-relay run`"),
        ),
        Some(Some(true)) => ok("failover slot", format!("slot `{name}` is a failover slot")),
        Some(_) => warning(
            "failover slot",
            format!("slot `{name}` is not a failover slot; `outbox-relay run` turns failover on"),
            format!(
                "nothing to do, or run `{}` over a replication connection",
                crate::postgres::control::alter_failover_command(name)
            ),
        ),
    });
    let standby_slots = setting(control, "synchronized_standby_slots").await;
    items.push(match standby_slots.as_deref() {
        Some("") => warning(
            "synchronized_standby_slots",
            "empty on the primary: the relay can confirm changes a standby has not received, and that standby's copy of the slot is then unusable after a promotion",
            "ALTER SYSTEM SET synchronized_standby_slots = '<physical slot of each standby>'; SELECT pg_reload_conf();",
        ),
        Some(v) => ok("synchronized_standby_slots", format!("`{v}` on the primary")),
        None => warning(
            "synchronized_standby_slots",
            "cannot read it on the primary",
            "grant the role pg_read_all_settings",
        ),
    });
    items.extend(standbys(control, config).await);
    items
}

/// Every other host of the URL: reachable, a standby, set up to keep the slot.
async fn standbys(control: &Control, config: &Config) -> Vec<Item> {
    let Ok(info) = ConnInfo::from_config(&config.postgres) else {
        return Vec::new();
    };
    let name = &config.postgres.slot;
    let mut items = Vec::new();
    for endpoint in info.endpoints.iter().filter(|e| *e != control.endpoint()) {
        let target = endpoint.target();
        let check = format!("standby {target}");
        let mut one = info.pinned(endpoint);
        one.session_attrs = SessionAttrs::Any;
        let standby = match Control::open(&one).await {
            Ok(c) => c,
            Err(e) => {
                items.push(warning(
                    &check,
                    format!("not reachable, not checked: {e}"),
                    "check it from a host that reaches it",
                ));
                continue;
            }
        };
        if !standby.server().in_recovery {
            items.push(warning(
                &check,
                "is not a standby (not in recovery)",
                "list the primary and its standbys in postgres.url",
            ));
            continue;
        }
        let mut wrong = Vec::new();
        for (name, want) in [
            ("sync_replication_slots", "on"),
            ("hot_standby_feedback", "on"),
        ] {
            let got = setting(&standby, name).await.unwrap_or_default();
            if got != want {
                wrong.push(format!("{name} = '{got}' (needs '{want}')"));
            }
        }
        if setting(&standby, "primary_slot_name")
            .await
            .unwrap_or_default()
            .is_empty()
        {
            wrong.push(
                "primary_slot_name is empty (needs the standby's physical slot on the primary)"
                    .into(),
            );
        }
        if !wrong.is_empty() {
            items.push(problem(
                &check,
                format!("cannot keep slot `{name}` across a failover: {}", wrong.join(", ")),
                "on the standby: ALTER SYSTEM SET sync_replication_slots = on; ALTER SYSTEM SET hot_standby_feedback = on; ALTER SYSTEM SET primary_slot_name = '<its physical slot>'; primary_conninfo must include dbname; SELECT pg_reload_conf();",
            ));
        }
        items.push(match standby.slot(name).await {
            Ok(Some(s)) if s.synced == Some(true) && !s.temporary => ok(
                &check,
                format!("keeps a synchronized, persistent copy of slot `{name}` (at {})", s.confirmed_flush_lsn.unwrap_or_default()),
            ),
            Ok(Some(s)) => warning(
                &check,
                format!("slot `{name}` is there but not usable after a promotion yet (synced = {:?}, temporary = {})", s.synced, s.temporary),
                "wait: it becomes persistent once the relay confirmed past what the standby has (SELECT pg_sync_replication_slots() on the standby syncs at once)",
            ),
            Ok(None) => warning(
                &check,
                format!("has no copy of slot `{name}` yet"),
                "start the relay (it creates a failover slot); the standby's slot sync worker copies it",
            ),
            Err(e) => warning(&check, format!("cannot read its slots: {e}"), "grant the role access to pg_replication_slots"),
        });
    }
    items
}

async fn setting(control: &Control, name: &str) -> Option<String> {
    control
        .client()
        .query_opt("SELECT setting FROM pg_settings WHERE name = $1", &[&name])
        .await
        .ok()
        .flatten()
        .map(|r| r.get(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(version_num: i32) -> ServerState {
        ServerState {
            in_recovery: false,
            read_only: false,
            version_num,
        }
    }

    #[test]
    fn the_version_item_says_what_the_version_enables() {
        let v14 = version(server(140012)).unwrap();
        assert!(
            v14.detail.starts_with("PostgreSQL 14.12: "),
            "{}",
            v14.detail
        );
        assert!(v14.detail.contains("no skipping of empty transactions"));
        assert!(!v14.detail.contains("failover slots"));
        let v17 = version(server(170002)).unwrap();
        assert!(v17
            .detail
            .contains("logical decoding on a standby, failover slots"));
        let v13 = version(server(130016)).unwrap_err();
        assert_eq!(v13.status, super::super::Status::Problem);
        assert!(v13.detail.contains("needs PostgreSQL 14 or newer"));
    }
}
