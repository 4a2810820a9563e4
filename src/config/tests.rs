use std::path::Path;

use super::kafka::OWNED_KAFKA_PROPERTIES;
use super::secret::redact_connection_string;
use super::*;

type Table = toml::map::Map<String, toml::Value>;

const EXAMPLE: &str = include_str!("../../config/outbox-relay.toml");

fn no_env() -> Vec<(String, String)> {
    Vec::new()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn from_env(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    Config::from_sources(None, env(pairs))
}

fn from_toml(text: &str) -> Result<Config, ConfigError> {
    Config::from_sources(Some(text), no_env())
}

/// Asserts that `config` fails validation with an `Invalid` error for `field`.
fn assert_invalid(config: &Config, field: &str) -> String {
    match config.validate() {
        Err(err @ ConfigError::Invalid { .. }) => {
            let message = err.to_string();
            let ConfigError::Invalid { field: got, .. } = &err else {
                unreachable!()
            };
            assert_eq!(got, field, "{message}");
            assert!(message.contains(field), "{message}");
            message
        }
        other => panic!("expected Invalid {{ field: {field} }}, got {other:?}"),
    }
}

fn with(edit: impl FnOnce(&mut Config)) -> Config {
    let mut config = Config::default();
    edit(&mut config);
    config
}

#[test]
fn defaults_validate() {
    Config::default().validate().unwrap();
    assert_eq!(
        Config::from_sources(None, no_env()).unwrap(),
        Config::default()
    );
}

#[test]
fn example_file_loads_and_lists_the_defaults() {
    let config = from_toml(EXAMPLE).unwrap();
    assert_eq!(config, Config::default());
}

#[test]
fn example_file_has_every_key() {
    let file: Table = EXAMPLE.parse().unwrap();
    let defaults = match toml::Value::try_from(Config::default()).unwrap() {
        toml::Value::Table(t) => t,
        _ => unreachable!(),
    };
    for (section, keys) in &defaults {
        let keys = keys.as_table().unwrap();
        let in_file = file[section].as_table().unwrap();
        for key in keys.keys() {
            assert!(in_file.contains_key(key), "example lacks {section}.{key}");
        }
    }
}

#[test]
fn load_reads_the_example_file() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/outbox-relay.toml");
    Config::load(Some(&path)).unwrap();
}

#[test]
fn load_names_a_missing_file() {
    let path = Path::new("/nonexistent/outbox-relay.toml");
    let err = Config::load(Some(path)).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }));
    assert!(
        err.to_string().contains("/nonexistent/outbox-relay.toml"),
        "{err}"
    );
}

#[test]
fn env_overrides_strings() {
    let config = from_env(&[
        (
            "OUTBOX_RELAY__POSTGRES__URL",
            "postgres://relay:pw@db.internal:6432/app",
        ),
        ("OUTBOX_RELAY__POSTGRES__SLOT", "orders_slot"),
        ("OUTBOX_RELAY__POSTGRES__PUBLICATION", "orders_pub"),
        ("OUTBOX_RELAY__OUTBOX__TABLE", "sales.outbox_events"),
        ("OUTBOX_RELAY__KAFKA__BROKERS", "k1:9092,k2:9092"),
        ("UNRELATED", "ignored"),
    ])
    .unwrap();
    assert_eq!(
        config.postgres.url,
        "postgres://relay:pw@db.internal:6432/app"
    );
    assert_eq!(config.postgres.slot, "orders_slot");
    assert_eq!(config.postgres.publication, "orders_pub");
    assert_eq!(config.outbox.table, "sales.outbox_events");
    assert_eq!(
        config.outbox.schema_and_table(),
        ("sales".to_string(), "outbox_events".to_string())
    );
    assert_eq!(config.kafka.brokers, "k1:9092,k2:9092");
}

#[test]
fn env_overrides_convert_numbers_and_booleans() {
    let config = from_env(&[
        ("OUTBOX_RELAY__KAFKA__MAX_IN_FLIGHT_MESSAGES", "5000"),
        ("OUTBOX_RELAY__POSTGRES__CREATE_SLOT", "false"),
        ("OUTBOX_RELAY__KAFKA__ALLOW_UNSAFE_KAFKA_SETTINGS", "TRUE"),
        ("OUTBOX_RELAY__KAFKA__COMPRESSION", "zstd"),
        ("OUTBOX_RELAY__RELAY__LOG_FORMAT", "json"),
    ])
    .unwrap();
    assert_eq!(config.kafka.max_in_flight_messages, 5000);
    assert!(!config.postgres.create_slot);
    assert!(config.kafka.allow_unsafe_kafka_settings);
    assert_eq!(config.kafka.compression, Compression::Zstd);
    assert_eq!(config.relay.log_format, LogFormat::Json);
}

#[test]
fn env_overrides_beat_the_file() {
    let config = Config::from_sources(
        Some("[postgres]\nslot = \"from_file\"\n"),
        env(&[("OUTBOX_RELAY__POSTGRES__SLOT", "from_env")]),
    )
    .unwrap();
    assert_eq!(config.postgres.slot, "from_env");
}

