#!/usr/bin/env bash
# Provision PostgreSQL for the multi-worker tests (tests/workers): Debian's postgresql,
# one cluster listening on loopback, and a role + database for the tests.
#
# Idempotent: a machine that already has all of it pays a couple of psql calls.
# Exports nothing: the tests read TUNER_TEST_PG_DSN when set, else they use
#     postgresql://tuner:tuner@127.0.0.1:5432/tuner_test
# which is what this script creates (the cluster's port is printed when it differs).
# Runs as root (CI, developer machines); the server itself runs as the postgres user.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib/apt.sh
source "$here/lib/apt.sh"

PG_USER="${TUNER_TEST_PG_USER:-tuner}"
PG_PASSWORD="${TUNER_TEST_PG_PASSWORD:-tuner}"
PG_DB="${TUNER_TEST_PG_DB:-tuner_test}"
PG_CLUSTER="main"

apt_install postgresql

version="$(ls /usr/lib/postgresql | sort -V | tail -n 1)"
if [[ -z "$version" ]]; then
    echo "error: postgresql installed but no server under /usr/lib/postgresql" >&2
    exit 1
fi

# A cluster is created by the package's post-install; create it if someone dropped it.
if ! pg_lsclusters -h | awk '{print $1, $2}' | grep -qx "$version $PG_CLUSTER"; then
    echo "postgres: creating cluster $version/$PG_CLUSTER" >&2
    pg_createcluster "$version" "$PG_CLUSTER" >&2
fi
port="$(pg_lsclusters -h | awk -v v="$version" -v c="$PG_CLUSTER" '$1 == v && $2 == c {print $3}')"
status="$(pg_lsclusters -h | awk -v v="$version" -v c="$PG_CLUSTER" '$1 == v && $2 == c {print $4}')"

if [[ "$status" != online* ]]; then
    echo "postgres: starting cluster $version/$PG_CLUSTER on 127.0.0.1:$port" >&2
    # No init system on CI machines: pg_ctlcluster starts the server as the postgres
    # user, detached, and it outlives this script.
    pg_ctlcluster "$version" "$PG_CLUSTER" start >&2
fi

for _ in $(seq 1 60); do
    pg_isready -q -h 127.0.0.1 -p "$port" && break
    sleep 0.5
done
if ! pg_isready -q -h 127.0.0.1 -p "$port"; then
    echo "error: PostgreSQL did not accept connections on 127.0.0.1:$port within 30 s; see /var/log/postgresql/" >&2
    exit 1
fi

psql_admin() {
    runuser -u postgres -- psql -X -q -v ON_ERROR_STOP=1 -p "$port" "$@"
}

psql_admin -d postgres -v user="$PG_USER" -v password="$PG_PASSWORD" <<'SQL'
SELECT format('CREATE ROLE %I LOGIN PASSWORD %L', :'user', :'password')
WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :'user') \gexec
SELECT format('ALTER ROLE %I LOGIN PASSWORD %L', :'user', :'password') \gexec
SQL
psql_admin -d postgres -v user="$PG_USER" -v db="$PG_DB" <<'SQL'
SELECT format('CREATE DATABASE %I OWNER %I', :'db', :'user')
WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = :'db') \gexec
SQL

dsn="postgresql://$PG_USER:$PG_PASSWORD@127.0.0.1:$port/$PG_DB"
if [[ "$port" != "5432" || "$PG_USER$PG_PASSWORD$PG_DB" != "tunertunertuner_test" ]]; then
    echo "postgres: ready; set TUNER_TEST_PG_DSN=$dsn for the tests" >&2
else
    echo "postgres: ready at $dsn" >&2
fi
