//! Range-partitioned outbox tables against the real PostgreSQL and Kafka: the live stream
//! (with partitions attached and detached while the relay runs), a publication made without
//! `publish_via_partition_root`, and `check`, `status`, `replay` and the sweeper.
//!
//! The outbox here is `PARTITION BY RANGE (created_at)` with two monthly partitions
//! (2026-01, 2026-02) and a DEFAULT; its primary key includes the partition key, as
//! PostgreSQL requires.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use outbox_relay::config::Config;
use outbox_relay::postgres::control::Control;
use outbox_relay::relay::sweeper::Sweeper;
use serde_json::Value;
use tokio_postgres::Client;

const BIN: &str = env!("CARGO_BIN_EXE_outbox-relay");

const JAN: &str = "2026-01-15 12:00:00+00";
const FEB: &str = "2026-02-15 12:00:00+00";
const MAR: &str = "2026-03-15 12:00:00+00";
/// Covered by no monthly partition: goes to DEFAULT. In the past, because `replay` stamps
/// records with `created_at` here and Kafka refuses timestamps far in the future
/// (`log.message.timestamp.after.max.ms`).
const LATER: &str = "2025-06-15 12:00:00+00";

/// Replaces the migration's plain outbox with a range-partitioned one. With `publication`,
/// the publication is recreated as given (`None`: dropped, for the relay to create).
async fn partition_outbox(db: &TestDb, publication: Option<&str>) {
    let client = db.client().await;
    client
        .batch_execute(
            "DROP PUBLICATION outbox_relay_pub;
             DROP TABLE outbox;
             CREATE TABLE outbox (
                 id            uuid        NOT NULL,
                 aggregatetype text        NOT NULL,
                 aggregateid   text        NOT NULL,
                 type          text        NOT NULL,
                 payload       jsonb,
                 created_at    timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (id, created_at)
             ) PARTITION BY RANGE (created_at);
             CREATE TABLE outbox_2026_01 PARTITION OF outbox
                 FOR VALUES FROM ('2026-01-01 00:00:00+00') TO ('2026-02-01 00:00:00+00');
             CREATE TABLE outbox_2026_02 PARTITION OF outbox
                 FOR VALUES FROM ('2026-02-01 00:00:00+00') TO ('2026-03-01 00:00:00+00');
             CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;",
        )
        .await
        .expect("partition the outbox");
    if let Some(sql) = publication {
        client.batch_execute(sql).await.expect("create publication");
    }
}

/// Inserts `events` in one transaction with `created_at` = `at`; returns the WAL insert
/// position just before COMMIT (a lower bound of the commit LSN).
async fn insert_at(client: &mut Client, events: &[Event], at: &str) -> u64 {
    let tx = client.transaction().await.expect("begin");
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    let types: Vec<&str> = events.iter().map(|e| e.aggregate_type.as_str()).collect();
    let agg_ids: Vec<&str> = events.iter().map(|e| e.aggregate_id.as_str()).collect();
    let payloads: Vec<&str> = events.iter().map(|e| e.payload.as_str()).collect();
    tx.execute(
        "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
         SELECT i::uuid, a, g, 'Created', p::jsonb, $5::text::timestamptz
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[])
              WITH ORDINALITY AS u(i, a, g, p, n) ORDER BY n",
        &[&ids, &types, &agg_ids, &payloads, &at],
    )
    .await
    .expect("insert outbox rows");
    let before_commit = wal_insert_lsn(&tx).await;
    tx.commit().await.expect("commit");
    before_commit
}

fn batch(n: usize, writer: usize, from: usize) -> Vec<Event> {
    (0..n)
        .map(|i| {
            Event::new(
                "order",
                &format!("agg-{}", (from + i) % 7),
                writer,
                from + i,
            )
        })
        .collect()
}

/// Rows per table that holds outbox rows (partitions, and tables detached from it).
async fn rows_per_table(client: &Client, tables: &[&str]) -> HashMap<String, i64> {
    let mut counts = HashMap::new();
    for table in tables {
        let n: i64 = client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .await
            .unwrap()
            .get(0);
        counts.insert(table.to_string(), n);
    }
    counts
}

