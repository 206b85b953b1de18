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
# Build arguments choose what goes in, without changing what the stages do, so
# that CI can build and run this very file where nothing can be pulled
# (scripts/check-image):
#   RUST_IMAGE           the image the build stage compiles in: the pinned
#                        rust:1.95-bookworm below by default, or a local image
#                        laid out the same way (RUSTUP_HOME=/usr/local/rustup,
#                        CARGO_HOME=/usr/local/cargo, Debian 12).
#   BINARIES=from-build  (default) compile in that build stage;
#   BINARIES=from-host   take the release binaries already built on the host
#                        (cargo build --release, glibc of Debian 12) from BIN_DIR,
#                        a path inside the build context (default target/release).
#   RUNTIME_BASE         the image the binaries are copied onto: the pinned
#                        distroless cc-debian12:nonroot below by default (glibc,
#                        libgcc, CA certificates, tzdata, the nonroot user; no
#                        shell), or a local image with the same contents.
# Builders skip the stages the target does not need (BuildKit, and buildah's
# --skip-unused-stages, on by default), so a base that is replaced, and the
# Rust image under BINARIES=from-host, is never pulled.
# VERSION, REVISION and SOURCE fill the OCI labels: pass the release,
# `git rev-parse HEAD` and the repository's URL.

ARG RUST_IMAGE=upstream-rust
ARG RUNTIME_BASE=upstream-runtime
ARG BINARIES=from-build

# ---- the two public base images, pinned ----
# The tag is for people; a builder given `tag@digest` fetches the digest (the
# multi-platform index) and does not look at the tag, so every build gets the
# same bytes until the pin is moved on purpose. To move one, read the tag's
# current index digest and replace the sha256 after it:
#   docker buildx imagetools inspect rust:1.95-bookworm      (the "Digest:" line)
#   crane digest gcr.io/distroless/cc-debian12:nonroot
#   skopeo inspect --format '{{.Digest}}' docker://docker.io/library/rust:1.95-bookworm
# Renovate (its dockerfile manager) and Dependabot (the docker ecosystem), once
# enabled for the repository, read these literal FROM lines and open a pull
# request when the tag moves to a new digest (the images are rebuilt for Debian
# security updates).
# They are FROM lines, not ARG defaults, because Dependabot does not read image
# references out of ARGs (dependabot/dependabot-core#2057). A new Rust release is
# a new tag: change it together with scripts/check-image's stand-in check (it
# requires a host toolchain of the tag's version) and the README.
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS upstream-rust
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f AS upstream-runtime

# ---- build: the three binaries, release mode, exactly the locked dependencies ----
# Debian bookworm, so the binaries link against the same glibc as the runtime
# image. `:-` repeats each default on purpose: buildah (1.28, so podman build)
# decides which stages to skip from the --build-arg values alone, ignoring an
# ARG's default, and would take a bare ${RUST_IMAGE} for an image named
# "upstream-rust". Docker reads both forms alike.
FROM ${RUST_IMAGE:-upstream-rust} AS build
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

# `:-from-build` repeats the default for buildah, as above.
FROM ${BINARIES:-from-build} AS binaries

# ---- runtime: glibc, libgcc, CA certificates and tzdata; no shell, no package manager ----
FROM ${RUNTIME_BASE:-upstream-runtime} AS runtime
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
