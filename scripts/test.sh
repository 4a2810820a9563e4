#!/usr/bin/env bash
# scripts/test.sh: build, start PostgreSQL + Kafka, run every test, stop
# them again. This is THE test command (CI runs it through .ci/run).
#
#   scripts/test.sh                       all tests (the bench crate's unit tests too)
#   scripts/test.sh --no-run              only build what the whole suite runs (.ci/run
#                                         builds first, then runs the version matrix beside it)
#   scripts/test.sh some_filter           only tests whose name contains it
#   scripts/test.sh --test integration relay_e2e::
#                                         one area of the integration tests
#                                         (cargo options go before `--`...)
#   scripts/test.sh --test integration -- relay_e2e:: --nocapture
#                                         ...test-binary options after it
#   OUTBOX_PG_VERSION=17 scripts/test.sh --test integration relay_e2e::
#                                         against another PostgreSQL major
#                                         (14, 15, 16, 17, 18; default 15)
#
# Services run from a fresh state dir, ${OUTBOX_RUN_DIR:-/tmp/outbox-relay-test}
# (wiped first unless OUTBOX_KEEP_STATE=1), and are stopped on exit whatever
# happens; the exit code is cargo test's. Their logs stay in the state dir:
#   pg/postgres.log  pg-replica/postgres.log  kafka/logs/server.log
#   kafka-acl/logs/server.log (the ACL broker, when a test started it)
# Needs nothing but what scripts/services.sh installs (PostgreSQL, Java and
# Maven via apt-get when missing, the Kafka jars via Maven, and with
# OUTBOX_PG_VERSION other than 15 that PostgreSQL's server binaries via Maven;
# see scripts/pg-binaries.sh). Tests can read the running major from
# OUTBOX_TEST_PG_VERSION.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
SERVICES="$ROOT/scripts/services.sh"
REGISTRY="$ROOT/scripts/registry.sh"
export OUTBOX_RUN_DIR=${OUTBOX_RUN_DIR:-/tmp/outbox-relay-test}

# Each line says when it was written (seconds since this script began).
log() { printf '[test.sh %d s] %s\n' "$SECONDS" "$*" >&2; }

locked=()
[[ -f Cargo.lock ]] && locked=(--locked)

# Split the arguments: before `--` for cargo, after it for the test binaries.
cargo_args=()
test_args=()
seen_dashdash=0
for arg in "$@"; do
    if ((seen_dashdash)); then
        test_args+=("$arg")
    elif [[ $arg == -- ]]; then
        seen_dashdash=1
    else
        cargo_args+=("$arg")
    fi
done
# --all-targets unless the caller picked targets. --workspace (the relay and the bench crate,
# bench/, whose unit tests run here too) unless the caller picked packages: also with picked
# targets, so that cargo unifies the same features as for the whole suite and reuses its build
# (`--test integration` alone would compile 15 dependencies again, with the root's features).
targets=(--all-targets)
packages=(--workspace)
for arg in "${cargo_args[@]}"; do
    case $arg in
    --lib | --bins | --bin | --bin=* | --tests | --test | --test=* | --examples | --example | \
        --example=* | --benches | --bench | --bench=* | --doc | --all-targets)
        targets=()
        ;;
    -p | -p* | --package | --package=* | --workspace | --all | --exclude | --exclude=*)
        packages=()
        ;;
    esac
