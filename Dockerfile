# syntax=docker/dockerfile:1
#
# outboxd, outbox-relay and outboxctl in one image:
#   docker build -t REGISTRY/outboxd:0.1.0 .
#   docker run --rm REGISTRY/outboxd:0.1.0 --help
#   docker run --rm --entrypoint /usr/local/bin/outbox-relay REGISTRY/outboxd:0.1.0 --help
# The Helm chart (helm/outboxd) runs this image for the server, the migration Job
# (`outboxd migrate`), the relay and the `helm test` pod (`outboxctl health`).
#
# Needs BuildKit (the default builder of current Docker) for the cache mounts.
# No protoc: build.rs compiles proto/ with protox, a pure-Rust compiler.
#
# Two build arguments choose what goes in, without changing what the runtime
# stage does, so that CI can build and run this very file where nothing can be
# pulled (scripts/check-image):
#   BINARIES=from-build  (default) compile in the rust:bookworm stage below;
#   BINARIES=from-host   take the release binaries already built on the host
#                        (cargo build --release, glibc of Debian 12) from BIN_DIR,
#                        a path inside the build context (default target/release).
#   RUNTIME_BASE         the image the binaries are copied onto: distroless's
#                        cc-debian12 (glibc, libgcc, CA certificates, tzdata, the
#                        nonroot user; no shell) by default, or a local image with
#                        the same contents.
# Builders skip the stages the target does not need (BuildKit, and buildah's
# --skip-unused-stages, on by default), so BINARIES=from-host pulls no Rust image.
# VERSION, REVISION and SOURCE fill the OCI labels: pass the release,
# `git rev-parse HEAD` and the repository's URL.

ARG RUST_VERSION=1.95
ARG RUNTIME_BASE=gcr.io/distroless/cc-debian12:nonroot
ARG BINARIES=from-build

# ---- build: the three binaries, release mode, exactly the locked dependencies ----
# Debian bookworm, so the binaries link against the same glibc as the runtime image.
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY migrations ./migrations
COPY src ./src
COPY runtime ./runtime
COPY relay ./relay
COPY ctl ./ctl
# The benchmark is a workspace member with its own dependencies; only its
# manifest and a stub are needed for cargo to load the workspace (nothing of
# it is built: `-p` selects three other members).
COPY bench/Cargo.toml ./bench/Cargo.toml
RUN mkdir -p bench/src && echo 'fn main() {}' > bench/src/main.rs
# The registry and target caches survive between builds; the binaries are copied
# out of the cached target directory within the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p outboxd -p outbox-relay -p outboxctl --bins \
    && install -D -m 0755 -t /out target/release/outboxd target/release/outbox-relay target/release/outboxctl

# ---- where the binaries come from: one of these two is `binaries` below ----
FROM scratch AS from-build
COPY --from=build /out/ /out/

FROM scratch AS from-host
ARG BIN_DIR=target/release
COPY ${BIN_DIR}/outboxd ${BIN_DIR}/outbox-relay ${BIN_DIR}/outboxctl /out/

# `:-from-build` repeats the default on purpose: buildah (1.28, so podman build)
# decides which stages to skip from the --build-arg values alone, ignoring the
# ARG's default, and would take a bare ${BINARIES} for an image named
# "from-build". Docker reads both forms alike.
FROM ${BINARIES:-from-build} AS binaries

# ---- runtime: glibc, libgcc, CA certificates and tzdata; no shell, no package manager ----
FROM ${RUNTIME_BASE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=
LABEL org.opencontainers.image.title="outboxd" \
      org.opencontainers.image.description="Outbox-as-a-service for PostgreSQL: gRPC leases on outbox rows, the outbox-relay worker and outboxctl" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=binaries --chmod=0755 /out/outboxd /out/outbox-relay /out/outboxctl /usr/local/bin/
# distroless's "nonroot" user; the chart's securityContext runs as the same ids.
USER 65532:65532
# gRPC (OUTBOXD_LISTEN), metrics (OUTBOXD_METRICS_LISTEN) and the status page
# (OUTBOXD_ADMIN_HTTP_LISTEN, the chart's default port; off unless set).
EXPOSE 50051 9090 8080
ENTRYPOINT ["/usr/local/bin/outboxd"]
