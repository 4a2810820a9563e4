//! `postgres.binary = true` against the real PostgreSQL and Kafka: the same rows relayed once
//! in text mode and once in pgoutput's binary mode (two slots on one database) give the same
//! Kafka records, for every column type binary mode converts, on a plain and on a
//! range-partitioned outbox; and a mapped column of a type it cannot convert stops the relay
//! with the fix, never confirmed past its transaction (the same slot delivers it once fixed).

use std::collections::HashMap;
use std::time::Duration;

use crate::common::*;

/// Columns beyond the migration's (`id uuid`, `aggregatetype`/`aggregateid`/`type text`,
/// `payload jsonb`, `created_at timestamptz`): one per type binary mode converts.
const EXTRA_COLUMNS: &str = "
    ADD COLUMN doc json,
    ADD COLUMN blob bytea,
    ADD COLUMN small int2,
    ADD COLUMN num int4,
    ADD COLUMN big int8,
    ADD COLUMN flag bool,
    ADD COLUMN code char(4),
    ADD COLUMN vname varchar(20),
    ADD COLUMN nm name,
    ADD COLUMN relid oid,
    ADD COLUMN at timestamp,
    ADD COLUMN occurred timestamptz";

/// Every extra column but `occurred` (the timestamp) as a header; `num` chooses the partition.
fn mapping_toml(topic_prefix: &str, table: &str) -> String {
    format!(
        r#"
[outbox]
table = "{table}"
topic = "{topic_prefix}.{{aggregatetype}}"
timestamp_column = "occurred"
partition_by = "num"
header_columns = {{ doc = "x-doc", blob = "x-blob", small = "x-small", num = "x-num", big = "x-big", flag = "x-flag", code = "x-code", vname = "x-vname", nm = "x-nm", relid = "x-relid", at = "x-at" }}
"#
    )
}

/// One relay's environment: `db`'s, with its own slot, the outbox keys from a file, and
/// `binary` on or off.
fn relay_env(db: &TestDb, slot: &str, toml: &str, binary: bool) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = db
        .relay_env()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("OUTBOX_RELAY__OUTBOX__") && !k.ends_with("__SLOT"))
        .collect();
    let path = write_config(slot, toml);
    env.push(("OUTBOX_RELAY__POSTGRES__SLOT".into(), slot.into()));
    env.push((
        "OUTBOX_RELAY_CONFIG".into(),
        path.to_string_lossy().into_owned(),
    ));
    env.push(("OUTBOX_RELAY__POSTGRES__BINARY".into(), binary.to_string()));
    env
}

/// Drops this test's slots (the text- and binary-mode ones), then the database.
async fn cleanup(db: TestDb) {
    let client = db.client().await;
    for mode in ["text", "binary"] {
        let _ = client
            .execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1 AND NOT active",
                &[&format!("{}_{mode}", db.name)],
            )
            .await;
    }
    db.cleanup().await;
}

async fn create_slot(db: &TestDb, slot: &str) {
    db.client()
        .await
        .execute(
            "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
            &[&slot],
        )
        .await
        .expect("create slot");
}

/// Inserts `rows` rows whose values cover each type's edge cases (negative numbers,
/// sub-second and BC timestamps, NULLs, bytes that need escaping, non-ASCII text), in
/// transactions of 1, 2, 3 … rows. Returns the ids.
async fn insert_rows(db: &TestDb, rows: usize) -> Vec<String> {
    let mut client = db.client().await;
    let mut ids = Vec::new();
    let mut i = 0;
    let mut size = 1;
    while i < rows {
        let tx = client.transaction().await.unwrap();
        for _ in 0..size.min(rows - i) {
            let id: String = tx
                .query_one(
                    "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, created_at,
                         doc, blob, small, num, big, flag, code, vname, nm, relid, at, occurred)
                     SELECT gen_random_uuid(), 'order', 'agg-' || (n % 5), 'Created',
                         jsonb_build_object('n', n, 'text', 'é ' || repeat('x', n), 'f', 2.50, 'nested', jsonb_build_array(n, null, true)),
                         timestamptz '2026-01-15 12:00:00+00' + n * interval '20 days',
                         CASE WHEN n % 4 = 3 THEN NULL ELSE format('{ \"n\" : %s }', n)::json END,
                         CASE WHEN n % 4 = 2 THEN NULL ELSE decode(lpad(to_hex(n), 2, '0') || '00ff5c78', 'hex') END,
                         (-n)::int2, (n * 1000003 - 7)::int4, (n::int8 * -123456789012),
                         n % 2 = 0, left('ab' || n, 4), 'vé' || n, ('name_' || n)::name, (4294967295 - n)::oid,
                         CASE WHEN n % 5 = 4 THEN timestamp '0001-01-01 00:00:00' - interval '3 days'
                              ELSE timestamp '2026-03-01 12:30:45.678901' + n * interval '1 hour 0.25 seconds' END,
                         CASE WHEN n % 3 = 2 THEN NULL
                              ELSE timestamptz '2026-03-01 12:30:45.678901+02' + n * interval '1 day 0.001 seconds' END
                     FROM (SELECT $1::int AS n) AS r
                     RETURNING id::text",
                    &[&(i as i32)],
                )
                .await
                .expect("insert")
                .get(0);
            ids.push(id);
            i += 1;
        }
        tx.commit().await.unwrap();
        size += 1;
    }
    ids
}

