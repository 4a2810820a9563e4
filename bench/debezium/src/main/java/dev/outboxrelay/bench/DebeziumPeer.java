package dev.outboxrelay.bench;

import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.connect.source.SourceRecord;

import io.debezium.embedded.Connect;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;
import io.debezium.engine.format.ChangeEventFormat;

/**
 * The benchmark's Debezium peer (`scripts/bench.sh --peer debezium`): Debezium's embedded
 * engine streaming an existing pgoutput slot through the Outbox Event Router into Kafka, as
 * a careful user runs it: every batch is acknowledged by Kafka before its offsets are
 * committed, and committed offsets are what the connector confirms to the slot.
 *
 * <p>Arguments are {@code key=value}: {@code host}, {@code port}, {@code user}, {@code
 * database}, {@code slot}, {@code publication}, {@code brokers}, {@code topic}, {@code
 * offsets} (the offsets file). It runs until SIGTERM (then it stops the engine and closes
 * the producer) or until the engine fails (exit 1).
 */
public final class DebeziumPeer {

    /** Offsets are flushed (and so the slot confirmed) this often. */
    static final String OFFSET_FLUSH_INTERVAL_MS = "100";
    /**
     * The connector confirms the commit position of the last transaction it emitted a record
     * after: without a heartbeat, the last transaction of a backlog stays unconfirmed until
     * another one comes (Debezium's documentation recommends heartbeats for this). A heartbeat
     * record goes to {@code __debezium-heartbeat.<topic>}.
     */
    static final String HEARTBEAT_INTERVAL_MS = "100";

    private DebeziumPeer() {}

    public static void main(String[] args) throws Exception {
        Map<String, String> a = arguments(args);
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(producerProperties(a))) {
            run(a, producer);
        }
    }

    private static void run(Map<String, String> a, KafkaProducer<byte[], byte[]> producer)
            throws InterruptedException {
        CountDownLatch done = new CountDownLatch(1);
        AtomicReference<Throwable> failure = new AtomicReference<>();
        DebeziumEngine<RecordChangeEvent<SourceRecord>> engine = DebeziumEngine.create(ChangeEventFormat.of(Connect.class))
                .using(engineProperties(a))
                .notifying(new AckingConsumer(producer))
                .using((success, message, error) -> {
                    if (!success) {
                        System.err.println("[debezium-peer] engine failed: " + message);
                        failure.set(error != null ? error : new IllegalStateException(message));
                    }
                    done.countDown();
                })
                .build();
        ExecutorService executor = Executors.newSingleThreadExecutor();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> stop(engine, done)));
        executor.execute(engine);
        done.await();
        executor.shutdown();
        if (failure.get() != null) {
            failure.get().printStackTrace();
            // The shutdown hook would wait for an engine that is already gone.
            Runtime.getRuntime().halt(1);
        }
    }

    /** SIGTERM: the engine commits what was acknowledged and stops. */
    private static void stop(DebeziumEngine<?> engine, CountDownLatch done) {
        try {
            engine.close();
            done.await(30, TimeUnit.SECONDS);
        } catch (Exception e) {
            e.printStackTrace();
        }
    }

    static Map<String, String> arguments(String[] args) {
        Map<String, String> a = new HashMap<>();
        for (String arg : args) {
            int eq = arg.indexOf('=');
            if (eq < 1) {
                throw new IllegalArgumentException("expected key=value, got " + arg);
            }
            a.put(arg.substring(0, eq), arg.substring(eq + 1));
        }
        return a;
    }

    private static String need(Map<String, String> a, String key) {
        String v = a.get(key);
        if (v == null) {
            throw new IllegalArgumentException("missing argument " + key + "=...");
        }
        return v;
    }

    /** The connector, its offsets and the Outbox Event Router. */
    static Properties engineProperties(Map<String, String> a) {
        Properties p = new Properties();
        p.setProperty("name", "outbox-bench-debezium");
        p.setProperty("connector.class", "io.debezium.connector.postgresql.PostgresConnector");
        p.setProperty("offset.storage", "org.apache.kafka.connect.storage.FileOffsetBackingStore");
        p.setProperty("offset.storage.file.filename", need(a, "offsets"));
        p.setProperty("offset.flush.interval.ms", OFFSET_FLUSH_INTERVAL_MS);
        p.setProperty("database.hostname", need(a, "host"));
        p.setProperty("database.port", need(a, "port"));
        p.setProperty("database.user", need(a, "user"));
        p.setProperty("database.password", a.getOrDefault("password", ""));
        p.setProperty("database.dbname", need(a, "database"));
        p.setProperty("topic.prefix", need(a, "topic"));
        p.setProperty("heartbeat.interval.ms", HEARTBEAT_INTERVAL_MS);
        // The slot and publication the benchmark made: stream, do not create or snapshot.
        p.setProperty("plugin.name", "pgoutput");
        p.setProperty("slot.name", need(a, "slot"));
        p.setProperty("publication.name", need(a, "publication"));
        p.setProperty("publication.autocreate.mode", "disabled");
        p.setProperty("snapshot.mode", "no_data");
        p.setProperty("table.include.list", "public.outbox");
        // No __debezium.context.* headers: the records carry the relay's four headers only.
        p.setProperty("extended.headers.enabled", "false");
        routerProperties(p, need(a, "topic"));
        return p;
    }

    /**
     * The Outbox Event Router mapped to migrations/001_outbox.sql (its column names are the
     * router's defaults): the value is the payload, the key the router's usual one, the
     * aggregate id (so a record lands on the partition the relay's murmur2 of the aggregate
     * id picks; the relay keys by event id instead), and the headers are the relay's: id (the
     * router's own), type, aggregatetype, aggregateid. Every event goes to one topic, as the
     * relay's fixed `outbox.topic` of the drain rounds.
     */
    private static void routerProperties(Properties p, String topic) {
        p.setProperty("transforms", "outbox");
        p.setProperty("transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
        p.setProperty("transforms.outbox.table.field.event.id", "id");
        p.setProperty("transforms.outbox.table.field.event.key", "aggregateid");
        p.setProperty("transforms.outbox.table.field.event.payload", "payload");
        p.setProperty("transforms.outbox.route.by.field", "aggregatetype");
        p.setProperty("transforms.outbox.route.topic.replacement", topic);
        p.setProperty("transforms.outbox.table.fields.additional.placement",
                "type:header:type,aggregatetype:header:aggregatetype,aggregateid:header:aggregateid");
    }

    /** The relay's producer settings: acks=all, idempotent, lz4, linger 5 ms. */
    static Properties producerProperties(Map<String, String> a) {
        Properties p = new Properties();
        p.setProperty(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, need(a, "brokers"));
        p.setProperty(ProducerConfig.CLIENT_ID_CONFIG, "outbox-bench-debezium");
        p.setProperty(ProducerConfig.ACKS_CONFIG, "all");
        p.setProperty(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.setProperty(ProducerConfig.COMPRESSION_TYPE_CONFIG, "lz4");
        p.setProperty(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.setProperty(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.setProperty(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        return p;
    }
}
