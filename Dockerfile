# syntax=docker/dockerfile:1
# outbox-relay container image: `docker build -t outbox-relay .`
# (docker-compose.yml builds it too). Needs BuildKit (the default builder).

# ---- build ----------------------------------------------------------------
FROM rust:1-bookworm AS builder
# librdkafka is compiled from source by rdkafka-sys with CMake, libzstd and libcurl with cc
# (all three linked statically: the run stage needs nothing for them); OpenSSL backs TLS to
# PostgreSQL and Kafka (and SASL SCRAM), zlib gzip.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config zlib1g-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The caches keep the crate downloads and compiled dependencies between builds;
# the binary is copied out because the target dir is not part of the image.
# The image ships it without its debug info (most of the release binary's 150 MB), but
# with its symbol table, so a panic's backtrace still names the functions. The line tables go
# to outbox-relay.debug, which the binary names (.gnu_debuglink): get it with
#   docker build --target debug-symbols --output type=local,dest=. .
# and gdb or addr2line finds file and line for a core dump or an address in a backtrace.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin outbox-relay \
 && install -D -m 0755 target/release/outbox-relay /out/outbox-relay \
 && objcopy --only-keep-debug /out/outbox-relay /out/outbox-relay.debug \
 && objcopy --strip-debug --add-gnu-debuglink=/out/outbox-relay.debug /out/outbox-relay

# ---- debug symbols (not part of the image; see above) -----------------------
FROM scratch AS debug-symbols
COPY --from=builder /out/outbox-relay.debug /

# ---- run ------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin relay
COPY --from=builder /out/outbox-relay /usr/local/bin/outbox-relay
COPY config/outbox-relay.toml /etc/outbox-relay/outbox-relay.toml
USER relay
# /metrics, /healthz, /readyz (bound to all interfaces inside the container).
ENV OUTBOX_RELAY__HTTP__LISTEN=0.0.0.0:9187
EXPOSE 9187
# Settings come from the config file, overridden by OUTBOX_RELAY__<SECTION>__<KEY>
# variables (e.g. OUTBOX_RELAY__POSTGRES__URL, OUTBOX_RELAY__KAFKA__BROKERS).
ENTRYPOINT ["outbox-relay"]
CMD ["run", "--config", "/etc/outbox-relay/outbox-relay.toml"]
