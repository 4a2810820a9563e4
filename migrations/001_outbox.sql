-- 001_outbox.sql: the transactional outbox table and the publication the
-- relay streams from.
--
-- Idempotent: safe to run any number of times (psql -f, or mounted into
-- /docker-entrypoint-initdb.d by docker-compose.yml).
--
-- The column layout follows Debezium's outbox event router, so applications
-- that already write Debezium-style outbox rows need no change:
--   id             unique event id: the Kafka record key; consumers deduplicate
--                  on it (delivery to Kafka is at-least-once)
--   aggregatetype  selects the topic (e.g. "order" -> outbox.event.order)
--   aggregateid    chooses the partition (outbox.partition_by = "aggregate_id",
--                  the default: murmur2 of the aggregate id, as the Java client
--                  hashes keys), so all events of one aggregate go to one
--                  partition and keep their commit order although the key is
--                  the event id
--   type           the event type
--   payload        the record value (JSON)
--   created_at     for humans, `outbox-relay replay --since` and the retention
--                  sweeper ([outbox.sweeper]); DEFAULT now() is the inserting
--                  transaction's start time

CREATE TABLE IF NOT EXISTS outbox (
    id            uuid        PRIMARY KEY,
    aggregatetype text        NOT NULL,
    aggregateid   text        NOT NULL,
    type          text        NOT NULL,
    payload       jsonb,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- For the retention sweeper ([outbox.sweeper]) and replay --since, which select
-- rows by created_at.
CREATE INDEX IF NOT EXISTS outbox_created_at_idx ON outbox (created_at);

-- A partitioned outbox instead (docs/src/guides/partitioned-outboxes.md): one
-- partition per month, dropped when every row in it was confirmed by the slot
-- (by hand, or by the sweeper with [outbox.sweeper] drop_partitions = true).
-- The primary key must include the partition key. Configure the partitioned
-- table (outbox.table = "public.outbox"), not its partitions.
--
-- CREATE TABLE outbox (
--     id            uuid        NOT NULL,
--     aggregatetype text        NOT NULL,
--     aggregateid   text        NOT NULL,
--     type          text        NOT NULL,
--     payload       jsonb,
--     created_at    timestamptz NOT NULL DEFAULT now(),
--     PRIMARY KEY (id, created_at)
-- ) PARTITION BY RANGE (created_at);
-- CREATE TABLE outbox_2026_01 PARTITION OF outbox
--     FOR VALUES FROM ('2026-01-01') TO ('2026-02-01');
-- CREATE TABLE outbox_2026_02 PARTITION OF outbox
--     FOR VALUES FROM ('2026-02-01') TO ('2026-03-01');
-- CREATE TABLE outbox_default PARTITION OF outbox DEFAULT;
-- CREATE INDEX outbox_created_at_idx ON outbox (created_at);

-- The relay reads the outbox through logical decoding (pgoutput) of this
-- publication, not by polling the table.
--
-- publish = 'insert' on purpose: only INSERTs are events. An application may
-- insert the outbox row and delete it again in the same transaction (or a
-- cleanup job may delete rows later) to keep the table small; those DELETEs
-- (and any UPDATE or TRUNCATE) are never decoded into the stream, so the
-- insert-then-delete pattern stays invisible to the relay and to Kafka, and
-- the table never needs REPLICA IDENTITY FULL.
--
-- publish_via_partition_root = true (PostgreSQL 13+) makes pgoutput send the
-- changes of a partitioned outbox under the partitioned table's name instead of
-- each partition's; it changes nothing for a plain table.
--
-- CREATE PUBLICATION has no IF NOT EXISTS, hence the DO block. The relay also
-- creates the publication (and its replication slot) itself when missing.
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'outbox_relay_pub') THEN
        CREATE PUBLICATION outbox_relay_pub FOR TABLE outbox
            WITH (publish = 'insert', publish_via_partition_root = true);
    END IF;
END
$$;
