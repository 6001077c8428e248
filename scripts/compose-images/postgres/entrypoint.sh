#!/bin/sh
# As the official image: on an empty $PGDATA, initdb with POSTGRES_USER (default postgres) as the
# superuser and POSTGRES_PASSWORD, create POSTGRES_DB (default: the user's name), accept password
# logins from other containers; then run the server as user postgres.
set -e
as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
if [ "$1" = postgres ]; then
  user=${POSTGRES_USER:-postgres}; db=${POSTGRES_DB:-$user}
  mkdir -p "$PGDATA" /var/run/postgresql
  chown -R postgres:postgres "$PGDATA" /var/run/postgresql
  chmod 700 "$PGDATA"
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    [ -n "$POSTGRES_PASSWORD" ] || { echo "error: POSTGRES_PASSWORD is not set" >&2; exit 1; }
    pw=$(mktemp); printf '%s\n' "$POSTGRES_PASSWORD" > "$pw"; chown postgres "$pw"
    as_pg initdb -D "$PGDATA" --username="$user" --pwfile="$pw" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pw"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    if [ "$db" != postgres ]; then
      as_pg pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
      as_pg psql -v ON_ERROR_STOP=1 --username="$user" --dbname=postgres -q -c "CREATE DATABASE \"$db\""
      as_pg pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    fi
    echo "initialised $PGDATA: user $user, database $db"
  fi
  exec setpriv --reuid=postgres --regid=postgres --init-groups "$@"
fi
exec "$@"
