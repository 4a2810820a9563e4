#!/usr/bin/env bash
# scripts/registry.sh: a real Schema Registry for the end-to-end tests, as a
# plain local process (no Docker), listening on 127.0.0.1 only: Apicurio
# Registry, whose Confluent-compatible API (what Confluent's serializers and
# deserializers speak) is under /apis/ccompat/v7.
#
# Usage: scripts/registry.sh COMMAND
#
#   start      start the registry (if it is not running), wait until it
#              answers; prints its Confluent-compatible base URL,
#              http://127.0.0.1:PORT/apis/ccompat/v7 (the value of a client's
#              schema.registry.url). stop then start brings back the SAME
#              registry: same port, same schemas and ids (see storage below).
#   stop       stop it (idempotent; SIGTERM, SIGKILL after the stop timeout)
#   status     say whether it runs (exit 3 if not)
#   url        print the base URL (exit 1 if it was never started here)
#   env        print the env file's path (exit 1 if not written yet)
#   selftest   register a JSON Schema, an Avro and a Protobuf schema through
#              the ccompat API, read them back by id, list the subjects;
#              starts the registry first if it is not running (and stops it
#              again afterwards)
#   clean      stop it and delete its state (schemas, logs)
#   python     print the path of a python with Confluent's client library
#              (confluent-kafka[avro,json,protobuf] and grpcio-tools from PyPI, in a venv in the cache dir
#              below; made on first use) for scripts/registry/consume.py
#
# State lives in ${OUTBOX_RUN_DIR:-/tmp/outbox-relay-run}/registry (the same
# run dir as scripts/services.sh; ports are saved in its ports/ beside the
# others, so the two scripts never pick the same port):
#   env                 shell `export` lines (source it): OUTBOX_TEST_REGISTRY_URL
#                       (the ccompat base URL), _ROOT (http://127.0.0.1:PORT, for
#                       Apicurio's own API under /apis/registry/v3), _HEALTH
#                       (readiness, on the management port), _LOG, _SCRIPT
#   registry.log        everything the JVM printed, kept across starts; one
#                       access-log line per HTTP request, so a test can count
#                       the relay's calls
#   registry.pid, data/ (H2 database files), tmp/, registry.jsa
#   ports: ../ports/registry, ../ports/registry-management
# The unpacked registry (from Maven Central, scripts/registry/pom.xml) and a
# JVM class archive of it (faster start-up) are cached in
# ${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/.
#
# Tuning (environment):
#   OUTBOX_REGISTRY_STORAGE  file (default): H2 database files in the state
#                            dir, kept across stop/start; mem: H2 in memory,
#                            empty at every start (ids start again at 1)
#   OUTBOX_REGISTRY_JAVA     the java to run it with; it needs Java 21+.
#                            Unset: $JAVA_HOME, java on PATH or the newest
#                            JDK under /usr/lib/jvm, whichever is 21+ first
#   OUTBOX_REGISTRY_JVM_OPTS extra JVM options, appended (e.g. -Dapicurio...
#                            or -Dquarkus... settings)
#   OUTBOX_REGISTRY_CDS=0    no class archive
#   OUTBOX_REGISTRY_START_TIMEOUT (180), OUTBOX_REGISTRY_STOP_TIMEOUT (20)
#                            seconds
#
# Messages go to stderr; stdout carries only the documented output, so
# `url=$(scripts/registry.sh start)` works.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")"
REGISTRY_POM="$SCRIPT_DIR/registry/pom.xml"

