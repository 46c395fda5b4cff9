#!/bin/sh
# First start: initdb with password auth for TCP clients and create the user and
# database from the environment. Then exec postgres as PID 1 (fast, clean stop).
set -eu
: "${POSTGRES_USER:=tuner}" "${POSTGRES_PASSWORD:=tuner}" "${POSTGRES_DB:=optuna}"
mkdir -p "$PGDATA" /run/postgresql
chown -R postgres:postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    chown postgres "$pwfile"
    su postgres -s /bin/sh -c "initdb -D '$PGDATA' -U '$POSTGRES_USER' --pwfile='$pwfile' --auth-local=trust --auth-host=scram-sha-256" >/dev/null
    rm -f "$pwfile"
    echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PGDATA/pg_hba.conf"
    su postgres -s /bin/sh -c "pg_ctl -D '$PGDATA' -o '-c listen_addresses=' -w start" >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        su postgres -s /bin/sh -c "createdb -U '$POSTGRES_USER' '$POSTGRES_DB'"
    fi
    su postgres -s /bin/sh -c "pg_ctl -D '$PGDATA' -m fast -w stop" >/dev/null
fi
# setpriv execs (su would stay PID 1 as a parent that must relay signals).
exec setpriv --reuid=postgres --regid=postgres --init-groups postgres -D "$PGDATA" -c listen_addresses='*'
