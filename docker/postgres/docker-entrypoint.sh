#!/usr/bin/env bash
# Entrypoint of pgfence/postgres, the PostgreSQL image that
# docker/build-images.sh builds from Debian packages where the upstream
# postgres image cannot be pulled. It does what the upstream image's
# entrypoint does for what pgfence's tests, docker-compose.yml and
# testcontainers-go's postgres module rely on:
#
#   POSTGRES_USER             superuser to create (default postgres)
#   POSTGRES_PASSWORD         its password; required unless
#                             POSTGRES_HOST_AUTH_METHOD=trust
#   POSTGRES_DB               database to create (default: POSTGRES_USER)
#   POSTGRES_HOST_AUTH_METHOD pg_hba method for remote hosts
#                             (default scram-sha-256)
#   POSTGRES_INITDB_ARGS      extra initdb arguments
#   /docker-entrypoint-initdb.d/*.sh, *.sql, *.sql.gz  run once, in order
#
# On a fresh data directory it initialises the cluster, starts a temporary
# server listening on the Unix socket only, creates the database, runs the
# init scripts, stops it and then starts the real server: so the log says
# "database system is ready to accept connections" twice, and
# testcontainers' postgres wait strategy (BasicWaitStrategies) waits for
# the second. With data already there it starts the server at once.
#
# Arguments: "postgres ..." (the default) or options ("-c fsync=off") start
# the server; anything else is run as given (pg_isready, psql, bash).
set -Eeuo pipefail

if [ "${1:0:1}" = '-' ]; then
	set -- postgres "$@"
fi

if [ "$1" != 'postgres' ]; then
	exec "$@"
fi

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [ "$(id -u)" = '0' ]; then
	# As root: own the data and socket directories, then run this script
	# again as the postgres user.
	mkdir -p "$PGDATA" /var/run/postgresql
	chown -R postgres:postgres "$PGDATA" /var/run/postgresql
	chmod 700 "$PGDATA"
	chmod 2775 /var/run/postgresql
	exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi

if [ -s "$PGDATA/PG_VERSION" ]; then
	exec "$@"
fi

: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_PASSWORD:=}"
: "${POSTGRES_HOST_AUTH_METHOD:=}"
if [ -z "$POSTGRES_PASSWORD" ] && [ "$POSTGRES_HOST_AUTH_METHOD" != 'trust' ]; then
	cat >&2 <<-'EOF'
		error: the database is uninitialised and no superuser password is set.
		       Set POSTGRES_PASSWORD, or POSTGRES_HOST_AUTH_METHOD=trust to allow
		       connections from other hosts without one.
	EOF
	exit 1
fi
auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"

# shellcheck disable=SC2206 # POSTGRES_INITDB_ARGS is a list of words
initdb_args=(--username="$POSTGRES_USER" --auth-local=trust --auth-host=trust ${POSTGRES_INITDB_ARGS:-})
if [ -n "$POSTGRES_PASSWORD" ]; then
	# The process substitution must be in initdb's own command line: bash
	# closes it when the command that opened it ends.
	initdb "${initdb_args[@]}" --pwfile=<(printf '%s\n' "$POSTGRES_PASSWORD")
else
	initdb "${initdb_args[@]}"
fi

# Reachable from other containers, with the chosen method.
printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
printf '\nhost all all all %s\n' "$auth" >>"$PGDATA/pg_hba.conf"

# A temporary server on the Unix socket only, for the set-up.
pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -p 5432" start

psql_setup=(psql -v ON_ERROR_STOP=1 --no-password --no-psqlrc --username "$POSTGRES_USER" --dbname postgres)
if [ "$POSTGRES_DB" != 'postgres' ]; then
	exists=$("${psql_setup[@]}" -Atq --set db="$POSTGRES_DB" <<<"SELECT 1 FROM pg_database WHERE datname = :'db'")
	if [ -z "$exists" ]; then
		"${psql_setup[@]}" -q --set db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
	fi
fi

psql_db=("${psql_setup[@]:0:${#psql_setup[@]}-1}" "$POSTGRES_DB")
for f in /docker-entrypoint-initdb.d/*; do
	[ -e "$f" ] || continue
	case "$f" in
	*.sh)
		echo "$0: running $f"
		if [ -x "$f" ]; then "$f"; else . "$f"; fi
		;;
	*.sql)
		echo "$0: running $f"
		"${psql_db[@]}" -f "$f"
		;;
	*.sql.gz)
		echo "$0: running $f"
		gunzip -c "$f" | "${psql_db[@]}"
		;;
	*) echo "$0: ignoring $f" ;;
	esac
done

pg_ctl -D "$PGDATA" -m fast -w stop
echo
echo 'PostgreSQL init process complete; ready for start up.'
echo

exec "$@"
