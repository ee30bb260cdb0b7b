#!/usr/bin/env bash
# bench/compare.sh OLD NEW: the write figures of two revisions of the
# extension side by side, on this machine, in the same run.  Each revision is
# built and installed into a private copy of the PostgreSQL installation under
# /tmp (the system's installation is not touched), and each round runs both,
# one after the other, on a fresh cluster with the tuned settings of
# bench/run.sh (BENCH_DEFAULT_CONF=1: the default postgresql.conf).  Figures: report() vs a plain INSERT with 1 and 8 clients
# (transactions per second), one INSERT ... SELECT of BULK reports over
# OBJECTS objects, and reconnect() over those objects, each against its plain
# baseline -- timed by the wall clock, and once more by the CPU time of the
# backend that runs it (less noisy on a shared machine; new objects, then all
# 2 x OBJECTS reconnected).  Prints one line per revision and round; compare the
# medians.
#
#   bench/compare.sh c1c3655 HEAD            # ROUNDS=3 DURATION=5 BULK=200000 OBJECTS=20000
set -euo pipefail
cd "$(dirname "$0")/.."
source test/deps.sh
: "${ROUNDS:=3}" "${DURATION:=5}" "${BULK:=200000}" "${OBJECTS:=20000}"
[ $# -eq 2 ] || { echo "usage: bench/compare.sh OLD_REV NEW_REV" >&2; exit 2; }

work=$(mktemp -d /tmp/status_history_compare.XXXXXX)
chmod 755 "$work"
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
    for v in a b; do as_pg "$work/pg$v/usr/lib/postgresql/15/bin/pg_ctl" -D "$work/data$v" -m immediate stop >/dev/null 2>&1 || true; done
    [ -n "${BENCH_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# A private installation per revision: the server's tree, plus that build.
install_rev() {
    local v=$1 rev=$2
    mkdir -p "$work/src$v" "$work/pg$v/usr/lib/postgresql" "$work/pg$v/usr/share/postgresql"
    git archive "$rev" | tar -x -C "$work/src$v"
    cp -a /usr/lib/postgresql/15 "$work/pg$v/usr/lib/postgresql/"
    cp -a /usr/share/postgresql/15 "$work/pg$v/usr/share/postgresql/"
    rm -f "$work/pg$v"/usr/share/postgresql/15/extension/status_history*
    make -s -C "$work/src$v" PG_CONFIG="$PG_CONFIG" >/dev/null
    make -s -C "$work/src$v" PG_CONFIG="$PG_CONFIG" install DESTDIR="$work/pg$v" >/dev/null
}

tps() { sed -n 's/^tps = \([0-9.]*\).*/\1/p'; }
# Seconds a psql command takes.
timed() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
# The CPU seconds (user + system) of the backend that runs SQL statement $2
# with psql command $1...: less noisy than the wall clock on a shared machine.
ticks=$(getconf CLK_TCK)
cpu_of() {
    local sql=${!#} cpu
    local -a psql=("${@:1:$#-1}")
    cpu=$("${psql[@]}" -c "CREATE TEMP VIEW cpu AS SELECT split_part(s, ' ', 14)::bigint + split_part(s, ' ', 15)::bigint AS t
                             FROM pg_read_file('/proc/' || pg_backend_pid() || '/stat') AS s" \
                        -c "SELECT t FROM cpu" -c "$sql" -c "SELECT t FROM cpu" | grep -E '^[0-9]+$' | tail -2 | tr '\n' ' ')
    set -- $cpu
    echo "($2 - $1) / $ticks" | bc -l
}

run_rev() {
    local v=$1 rev=$2 port=$3 bin="$work/pg$1/usr/lib/postgresql/15/bin" d="$work/data$1"
    rm -rf "$d"
    [ "$(id -u)" -eq 0 ] && chown postgres "$work"
    as_pg "$bin/initdb" -D "$d" -A trust >/dev/null
    cat >>"$d/postgresql.conf" <<EOF
listen_addresses = ''
port = $port
unix_socket_directories = '$work'
EOF
    # BENCH_DEFAULT_CONF=1: the postgresql.conf a new user has.
    [ "${BENCH_DEFAULT_CONF:-0}" = 1 ] || cat >>"$d/postgresql.conf" <<EOF
shared_buffers = '1GB'
max_wal_size = '8GB'
synchronous_commit = off
EOF
    as_pg "$bin/pg_ctl" -D "$d" -l "$work/log$v" -w start >/dev/null
    local P=("$bin/psql" -X -q -At -h "$work" -p "$port" -U postgres -d postgres)
    "${P[@]}" -c "CREATE EXTENSION status_history" \
        -c "CREATE TABLE base (LIKE status_history.history); CREATE INDEX ON base (object_id, occurred_at DESC)"
    echo "SELECT status_history.report('o' || (random() * 999)::int, 'running');" >"$work/rep.sql"
    echo "INSERT INTO base (occurred_at, object_id, status, generation, stale) VALUES (clock_timestamp(), 'o' || (random() * 999)::int, 'running', 0, false);" >"$work/base.sql"
    chmod 644 "$work"/*.sql
    local pb=("$bin/pgbench" -n -h "$work" -p "$port" -U postgres -T "$DURATION")
    local r1 b1 r8 b8 bulk bbulk rc brc
    r1=$("${pb[@]}" -c 1 -f "$work/rep.sql" postgres 2>/dev/null | tps)
    b1=$("${pb[@]}" -c 1 -f "$work/base.sql" postgres 2>/dev/null | tps)
    r8=$("${pb[@]}" -c 8 -j 2 -f "$work/rep.sql" postgres 2>/dev/null | tps)
    b8=$("${pb[@]}" -c 8 -j 2 -f "$work/base.sql" postgres 2>/dev/null | tps)
    bulk=$(timed "${P[@]}" -c "INSERT INTO status_history.history (object_id, status, error) SELECT 'b' || (i % $OBJECTS), (ARRAY['running', 'stalled'])[1 + (i / $OBJECTS) % 2], 'e' FROM generate_series(1, $BULK) AS i")
    bbulk=$(timed "${P[@]}" -c "INSERT INTO base (occurred_at, object_id, status, error, generation, stale) SELECT clock_timestamp(), 'b' || (i % $OBJECTS), (ARRAY['running', 'stalled'])[1 + (i / $OBJECTS) % 2], 'e', 0, false FROM generate_series(1, $BULK) AS i")
    rc=$(timed "${P[@]}" -c "SELECT count(*) FROM status_history.reconnect(1)")
    brc=$(timed "${P[@]}" -c "INSERT INTO base (occurred_at, object_id, status, generation, stale) SELECT clock_timestamp(), object_id, status, 1, false FROM status_history.objects")
    # The same two again, timed by the backend's CPU: new objects, reported
    # at generation 1 (reconnect(1) raised the floor), then all reconnected.
    local cbulk cbbulk crc cbrc
    cbulk=$(cpu_of "${P[@]}" "INSERT INTO status_history.history (object_id, status, error, generation) SELECT 'c' || (i % $OBJECTS), (ARRAY['running', 'stalled'])[1 + (i / $OBJECTS) % 2], 'e', 1 FROM generate_series(1, $BULK) AS i")
    cbbulk=$(cpu_of "${P[@]}" "INSERT INTO base (occurred_at, object_id, status, error, generation, stale) SELECT clock_timestamp(), 'c' || (i % $OBJECTS), (ARRAY['running', 'stalled'])[1 + (i / $OBJECTS) % 2], 'e', 1, false FROM generate_series(1, $BULK) AS i")
    crc=$(cpu_of "${P[@]}" "DO \$\$BEGIN PERFORM count(*) FROM status_history.reconnect(2); END\$\$")
    cbrc=$(cpu_of "${P[@]}" "INSERT INTO base (occurred_at, object_id, status, generation, stale) SELECT clock_timestamp(), object_id, status, 2, false FROM status_history.objects WHERE status IS NOT NULL")
    as_pg "$bin/pg_ctl" -D "$d" -m fast stop >/dev/null
    printf '%-10s report 1 client %8.0f tps (%.3f of INSERT)  8 clients %8.0f tps (%.3f)  bulk %6.2f s (%.2fx)  reconnect %6.2f s (%.2fx)  CPU: bulk %5.2f s (%.2fx)  reconnect %5.2f s (%.2fx)\n' \
        "$rev" "$r1" "$(echo "$r1 / $b1" | bc -l)" "$r8" "$(echo "$r8 / $b8" | bc -l)" \
        "$bulk" "$(echo "$bulk / $bbulk" | bc -l)" "$rc" "$(echo "$rc / $brc" | bc -l)" \
        "$cbulk" "$(echo "$cbulk / $cbbulk" | bc -l)" "$crc" "$(echo "$crc / $cbrc" | bc -l)"
}

command -v bc >/dev/null || { apt-get install -y -qq bc >/dev/null 2>&1 || sudo apt-get install -y -qq bc >/dev/null; }
install_rev a "$1"
install_rev b "$2"
echo "== $1 vs $2: $ROUNDS rounds, pgbench ${DURATION}s, bulk $BULK reports over $OBJECTS objects"
for _ in $(seq "$ROUNDS"); do
    run_rev a "$1" 55411
    run_rev b "$2" 55412
done
