# shellcheck shell=bash
# scripts/run-dir.sh: the run dir that scripts/services.sh and scripts/registry.sh
# share (sourced by both): its marker, its lock, its saved loopback ports (both
# keep them in the same $PORTS_DIR, so they never pick the same one) and the
# log tails they print on a failure, and how they stop their processes. The sourcing script defines RUN_DIR,
# MARKER, PORTS_DIR, log() and die().

# Prints the last lines of each existing file given, to stderr.
show_tail() {
    local f
    for f in "$@"; do
        if [[ -s $f ]]; then
            printf -- '----- last lines of %s -----\n' "$f" >&2
            tail -n 40 "$f" >&2 || true
            printf -- '----- end of %s -----\n' "$f" >&2
        fi
    done
}

# Creates the run dir with its marker (`services.sh clean` deletes only a run
# dir that carries it), and the ports dir.
make_run_dir() {
    if [[ ! -d $RUN_DIR ]]; then
        mkdir -p "$RUN_DIR"
        : >"$MARKER"
    fi
    [[ -f $MARKER ]] || [[ -z $(ls -A "$RUN_DIR") ]] && : >"$MARKER"
    mkdir -p "$PORTS_DIR"
}

# Serialises the commands that change the state under DIR ($1). fd 9 is closed
# for every long-lived child (postgres, java) so that the lock dies with the
# script that took it.
lock_dir() {
    exec 9>"$1/.lock"
    if command -v flock >/dev/null 2>&1; then
        flock -w 300 9 || die "could not lock $1/.lock within 300 s"
    fi
}

port_in_use() {
    local port=$1
    if command -v ss >/dev/null 2>&1; then
        [[ -n $(ss -Htln "sport = :$port" 2>/dev/null) ]]
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
    fi
}

# Prints the port saved under NAME, picking and saving a free one first if
# there is none. Ports come from 15000-31999: below Linux's ephemeral range
# (32768+), so an outgoing connection cannot grab the port of a service that
# is stopped for a while; and none that another saved name holds.
port_for() {
    local name=$1 file="$PORTS_DIR/$1" port other taken i
    if [[ -s $file ]]; then
        cat "$file"
        return
    fi
    for ((i = 0; i < 500; i++)); do
        port=$((15000 + (RANDOM * 32768 + RANDOM) % 17000))
        taken=0
        for other in "$PORTS_DIR"/*; do
            [[ -s $other ]] && [[ $(cat "$other") == "$port" ]] && taken=1
        done
        ((taken)) && continue
        port_in_use "$port" && continue
        echo "$port" >"$file.tmp.$$"
        mv -f "$file.tmp.$$" "$file"
        echo "$port"
        return
    done
    die "found no free port for $name"
}

# True while PID exists and is not a zombie.
alive() {
    local state
    [[ -r /proc/$1/stat ]] || return 1
    state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [[ -n $state && $state != Z && $state != X ]]
}

# Stops process PID ($1, named $2 in messages): SIGTERM, up to $3 seconds for it
# to exit, then SIGKILL. Returns 1 when it had to be killed (files it writes at
# exit may be half written).
stop_process() {
    local pid=$1 name=$2 timeout=$3 i
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < timeout * 10; i++)); do
        alive "$pid" || return 0
        sleep 0.1
    done
    alive "$pid" || return 0
    log "$name still running after ${timeout}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        alive "$pid" || break
        sleep 0.1
    done
    return 1
}
