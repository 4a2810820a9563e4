#!/usr/bin/env bash
# scripts/bench.sh: throughput, latency and footprint of outbox-relay, measured
# against PostgreSQL's own walsender limit in the same run.
#
# Usage: scripts/bench.sh [N] [OPTIONS]
#
#   N, --events N      events per drain round (default 1000000)
#   --quick            5 s per latency rate, 10 s idle, and N=200000 unless
#                      N is given (a shorter run)
#   --txn-sizes LIST   drain rounds, rows per transaction (default "1 10 100")
#   --rates LIST       latency rates, events/s (default "1000 5000 20000")
#   --rate-seconds S   seconds per latency rate (default 15)
#   --idle-seconds S   idle CPU window (default 30)
#   --partitions P     partitions of each benchmark topic (default 3)
#   --writers W        latency writer connections (default 4)
#   --no-drain, --no-latency
#                      skip a phase
#   --tracing          each latency rate runs twice per mode, with [tracing]
#                      off and on (a span per event, exported to a local
#                      `outbox-bench otlp-sink` that drops them); the relay's
#                      CPU seconds per rate are in the JSON either way
#   --delivery LIST    delivery modes measured side by side: each drain round
#                      and each latency rate runs once per mode (default
#                      "at_least_once exactly_once"); pg_recvlogical runs once
#                      per backlog, every relay mode drains its own copy of
#                      the slot
#   --shapes LIST      opt-in phases (space or comma separated), each run in
#                      every --delivery mode:
#                        payload  backlogs of big payloads (--payload-sizes):
#                                 MB/s of the relay against pg_recvlogical
#                        topics   one topic per aggregate type (--topics-count):
#                                 events/s and peak RSS
#                        big-txn  one transaction of --big-txn-rows rows
#                                 committed while the relay streams: commit
#                                 to last acknowledgement, peak RSS
#                        sigkill  writers at --kill-rate while the relay is
#                                 SIGKILLed --kills times: re-sent events per
#                                 kill, missing events (never expected)
#                        all      all of them
#   --payload-sizes LIST  payload bytes of the payload shape
#                      (default "2048 16384 262144")
#   --payload-mb MB    payload megabytes per payload size (default 512;
#                      64 with --quick)
#   --topics-count T   aggregate types (= topics) of the topics shape
#                      (default 1000); it drains N events
#   --big-txn-rows R   rows of the big-txn shape's transaction (default
#                      1000000; 200000 with --quick)
#   --kill-rate R      writers' events/s in the sigkill shape (default 5000)
#   --kills K          SIGKILLs per delivery mode (default 3)
#   --kill-interval S  seconds between kills (default 5)
#   --relay-env K=V    extra OUTBOX_RELAY__K=V for every relay run (repeatable),
#                      e.g. --relay-env KAFKA__LINGER_MS=10
#   --perf             in each drain round, profile the relay (perf record with
#                      DWARF call graphs) and the whole machine (no call
#                      graphs) into the run dir; perf's own cost lowers the
#                      figures of such a run
#   --relay-bin PATH   measure this relay binary instead of building one
#                      (to compare two builds of the relay)
#   --label TEXT       recorded with the results (e.g. which patch was measured)
#   --output FILE      result JSON (default bench/results/<date>.json)
#   --keep-services    leave PostgreSQL and Kafka running at the end
#
# What it does (see bench/README.md for how to read the results):
#   1. Drain: for each transaction size, a fresh database and two pgoutput
#      slots at the same position (the second is a copy of the first), then a
#      server-side preload of N events (~250-byte JSON payloads). It times
#      pg_recvlogical draining slot 1 to /dev/null (--endpos: exits at the last
#      commit), then the relay draining slot 2 to Kafka until that slot's
#      confirmed_flush_lsn reaches the same position (polled every 100 ms),
#      and samples the relay's peak RSS and CPU time at that moment.
#   2. Latency: one relay, writers inserting 1-row transactions at each rate;
#      a consumer computes receive time - record timestamp (the relay stamps
#      each record with its transaction's commit time).
#   3. Idle: the same relay's CPU over --idle-seconds with no traffic.
#   4. The --shapes phases, described in bench/README.md.
#   Phases 1-3 (and 4) run once per --delivery mode.
# It prints one table and writes the same figures as JSON with the machine
# and versions. It asserts nothing about time; it is not a test.
#
# Services: scripts/services.sh in ${OUTBOX_RUN_DIR:-/tmp/outbox-relay-bench}
# (its own PostgreSQL and Kafka, never the test suite's), stopped at the end.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)
COMMAND_LINE="scripts/bench.sh${*:+ $*}"

EVENTS=1000000
EVENTS_GIVEN=0
QUICK=0
TXN_SIZES="1 10 100"
RATES="1000 5000 20000"
RATE_SECONDS=15
IDLE_SECONDS=30
PARTITIONS=3
WRITERS=4
DO_DRAIN=1
DO_LATENCY=1
TRACING_RUNS=off
OTLP_SINK_PID=
OTLP_PORT=
DELIVERY="at_least_once exactly_once"
SHAPES=
PAYLOAD_SIZES="2048 16384 262144"
PAYLOAD_MB=512
PAYLOAD_MB_GIVEN=0
TOPICS_COUNT=1000
BIG_TXN_ROWS=1000000
BIG_TXN_ROWS_GIVEN=0
KILL_RATE=5000
KILLS=3
KILL_INTERVAL=5
# Rows per transaction of the payload and topics shapes' backlogs.
SHAPE_TXN_ROWS=10
# How long a drain may take before it counts as failed (and the run goes on).
DRAIN_TIMEOUT_S=900
PERF=0
KEEP_SERVICES=0
OUTPUT=
LABEL=
RELAY_BIN=
RELAY_EXTRA_ENV=()