#[test]
fn env_sets_kafka_properties_with_dotted_lower_case_keys() {
    let config = from_env(&[
        (
            "OUTBOX_RELAY__KAFKA__PROPERTIES__SOCKET_TIMEOUT_MS",
            "60000",
        ),
        ("OUTBOX_RELAY__KAFKA__PROPERTIES__CLIENT_RACK", "rack-a"),
    ])
    .unwrap();
    assert_eq!(config.kafka.properties["socket.timeout.ms"], "60000");
    assert_eq!(config.kafka.properties["client.rack"], "rack-a");
}

#[test]
fn env_unparsable_number_names_variable_and_type() {
    let err = from_env(&[("OUTBOX_RELAY__KAFKA__MAX_IN_FLIGHT_MESSAGES", "lots")]).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, ConfigError::Env { .. }));
    assert!(
        message.contains("OUTBOX_RELAY__KAFKA__MAX_IN_FLIGHT_MESSAGES"),
        "{message}"
    );
    assert!(message.contains("integer"), "{message}");
    assert!(
        !message.contains("lots"),
        "values are not echoed: {message}"
    );

    let err = from_env(&[("OUTBOX_RELAY__KAFKA__LINGER_MS", "-1")]).unwrap_err();
    assert!(err.to_string().contains("non-negative integer"), "{err}");

    let err = from_env(&[("OUTBOX_RELAY__POSTGRES__CREATE_SLOT", "yes")]).unwrap_err();
    assert!(err.to_string().contains("boolean"), "{err}");
}

#[test]
fn env_unknown_key_or_section_is_an_error() {
    for var in [
        "OUTBOX_RELAY__POSTGRES__SLOTT",
        "OUTBOX_RELAY__NOPE__SLOT",
        "OUTBOX_RELAY__POSTGRES",
        "OUTBOX_RELAY__POSTGRES__SLOT__X",
        "OUTBOX_RELAY__",
    ] {
        let err = from_env(&[(var, "x")]).unwrap_err();
        assert!(matches!(err, ConfigError::Env { .. }), "{var}: {err:?}");
        assert!(err.to_string().contains(var), "{err}");
    }
    let err = from_env(&[("OUTBOX_RELAY__KAFKA__PROPERTIES", "x")]).unwrap_err();
    assert!(err.to_string().contains("section"), "{err}");
    let err = from_env(&[("OUTBOX_RELAY__KAFKA__PROPERTIES__", "x")]).unwrap_err();
    assert!(matches!(err, ConfigError::Env { .. }), "{err:?}");
}

#[test]
fn unknown_file_key_names_key_section_and_file() {
    let err = from_toml("[postgres]\nslot_name = \"x\"\n").unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, ConfigError::Parse { .. }));
    assert!(message.contains("slot_name"), "{message}");
    assert!(message.contains("[postgres]"), "{message}");
    assert!(message.contains("config text"), "{message}");

    let err = from_toml("[kafkaa]\nbrokers = \"x\"\n").unwrap_err();
    assert!(err.to_string().contains("[kafkaa]"), "{err}");
}

