#!/usr/bin/env bash
# scripts/test-versions.sh: the PostgreSQL version matrix, for CI after the
# full suite (which scripts/test.sh runs on 15).
#
#   scripts/test-versions.sh            core on 14, 16, 17, 18; failover and
#                                       decoding on a standby on 17;
#                                       PostgreSQL 13 refused by check and run
#   scripts/test-versions.sh 14 18      core on those majors only
#   OUTBOX_VERSIONS_FAILOVER=0 / OUTBOX_VERSIONS_PG13=0   leave those parts out
#   scripts/test-versions.sh --install  install what the matrix needs (server
#                                       binaries, the Kafka jars), run nothing:
#                                       .ci/run, before the matrix runs beside
#                                       the suite (apt-get and Maven one at a time)
#
# "Core" is tests/integration/relay_e2e.rs (exactly once in commit order, rollbacks,
# SIGKILLs with zero missing, idle WAL advance) and tests/integration/ops.rs (operator
# commands). Each major runs scripts/test.sh in its own state dir,
# ${OUTBOX_RUN_DIR:-/tmp/outbox-relay-versions}/<major>, with its own
# PostgreSQL and Kafka; OUTBOX_VERSIONS_JOBS (default 3) parts run at a time,
# each part's output in <state dir>/logs/, printed when the part ends. Server
# binaries other than Debian's 15 come from Maven Central and are cached
# (scripts/pg-binaries.sh).
#
# Duration, measured on the 2-core development machine one part at a time:
# about 77 s per major for the core (PostgreSQL and Kafka start included), 63 s
# for failover and decoding on a standby, a few seconds for the PostgreSQL 13
# refusal (the Maven downloads of the server binaries come on top, once).
# Exit code: 0 when every part passed; the summary at the end names the others.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
BASE=${OUTBOX_RUN_DIR:-/tmp/outbox-relay-versions}
install_only=0
if [[ ${1:-} == --install ]]; then
    install_only=1
    shift
fi
majors=("$@")
((${#majors[@]})) || majors=(14 16 17 18)

log() { printf '[test-versions] %s\n' "$*" >&2; }

# Parts run OUTBOX_VERSIONS_JOBS (3) at a time, each with its own state dir,
# ports, PostgreSQL and Kafka: most of a part's time is waiting (relay restarts,
# backlogs draining, deadlines), so three overlap well on two cores (with two:
# 68, 66 and 90 s rounds, 224 s in CI8). Each part
# writes to its own log, printed whole when it ends, so the output is not
# interleaved.
JOBS=${OUTBOX_VERSIONS_JOBS:-3}
LOGS="$BASE/logs"
mkdir -p "$LOGS"
results=()
failed=0
declare -A part_label=() part_log=() part_start=()

run_part() {
    local label=$1 logf
    shift
    while ((${#part_label[@]} >= JOBS)); do
        finish_part
    done
    logf="$LOGS/$(tr -c 'A-Za-z0-9\n' '-' <<<"$label").log"
    log "== $label (log: $logf)"
    "$@" >"$logf" 2>&1 &
    part_label[$!]=$label
    part_log[$!]=$logf
    part_start[$!]=$SECONDS
}

# Waits for one part to end, prints its log and records its result.
finish_part() {
    local pid rc=0
    wait -n -p pid || rc=$?
    local label=${part_label[$pid]} took=$((SECONDS - ${part_start[$pid]}))
    printf -- '----- %s (exit %d, %d s) -----\n' "$label" "$rc" "$took" >&2
    cat "${part_log[$pid]}" >&2
    unset "part_label[$pid]" "part_log[$pid]" "part_start[$pid]"
    if ((rc == 0)); then
        results+=("ok      $label ($took s)")
    else
        results+=("FAILED  $label ($took s)")
        failed=1
    fi
}

# No test of this selection needs the Schema Registry.
export OUTBOX_TEST_REGISTRY=0

# Download the server binaries one major at a time, before parts run side by
# side (Maven's local repository is shared), and build once.
prefetch=("${majors[@]}")
[[ ${OUTBOX_VERSIONS_FAILOVER:-1} == 1 ]] && prefetch+=(17)
[[ ${OUTBOX_VERSIONS_PG13:-1} == 1 ]] && prefetch+=(13)
for major in "${prefetch[@]}"; do
    bash scripts/pg-binaries.sh "$major" >/dev/null
done
if ((install_only)); then
    bash scripts/services.sh install
    exit 0
fi
# --workspace: the features of scripts/test.sh's build, which this reuses.
cargo test --no-run --quiet --locked --workspace --test integration

# The longest part first, so that the shorter ones fill in beside it.
if [[ ${OUTBOX_VERSIONS_FAILOVER:-1} == 1 ]]; then
    run_part "PostgreSQL 17: failover, decoding on a standby" \
        env OUTBOX_PG_VERSION=17 OUTBOX_RUN_DIR="$BASE/17-failover" \
        bash scripts/test.sh --test integration -- --test-threads=1 failover:: standby::
fi

for major in "${majors[@]}"; do
    run_part "PostgreSQL $major: relay_e2e, ops" \
        env OUTBOX_PG_VERSION="$major" OUTBOX_RUN_DIR="$BASE/$major" \
        bash scripts/test.sh --test integration -- relay_e2e:: ops::
done

# PostgreSQL 13: `check` and `run` refuse it with one line. A subshell, so that
# its exports and its EXIT trap (stop that cluster) stay inside.
# shellcheck disable=SC2317 # called through run_part
pg13_refused() (
    local dir="$BASE/13" env_file out rc
    export OUTBOX_RUN_DIR=$dir OUTBOX_PG_VERSION=13
    bash scripts/services.sh clean >/dev/null 2>&1 || true
    stop13() { bash scripts/services.sh stop >/dev/null 2>&1 || true; }
    trap stop13 EXIT
    env_file=$(bash scripts/services.sh pg-start >/dev/null && bash scripts/services.sh env) || return 1
    # shellcheck disable=SC1090 # written at run time by services.sh
    source "$env_file"
    # Built above as scripts/test.sh builds it (`cargo build` would compile
    # tokio and everything above it again, with the normal features).
    local bin="$ROOT/target/debug/outbox-relay"
    export OUTBOX_RELAY__POSTGRES__URL=$OUTBOX_TEST_PG_URL OUTBOX_RELAY__KAFKA__BROKERS=127.0.0.1:1
    for cmd in check run; do
        set +e
        out=$(timeout 60 "$bin" "$cmd" 2>&1)
        rc=$?
        set -e
        if ((rc == 0)) || ! grep -q "is not supported: outbox-relay needs PostgreSQL 14 or newer" <<<"$out"; then
            log "PostgreSQL 13: \`$cmd\` did not refuse (exit $rc):"
            printf '%s\n' "$out" >&2
            return 1
        fi
        log "PostgreSQL 13: \`$cmd\` refused (exit $rc): $(grep -m1 'not supported' <<<"$out")"
    done
)
if [[ ${OUTBOX_VERSIONS_PG13:-1} == 1 ]]; then
    run_part "PostgreSQL 13: check and run refuse" pg13_refused
fi

while ((${#part_label[@]} > 0)); do
    finish_part
done
log "summary:"
printf '  %s\n' "${results[@]}" >&2
exit "$failed"
