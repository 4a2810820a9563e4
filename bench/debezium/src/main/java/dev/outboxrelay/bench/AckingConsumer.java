package dev.outboxrelay.bench;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.header.Header;
import org.apache.kafka.connect.json.JsonConverter;
import org.apache.kafka.connect.source.SourceRecord;

import io.debezium.DebeziumException;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.RecordChangeEvent;

/**
 * The careful user's consumer: sends a batch, waits until Kafka acknowledged every record of
 * it, and only then marks the records processed, so that no offset (and no slot position)
 * is committed past an unacknowledged event. A failed send fails the engine with nothing of
 * the batch committed: it is re-read on restart (at-least-once).
 */
final class AckingConsumer implements DebeziumEngine.ChangeConsumer<RecordChangeEvent<SourceRecord>> {

    private final KafkaProducer<byte[], byte[]> producer;
    /** For values that are not text or bytes (none expected from the router). */
    private final JsonConverter json = new JsonConverter();

    AckingConsumer(KafkaProducer<byte[], byte[]> producer) {
        this.producer = producer;
        json.configure(Map.of("schemas.enable", "false"), false);
    }

    @Override
    public void handleBatch(List<RecordChangeEvent<SourceRecord>> records,
            DebeziumEngine.RecordCommitter<RecordChangeEvent<SourceRecord>> committer)
            throws InterruptedException {
        List<Future<RecordMetadata>> acks = new ArrayList<>(records.size());
        for (RecordChangeEvent<SourceRecord> event : records) {
            acks.add(producer.send(toKafka(event.record())));
        }
        for (Future<RecordMetadata> ack : acks) {
            try {
                ack.get();
            } catch (ExecutionException e) {
                throw new DebeziumException("Kafka did not acknowledge a record", e.getCause());
            }
        }
        for (RecordChangeEvent<SourceRecord> event : records) {
            committer.markProcessed(event);
        }
        committer.markBatchFinished();
    }

    private ProducerRecord<byte[], byte[]> toKafka(SourceRecord r) {
        RecordHeaders headers = new RecordHeaders();
        for (Header h : r.headers()) {
            headers.add(h.key(), bytes(r.topic(), h.schema(), h.value()));
        }
        return new ProducerRecord<>(r.topic(), null, r.timestamp(),
                bytes(r.topic(), r.keySchema(), r.key()),
                bytes(r.topic(), r.valueSchema(), r.value()), headers);
    }

    /** Text as UTF-8 (the payload, the key, the headers), bytes as they are, else JSON. */
    private byte[] bytes(String topic, Schema schema, Object value) {
        if (value == null) {
            return null;
        }
        if (value instanceof String s) {
            return s.getBytes(StandardCharsets.UTF_8);
        }
        if (value instanceof byte[] b) {
            return b;
        }
        return json.fromConnectData(topic, schema, value);
    }
}