async fn via_root(client: &Client) -> bool {
    client
        .query_one(
            "SELECT pubviaroot FROM pg_publication WHERE pubname = 'outbox_relay_pub'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

/// Done-when 1, first half: the relay creates its publication itself; rows routed to each
/// monthly partition and to DEFAULT, a partition attached and another detached while events
/// stream: every event arrives, and the relay keeps running.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn partitioned_outbox_delivers_every_event_while_partitions_come_and_go() {
    let db = TestDb::new().await;
    partition_outbox(&db, None).await;
    let mut relay = RelayProcess::start(&db.relay_env(), &format!("{}-partitions", db.name));
    wait_for_slot(&db, &mut relay).await;
    let client = db.client().await;
    assert!(
        via_root(&client).await,
        "the relay creates its publication WITH publish_via_partition_root"
    );

    // One writer, transactions of 1..=8 rows cycling through the partitions; March joins
    // the cycle once its partition is attached.
    const TXNS: usize = 90;
    let written = Arc::new(AtomicUsize::new(0));
    let march = Arc::new(AtomicBool::new(false));
    let writer = {
        let mut client = db.client().await;
        let (written, march) = (written.clone(), march.clone());
        tokio::spawn(async move {
            let mut all = Vec::new();
            for t in 0..TXNS {
                let mut months = vec![JAN, FEB, LATER];
                if march.load(Ordering::SeqCst) {
                    months.push(MAR);
                }
                let events = batch(1 + t % 8, 0, all.len());
                insert_at(&mut client, &events, months[t % months.len()]).await;
                all.extend(events);
                written.store(t + 1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            all
        })
    };
    let reached = |n: usize| {
        let written = written.clone();
        async move { written.load(Ordering::SeqCst) >= n }
    };
    wait_for(
        "a third of the transactions",
        Duration::from_secs(60),
        || reached(TXNS / 3),
    )
    .await;
    client
        .batch_execute(
            "CREATE TABLE outbox_2026_03 (LIKE outbox INCLUDING DEFAULTS);
             ALTER TABLE outbox ATTACH PARTITION outbox_2026_03
                 FOR VALUES FROM ('2026-03-01 00:00:00+00') TO ('2026-04-01 00:00:00+00');",
        )
        .await
        .expect("attach a partition mid-stream");
    march.store(true, Ordering::SeqCst);
    wait_for(
        "two thirds of the transactions",
        Duration::from_secs(60),
        || reached(2 * TXNS / 3),
    )
    .await;
    // January's rows written so far stay in the detached table; later January rows go to
    // DEFAULT.
    client
        .batch_execute("ALTER TABLE outbox DETACH PARTITION outbox_2026_01")
        .await
        .expect("detach a partition mid-stream");
    let all = writer.await.unwrap();

    let counts = rows_per_table(
        &client,
        &[
            "outbox_2026_01",
            "outbox_2026_02",
            "outbox_2026_03",
            "outbox_default",
        ],
    )
    .await;
    println!("rows per table: {counts:?}");
    assert!(
        counts.values().all(|&n| n > 0),
        "rows were routed to every partition: {counts:?}"
    );
    assert_eq!(counts.values().sum::<i64>() as usize, all.len());

    let (_, t) = expect_all(
        "partitioned outbox",
        &[db.topic("order")],
        &all,
        Duration::from_secs(90),
        Duration::from_secs(2),
        &relay,
    )
    .await;
    assert_eq!(t.unexpected, 0);
    assert_eq!(t.duplicates, 0, "a clean run must not duplicate");
    assert!(
        relay.try_status().is_none(),
        "the relay keeps running:\n{}",
        relay.log_text()
    );
    let target = db.current_wal_lsn().await;
    wait_for(
        "the slot to confirm everything",
        Duration::from_secs(30),
        || async { db.confirmed_flush_lsn().await >= target },
    )
    .await;
    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}

/// Done-when 1, second half: the user's publication has no `publish_via_partition_root`, so
/// pgoutput names the leaf partitions. While a leaf is attached, its events arrive (mapped
/// through its partition root). A partition detached and dropped before the relay read its
/// rows cannot be mapped: the relay stops with exit code 1 naming the partition and the fix,
/// and the slot is not confirmed past those rows, also after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn publication_without_partition_root_delivers_or_stops_before_confirming() {
    let db = TestDb::new().await;
    partition_outbox(
        &db,
        Some("CREATE PUBLICATION outbox_relay_pub FOR TABLE outbox WITH (publish = 'insert')"),
    )
    .await;
    db.create_slot().await;
    let mut client = db.client().await;
    assert!(!via_root(&client).await);

    // Written before the relay starts, and while it runs.
    let mut all = Vec::new();
    for (i, at) in [JAN, FEB, LATER].iter().enumerate() {
        let events = batch(20, 0, i * 20);
        insert_at(&mut client, &events, at).await;
        all.extend(events);
    }
    let env = db.relay_env();
    let mut relay = RelayProcess::start(&env, &format!("{}-leaves", db.name));
    wait_for_slot(&db, &mut relay).await;
    for (i, at) in [LATER, FEB, JAN].iter().enumerate() {
        let events = batch(20, 1, i * 20);
        insert_at(&mut client, &events, at).await;
        all.extend(events);
    }
    let (_, t) = expect_all(
        "leaf partitions",
        &[db.topic("order")],
        &all,
        Duration::from_secs(60),
        Duration::from_secs(1),
        &relay,
    )
    .await;
    assert_eq!(t.unexpected, 0);
    assert!(
        relay.log_text().contains("mapped as its root"),
        "the leaves were resolved to their root:\n{}",
        relay.log_text()
    );
    let target = db.current_wal_lsn().await;
    wait_for(
        "the slot to confirm everything",
        Duration::from_secs(30),
        || async { db.confirmed_flush_lsn().await >= target },
    )
    .await;
    let exit = relay.terminate(Duration::from_secs(30));
    assert!(exit.success(), "{exit}");

    // With the relay stopped: February gets rows, then is detached and dropped before the
    // relay reads them. Rows in other partitions follow.
    let doomed = batch(5, 2, 0);
    let doomed_commit = insert_at(&mut client, &doomed, FEB).await;
    let after = batch(5, 2, 5);
    insert_at(&mut client, &after, LATER).await;
    client
        .batch_execute(
            "ALTER TABLE outbox DETACH PARTITION outbox_2026_02; DROP TABLE outbox_2026_02;",
        )
        .await
        .unwrap();
    let confirmed_before = db.confirmed_flush_lsn().await;
    assert!(confirmed_before <= doomed_commit);

    for attempt in 0..2 {
        let mut relay = RelayProcess::start(&env, &format!("{}-leaves-{attempt}", db.name));
        let mut exit = None;
        wait_for("the relay to stop", Duration::from_secs(60), || {
            exit = relay.try_status();
            std::future::ready(exit.is_some())
        })
        .await;
        let log = relay.log_text();
        assert_eq!(exit.unwrap().code(), Some(1), "{log}");
        for expected in [
            "public.outbox_2026_02 (oid ",
            "no longer exists",
            "ALTER PUBLICATION \"outbox_relay_pub\" SET (publish_via_partition_root = true)",
        ] {
            assert!(log.contains(expected), "`{expected}` in:\n{log}");
        }
        let confirmed = db.confirmed_flush_lsn().await;
        assert!(
            confirmed <= doomed_commit,
            "attempt {attempt}: the slot confirmed {confirmed:#x}, past the unmappable insert committed after {doomed_commit:#x}"
        );
    }
    db.cleanup().await;
}

/// Runs `outbox-relay <args>`; returns the exit code and stdout.
async fn ops(env: &[(String, String)], args: &[&str]) -> (i32, String, String) {
    let output = tokio::process::Command::new(BIN)
        .args(args)
        .envs(env.iter().cloned())
        .env_remove("OUTBOX_RELAY_CONFIG")
        .env_remove("OUTBOX_RELAY_LOG")
        .output()
        .await
        .expect("run outbox-relay");
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

async fn ops_json(env: &[(String, String)], args: &[&str]) -> Value {
    let (code, stdout, stderr) = ops(env, args).await;
    serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("exit {code}, stdout is not JSON ({e}):\n{stdout}\n{stderr}"))
}

fn item<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|i| i["check"] == name)
        .unwrap_or_else(|| panic!("no check item `{name}` in {report:#}"))
}