RUN_DIR=${OUTBOX_RUN_DIR:-/tmp/outbox-relay-run}
case $RUN_DIR in /*) ;; *) RUN_DIR="$PWD/$RUN_DIR" ;; esac
RUN_DIR=${RUN_DIR%/}
PORTS_DIR="$RUN_DIR/ports"
MARKER="$RUN_DIR/.outbox-relay-run"
REG_DIR="$RUN_DIR/registry"
REG_LOG="$REG_DIR/registry.log"
REG_PID="$REG_DIR/registry.pid"
REG_ENV="$REG_DIR/env"
CACHE_DIR="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/outbox-relay"
CCOMPAT_PATH=/apis/ccompat/v7

START_TIMEOUT=${OUTBOX_REGISTRY_START_TIMEOUT:-180}
STOP_TIMEOUT=${OUTBOX_REGISTRY_STOP_TIMEOUT:-20}
STORAGE=${OUTBOX_REGISTRY_STORAGE:-file}
MIN_JAVA=21

log() { printf '[registry] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- state dir

ensure_dirs() {
    make_run_dir
    mkdir -p "$REG_DIR"
}

# The run dir's marker, lock and ports, and show_tail: scripts/run-dir.sh.
# shellcheck source=scripts/run-dir.sh
source "$SCRIPT_DIR/run-dir.sh"
# shellcheck source=scripts/apt-install.sh
source "$SCRIPT_DIR/apt-install.sh"
take_lock() { lock_dir "$REG_DIR"; }

saved_port() {
    [[ -s $PORTS_DIR/$1 ]] || return 1
    cat "$PORTS_DIR/$1"
}

base_url() { echo "http://127.0.0.1:$1$CCOMPAT_PATH"; }

# -------------------------------------------------------------------- java

# Prints the major version of the java binary $1 (from the JDK's release
# file when there is one: no JVM start).
java_major() {
    local java=$1 home ver
    home=$(dirname "$(dirname "$(readlink -f "$java")")")
    if [[ -f $home/release ]]; then
        ver=$(sed -n 's/^JAVA_VERSION="\([^"]*\)".*/\1/p' "$home/release")
    fi
    if [[ -z ${ver:-} ]]; then
        ver=$("$java" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1)
    fi
    ver=${ver#1.} # 1.8 -> 8
    echo "${ver%%[.+-]*}"
}

