#!/usr/bin/env bash
# scripts/demo.sh: run the relay end to end, locally, in about a minute.
#
#   1. starts PostgreSQL (wal_level=logical) and a Kafka broker on 127.0.0.1
#      (scripts/services.sh; nothing to install by hand)
#   2. applies migrations/*.sql (the outbox table and its publication)
#   3. runs `outbox-relay run --config config/outbox-relay.toml`, pointed at
#      those services by OUTBOX_RELAY__POSTGRES__URL / OUTBOX_RELAY__KAFKA__BROKERS
#   4. writes outbox rows in two committed transactions and one rolled back
#   5. prints what arrived on Kafka (key, headers, value): the committed rows
#      only, in commit order
#   6. stops the relay (SIGTERM) and the services
#
# OUTBOX_DEMO_KEEP=1 leaves the services running at the end (stop them with
# `OUTBOX_RUN_DIR=/tmp/outbox-relay-demo scripts/services.sh stop`).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
SERVICES="$ROOT/scripts/services.sh"
export OUTBOX_RUN_DIR=${OUTBOX_RUN_DIR:-/tmp/outbox-relay-demo}
DEMO_DIR="$OUTBOX_RUN_DIR/demo"
TOPIC=${OUTBOX_DEMO_TOPIC:-outbox.event.order}
EXPECTED=4 # committed rows below

log() { printf '\n\033[1m==> %s\033[0m\n' "$*" >&2; }

relay_pid=
services_up=0
# shellcheck disable=SC2317 # called through the EXIT trap
cleanup() {
    local rc=$? i
    trap - EXIT INT TERM
    if [[ -n $relay_pid ]] && kill -0 "$relay_pid" 2>/dev/null; then
        log "stopping the relay (SIGTERM)"
        kill -TERM "$relay_pid" 2>/dev/null || true
        for ((i = 0; i < 300; i++)); do
            kill -0 "$relay_pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$relay_pid" 2>/dev/null; then
            echo "relay still running after 30 s: SIGKILL" >&2
            kill -KILL "$relay_pid" 2>/dev/null || true
        fi
        wait "$relay_pid" 2>/dev/null || true
    fi
    if [[ -s $DEMO_DIR/relay.log ]]; then
        log "relay log (last lines of $DEMO_DIR/relay.log)"
        tail -n 25 "$DEMO_DIR/relay.log" >&2 || true
    fi
    if ((services_up)); then
        if [[ ${OUTBOX_DEMO_KEEP:-0} == 1 ]]; then
            log "services left running: source $OUTBOX_RUN_DIR/env; OUTBOX_RUN_DIR=$OUTBOX_RUN_DIR $SERVICES stop"
        else
            log "stopping the services"
            bash "$SERVICES" stop || true
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

locked=()
[[ -f Cargo.lock ]] && locked=(--locked)

log "building the relay (release)"
bash "$(dirname "${BASH_SOURCE[0]}")/build-deps.sh"
cargo build --release "${locked[@]}" --bin outbox-relay

log "starting PostgreSQL and Kafka (state in $OUTBOX_RUN_DIR)"
bash "$SERVICES" clean # a fresh cluster and broker: no slot or topic left from an earlier demo
services_up=1
env_file=$(bash "$SERVICES" start)
# shellcheck disable=SC1090 # written at run time by services.sh
source "$env_file"
mkdir -p "$DEMO_DIR"

psql_() {
    "$OUTBOX_TEST_PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$OUTBOX_TEST_PG_URL" "$@"
}

log "applying migrations"
for f in migrations/*.sql; do
    echo "  $f" >&2
    psql_ -f "$f"
done

config=config/outbox-relay.toml
if [[ ! -f $config ]]; then
    # Only when the repository's example config is missing.
    config="$DEMO_DIR/outbox-relay.toml"
    cat >"$config" <<EOF
[postgres]
url = "$OUTBOX_TEST_PG_URL"
slot = "outbox_relay"
publication = "outbox_relay_pub"

[outbox]
table = "public.outbox"
topic = "outbox.event.{aggregatetype}"

[kafka]
brokers = "$OUTBOX_TEST_KAFKA_BROKERS"
EOF
fi
# The services' addresses win over whatever the config file says.
export OUTBOX_RELAY__POSTGRES__URL="$OUTBOX_TEST_PG_URL"
export OUTBOX_RELAY__KAFKA__BROKERS="$OUTBOX_TEST_KAFKA_BROKERS"
export RUST_LOG=${RUST_LOG:-info}

log "starting the relay: cargo run --release -- run --config $config (log: $DEMO_DIR/relay.log)"
# cargo run execs the binary, so $! is the relay itself.
cargo run --release "${locked[@]}" --quiet --bin outbox-relay -- run --config "$config" \
    </dev/null >"$DEMO_DIR/relay.log" 2>&1 &
relay_pid=$!

# The relay creates its replication slot on start-up; rows written before
# the slot exists would not be streamed, so wait for it.
echo "waiting for the relay's replication slot..." >&2
for ((i = 0; ; i++)); do
    if ! kill -0 "$relay_pid" 2>/dev/null; then
        relay_pid=
        echo "the relay exited during start-up" >&2
        exit 1
    fi
    active=$(psql_ -At -c "SELECT count(*) FROM pg_replication_slots WHERE plugin = 'pgoutput' AND active")
    ((active > 0)) && break
    ((i < 600)) || {
        echo "no active pgoutput slot after 60 s" >&2
        exit 1
    }
    sleep 0.1
done
psql_ -c "SELECT slot_name, plugin, active, confirmed_flush_lsn FROM pg_replication_slots"

log "writing outbox rows: two transactions committed, one rolled back"
psql_ -e <<'SQL'
BEGIN;
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
  (gen_random_uuid(), 'order', 'order-1', 'OrderCreated', '{"order": 1, "total": 42.5}'),
  (gen_random_uuid(), 'order', 'order-2', 'OrderCreated', '{"order": 2, "total": 7}');
COMMIT;

BEGIN;
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
  (gen_random_uuid(), 'order', 'order-1', 'OrderPaid', '{"order": 1}');
-- insert-then-delete keeps the table empty; the publication only publishes
-- inserts, so the event is still relayed.
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
  (gen_random_uuid(), 'order', 'order-2', 'OrderCancelled', '{"order": 2}');
DELETE FROM outbox WHERE type = 'OrderCancelled';
COMMIT;

BEGIN;
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload) VALUES
  (gen_random_uuid(), 'order', 'order-3', 'RolledBack', '{"order": 3, "note": "never published"}');
ROLLBACK;
SQL

log "records on Kafka topic $TOPIC (console consumer, up to 30 s)"
bash "$SERVICES" kafka-tool org.apache.kafka.tools.consumer.ConsoleConsumer \
    --bootstrap-server "$OUTBOX_TEST_KAFKA_BROKERS" --topic "$TOPIC" --from-beginning \
    --max-messages "$EXPECTED" --timeout-ms 30000 \
    --property print.key=true --property print.headers=true \
    --property key.separator=' | ' --property headers.separator=',' \
    | tee "$DEMO_DIR/records.txt"

got=$(grep -c . "$DEMO_DIR/records.txt" || true)
if ((got != EXPECTED)); then
    echo "expected $EXPECTED records on $TOPIC, got $got" >&2
    exit 1
fi
if grep -q "never published" "$DEMO_DIR/records.txt"; then
    echo "the rolled-back row was published!" >&2
    exit 1
fi
log "demo OK: $EXPECTED committed events relayed, the rolled-back one was not"