/// `check` and `status` on a partitioned outbox: the leaves in a publication without
/// `publish_via_partition_root` cover the table, the missing option is flagged with the exact
/// ALTER PUBLICATION, a table that is not an outbox in the publication is a problem, and
/// `status` counts rows over all partitions. Then `replay` re-publishes rows from every
/// partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn check_status_and_replay_handle_a_partitioned_outbox() {
    let db = TestDb::new().await;
    partition_outbox(
        &db,
        Some("CREATE PUBLICATION outbox_relay_pub FOR TABLE outbox WITH (publish = 'insert')"),
    )
    .await;
    db.create_slot().await;
    let env = db.relay_env();
    let mut client = db.client().await;
    let mut all = Vec::new();
    for (i, at) in [JAN, FEB, LATER].iter().enumerate() {
        let events = batch(4, 0, i * 4);
        insert_at(&mut client, &events, at).await;
        all.extend(events);
    }

    let report = ops_json(&env, &["check", "--json"]).await;
    assert_eq!(
        item(&report, "publication tables")["status"],
        "ok",
        "{report:#}"
    );
    let partitions = item(&report, "publication partitions");
    assert_eq!(partitions["status"], "warning", "{report:#}");
    assert_eq!(
        partitions["fix"],
        r#"ALTER PUBLICATION "outbox_relay_pub" SET (publish_via_partition_root = true);"#
    );
    assert_eq!(item(&report, "outbox table")["status"], "ok", "{report:#}");

    client
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY);
             ALTER PUBLICATION outbox_relay_pub ADD TABLE orders;",
        )
        .await
        .unwrap();
    let report = ops_json(&env, &["check", "--json"]).await;
    let tables = item(&report, "publication tables");
    assert_eq!(tables["status"], "problem", "{report:#}");
    assert!(
        tables["detail"].as_str().unwrap().contains("public.orders"),
        "{report:#}"
    );
    assert_eq!(report["ok"], false, "{report:#}");

    client
        .batch_execute(
            "ALTER PUBLICATION outbox_relay_pub DROP TABLE orders;
             ALTER PUBLICATION outbox_relay_pub SET (publish_via_partition_root = true);",
        )
        .await
        .unwrap();
    let report = ops_json(&env, &["check", "--json"]).await;
    assert_eq!(
        item(&report, "publication partitions")["status"],
        "ok",
        "{report:#}"
    );
    assert_eq!(
        item(&report, "publication tables")["status"],
        "ok",
        "{report:#}"
    );

    let status = ops_json(&env, &["status", "--json"]).await;
    let outbox = &status["outbox"][0];
    assert_eq!(outbox["published"], true, "{status:#}");
    assert_eq!(outbox["partitions"], 3, "{status:#}");
    assert_eq!(outbox["rows"], 12, "{status:#}");
    assert_eq!(
        outbox["oldest_created_at"], "2025-06-15 12:00:00+00",
        "{status:#}"
    );
    let (code, text, _) = ops(&env, &["status"]).await;
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("12 rows in 3 partitions"), "{text}");

    // Replay walks every partition (no relay runs: everything Kafka sees is replayed).
    let dry = ops_json(
        &env,
        &["replay", "--since", "-infinity", "--dry-run", "--json"],
    )
    .await;
    assert_eq!(dry["matched"], 12, "{dry:#}");
    let report = ops_json(&env, &["replay", "--since", "-infinity", "--json"]).await;
    assert_eq!(report["acknowledged"], 12, "{report:#}");
    let ids: Vec<String> = all.iter().map(|e| e.id.clone()).collect();
    let records = read_ids(
        &[db.topic("order")],
        1,
        &ids,
        Duration::from_secs(60),
        Duration::from_secs(1),
    )
    .await;
    let t = tally(&all, &records);
    assert!(
        t.missing.is_empty(),
        "{} replayed events missing",
        t.missing.len()
    );
    assert!(records
        .iter()
        .all(|r| r.header("outbox-relay-replay") == Some("true")));
    db.cleanup().await;
}

