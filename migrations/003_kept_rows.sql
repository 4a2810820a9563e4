-- 003_kept_rows.sql: outbox rows kept for their dead letters (docs/src/guides/dead-letters.md, "What a dead letter keeps").
--
-- outbox-relay creates this table on demand, in the schema of the first
-- configured outbox table, the first time a dead letter cannot keep its event
-- (neither payload nor row image fit what the dead-letter topic and the
-- producer take). Run this file instead (as the schema's owner) when the
-- relay's role may not create tables there, then grant it the rights below.
-- Idempotent.
--
-- One row per kept outbox row: the sweeper deletes no outbox row whose id is
-- recorded here for its slot; `outbox-relay dead-letters redrive` re-sends the
-- event from the row and deletes the record (or delete it by hand to let the
-- row be swept).

CREATE TABLE IF NOT EXISTS outbox_relay_kept_rows (
    slot         text        NOT NULL,
    outbox_table text        NOT NULL,
    row_id       text        NOT NULL,
    event_id     text        NOT NULL,
    reason       text        NOT NULL,
    kept_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (slot, outbox_table, row_id)
);

-- GRANT SELECT, INSERT, DELETE ON outbox_relay_kept_rows TO <the relay's role>;