/// What a record is, less where it landed: key, payload, sorted headers, timestamp and
/// partition, bytes shown escaped (exact, and readable in a failure).
#[derive(Debug, PartialEq, Eq)]
struct Shape {
    key: String,
    payload: Option<String>,
    headers: Vec<(String, String)>,
    timestamp_ms: Option<i64>,
    partition: i32,
}

fn by_key(records: &[Received]) -> HashMap<Vec<u8>, Shape> {
    let show = |b: &[u8]| b.escape_ascii().to_string();
    records
        .iter()
        .map(|r| {
            let mut headers: Vec<_> = r
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), show(v)))
                .collect();
            headers.sort();
            let shape = Shape {
                key: show(&r.key),
                payload: r.payload.as_deref().map(show),
                headers,
                timestamp_ms: r.timestamp_ms,
                partition: r.partition,
            };
            (r.key.clone(), shape)
        })
        .collect()
}

/// Relays `ids` (already in both slots) with a text-mode and a binary-mode relay and
/// asserts that both produce the same records.
async fn relay_both_and_compare(db: &TestDb, table: &str, ids: &[String], label: &str) {
    let mut records = Vec::new();
    for binary in [false, true] {
        let mode = if binary { "binary" } else { "text" };
        let slot = format!("{}_{mode}", db.name);
        let prefix = format!("{}.{mode}", db.topic_prefix);
        let topic = format!("{prefix}.order");
        create_topic(&topic, 3).await;
        let env = relay_env(db, &slot, &mapping_toml(&prefix, table), binary);
        let mut relay = RelayProcess::start(&env, &format!("{slot}-{label}"));
        let received = read_ids(
            std::slice::from_ref(&topic),
            3,
            ids,
            Duration::from_secs(60),
            Duration::from_millis(500),
        )
        .await;
        let got = by_key(&received);
        let missing: Vec<&String> = ids
            .iter()
            .filter(|id| !got.contains_key(id.as_bytes()))
            .collect();
        assert!(
            missing.is_empty(),
            "{label}, {mode} mode: {} of {} events missing after 60 s, e.g. {:?}\n{}",
            missing.len(),
            ids.len(),
            &missing[..missing.len().min(3)],
            relay.log_text()
        );
        let status = relay.terminate(Duration::from_secs(30));
        assert!(
            status.success(),
            "{label}, {mode} mode: relay exited with {status}"
        );
        // The walsender really was asked for binary values (or not).
        let log = relay.log_text();
        assert_eq!(
            log.contains("\"binary\" 'true'"),
            binary,
            "{mode} mode:\n{log}"
        );
        records.push(got);
    }
    let (text, binary) = (&records[0], &records[1]);
    assert_eq!(text.len(), ids.len(), "{label}: text mode");
    let mut differ = Vec::new();
    for (key, shape) in text {
        if binary.get(key) != Some(shape) {
            differ.push(format!("text: {shape:?}\nbinary: {:?}", binary.get(key)));
        }
    }
    assert!(
        differ.is_empty(),
        "{label}: {} of {} records differ between text and binary mode, e.g.\n{}",
        differ.len(),
        ids.len(),
        differ[0]
    );
    // Sanity: the headers hold values of every type (the comparison is not of empty records).
    let most = text.values().map(|s| s.headers.len()).max().unwrap_or(0);
    assert!(most >= 14, "{:?}", text.values().next());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binary_mode_relays_the_same_records_as_text_mode() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute(&format!("ALTER TABLE outbox {EXTRA_COLUMNS}"))
        .await
        .unwrap();
    // A TimeZone other than UTC: text-mode timestamptz values then carry +01/+02 offsets,
    // which binary mode must not change.
    client
        .batch_execute(&format!(
            "ALTER DATABASE {} SET TimeZone = 'Europe/Berlin'",
            db.name
        ))
        .await
        .unwrap();
    for mode in ["text", "binary"] {
        create_slot(&db, &format!("{}_{mode}", db.name)).await;
    }
    let ids = insert_rows(&db, 40).await;
    relay_both_and_compare(&db, "public.outbox", &ids, "plain outbox").await;
    cleanup(db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binary_mode_relays_a_partitioned_outbox_like_text_mode() {
    let db = TestDb::new().await;
    let client = db.client().await;
    // Without publish_via_partition_root: rows arrive under the leaves' names and
    // Relation messages, each bound as the root.
    client
        .batch_execute(&format!(
            "DROP PUBLICATION outbox_relay_pub;
             DROP TABLE outbox;
             CREATE TABLE outbox (
                 id uuid NOT NULL, aggregatetype text NOT NULL, aggregateid text NOT NULL,
                 type text NOT NULL, payload jsonb, created_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (id, created_at)
             ) PARTITION BY RANGE (created_at);
             ALTER TABLE outbox {EXTRA_COLUMNS};
             CREATE TABLE outbox_2026_01 PARTITION OF outbox
                 FOR VALUES FROM ('2026-01-01 00:00:00+00') TO ('2026-02-01 00:00:00+00');
             CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;
             CREATE PUBLICATION outbox_relay_pub FOR TABLE outbox WITH (publish = 'insert');"
        ))
        .await
        .unwrap();
    for mode in ["text", "binary"] {
        create_slot(&db, &format!("{}_{mode}", db.name)).await;
    }
    let ids = insert_rows(&db, 12).await;
    relay_both_and_compare(&db, "public.outbox", &ids, "partitioned outbox").await;
    cleanup(db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn binary_mode_stops_on_a_column_it_cannot_convert() {
    let db = TestDb::new().await;
    let client = db.client().await;
    client
        .batch_execute("ALTER TABLE outbox ADD COLUMN amount numeric")
        .await
        .unwrap();
    let slot = format!("{}_binary", db.name);
    create_slot(&db, &slot).await;
    let id: String = client
        .query_one(
            "INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, amount)
             VALUES (gen_random_uuid(), 'order', '1', 'Created', '{}', 1.50) RETURNING id::text",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let toml = format!(
        "[outbox]\ntable = \"public.outbox\"\ntopic = \"{}.{{aggregatetype}}\"\nheader_columns = {{ amount = \"x-amount\" }}\n",
        db.topic_prefix
    );
    let env = relay_env(&db, &slot, &toml, true);
    let mut relay = RelayProcess::start(&env, &format!("{slot}-numeric"));
    let status = probe::wait_exit(&mut relay, Duration::from_secs(30));
    let log = relay.log_text();
    assert!(!status.success(), "{log}");
    for part in [
        "`amount`",
        "numeric",
        "header_columns",
        "postgres.binary = false",
    ] {
        assert!(log.contains(part), "log lacks {part}:\n{log}");
    }
    // The slot may have moved inside the transaction (an idle relay confirms the server's
    // keepalive position, which can be past the insert's record but before its commit), but
    // never past its commit: with the fix the log names, the same slot still delivers the row.
    let env = relay_env(&db, &slot, &toml, false);
    let mut relay = RelayProcess::start(&env, &format!("{slot}-numeric-text"));
    let got = read_ids(
        &[db.topic("order")],
        1,
        std::slice::from_ref(&id),
        Duration::from_secs(30),
        Duration::from_millis(300),
    )
    .await;
    assert_eq!(
        got.iter().filter(|r| r.key_str() == id).count(),
        1,
        "the row the relay stopped on was confirmed past:\n{}",
        relay.log_text()
    );
    relay.terminate(Duration::from_secs(30));
    cleanup(db).await;
}