async fn outbox_ids(client: &Client) -> HashSet<String> {
    client
        .query("SELECT id::text FROM outbox", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The sweeper on a partitioned outbox deletes exactly the confirmed rows past the
/// retention. Every partition's first row has the same ctid `(0,1)`: a delete by ctid on the
/// partitioned table would take the unconfirmed February row and the young DEFAULT row too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sweeper_deletes_only_confirmed_old_rows_of_a_partitioned_outbox() {
    let db = TestDb::new().await;
    partition_outbox(
        &db,
        Some("CREATE PUBLICATION outbox_relay_pub FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)"),
    )
    .await;
    db.create_slot().await;
    let mut client = db.client().await;
    let mut config = Config::default();
    config.postgres.url = db.url.clone();
    config.postgres.slot = db.slot.clone();
    config.outbox.sweeper.retention_ms = 3_600_000;
    config.outbox.sweeper.batch_size = 2;
    let control = Control::connect(&config.postgres).await.unwrap();
    let mut sweeper = Sweeper::new(control, &config);

    let january = batch(3, 0, 0);
    insert_at(&mut client, &january, JAN).await;
    let january_ids: Vec<String> = january.iter().map(|e| e.id.clone()).collect();
    let mark = mark_after(&mut sweeper, &client, &january_ids).await;
    advance_slot(&db, mark.lsn).await;
    // After the mark: an old-looking February row (not confirmed) and a young DEFAULT row.
    let february = batch(1, 1, 0);
    insert_at(&mut client, &february, FEB).await;
    let young = batch(1, 2, 0);
    let now: String = client
        .query_one("SELECT now()::text", &[])
        .await
        .unwrap()
        .get(0);
    insert_at(&mut client, &young, &now).await;
    let ctids: Vec<String> = client
        .query(
            "SELECT DISTINCT ctid::text FROM outbox WHERE id::text = ANY($1)",
            &[&vec![
                january[0].id.clone(),
                february[0].id.clone(),
                young[0].id.clone(),
            ]],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ctids, vec!["(0,1)".to_string()], "the rows share a ctid");

    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.used, Some(mark));
    assert_eq!(report.deleted, 3, "{report:?}");
    let expect: HashSet<String> = [february[0].id.clone(), young[0].id.clone()].into();
    assert_eq!(outbox_ids(&client).await, expect);
    db.cleanup().await;
}