# Prints the java to run the registry with (Java 21+), or fails saying why.
find_java() {
    local c major
    local -a candidates=()
    if [[ -n ${OUTBOX_REGISTRY_JAVA:-} ]]; then
        [[ -x $OUTBOX_REGISTRY_JAVA ]] || die "OUTBOX_REGISTRY_JAVA=$OUTBOX_REGISTRY_JAVA is not an executable"
        major=$(java_major "$OUTBOX_REGISTRY_JAVA")
        ((major >= MIN_JAVA)) ||
            die "OUTBOX_REGISTRY_JAVA=$OUTBOX_REGISTRY_JAVA is Java $major; Apicurio Registry needs Java $MIN_JAVA+"
        echo "$OUTBOX_REGISTRY_JAVA"
        return
    fi
    [[ -n ${JAVA_HOME:-} && -x $JAVA_HOME/bin/java ]] && candidates+=("$JAVA_HOME/bin/java")
    command -v java >/dev/null 2>&1 && candidates+=("$(command -v java)")
    for c in "${candidates[@]}"; do
        major=$(java_major "$c" 2>/dev/null || true)
        if [[ $major =~ ^[0-9]+$ ]] && ((major >= MIN_JAVA)); then
            echo "$c"
            return
        fi
    done
    # Else the newest JDK under /usr/lib/jvm.
    local best='' best_major=0
    for c in /usr/lib/jvm/*/bin/java; do
        [[ -x $c ]] || continue
        candidates+=("$c")
        major=$(java_major "$c" 2>/dev/null || true)
        if [[ $major =~ ^[0-9]+$ ]] && ((major > best_major)); then
            best=$c
            best_major=$major
        fi
    done
    if ((best_major >= MIN_JAVA)); then
        echo "$best"
        return
    fi
    die "Apicurio Registry needs Java $MIN_JAVA+, found none (tried: ${candidates[*]:-nothing}; \
Debian 12 ships only 17). Install a JDK 21+ (on these machines Temurin 25 is in \
/usr/lib/jvm/temurin-25-jdk-amd64) or set OUTBOX_REGISTRY_JAVA=/path/to/bin/java"
}

# --------------------------------------------------------------- the app

# Prints the directory of the unpacked registry (quarkus-run.jar and its
# lib/), fetching it with Maven and unpacking it into the cache on first use.
registry_home() {
    local key home tarball tmp cp_file mlog
    key=$(sha256sum "$REGISTRY_POM" | cut -c1-16)
    home="$CACHE_DIR/apicurio-registry-$key"
    if [[ -f $home/.complete && -f $home/quarkus-run.jar ]]; then
        echo "$home"
        return
    fi
    command -v mvn >/dev/null 2>&1 || die "mvn not found: install Maven (apt-get install maven)"
    mkdir -p "$CACHE_DIR"
    cp_file="$CACHE_DIR/apicurio-registry-$key.path.$$"
    mlog="$CACHE_DIR/maven-registry.log"
    log "fetching Apicurio Registry with Maven (once, ~160 MB; unpacked into $home)"
    if ! mvn -B -q -f "$REGISTRY_POM" dependency:build-classpath -Dmdep.outputFile="$cp_file" \
        </dev/null >"$mlog" 2>&1 || [[ ! -s $cp_file ]]; then
        show_tail "$mlog"
        rm -f "$cp_file"
        die "Maven could not fetch Apicurio Registry (log: $mlog)"
    fi
    tarball=$(cat "$cp_file")
    rm -f "$cp_file"
    [[ $tarball == *.tar.gz && -s $tarball ]] || die "Maven named no registry tarball (got '$tarball'; log: $mlog)"
    tmp="$home.tmp.$$"
    rm -rf "$tmp"
    mkdir -p "$tmp"
    if ! tar -xzf "$tarball" -C "$tmp" || [[ ! -f $tmp/quarkus-run.jar ]]; then
        rm -rf "$tmp"
        die "could not unpack $tarball (no quarkus-run.jar in it?)"
    fi
    : >"$tmp/.complete"
    # Another state dir may have unpacked it meanwhile: keep the first.
    if ! mv -T "$tmp" "$home" 2>/dev/null; then
        rm -rf "$tmp"
        [[ -f $home/.complete ]] || die "could not move the unpacked registry to $home"
    fi
    echo "$home"
}

# Prints the pid of this state dir's registry if it runs (the pid file's
# process, checked to be our JVM: not a recycled pid).
registry_pid() {
    local pid
    [[ -s $REG_PID ]] || return 1
    pid=$(cat "$REG_PID")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    alive "$pid" || return 1
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF -- "-Doutbox.registry.dir=$REG_DIR" || return 1
    echo "$pid"
}

# HTTP status of a GET of $1 (000 if no answer).
http_status() {
    curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$1" 2>/dev/null || true
}

write_env() {
    local port=$1 mport=$2 tmp="$REG_ENV.tmp.$$"
    {
        echo "# Written by scripts/registry.sh; source it: . $REG_ENV"
        printf 'export OUTBOX_TEST_REGISTRY_URL=%q\n' "$(base_url "$port")"
        printf 'export OUTBOX_TEST_REGISTRY_ROOT=%q\n' "http://127.0.0.1:$port"
        printf 'export OUTBOX_TEST_REGISTRY_HEALTH=%q\n' "http://127.0.0.1:$mport/health/ready"
        printf 'export OUTBOX_TEST_REGISTRY_LOG=%q\n' "$REG_LOG"
        printf 'export OUTBOX_TEST_REGISTRY_SCRIPT=%q\n' "$SELF"
    } >"$tmp"
    mv -f "$tmp" "$REG_ENV"
}

# The class archive: the JVM writes it at exit when it is missing or stale
# (-XX:+AutoCreateSharedArchive), into the state dir; stop copies a fresh one
# to the cache, and start begins from the cached copy.
cds_cache_file() {
    local java=$1 home=$2 id
    id=$(printf '%s\n%s\n' "$(readlink -f "$java")" "$home" | sha256sum | cut -c1-16)
    echo "$CACHE_DIR/apicurio-registry-$id.jsa"
}

# Prints ": " and the first ERROR line and the last "Caused by" of what the
# JVM logged after byte $1 of the log (a Quarkus start-up failure is a long
# stack trace whose tail says little), or nothing.
start_error() {
    local part first cause
    part=$(tail -c +"$(($1 + 1))" "$REG_LOG" 2>/dev/null) || return 0
    first=$(grep -m 1 -E ' (ERROR|FATAL) |^Error|^Exception' <<<"$part" || true)
    cause=$(grep -E '^Caused by: ' <<<"$part" | tail -n 1 || true)
    [[ -n $first$cause ]] || return 0
    printf ': %s' "${first}${first:+${cause:+ / }}${cause}"
}

cmd_start() {
    local java home port mport pid i offset status cds='' t0
    local -a args
    port=$(port_for registry)
    mport=$(port_for registry-management)
    if pid=$(registry_pid); then
        log "registry already running (pid $pid) on 127.0.0.1:$port"
        write_env "$port" "$mport"
        base_url "$port"
        return 0
    fi
    command -v curl >/dev/null 2>&1 || die "curl not found (apt-get install curl): needed to see when the registry is up"
    java=$(find_java)
    home=$(registry_home)
    for i in "$port" "$mport"; do
        if port_in_use "$i"; then
            die "port $i (saved in $PORTS_DIR) is taken by another process; stop it or run '$SELF clean'"
        fi
    done
    mkdir -p "$REG_DIR/tmp" "$REG_DIR/data"
    args=(-Doutbox.registry.dir="$REG_DIR"
        -Xms64m -Xmx256m -XX:+UseSerialGC -XX:+ExitOnOutOfMemoryError
        # C1 only: starts faster and spends less CPU on 2 cores.
        -XX:TieredStopAtLevel=1
        -Djava.net.preferIPv4Stack=true -Djava.awt.headless=true
        -Djava.io.tmpdir="$REG_DIR/tmp" -Dvertx.cacheDirBase="$REG_DIR/tmp/vertx-cache")
    if [[ ${OUTBOX_REGISTRY_CDS:-1} != 0 ]]; then
        cds=$(cds_cache_file "$java" "$home")
        [[ ! -s $REG_DIR/registry.jsa && -s $cds ]] && cp -f "$cds" "$REG_DIR/registry.jsa"
        args+=(-XX:+AutoCreateSharedArchive -XX:SharedArchiveFile="$REG_DIR/registry.jsa"
            '-Xlog:cds*=error')
    fi
    # Loopback only, on our ports (the app's defaults are 0.0.0.0:8080 and
    # management 0.0.0.0:9000).
    args+=(-Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port"
        -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$mport"
        -Dquarkus.log.console.format='%d{yyyy-MM-dd HH:mm:ss,SSS} %-5p [%c{3.}] (%t) %s%e%n'
        -Dapicurio.storage.snapshot.location="$REG_DIR/tmp" -Dapicurio.import.work-dir="$REG_DIR/tmp"
        # The app keeps 20 connections open by default; a test needs few.
        -Dapicurio.datasource.jdbc.initial-size=2 -Dapicurio.datasource.jdbc.min-size=2
        -Dapicurio.datasource.jdbc.max-size=20)
    case $STORAGE in
    file) args+=(-Dapicurio.datasource.url="jdbc:h2:file:$REG_DIR/data/registry") ;;
    mem) args+=(-Dapicurio.datasource.url="jdbc:h2:mem:registry") ;;
    *) die "OUTBOX_REGISTRY_STORAGE must be file or mem, not '$STORAGE'" ;;
    esac
    # shellcheck disable=SC2206 # word splitting wanted: several options
    [[ -n ${OUTBOX_REGISTRY_JVM_OPTS:-} ]] && args+=($OUTBOX_REGISTRY_JVM_OPTS)
    args+=(-jar "$home/quarkus-run.jar")
    offset=0
    [[ -f $REG_LOG ]] && offset=$(stat -c %s "$REG_LOG")
    printf -- '===== %s: starting (%s, Java %s, storage %s) =====\n' \
        "$(date -u +%FT%TZ)" "$home" "$(java_major "$java")" "$STORAGE" >>"$REG_LOG"
    log "starting Apicurio Registry on 127.0.0.1:$port (management 127.0.0.1:$mport; Java $(java_major "$java"))"
    rm -f "$REG_PID"
    t0=$SECONDS
    # setsid: the JVM must not get the terminal's Ctrl-C nor hold the caller's
    # stdout/stderr. The inner bash writes its own pid, then becomes java.
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid bash -c 'echo $$ >"$0"; exec "$1" "${@:2}"' "$REG_PID" "$java" "${args[@]}" \
        </dev/null >>"$REG_LOG" 2>&1 9>&- &
    for ((i = 0; i < 200; i++)); do
        [[ -s $REG_PID ]] && break
        sleep 0.05
    done
    pid=$(cat "$REG_PID" 2>/dev/null || true)
    while ((SECONDS - t0 < START_TIMEOUT)); do
        if [[ -z $pid ]] || ! alive "$pid"; then
            show_tail "$REG_LOG"
            # Should the class archive be at fault, the next start goes without it.
            if tail -c +"$((offset + 1))" "$REG_LOG" | grep -Eqi 'shared archive|\[cds'; then
                rm -f "$REG_DIR/registry.jsa"
                [[ -n $cds ]] && rm -f "$cds"
            fi
            rm -f "$REG_PID"
            die "the registry exited during start-up$(start_error "$offset"); log: $REG_LOG"
        fi
        status=$(http_status "http://127.0.0.1:$mport/health/ready")
        if [[ $status == 200 && $(http_status "$(base_url "$port")/subjects") == 200 ]]; then
            write_env "$port" "$mport"
            log "registry ready on 127.0.0.1:$port (pid $pid, $((SECONDS - t0)) s); log: $REG_LOG"
            base_url "$port"
            return 0
        fi
        sleep 0.2
    done
    show_tail "$REG_LOG"
    stop_registry
    die "the registry did not become ready$(start_error "$offset") within ${START_TIMEOUT}s (last health status: $status); log: $REG_LOG"
}

stop_registry() {
    local pid cds_target
    if ! pid=$(registry_pid); then
        rm -f "$REG_PID"
        return 0
    fi
    stop_process "$pid" "the registry" "$STOP_TIMEOUT" || rm -f "$REG_DIR/registry.jsa" # maybe half written
    rm -f "$REG_PID"
    printf -- '===== %s: stopped =====\n' "$(date -u +%FT%TZ)" >>"$REG_LOG"
    # Keep a class archive the JVM wrote at exit for the next state dir.
    if [[ ${OUTBOX_REGISTRY_CDS:-1} != 0 && -s $REG_DIR/registry.jsa ]]; then
        local java home
        java=$(find_java 2>/dev/null) || return 0
        home=$(registry_home 2>/dev/null) || return 0
        cds_target=$(cds_cache_file "$java" "$home")
        if ! cmp -s "$REG_DIR/registry.jsa" "$cds_target"; then
            cp -f "$REG_DIR/registry.jsa" "$cds_target.tmp.$$" && mv -f "$cds_target.tmp.$$" "$cds_target" &&
                log "cached the registry's class archive in $cds_target"
        fi
    fi
}

cmd_status() {
    local pid port
    port=$(saved_port registry 2>/dev/null || echo '?')
    if pid=$(registry_pid); then
        echo "registry: running on 127.0.0.1:$port (pid $pid): $(base_url "$port")"
        [[ -f $REG_ENV ]] && echo "env file: $REG_ENV"
        return 0
    fi
    echo "registry: stopped"
    return 3
}

# --------------------------------------------------------------- selftest

# POSTs the JSON body $2 to the ccompat path $1; prints the response body,
# fails unless the status is $3 (200 unless given).
post() {
    local path=$1 body=$2 want=${3:-200} out status
    out=$(curl -sS --max-time 30 -w '\n%{http_code}' -X POST \
        -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
        --data-binary "$body" "$SELFTEST_URL$path") || return 1
    status=${out##*$'\n'}
    out=${out%$'\n'*}
    printf '%s\n' "$out"
    [[ $status == "$want" ]] || { log "POST $path: HTTP $status (wanted $want): $out"; return 1; }
}

get() {
    curl -fsS --max-time 30 "$SELFTEST_URL$1"
}

# True if $1 is an id and not $2.
new_id() { [[ -n $1 && $1 != "$2" ]]; }

# True if the JSON array of strings $1 holds each of $2...
lists() {
    local list=$1 s
    shift
    for s in "$@"; do
        grep -qF "\"$s\"" <<<"$list" || return 1
    done
}

json_id() { sed -n 's/.*"id":\([0-9][0-9]*\).*/\1/p' <<<"$1"; }

cmd_selftest() {
    local started=0 prefix pass=0 fail=0 out id_json id_json2 id_avro id_proto subjects
    if ! registry_pid >/dev/null; then
        SELFTEST_URL=$(cmd_start)
        started=1
    else
        SELFTEST_URL=$(base_url "$(saved_port registry)")
    fi
    log "selftest against $SELFTEST_URL"
    prefix="selftest-$(date +%s)-$$"
    check() {
        local what=$1
        shift
        if "$@"; then
            pass=$((pass + 1))
            log "ok:   $what"
        else
            fail=$((fail + 1))
            log "FAIL: $what"
        fi
    }
    # shellcheck disable=SC2016 # "$schema" is JSON Schema's keyword
    local json_schema='{"schemaType":"JSON","schema":"{\"$schema\":\"http://json-schema.org/draft-07/schema#\",\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"integer\"},\"status\":{\"type\":\"string\"}},\"required\":[\"id\"]}"}'
    local avro_schema='{"schemaType":"AVRO","schema":"{\"type\":\"record\",\"name\":\"OrderPlaced\",\"namespace\":\"dev.outbox.test\",\"fields\":[{\"name\":\"id\",\"type\":\"long\"},{\"name\":\"status\",\"type\":\"string\"}]}"}'
    local proto_schema='{"schemaType":"PROTOBUF","schema":"syntax = \"proto3\";\npackage dev.outbox.test;\n\nmessage OrderShipped {\n  int64 id = 1;\n  string carrier = 2;\n}\n"}'

    out=$(post "/subjects/$prefix-json-value/versions" "$json_schema") || true
    id_json=$(json_id "$out")
    check "register a JSON Schema: id ${id_json:-none}" test -n "$id_json"
    out=$(post "/subjects/$prefix-json-value/versions" "$json_schema") || true
    id_json2=$(json_id "$out")
    check "registering it again gives the same id (${id_json2:-none})" test "${id_json2:-x}" = "${id_json:-y}"
    out=$(post "/subjects/$prefix-avro-value/versions" "$avro_schema") || true
    id_avro=$(json_id "$out")
    check "register an Avro schema: id ${id_avro:-none}, not the JSON one's" \
        new_id "$id_avro" "$id_json"
    out=$(post "/subjects/$prefix-proto-value/versions" "$proto_schema") || true
    id_proto=$(json_id "$out")
    check "register a Protobuf schema: id ${id_proto:-none}" test -n "$id_proto"

    out=$(get "/schemas/ids/${id_json:-0}" 2>&1) || true
    check "GET /schemas/ids/$id_json is the JSON Schema" grep -q '"schemaType":"JSON"' <<<"$out"
    out=$(get "/schemas/ids/${id_avro:-0}" 2>&1) || true
    # Confluent leaves schemaType out for Avro (the default); accept both.
    check "GET /schemas/ids/$id_avro is the Avro record" grep -q 'OrderPlaced' <<<"$out"
    out=$(get "/schemas/ids/${id_proto:-0}" 2>&1) || true
    check "GET /schemas/ids/$id_proto is the Protobuf message" grep -q '"schemaType":"PROTOBUF"' <<<"$out"
    out=$(get "/subjects/$prefix-avro-value/versions/latest" 2>&1) || true
    check "latest version of $prefix-avro-value has id $id_avro" test "$(json_id "$out")" = "${id_avro:-x}"

    subjects=$(get /subjects 2>&1) || true
    check "GET /subjects lists the three subjects" \
        lists "$subjects" "$prefix-json-value" "$prefix-avro-value" "$prefix-proto-value"
    out=$(post "/subjects/$prefix-bad-value/versions" \
        '{"schemaType":"AVRO","schema":"{\"type\":\"record\",\"name\":\"Broken\""}' 422 2>&1) || true
    check "an invalid Avro schema is refused with 422" grep -q '"error_code":422' <<<"$out"

    ((started)) && stop_registry
    echo "selftest: $pass passed, $fail failed"
    ((fail == 0))
}

# ----------------------------------------------------------------- python

# The venv's python, made (and confluent-kafka installed into it) on first use. Its
# directory is named after the requirements, so that a new set never replaces a venv that
# another checkout's tests are using. grpcio-tools: protoc as a Python module, to generate
# the message class that Confluent's ProtobufDeserializer needs from the registry's .proto.
cmd_python() {
    local req='confluent-kafka[avro,json,protobuf]==2.16.1 grpcio-tools==1.85.1' t0=$SECONDS
    local venv
    venv="$CACHE_DIR/registry-python-$(printf '%s' "$req" | md5sum | cut -c1-8)"
    if [[ -x $venv/bin/python && -f $venv/.complete ]] && grep -qxF "$req" "$venv/.complete"; then
        echo "$venv/bin/python"
        return
    fi
    command -v python3 >/dev/null 2>&1 || apt_install python3 python3-venv
    mkdir -p "$CACHE_DIR"
    rm -rf "$venv"
    if ! python3 -m venv "$venv" >&2; then
        # Debian's python3 has no venv (ensurepip) without python3-venv.
        rm -rf "$venv"
        apt_install python3-venv
        python3 -m venv "$venv" >&2 || die "python3 -m venv failed after installing python3-venv"
    fi
    log "installing $req into $venv (once)"
    # shellcheck disable=SC2086 # $req is a list of requirements
    "$venv/bin/pip" install -q --disable-pip-version-check $req >&2 ||
        die "pip could not install $req"
    echo "$req" >"$venv/.complete"
    log "python ready in $((SECONDS - t0)) s"
    echo "$venv/bin/python"
}

# ------------------------------------------------------------------- main

usage() { sed -n '2,/^set -euo/p' "$SELF" | sed -e '$d' -e 's/^# \{0,1\}//'; }

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in
    start)
        ensure_dirs
        take_lock
        cmd_start
        ;;
    stop)
        [[ -d $REG_DIR ]] || exit 0
        take_lock
        stop_registry
        ;;
    status)
        [[ -d $REG_DIR ]] || { echo "registry: stopped"; exit 3; }
        cmd_status
        ;;
    url)
        local port
        port=$(saved_port registry) || die "the registry was never started in $RUN_DIR"
        base_url "$port"
        ;;
    env)
        echo "$REG_ENV"
        [[ -f $REG_ENV ]]
        ;;
    selftest)
        ensure_dirs
        take_lock
        cmd_selftest
        ;;
    clean)
        [[ -d $REG_DIR ]] || exit 0
        take_lock
        stop_registry
        rm -rf "$REG_DIR"
        rm -f "$PORTS_DIR/registry" "$PORTS_DIR/registry-management"
        log "removed $REG_DIR"
        ;;
    python) cmd_python ;;
    -h | --help | help) usage ;;
    *)
        usage >&2
        exit 2
        ;;
    esac
}

main "$@"
