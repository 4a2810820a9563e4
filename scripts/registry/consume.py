"""Reads a topic with Confluent's own deserializers, as a consumer would, and prints each
record as one JSON line: {"key", "schema_id", "value"}. Used by tests/integration/schema_registry.rs to
show that what the relay writes decodes with a stock deserializer.

Usage: consume.py BROKERS REGISTRY_URL TOPIC COUNT [TIMEOUT_S]
Stops after COUNT records, or at the timeout (then exits 1).
"""

import json
import sys
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext


def main() -> int:
    brokers, registry_url, topic, count = sys.argv[1:5]
    timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 60.0
    count = int(count)
    registry = SchemaRegistryClient({"url": registry_url})
    deserialize = AvroDeserializer(registry)
    consumer = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": "decode-" + uuid.uuid4().hex,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + timeout
    try:
        while seen < count and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                print(f"consumer error: {msg.error()}", file=sys.stderr)
                continue
            raw = msg.value()
            value = deserialize(raw, SerializationContext(topic, MessageField.VALUE))
            key = msg.key().decode() if msg.key() is not None else None
            schema_id = int.from_bytes(raw[1:5], "big")
            print(json.dumps({"key": key, "schema_id": schema_id, "value": value}))
            seen += 1
    finally:
        consumer.close()
    if seen < count:
        print(f"only {seen} of {count} records within {timeout}s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
