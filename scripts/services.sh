#!/usr/bin/env bash
# scripts/services.sh: the PostgreSQL and Kafka that the tests and the demo
# run against, as plain local processes (no Docker), listening on 127.0.0.1
# only.
#
# Usage: scripts/services.sh COMMAND
#
#   start              start PostgreSQL and Kafka, wait until both accept
#                      connections, write the env file; prints its path
#   stop               stop everything this state dir runs (idempotent)
#   pg-start|pg-stop   the main PostgreSQL cluster alone (wal_level=logical)
#   kafka-start|kafka-stop
#                      the Kafka broker alone; kafka-stop then kafka-start
#                      brings back the SAME broker (port, data, cluster id)
#   pg-replica-start|pg-replica-stop
#                      a second, independent cluster with wal_level=replica;
#                      pg-replica-start prints its URL, which also goes into
#                      the env file as OUTBOX_TEST_PG_REPLICA_URL
#   pg-ha-start        a primary (pg-ha) and its physical standby (pg-ha-standby),
#                      apart from the main cluster, for failover tests; see
#                      "Primary and standby" below. Prints the env file path.
#   pg-ha-crash        crash the primary: pg_ctl stop -m immediate
#   pg-ha-promote      promote the standby; returns once it accepts writes
#   pg-ha-stop         stop both (pg-ha-start starts them again)
#   pg-ha-reset        stop and delete both; the next pg-ha-start makes a
#                      fresh pair (needed after a promotion)
#   install            install what start needs (PostgreSQL, Java, Maven, the
#                      Kafka jars), start nothing
#   env                print the env file path (exit 1 if not written yet)
#   status             say what is running
#   clean              stop everything and delete the state dir
#   psql [ARGS]        psql as superuser on the main cluster
#   kafka-tool CLASS [ARGS]
#                      run a Kafka tool from the broker's jars, e.g.
#                      org.apache.kafka.tools.TopicCommand --bootstrap-server
#                      "$OUTBOX_TEST_KAFKA_BROKERS" --list
#   kafka-acl-start|kafka-acl-stop
#                      a second broker, locked down as production runs it:
#                      SASL_PLAINTEXT with PLAIN only, StandardAuthorizer
#                      (nothing allowed without an ACL), no topic auto-create;
#                      users admin (super user) and relay (no ACLs). Not
#                      started by `start`. kafka-acl-start prints the env file
#                      path; see "Broker with ACLs" below.
#   kafka-acl-tool CLASS [ARGS]
#                      a Kafka tool as that broker's admin: --bootstrap-server
#                      and --command-config are added unless given, e.g.
#                      org.apache.kafka.tools.AclCommand --add --allow-principal
#                      User:relay --operation Write --topic orders
#
# State lives in ${OUTBOX_RUN_DIR:-/tmp/outbox-relay-run}:
#   env                     shell `export` lines (source it)
#   ports/{pg,pg-replica,pg-ha,pg-ha-standby,kafka,kafka-controller,...}
#                           the ports picked on first start; reused afterwards
#   pg/data, pg/postgres.log                 main cluster; socket in pg/
#   pg-replica/data, pg-replica/postgres.log second cluster
#   pg-ha/..., pg-ha-standby/...             primary and standby
#   kafka/data, kafka/logs/server.log, kafka/kafka.out, kafka/kafka.pid,
#   kafka/cluster.id, kafka/server.properties
#   kafka-acl/...           the ACL broker (same layout), and its admin client
#                           settings kafka-acl/admin.properties
# The Kafka classpath (resolved once with Maven from scripts/kafka/pom.xml) and
# a JVM class archive of the broker (faster start-up) are cached in
# ${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay/.
#
# Tuning (environment):
#   OUTBOX_KAFKA_JVM_OPTS   extra broker JVM options, appended. The broker runs
#                           with C1 only (-XX:TieredStopAtLevel=1: starts fast,
#                           less JIT CPU on 2 cores); for throughput benchmarks
#                           pass "-XX:TieredStopAtLevel=4" to get C2 back.
#   OUTBOX_KAFKA_CDS=0      no class archive
#   OUTBOX_KAFKA_STOP_TIMEOUT (20), OUTBOX_KAFKA_START_TIMEOUT (120),
#   OUTBOX_PG_START_TIMEOUT (60)   seconds
#   OUTBOX_PG_VERSION       PostgreSQL major: 14, 15, 16, 17 or 18 (13: only
#                           to test that the relay refuses it). Unset: the
#                           state dir's clusters' version, else Debian's 15.
#                           Majors Debian does not ship here come from Maven
#                           Central, cached (scripts/pg-binaries.sh). A state
#                           dir holds one major: `clean` before switching.
#   OUTBOX_PG_BIN           PostgreSQL server bin dir (overrides the above)
#
# Env file, PostgreSQL: OUTBOX_TEST_PG_URL/_HOST/_PORT/_DATA (main cluster),
# OUTBOX_TEST_PG_VERSION (its major), OUTBOX_TEST_PG_SERVER_BIN (postgres,
# initdb, pg_ctl), OUTBOX_TEST_PG_BIN (client tools: psql, pg_recvlogical; for
# majors from Maven, Debian's 15 client, which speaks to 14-18),
# OUTBOX_TEST_PG_CA/_WRONG_CA, OUTBOX_TEST_PG_REPLICA_URL (while it runs), and
# after pg-ha-start: OUTBOX_TEST_PG_HA_PRIMARY_URL, OUTBOX_TEST_PG_HA_STANDBY_URL,
# OUTBOX_TEST_PG_HA_URL (both hosts: postgres://postgres@h:p1,h:p2/postgres),
# OUTBOX_TEST_PG_HA_SLOT (the standby's physical slot), *_PRIMARY_DATA/_STANDBY_DATA.
#
# Env file, Kafka: OUTBOX_TEST_KAFKA_BROKERS (PLAINTEXT), the same broker's
# OUTBOX_TEST_KAFKA_SASL_BROKERS / _SASL_SSL_BROKERS with OUTBOX_TEST_KAFKA_SASL_USER
# / _PASSWORD, OUTBOX_TEST_KAFKA_OAUTH_BROKERS (SASL_PLAINTEXT, OAUTHBEARER only, any
# unsecured JWT, alg none, with sub and exp accepted; a session ends when its token
# expires); the ACL broker's in the next paragraph.
#
# Broker with ACLs (kafka-acl-start): OUTBOX_TEST_KAFKA_ACL_BROKERS (host:port,
# SASL_PLAINTEXT, mechanism PLAIN), OUTBOX_TEST_KAFKA_ACL_ADMIN_USER/_PASSWORD
# (a super user), OUTBOX_TEST_KAFKA_ACL_RELAY_USER/_PASSWORD (no ACLs until
# granted), OUTBOX_TEST_KAFKA_ACL_ADMIN_CONFIG (the admin's client properties,
# for --command-config). A test process started before kafka-acl-start does not
# have them in its environment: it reads them from the env file whose path
# kafka-acl-start prints.
#
# Primary and standby (pg-ha-start): pg-ha is set up like the main cluster
# (wal_level=logical, TLS, the test roles); pg-ha-standby is a copy of its
# cleanly stopped data dir (no pg_basebackup; slots not copied) with
# standby.signal, primary_conninfo (with dbname=postgres, which slot sync
# needs), primary_slot_name = the physical slot, hot_standby_feedback = on.
# Replication is synchronous (synchronous_standby_names), so a commit pg-ha
# acknowledged survives pg-ha-crash. On 17+: sync_replication_slots = on on
# the standby, synchronized_standby_slots = the physical slot on the primary;
# a logical slot created with failover = true is then synced to the standby
# (by the worker, or with OUTBOX_PG_HA_SLOT_SYNC=manual only by `SELECT
# pg_sync_replication_slots()` on the standby, for deterministic tests). While the
# standby is down, commits on pg-ha wait for it (synchronous replication) and
# so do logical walsenders on 17+.
#
# Messages go to stderr; stdout carries only the documented output, so
# `source "$(scripts/services.sh start)"` works.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SELF="$SCRIPT_DIR/$(basename "${BASH_SOURCE[0]}")"
KAFKA_POM="$SCRIPT_DIR/kafka/pom.xml"

