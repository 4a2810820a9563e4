-- 002_sweeper_hold.sql: the retention sweeper's holds (docs/src/guides/keeping-the-table-small.md, "The sweeper hold").
--
-- outbox-relay creates this table on demand, in the schema of the first
-- configured outbox table, the first time it creates a slot. Run this file
-- instead (as the schema's owner) when the relay's role may not create tables
-- there, then grant it the rights below. Idempotent.
--
-- One row per slot and outbox table: rows of that table inserted by a
-- transaction whose id is below below_xid were committed before the slot
-- existed, so the slot never streamed them, and the sweeper keeps them until
-- `outbox-relay replay` covered them (or the row here is deleted by hand).

CREATE TABLE IF NOT EXISTS outbox_relay_sweeper_hold (
    slot           text        NOT NULL,
    outbox_table   text        NOT NULL,
    below_xid      bigint      NOT NULL,
    slot_start_lsn pg_lsn,
    armed_at       timestamptz NOT NULL DEFAULT now(),
    reason         text        NOT NULL,
    PRIMARY KEY (slot, outbox_table)
);

-- GRANT SELECT, INSERT, UPDATE, DELETE ON outbox_relay_sweeper_hold TO <the relay's role>;
