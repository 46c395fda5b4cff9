# PostgreSQL for shared Optuna study storage (compose profile `distributed`), built
# from Debian's postgresql package so it needs no registry beyond Debian's mirror.
# Honours POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB like the official image.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

RUN set -eu; \
    apt-get update -qq; \
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null; \
    rm -rf /var/lib/apt/lists/*

ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data

COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]

# Last, so the layers above stay cached; .ci prunes older untagged builds by it.
LABEL fusion-tuner.image=postgres
