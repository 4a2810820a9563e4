use std::collections::BTreeMap;

use super::*;
use crate::config::{Config, NullPayload};

/// Debezium's own outbox example (debezium-examples, `outbox/register-postgres.json`): the
/// bare config object that `PUT /connectors/…/config` takes.
const DOCUMENTED_EXAMPLE: &str = r#"{
    "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
    "tasks.max": "1",
    "database.hostname": "order-db",
    "database.port": "5432",
    "database.user": "postgresuser",
    "database.password": "postgrespw",
    "database.dbname" : "orderdb",
    "topic.prefix": "dbserver1",
    "schema.include.list": "inventory",
    "table.include.list" : "inventory.outboxevent",
    "tombstones.on.delete" : "false",
    "transforms" : "outbox",
    "transforms.outbox.type" : "io.debezium.transforms.outbox.EventRouter",
    "transforms.outbox.route.topic.replacement" : "${routedByValue}.events",
    "transforms.outbox.table.field.event.timestamp" : "timestamp",
    "transforms.outbox.table.fields.additional.placement" : "type:header:eventType"
}"#;

/// The settings of the benchmark's Debezium peer (bench/debezium, `DebeziumPeer`), with the
/// values its harness passes, as the embedded engine's properties.
const BENCH_PEER: &str = r#"
# DebeziumPeer.engineProperties + routerProperties
name=outbox-bench-debezium
connector.class=io.debezium.connector.postgresql.PostgresConnector
offset.storage=org.apache.kafka.connect.storage.FileOffsetBackingStore
offset.storage.file.filename=/tmp/bench/offsets.dat
offset.flush.interval.ms=100
database.hostname=127.0.0.1
database.port=54329
database.user=postgres
database.password=
database.dbname=bench
topic.prefix=outbox-bench
heartbeat.interval.ms=1000
plugin.name=pgoutput
slot.name=bench_debezium
publication.name=bench_pub
publication.autocreate.mode=disabled
snapshot.mode=no_data
table.include.list=public.outbox
extended.headers.enabled=false
transforms=outbox
transforms.outbox.type=io.debezium.transforms.outbox.EventRouter
transforms.outbox.table.field.event.id=id
transforms.outbox.table.field.event.key=aggregateid
transforms.outbox.table.field.event.payload=payload
transforms.outbox.route.by.field=aggregatetype
transforms.outbox.route.topic.replacement=outbox-bench
transforms.outbox.table.fields.additional.placement=type:header:type,\
    aggregatetype:header:aggregatetype,aggregateid:header:aggregateid
"#;

/// The converted TOML, accepted by the same parse and validation as `outbox-relay check`
/// and `run` (`Config::load` without the file system).
fn validated(converted: &Converted) -> Config {
    match Config::from_sources(Some(&converted.toml), Vec::<(String, String)>::new()) {
        Ok(config) => config,
        Err(e) => panic!("converted TOML refused: {e}\n{}", converted.toml),
    }
}

fn unmapped_keys(converted: &Converted) -> Vec<&str> {
    converted.unmapped.iter().map(|u| u.key.as_str()).collect()
}

/// Every option of the input is named: in a comment of the TOML (mapped), or on the list left
/// behind (with a reason).
fn assert_every_option_accounted_for(input: &[(String, String)], converted: &Converted) {
    let comments: String = converted
        .toml
        .lines()
        .filter(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n");
    let left = unmapped_keys(converted);
    let missing: Vec<&str> = input
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| !left.contains(k) && !comments.contains(k))
        .collect();
    assert!(
        missing.is_empty(),
        "{} options neither mapped nor left: {missing:?}\n{}",
        missing.len(),
        converted.toml
    );
    for u in &converted.unmapped {
        assert!(!u.reason.is_empty(), "{} left without a reason", u.key);
    }
}

