#!/usr/bin/env bash
# Installs, from Debian's packages, whatever the build, tests, demo and
# benchmarks need and this machine lacks.  Sourced by the other scripts.
set -euo pipefail

sh_packages=(
    make gcc
    postgresql-15 postgresql-server-dev-15 postgresql-common postgresql-contrib
    postgresql-15-pgtap libtap-parser-sourcehandler-pgtap-perl libipc-run-perl
    valgrind postgresql-plperl-15 postgresql-15-cron
    gnuplot-nox     # make bench's chart (bench/chart.sh)
    python3-psycopg golang-go golang-github-jackc-pgx-v4-dev   # the client examples (examples/, test/clients.sh)
    pgbouncer       # make poolers (test/poolers.sh): transaction and session pooling
    cargo rustc librust-tokio-postgres-dev librust-tokio-dev   # examples/rust, built offline from Debian's crates
    prometheus-postgres-exporter prometheus curl   # make monitoring (test/exporter.sh): the exporter, promtool
)

sh_missing=()
for p in "${sh_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || sh_missing+=("$p")
done
if [ ${#sh_missing[@]} -gt 0 ]; then
    echo "== installing: ${sh_missing[*]}"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${sh_missing[@]}" >/dev/null
fi
export PATH="/usr/lib/postgresql/15/bin:$PATH"
export PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config

# Build and install the extension into the server's directories.
sh_build_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    make -s PG_CONFIG="$PG_CONFIG" >/dev/null
    $sudo make -s PG_CONFIG="$PG_CONFIG" install >/dev/null
}

# A throw-away server run by postgres: sh_scratch_server DATADIR PORT [CONF-LINE...].
# It listens on 127.0.0.1:PORT and on a socket in DATADIR's parent directory,
# which must exist and be the postgres user's; its log is DATADIR/../server.log.
sh_scratch_server() {
    local data=$1 port=$2 dir
    shift 2
    dir=$(dirname "$data")
    runuser -u postgres -- /usr/lib/postgresql/15/bin/initdb -D "$data" -A trust -U postgres >/dev/null
    printf '%s\n' "port = $port" "listen_addresses = '127.0.0.1'" "unix_socket_directories = '$dir'" "$@" \
        >>"$data/postgresql.conf"
    runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D "$data" -l "$dir/server.log" -w start >/dev/null
}
