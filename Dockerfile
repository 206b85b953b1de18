# syntax=docker/dockerfile:1
#
# outboxd and outbox-relay in one image:
#   docker build -t REGISTRY/outboxd:0.1.0 .
#   docker run --rm REGISTRY/outboxd:0.1.0 --help
#   docker run --rm --entrypoint /usr/local/bin/outbox-relay REGISTRY/outboxd:0.1.0 --help
# The Helm chart (helm/outboxd) runs this image for the server, the migration Job
# (`outboxd migrate`) and the relay.
#
# Needs BuildKit (the default builder of current Docker) for the cache mounts.
# No protoc: build.rs compiles proto/ with protox, a pure-Rust compiler.

ARG RUST_VERSION=1.95

# ---- build: both binaries (packages outboxd and outbox-relay), release mode, exactly the locked dependencies ----
# Debian bookworm, so the binaries link against the same glibc as the runtime image.
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY migrations ./migrations
COPY src ./src
COPY runtime ./runtime
COPY relay ./relay
# The benchmark is a workspace member with its own dependencies; only its
# manifest and a stub are needed for cargo to load the workspace (nothing of
# it is built: `--bin outboxd --bin outbox-relay` select two other members).
COPY bench/Cargo.toml ./bench/Cargo.toml
RUN mkdir -p bench/src && echo 'fn main() {}' > bench/src/main.rs
# The registry and target caches survive between builds; the binaries are copied
# out of the cached target directory within the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p outboxd -p outbox-relay --bin outboxd --bin outbox-relay \
    && install -D -m 0755 target/release/outboxd /out/outboxd \
    && install -D -m 0755 target/release/outbox-relay /out/outbox-relay

# ---- runtime: glibc, libgcc, CA certificates and tzdata; no shell, no package manager ----
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
LABEL org.opencontainers.image.title="outboxd" \
      org.opencontainers.image.description="Outbox-as-a-service for PostgreSQL: gRPC leases on outbox rows, and the outbox-relay worker" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/outboxd /out/outbox-relay /usr/local/bin/
# distroless's "nonroot" user; the chart's securityContext runs as the same ids.
USER 65532:65532
# gRPC (OUTBOXD_LISTEN) and metrics (OUTBOXD_METRICS_LISTEN).
EXPOSE 50051 9090
ENTRYPOINT ["/usr/local/bin/outboxd"]
