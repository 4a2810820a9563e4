//! `outbox-relay config --from-debezium` end to end: a Debezium connector configuration with
//! the outbox event router, translated, runs a relay that puts each event where Debezium's
//! router puts it — the topic of `route.topic.replacement`, the key of
//! `table.field.event.key` (default: the aggregate id), the partition Kafka Connect's producer
//! picks for that key (murmur2 of its bytes), the payload as the value, header `id` and the
//! header placement's header. The relay also sends `type`, `aggregatetype` and `aggregateid`
//! headers, by design (docs/src/guides/from-debezium.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use outbox_relay::mapping::partition::partition_for_key;
use outbox_relay::ops::from_debezium::convert;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn converted_debezium_config_puts_events_where_the_router_would() {
    let db = TestDb::new().await;
    // The database's publication names the outbox alone (migrations/001_outbox.sql): the
    // translation reuses the connector's slot and publication, as after a cut-over.
    let connector = serde_json::json!({
        "name": "orders-outbox",
        "config": {
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "tasks.max": "1",
            "database.hostname": "localhost",
            "database.port": "5432",
            "database.user": "postgres",
            "database.dbname": db.name,
            "plugin.name": "pgoutput",
            "slot.name": db.slot,
            "publication.name": db.publication,
            "publication.autocreate.mode": "filtered",
            "table.include.list": "public.outbox",
            "tombstones.on.delete": "false",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "transforms": "outbox",
            "transforms.outbox.type": "io.debezium.transforms.outbox.EventRouter",
            "transforms.outbox.route.topic.replacement":
                format!("{}.${{routedByValue}}.events", db.topic_prefix),
            "transforms.outbox.table.fields.additional.placement": "type:header:eventType"
        }
    });
    let converted = convert(&connector.to_string()).expect("translate the connector");
    let config = write_config("from_debezium", &converted.toml);
    // The harness's URL (its host, port and password) and brokers; the rest from the file.
    let mut env: Vec<(String, String)> = db
        .relay_env()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("OUTBOX_RELAY__OUTBOX__"))
        .filter(|(k, _)| {
            k != "OUTBOX_RELAY__POSTGRES__SLOT" && k != "OUTBOX_RELAY__POSTGRES__PUBLICATION"
        })
        .collect();
    env.push((
        "OUTBOX_RELAY_CONFIG".into(),
        config.to_string_lossy().into_owned(),
    ));
    let topic = format!("{}.Order.events", db.topic_prefix);
    create_topic(&topic, 3).await;
    let mut relay = RelayProcess::start(&env, "from_debezium");
    wait_for_slot(&db, &mut relay).await;

    let mut events = Vec::new();
    for i in 0..12 {
        let mut event = Event::new("Order", &format!("order-{}", i % 4), 0, i);
        event.event_type = format!("OrderCreated{}", i % 2);
        events.push(event);
    }
    let mut client = db.client().await;
    for event in &events {
        insert_events(&mut client, std::slice::from_ref(event), true).await;
    }
    let seen: Arc<Mutex<HashMap<String, ()>>> = Arc::default();
    let counter = seen.clone();
    let wanted = events.len();
    let received = read_until(
        std::slice::from_ref(&topic),
        3,
        Duration::from_secs(60),
        Duration::from_secs(2),
        move |r| {
            let mut seen = counter.lock().unwrap();
            if let Some(id) = r.header("id") {
                seen.insert(id.to_string(), ());
            }
            seen.len() >= wanted
        },
    )
    .await;
    let by_id: HashMap<String, &Received> = received
        .iter()
        .filter_map(|r| Some((r.header("id")?.to_string(), r)))
        .collect();
    let missing: Vec<&str> = events
        .iter()
        .filter(|e| !by_id.contains_key(&e.id))
        .map(|e| e.id.as_str())
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} events missing: {missing:?}\n{}",
        missing.len(),
        events.len(),
        relay.log_text()
    );
    assert_eq!(received.len(), events.len(), "each event once");
    for event in &events {
        let r = by_id[&event.id];
        assert_eq!(r.topic, topic, "route.topic.replacement");
        assert_eq!(
            r.key_str(),
            event.aggregate_id,
            "table.field.event.key's default"
        );
        assert_eq!(
            r.partition,
            partition_for_key(event.aggregate_id.as_bytes(), 3),
            "Kafka Connect's producer: murmur2 of the key"
        );
        assert_eq!(r.payload.as_deref(), Some(event.payload.as_bytes()));
        assert_eq!(
            r.header("eventType"),
            Some(event.event_type.as_str()),
            "header placement"
        );
        // By design, on top of what the router sends.
        assert_eq!(r.header("type"), Some(event.event_type.as_str()));
        assert_eq!(r.header("aggregatetype"), Some("Order"));
        assert_eq!(r.header("aggregateid"), Some(event.aggregate_id.as_str()));
    }
    relay.terminate(Duration::from_secs(30));
    db.cleanup().await;
}