# The drain relays report their position every 100 ms instead of every 1 s
# (the default), so that the moment the slot reaches the end is seen with the
# same 100 ms resolution as the polling; one 39-byte message per 100 ms costs
# nothing measurable. The latency and idle relay runs with the defaults.
DRAIN_STATUS_INTERVAL_MS=100

export OUTBOX_RUN_DIR=${OUTBOX_RUN_DIR:-/tmp/outbox-relay-bench}
# The broker's JIT: services.sh defaults to C1 only (fast start for tests);
# a throughput benchmark wants C2, or the broker, not the relay, is measured.
export OUTBOX_KAFKA_JVM_OPTS=${OUTBOX_KAFKA_JVM_OPTS:--XX:TieredStopAtLevel=4}

log() { printf '[bench] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

parse_args() {
    while (($#)); do
        case $1 in
        --events) EVENTS=$2 EVENTS_GIVEN=1; shift ;;
        --quick) QUICK=1 ;;
        --txn-sizes) TXN_SIZES=$2; shift ;;
        --rates) RATES=$2; shift ;;
        --rate-seconds) RATE_SECONDS=$2; shift ;;
        --idle-seconds) IDLE_SECONDS=$2; shift ;;
        --partitions) PARTITIONS=$2; shift ;;
        --writers) WRITERS=$2; shift ;;
        --no-drain) DO_DRAIN=0 ;;
        --no-latency) DO_LATENCY=0 ;;
        --tracing) TRACING_RUNS="off on" ;;
        --delivery) DELIVERY=${2//,/ }; shift ;;
        --shapes) SHAPES=${2//,/ }; shift ;;
        --payload-sizes) PAYLOAD_SIZES=$2; shift ;;
        --payload-mb) PAYLOAD_MB=$2 PAYLOAD_MB_GIVEN=1; shift ;;
        --topics-count) TOPICS_COUNT=$2; shift ;;
        --big-txn-rows) BIG_TXN_ROWS=$2 BIG_TXN_ROWS_GIVEN=1; shift ;;
        --kill-rate) KILL_RATE=$2; shift ;;
        --kills) KILLS=$2; shift ;;
        --kill-interval) KILL_INTERVAL=$2; shift ;;
        --relay-env) RELAY_EXTRA_ENV+=("OUTBOX_RELAY__$2"); shift ;;
        --perf) PERF=1 ;;
        --output) OUTPUT=$2; shift ;;
        --label) LABEL=$2; shift ;;
        --relay-bin) RELAY_BIN=$(realpath "$2"); shift ;;
        --keep-services) KEEP_SERVICES=1 ;;
        -h | --help) usage; exit 0 ;;
        [0-9]*) EVENTS=$1 EVENTS_GIVEN=1 ;;
        *) usage >&2; exit 2 ;;
        esac
        shift
    done
    if ((QUICK)); then
        ((EVENTS_GIVEN)) || EVENTS=200000
        ((PAYLOAD_MB_GIVEN)) || PAYLOAD_MB=64
        ((BIG_TXN_ROWS_GIVEN)) || BIG_TXN_ROWS=200000
        RATE_SECONDS=5 IDLE_SECONDS=10
    fi
    local mode shape
    [[ -n ${DELIVERY// /} ]] || die "--delivery needs at least one mode"
    for mode in $DELIVERY; do
        case $mode in
        at_least_once | exactly_once) ;;
        *) die "unknown delivery mode '$mode' (at_least_once, exactly_once)" ;;
        esac
    done
    if [[ " $SHAPES " == *" all "* ]]; then SHAPES="payload topics big-txn sigkill"; fi
    for shape in $SHAPES; do
        case $shape in
        payload | topics | big-txn | sigkill) ;;
        *) die "unknown shape '$shape' (payload, topics, big-txn, sigkill, all)" ;;
        esac
    done
    if ! [[ $EVENTS =~ ^[0-9]+$ ]] || ((EVENTS == 0)); then
        die "N must be a positive integer"
    fi
    if ((PERF)) && ! command -v perf >/dev/null; then
        die "--perf needs perf (Debian: apt-get install linux-perf)"
    fi
}

# ------------------------------------------------------------------ set-up

build() {
    if [[ -n $RELAY_BIN ]]; then
        log "cargo build --release (outbox-bench); relay: $RELAY_BIN"
        (cd "$REPO" && cargo build --release --quiet --bin outbox-bench)
    else
        log "cargo build --release (outbox-relay, outbox-bench)"
        (cd "$REPO" && cargo build --release --quiet --bin outbox-relay --bin outbox-bench)
        RELAY_BIN="$REPO/target/release/outbox-relay"
    fi
    [[ -x $RELAY_BIN ]] || die "no relay binary at $RELAY_BIN"
    BENCH_BIN="$REPO/target/release/outbox-bench"
}

start_services() {
    local env_file
    env_file=$(bash "$SCRIPT_DIR/services.sh" start)
    # shellcheck disable=SC1090
    source "$env_file"
    PG_BIN=$OUTBOX_TEST_PG_BIN
    PG_PORT=$OUTBOX_TEST_PG_PORT
    BROKERS=$OUTBOX_TEST_KAFKA_BROKERS
    trap cleanup EXIT
}

# On any exit: stop the relay (and perf), then the services unless kept.
cleanup() {
    stop_relay
    if [[ -n $OTLP_SINK_PID ]]; then kill "$OTLP_SINK_PID" 2>/dev/null || true; fi
    if ((KEEP_SERVICES == 0)); then
        log "stopping services in $OUTBOX_RUN_DIR"
        bash "$SCRIPT_DIR/services.sh" stop || true
    fi
}