#[test]
fn debeziums_documented_outbox_example_becomes_a_config_that_validates() {
    let converted = convert(DOCUMENTED_EXAMPLE).unwrap();
    let config = validated(&converted);
    assert_eq!(
        config.postgres.url,
        "postgres://postgresuser@order-db:5432/orderdb"
    );
    // Debezium's default publication is FOR ALL TABLES: the relay gets its own.
    assert_eq!(config.postgres.slot, "outbox_relay");
    assert_eq!(config.postgres.publication, "outbox_relay_pub");
    assert!(config.postgres.create_publication);
    let outbox = &config.outbox;
    assert_eq!(outbox.table, "inventory.outboxevent");
    assert_eq!(outbox.topic, "{aggregatetype}.events");
    assert_eq!(outbox.aggregate_type_column, "aggregatetype");
    assert_eq!(outbox.id_column, "id");
    assert_eq!(outbox.key_column.as_deref(), Some("aggregateid"));
    assert_eq!(outbox.partition_by, "key");
    assert_eq!(outbox.timestamp_column.as_deref(), Some("timestamp"));
    assert_eq!(
        outbox.header_columns,
        BTreeMap::from([("type".to_string(), "eventType".to_string())])
    );
    assert!(
        !converted.toml.contains("postgrespw"),
        "the password must not be copied\n{}",
        converted.toml
    );
    let left = unmapped_keys(&converted);
    for key in ["tasks.max", "topic.prefix", "database.password"] {
        assert!(left.contains(&key), "{key} not listed: {left:?}");
    }
    assert!(!left.contains(&"schema.include.list"), "{left:?}");
    assert_every_option_accounted_for(&parse_json(DOCUMENTED_EXAMPLE).unwrap(), &converted);
}