#[test]
fn load_errors_name_the_file() {
    let dir = std::env::temp_dir().join(format!("outbox-relay-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(&path, "[relay]\nshutdown_timeout = 5\n").unwrap();
    let err = Config::load(Some(&path)).unwrap_err();
    let _ = std::fs::remove_dir_all(&dir);
    let message = err.to_string();
    assert!(message.contains("bad.toml"), "{message}");
    assert!(message.contains("shutdown_timeout"), "{message}");
}

#[test]
fn wrong_types_and_syntax_errors_are_one_line() {
    let err = from_toml("[kafka]\nlinger_ms = \"5\"\n").unwrap_err();
    let message = err.to_string();
    assert!(
        message.contains("kafka.linger_ms") && message.contains("integer"),
        "{message}"
    );

    let err = from_toml("[kafka]\nlinger_ms = -5\n").unwrap_err();
    assert!(err.to_string().contains("kafka.linger_ms"), "{err}");

    let err = from_toml("postgres = 3\n").unwrap_err();
    assert!(err.to_string().contains("section"), "{err}");

    let err = from_toml("[postgres\nslot = 1\n").unwrap_err();
    let message = err.to_string();
    assert!(message.contains("line 1"), "{message}");
    assert!(!message.contains('\n'), "{message}");
}

#[test]
fn file_properties_accept_bare_dotted_keys_and_scalars() {
    let config = from_toml(
        "[kafka.properties]\nsocket.timeout.ms = 60000\n\"client.rack\" = \"ssl\"\n\
         enable.idempotence = true\n",
    )
    .unwrap();
    assert_eq!(config.kafka.properties["socket.timeout.ms"], "60000");
    assert_eq!(config.kafka.properties["client.rack"], "ssl");
    assert_eq!(config.kafka.properties["enable.idempotence"], "true");
}

#[test]
fn network_rules_name_their_field() {
    Config::default().validate().unwrap();
    for (config, field) in [
        (
            with(|c| c.postgres.keepalives_idle_ms = 999),
            "postgres.keepalives_idle_ms",
        ),
        (
            with(|c| c.postgres.keepalives_interval_ms = 0),
            "postgres.keepalives_interval_ms",
        ),
        (
            with(|c| c.postgres.keepalives_retries = 0),
            "postgres.keepalives_retries",
        ),
        (
            with(|c| c.postgres.keepalives_retries = 128),
            "postgres.keepalives_retries",
        ),
        (
            with(|c| c.postgres.tcp_user_timeout_ms = 500),
            "postgres.tcp_user_timeout_ms",
        ),
    ] {
        assert_invalid(&config, field);
    }
    let message = assert_invalid(
        &with(|c| c.postgres.receive_timeout_ms = 1_500),
        "postgres.receive_timeout_ms",
    );
    assert!(message.contains("2000 ms"), "{message}");
    with(|c| c.postgres.receive_timeout_ms = 2_000)
        .validate()
        .unwrap();
    with(|c| c.postgres.tcp_user_timeout_ms = 0)
        .validate()
        .unwrap();
    let from_env = from_env(&[("OUTBOX_RELAY__POSTGRES__RECEIVE_TIMEOUT_MS", "4000")]).unwrap();
    assert_eq!(from_env.postgres.receive_timeout_ms, 4_000);
}

#[test]
fn binary_mode_is_off_unless_asked_for() {
    assert!(!Config::default().postgres.binary);
    let from_file = from_toml("[postgres]\nbinary = true\n").unwrap();
    assert!(from_file.postgres.binary);
    from_file.validate().unwrap();
    let overridden = from_env(&[("OUTBOX_RELAY__POSTGRES__BINARY", "true")]).unwrap();
    assert!(overridden.postgres.binary);
    let err = from_env(&[("OUTBOX_RELAY__POSTGRES__BINARY", "on")]).unwrap_err();
    assert!(err.to_string().contains("boolean"), "{err}");
}

#[test]
fn keepalives_come_from_the_keys_or_the_url() {
    use std::time::Duration;
    let defaults = PostgresConfig::default().tcp_keepalive();
    assert_eq!(
        defaults,
        TcpKeepalive {
            enabled: true,
            idle: Duration::from_secs(30),
            interval: Duration::from_secs(10),
            retries: 3,
            user_timeout: Some(Duration::from_secs(60)),
        }
    );
    let url = PostgresConfig {
        url: "postgres://u@db/app?keepalives_idle=5&keepalives_interval=2&keepalives_retries=4&tcp_user_timeout=9000&sslmode=require".into(),
        ..PostgresConfig::default()
    };
    assert_eq!(
        url.tcp_keepalive(),
        TcpKeepalive {
            enabled: true,
            idle: Duration::from_secs(5),
            interval: Duration::from_secs(2),
            retries: 4,
            user_timeout: Some(Duration::from_millis(9_000)),
        }
    );
    // Keys set in the config win over the URL.
    let keyed = PostgresConfig {
        keepalives_idle_ms: 7_000,
        tcp_user_timeout_ms: 0,
        ..url.clone()
    };
    let resolved = keyed.tcp_keepalive();
    assert_eq!(resolved.idle, Duration::from_secs(7));
    assert_eq!(resolved.user_timeout, None);
    let off = PostgresConfig {
        url: "host=db user=u keepalives=0".into(),
        ..PostgresConfig::default()
    };
    assert!(!off.tcp_keepalive().enabled);
}

#[test]
fn postgres_rules_name_their_field() {
    assert_invalid(&with(|c| c.postgres.url = String::new()), "postgres.url");
    assert_invalid(
        &with(|c| c.postgres.url = "postgres://127.0.0.1/db".into()),
        "postgres.url",
    );
    assert_invalid(
        &with(|c| c.postgres.url = "postgres://user@/db".into()),
        "postgres.url",
    );
    assert_invalid(
        &with(|c| c.postgres.url = "postgres://u@h:notaport/db".into()),
        "postgres.url",
    );
    with(|c| c.postgres.url = "host=db user=relay password='a b' dbname=app".into())
        .validate()
        .unwrap();
    for slot in ["", "Outbox", "out-box", &"a".repeat(64)] {
        assert_invalid(
            &with(|c| c.postgres.slot = slot.to_string()),
            "postgres.slot",
        );
    }
    with(|c| c.postgres.slot = "a".repeat(63))
        .validate()
        .unwrap();
    assert_invalid(
        &with(|c| c.postgres.publication = String::new()),
        "postgres.publication",
    );
    assert_invalid(
        &with(|c| c.postgres.publication = "p".repeat(64)),
        "postgres.publication",
    );
    with(|c| c.postgres.publication = "Mixed Case-pub".into())
        .validate()
        .unwrap();
    let message = assert_invalid(
        &with(|c| c.postgres.status_interval_ms = 0),
        "postgres.status_interval_ms",
    );
    assert!(message.contains("between 1 and 30000 (ms)"), "{message}");
    assert_invalid(
        &with(|c| c.postgres.status_interval_ms = 30_001),
        "postgres.status_interval_ms",
    );
    assert_invalid(
        &with(|c| c.postgres.connect_timeout_ms = 0),
        "postgres.connect_timeout_ms",
    );
    assert_invalid(
        &with(|c| c.postgres.reconnect_backoff_initial_ms = 0),
        "postgres.reconnect_backoff_initial_ms",
    );
    assert_invalid(
        &with(|c| c.postgres.reconnect_backoff_max_ms = 100),
        "postgres.reconnect_backoff_max_ms",
    );
}

#[test]
fn outbox_rules_name_their_field() {
    assert_invalid(&with(|c| c.outbox.table = String::new()), "outbox.table");
    assert_invalid(&with(|c| c.outbox.table = "a.b.c".into()), "outbox.table");
    assert_invalid(&with(|c| c.outbox.table = ".outbox".into()), "outbox.table");
    assert_invalid(
        &with(|c| c.outbox.table = format!("public.{}", "t".repeat(64))),
        "outbox.table",
    );
    let config = with(|c| c.outbox.table = "Outbox".into());
    config.validate().unwrap();
    assert_eq!(
        config.outbox.schema_and_table(),
        ("public".to_string(), "Outbox".to_string())
    );

    assert_invalid(&with(|c| c.outbox.topic = String::new()), "outbox.topic");
    let message = assert_invalid(
        &with(|c| c.outbox.topic = "events.{foo}".into()),
        "outbox.topic",
    );
    assert!(message.contains("{foo}"), "{message}");
    assert_invalid(
        &with(|c| c.outbox.topic = "events.{type".into()),
        "outbox.topic",
    );
    assert_invalid(
        &with(|c| c.outbox.topic = "events/{type}".into()),
        "outbox.topic",
    );
    with(|c| c.outbox.topic = "{schema}.{table}.{aggregatetype}.{type}-{id}_{aggregateid}".into())
        .validate()
        .unwrap();

    assert_invalid(
        &with(|c| c.outbox.id_column = String::new()),
        "outbox.id_column",
    );
    assert_invalid(
        &with(|c| c.outbox.aggregate_type_column = String::new()),
        "outbox.aggregate_type_column",
    );
    assert_invalid(
        &with(|c| c.outbox.aggregate_id_column = "c".repeat(64)),
        "outbox.aggregate_id_column",
    );
    assert_invalid(
        &with(|c| c.outbox.type_column = String::new()),
        "outbox.type_column",
    );
    assert_invalid(
        &with(|c| c.outbox.payload_column = String::new()),
        "outbox.payload_column",
    );
}

#[test]
fn outbox_tables_inherit_the_top_level_mapping() {
    let config = from_toml(
        r#"
[outbox]
table = "public.outbox"
topic = "events.{aggregatetype}"
partition_by = "key"
topic_overrides = { order = "orders.v2" }
header_columns = { tenant = "x-tenant" }
null_payload = "tombstone"

[[outbox.tables]]
table = "tenant_b.outbox"
topic = "b.{aggregatetype}"

[[outbox.tables]]
table = "billing.events"
aggregate_id_column = "invoice_id"
header_columns = {}
envelope = true
"#,
    )
    .unwrap();
    let tables = config.outbox.table_configs();
    assert_eq!(tables.len(), 3);
    assert_eq!(
        config.outbox.publication_tables(),
        vec![
            ("public".to_string(), "outbox".to_string()),
            ("tenant_b".to_string(), "outbox".to_string()),
            ("billing".to_string(), "events".to_string()),
        ]
    );
    let b = &tables[1];
    assert_eq!(b.topic, "b.{aggregatetype}");
    assert_eq!(b.partition_by, "key");
    assert_eq!(b.null_payload, NullPayload::Tombstone);
    assert_eq!(b.topic_overrides["order"], "orders.v2");
    assert_eq!(b.header_columns["tenant"], "x-tenant");
    assert!(b.tables.is_empty());
    let billing = &tables[2];
    assert_eq!(billing.topic, "events.{aggregatetype}");
    assert_eq!(billing.aggregate_id_column, "invoice_id");
    assert!(billing.header_columns.is_empty());
    assert!(billing.envelope);
    assert!(!tables[0].envelope);

    // The effective configuration renders as a loadable file.
    let reparsed = from_toml(&config.to_redacted_toml()).unwrap();
    assert_eq!(reparsed.outbox, config.outbox);
}

#[test]
fn outbox_mapping_keys_are_validated_per_table() {
    assert_invalid(&with(|c| c.outbox.table = String::new()), "outbox.table");
    with(|c| {
        c.outbox.table = String::new();
        c.outbox.message_prefix = Some("outbox".into());
    })
    .validate()
    .unwrap();
    let entry = |table: &str| OutboxTableConfig {
        table: table.into(),
        ..OutboxTableConfig::default()
    };
    let message = assert_invalid(
        &with(|c| c.outbox.tables.push(entry("public.outbox"))),
        "outbox.tables[0].table",
    );
    assert!(message.contains("twice"), "{message}");
    assert_invalid(
        &with(|c| c.outbox.tables.push(entry("a.b.c"))),
        "outbox.tables[0].table",
    );
    assert_invalid(
        &with(|c| {
            c.outbox.tables.push(entry("s.t"));
            c.outbox.tables.push(OutboxTableConfig {
                topic: Some("bad/{type}".into()),
                ..entry("s.u")
            });
        }),
        "outbox.tables[1].topic",
    );
    assert_invalid(
        &with(|c| {
            c.outbox
                .topic_overrides
                .insert("order".into(), "x.{nope}".into());
        }),
        "outbox.topic_overrides.order",
    );
    assert_invalid(
        &with(|c| {
            c.outbox
                .header_columns
                .insert("tenant".into(), String::new());
        }),
        "outbox.header_columns.tenant",
    );
    assert_invalid(
        &with(|c| c.outbox.partition_by = String::new()),
        "outbox.partition_by",
    );
    assert_invalid(
        &with(|c| c.outbox.timestamp_column = Some("t".repeat(64))),
        "outbox.timestamp_column",
    );
    assert_invalid(
        &with(|c| {
            c.outbox.tracing_column = Some("span".into());
            c.outbox.tracing_header = String::new();
        }),
        "outbox.tracing_header",
    );
    assert_invalid(
        &with(|c| c.outbox.sweeper.retention_ms = 0),
        "outbox.sweeper.retention_ms",
    );
    assert_invalid(
        &with(|c| c.outbox.sweeper.batch_size = MAX_SWEEPER_BATCH_SIZE + 1),
        "outbox.sweeper.batch_size",
    );
    assert_invalid(
        &with(|c| c.outbox.sweeper.interval_ms = 0),
        "outbox.sweeper.interval_ms",
    );

    let err = from_toml("[outbox]\nnull_payload = \"drop\"\n").unwrap_err();
    assert!(err.to_string().contains("outbox.null_payload"), "{err}");
    let err = from_toml("[outbox]\ntopic_overrides = { order = 1 }\n").unwrap_err();
    assert!(
        err.to_string().contains("outbox.topic_overrides.order"),
        "{err}"
    );
    let err = from_toml("[outbox]\ntables = \"x\"\n").unwrap_err();
    assert!(err.to_string().contains("outbox.tables"), "{err}");
    let err = from_toml("[[outbox.tables]]\ntable = \"s.t\"\ntopics = \"x\"\n").unwrap_err();
    assert!(err.to_string().contains("topics"), "{err}");
}

#[test]
fn env_overrides_reach_the_new_outbox_keys() {
    let config = from_env(&[
        ("OUTBOX_RELAY__OUTBOX__PARTITION_BY", "key"),
        ("OUTBOX_RELAY__OUTBOX__ENVELOPE", "true"),
        ("OUTBOX_RELAY__OUTBOX__NULL_PAYLOAD", "tombstone"),
        ("OUTBOX_RELAY__OUTBOX__MESSAGE_PREFIX", "outbox"),
        ("OUTBOX_RELAY__OUTBOX__TIMESTAMP_COLUMN", "occurred_at"),
        ("OUTBOX_RELAY__OUTBOX__SWEEPER__ENABLED", "true"),
        ("OUTBOX_RELAY__OUTBOX__SWEEPER__RETENTION_MS", "60000"),
    ])
    .unwrap();
    let o = &config.outbox;
    assert_eq!(o.partition_by, "key");
    assert!(o.envelope);
    assert_eq!(o.null_payload, NullPayload::Tombstone);
    assert!(o.messages_enabled());
    assert_eq!(o.timestamp_column.as_deref(), Some("occurred_at"));
    assert!(o.sweeper.enabled);
    assert_eq!(o.sweeper.retention_ms, 60_000);
    let err = from_env(&[("OUTBOX_RELAY__OUTBOX__TABLES", "x")]).unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot be set from the environment"),
        "{err}"
    );
}

#[test]
fn kafka_and_relay_rules_name_their_field() {
    assert_invalid(&with(|c| c.kafka.brokers = " ".into()), "kafka.brokers");
    assert_invalid(
        &with(|c| c.kafka.brokers = "a:9092,".into()),
        "kafka.brokers",
    );
    assert_invalid(
        &with(|c| c.kafka.client_id = String::new()),
        "kafka.client_id",
    );
    assert_invalid(
        &with(|c| c.kafka.max_in_flight_messages = 0),
        "kafka.max_in_flight_messages",
    );
    assert_invalid(
        &with(|c| c.kafka.max_in_flight_bytes = MIN_MAX_IN_FLIGHT_BYTES - 1),
        "kafka.max_in_flight_bytes",
    );
    with(|c| c.kafka.max_in_flight_bytes = MIN_MAX_IN_FLIGHT_BYTES)
        .validate()
        .unwrap();
    assert_invalid(
        &with(|c| c.kafka.linger_ms = MAX_LINGER_MS + 1),
        "kafka.linger_ms",
    );
    assert_invalid(
        &with(|c| c.kafka.batch_num_messages = 0),
        "kafka.batch_num_messages",
    );
    assert_invalid(
        &with(|c| c.kafka.message_timeout_ms = 999),
        "kafka.message_timeout_ms",
    );

    let err = from_toml("[kafka]\ncompression = \"brotli\"\n").unwrap_err();
    assert!(err.to_string().contains("kafka.compression"), "{err}");
    assert!(matches!(err, ConfigError::Invalid { .. }));
    let err = from_env(&[("OUTBOX_RELAY__RELAY__LOG_FORMAT", "xml")]).unwrap_err();
    assert!(err.to_string().contains("relay.log_format"), "{err}");
    assert_eq!(
        from_toml("[kafka]\ncompression = \"none\"\n")
            .unwrap()
            .kafka
            .compression,
        Compression::None
    );
}

#[test]
fn unsafe_kafka_properties_are_refused_unless_allowed() {
    let cases = [
        ("acks", "1"),
        ("request.required.acks", "0"),
        ("enable.idempotence", "false"),
        ("max.in.flight.requests.per.connection", "6"),
        ("message.send.max.retries", "0"),
        ("retries", "0"),
        ("delivery.report.only.error", "true"),
        ("enable.gapless.guarantee", "false"),
    ];
    for (key, value) in cases {
        let config = with(|c| {
            c.kafka
                .properties
                .insert(key.to_string(), value.to_string());
        });
        let message = assert_invalid(&config, &format!("kafka.properties.{key}"));
        assert!(message.contains("allow_unsafe_kafka_settings"), "{message}");
        assert_eq!(config.kafka.unsafe_properties().len(), 1, "{key}");

        let allowed = with(|c| {
            c.kafka
                .properties
                .insert(key.to_string(), value.to_string());
            c.kafka.allow_unsafe_kafka_settings = true;
        });
        allowed.validate().unwrap();
    }
    let safe = [
        ("acks", "all"),
        ("acks", "-1"),
        ("enable.idempotence", "true"),
        ("max.in.flight.requests.per.connection", "5"),
        ("retries", "10"),
        ("enable.gapless.guarantee", "true"),
        ("queue.buffering.backpressure.threshold", "1"),
        ("delivery.report.only.error", "false"),
        ("partitioner", "murmur2_random"),
    ];
    for (key, value) in safe {
        let config = with(|c| {
            c.kafka
                .properties
                .insert(key.to_string(), value.to_string());
        });
        config.validate().unwrap();
        assert!(config.kafka.unsafe_properties().is_empty(), "{key}");
    }
}

#[test]
fn relay_owned_kafka_properties_point_to_their_field() {
    for (key, field) in OWNED_KAFKA_PROPERTIES {
        let config = with(|c| {
            c.kafka.properties.insert(key.to_string(), "x".to_string());
            c.kafka.allow_unsafe_kafka_settings = true;
        });
        let message = assert_invalid(&config, &format!("kafka.properties.{key}"));
        assert!(message.contains(field), "{message}");
    }
    let err =
        from_env(&[("OUTBOX_RELAY__KAFKA__PROPERTIES__BOOTSTRAP_SERVERS", "x:1")]).unwrap_err();
    assert!(err.to_string().contains("kafka.brokers"), "{err}");
}

#[test]
fn url_may_carry_every_libpq_sslmode() {
    for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
        let url = format!("postgres://u@db/app?sslmode={mode}&sslrootcert=/ca.pem");
        from_env(&[("OUTBOX_RELAY__POSTGRES__URL", &url)]).unwrap();
    }
    let err = from_env(&[(
        "OUTBOX_RELAY__POSTGRES__URL",
        "postgres://u@db/app?sslmode=paranoid",
    )])
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("postgres.url") && err.contains("paranoid"),
        "{err}"
    );
}

