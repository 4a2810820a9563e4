#!/usr/bin/env bash
# scripts/pg-failover-smoke.sh: checks, without the relay, what PostgreSQL
# itself does at a failover of the pg-ha pair (scripts/services.sh
# pg-ha-start), so that a failing relay test can be told apart from a broken
# test environment. Uses the services of OUTBOX_RUN_DIR (started if needed)
# and leaves a fresh pair behind (pg-ha-reset at the start and at the end).
#
#   OUTBOX_PG_VERSION=17 OUTBOX_RUN_DIR=/tmp/x scripts/pg-failover-smoke.sh
#
# Checks, in order:
#   16+  a logical slot can be created and decoded on the standby
#        (pg_log_standby_snapshot() on the primary lets its creation finish)
#   17+  a slot created with failover = true on the primary becomes synced
#        and persistent (synced = t, temporary = f) on the standby, once its
#        consumer confirmed past a running-xacts record the standby has
#   all  after pg-ha-crash + pg-ha-promote: on 17+ that slot is on the new
#        primary and decodes the rows written before the crash and after the
#        promotion; before 17 it is not there (a failover loses the slot)
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SERVICES="$SCRIPT_DIR/services.sh"
export OUTBOX_RUN_DIR=${OUTBOX_RUN_DIR:-/tmp/outbox-relay-run}

log() { printf '[smoke] %s\n' "$*" >&2; }
fail() { log "FAILED: $*"; exit 1; }

bash "$SERVICES" pg-ha-reset
env_file=$(bash "$SERVICES" pg-ha-start)
# shellcheck disable=SC1090 # written at run time by services.sh
source "$env_file"
P=$OUTBOX_TEST_PG_HA_PRIMARY_URL
S=$OUTBOX_TEST_PG_HA_STANDBY_URL
q() { "$OUTBOX_TEST_PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 "$@"; }
major=$(q "$P" -c "SELECT current_setting('server_version_num')::int / 10000")
log "PostgreSQL $major: primary $P, standby $S"

# Polls SQL $2 on URL $1 until it prints $3 (30 s).
wait_for() {
    local i got
    for ((i = 0; i < 300; i++)); do
        got=$(q "$1" -c "$2" 2>/dev/null || true)
        [[ $got == "$3" ]] && return 0
        sleep 0.1
    done
    fail "waited 30 s for '$2' to be '$3'; last: '$got'"
}

# decode SLOT: the query counting the messages SLOT (an SQL literal) would decode.
decode() {
    printf "SELECT count(*) FROM pg_logical_slot_peek_binary_changes(%s, NULL, NULL,
    'proto_version', '1', 'publication_names', 'pub')" "$1"
}
q "$P" -c "CREATE TABLE outbox (id bigserial PRIMARY KEY, payload text);
           CREATE PUBLICATION pub FOR TABLE outbox"

if ((major >= 16)); then
    # Creating a slot on a standby waits for a running-xacts record from the primary.
    q "$S" -c "SELECT pg_create_logical_replication_slot('on_standby', 'pgoutput')" >/dev/null &
    creator=$!
    for ((i = 0; i < 50; i++)); do
        q "$P" -c "SELECT pg_log_standby_snapshot()" >/dev/null
        kill -0 "$creator" 2>/dev/null || break
        sleep 0.1
    done
    wait "$creator" || fail "could not create a logical slot on the standby"
    q "$P" -c "INSERT INTO outbox (payload) VALUES ('decoded on the standby')"
    wait_for "$S" "SELECT ($(decode "'on_standby'")) > 0" t
    log "ok: logical decoding on the standby"
    q "$S" -c "SELECT pg_drop_replication_slot('on_standby')" >/dev/null
fi

if ((major >= 17)); then
    q "$P" -c "SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, false, true)" >/dev/null
else
    q "$P" -c "SELECT pg_create_logical_replication_slot('s', 'pgoutput')" >/dev/null
fi
q "$P" -c "INSERT INTO outbox (payload) SELECT 'before ' || g FROM generate_series(1, 100) g"
if ((major >= 17)); then
    # The consumer confirms past a running-xacts record: the slot's catalog_xmin
    # moves up to what the standby has, which is when the sync can persist it.
    for ((i = 0; i < 300; i++)); do
        q "$P" -c "SELECT pg_log_standby_snapshot()" >/dev/null
        q "$P" -c "SELECT pg_replication_slot_advance('s', pg_current_wal_lsn())" >/dev/null
        [[ $(q "$S" -c "SELECT synced AND NOT temporary FROM pg_replication_slots
                        WHERE slot_name = 's'") == t ]] && break
        sleep 0.1
    done
    [[ $(q "$S" -c "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = 's'") == t ]] ||
        fail "slot s not synced and persistent on the standby: $(q "$S" -c "TABLE pg_replication_slots")"
    log "ok: failover slot synced to the standby (synced, not temporary)"
    q "$P" -c "INSERT INTO outbox (payload) SELECT 'pending ' || g FROM generate_series(1, 100) g"
fi

bash "$SERVICES" pg-ha-crash
bash "$SERVICES" pg-ha-promote
q "$S" -c "INSERT INTO outbox (payload) SELECT 'promoted ' || g FROM generate_series(1, 10) g"
slot=$(q "$S" -c "SELECT failover::text || ',' || synced::text || ',' || temporary::text
                  FROM pg_replication_slots WHERE slot_name = 's'" 2>/dev/null ||
    q "$S" -c "SELECT temporary::text FROM pg_replication_slots WHERE slot_name = 's'")
if ((major >= 17)); then
    [[ $slot == true,true,false ]] || fail "slot s on the new primary: '$slot' (want failover,synced,not temporary)"
    # 100 pending rows + 10 written after the promotion, each 1 INSERT message,
    # plus BEGIN/COMMIT per transaction and a RELATION message per stream.
    # (Decoding reads only flushed WAL: synchronous_commit is off, so wait.)
    wait_for "$S" "SELECT ($(decode "'s'")) >= 110" t
    n=$(q "$S" -c "$(decode "'s'")")
    log "ok: slot s survived the promotion and decodes $n messages (pending + new rows)"
else
    [[ -z $slot ]] || fail "slot s unexpectedly on the promoted standby: $slot"
    log "ok: before 17 the slot is gone after a failover, as expected"
fi
bash "$SERVICES" pg-ha-reset
log "all checks passed on PostgreSQL $major"