# URL of database $1 on the benchmark cluster.
pg_url() { echo "postgres://postgres@127.0.0.1:$PG_PORT/$1"; }

# psql on database $1, remaining args passed on; unaligned, tuples only.
sql() {
    local db=$1
    shift
    PGOPTIONS="-c client_min_messages=warning" \
        "$PG_BIN/psql" -X -q -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$db" "$@"
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# Appends one JSON line to the results file. Arguments: key=value pairs whose
# values are numbers or plain strings without quotes or backslashes.
record() {
    local pair key value sep="" line="{"
    for pair in "$@"; do
        key=${pair%%=*}
        value=${pair#*=}
        if [[ $value =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; then
            line+="$sep\"$key\":$value"
        else
            line+="$sep\"$key\":\"$value\""
        fi
        sep=,
    done
    echo "$line}" >>"$RESULTS"
}

# A fresh database $1 with the outbox migration and the preload procedure.
fresh_database() {
    local db=$1 slot
    # Slots pin their database: drop any left by an interrupted run first.
    for slot in $(sql postgres -c "SELECT slot_name FROM pg_replication_slots WHERE database = '$db'"); do
        sql postgres -c "SELECT pg_drop_replication_slot('$slot')" >/dev/null
    done
    sql postgres -c "DROP DATABASE IF EXISTS $db" -c "CREATE DATABASE $db"
    sql "$db" -f "$REPO/migrations/001_outbox.sql"
    # Autovacuum would wake up after the preload and compete for the 2 cores
    # with exactly the processes being measured.
    sql "$db" -c "ALTER TABLE outbox SET (autovacuum_enabled = false)"
    sql "$db" -f "$REPO/bench/preload.sql" -f "$REPO/bench/preload-shapes.sql"
}

drop_database() {
    local db=$1 slot
    for slot in $(sql postgres -c "SELECT slot_name FROM pg_replication_slots WHERE database = '$db'"); do
        sql postgres -c "SELECT pg_drop_replication_slot('$slot')" >/dev/null
    done
    sql postgres -c "DROP DATABASE IF EXISTS $db"
}

# --------------------------------------------------------------- the relay

RELAY_PID=        # the relay process
RELAY_WAIT_PID=   # what to wait for when stopping it: the relay, or perf around it
SYSTEM_PERF_PID=  # a system-wide perf record, with --perf

# Starts the relay on database $1, slot $2, topic template $3, with extra
# OUTBOX_RELAY__* assignments after that; its log goes to $LOG_DIR/$4.log.
# With PROFILE_AS set, it runs under perf record (DWARF call graphs: the
# release build keeps debug info but no frame pointers), written to
# $OUTBOX_RUN_DIR/perf-$PROFILE_AS.data. Sets RELAY_PID and RELAY_STARTED_NS.
start_relay() {
    local db=$1 slot=$2 topic=$3 name=$4 child i
    shift 4
    local -a command=(env OUTBOX_RELAY__POSTGRES__URL="$(pg_url "$db")"
        OUTBOX_RELAY__POSTGRES__SLOT="$slot"
        OUTBOX_RELAY__POSTGRES__PUBLICATION=outbox_relay_pub
        OUTBOX_RELAY__POSTGRES__CREATE_SLOT=false
        OUTBOX_RELAY__OUTBOX__TOPIC="$topic"
        OUTBOX_RELAY__KAFKA__BROKERS="$BROKERS"
        "${METRICS_ENV[@]}" "$@" "${RELAY_EXTRA_ENV[@]}" "$RELAY_BIN" run)
    RELAY_STARTED_NS=$(date +%s%N)
    RELAY_LOG="$LOG_DIR/$name.log"
    if [[ -n ${PROFILE_AS:-} ]]; then
        # Started under perf rather than attached to, so that librdkafka's
        # threads, created at start-up, are all followed.
        perf record -q -e cpu-clock -F 499 --call-graph dwarf,16384 \
            -o "$OUTBOX_RUN_DIR/perf-$PROFILE_AS.data" -- "${command[@]}" \
            >"$LOG_DIR/$name.log" 2>&1 &
        RELAY_WAIT_PID=$!
        for ((i = 0; i < 100; i++)); do
            child=$(pgrep -P "$RELAY_WAIT_PID" || true)
            [[ -n $child ]] && break
            sleep 0.01
        done
        [[ -n $child ]] || die "the relay did not start under perf; log: $LOG_DIR/$name.log"
        RELAY_PID=$child
    else
        "${command[@]}" >"$LOG_DIR/$name.log" 2>&1 &
        RELAY_PID=$!
        RELAY_WAIT_PID=$RELAY_PID
    fi
}

# SIGTERM (the relay drains and confirms), then wait for it.
stop_relay() {
    if [[ -n $RELAY_PID ]]; then
        kill -TERM "$RELAY_PID" 2>/dev/null || true
        wait "$RELAY_WAIT_PID" 2>/dev/null || true
        RELAY_PID=
        RELAY_WAIT_PID=
    fi
    if [[ -n $SYSTEM_PERF_PID ]]; then
        kill -INT "$SYSTEM_PERF_PID" 2>/dev/null || true
        wait "$SYSTEM_PERF_PID" 2>/dev/null || true
        SYSTEM_PERF_PID=
    fi
}

# Relays with an HTTP listener (the [http] config section) listen on a port
# the kernel picks (127.0.0.1:0): a benchmark relay must not collide with
# another relay on the default 9187, nor with the relays of a benchmark run
# by someone else on the same machine (a port that was free when this run
# started may be taken by the time a relay starts). The relay logs the
# address it listens on; metrics_url reads it from there. The latency phase
# reads the relay's own commit-to-ack histogram, the drains its exactly-once
# figures. Sets METRICS_ENV (for start_relay).
setup_metrics() {
    METRICS_ENV=()
    if "$RELAY_BIN" config 2>/dev/null | grep -q '^\[http\]'; then
        METRICS_ENV=("OUTBOX_RELAY__HTTP__LISTEN=127.0.0.1:0")
        return
    fi
    log "this relay has no HTTP listener: latency is measured by the consumer only"
}

# Sets METRICS_URL to the running relay's /metrics, from the address its log
# says it listens on (waits up to 5 s for that line); empty when it has none.
metrics_url() {
    local addr i
    METRICS_URL=
    ((${#METRICS_ENV[@]})) || return 0
    for ((i = 0; i < 50; i++)); do
        addr=$(sed -n 's/.*serving \/metrics.* addr=\([0-9.]*:[0-9]*\).*/\1/p' "$RELAY_LOG" | tail -1)
        if [[ -n $addr ]]; then
            METRICS_URL="http://$addr/metrics"
            return 0
        fi
        sleep 0.1
    done
    log "  the relay did not say where it serves /metrics; log: $RELAY_LOG"
}

# CPU seconds (user + system) used so far by process $1.
cpu_seconds() {
    local ticks
    ticks=$(sed 's/^.*) //' "/proc/$1/stat" | awk '{print $12 + $13}')
    awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.3f", t / hz }'
}

# Short name of a delivery mode, for slot, database and topic names.
mode_tag() {
    case $1 in
    at_least_once) echo alo ;;
    exactly_once) echo eo ;;
    esac
}

# Sets MODE_ENV: the relay's environment for delivery mode $1. Nothing for
# at_least_once (the default), so that --delivery at_least_once also measures
# relays that predate the setting. exactly_once publishes its progress
# records to a topic created up front (compacted, as the relay would).
mode_env() {
    MODE_ENV=()
    if [[ $1 == exactly_once ]]; then
        MODE_ENV=(OUTBOX_RELAY__KAFKA__DELIVERY=exactly_once
            OUTBOX_RELAY__KAFKA__PROGRESS_TOPIC="$PROGRESS_TOPIC")
    fi
}

# Appends the running relay's /metrics figures (exactly-once's Kafka
# transactions since it started) with fields "$@", when it serves them.
record_relay_metrics() {
    local f
    local -a field_args=()
    for f in "$@"; do field_args+=(--field "$f"); done
    metrics_url
    if [[ -n $METRICS_URL ]]; then
        "$BENCH_BIN" metrics --metrics-url "$METRICS_URL" "${field_args[@]}" \
            >>"$RESULTS" 2>/dev/null || log "  (no metrics scrape)"
    fi
}

# A phase that failed: said loudly, recorded, and the run goes on.
FAILURES=0
record_failure() {
    local phase=$1 mode=$2 message=$3
    log "FAILED: $phase ($mode): $message"
    record kind=error phase="$phase" delivery="$mode" message="$message"
    FAILURES=$((FAILURES + 1))
}

# -------------------------------------------------------------------- drain

# One drain round: N events in transactions of $1 rows.
drain_round() {
    local rows=$1
    drain_backlog "tx$rows" txn "$rows" "$EVENTS" "CALL bench_preload($EVENTS, $rows)" "$PARTITIONS" ""
}

# One backlog drained by pg_recvlogical once and by the relay once per
# delivery mode, each from its own slot at the same start position.
#   $1 round: names the database, the slots and the topics (an identifier)
#   $2 shape: txn | payload | topics (groups the report's tables)
#   $3 rows per transaction, $4 events, $5 the preload (SQL)
#   $6 partitions per topic
#   $7 aggregate types, space separated: one topic each per delivery mode and
#      the relay's topic template ends in {aggregatetype}; empty: the rows'
#      type is 'order' and the relay publishes to one fixed topic (as before
#      the shapes existed: no template to render)
#   rest: key=value fields recorded with this round's lines
drain_backlog() {
    local round=$1 shape=$2 rows=$3 events=$4 preload=$5 partitions=$6 types=$7
    shift 7
    local db="bench_$round" recv_slot="bench_recv_$round"
    local mode tag end_lsn t0 t1 seconds payload_bytes toast_mb prefix template type
    local -a fields topics
    log "drain $round ($shape, $rows-row transactions): fresh database $db"
    fresh_database "$db"
    # All slots before the preload, at the same position: a copy shares the
    # original's restart and confirmed positions exactly.
    sql "$db" -c "SELECT pg_create_logical_replication_slot('$recv_slot', 'pgoutput')" >/dev/null
    for mode in $DELIVERY; do
        sql "$db" -c "SELECT pg_copy_logical_replication_slot('$recv_slot', 'bench_relay_${round}_$(mode_tag "$mode")')" >/dev/null
    done

    log "  preloading $events events: $preload"
    t0=$(date +%s%N)
    # The end position is read in the same session right after the last
    # COMMIT: the end of that commit record, where both consumers must get to.
    end_lsn=$(sql "$db" -c "$preload" -c "SELECT pg_current_wal_insert_lsn()")
    t1=$(date +%s%N)
    payload_bytes=$(sql "$db" -c "SELECT round(avg(octet_length(payload::text))) FROM (SELECT payload FROM outbox LIMIT 1000) s")
    toast_mb=$(sql "$db" -c "SELECT round(pg_relation_size(reltoastrelid) / 1e6, 1) FROM pg_class WHERE relname = 'outbox'")
    log "  preload took $(((t1 - t0) / 1000000)) ms; end LSN $end_lsn; payloads ~$payload_bytes bytes; TOAST $toast_mb MB"
    fields=(shape="$shape" round="$round" txn_rows="$rows" events="$events"
        payload_bytes="$payload_bytes" toast_mb="$toast_mb" "$@")

    topics=()
    for mode in $DELIVERY; do
        prefix="bench-$RUN_ID-$round-$(mode_tag "$mode")"
        if [[ -z $types ]]; then
            topics+=("$prefix")
        else
            for type in $types; do topics+=("$prefix-$type"); done
        fi
    done
    log "  creating ${#topics[@]} topics"
    "$BENCH_BIN" create-topics --brokers "$BROKERS" --partitions "$partitions" "${topics[@]}"

    log "  pg_recvlogical draining $recv_slot (load $(loadavg))"
    record kind=load phase="recvlogical-$round" loadavg="$(loadavg)"
    t0=$(date +%s%N)
    "$PG_BIN/pg_recvlogical" --start --no-loop -S "$recv_slot" -d "$(pg_url "$db")" \
        --plugin=pgoutput -o proto_version=1 -o publication_names=outbox_relay_pub \
        --endpos="$end_lsn" -f /dev/null
    t1=$(date +%s%N)
    seconds=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')
    log "  pg_recvlogical: $seconds s"
    [[ $(sql "$db" -c "SELECT confirmed_flush_lsn >= '$end_lsn' FROM pg_replication_slots WHERE slot_name = '$recv_slot'") == t ]] ||
        die "pg_recvlogical exited before its slot reached $end_lsn"
    record kind=recvlogical "${fields[@]}" seconds="$seconds"
    # pg_recvlogical's slot is done: it would only hold WAL.
    sql "$db" -c "SELECT pg_drop_replication_slot('$recv_slot')" >/dev/null

    for mode in $DELIVERY; do
        tag=$(mode_tag "$mode")
        template="bench-$RUN_ID-$round-$tag"
        [[ -z $types ]] || template+="-{aggregatetype}"
        relay_drain "$db" "bench_relay_${round}_$tag" "$end_lsn" "$mode" "$round-$tag" \
            "$template" "${fields[@]}"
    done
    # Frees the WAL the slots hold, so every round starts alike.
    drop_database "$db"
}

# The relay draining slot $2 of database $1 up to LSN $3 in delivery mode $4;
# $5 names its log and profile, $6 is the topic template, the rest are fields
# recorded with its line.
relay_drain() {
    local db=$1 slot=$2 end_lsn=$3 mode=$4 name=$5 template=$6 load_before profile_as="" f
    shift 6
    local -a field_args=()
    for f in "$@"; do field_args+=(--field "$f"); done
    log "  relay ($mode) draining $slot into $template (load $(loadavg))"
    load_before=$(loadavg)
    if ((PERF)); then
        # Where the whole machine's time goes (walsender, broker, relay),
        # without call graphs: the share of each process and thread.
        perf record -q -a -e cpu-clock -F 499 -o "$OUTBOX_RUN_DIR/perf-system-$name.data" \
            2>"$LOG_DIR/perf-system-$name.log" &
        SYSTEM_PERF_PID=$!
        profile_as=$name
    fi
    mode_env "$mode"
    PROFILE_AS=$profile_as start_relay "$db" "$slot" "$template" "relay-$name" "${MODE_ENV[@]}" \
        OUTBOX_RELAY__POSTGRES__STATUS_INTERVAL_MS="$DRAIN_STATUS_INTERVAL_MS"
    if "$BENCH_BIN" wait-slot --url "$(pg_url "$db")" --slot "$slot" --lsn "$end_lsn" \
        --pid "$RELAY_PID" --started-ns "$RELAY_STARTED_NS" --clk-tck "$(getconf CLK_TCK)" \
        --timeout-s "$DRAIN_TIMEOUT_S" --field kind=relay_drain --field delivery="$mode" \
        "${field_args[@]}" --field load_before="$load_before" >>"$RESULTS"; then
        record_relay_metrics kind=relay_metrics delivery="$mode" "$@"
    else
        record_failure "drain $name" "$mode" "the relay did not drain $slot; log: $LOG_DIR/relay-$name.log"
    fi
    stop_relay
    if ((PERF)); then
        log "  profiles: perf report -i $OUTBOX_RUN_DIR/perf-$name.data (relay)," \
            "perf report -i $OUTBOX_RUN_DIR/perf-system-$name.data --sort comm (machine)"
    fi
}

# ------------------------------------------------------------------ latency

# Waits until the relay just started on slot $2 of database $1 streams: it
# confirmed the current position (an idle relay confirms the server's
# keepalive position). Returns non-zero if it did not within 60 s.
wait_streaming() {
    local db=$1 slot=$2 lsn
    lsn=$(sql "$db" -c "SELECT pg_current_wal_insert_lsn()")
    "$BENCH_BIN" wait-slot --url "$(pg_url "$db")" --slot "$slot" --lsn "$lsn" \
        --pid "$RELAY_PID" --started-ns "$RELAY_STARTED_NS" --timeout-s 60 >/dev/null
}

# The local OTLP endpoint of --tracing (started once): sets OTLP_PORT.
start_otlp_sink() {
    [[ -z $OTLP_SINK_PID ]] || return 0
    local i
    rm -f "$OUTBOX_RUN_DIR/otlp-sink.port"
    "$BENCH_BIN" otlp-sink --port-file "$OUTBOX_RUN_DIR/otlp-sink.port" \
        --counts-file "$LOG_DIR/otlp-sink-counts.json" >"$LOG_DIR/otlp-sink.log" 2>&1 &
    OTLP_SINK_PID=$!
    for ((i = 0; i < 100; i++)); do
        [[ -s $OUTBOX_RUN_DIR/otlp-sink.port ]] && break
        sleep 0.05
    done
    OTLP_PORT=$(cat "$OUTBOX_RUN_DIR/otlp-sink.port") || die "otlp-sink did not start; log: $LOG_DIR/otlp-sink.log"
    log "  OTLP sink on 127.0.0.1:$OTLP_PORT"
}

# Latency at each rate, then idle CPU, with one relay in delivery mode $1,
# tracing $2 (off or on).
latency_phase() {
    local mode=$1 tracing=${2:-off} tag rate topics=() db slot c0 c1 out
    local -a tracing_env=()
    tag=$(mode_tag "$mode")
    if [[ $tracing == on ]]; then
        start_otlp_sink
        tag+=_tr
        tracing_env=(OUTBOX_RELAY__TRACING__ENABLED=true
            OUTBOX_RELAY__TRACING__ENDPOINT="http://127.0.0.1:$OTLP_PORT/v1/traces")
    fi
    db=bench_latency_$tag slot=bench_latency_$tag
    log "latency ($mode): fresh database $db"
    fresh_database "$db"
    sql "$db" -c "SELECT pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
    for rate in $RATES; do topics+=("bench-$RUN_ID-lat-$tag-r$rate"); done
    "$BENCH_BIN" create-topics --brokers "$BROKERS" --partitions "$PARTITIONS" "${topics[@]}"
    # One relay for all rates; the topic follows the rows' aggregatetype.
    mode_env "$mode"
    start_relay "$db" "$slot" "bench-$RUN_ID-lat-$tag-{aggregatetype}" "relay-latency-$tag" \
        "${MODE_ENV[@]}" "${tracing_env[@]}"
    if ! wait_streaming "$db" "$slot"; then
        record_failure latency "$mode" "the latency relay did not start; log: $LOG_DIR/relay-latency-$tag.log"
        stop_relay
        drop_database "$db"
        return
    fi
    metrics_url
    [[ -z $METRICS_URL ]] || log "  relay metrics on $METRICS_URL"
    for rate in $RATES; do
        log "latency ($mode, tracing $tracing): $rate events/s for $RATE_SECONDS s (load $(loadavg))"
        record kind=load phase="latency-$tag-$rate" loadavg="$(loadavg)"
        c0=$(cpu_seconds "$RELAY_PID")
        out=$("$BENCH_BIN" latency --url "$(pg_url "$db")" --brokers "$BROKERS" \
            --topic "bench-$RUN_ID-lat-$tag-r$rate" --aggregate-type "r$rate" --rate "$rate" \
            --seconds "$RATE_SECONDS" --writers "$WRITERS" ${METRICS_URL:+--metrics-url "$METRICS_URL"})
        c1=$(cpu_seconds "$RELAY_PID")
        c1=$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.3f", b - a }')
        printf '%s\n' "$out" |
            sed "s/^{/{\"kind\":\"latency\",\"delivery\":\"$mode\",\"tracing\":\"$tracing\",\"relay_cpu_seconds\":$c1,/" >>"$RESULTS"
    done
    save_metrics "$tag"
    idle_phase "$mode"
    stop_relay
    drop_database "$db"
}

# If the relay serves Prometheus metrics, keep a scrape next to the results.
# $1 names the file.
save_metrics() {
    if [[ -n $METRICS_URL ]] && command -v curl >/dev/null &&
        curl -sf -m 2 "$METRICS_URL" -o "$LOG_DIR/metrics-$1.txt"; then
        log "  relay metrics saved: $LOG_DIR/metrics-$1.txt"
    fi
}

# CPU of the latency relay (delivery mode $1) over IDLE_SECONDS with nothing
# to do.
idle_phase() {
    local mode=$1 c0 c1 rss
    log "idle ($mode): relay CPU over $IDLE_SECONDS s with no traffic"
    sleep 2 # let the last deliveries and status updates pass
    c0=$(cpu_seconds "$RELAY_PID")
    sleep "$IDLE_SECONDS"
    c1=$(cpu_seconds "$RELAY_PID")
    rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$RELAY_PID/status")
    record kind=idle delivery="$mode" seconds="$IDLE_SECONDS" cpu_seconds="$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.3f", b - a }')" \
        cpu_percent="$(awk -v a="$c0" -v b="$c1" -v s="$IDLE_SECONDS" 'BEGIN { printf "%.3f", 100 * (b - a) / s }')" \
        vmrss_kb="$rss"
}

# ------------------------------------------------------------------- shapes

# Backlogs of big payloads: PAYLOAD_MB of payload text per size, in
# transactions of SHAPE_TXN_ROWS rows; MB/s against pg_recvlogical.
payload_shape() {
    local bytes events
    for bytes in $PAYLOAD_SIZES; do
        events=$((PAYLOAD_MB * 1000000 / bytes))
        ((events > 0)) || events=1
        drain_backlog "p$bytes" payload "$SHAPE_TXN_ROWS" "$events" \
            "CALL bench_preload_payload($events, $SHAPE_TXN_ROWS, $bytes)" 1 ""
    done
}

# N events over TOPICS_COUNT aggregate types, one topic each (created up
# front, one partition each: TOPICS_COUNT partitions per delivery mode).
topics_shape() {
    local types i
    types=$(for ((i = 0; i < TOPICS_COUNT; i++)); do printf 'a%d ' "$i"; done)
    drain_backlog "types$TOPICS_COUNT" topics "$SHAPE_TXN_ROWS" "$EVENTS" \
        "CALL bench_preload_types($EVENTS, $SHAPE_TXN_ROWS, $TOPICS_COUNT)" 1 "$types" \
        aggregate_types="$TOPICS_COUNT"
}

# One transaction of BIG_TXN_ROWS rows, committed while the relay streams:
# from the commit (the moment the CALL returned) until the relay's slot
# confirmed its end, and the relay's peak RSS. Each delivery mode gets its own
# slot (created just before its transaction) and relay. pg_recvlogical then
# drains the first transaction from a slot made before it, as a reference.
big_txn_shape() {
    local db=bench_bigtxn recv_slot=bench_recv_bigtxn mode tag slot topic end_lsn commit_ns
    local first_end=
    log "big transaction ($BIG_TXN_ROWS rows): fresh database $db"
    fresh_database "$db"
    sql "$db" -c "SELECT pg_create_logical_replication_slot('$recv_slot', 'pgoutput')" >/dev/null
    for mode in $DELIVERY; do
        tag=$(mode_tag "$mode")
        slot=bench_relay_bigtxn_$tag topic="bench-$RUN_ID-bigtxn-$tag"
        "$BENCH_BIN" create-topics --brokers "$BROKERS" --partitions "$PARTITIONS" "$topic"
        sql "$db" -c "SELECT pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
        mode_env "$mode"
        start_relay "$db" "$slot" "$topic" "relay-bigtxn-$tag" "${MODE_ENV[@]}" \
            OUTBOX_RELAY__POSTGRES__STATUS_INTERVAL_MS="$DRAIN_STATUS_INTERVAL_MS"
        if ! wait_streaming "$db" "$slot"; then
            record_failure big-txn "$mode" "the relay did not start; log: $LOG_DIR/relay-bigtxn-$tag.log"
            stop_relay
            continue
        fi
        log "  $mode: one $BIG_TXN_ROWS-row transaction (load $(loadavg))"
        record kind=load phase="bigtxn-$tag" loadavg="$(loadavg)"
        end_lsn=$(sql "$db" -c "CALL bench_preload($BIG_TXN_ROWS, $BIG_TXN_ROWS)" \
            -c "SELECT pg_current_wal_insert_lsn()")
        commit_ns=$(date +%s%N)
        first_end=${first_end:-$end_lsn}
        if "$BENCH_BIN" wait-slot --url "$(pg_url "$db")" --slot "$slot" --lsn "$end_lsn" \
            --pid "$RELAY_PID" --started-ns "$commit_ns" --clk-tck "$(getconf CLK_TCK)" \
            --timeout-s "$DRAIN_TIMEOUT_S" --field kind=big_txn --field delivery="$mode" \
            --field events="$BIG_TXN_ROWS" >>"$RESULTS"; then
            record_relay_metrics kind=relay_metrics shape=big_txn delivery="$mode"
        else
            record_failure big-txn "$mode" "the relay did not confirm the transaction; log: $LOG_DIR/relay-bigtxn-$tag.log"
        fi
        stop_relay
        sql "$db" -c "SELECT pg_drop_replication_slot('$slot')" >/dev/null
    done
    if [[ -n $first_end ]]; then
        local t0 t1
        log "  pg_recvlogical draining the first transaction from $recv_slot"
        t0=$(date +%s%N)
        "$PG_BIN/pg_recvlogical" --start --no-loop -S "$recv_slot" -d "$(pg_url "$db")" \
            --plugin=pgoutput -o proto_version=1 -o publication_names=outbox_relay_pub \
            --endpos="$first_end" -f /dev/null
        t1=$(date +%s%N)
        record kind=recvlogical shape=big_txn round=bigtxn events="$BIG_TXN_ROWS" \
            seconds="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.3f", (b - a) / 1e9 }')"
    fi
    drop_database "$db"
}

# Starts the relay (arguments as start_relay) and checks that it is still
# running a second later; tries again up to 5 times (after a SIGKILL, the
# old walsender may hold the slot for a moment). Returns non-zero if it
# never stayed up.
start_relay_checked() {
    local attempt
    for ((attempt = 1; attempt <= 5; attempt++)); do
        start_relay "$@"
        sleep 1
        kill -0 "$RELAY_PID" 2>/dev/null && return 0
        wait "$RELAY_PID" 2>/dev/null || true
        log "  the relay exited at start (attempt $attempt); log: $LOG_DIR/$4.log"
        RELAY_PID='' RELAY_WAIT_PID=''
    done
    return 1
}

# Writers at KILL_RATE events/s with known event ids for (KILLS + 1) *
# KILL_INTERVAL s; every KILL_INTERVAL s the relay is SIGKILLed and started
# again. A read_committed consumer counts the copies of every id.
sigkill_shape() {
    local mode tag db slot topic k kills resend_pid seconds out
    seconds=$(((KILLS + 1) * KILL_INTERVAL))
    for mode in $DELIVERY; do
        tag=$(mode_tag "$mode")
        db=bench_kill_$tag slot=bench_kill_$tag topic="bench-$RUN_ID-kill-$tag"
        out="$LOG_DIR/resend-$tag.json"
        log "sigkill ($mode): $KILL_RATE events/s for $seconds s, $KILLS kills"
        fresh_database "$db"
        sql "$db" -c "SELECT pg_create_logical_replication_slot('$slot', 'pgoutput')" >/dev/null
        "$BENCH_BIN" create-topics --brokers "$BROKERS" --partitions "$PARTITIONS" "$topic"
        mode_env "$mode"
        start_relay "$db" "$slot" "$topic" "relay-kill-$tag-0" "${MODE_ENV[@]}"
        if ! wait_streaming "$db" "$slot"; then
            record_failure sigkill "$mode" "the relay did not start; log: $LOG_DIR/relay-kill-$tag-0.log"
            stop_relay
            drop_database "$db"
            continue
        fi
        record kind=load phase="sigkill-$tag" loadavg="$(loadavg)"
        "$BENCH_BIN" resend --url "$(pg_url "$db")" --brokers "$BROKERS" --topic "$topic" \
            --aggregate-type kill --rate "$KILL_RATE" --seconds "$seconds" --writers "$WRITERS" \
            >"$out" &
        resend_pid=$!
        kills=0
        for ((k = 1; k <= KILLS; k++)); do
            sleep "$KILL_INTERVAL"
            log "  kill -9 relay $RELAY_PID ($k of $KILLS)"
            kill -KILL "$RELAY_PID" 2>/dev/null && kills=$((kills + 1))
            wait "$RELAY_WAIT_PID" 2>/dev/null || true
            RELAY_PID='' RELAY_WAIT_PID=''
            if ! start_relay_checked "$db" "$slot" "$topic" "relay-kill-$tag-$k" "${MODE_ENV[@]}"; then
                record_failure sigkill "$mode" "the relay did not restart after kill $k"
                break
            fi
        done
        if wait "$resend_pid"; then
            sed "s/^{/{\"kind\":\"resend\",\"delivery\":\"$mode\",\"kills\":$kills,/" "$out" >>"$RESULTS"
        else
            record_failure sigkill "$mode" "outbox-bench resend failed"
        fi
        stop_relay
        drop_database "$db"
    done
}

# ------------------------------------------------------------------- report

report() {
    local kafka_version
    kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$SCRIPT_DIR/kafka/pom.xml")
    "$BENCH_BIN" report --input "$RESULTS" --output "$OUTPUT" \
        --meta date="$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
        --meta command="$COMMAND_LINE" \
        --meta label="$LABEL" \
        --meta events="$EVENTS" \
        --meta partitions="$PARTITIONS" \
        --meta payload_bytes_avg="$PAYLOAD_BYTES" \
        --meta drain_relay_status_interval_ms="$DRAIN_STATUS_INTERVAL_MS" \
        --meta delivery="$DELIVERY" \
        --meta shapes="$SHAPES" \
        --meta relay_extra_env="${RELAY_EXTRA_ENV[*]}" \
        --meta kafka_jvm_opts="$OUTBOX_KAFKA_JVM_OPTS" \
        --meta load_start="$LOAD_START" \
        --meta load_end="$(loadavg)" \
        --meta git_commit="$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)" \
        --meta relay_sha256="$(sha256sum "$RELAY_BIN" | cut -c1-16)" \
        --meta postgres="$("${OUTBOX_TEST_PG_SERVER_BIN:-$PG_BIN}/postgres" --version)" \
        --meta kafka="$kafka_version" \
        --meta rustc="$(rustc --version)"
}

main() {
    parse_args "$@"
    RUN_ID=$(date -u +%Y%m%d%H%M%S)
    OUTPUT=${OUTPUT:-$REPO/bench/results/$(date -u +%Y-%m-%d-%H%M).json}
    LOAD_START=$(loadavg)
    build
    setup_metrics
    start_services
    LOG_DIR="$OUTBOX_RUN_DIR/bench-$RUN_ID"
    mkdir -p "$LOG_DIR"
    RESULTS="$LOG_DIR/results.jsonl"
    : >"$RESULTS"
    log "run $RUN_ID: N=$EVENTS; logs and raw results in $LOG_DIR"
    # A freshly started broker takes a moment to hand out producer ids; the
    # first relay would otherwise wait for that inside its timed drain.
    "$BENCH_BIN" warm-up --brokers "$BROKERS"
    # exactly_once's progress topic, made before anything is timed; the
    # relay would create it the same way (one partition, compacted).
    PROGRESS_TOPIC="bench-$RUN_ID-progress"
    if [[ " $DELIVERY " == *" exactly_once "* ]]; then
        "$BENCH_BIN" create-topics --brokers "$BROKERS" --partitions 1 \
            --config cleanup.policy=compact "$PROGRESS_TOPIC"
        # What a Kafka transaction costs without the relay: the floor under
        # exactly-once's commit time and commit-to-visible latency.
        "$BENCH_BIN" create-topics --brokers "$BROKERS" --partitions "$PARTITIONS" "bench-$RUN_ID-probe"
        "$BENCH_BIN" txn-probe --brokers "$BROKERS" --topic "bench-$RUN_ID-probe" \
            --transactions 50 --records 100 >>"$RESULTS" ||
            record_failure txn-probe exactly_once "a bare transactional producer failed"
    fi
    PAYLOAD_BYTES=$(payload_size)
    local mode shape
    if ((DO_DRAIN)); then
        for rows in $TXN_SIZES; do
            drain_round "$rows"
        done
    fi
    if ((DO_LATENCY)); then
        for mode in $DELIVERY; do
            for tracing in $TRACING_RUNS; do
                latency_phase "$mode" "$tracing"
            done
        done
    fi
    for shape in $SHAPES; do
        case $shape in
        payload) payload_shape ;;
        topics) topics_shape ;;
        big-txn) big_txn_shape ;;
        sigkill) sigkill_shape ;;
        esac
    done
    report
    if ((FAILURES)); then
        die "$FAILURES phase(s) failed: see FAILED above and the logs in $LOG_DIR"
    fi
}

# Average payload size of the preload, from a small sample.
payload_size() {
    sql postgres -c "DROP DATABASE IF EXISTS bench_sample" -c "CREATE DATABASE bench_sample"
    sql bench_sample -f "$REPO/migrations/001_outbox.sql"
    sql bench_sample -f "$REPO/bench/preload.sql"
    sql bench_sample -c "CALL bench_preload(1000, 100)" \
        -c "SELECT round(avg(octet_length(payload::text))) FROM outbox"
    sql postgres -c "DROP DATABASE bench_sample"
}

main "$@"
