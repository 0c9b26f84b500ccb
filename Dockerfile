# syntax=docker/dockerfile:1
#
# Breakwater's one image: breakwater-api (serve, migrate, token), breakwater-worker,
# breakwater-seed and loadlab. Build: `docker build -t breakwater .` (docker-compose.yml does it).
# SQL is checked at compile time against the committed `.sqlx/` data (SQLX_OFFLINE), so the build
# needs no database.

ARG RUST_VERSION=1.95
ARG DEBIAN=bookworm

FROM rust:${RUST_VERSION}-slim-${DEBIAN} AS build
WORKDIR /src
ENV SQLX_OFFLINE=true \
    CARGO_TERM_COLOR=never \
    CARGO_INCREMENTAL=0
COPY . .
# Every binary of the workspace but the dev chores (loadlab comes along when its crate exists).
# The cache mounts keep the registry and the build between image builds.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --workspace --exclude xtask --bins \
 && mkdir -p /out \
 && for bin in breakwater-api breakwater-worker breakwater-seed loadlab; do \
      if [ -f "target/release/$bin" ]; then cp "target/release/$bin" /out/; fi; \
    done \
 && test -x /out/breakwater-api && test -x /out/breakwater-worker && test -x /out/breakwater-seed

FROM debian:${DEBIAN}-slim AS runtime
# ca-certificates: TLS to managed PostgreSQL and Redis. Nothing else: the API's health check (in
# docker-compose.yml and the ECS task definition, not here, since the worker and the one-shot
# services share this image) uses bash's /dev/tcp, not curl.
# checkov:skip=CKV_DOCKER_2: one image runs the API, the worker and one-shot jobs; each deployment (compose, ECS) sets the API's health check
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 breakwater \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin breakwater \
 && mkdir -p /var/lib/breakwater \
 && chown breakwater:breakwater /var/lib/breakwater
COPY --from=build /out/ /usr/local/bin/
USER 10001:10001
ENV BIND_ADDR=0.0.0.0:8080 \
    LOG_FORMAT=json
EXPOSE 8080
# No STOPSIGNAL: the API and the worker both stop gracefully on SIGTERM, what `docker stop` and
# ECS send (ECS ignores STOPSIGNAL anyway), as on SIGINT.
CMD ["breakwater-api", "serve"]