done
# Three at a time on two cores: most of an integration test's time is waiting (relay restarts,
# outages, deadlines), and the tests assert properties, not rates (a timing run: 922 s of tests
# in 462 s with two).
threads=(--test-threads=3)
# The whole suite, no filter: two processes side by side. One runs the integration tests but
# `exclusive::`, four at a time (the cores idled 50-90% with three). The other, on services of
# its own in ${OUTBOX_RUN_DIR}-exclusive, runs `exclusive::` (they stop and restart their broker
# and PostgreSQL, one at a time, mostly waiting: 140 s), then the unit tests of both crates (no
# services; 30 s, most of it CPU) — instead of after and before the integration tests. Its
# output is printed at the end.
run_targets=("${targets[@]}")
EXCLUSIVE_DIR=$OUTBOX_RUN_DIR-exclusive
exclusive_pid=
skip_exclusive=()
if [[ ${#cargo_args[@]} -eq 0 && ${#test_args[@]} -eq 0 ]]; then
    run_targets=(--test integration)
    skip_exclusive=(--skip exclusive::)
    threads=(--test-threads=4)
fi
# The name filters: cargo's TESTNAME before `--` (not an option's value) and the test binaries'
# after it (not --skip's value).
filters=()
after_value=0
for arg in "${cargo_args[@]}"; do
    if ((after_value)); then
        after_value=0
    elif [[ $arg =~ ^(--test|--bin|--example|--bench|-p|--package|--exclude|-F|--features|--target|--target-dir|--profile|-j|--jobs|--manifest-path|--color|--message-format|--config|-Z)$ ]]; then
        after_value=1
    elif [[ $arg != -* ]]; then
        filters+=("$arg")
    fi
done
for arg in "${test_args[@]}"; do
    if ((after_value)); then
        after_value=0
    elif [[ $arg == --skip ]]; then
        after_value=1
    elif [[ $arg != -* ]]; then
        filters+=("$arg")
    fi
done
# `exclusive::` tests stop and restart the services they use. Named alone, they may use this
# run's: nothing else runs on them (exclusive/mod.rs refuses to run otherwise). Not named, they
# are left out of a selection (they would refuse to run beside it); named beside other tests,
# they refuse with the command that runs them.
if ((${#filters[@]})) && ! printf '%s\n' "${filters[@]}" | grep -qv '^exclusive::'; then
    export OUTBOX_TEST_EXCLUSIVE=1
elif ((${#skip_exclusive[@]} == 0)) && ! printf '%s\n' "${filters[@]}" | grep -q '^exclusive::'; then
    skip_exclusive=(--skip exclusive::)
    log "exclusive:: left out (they restart the services; alone: scripts/test.sh --test integration -- exclusive::)"
fi
for arg in "${test_args[@]}"; do
    [[ $arg == --test-threads* ]] && threads=()
done
# `scripts/test.sh --no-run`: the whole suite's build (the examples too), and nothing started.
build_only=0
if [[ ${cargo_args[*]} == --no-run && ${#test_args[@]} -eq 0 ]]; then
    build_only=1
    cargo_args=()
fi

bash "$ROOT/scripts/build-deps.sh"

# Build first (exactly what `cargo test` below runs), so that the services
# are not kept waiting by the compiler.
log "building: cargo test --no-run ${packages[*]} ${targets[*]} ${locked[*]} ${cargo_args[*]}"
cargo test --no-run "${packages[@]}" "${targets[@]}" "${locked[@]}" "${cargo_args[@]}"
# The whole suite: the inbox test runs examples/inbox_consumer as a program, which --all-targets
# built as a test harness only. Built now, with the same features, not beside running tests.
if [[ ${#cargo_args[@]} -eq 0 ]]; then
    log "building: cargo build --workspace --examples ${locked[*]}"
    cargo build --workspace --examples "${locked[@]}"
fi
((build_only)) && exit 0

services_started=0
# shellcheck disable=SC2317 # called through the EXIT trap
cleanup() {
    local rc=$? f
    trap - EXIT INT TERM
    if [[ -n $exclusive_pid ]] && kill -0 "$exclusive_pid" 2>/dev/null; then
        kill "$exclusive_pid" 2>/dev/null || true
        wait "$exclusive_pid" 2>/dev/null || true
    fi
    if ((services_started)); then
        if ((rc != 0)) && [[ ${CI:-} == true ]]; then
            # CI keeps no files: show the end of the service logs.
            for f in "$OUTBOX_RUN_DIR"{,-exclusive}/{pg,pg-ha,pg-ha-standby}/postgres.log; do
                if [[ -s $f ]]; then
                    printf -- '----- last lines of %s -----\n' "$f" >&2
                    tail -n 60 "$f" >&2 || true
                fi
            done
            for f in "$OUTBOX_RUN_DIR"{,-exclusive}/{kafka,kafka-acl}/logs/server.log; do
                if [[ -s $f ]]; then
                    printf -- '----- last warnings and errors of %s -----\n' "$f" >&2
                    grep -E '^\[[^]]*\] (WARN|ERROR|FATAL) ' "$f" | tail -n 40 >&2 || true
                fi
            done
            # The registry's access log shows the last request each test made.
            for f in "$OUTBOX_RUN_DIR"/{registry,registry-outage/registry}/registry.log; do
                if [[ -s $f ]]; then
                    printf -- '----- last lines of %s -----\n' "$f" >&2
                    tail -n 30 "$f" | cut -c1-300 >&2 || true
                fi
            done
        fi
        log "stopping services"
        bash "$SERVICES" stop || true
        OUTBOX_RUN_DIR=$EXCLUSIVE_DIR bash "$SERVICES" stop || true
        # services.sh stops the shared registry; the outage test's own one is here.
        OUTBOX_RUN_DIR="$OUTBOX_RUN_DIR/registry-outage" bash "$REGISTRY" stop || true
        log "service logs kept in $OUTBOX_RUN_DIR"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [[ ${OUTBOX_KEEP_STATE:-0} != 1 ]]; then
    bash "$SERVICES" clean
fi
services_started=1
log "starting PostgreSQL ${OUTBOX_PG_VERSION:-(default)} and Kafka in $OUTBOX_RUN_DIR"
start_time=$SECONDS
# services.sh prints the log tails itself when a service fails to start.
env_file=$(bash "$SERVICES" start) || {
    log "services failed to start (logs in $OUTBOX_RUN_DIR)"
    exit 1
}
if [[ ${run_targets[*]} != "${targets[*]}" ]]; then
    if [[ ${OUTBOX_KEEP_STATE:-0} != 1 ]]; then
        OUTBOX_RUN_DIR=$EXCLUSIVE_DIR bash "$SERVICES" clean
    fi
    exclusive_env=$(OUTBOX_RUN_DIR=$EXCLUSIVE_DIR bash "$SERVICES" start) || {
        log "the exclusive tests' services failed to start (logs in $EXCLUSIVE_DIR)"
        exit 1
    }
    log "exclusive tests, then the unit tests, start beside the others (services in $EXCLUSIVE_DIR; output at the end)"
    # A subshell with only the exclusive services' environment (the main one is sourced below).
    (
        # shellcheck disable=SC1090 # written at run time by services.sh
        source "$exclusive_env"
        side_rc=0
        OUTBOX_TEST_EXCLUSIVE=1 cargo test --workspace --test integration "${locked[@]}" -- \
            exclusive:: --skip kafka_msk_iam || side_rc=$?
        cargo test --no-fail-fast --workspace --lib --bins --examples "${locked[@]}" || side_rc=$?
        exit "$side_rc"
    ) >"$EXCLUSIVE_DIR/exclusive-tests.log" 2>&1 &
    exclusive_pid=$!
fi
bash "$SERVICES" pg-replica-start >/dev/null || {
    log "the wal_level=replica cluster failed to start (log: $OUTBOX_RUN_DIR/pg-replica/postgres.log)"
    exit 1
}
# shellcheck disable=SC1090 # written at run time by services.sh
source "$env_file"
log "services up in $((SECONDS - start_time))s (PostgreSQL $OUTBOX_TEST_PG_VERSION); env: $env_file"
# The Schema Registry (tests/integration/schema_registry.rs) and the Python consumer with
# Confluent's deserializers that checks what the relay wrote (both cached after
# the first run). OUTBOX_TEST_REGISTRY=0 leaves them out (test-versions.sh, whose
# selection has no registry test; those tests would start it themselves).
if [[ ${OUTBOX_TEST_REGISTRY:-1} == 1 ]]; then
    start_time=$SECONDS
    bash "$REGISTRY" start >/dev/null || {
        log "the schema registry failed to start (log: $OUTBOX_RUN_DIR/registry/registry.log)"
        exit 1
    }
    bash "$REGISTRY" python >/dev/null || {
        log "could not install the Python consumer for the schema registry tests"
        exit 1
    }
    # shellcheck disable=SC1091 # written at run time by registry.sh
    source "$OUTBOX_RUN_DIR/registry/env"
    log "schema registry up in $((SECONDS - start_time))s: $OUTBOX_TEST_REGISTRY_URL"
fi

set +e
# --no-fail-fast: a failing test binary does not hide the results of the others.
cargo test --no-fail-fast "${packages[@]}" "${run_targets[@]}" "${locked[@]}" "${cargo_args[@]}" -- \
    "${threads[@]}" "${skip_exclusive[@]}" "${test_args[@]}"
rc=$?
log "cargo test finished (exit $rc)"
if [[ -n $exclusive_pid ]]; then
    wait "$exclusive_pid"
    exclusive_rc=$?
    exclusive_pid=
    printf '\n----- exclusive::, then the unit tests (ran beside the others; exit %d) -----\n' "$exclusive_rc"
    cat "$EXCLUSIVE_DIR/exclusive-tests.log"
    ((rc != 0)) || rc=$exclusive_rc
    # The token-login tests restart their broker and wait for every client to log in again
    # within fixed deadlines: once (in 3 runs) a consumer had not within 60 s while the suite
    # ran beside it. They run alone, after it.
    printf '\n----- exclusive::kafka_msk_iam, alone -----\n'
    (
        # shellcheck disable=SC1090 # written at run time by services.sh
        source "$exclusive_env"
        OUTBOX_TEST_EXCLUSIVE=1 exec cargo test --workspace --test integration "${locked[@]}" -- \
            exclusive::kafka_msk_iam
    )
    msk_rc=$?
    log "kafka_msk_iam finished (exit $msk_rc)"
    ((rc != 0)) || rc=$msk_rc
fi
set -e
exit "$rc"
