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
#   --warm-up-seconds S
#                      writers at each rate before its measured window, whose
#                      records are reported apart (default 10; 3 with --quick)
#   --idle-seconds S   idle CPU window (default 30)
#   --partitions P     partitions of each benchmark topic (default 3)
#   --writers W        latency writer connections (default 4)
#   --latency-topics T topics each latency rate's rows spread over (default 1)
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
#                        schema   the same backlog (N events, 10-row
#                                 transactions) drained with values as they
#                                 are and Avro-encoded (bench/order.avsc,
#                                 against an Apicurio registry this script
#                                 starts): ratio and CPU per event of each
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
#   --peer debezium    the incumbent on the same backlogs: after the relays, each
#                      txn round's backlog is drained once more, from a third
#                      copy of the slot, by Debezium's embedded engine with its
#                      Outbox Event Router (bench/debezium, compiled with Maven
#                      into the run dir; Kafka acknowledges every batch before
#                      its offsets are committed); timed from when it streams
#                      (its JVM and connector start-up is reported apart) until
#                      its slot confirmed the last commit; all N events must be
#                      in its topic
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
#   1. Drain: for each transaction size, a fresh database and pgoutput slots
#      at the same position (copies of the first: one per contender, one for
#      the warm-up read and two for pg_recvlogical), then a
#      server-side preload of N events (~250-byte JSON payloads). An untimed
#      pg_recvlogical read of the backlog first (the WAL in the page cache for
#      everyone); then it times pg_recvlogical draining its slot to /dev/null
#      (--endpos: exits at the last commit), then the relay in each --delivery
#      mode draining its own slot to Kafka until that slot's
#      confirmed_flush_lsn reaches the same position (polled every 100 ms),
#      sampling the relay's peak RSS and CPU time at that moment, then the
#      --peer, then pg_recvlogical once more (the limit after the contenders).
#   2. Latency: one relay, writers inserting 1-row transactions at each rate;
#      a consumer computes receive time - record timestamp (the relay stamps
#      each record with its transaction's commit time). Each rate starts with
#      --warm-up-seconds of the same writers, then waits for all their records,
#      so that the window measures a steady state; the warm-up's own figures
#      are printed apart.
#   3. Idle: the same relay's CPU over --idle-seconds with no traffic.
#   4. The --shapes phases, described in bench/README.md.
#   Phases 1-3 (and 4) run once per --delivery mode.
# The phases run in Rust (`outbox-bench run`, the crate in bench/), which owns the
# relays and pg_recvlogical it starts (stopped when it exits, also on an error or
# Ctrl-C) and writes typed records; this script only builds, starts and stops the
# services, and passes the options on. It prints one table and writes the same
# figures as JSON with the machine and versions. It asserts nothing about time; it is not a test.
#
# Services: scripts/services.sh in ${OUTBOX_RUN_DIR:-/tmp/outbox-relay-bench}
# (its own PostgreSQL and Kafka, never the test suite's), stopped at the end.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$SCRIPT_DIR/.." && pwd)

# What outbox-bench run records as the command, where it finds the migrations.
export OUTBOX_BENCH_COMMAND="scripts/bench.sh${*:+ $*}"
export OUTBOX_BENCH_REPO=$REPO
export OUTBOX_RUN_DIR=${OUTBOX_RUN_DIR:-/tmp/outbox-relay-bench}
# The broker's JIT: services.sh defaults to C1 only (fast start for tests);
# a throughput benchmark wants C2, or the broker, not the relay, is measured.
export OUTBOX_KAFKA_JVM_OPTS=${OUTBOX_KAFKA_JVM_OPTS:--XX:TieredStopAtLevel=4}