async fn table_exists(client: &Client, name: &str) -> bool {
    client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&name])
        .await
        .unwrap()
        .get(0)
}

/// `drop_partitions`: a monthly partition goes as a whole once every row in it is past the
/// retention and confirmed; one with an unconfirmed row stays, and so does one into which an
/// insert is in progress (the sweeper gives up the lock and tries again); an empty partition
/// and the DEFAULT partition are never dropped (DEFAULT is swept row by row).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sweeper_drops_partitions_whose_rows_are_all_confirmed_and_old() {
    let db = TestDb::new().await;
    partition_outbox(
        &db,
        Some("CREATE PUBLICATION outbox_relay_pub FOR TABLE outbox WITH (publish = 'insert', publish_via_partition_root = true)"),
    )
    .await;
    db.create_slot().await;
    let mut client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE outbox_2026_03 PARTITION OF outbox
                 FOR VALUES FROM ('2026-03-01 00:00:00+00') TO ('2026-04-01 00:00:00+00');",
        )
        .await
        .unwrap();
    let mut config = Config::default();
    config.postgres.url = db.url.clone();
    config.postgres.slot = db.slot.clone();
    config.outbox.sweeper.retention_ms = 3_600_000;
    config.outbox.sweeper.drop_partitions = true;
    let control = Control::connect(&config.postgres).await.unwrap();
    let mut sweeper = Sweeper::new(control, &config);

    let january = batch(3, 0, 0);
    insert_at(&mut client, &january, JAN).await;
    let old_default = batch(2, 0, 3);
    insert_at(&mut client, &old_default, LATER).await;
    let confirmed: Vec<String> = january
        .iter()
        .chain(&old_default)
        .map(|e| e.id.clone())
        .collect();
    let mark = mark_after(&mut sweeper, &client, &confirmed).await;
    advance_slot(&db, mark.lsn).await;
    let february = batch(1, 1, 0);
    insert_at(&mut client, &february, FEB).await;
    let young = batch(1, 2, 0);
    let now: String = client
        .query_one("SELECT now()::text", &[])
        .await
        .unwrap()
        .get(0);
    insert_at(&mut client, &young, &now).await;

    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.used, Some(mark));
    assert_eq!(report.dropped, vec!["public.outbox_2026_01".to_string()]);
    assert_eq!(
        report.deleted, 2,
        "DEFAULT's confirmed old rows: {report:?}"
    );
    assert!(!table_exists(&client, "outbox_2026_01").await);
    for kept in ["outbox_2026_02", "outbox_2026_03", "outbox_default"] {
        assert!(table_exists(&client, kept).await, "{kept} was dropped");
    }
    let expect: HashSet<String> = [february[0].id.clone(), young[0].id.clone()].into();
    assert_eq!(outbox_ids(&client).await, expect);

    // February's row gets confirmed, but an insert into February is in progress: the
    // sweeper cannot lock the partition and leaves it.
    let open = db.client().await;
    let late = batch(1, 3, 0);
    open.batch_execute(&format!(
        "BEGIN; INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at)
         VALUES ('{}', 'order', 'a', 'Created', '{{}}', '{FEB}')",
        late[0].id
    ))
    .await
    .unwrap();
    let mark2 = mark_after(&mut sweeper, &client, &[february[0].id.clone()]).await;
    advance_slot(&db, mark2.lsn).await;
    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.used, Some(mark2));
    assert!(report.dropped.is_empty(), "{report:?}");
    assert!(table_exists(&client, "outbox_2026_02").await);
    open.batch_execute("COMMIT").await.unwrap();

    // Once that insert is confirmed too, February goes.
    let mark3 = mark_after(&mut sweeper, &client, &[late[0].id.clone()]).await;
    advance_slot(&db, mark3.lsn).await;
    let report = sweeper.sweep().await.unwrap();
    assert_eq!(report.dropped, vec!["public.outbox_2026_02".to_string()]);
    assert!(table_exists(&client, "outbox_2026_03").await, "empty: kept");
    assert!(table_exists(&client, "outbox_default").await);
    assert_eq!(
        outbox_ids(&client).await,
        HashSet::from([young[0].id.clone()])
    );
    db.cleanup().await;
}

