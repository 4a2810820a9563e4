#!/usr/bin/env bash
# scripts/build-deps.sh: installs what building outbox-relay needs beyond Rust, when missing
# (Debian/Ubuntu, as root): a C/C++ toolchain, make and cmake for librdkafka (built with its
# CMake build, which also compiles libzstd and libcurl in), OpenSSL headers for TLS to PostgreSQL
# and Kafka, zlib, pkg-config. Does nothing when everything is there.
set -euo pipefail

missing=()
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
[[ -f /usr/include/openssl/ssl.h ]] || missing+=(libssl-dev)
[[ -f /usr/include/zlib.h ]] || missing+=(zlib1g-dev)
((${#missing[@]} == 0)) && exit 0

echo "[build-deps] installing ${missing[*]}" >&2
if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
    echo "[build-deps] missing ${missing[*]}: install them with your package manager" >&2
    exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
