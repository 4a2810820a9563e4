"""Reads a topic with Confluent's own deserializers, as a consumer would, and prints each
record as one JSON line: {"key", "schema_id", "value", "partition", "offset", "key_schema_id"}. Used by tests/integration/schema_registry.rs to
show that what the relay writes decodes with a stock deserializer.

Usage: consume.py [--key=KEY_FORMAT] BROKERS REGISTRY_URL TOPIC COUNT [TIMEOUT_S] [FORMAT] [PROTO_FILE]
KEY_FORMAT: avro, json or protobuf:PROTO_FILE (its first message, one string field): the key
is decoded by that deserializer too (a framed string key, `key_format`), and key_schema_id is
its schema id; without it the key is printed as text. FORMAT plain: the value is unframed JSON
(`format = "none"`), schema_id null.
FORMAT: avro (default), json (JSONDeserializer: it fetches the writer's schema by the
record's id and validates the value against it) or protobuf (ProtobufDeserializer, with the
message class generated here from PROTO_FILE by protoc from grpcio-tools: the first message
of the file; the value printed with protobuf's own MessageToDict, field names as in the file;
each record's schema id must name PROTO_FILE's text in the registry).
Stops after COUNT records, or at the timeout (then exits 1).
"""

import atexit
import importlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid

from confluent_kafka import Consumer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.serialization import MessageField, SerializationContext


# The subject by Confluent's TopicNameStrategy, as the relay names it. The default since
# confluent-kafka 2.14, ASSOCIATED, first asks the registry for the topic's "associations":
# Apicurio answers 404, and once in CI its 404 never finished, so the read of the answer
# hung until Quarkus' 30-minute idle timeout closed the connection.
SUBJECT_BY_TOPIC = {"subject.name.strategy.type": "TOPIC"}

# Seconds for any one registry request (the client's default is none: a stuck answer
# would hang this consumer, and the test waiting on it, with no message).
REGISTRY_TIMEOUT_S = 30


def avro(registry, _proto):
    from confluent_kafka.schema_registry.avro import AvroDeserializer

    return AvroDeserializer(registry, conf=SUBJECT_BY_TOPIC)


def json_schema(registry, _proto):
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer

    return JSONDeserializer(None, schema_registry_client=registry, conf=SUBJECT_BY_TOPIC)


def protobuf(registry, proto):
    """The ProtobufDeserializer of PROTO_FILE's first message, as a dict-returning function."""
    from google.protobuf.json_format import MessageToDict
    from grpc_tools import protoc

    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer

    out = tempfile.mkdtemp(prefix="consume-proto-")
    atexit.register(shutil.rmtree, out, True)
    folder, name = os.path.split(os.path.abspath(proto))
    if protoc.main(["protoc", f"-I{folder}", f"--python_out={out}", name]) != 0:
        raise SystemExit(f"protoc could not compile {proto}")
    sys.path.insert(0, out)
    module = importlib.import_module(name[: -len(".proto")] + "_pb2")
    first = next(iter(module.DESCRIPTOR.message_types_by_name))
    # Without the registry client: given one, the deserializer asks for the writer's schema
    # as a serialized FileDescriptorProto (`?format=serialized`), which Apicurio's
    # Confluent-compatible API does not serve (it answers the .proto text). It still reads
    # Confluent's framing (magic byte, id, message indexes); the id is checked here instead:
    # it must name the same .proto text in the registry.
    deserializer = ProtobufDeserializer(getattr(module, first), {"use.deprecated.format": False})
    with open(proto, encoding="utf-8") as f:
        text = f.read()
    checked = set()

    def deserialize(raw, ctx):
        schema_id = int.from_bytes(raw[1:5], "big")
        if schema_id not in checked:
            schema = registry.get_schema(schema_id)
            if schema.schema_type != "PROTOBUF" or schema.schema_str.strip() != text.strip():
                raise SystemExit(f"schema id {schema_id} is not {proto}: {schema.schema_str!r}")
            checked.add(schema_id)
        message = deserializer(raw, ctx)
        return MessageToDict(
            message,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
        )

    return deserialize


def plain(_registry, _proto):
    return lambda raw, _ctx: json.loads(raw)


FORMATS = {"avro": avro, "json": json_schema, "protobuf": protobuf, "plain": plain}


def key_deserializer(registry, key_form):
    """KEY_FORMAT's deserializer, returning the key string (a Protobuf key's one field)."""
    form, _, proto = key_form.partition(":")
    deserialize = FORMATS[form](registry, proto or None)
    if form != "protobuf":
        return deserialize
    return lambda raw, ctx: next(iter(deserialize(raw, ctx).values()))


def watchdog(seconds):
    """Exits (status 3, with a message) after `seconds`, even inside a call that hangs: the
    poll loop's own deadline is only checked between records."""

    def expire(_signum, _frame):
        print(f"consume.py: still running after {seconds:.0f} s: a broker or registry request hung", file=sys.stderr)
        os._exit(3)

    signal.signal(signal.SIGALRM, expire)
    signal.alarm(int(seconds))


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--key=")]
    key_form = next((a[len("--key="):] for a in sys.argv[1:] if a.startswith("--key=")), None)
    brokers, registry_url, topic, count = args[0:4]
    timeout = float(args[4]) if len(args) > 4 else 60.0
    form = args[5] if len(args) > 5 else "avro"
    proto = args[6] if len(args) > 6 else None
    count = int(count)
    watchdog(timeout + 30)
    registry = SchemaRegistryClient({"url": registry_url, "timeout": REGISTRY_TIMEOUT_S})
    deserialize = FORMATS[form](registry, proto)
    deserialize_key = key_deserializer(registry, key_form) if key_form else None
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
            raw_key = msg.key()
            key_schema_id = None
            if deserialize_key is not None:
                key = deserialize_key(raw_key, SerializationContext(topic, MessageField.KEY))
                key_schema_id = int.from_bytes(raw_key[1:5], "big")
            else:
                key = raw_key.decode() if raw_key is not None else None
            schema_id = None if form == "plain" else int.from_bytes(raw[1:5], "big")
            row = {"key": key, "schema_id": schema_id, "value": value}
            row.update(partition=msg.partition(), offset=msg.offset(), key_schema_id=key_schema_id)
            print(json.dumps(row))
            seen += 1
    finally:
        consumer.close()
    if seen < count:
        print(f"only {seen} of {count} records within {timeout}s", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