#[test]
fn kafka_connect_json_with_name_and_config_is_read_like_the_bare_object() {
    let wrapped = format!(r#"{{"name": "outbox-connector", "config": {DOCUMENTED_EXAMPLE}}}"#);
    let converted = convert(&wrapped).unwrap();
    let config = validated(&converted);
    assert_eq!(config.kafka.client_id, "outbox-connector");
    let bare = validated(&convert(DOCUMENTED_EXAMPLE).unwrap());
    assert_eq!(config.outbox, bare.outbox);
    assert_eq!(config.postgres, bare.postgres);
}

#[test]
fn the_bench_peers_settings_become_the_relays_drain_config() {
    let converted = convert(BENCH_PEER).unwrap();
    let config = validated(&converted);
    assert_eq!(
        config.postgres.url,
        "postgres://postgres@127.0.0.1:54329/bench"
    );
    assert_eq!(config.postgres.slot, "bench_debezium");
    assert_eq!(config.postgres.publication, "bench_pub");
    assert!(!config.postgres.create_publication);
    let outbox = &config.outbox;
    assert_eq!(outbox.table, "public.outbox");
    assert_eq!(outbox.topic, "outbox-bench", "one fixed topic");
    assert_eq!(outbox.key_column.as_deref(), Some("aggregateid"));
    assert_eq!(outbox.partition_by, "key");
    assert!(
        outbox.header_columns.is_empty(),
        "type, aggregatetype and aggregateid are headers the relay always sends: {:?}",
        outbox.header_columns
    );
    assert_eq!(config.kafka.client_id, "outbox-bench-debezium");
    let left = unmapped_keys(&converted);
    for key in [
        "offset.storage",
        "offset.storage.file.filename",
        "offset.flush.interval.ms",
        "heartbeat.interval.ms",
        "topic.prefix",
    ] {
        assert!(left.contains(&key), "{key} not listed: {left:?}");
    }
    assert!(
        !left.contains(&"snapshot.mode"),
        "no_data is what the relay does"
    );
    assert_every_option_accounted_for(&parse_properties(BENCH_PEER).unwrap(), &converted);
}

#[test]
fn properties_lines_follow_javas_syntax() {
    let text = "# comment\n! also a comment\n\na=1\nb : two words\nc three\n\
                d=x\\\n    y\ne\\:f=g\\u0041\\tz\n  f = \n";
    let options = parse_properties(text).unwrap();
    let expected: Vec<(String, String)> = [
        ("a", "1"),
        ("b", "two words"),
        ("c", "three"),
        ("d", "xy"),
        ("e:f", "gA\tz"),
        ("f", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    assert_eq!(options, expected);
}

#[test]
fn a_file_without_the_outbox_router_or_of_another_connector_is_refused() {
    let no_router = "connector.class=io.debezium.connector.postgresql.PostgresConnector\n\
                     transforms=unwrap\n\
                     transforms.unwrap.type=io.debezium.transforms.ExtractNewRecordState\n";
    assert!(matches!(
        convert(no_router),
        Err(DebeziumError::NoOutboxRouter)
    ));
    let mysql = "connector.class=io.debezium.connector.mysql.MySqlConnector\n\
                 transforms=outbox\n\
                 transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n";
    assert!(matches!(convert(mysql), Err(DebeziumError::NotPostgres(_))));
    assert!(matches!(
        convert("{\"a\": [1]}"),
        Err(DebeziumError::JsonValue { .. })
    ));
}

#[test]
fn router_options_the_relay_cannot_express_are_left_with_their_reason() {
    let text = "transforms=unwrap,router\n\
                transforms.unwrap.type=io.debezium.transforms.ExtractNewRecordState\n\
                transforms.unwrap.drop.tombstones=true\n\
                transforms.router.type=io.debezium.transforms.outbox.EventRouter\n\
                transforms.router.route.topic.regex=(?<routedByValue>[a-z]+)-.*\n\
                transforms.router.route.topic.replacement=events.$1\n\
                transforms.router.table.fields.additional.placement=region:envelope,shard:partition\n\
                transforms.router.table.field.event.schema.version=version\n\
                transforms.router.route.tombstone.on.empty.payload=true\n\
                transforms.router.no.such.option=1\n\
                value.converter=org.apache.kafka.connect.json.JsonConverter\n\
                value.converter.schemas.enable=true\n\
                snapshot.mode=initial\n";
    let converted = convert(text).unwrap();
    let config = validated(&converted);
    assert_eq!(config.outbox.partition_by, "shard");
    assert_eq!(config.outbox.null_payload, NullPayload::Tombstone);
    assert_eq!(
        config.outbox.topic,
        Config::default().outbox.topic,
        "an untranslated route keeps the default topic"
    );
    let left = unmapped_keys(&converted);
    for key in [
        "transforms.unwrap.type",
        "transforms.unwrap.drop.tombstones",
        "transforms.router.route.topic.regex",
        "transforms.router.route.topic.replacement",
        "transforms.router.table.fields.additional.placement",
        "transforms.router.table.field.event.schema.version",
        "transforms.router.no.such.option",
        "value.converter",
        "value.converter.schemas.enable",
        "snapshot.mode",
    ] {
        assert!(left.contains(&key), "{key} not listed: {left:?}");
    }
    assert_every_option_accounted_for(&parse_properties(text).unwrap(), &converted);
}

#[test]
fn several_outbox_tables_become_outbox_tables_entries() {
    let text = "transforms=outbox\n\
                transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n\
                table.include.list=public.outbox,billing\\\\.outbox, shipping.outbox\n\
                transforms.outbox.route.by.field=topic\n\
                transforms.outbox.route.topic.replacement=${routedByValue}\n";
    let converted = convert(text).unwrap();
    let config = validated(&converted);
    assert_eq!(config.outbox.table, "public.outbox");
    let tables: Vec<&str> = config
        .outbox
        .tables
        .iter()
        .map(|t| t.table.as_str())
        .collect();
    assert_eq!(tables, ["billing.outbox", "shipping.outbox"]);
    assert_eq!(config.outbox.aggregate_type_column, "topic");
    assert_eq!(config.outbox.topic, "{aggregatetype}");
}

#[test]
fn debeziums_slot_is_reused_only_with_a_publication_of_the_outbox_tables_alone() {
    let base = "transforms=outbox\n\
                transforms.outbox.type=io.debezium.transforms.outbox.EventRouter\n\
                slot.name=orders_slot\n\
                publication.name=orders_pub\n";
    let filtered = convert(&format!("{base}publication.autocreate.mode=filtered\n")).unwrap();
    let config = validated(&filtered);
    assert_eq!(config.postgres.slot, "orders_slot");
    assert_eq!(config.postgres.publication, "orders_pub");
    assert!(filtered.unmapped.is_empty(), "{:?}", filtered.unmapped);

    for mode in ["", "publication.autocreate.mode=all_tables\n"] {
        let all_tables = convert(&format!("{base}{mode}")).unwrap();
        let config = validated(&all_tables);
        assert_eq!(config.postgres.slot, "outbox_relay", "{mode}");
        assert_eq!(config.postgres.publication, "outbox_relay_pub", "{mode}");
        let left = unmapped_keys(&all_tables);
        assert_eq!(left, ["slot.name", "publication.name"], "{mode}");
    }
}
