#!/usr/bin/env bash
# Start a PostgreSQL server on loopback for tests/test_fleet.py and create its database.
# Idempotent, run as root (CI): installs the Debian package if missing, starts the default
# cluster, lets user postgres into database cutetune_test from 127.0.0.1 without a password
# (trust, loopback and that database only: there is no secret to print or export), and prints
# the test URL as the last line of stdout, for: export CUTETUNE_TEST_PG_URL=$(bash .ci/start_postgres.sh)
set -euo pipefail
DB=cutetune_test
log() { echo "start_postgres: $*" >&2; }

if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
  log "installing the postgresql package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq postgresql >&2
fi
ver=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
pg_lsclusters -h | awk '{print $1, $2}' | grep -qx "$ver main" || pg_createcluster "$ver" main >&2
port=$(pg_lsclusters -h | awk -v v="$ver" '$1 == v && $2 == "main" {print $3}')

# pg_hba.conf is read top-down: the trust line must precede the package's password lines.
hba=/etc/postgresql/$ver/main/pg_hba.conf
line="host $DB postgres 127.0.0.1/32 trust"
grep -qxF "$line" "$hba" || sed -i "1i $line" "$hba"

if pg_lsclusters -h | awk -v v="$ver" '$1 == v && $2 == "main" {print $4}' | grep -qx online; then
  pg_ctlcluster "$ver" main reload >&2
else
  pg_ctlcluster "$ver" main start >&2
fi
for _ in $(seq 60); do
  pg_isready -q -h 127.0.0.1 -p "$port" && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p "$port" >&2

exists=$(runuser -u postgres -- psql -p "$port" -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB'")
[ "$exists" = 1 ] || runuser -u postgres -- createdb -p "$port" "$DB"
log "PostgreSQL $ver on 127.0.0.1:$port, database $DB"
echo "postgresql://postgres@127.0.0.1:$port/$DB"