#[test]
fn kafka_sasl_fields_are_checked_together_and_the_password_hidden() {
    let sasl = |protocol: &str, mechanism: &str, user: &str| {
        from_env(&[
            ("OUTBOX_RELAY__KAFKA__SECURITY_PROTOCOL", protocol),
            ("OUTBOX_RELAY__KAFKA__SASL_MECHANISM", mechanism),
            ("OUTBOX_RELAY__KAFKA__SASL_USERNAME", user),
            ("OUTBOX_RELAY__KAFKA__SASL_PASSWORD", "s3cret-pw"),
        ])
    };
    let config = sasl("sasl_ssl", "SCRAM-SHA-512", "relay").unwrap();
    assert_eq!(
        config.kafka.security_protocol,
        KafkaSecurityProtocol::SaslSsl
    );
    assert!(!format!("{config:?}").contains("s3cret-pw"));
    assert!(!config.to_redacted_toml().contains("s3cret-pw"));
    let err = sasl("sasl_plaintext", "GSSAPI", "relay")
        .unwrap_err()
        .to_string();
    assert!(err.contains("kafka.sasl_mechanism"), "{err}");
    let err = sasl("sasl_plaintext", "PLAIN", "").unwrap_err().to_string();
    assert!(err.contains("kafka.sasl_username"), "{err}");
    let err = sasl("plaintext", "PLAIN", "relay").unwrap_err().to_string();
    assert!(err.contains("only used with"), "{err}");
    let err = from_env(&[("OUTBOX_RELAY__KAFKA__SECURITY_PROTOCOL", "tls")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("kafka.security_protocol"), "{err}");
    let err = from_env(&[("OUTBOX_RELAY__KAFKA__PROPERTIES__SASL_PASSWORD", "x")])
        .unwrap_err()
        .to_string();
    assert!(err.contains("kafka.sasl_password"), "{err}");
}

#[test]
fn secrets_are_hidden_in_debug_and_redacted_toml() {
    let config = with(|c| {
        c.postgres.url = "postgres://relay:hunter2@db:5432/app?sslmode=disable".into();
        c.kafka
            .properties
            .insert("ssl.keystore.password".into(), "kafkapass".into());
        c.kafka.properties.insert(
            "sasl.jaas.config".into(),
            "user=\"u\" password=\"jaaspass\"".into(),
        );
        c.kafka
            .properties
            .insert("ssl.key.pem".into(), "PEMDATA".into());
        c.kafka
            .properties
            .insert("socket.timeout.ms".into(), "60000".into());
    });
    config.validate().unwrap();
    assert_eq!(
        config.postgres.redacted_url(),
        "postgres://relay:***@db:5432/app?sslmode=disable"
    );
    let debug = format!("{config:?}");
    let rendered = config.to_redacted_toml();
    for shown in [&debug, &rendered] {
        for secret in ["hunter2", "kafkapass", "jaaspass", "PEMDATA"] {
            assert!(!shown.contains(secret), "{secret} leaked: {shown}");
        }
        assert!(
            shown.contains("postgres://relay:***@db:5432/app"),
            "{shown}"
        );
        assert!(shown.contains("60000"), "{shown}");
    }
    // The rendering is a loadable config.
    let reparsed = from_toml(&rendered).unwrap();
    assert_eq!(reparsed.kafka.properties["ssl.keystore.password"], "***");
    assert_eq!(reparsed.postgres.slot, config.postgres.slot);
}

#[test]
fn connection_string_redaction_covers_every_form() {
    let cases = [
        ("postgres://u@h/db", "postgres://u@h/db"),
        ("postgresql://u:p%40ss@h/db", "postgresql://u:***@h/db"),
        (
            "postgres://u@h/db?password=pw&sslmode=require",
            "postgres://u@h/db?password=***&sslmode=require",
        ),
        ("postgres://h:5432/db", "postgres://h:5432/db"),
        (
            "host=h user=u password=pw dbname=d",
            "host=h user=u password=*** dbname=d",
        ),
        (
            "host=h password = 'a \\' b' user=u",
            "host=h password = *** user=u",
        ),
        ("host=h password='unterminated", "***"),
    ];
    for (input, expected) in cases {
        assert_eq!(redact_connection_string(input), expected, "{input}");
    }
}

#[test]
fn password_comes_from_the_file_over_the_url() {
    let config = with(|c| c.postgres.url = "postgres://u:urlpw@h/db".into());
    assert_eq!(
        config.postgres.password().unwrap().unwrap().expose(),
        "urlpw"
    );
    assert_eq!(
        format!("{:?}", config.postgres.password().unwrap()),
        "Some(***)"
    );

    let dir = std::env::temp_dir().join(format!("outbox-relay-pw-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("pw");
    std::fs::write(&path, "  filepw\n").unwrap();
    let config = with(|c| {
        c.postgres.url = "postgres://u:urlpw@h/db".into();
        c.postgres.password_file = Some(path.clone());
    });
    assert_eq!(
        config.postgres.password().unwrap().unwrap().expose(),
        "filepw"
    );
    let _ = std::fs::remove_dir_all(&dir);

    let missing = with(|c| c.postgres.password_file = Some("/nonexistent/pw".into()));
    let err = missing.postgres.password().unwrap_err();
    assert!(err.to_string().contains("/nonexistent/pw"), "{err}");
}

#[test]
fn error_messages_are_single_lines() {
    let errors = [
        from_toml("[postgres]\nbogus = 1\n").unwrap_err(),
        from_env(&[("OUTBOX_RELAY__X__Y", "1")]).unwrap_err(),
        with(|c| c.postgres.slot = "X".into())
            .validate()
            .unwrap_err(),
    ];
    for err in errors {
        assert!(!err.to_string().contains('\n'), "{err}");
    }
}

#[test]
fn env_values_are_typed_by_their_key() {
    // A string key takes the value verbatim, even when it looks like a number or is quoted.
    let config = from_env(&[
        ("OUTBOX_RELAY__KAFKA__CLIENT_ID", "12345"),
        ("OUTBOX_RELAY__OUTBOX__MESSAGE_PREFIX", "\"quoted\""),
        ("OUTBOX_RELAY__KAFKA__PROPERTIES__SOCKET_TIMEOUT_MS", "2.0"),
    ])
    .unwrap();
    assert_eq!(config.kafka.client_id, "12345");
    assert_eq!(config.outbox.message_prefix.as_deref(), Some("\"quoted\""));
    assert_eq!(config.kafka.properties["socket.timeout.ms"], "2.0");
    // The variable overrides the file's bare dotted property.
    let config = Config::from_sources(
        Some("[kafka.properties]\nsocket.timeout.ms = 1\n"),
        env(&[("OUTBOX_RELAY__KAFKA__PROPERTIES__SOCKET_TIMEOUT_MS", "2")]),
    )
    .unwrap();
    assert_eq!(config.kafka.properties.len(), 1);
    assert_eq!(config.kafka.properties["socket.timeout.ms"], "2");
    // A value out of the key's range names the variable.
    let err =
        from_env(&[("OUTBOX_RELAY__POSTGRES__KEEPALIVES_RETRIES", "99999999999")]).unwrap_err();
    assert!(matches!(err, ConfigError::Env { .. }), "{err:?}");
    assert!(
        err.to_string().contains("postgres.keepalives_retries"),
        "{err}"
    );
}

#[test]
fn empty_strings_mean_unset() {
    let config = from_toml(
        "[postgres]\npassword_file = \"\"\nssl_root_cert = \"\"\n[http]\nlisten = \"\"\n\
         [outbox]\nmessage_prefix = \"\"\n[kafka]\nssl_ca_file = \"\"\nsasl_password = \"\"\n",
    )
    .unwrap();
    assert_eq!(config.postgres.password_file, None);
    assert_eq!(config.postgres.ssl_root_cert, None);
    assert_eq!(config.http.listen, None);
    assert_eq!(config.outbox.message_prefix, None);
    assert_eq!(config.kafka.ssl_ca_file, None);
    assert_eq!(config.kafka.sasl_password, None);
    assert!(!config.outbox.messages_enabled());
    // Unset keys are written back as "", so the rendering lists every key and reloads.
    let rendered = config.to_redacted_toml();
    assert!(rendered.contains("listen = \"\""), "{rendered}");
    assert_eq!(from_toml(&rendered).unwrap(), config);
    let set = from_env(&[("OUTBOX_RELAY__POSTGRES__SSL_ROOT_CERT", "/ca.pem")]);
    // ssl_root_cert needs a verifying ssl_mode: the rule still sees the key as set.
    assert!(set
        .unwrap_err()
        .to_string()
        .contains("postgres.ssl_root_cert"));
}

#[test]
fn file_errors_name_the_key_path() {
    let err = from_toml("[[outbox.tables]]\ntable = \"s.t\"\ntopics = \"x\"\n").unwrap_err();
    assert!(err.to_string().contains("[outbox.tables[0]]"), "{err}");
    let err = from_toml("[[outbox.tables]]\ntopic = \"x\"\n").unwrap_err();
    assert!(
        err.to_string()
            .contains("`outbox.tables[0].table` is required"),
        "{err}"
    );
    let err = from_toml("[kafka]\nlinger_ms = -5\n").unwrap_err();
    assert!(err.to_string().ends_with("found -5"), "{err}");
    let err = from_toml("[kafka.properties]\nx = [1]\n").unwrap_err();
    assert!(err.to_string().contains("`kafka.properties.x`"), "{err}");
}

#[test]
fn a_table_entry_may_clear_an_inherited_optional_column() {
    let config = from_toml(
        "[outbox]\nkey_column = \"k\"\n[[outbox.tables]]\ntable = \"s.t\"\nkey_column = \"\"\n\
         [[outbox.tables]]\ntable = \"s.u\"\n",
    )
    .unwrap();
    let tables = config.outbox.table_configs();
    assert_eq!(tables[0].key_column.as_deref(), Some("k"));
    assert_eq!(tables[1].key_column, None);
    assert_eq!(tables[2].key_column.as_deref(), Some("k"));
}

#[test]
fn the_early_commit_age_is_at_most_the_transaction_age() {
    let mut config = Config::default();
    config.kafka.transaction_max_ms = 50;
    config.kafka.transaction_min_ms = 50;
    config.validate().unwrap();
    config.kafka.transaction_min_ms = 51;
    let message = assert_invalid(&config, "kafka.transaction_min_ms");
    assert!(message.contains("transaction_max_ms"), "{message}");
}

#[test]
fn the_transaction_age_fits_a_transaction_timeout_set_in_the_properties() {
    let mut config = Config::default();
    config.kafka.delivery = Delivery::ExactlyOnce;
    config.kafka.transaction_max_ms = 10_000;
    config
        .kafka
        .properties
        .insert("transaction.timeout.ms".into(), "20000".into());
    config.validate().unwrap();
    config
        .kafka
        .properties
        .insert("transaction.timeout.ms".into(), "15000".into());
    let message = assert_invalid(&config, "kafka.transaction_max_ms");
    assert!(message.contains("transaction.timeout.ms"), "{message}");
    // At-least-once has no Kafka transactions.
    config.kafka.delivery = Delivery::AtLeastOnce;
    config.validate().unwrap();
}

#[test]
fn batching_is_adaptive_by_default_and_only_in_at_least_once() {
    let config = Config::default();
    assert_eq!(config.kafka.batching, Batching::Adaptive);
    assert!(config.kafka.adaptive_batching());
    let linger = from_toml("[kafka]\nbatching = \"linger\"\n").unwrap();
    assert!(!linger.kafka.adaptive_batching());
    // Exactly-once batches by its Kafka transactions.
    let eo = from_toml("[kafka]\ndelivery = \"exactly_once\"\n").unwrap();
    assert_eq!(eo.kafka.batching, Batching::Adaptive);
    assert!(!eo.kafka.adaptive_batching());
    let err = from_toml("[kafka]\nbatching = \"nagle\"\n").unwrap_err();
    assert!(err.to_string().contains("kafka.batching"), "{err}");
}