/// No silent skip: the user's publication also holds a table that is not an outbox. The
/// events before its insert arrive; at its insert the relay stops with exit code 1, naming
/// the table and the fix, without confirming past it (before: the row was ignored and the
/// slot confirmed past it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_insert_into_a_table_that_is_not_an_outbox_stops_the_relay() {
    let db = TestDb::new().await;
    let mut client = db.client().await;
    client
        .batch_execute(
            "CREATE TABLE orders (id int PRIMARY KEY);
             ALTER PUBLICATION outbox_relay_pub ADD TABLE orders;",
        )
        .await
        .unwrap();
    db.create_slot().await;
    let before = batch(10, 0, 0);
    insert_events(&mut client, &before, true).await;
    let tx = client.transaction().await.unwrap();
    tx.execute("INSERT INTO orders VALUES (1)", &[])
        .await
        .unwrap();
    let orders_commit = wal_insert_lsn(&tx).await;
    tx.commit().await.unwrap();
    insert_events(&mut client, &batch(10, 0, 10), true).await;

    let mut relay = RelayProcess::start(&db.relay_env(), &format!("{}-foreign", db.name));
    expect_all(
        "before the foreign insert",
        &[db.topic("order")],
        &before,
        Duration::from_secs(60),
        Duration::ZERO,
        &relay,
    )
    .await;
    let mut exit = None;
    wait_for("the relay to stop", Duration::from_secs(60), || {
        exit = relay.try_status();
        std::future::ready(exit.is_some())
    })
    .await;
    let log = relay.log_text();
    assert_eq!(exit.unwrap().code(), Some(1), "{log}");
    for expected in [
        "received an insert from public.orders (oid ",
        "ALTER PUBLICATION \"outbox_relay_pub\" DROP TABLE",
    ] {
        assert!(log.contains(expected), "`{expected}` in:\n{log}");
    }
    let confirmed = db.confirmed_flush_lsn().await;
    assert!(
        confirmed <= orders_commit,
        "the slot confirmed {confirmed:#x}, past the unmappable insert committed after {orders_commit:#x}"
    );
    db.cleanup().await;
}
