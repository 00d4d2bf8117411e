# permit-gateway container image.
#
#   docker build -t permit-gateway:0.2.0 --build-arg BUILD_COMMIT="$(git rev-parse --short HEAD)" .
#   docker run --rm -p 8080:8080 -p 9090:9090 \
#     -e PERMIT_GATEWAY_UPSTREAM__API_KEY=... \
#     -v permit-gateway-data:/var/lib/permit-gateway \
#     permit-gateway:0.2.0
#
# The binary is built from the same context CI builds, with the `dist`
# profile (release + fat LTO, Cargo.toml; what the benchmarks measure),
# without the default `demo` feature (no simulator in a production binary):
#   cargo build --profile dist --locked --no-default-features -p permit-gateway --bin permit-gateway
# .ci/run lints this file with hadolint and builds the binary from the
# context .dockerignore leaves (ops/context.py), with `--release`: the same
# sources and files, without the long LTO link. ops/image.sh builds and runs
# the image for real, also on a machine without registry access (local
# stand-ins for the two base images, an offline cargo registry): see
# docs/operations.md, "Container image".
#
# Runtime layout (docs/operations.md):
#   /usr/local/bin/permit-gateway        the binary (ENTRYPOINT)
#   /etc/permit-gateway/gateway.toml     config (mount your own over it)
#   /var/lib/permit-gateway              VOLUME: the file ledger (quota.path)
#   /tmp                                 VOLUME: scratch (nothing writes
#                                        elsewhere: --read-only works)
# Ports: 8080 team traffic (server.listen), 9090 admin: /metrics, /healthz,
# /readyz, /admin/* (server.admin_listen).
#
# No HEALTHCHECK: the distroless runtime has no shell or curl to run one.
# Orchestrators probe GET /healthz (liveness) and GET /readyz (readiness) on
# port 9090 instead; the Helm chart does.

# Any stable Rust >= the workspace rust-version (1.85); "1" is the newest 1.x.
ARG RUST_VERSION=1

############################ builder ############################
FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src

# 1. The whole workspace as .dockerignore leaves it (no target/, docs or
#    charts): cargo reads every member and target of the workspace even to
#    build one package, so copying a chosen few broke this stage whenever one
#    was added. No dependency-only layer: it needs a stub per member and
#    target, the same trap. .ci/run builds from exactly this context.
COPY . .
# The commit `--version` and `gateway_build_info` name: the context has no
# .git, so it comes from the command line (build.rs; `unknown` without it).
ARG BUILD_COMMIT=unknown
RUN cargo build --profile dist --locked --no-default-features -p permit-gateway --bin permit-gateway \
 && ./target/dist/permit-gateway --version

# 2. What the runtime stage copies: the binary, a container config, and the
#    data directory owned by the runtime user (distroless has no shell).
RUN mkdir -p /out/etc /out/data/ledger \
 && cp target/dist/permit-gateway /out/permit-gateway \
 && printf '%s\n' \
      '# permit-gateway in a container: mount your own file here, or override' \
      '# any key with PERMIT_GATEWAY_<SECTION>__<KEY>. Every key with its' \
      '# default: permit-gateway check-config, docs/operations.md.' \
      '[server]' \
      'listen = "0.0.0.0:8080"' \
      'admin_listen = "0.0.0.0:9090"' \
      '' \
      '[quota]' \
      'store = "file"' \
      'path = "/var/lib/permit-gateway/ledger"' \
      > /out/etc/gateway.toml

############################ runtime ############################
FROM gcr.io/distroless/cc-debian12:nonroot

LABEL org.opencontainers.image.title="permit-gateway" \
      org.opencontainers.image.description="A caching, credit-aware reverse proxy in front of one paid, metered REST API" \
      org.opencontainers.image.licenses="MIT"

COPY --from=builder /out/permit-gateway /usr/local/bin/permit-gateway
COPY --from=builder /out/etc/gateway.toml /etc/permit-gateway/gateway.toml
COPY --from=builder --chown=65532:65532 /out/data /var/lib/permit-gateway

# distroless "nonroot" is uid/gid 65532; numeric so runAsNonRoot can check it.
USER 65532:65532
WORKDIR /var/lib/permit-gateway
VOLUME ["/var/lib/permit-gateway", "/tmp"]
EXPOSE 8080 9090
# mimalloc is built without asking for transparent huge pages (`no_thp`);
# on hosts whose THP setting is "always" this turns them off for the
# process too: 2 MiB pages kept freed memory resident after an attack.
ENV MIMALLOC_ALLOW_THP=0

ENTRYPOINT ["/usr/local/bin/permit-gateway"]
CMD ["serve", "--config", "/etc/permit-gateway/gateway.toml"]
