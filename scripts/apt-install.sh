# shellcheck shell=bash
# scripts/apt-install.sh: sourced by the scripts that install what they miss (services.sh,
# pg-binaries.sh). Defines apt_install PACKAGE...; the caller defines log and die.
# Installs with Debian's apt-get as root, running `apt-get update` once per script.

APT_UPDATED=0
apt_install() {
    [[ $EUID -eq 0 ]] || die "missing $*; install it (as root: apt-get install $*)"
    command -v apt-get >/dev/null 2>&1 || die "missing $* and no apt-get to install it"
    if ((APT_UPDATED == 0)); then
        log "apt-get update"
        apt-get update -qq >&2
        APT_UPDATED=1
    fi
    log "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" </dev/null >&2
}