RUN_DIR=${OUTBOX_RUN_DIR:-/tmp/outbox-relay-run}
case $RUN_DIR in /*) ;; *) RUN_DIR="$PWD/$RUN_DIR" ;; esac
RUN_DIR=${RUN_DIR%/}
ENV_FILE="$RUN_DIR/env"
PORTS_DIR="$RUN_DIR/ports"
MARKER="$RUN_DIR/.outbox-relay-run"
KAFKA_DIR="$RUN_DIR/kafka"
CACHE_DIR="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/outbox-relay"

PG_USER_OS=postgres            # OS user that owns the clusters when we are root
KAFKA_STOP_TIMEOUT=${OUTBOX_KAFKA_STOP_TIMEOUT:-20}
KAFKA_START_TIMEOUT=${OUTBOX_KAFKA_START_TIMEOUT:-120}
PG_START_TIMEOUT=${OUTBOX_PG_START_TIMEOUT:-60}

log() { printf '[services] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# ---------------------------------------------------------------- state dir

ensure_run_dir() {
    make_run_dir
    chmod 755 "$RUN_DIR" 2>/dev/null || true
}

# The run dir's marker, lock and ports, and show_tail: scripts/run-dir.sh.
# shellcheck source=scripts/run-dir.sh
source "$SCRIPT_DIR/run-dir.sh"
take_lock() { lock_dir "$RUN_DIR"; }

# ---------------------------------------------------------------- env file

write_env() {
    local tmp="$ENV_FILE.tmp.$$" pg_port kafka_port replica_port ha1='' ha2
    pg_port=$(port_for pg)
    kafka_port=$(port_for kafka)
    {
        echo "# Written by scripts/services.sh; source it: . $ENV_FILE"
        printf 'export OUTBOX_RUN_DIR=%q\n' "$RUN_DIR"
        printf 'export OUTBOX_TEST_SERVICES=%q\n' "$SELF"
        printf 'export OUTBOX_TEST_PG_URL=%q\n' "postgres://postgres@127.0.0.1:$pg_port/postgres"
        printf 'export OUTBOX_TEST_PG_HOST=%q\n' "127.0.0.1"
        printf 'export OUTBOX_TEST_PG_PORT=%q\n' "$pg_port"
        # Client tools (psql, pg_recvlogical); the server's own bin dir for Debian's 15.
        printf 'export OUTBOX_TEST_PG_BIN=%q\n' "${PG_CLIENT_BIN:-$(find_pg_client_bin || true)}"
        # Server binaries (postgres, initdb, pg_ctl) and their major version.
        printf 'export OUTBOX_TEST_PG_SERVER_BIN=%q\n' "${PG_BIN:-$(find_pg_bin || true)}"
        printf 'export OUTBOX_TEST_PG_VERSION=%q\n' "$(pg_existing_major)"
        printf 'export OUTBOX_TEST_PG_DATA=%q\n' "$RUN_DIR/pg/data"
        printf 'export OUTBOX_TEST_KAFKA_BROKERS=%q\n' "127.0.0.1:$kafka_port"
        # The same broker behind SASL (PLAIN, SCRAM-SHA-256/512), and SASL over TLS.
        printf 'export OUTBOX_TEST_KAFKA_SASL_BROKERS=%q\n' "127.0.0.1:$(port_for kafka-sasl)"
        printf 'export OUTBOX_TEST_KAFKA_SASL_SSL_BROKERS=%q\n' "127.0.0.1:$(port_for kafka-sasl-ssl)"
        printf 'export OUTBOX_TEST_KAFKA_SASL_USER=%q\n' "$KAFKA_SASL_USER"
        printf 'export OUTBOX_TEST_KAFKA_SASL_PASSWORD=%q\n' "$KAFKA_SASL_PASSWORD"
        # The same broker's OAUTHBEARER listener (SASL_PLAINTEXT, unsecured JWTs).
        printf 'export OUTBOX_TEST_KAFKA_OAUTH_BROKERS=%q\n' "127.0.0.1:$(port_for kafka-oauth)"
        # TLS on the main cluster: the CA that signed its certificate, and one that did not.
        printf 'export OUTBOX_TEST_PG_CA=%q\n' "$RUN_DIR/pg/tls/ca.crt"
        printf 'export OUTBOX_TEST_PG_WRONG_CA=%q\n' "$RUN_DIR/pg/tls/wrong-ca.crt"
        if [[ -f $KAFKA_ACL_DIR/admin.properties ]]; then
            # The ACL broker (after kafka-acl-start): SASL_PLAINTEXT, PLAIN.
            printf 'export OUTBOX_TEST_KAFKA_ACL_BROKERS=%q\n' "127.0.0.1:$(port_for kafka-acl)"
            printf 'export OUTBOX_TEST_KAFKA_ACL_ADMIN_USER=%q\n' "$KAFKA_ACL_ADMIN_USER"
            printf 'export OUTBOX_TEST_KAFKA_ACL_ADMIN_PASSWORD=%q\n' "$KAFKA_ACL_ADMIN_PASSWORD"
            printf 'export OUTBOX_TEST_KAFKA_ACL_RELAY_USER=%q\n' "$KAFKA_ACL_RELAY_USER"
            printf 'export OUTBOX_TEST_KAFKA_ACL_RELAY_PASSWORD=%q\n' "$KAFKA_ACL_RELAY_PASSWORD"
            printf 'export OUTBOX_TEST_KAFKA_ACL_ADMIN_CONFIG=%q\n' "$KAFKA_ACL_DIR/admin.properties"
        fi
        if pg_running pg-replica; then
            replica_port=$(port_for pg-replica)
            printf 'export OUTBOX_TEST_PG_REPLICA_URL=%q\n' \
                "postgres://postgres@127.0.0.1:$replica_port/postgres"
        fi
        if [[ -f $RUN_DIR/pg-ha/data/PG_VERSION ]]; then
            ha1=127.0.0.1:$(port_for pg-ha)
            printf 'export OUTBOX_TEST_PG_HA_PRIMARY_URL=%q\n' "postgres://postgres@$ha1/postgres"
            printf 'export OUTBOX_TEST_PG_HA_PRIMARY_DATA=%q\n' "$RUN_DIR/pg-ha/data"
        fi
        if [[ -f $RUN_DIR/pg-ha-standby/data/PG_VERSION ]]; then
            ha2=127.0.0.1:$(port_for pg-ha-standby)
            printf 'export OUTBOX_TEST_PG_HA_STANDBY_URL=%q\n' "postgres://postgres@$ha2/postgres"
            printf 'export OUTBOX_TEST_PG_HA_STANDBY_DATA=%q\n' "$RUN_DIR/pg-ha-standby/data"
            # Both hosts, in libpq's multi-host form.
            printf 'export OUTBOX_TEST_PG_HA_URL=%q\n' "postgres://postgres@$ha1,$ha2/postgres"
            printf 'export OUTBOX_TEST_PG_HA_SLOT=%q\n' "$HA_SLOT"
        fi
    } >"$tmp"
    mv -f "$tmp" "$ENV_FILE"
}

# -------------------------------------------------------------- PostgreSQL

# shellcheck source=scripts/apt-install.sh
source "$SCRIPT_DIR/apt-install.sh"

# Cluster names: pg (the main one), pg-replica (wal_level=replica), pg-ha and
# pg-ha-standby (a primary and its physical standby, for failover tests).
# Every cluster of a state dir runs the same major version.
PG_CLUSTERS=(pg pg-replica pg-ha pg-ha-standby)
HA_SLOT=outbox_ha_standby      # the standby's physical slot on pg-ha

# The major version of the clusters already in the state dir (empty if none).
pg_existing_major() {
    local c
    for c in "${PG_CLUSTERS[@]}"; do
        if [[ -f $RUN_DIR/$c/data/PG_VERSION ]]; then
            cat "$RUN_DIR/$c/data/PG_VERSION"
            return 0
        fi
    done
}

# The major version to run: the state dir's, else OUTBOX_PG_VERSION, else
# empty (= the default search below, Debian's 15). With "strict", a clash
# between OUTBOX_PG_VERSION and existing clusters is an error.
pg_major_wanted() {
    local existing want=${OUTBOX_PG_VERSION:-}
    existing=$(pg_existing_major)
    if [[ -n $want && -n $existing && $want != "$existing" && ${1:-} == strict ]]; then
        die "$RUN_DIR holds PostgreSQL $existing clusters but OUTBOX_PG_VERSION=$want: run '$SELF clean' first"
    fi
    if [[ -n $existing ]]; then
        echo "$existing"
    else
        echo "$want"
    fi
}

# Prints the server bin dir (postgres, initdb, pg_ctl).
find_pg_bin() {
    local d want
    if [[ -n ${OUTBOX_PG_BIN:-} ]]; then
        echo "$OUTBOX_PG_BIN"
        return 0
    fi
    want=$(pg_major_wanted)
    if [[ -n $want ]]; then
        # Debian's build when installed, else Maven Central (cached).
        bash "$SCRIPT_DIR/pg-binaries.sh" "$want"
        return
    fi
    if [[ -x /usr/lib/postgresql/15/bin/postgres ]]; then
        echo /usr/lib/postgresql/15/bin
        return 0
    fi
    # Another major version (>= 10 has wal_level=logical and pgoutput).
    d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    if [[ -n $d && -x $d/postgres ]]; then
        echo "$d"
        return 0
    fi
    if command -v pg_config >/dev/null 2>&1; then
        d=$(pg_config --bindir)
        [[ -x $d/postgres ]] && { echo "$d"; return 0; }
    fi
    return 1
}

# Prints a bin dir with the client tools (psql, pg_isready, pg_recvlogical):
# the server's own when it has them (Debian), else the newest Debian client.
find_pg_client_bin() {
    local d
    if [[ -n ${PG_BIN:-} && -x $PG_BIN/psql && -x $PG_BIN/pg_isready ]]; then
        echo "$PG_BIN"
        return 0
    fi
    d=$(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V | while read -r d; do
        [[ -x $d/psql && -x $d/pg_isready ]] && echo "$d"
    done | tail -n 1)
    [[ -n $d ]] && { echo "$d"; return 0; }
    return 1
}

ensure_pg_installed() {
    local want
    want=$(pg_major_wanted strict)
    if [[ -n $want ]]; then
        # 13 only to test that the relay refuses it.
        [[ -n ${OUTBOX_PG_BIN:-} ]] || [[ $want =~ ^(13|14|15|16|17|18)$ ]] ||
            die "OUTBOX_PG_VERSION=$want: supported are 14, 15, 16, 17 and 18 (and 13, to test the refusal)"
        PG_BIN=$(find_pg_bin) || die "no PostgreSQL $want server binaries"
        PG_CLIENT_BIN=$(find_pg_client_bin) || {
            apt_install postgresql-client
            PG_CLIENT_BIN=$(find_pg_client_bin) || die "no psql/pg_isready after apt-get install postgresql-client"
        }
        return
    fi
    if PG_BIN=$(find_pg_bin); then
        PG_CLIENT_BIN=$(find_pg_client_bin) || PG_CLIENT_BIN=$PG_BIN
        return
    fi
    apt_install postgresql
    # The Debian package may have started its own cluster on 5432; these
    # scripts own every process they need, so stop it again.
    if command -v pg_lsclusters >/dev/null 2>&1; then
        pg_lsclusters --no-header 2>/dev/null | while read -r ver name _; do
            pg_ctlcluster --mode fast "$ver" "$name" stop >/dev/null 2>&1 || true
        done
    fi
    PG_BIN=$(find_pg_bin) || die "PostgreSQL still not found after apt-get install postgresql"
    PG_CLIENT_BIN=$(find_pg_client_bin) || PG_CLIENT_BIN=$PG_BIN
}

# Runs a command as the cluster owner (postgres when we are root).
as_pg() {
    if [[ $EUID -eq 0 ]]; then
        runuser -u "$PG_USER_OS" -- "$@"
    else
        "$@"
    fi
}

pg_running() {
    local data="$RUN_DIR/$1/data" bin
    [[ -f $data/PG_VERSION && -f $data/postmaster.pid ]] || return 1
    bin=${PG_BIN:-$(find_pg_bin)} || return 1
    as_pg "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1
}

# psql as superuser on cluster $1 (database postgres); other args passed on.
pg_psql() {
    local name=$1
    shift
    "$PG_CLIENT_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$(port_for "$name")" \
        -U postgres -d postgres "$@"
}

# The major version of the cluster $1's data dir.
pg_data_major() {
    cat "$RUN_DIR/$1/data/PG_VERSION"
}

# A test CA, a server certificate it signed (for localhost and 127.0.0.1) and an
# unrelated CA, so tests can check verify-full and a wrong CA. Made once per state dir.
pg_make_certs() {
    local tls="$RUN_DIR/$1/tls" tmp
    [[ -f $tls/server.crt ]] && return 0
    command -v openssl >/dev/null 2>&1 || apt_install openssl
    # Made aside and moved into place in one step: PostgreSQL and Kafka start in
    # parallel and both need them; two half-written sets gave a key that did
    # not match its certificate.
    mkdir -p "$RUN_DIR/$1"
    tmp=$(mktemp -d "$RUN_DIR/$1/.tls.XXXXXX")
    (
        cd "$tmp"
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=outbox-relay test CA" \
            -keyout ca.key -out ca.crt 2>/dev/null
        openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=unrelated CA" \
            -keyout wrong-ca.key -out wrong-ca.crt 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
            -keyout server.key -out server.csr 2>/dev/null
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >san.ext
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
            -extfile san.ext -out server.crt 2>/dev/null
    ) || { rm -rf "$tmp"; die "cannot make the test TLS certificates"; }
    chmod 755 "$tmp"
    chmod 600 "$tmp/server.key"
    chmod 644 "$tmp/ca.crt" "$tmp/wrong-ca.crt"
    if [[ $EUID -eq 0 ]]; then
        chown -R "$PG_USER_OS:" "$tmp"
    fi
    # Fails when another start won the race: then its set is the one.
    mv -T "$tmp" "$tls" 2>/dev/null || rm -rf "$tmp"
    [[ -f $tls/server.crt ]] || die "no test TLS certificates in $tls"
}

# Writes the settings file that postgresql.conf includes (rewritten at every
# start, so that the port and settings always match this script).
pg_write_conf() {
    local name=$1 port=$2 dir="$RUN_DIR/$1" data="$RUN_DIR/$1/data"
    {
        echo "# Written by scripts/services.sh at every start; edits are lost."
        echo "listen_addresses = '127.0.0.1'"
        echo "port = $port"
        echo "unix_socket_directories = '$dir'"
        echo "max_connections = 200"
        echo "fsync = off                 # tests only"
        echo "synchronous_commit = off    # tests only"
        echo "full_page_writes = off      # tests only"
        echo "max_wal_size = 2GB"
        echo "log_destination = 'stderr'  # pg_ctl -l sends it to postgres.log"
        echo "logging_collector = off"
        echo "log_line_prefix = '%m [%p] %q%u@%d '"
        echo "log_replication_commands = on"
        case $name in
        pg | pg-ha | pg-ha-standby)
            # The same TLS certificate (for 127.0.0.1) on every logical cluster.
            echo "ssl = on"
            echo "ssl_cert_file = '$RUN_DIR/pg/tls/server.crt'"
            echo "ssl_key_file = '$RUN_DIR/pg/tls/server.key'"
            echo "wal_level = logical"
            echo "max_replication_slots = 64"
            echo "max_wal_senders = 64"
            echo "wal_sender_timeout = '10s'"
            if [[ $name == pg ]]; then
                echo "shared_buffers = 256MB"
            else
                echo "shared_buffers = 128MB"
            fi
            ;;
        *)
            # The cluster a pre-flight check must reject: no logical decoding.
            echo "wal_level = replica"
            echo "max_replication_slots = 10"
            echo "max_wal_senders = 10"
            echo "shared_buffers = 32MB"
            ;;
        esac
        pg_ha_conf "$name"
    } >"$data/outbox-relay.conf"
    # Order matters: the first line whose type, user and address match wins.
    cat >"$data/pg_hba.conf" <<'EOF'
# Written by scripts/services.sh at every start; edits are lost.
# TYPE  DATABASE  USER       ADDRESS       METHOD
local   all       all                      trust
host    all       md5user    127.0.0.1/32  md5
host    all       scramuser  127.0.0.1/32  scram-sha-256
host    all       clearuser  127.0.0.1/32  password
host    all       all        127.0.0.1/32  trust
# Physical replication (pg-ha-standby's walreceiver); "all" above does not cover it.
host    replication all      127.0.0.1/32  trust
EOF
    if [[ $EUID -eq 0 ]]; then
        chown "$PG_USER_OS:" "$data/outbox-relay.conf" "$data/pg_hba.conf"
    fi
}

pg_start_cluster() {
    local name=$1 dir="$RUN_DIR/$1" data="$RUN_DIR/$1/data" logf="$RUN_DIR/$1/postgres.log" port i
    ensure_pg_installed
    port=$(port_for "$name")
    if pg_running "$name"; then
        log "PostgreSQL ($name) already running on 127.0.0.1:$port"
        return 0
    fi
    mkdir -p "$dir"
    if [[ $EUID -eq 0 ]]; then
        id -u "$PG_USER_OS" >/dev/null 2>&1 || die "no OS user '$PG_USER_OS' to run PostgreSQL as"
        chown "$PG_USER_OS:" "$dir"
        as_pg test -w "$dir" ||
            die "user $PG_USER_OS cannot write $dir: set OUTBOX_RUN_DIR to a directory whose parents it can traverse (e.g. under /tmp)"
    fi
    if ((${#dir} + 20 > 107)); then
        die "socket path $dir/.s.PGSQL.$port is too long for a Unix socket: use a shorter OUTBOX_RUN_DIR"
    fi
    if [[ ! -f $data/PG_VERSION ]]; then
        [[ $name != pg-ha-standby ]] || die "no standby data dir: start it with '$SELF pg-ha-start'"
        log "initdb $data ($("$PG_BIN/postgres" --version))"
        rm -rf "$data"
        as_pg "$PG_BIN/initdb" -D "$data" -U postgres -A trust -E UTF8 --no-locale -N \
            >"$dir/initdb.log" 2>&1 9>&- || {
            show_tail "$dir/initdb.log"
            die "initdb failed for $name"
        }
        echo "include = 'outbox-relay.conf'" >>"$data/postgresql.conf"
    fi
    if port_in_use "$port"; then
        die "port $port (saved in $PORTS_DIR/$name) is taken by another process; stop it or run '$SELF clean'"
    fi
    if [[ $name != pg-replica ]]; then pg_make_certs pg; fi
    pg_write_conf "$name" "$port"
    log "starting PostgreSQL ($name) on 127.0.0.1:$port"
    if ! as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$logf" -w -t "$PG_START_TIMEOUT" -s start \
        </dev/null >&2 9>&-; then
        show_tail "$logf"
        die "PostgreSQL ($name) did not start; log: $logf"
    fi
    for ((i = 0; i < PG_START_TIMEOUT * 10; i++)); do
        if "$PG_CLIENT_BIN/pg_isready" -q -h 127.0.0.1 -p "$port" -d postgres -U postgres; then
            log "PostgreSQL ($name) ready on 127.0.0.1:$port"
            return 0
        fi
        sleep 0.1
    done
    show_tail "$logf"
    die "PostgreSQL ($name) does not accept connections on 127.0.0.1:$port; log: $logf"
}

# Roles the tests log in as (one per password method, one without
# REPLICATION), on cluster $1 (default pg). Idempotent: passwords are reset at
# every start.
pg_setup_roles() {
    local port
    port=$(port_for "${1:-pg}")
    "$PG_CLIENT_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d postgres \
        >/dev/null <<'SQL'
DO $$
DECLARE r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['md5user', 'scramuser', 'clearuser', 'norepl'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I LOGIN', r);
        END IF;
    END LOOP;
END
$$;
-- PostgreSQL 18 deprecates MD5 passwords (they still work) and warns at each.
SELECT current_setting('server_version_num')::int >= 180000 AS pg18 \gset
\if :pg18
SET md5_password_warnings = off;
\endif
SET password_encryption = 'md5';
ALTER ROLE md5user WITH LOGIN REPLICATION PASSWORD 'md5pass';
SET password_encryption = 'scram-sha-256';
ALTER ROLE scramuser WITH LOGIN REPLICATION PASSWORD 'scrampass';
-- pg_hba sends clearuser through the cleartext 'password' method.
ALTER ROLE clearuser WITH LOGIN REPLICATION PASSWORD 'clearpass';
ALTER ROLE norepl WITH LOGIN NOREPLICATION PASSWORD NULL;
SQL
    # Schema rights are per database: grant them in postgres, and in template1
    # so that every database a test creates (CREATE DATABASE copies
    # template1) has them as well.
    local db
    for db in postgres template1; do
        "$PG_CLIENT_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres -d "$db" \
            >/dev/null <<'SQL'
GRANT ALL ON SCHEMA public TO md5user, scramuser, clearuser, norepl;
-- Tables the superuser creates later (e.g. outbox) are usable by them too.
ALTER DEFAULT PRIVILEGES FOR ROLE postgres IN SCHEMA public
    GRANT ALL ON TABLES TO md5user, scramuser, clearuser, norepl;
SQL
    done
}

pg_stop_cluster() {
    local name=$1 data="$RUN_DIR/$1/data"
    [[ -f $data/PG_VERSION ]] || return 0
    PG_BIN=${PG_BIN:-$(find_pg_bin)} || return 0
    if ! pg_running "$name"; then
        return 0
    fi
    log "stopping PostgreSQL ($name)"
    if ! as_pg "$PG_BIN/pg_ctl" -D "$data" -m fast -w -t 30 -s stop >&2 9>&-; then
        log "fast shutdown of $name failed; immediate shutdown"
        as_pg "$PG_BIN/pg_ctl" -D "$data" -m immediate -w -t 30 -s stop >&2 9>&- || true
    fi
}

# ------------------------------------------------------- primary + standby
#
# pg-ha and pg-ha-standby: a primary and a physical standby of it, for
# failover tests, apart from the main cluster (crashing pg-ha disturbs no
# other test). The standby is a copy of the cleanly stopped primary's data
# dir (no pg_basebackup) plus standby.signal; it streams through the physical
# slot $HA_SLOT with synchronous replication, so every commit the primary
# acknowledged is on the standby when the primary is crashed.

ha_promoted_marker() { echo "$RUN_DIR/pg-ha-standby/promoted"; }

# The failover-related settings of cluster $1, appended to its outbox-relay.conf.
pg_ha_conf() {
    local name=$1 major
    [[ $name == pg-ha || $name == pg-ha-standby ]] || return 0
    major=$(pg_data_major "$name")
    if [[ $name == pg-ha ]]; then
        [[ -f $RUN_DIR/pg-ha-standby/data/PG_VERSION && ! -f $(ha_promoted_marker) ]] || return 0
        echo "# Primary of pg-ha-standby."
        echo "synchronous_commit = on"
        echo "synchronous_standby_names = '\"pg-ha-standby\"'"
        if ((major >= 17)); then
            # Logical walsenders wait until the standby has the WAL they send,
            # so a synced failover slot is never ahead of the standby.
            echo "synchronized_standby_slots = '$HA_SLOT'"
        fi
    else
        echo "# Physical standby of pg-ha."
        echo "primary_conninfo = 'host=127.0.0.1 port=$(port_for pg-ha) user=postgres dbname=postgres application_name=pg-ha-standby'"
        echo "primary_slot_name = '$HA_SLOT'"
        echo "hot_standby = on"
        echo "hot_standby_feedback = on"
        echo "wal_receiver_status_interval = '1s'"
        if ((major >= 17)); then
            # The slot sync worker, unless OUTBOX_PG_HA_SLOT_SYNC=manual: then
            # only `SELECT pg_sync_replication_slots()` on the standby syncs
            # (it fails with "cannot synchronize replication slots
            # concurrently" while the worker runs).
            if [[ ${OUTBOX_PG_HA_SLOT_SYNC:-worker} == manual ]]; then
                echo "sync_replication_slots = off"
            else
                echo "sync_replication_slots = on"
            fi
        fi
    fi
}

# Polls SQL $2 on cluster $1 until it prints 't' (deadline $3 seconds).
pg_wait_true() {
    local name=$1 sql=$2 secs=${3:-$PG_START_TIMEOUT} i
    for ((i = 0; i < secs * 10; i++)); do
        [[ $(pg_psql "$name" -At -c "$sql" 2>/dev/null) == t ]] && return 0
        sleep 0.1
    done
    return 1
}

cmd_ha_start() {
    local standby="$RUN_DIR/pg-ha-standby" f
    ensure_pg_installed
    if [[ -f $(ha_promoted_marker) ]]; then
        die "pg-ha failed over (pg-ha-standby was promoted); run '$SELF pg-ha-reset' for a fresh pair"
    fi
    port_for pg-ha >/dev/null
    port_for pg-ha-standby >/dev/null
    if [[ ! -f $standby/data/PG_VERSION ]]; then
        pg_start_cluster pg-ha
        pg_setup_roles pg-ha
        pg_psql pg-ha -c "SELECT pg_create_physical_replication_slot('$HA_SLOT', true)
            WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '$HA_SLOT')" >/dev/null
        # A clean shutdown (checkpoint written), so that a plain copy of the
        # data dir is consistent.
        log "stopping PostgreSQL (pg-ha) to copy its data dir"
        as_pg "$PG_BIN/pg_ctl" -D "$RUN_DIR/pg-ha/data" -m fast -w -t 60 -s stop >&2 9>&- ||
            die "pg-ha did not stop cleanly"
        rm -rf "$standby"
        mkdir -p "$standby"
        [[ $EUID -ne 0 ]] || chown "$PG_USER_OS:" "$standby"
        as_pg cp -a "$RUN_DIR/pg-ha/data" "$standby/data.tmp"
        # What pg_basebackup leaves out: the primary's slots (a copied logical
        # slot would clash with a synced one), its pid and options files.
        for f in postmaster.pid postmaster.opts standby.signal recovery.signal; do
            rm -f "$standby/data.tmp/$f"
        done
        find "$standby/data.tmp/pg_replslot" -mindepth 1 -delete
        [[ ! -d $standby/data.tmp/pg_stat_tmp ]] || find "$standby/data.tmp/pg_stat_tmp" -mindepth 1 -delete
        as_pg touch "$standby/data.tmp/standby.signal"
        mv "$standby/data.tmp" "$standby/data"
        log "pg-ha-standby: copy of pg-ha's data dir, streaming through slot $HA_SLOT"
    fi
    pg_start_cluster pg-ha
    pg_start_cluster pg-ha-standby
    pg_wait_true pg-ha "SELECT EXISTS (SELECT 1 FROM pg_stat_replication
            WHERE application_name = 'pg-ha-standby' AND state = 'streaming')" ||
        { show_tail "$standby/postgres.log"; die "pg-ha-standby does not stream from pg-ha"; }
    log "pg-ha (primary) on 127.0.0.1:$(port_for pg-ha), pg-ha-standby on 127.0.0.1:$(port_for pg-ha-standby)"
}

cmd_ha_stop() {
    pg_stop_cluster pg-ha || true
    pg_stop_cluster pg-ha-standby || true
}

# Crashes the primary: no shutdown checkpoint, no goodbye to clients.
cmd_ha_crash() {
    ensure_pg_installed
    pg_running pg-ha || { log "pg-ha is not running"; return 0; }
    log "crashing PostgreSQL (pg-ha): pg_ctl stop -m immediate"
    as_pg "$PG_BIN/pg_ctl" -D "$RUN_DIR/pg-ha/data" -m immediate -w -t 30 -s stop >&2 9>&-
}

# Promotes the standby and waits until it accepts writes.
cmd_ha_promote() {
    ensure_pg_installed
    pg_running pg-ha-standby || die "pg-ha-standby is not running"
    log "promoting pg-ha-standby"
    : >"$(ha_promoted_marker)"
    as_pg "$PG_BIN/pg_ctl" -D "$RUN_DIR/pg-ha-standby/data" -w -t "$PG_START_TIMEOUT" -s promote >&2 9>&- ||
        die "pg_ctl promote failed (log: $RUN_DIR/pg-ha-standby/postgres.log)"
    pg_wait_true pg-ha-standby "SELECT NOT pg_is_in_recovery()" ||
        die "pg-ha-standby still in recovery after promote"
    log "pg-ha-standby is a primary on 127.0.0.1:$(port_for pg-ha-standby)"
}

cmd_ha_reset() {
    cmd_ha_stop
    rm -rf "$RUN_DIR/pg-ha" "$RUN_DIR/pg-ha-standby"
}

# ------------------------------------------------------------------- Kafka

ensure_java_maven() {
    local missing=()
    command -v java >/dev/null 2>&1 || missing+=(default-jre-headless)
    command -v mvn >/dev/null 2>&1 || missing+=(maven)
    ((${#missing[@]} == 0)) || apt_install "${missing[@]}"
}

# Prints the classpath of the broker and tools, resolving it with Maven only
# when the cached one is missing, stale or points at deleted jars.
kafka_classpath() {
    local key cp_file jar ok=1 tmp
    command -v java >/dev/null 2>&1 || ensure_java_maven
    key=$(sha256sum "$KAFKA_POM" | cut -c1-16)
    cp_file="$CACHE_DIR/kafka-classpath-$key.txt"
    if [[ -s $cp_file ]]; then
        # read's status is 1 at a last line without a newline (the file has one line, no newline).
        IFS=: read -r -a jars <"$cp_file" || true
        for jar in "${jars[@]}"; do
            [[ -f $jar ]] || { ok=0; break; }
        done
        if ((ok)); then
            cat "$cp_file"
            return
        fi
    fi
    ensure_java_maven
    mkdir -p "$CACHE_DIR"
    tmp="$cp_file.tmp.$$"
    log "resolving Kafka jars with Maven (once; cached in $cp_file)"
    if ! mvn -B -q -f "$KAFKA_POM" dependency:build-classpath -Dmdep.outputFile="$tmp" \
        </dev/null >"$CACHE_DIR/maven.log" 2>&1 || [[ ! -s $tmp ]]; then
        show_tail "$CACHE_DIR/maven.log"
        rm -f "$tmp"
        die "Maven could not resolve the Kafka jars (log: $CACHE_DIR/maven.log)"
    fi
    mv -f "$tmp" "$cp_file"
    cat "$cp_file"
}

# The pid of the broker of state dir $1 (default: the main broker's) while it runs.
kafka_pid() {
    local dir=${1:-$KAFKA_DIR} pid
    [[ -s $dir/kafka.pid ]] || return 1
    pid=$(cat "$dir/kafka.pid")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    alive "$pid" || return 1
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'kafka\.Kafka' || return 1
    echo "$pid"
}

# Test credentials for the broker's SASL listeners (PLAIN and SCRAM alike).
KAFKA_SASL_USER=relay
KAFKA_SASL_PASSWORD=relay-secret

kafka_write_config() {
    local port=$1 cport=$2 sport=$3 tport=$4 oport=$5 jaas_plain jaas_scram l m
    mkdir -p "$KAFKA_DIR/data" "$KAFKA_DIR/logs"
    # The SASL_SSL listener serves the test CA's certificate (the one PostgreSQL uses).
    pg_make_certs pg
    cat "$RUN_DIR/pg/tls/server.key" "$RUN_DIR/pg/tls/server.crt" >"$KAFKA_DIR/server.pem"
    jaas_plain="org.apache.kafka.common.security.plain.PlainLoginModule required user_$KAFKA_SASL_USER=\"$KAFKA_SASL_PASSWORD\";"
    jaas_scram="org.apache.kafka.common.security.scram.ScramLoginModule required;"
    {
        kafka_single_node_properties "$KAFKA_DIR" "$cport"
        cat <<EOF
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport,SASL_PLAINTEXT://127.0.0.1:$sport,SASL_SSL://127.0.0.1:$tport,OAUTH://127.0.0.1:$oport
advertised.listeners=PLAINTEXT://127.0.0.1:$port,SASL_PLAINTEXT://127.0.0.1:$sport,SASL_SSL://127.0.0.1:$tport,OAUTH://127.0.0.1:$oport
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,OAUTH:SASL_PLAINTEXT
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
# OAUTH: SASL_PLAINTEXT with OAUTHBEARER only, validated by Kafka's built-in
# unsecured-JWT validator (alg none; the test's token endpoint issues them). A
# positive connections.max.reauth.ms makes the broker end a session when its
# token expires unless the client logged in again with a fresh one.
listener.name.oauth.sasl.enabled.mechanisms=OAUTHBEARER
listener.name.oauth.oauthbearer.sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="broker";
listener.name.oauth.oauthbearer.connections.max.reauth.ms=600000
ssl.keystore.type=PEM
ssl.keystore.location=$KAFKA_DIR/server.pem
inter.broker.listener.name=PLAINTEXT
auto.create.topics.enable=true
EOF
        for l in sasl_plaintext sasl_ssl; do
            echo "listener.name.$l.plain.sasl.jaas.config=$jaas_plain"
            for m in scram-sha-256 scram-sha-512; do
                echo "listener.name.$l.$m.sasl.jaas.config=$jaas_scram"
            done
        done
    } >"$KAFKA_DIR/server.properties"
    kafka_write_log4j "$KAFKA_DIR"
}

# Prints the settings every broker here shares: single-node KRaft (broker and
# controller in one JVM, controller on 127.0.0.1:$2) with its data in state
# dir $1, replication factor 1 everywhere. For tests only.
kafka_single_node_properties() {
    local dir=$1 cport=$2
    cat <<EOF
# Written by scripts/services.sh at every start; edits are lost.
# Single-node KRaft (broker and controller in one JVM), for tests only.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
controller.listener.names=CONTROLLER
log.dirs=$dir/data

num.partitions=1
default.replication.factor=1
min.insync.replicas=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
delete.topic.enable=true
group.initial.rebalance.delay.ms=0
# The default; a test relies on a 5 MB record being rejected.
message.max.bytes=1048588
# No time-based retention: tests write records stamped years ago (a timestamp_column of
# 2021), and the broker's retention check (every 5 min) deleted them, by their timestamp,
# between a test's two reads of a topic.
log.retention.ms=-1
num.network.threads=2
num.io.threads=4
# Offset and time indexes of 128 KB, not 10 MB: a new partition's first index entry faults
# its sparse, mmap'd index in, and the kernel reads ahead, zeroing the holes, up to the
# disk's read_ahead_kb: 128 KB on most disks, 8 MB on this VM's. So 50 new topics stalled
# the broker for 3-5 s (perf: 64 % of its request threads in __pi_memset from
# zero_user_segments), 1,000 for longer. A 128 KB index costs what the default one costs
# with production read-ahead, and still indexes 64 MB of log per segment.
log.index.size.max.bytes=131072
EOF
}

# The log4j2 configurations in state dir $1: the broker's, and the
# command-line tools'.
kafka_write_log4j() {
    local dir=$1
    cat >"$dir/log4j2.properties" <<'EOF'
# Broker log: one file, appended across restarts.
status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.statechange.name = state.change.logger
logger.statechange.level = WARN
EOF
    cat >"$dir/tools-log4j2.properties" <<'EOF'
# Command-line tools: warnings and errors only, on stderr.
status = warn
appender.err.type = Console
appender.err.name = STDERR
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.err.ref = STDERR
EOF
}

# A Kafka Uuid in its base64url form (22 chars); never starting with '-',
# which command lines would take for an option.
new_cluster_id() {
    local id
    while :; do
        id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
        [[ ${#id} -eq 22 && $id != -* && $id != AAAAAAAAAAAAAAAAAAAAA* ]] && break
    done
    echo "$id"
}

# Formats the storage of state dir $1 with the jars $2, once; further
# arguments go to StorageTool format (e.g. --add-scram).
kafka_format() {
    local dir=$1 cp=$2 cid
    shift 2
    [[ -f $dir/data/meta.properties ]] && return 0
    if [[ ! -s $dir/cluster.id ]]; then
        new_cluster_id >"$dir/cluster.id"
    fi
    cid=$(cat "$dir/cluster.id")
    log "formatting Kafka storage in $dir (cluster id $cid)"
    if ! java -Xmx256m -XX:TieredStopAtLevel=1 -Xshare:auto \
        -Dlog4j2.configurationFile="file:$dir/tools-log4j2.properties" \
        -cp "$cp" kafka.tools.StorageTool format \
        --cluster-id "$cid" --config "$dir/server.properties" --ignore-formatted "$@" \
        </dev/null >"$dir/format.log" 2>&1 9>&-; then
        show_tail "$dir/format.log"
        die "kafka storage format failed (log: $dir/format.log)"
    fi
}

# Class-data sharing: a JVM class archive of the broker, dumped when a broker
# started without one exits cleanly, then kept in the cache and mapped by
# every later start (about a second less start-up). OUTBOX_KAFKA_CDS=0 turns
# it off. The JVM checks the archive against the JDK and the jars and ignores
# it when they differ. Appends to the caller's java_args and sets its cds_used;
# the broker of state dir $1 dumps an archive when there is none if $2 is
# "dump", and otherwise goes without.
kafka_cds_args() {
    local dir=$1 mode=$2 key jsa
    cds_used=
    [[ ${OUTBOX_KAFKA_CDS:-1} == 0 ]] && return 0
    key=$( {
        cat "$KAFKA_POM"
        stat -c %Y "$CACHE_DIR"/kafka-classpath-*.txt 2>/dev/null
        java -version 2>&1
    } | sha256sum | cut -c1-16)
    jsa="$CACHE_DIR/kafka-cds-$key.jsa"
    rm -f "$dir/kafka.jsa" "$dir/cds.target"
    if [[ -s $jsa ]]; then
        java_args+=(-XX:SharedArchiveFile="$jsa")
        cds_used=$jsa
    elif [[ $mode == dump ]]; then
        # Written by the JVM at exit; kafka_stop_dir moves it into the cache.
        java_args+=(-XX:ArchiveClassesAtExit="$dir/kafka.jsa")
        echo "$jsa" >"$dir/cds.target"
    fi
}

kafka_start() {
    local port cport sport tport oport cp pid i
    port=$(port_for kafka)
    cport=$(port_for kafka-controller)
    sport=$(port_for kafka-sasl)
    tport=$(port_for kafka-sasl-ssl)
    oport=$(port_for kafka-oauth)
    if pid=$(kafka_pid); then
        log "Kafka already running (pid $pid) on 127.0.0.1:$port"
        return 0
    fi
    cp=$(kafka_classpath)
    kafka_write_config "$port" "$cport" "$sport" "$tport" "$oport"
    kafka_format "$KAFKA_DIR" "$cp" \
        --add-scram "SCRAM-SHA-256=[name=$KAFKA_SASL_USER,password=$KAFKA_SASL_PASSWORD]" \
        --add-scram "SCRAM-SHA-512=[name=$KAFKA_SASL_USER,password=$KAFKA_SASL_PASSWORD]"
    for i in "$port" "$cport" "$sport" "$tport" "$oport"; do
        if port_in_use "$i"; then
            die "port $i (saved in $PORTS_DIR) is taken by another process; stop it or run '$SELF clean'"
        fi
    done
    kafka_launch "$KAFKA_DIR" "$cp" Kafka "$port" "$cport" 256m 512m dump
}

# Starts the broker of state dir $1 (configured and formatted) with the jars
# $2, named $3 in messages, and waits until it serves clients on port $4
# (controller on $5). $6 and $7: its -Xms and -Xmx; $8: dump or map, see
# kafka_cds_args.
kafka_launch() {
    local dir=$1 cp=$2 name=$3 port=$4 cport=$5 xms=$6 xmx=$7 cds_mode=$8
    local pid offset out_offset i logf="$1/logs/server.log" outf="$1/kafka.out" cds_used=
    local -a java_args
    offset=0
    [[ -f $logf ]] && offset=$(stat -c %s "$logf")
    out_offset=0
    [[ -f $outf ]] && out_offset=$(stat -c %s "$outf")
    java_args=(-Xms"$xms" -Xmx"$xmx" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:+ExitOnOutOfMemoryError
        -XX:TieredStopAtLevel=1 -Xshare:auto '-Xlog:cds*=error' -Djava.awt.headless=true
        -Djava.net.preferIPv4Stack=true)
    kafka_cds_args "$dir" "$cds_mode"
    # shellcheck disable=SC2206 # word splitting wanted: several options
    [[ -n ${OUTBOX_KAFKA_JVM_OPTS:-} ]] && java_args+=($OUTBOX_KAFKA_JVM_OPTS)
    java_args+=(-Dlog4j2.configurationFile="file:$dir/log4j2.properties"
        -Dkafka.logs.dir="$dir/logs" -cp "$cp" kafka.Kafka "$dir/server.properties")
    log "starting $name on 127.0.0.1:$port (controller 127.0.0.1:$cport)"
    rm -f "$dir/kafka.pid"
    # setsid: the broker must not get the terminal's Ctrl-C nor hold the
    # caller's stdout/stderr (a test that runs this script would wait for EOF).
    # The inner bash writes its own pid, then becomes java (exec keeps the pid).
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid bash -c 'echo $$ >"$0"; exec java "$@"' "$dir/kafka.pid" "${java_args[@]}" \
        </dev/null >>"$outf" 2>&1 9>&- &
    for ((i = 0; i < 200; i++)); do
        [[ -s $dir/kafka.pid ]] && break
        sleep 0.05
    done
    pid=$(cat "$dir/kafka.pid" 2>/dev/null || true)
    for ((i = 0; i < KAFKA_START_TIMEOUT * 10; i++)); do
        if [[ -z $pid ]] || ! alive "$pid"; then
            show_tail "$outf" "$logf"
            # Should the cached class archive be at fault, the next start goes without it.
            if [[ -n $cds_used ]] &&
                tail -c +"$((out_offset + 1))" "$outf" | grep -Eqi 'shared archive|cds'; then
                rm -f "$cds_used"
            fi
            die "$name exited during start-up; logs: $logf $outf"
        fi
        if [[ -f $logf ]] &&
            tail -c +"$((offset + 1))" "$logf" | grep -Eq 'Kafka Server started|started \(kafka\.server\.KafkaRaftServer\)' &&
            port_in_use "$port"; then
            log "$name ready on 127.0.0.1:$port (pid $pid)"
            return 0
        fi
        sleep 0.1
    done
    show_tail "$outf" "$logf"
    kafka_stop_dir "$dir" "$name"
    die "$name did not start within ${KAFKA_START_TIMEOUT}s; logs: $logf $outf"
}

kafka_stop() {
    kafka_stop_dir "$KAFKA_DIR" Kafka
}

# Stops the broker of state dir $1 (named $2 in messages), if it runs.
kafka_stop_dir() {
    local dir=$1 name=$2 pid
    if ! pid=$(kafka_pid "$dir"); then
        rm -f "$dir/kafka.pid"
        return 0
    fi
    stop_process "$pid" "$name" "$KAFKA_STOP_TIMEOUT" || rm -f "$dir/kafka.jsa" # maybe half written
    rm -f "$dir/kafka.pid"
    if [[ -s $dir/kafka.jsa && -s $dir/cds.target ]]; then
        local target
        target=$(cat "$dir/cds.target")
        mkdir -p "$CACHE_DIR"
        mv -f "$dir/kafka.jsa" "$target.tmp.$$" && mv -f "$target.tmp.$$" "$target" &&
            log "cached the broker's class archive in $target"
    fi
    rm -f "$dir/kafka.jsa" "$dir/cds.target"
}

kafka_tool() {
    (($# >= 1)) || die "usage: $0 kafka-tool CLASS [ARGS...]"
    mkdir -p "$KAFKA_DIR"
    [[ -f $KAFKA_DIR/tools-log4j2.properties ]] || kafka_write_log4j "$KAFKA_DIR"
    kafka_run_tool "$KAFKA_DIR" "$@"
}

# Runs (execs) the Kafka tool class $2 with args, logging as state dir $1's
# tools-log4j2.properties says.
kafka_run_tool() {
    local dir=$1 cp
    shift
    cp=$(kafka_classpath)
    exec 9>&-
    exec java -Xmx512m -XX:TieredStopAtLevel=1 -Xshare:auto \
        -Dlog4j2.configurationFile="file:$dir/tools-log4j2.properties" \
        -cp "$cp" "$@"
}

# ------------------------------------------------ Kafka with authorization
#
# kafka-acl: a second single-node KRaft broker from the same jars, locked down
# as production clusters are: clients connect only over SASL_PLAINTEXT with
# PLAIN, the StandardAuthorizer refuses what no ACL allows
# (allow.everyone.if.no.acl.found=false), and topics are never auto-created.
# Users: admin (a super user) and relay (may do nothing until granted). The
# broker talks to itself over the same listener as admin; its controller
# listener is PLAINTEXT, loopback-only and not advertised, and its principal
# (ANONYMOUS) is a super user so that the broker may register.
# Started only on demand (a JVM costs memory): `kafka-acl-start`.
KAFKA_ACL_DIR="$RUN_DIR/kafka-acl"
KAFKA_ACL_ADMIN_USER='admin'
KAFKA_ACL_ADMIN_PASSWORD=admin-secret
KAFKA_ACL_RELAY_USER=relay
KAFKA_ACL_RELAY_PASSWORD=relay-acl-secret

kafka_acl_write_config() {
    local port=$1 cport=$2 jaas
    mkdir -p "$KAFKA_ACL_DIR/data" "$KAFKA_ACL_DIR/logs"
    # The broker's own login (username/password) and the users it accepts (user_NAME).
    jaas="org.apache.kafka.common.security.plain.PlainLoginModule required"
    jaas+=" username=\"$KAFKA_ACL_ADMIN_USER\" password=\"$KAFKA_ACL_ADMIN_PASSWORD\""
    jaas+=" user_$KAFKA_ACL_ADMIN_USER=\"$KAFKA_ACL_ADMIN_PASSWORD\""
    jaas+=" user_$KAFKA_ACL_RELAY_USER=\"$KAFKA_ACL_RELAY_PASSWORD\";"
    {
        kafka_single_node_properties "$KAFKA_ACL_DIR" "$cport"
        cat <<EOF
listeners=SASL_PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=SASL_PLAINTEXT://127.0.0.1:$port
listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=SASL_PLAINTEXT
sasl.enabled.mechanisms=PLAIN
sasl.mechanism.inter.broker.protocol=PLAIN
listener.name.sasl_plaintext.plain.sasl.jaas.config=$jaas
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:$KAFKA_ACL_ADMIN_USER;User:ANONYMOUS
allow.everyone.if.no.acl.found=false
auto.create.topics.enable=false
EOF
    } >"$KAFKA_ACL_DIR/server.properties"
    cat >"$KAFKA_ACL_DIR/admin.properties" <<EOF
# Written by scripts/services.sh: client settings of the ACL broker's admin
# (--command-config of the Kafka tools; kafka-acl-tool passes it).
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="$KAFKA_ACL_ADMIN_USER" password="$KAFKA_ACL_ADMIN_PASSWORD";
EOF
    kafka_write_log4j "$KAFKA_ACL_DIR"
}

kafka_acl_start() {
    local port cport cp pid i
    port=$(port_for kafka-acl)
    cport=$(port_for kafka-acl-controller)
    if pid=$(kafka_pid "$KAFKA_ACL_DIR"); then
        log "Kafka (ACL) already running (pid $pid) on 127.0.0.1:$port"
        return 0
    fi
    cp=$(kafka_classpath)
    kafka_acl_write_config "$port" "$cport"
    kafka_format "$KAFKA_ACL_DIR" "$cp"
    for i in "$port" "$cport"; do
        if port_in_use "$i"; then
            die "port $i (saved in $PORTS_DIR) is taken by another process; stop it or run '$SELF clean'"
        fi
    done
    kafka_launch "$KAFKA_ACL_DIR" "$cp" "Kafka (ACL)" "$port" "$cport" 128m 384m map
}

kafka_acl_stop() {
    kafka_stop_dir "$KAFKA_ACL_DIR" "Kafka (ACL)"
}

# A Kafka tool as the ACL broker's admin: adds --bootstrap-server and
# --command-config unless given (or a --producer.config/--consumer.config).
kafka_acl_tool() {
    local class a bootstrap=1 config=1
    local -a args
    (($# >= 1)) || die "usage: $0 kafka-acl-tool CLASS [ARGS...]"
    [[ -f $KAFKA_ACL_DIR/admin.properties ]] ||
        die "the ACL broker was never started here: run '$SELF kafka-acl-start' first"
    class=$1
    shift
    for a in "$@"; do
        case $a in
        --bootstrap-server | --bootstrap-server=* | --bootstrap-controller | --bootstrap-controller=*) bootstrap=0 ;;
        --command-config | --command-config=* | --producer.config | --producer.config=* | \
            --consumer.config | --consumer.config=*) config=0 ;;
        esac
    done
    args=("$@")
    ((bootstrap)) && args+=(--bootstrap-server "127.0.0.1:$(port_for kafka-acl)")
    ((config)) && args+=(--command-config "$KAFKA_ACL_DIR/admin.properties")
    kafka_run_tool "$KAFKA_ACL_DIR" "$class" "${args[@]}"
}

# ------------------------------------------------------------------- main

cmd_start() {
    local kafka_job pg_job rc=0
    # Installs (apt) happen one at a time, before anything runs in parallel.
    ensure_pg_installed
    if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
        ensure_java_maven
    fi
    # Ports are picked here, before anything runs in parallel.
    port_for pg >/dev/null
    port_for kafka >/dev/null
    port_for kafka-controller >/dev/null
    # Both need the test certificates: made here, before they run in parallel.
    pg_make_certs pg
    # Kafka (JVM start, maybe Maven) and PostgreSQL start in parallel, as
    # background jobs (where set -e still applies), then both are waited for.
    kafka_start &
    kafka_job=$!
    {
        pg_start_cluster pg
        pg_setup_roles
    } &
    pg_job=$!
    wait "$pg_job" || rc=$?
    wait "$kafka_job" || rc=$?
    if ((rc != 0)); then
        log "start failed; stopping what did start"
        cmd_stop
        exit "$rc"
    fi
    write_env
    echo "$ENV_FILE"
}

cmd_stop() {
    kafka_stop || true
    kafka_acl_stop || true
    # The schema registry (scripts/registry.sh) keeps its state in this run dir too.
    if [[ -f $RUN_DIR/registry/registry.pid ]]; then
        bash "$SCRIPT_DIR/registry.sh" stop || true
    fi
    cmd_ha_stop
    pg_stop_cluster pg-replica || true
    pg_stop_cluster pg || true
    # Drops OUTBOX_TEST_PG_REPLICA_URL again.
    if [[ -f $ENV_FILE ]]; then
        write_env 2>/dev/null || true
    fi
}

cmd_status() {
    local rc=0 pid
    if pg_running pg; then echo "postgres:   running on 127.0.0.1:$(cat "$PORTS_DIR/pg")"; else echo "postgres:   stopped"; rc=3; fi
    if pg_running pg-replica; then echo "pg-replica: running on 127.0.0.1:$(cat "$PORTS_DIR/pg-replica")"; else echo "pg-replica: stopped"; fi
    local c
    for c in pg-ha pg-ha-standby; do
        [[ -f $RUN_DIR/$c/data/PG_VERSION ]] || continue
        if pg_running "$c"; then echo "$c: running on 127.0.0.1:$(cat "$PORTS_DIR/$c")"; else echo "$c: stopped"; fi
    done
    [[ -f $(ha_promoted_marker) ]] && echo "pg-ha-standby: promoted (pg-ha-reset for a fresh pair)"
    [[ -n $(pg_existing_major) ]] && echo "PostgreSQL: $(pg_existing_major) ($(find_pg_bin 2>/dev/null || true))"
    if pid=$(kafka_pid); then echo "kafka:      running on 127.0.0.1:$(cat "$PORTS_DIR/kafka") (pid $pid)"; else echo "kafka:      stopped"; rc=3; fi
    if [[ -d $KAFKA_ACL_DIR ]]; then
        if pid=$(kafka_pid "$KAFKA_ACL_DIR"); then echo "kafka-acl:  running on 127.0.0.1:$(cat "$PORTS_DIR/kafka-acl") (pid $pid)"; else echo "kafka-acl:  stopped"; fi
    fi
    [[ -f $ENV_FILE ]] && echo "env file:   $ENV_FILE"
    return "$rc"
}

main() {
    local cmd=${1:-}
    shift || true
    case $cmd in
    start | pg-start | kafka-start | kafka-acl-start | pg-replica-start | pg-ha-start | pg-ha-crash | pg-ha-promote)
        ensure_run_dir
        take_lock
        case $cmd in
        start) cmd_start ;;
        pg-start)
            pg_start_cluster pg
            pg_setup_roles
            write_env
            ;;
        kafka-start)
            kafka_start
            write_env
            ;;
        kafka-acl-start)
            kafka_acl_start
            write_env
            echo "$ENV_FILE"
            ;;
        pg-replica-start)
            pg_start_cluster pg-replica
            write_env
            echo "postgres://postgres@127.0.0.1:$(port_for pg-replica)/postgres"
            ;;
        pg-ha-start)
            cmd_ha_start
            write_env
            echo "$ENV_FILE"
            ;;
        pg-ha-crash) cmd_ha_crash ;;
        pg-ha-promote) cmd_ha_promote ;;
        esac
        ;;
    stop | pg-stop | kafka-stop | kafka-acl-stop | pg-replica-stop | pg-ha-stop | pg-ha-reset)
        [[ -d $RUN_DIR ]] || exit 0
        take_lock
        case $cmd in
        stop) cmd_stop ;;
        pg-stop) pg_stop_cluster pg || true ;;
        kafka-stop) kafka_stop || true ;;
        kafka-acl-stop) kafka_acl_stop || true ;;
        pg-replica-stop)
            pg_stop_cluster pg-replica || true
            if [[ -f $ENV_FILE ]]; then write_env 2>/dev/null || true; fi
            ;;
        pg-ha-stop) cmd_ha_stop ;;
        pg-ha-reset)
            cmd_ha_reset
            if [[ -f $ENV_FILE ]]; then write_env 2>/dev/null || true; fi
            ;;
        esac
        ;;
    clean)
        if [[ -d $RUN_DIR ]]; then
            take_lock
            cmd_stop
            if [[ -f $MARKER ]]; then
                rm -rf "$RUN_DIR"
                log "removed $RUN_DIR"
            else
                die "$RUN_DIR was not created by this script; not deleting it"
            fi
        fi
        ;;
    install)
        # What `start` needs, installed, and nothing started: for a caller that then starts
        # several state dirs at once (.ci/run), so that apt-get and Maven run one at a time.
        ensure_pg_installed
        kafka_classpath >/dev/null
        ;;
    env)
        echo "$ENV_FILE"
        [[ -f $ENV_FILE ]]
        ;;
    status) cmd_status ;;
    psql)
        ensure_pg_installed
        [[ -s $PORTS_DIR/pg ]] || die "PostgreSQL was never started in $RUN_DIR"
        exec "$PG_CLIENT_BIN/psql" -X -h 127.0.0.1 -p "$(cat "$PORTS_DIR/pg")" -U postgres -d postgres "$@"
        ;;
    kafka-tool)
        ensure_run_dir
        kafka_tool "$@"
        ;;
    kafka-acl-tool)
        ensure_run_dir
        kafka_acl_tool "$@"
        ;;
    -h | --help | help)
        sed -n '2,/^set -euo/p' "$SELF" | sed -e '$d' -e 's/^# \{0,1\}//'
        ;;
    *)
        sed -n '2,/^set -euo/p' "$SELF" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
        exit 2
        ;;
    esac
}

main "$@"