log() { printf '[bench] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

RELAY_BIN=
KEEP_SERVICES=0
# The schema shape needs a Schema Registry (scripts/registry.sh, in the same run dir).
WANT_REGISTRY=0
# --peer debezium needs bench/debezium compiled.
WANT_DEBEZIUM=0

# Only what this script needs: which relay to build, whether to keep the
# services. Every option is outbox-bench run's (it checks them); the values of
# those that take one are skipped here.
scan_args() {
    while (($#)); do
        case $1 in
        -h | --help) usage; exit 0 ;;
        --relay-bin) RELAY_BIN=$(realpath "$2"); shift ;;
        --keep-services) KEEP_SERVICES=1 ;;
        --shapes)
            [[ ${2:-} =~ (^|[ ,])(schema|all)([ ,]|$) ]] && WANT_REGISTRY=1
            if (($# > 1)); then shift; fi ;;
        --peer)
            [[ ${2:-} == debezium ]] && WANT_DEBEZIUM=1
            if (($# > 1)); then shift; fi ;;
        --events | --txn-sizes | --rates | --rate-seconds | --warm-up-seconds | --idle-seconds | --partitions | \
            --writers | --latency-topics | --delivery | --payload-sizes | --payload-mb | --topics-count | \
            --big-txn-rows | --kill-rate | --kills | --kill-interval | --relay-env | --label | --output)
            if (($# > 1)); then shift; fi ;;
        esac
        shift
    done
}

build() {
    if [[ -n $RELAY_BIN ]]; then
        log "cargo build --release -p outbox-bench; relay: $RELAY_BIN"
        (cd "$REPO" && cargo build --release --quiet -p outbox-bench)
    else
        # The bench is a workspace member outside the root's default members: named here.
        log "cargo build --release --workspace --bins (outbox-relay, outbox-bench)"
        (cd "$REPO" && cargo build --release --quiet --workspace --bins)
        RELAY_BIN="$REPO/target/release/outbox-relay"
    fi
    [[ -x $RELAY_BIN ]] || die "no relay binary at $RELAY_BIN"
    export OUTBOX_BENCH_RELAY_BIN=$RELAY_BIN
    BENCH_BIN="$REPO/target/release/outbox-bench"
}

start_services() {
    local env_file
    env_file=$(bash "$SCRIPT_DIR/services.sh" start)
    # shellcheck disable=SC1090
    source "$env_file"
    trap cleanup EXIT
    if ((WANT_REGISTRY)); then
        OUTBOX_BENCH_REGISTRY_URL=$(bash "$SCRIPT_DIR/registry.sh" start) ||
            die "the schema registry did not start (scripts/registry.sh)"
        export OUTBOX_BENCH_REGISTRY_URL
    fi
}

# The Debezium peer (bench/debezium): compiled into the run dir, its jars resolved by
# Maven into ~/.m2 (Maven Central the first time); java and mvn are there once
# services.sh has started (it installs them when missing).
build_debezium_peer() {
    local dir="$OUTBOX_RUN_DIR/debezium-peer"
    log "compiling the Debezium peer (mvn -f bench/debezium/pom.xml) into $dir"
    mvn -B -q -f "$REPO/bench/debezium/pom.xml" -Dpeer.build="$dir" compile \
        dependency:build-classpath -Dmdep.outputFile="$dir/classpath.txt" >&2 ||
        die "the Debezium peer did not build (mvn -f bench/debezium/pom.xml compile)"
    OUTBOX_BENCH_DEBEZIUM_CLASSPATH="$dir/classes:$(cat "$dir/classpath.txt")"
    export OUTBOX_BENCH_DEBEZIUM_CLASSPATH
}

# On any exit (outbox-bench run has stopped its relays by then): the services,
# unless kept.
cleanup() {
    if ((KEEP_SERVICES == 0)); then
        log "stopping services in $OUTBOX_RUN_DIR"
        # services.sh stops the registry too, when one runs there.
        bash "$SCRIPT_DIR/services.sh" stop || true
    fi
}

main() {
    scan_args "$@"
    build
    # Bad options fail here, before the services start.
    "$BENCH_BIN" run --check-options "$@"
    start_services
    if ((WANT_DEBEZIUM)); then build_debezium_peer; fi
    # Not exec: the services are stopped when it ends.
    "$BENCH_BIN" run "$@"
}

main "$@"
