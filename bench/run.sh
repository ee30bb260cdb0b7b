#!/usr/bin/env bash
# make bench: every figure of docs/BENCHMARKS.md against its plain-SQL
# baseline, both measured in the same run on the same throw-away cluster.
#
# Sizes are environment variables.  The defaults are scaled down to finish in
# a few minutes on 2 cores; BENCH_FULL=1 uses the sizes the targets are stated
# for (100k objects x 50 reports, 1M bulk rows), which takes longer.
#
# At the end it writes a chart of every figure that has a target, as its
# ratio against the target (bench/chart.sh), to bench/out/figures.png or
# BENCH_CHART=<path>.png, and the rows behind it beside it (<path>.tsv).
set -euo pipefail
chart=${BENCH_CHART:-}
[ -z "$chart" ] || [[ $chart == /* ]] || chart="$PWD/$chart"
cd "$(dirname "$0")/.."
root=$(pwd)
: "${chart:=$root/bench/out/figures.png}"
source test/deps.sh
# PG_BIN=<bin directory of a private copy of the installation> (made as
# bench/compare.sh makes one): build with the system's headers, install into
# that copy and run its server, leaving the system's installation alone.
# BENCH_DEFAULT_CONF=1: the server keeps its default postgresql.conf (only
# where to listen is set), instead of the tuned settings below.
if [ -n "${PG_BIN:-}" ]; then
    make -s PG_CONFIG="$PG_CONFIG" >/dev/null
    make -s PG_CONFIG="$PG_BIN/pg_config" install >/dev/null
    export PATH="$PG_BIN:$PATH"
else
    sh_build_install
fi
pgbin=${PG_BIN:-/usr/lib/postgresql/15/bin}

if [ "${BENCH_FULL:-0}" = 1 ]; then
    : "${OBJECTS:=100000}" "${PER_OBJECT:=50}" "${BULK:=1000000}" "${GROWTH_OBJECTS:=10000}" "${DURATION:=5}"
    : "${QUESTION_OBJECTS:=100000}"
    : "${RETENTION_OBJECTS:=100000}"
    : "${EXPIRE_OBJECTS:=100000}"
else
    : "${OBJECTS:=20000}" "${PER_OBJECT:=50}" "${BULK:=200000}" "${GROWTH_OBJECTS:=5000}" "${DURATION:=3}"
    : "${QUESTION_OBJECTS:=20000}"
    : "${RETENTION_OBJECTS:=10000}"
    : "${EXPIRE_OBJECTS:=20000}"
fi
# Retention (figures 6, 6b): RETENTION_OBJECTS x RETENTION_PER_OBJECT reports,
# one replica per object; prune(RETENTION_KEEP) against the DELETE, then the
# latency of CLIENTS reporters alone and while prune(LATENCY_KEEP) runs.
# Heartbeats (figure 9): CLIENTS x HEARTBEAT_OBJECTS keys.
# Leases (figure 13): expire() over EXPIRE_OBJECTS lapsed objects; the
# worker's idle CPU sampled over WORKER_SECONDS per round.
: "${RETENTION_PER_OBJECT:=50}" "${RETENTION_KEEP:=5}" "${LATENCY_KEEP:=1}" "${HEARTBEAT_OBJECTS:=100}"
: "${WORKER_SECONDS:=15}"
# Change feed (figure 14): FEED_ROWS reports loaded, FEED_READ of them read in
# pages of FEED_PAGE; IDLE_SESSIONS other sessions connected for 14b.
: "${FEED_ROWS:=$((BULK * 2))}" "${FEED_READ:=$BULK}" "${FEED_PAGE:=1000}" "${IDLE_SESSIONS:=99}"

: "${QUESTION_PER_OBJECT:=10}"
: "${GROWTH:=10}" "${RUNS:=3}" "${REPS:=5}" "${CLIENTS:=8}"

# --- a throw-away cluster, owned by postgres when run as root ---------------
work=$(mktemp -d /tmp/status_history_bench.XXXXXX)
chmod 755 "$work"
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" -eq 0 ] && chown postgres "$work"
stop() {
    as_pg "$pgbin/pg_ctl" -D "$work/data" -m fast stop >/dev/null 2>&1 || true
    [ ! -d "$work/data2" ] || as_pg "$pgbin/pg_ctl" -D "$work/data2" -m fast stop >/dev/null 2>&1 || true
    [ -n "${BENCH_KEEP:-}" ] || rm -rf "$work"
}
trap stop EXIT
as_pg "$pgbin/initdb" -D "$work/data" -A trust >/dev/null
# conf DATA PORT: where to listen, and the tuned settings unless BENCH_DEFAULT_CONF=1.
conf() {
    cat >>"$1/postgresql.conf" <<EOF
listen_addresses = ''
port = $2
unix_socket_directories = '$work'
EOF
    [ "${BENCH_DEFAULT_CONF:-0}" = 1 ] || cat >>"$1/postgresql.conf" <<EOF
shared_buffers = '2GB'
max_wal_size = '16GB'
checkpoint_timeout = '30min'
synchronous_commit = off
work_mem = '4MB'
EOF
}
conf "$work/data" "${BENCH_PORT:-54340}"
# 14b connects IDLE_SESSIONS more sessions than the default 100 allows beside the others.
[[ -n "${FIGURES:-}" && " $FIGURES " != *" 14 "* ]] || echo "max_connections = $((IDLE_SESSIONS + 50))" >>"$work/data/postgresql.conf"
as_pg "$pgbin/pg_ctl" -D "$work/data" -l "$work/server.log" -w start >/dev/null
export PGHOST="$work" PGPORT="${BENCH_PORT:-54340}" PGUSER=postgres PGDATABASE=postgres
q() { psql -X -q -At -v ON_ERROR_STOP=1 -c "$1"; }
psql -X -q -v ON_ERROR_STOP=1 -f bench/setup.sql >/dev/null

results="$work/results.tsv"
: >"$results"
# row OPERATION SIZE EXT BASE UNIT KIND TARGET
#   KIND "rate": higher is better, ratio = ext / base must be >= TARGET
#   KIND "time": lower is better,  ratio = ext / base must be <= TARGET
row() {
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$results"
    printf '  %-52s %12s %12s %s\n' "$1 [$2]" "$3" "$4" "$5"
}

# Median tps of a pgbench script over RUNS runs, extension and baseline
# alternating so that drift hits both alike.  Prints "ext base".  MODE is
# pgbench's query protocol: simple (the default: every statement is parsed and
# planned anew) or prepared (parsed once, plans cached per connection).
tps_pair() {
    local clients=$1 ext=$2 base=$3 mode=${4:-simple} e=() b=()
    local jobs=$(( clients < 2 ? 1 : 2 ))
    for _ in $(seq "$RUNS"); do
        e+=("$(pgbench -n -M "$mode" -c "$clients" -j "$jobs" -T "$DURATION" -f "$ext" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')")
        b+=("$(pgbench -n -M "$mode" -c "$clients" -j "$jobs" -T "$DURATION" -f "$base" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')")
    done
    echo "$(median "${e[@]}") $(median "${b[@]}")"
}
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'; }

# Median of REPS runs of a statement, each in its own transaction (as a
# controller's calls would be), timed on the server.
stmt_median_ms() {
    local t=()
    for _ in $(seq "$REPS"); do
        t+=("$(q "SELECT bench_median_stmt_ms(\$\$$1\$\$, 1)")")
    done
    median "${t[@]}"
}

# FIGURES="3 5" runs only those figures (the load always runs).
want() { [ -z "${FIGURES:-}" ] || [[ " $FIGURES " == *" $1 "* ]]; }

script() { printf '%s\n' "$2" >"$work/$1.sql"; echo "$work/$1.sql"; }
statuses="(ARRAY['starting','running','paused','stalled','ceased'])"

echo "== status_history benchmarks: $OBJECTS objects x $PER_OBJECT reports, bulk $BULK, pgbench ${DURATION}s x $RUNS runs"

# --- 3. load the history, then the current status of every object ----------
n=$((OBJECTS * PER_OBJECT))
load_ext="INSERT INTO status_history.history (object_id, status, replica_id)
          SELECT 'obj-' || (i % $OBJECTS), $statuses[1 + (i / $OBJECTS) % 5], 'r' || (i % 3)
            FROM generate_series(0, $n - 1) AS i"
load_base="INSERT INTO plain (occurred_at, object_id, status, replica_id)
           SELECT clock_timestamp(), 'obj-' || (i % $OBJECTS), $statuses[1 + (i / $OBJECTS) % 5], 'r' || (i % 3)
             FROM generate_series(0, $n - 1) AS i"
# The load feeds figures 3, mem, 3b's baseline sizes, 4, 1 and 5; FIGURES naming
# only figures that load data of their own (6, 6b, 9, 12, 13, 14, counts) skip it.
main_load=1
if [ -n "${FIGURES:-}" ]; then
    main_load=0
    for f in $FIGURES; do case $f in 6|6b|9|12|13|14|counts) ;; *) main_load=1 ;; esac; done
fi
if [ "$main_load" = 1 ]; then
echo "-- loading $n reports into each (timed as a bulk append)"
e=$(q "SELECT bench_median_stmt_ms(\$\$$load_ext\$\$, 1)")
b=$(q "SELECT bench_median_stmt_ms(\$\$$load_base\$\$, 1)")
row "load: INSERT ... SELECT of all reports" "$n rows" "$e" "$b" ms time -
q "INSERT INTO plain_pk SELECT object_id, status, occurred_at FROM status_history.statuses"
q "VACUUM ANALYZE"
fi

if want 3; then
e=$(q "SELECT bench_median_ms('SELECT * FROM status_history.statuses', $REPS)")
b=$(q "SELECT bench_median_ms('SELECT DISTINCT ON (object_id) * FROM plain ORDER BY object_id, occurred_at DESC', $REPS)")
row "3. current status of every object: statuses vs DISTINCT ON" "$OBJECTS x $PER_OBJECT" "$e" "$b" ms time 0.1
e=$(q "SELECT bench_median_ms('SELECT * FROM status_history.latest()', $REPS)")
row "3. current status of every object: latest() vs DISTINCT ON" "$OBJECTS x $PER_OBJECT" "$e" "$b" ms time 0.1
fi

# --- memory of latest() over the whole data set ----------------------------
peak=0; idle=0
if want mem; then
# Sample the backend's private (anonymous) resident memory every 5 ms while
# latest() runs with work_mem = 4MB; shared buffers are not counted in RssAnon.
cat >"$work/mem.sql" <<EOF
\o $work/mem.pid
SELECT pg_backend_pid();
\o
SELECT pg_sleep(0.5);
SELECT count(*) FROM status_history.latest();
SELECT pg_sleep(0.3);
EOF
rm -f "$work/mem.pid"
psql -X -q -At -f "$work/mem.sql" >/dev/null &
mempsql=$!
while [ ! -s "$work/mem.pid" ]; do sleep 0.05; done
pid=$(tr -dc 0-9 <"$work/mem.pid")
rss_anon() { awk '/RssAnon/ {print $2}' "/proc/$pid/status" 2>/dev/null || true; }
idle=$(rss_anon)
peak=${idle:-0}
while kill -0 "$mempsql" 2>/dev/null; do
    cur=$(rss_anon)
    if [ -n "$cur" ] && [ "$cur" -gt "$peak" ]; then peak=$cur; fi
    sleep 0.005
done
wait "$mempsql" || true
echo "  memory: latest() over $OBJECTS objects, work_mem 4MB: backend RssAnon idle ${idle} kB, peak ${peak} kB (+$((peak - idle)) kB)"
fi

# --- 3b. cost follows objects, not history -----------------------------------
if want 3b; then
q "CREATE DATABASE growth"
PGDATABASE=growth psql -X -q -v ON_ERROR_STOP=1 -f bench/setup.sql >/dev/null
gq() { PGDATABASE=growth q "$1"; }
gload() {   # gload FROM COUNT_PER_OBJECT
    gq "INSERT INTO status_history.history (object_id, status)
        SELECT 'g-' || (i % $GROWTH_OBJECTS), $statuses[1 + (i / $GROWTH_OBJECTS) % 5]
          FROM generate_series(0, $GROWTH_OBJECTS * $1 - 1) AS i"
    gq "INSERT INTO plain (occurred_at, object_id, status)
        SELECT clock_timestamp(), 'g-' || (i % $GROWTH_OBJECTS), $statuses[1 + (i / $GROWTH_OBJECTS) % 5]
          FROM generate_series(0, $GROWTH_OBJECTS * $1 - 1) AS i"
    gq "VACUUM ANALYZE"
}
gload "$PER_OBJECT"
greps=$(( REPS > 15 ? REPS : 15 ))
e1=$(gq "SELECT bench_median_ms('SELECT * FROM status_history.statuses', $greps)")
b1=$(gq "SELECT bench_median_ms('SELECT DISTINCT ON (object_id) * FROM plain ORDER BY object_id, occurred_at DESC', $REPS)")
gload $((PER_OBJECT * (GROWTH - 1)))
e2=$(gq "SELECT bench_median_ms('SELECT * FROM status_history.statuses', $greps)")
b2=$(gq "SELECT bench_median_ms('SELECT DISTINCT ON (object_id) * FROM plain ORDER BY object_id, occurred_at DESC', $REPS)")
row "3b. statuses with ${GROWTH}x history (vs itself at 1x)" "$GROWTH_OBJECTS x $((PER_OBJECT * GROWTH))" "$e2" "$e1" ms time 1.5
row "3b. DISTINCT ON with ${GROWTH}x history (vs itself at 1x)" "$GROWTH_OBJECTS x $((PER_OBJECT * GROWTH))" "$b2" "$b1" ms time -
q "DROP DATABASE growth"
fi

# --- 4. one object's current status ------------------------------------------
if want 4; then
ext=$(script point_ext "\\set obj random(0, $((OBJECTS - 1)))
SELECT * FROM status_history.statuses WHERE object_id = 'obj-' || :obj;")
base=$(script point_base "\\set obj random(0, $((OBJECTS - 1)))
SELECT * FROM plain_pk WHERE object_id = 'obj-' || :obj;")
# Cached plans (a prepared statement, as a client library's would be), and
# planned anew every time (the simple protocol, as an ad-hoc psql query).
latency_us() { awk -v t="$1" 'BEGIN {printf "%.1f", 1e6 / t}'; }
read -r e b <<<"$(tps_pair 1 "$ext" "$base" prepared)"
row "4. one object through statuses vs primary-key lookup (latency), cached plans" "$OBJECTS objects" \
    "$(latency_us "$e")" "$(latency_us "$b")" us time 1.5
read -r e b <<<"$(tps_pair 1 "$ext" "$base" simple)"
row "4. one object through statuses vs primary-key lookup (latency), planned anew" "$OBJECTS objects" \
    "$(latency_us "$e")" "$(latency_us "$b")" us time 1.5
fi

# --- 7. the clock ---------------------------------------------------------------
if want 7; then
ext=$(script clock_ext "SELECT status_history.monotonic_now();")
base=$(script clock_base "SELECT clock_timestamp();")
for c in 1 "$CLIENTS"; do
    read -r e b <<<"$(tps_pair "$c" "$ext" "$base")"
    row "7. monotonic_now() vs clock_timestamp(), $c clients" "calls/s" "$e" "$b" tps rate -
done
fi

# --- 1. append, one report per transaction ---------------------------------------
if want 1; then
ext=$(script append_ext "\\set obj random(0, $((OBJECTS - 1)))
\\set st random(1, 5)
SELECT status_history.report('obj-' || :obj, $statuses[:st], NULL, NULL, 'r1', 0);")
base=$(script append_base "\\set obj random(0, $((OBJECTS - 1)))
\\set st random(1, 5)
INSERT INTO plain (occurred_at, object_id, status, replica_id) VALUES (clock_timestamp(), 'obj-' || :obj, $statuses[:st], 'r1');")
# The second baseline: report()'s work written by hand (bench/setup.sql,
# hand_report(): floors read, the object's row locked, a stamp from the
# extension's clock, the history row with the history's two indexes, the
# object's row and the key's row updated), both sides sent as prepared
# statements (-M prepared: parsed once per connection; hand_report()'s
# statements are PL/pgSQL's cached plans, report()'s are kept SPI plans).
# Until issue 21 this baseline was one statement without the key row, sent
# with the simple protocol (planned at every execution): not a floor.
# report() runs against it with deduplication off, so that every report
# appends as the hand-written function does (with it on, about one random
# report in five repeats its key's newest row and appends nothing).
hand=$(script append_hand "\\set obj random(0, $((OBJECTS - 1)))
\\set st random(1, 5)
SELECT hand_report('obj-' || :obj, $statuses[:st], 'r1');")
nodedup='-c status_history.deduplicate=off'
# The cluster runs with synchronous_commit = off, which exposes the CPU cost;
# with it on (the durable default) each commit also waits for its WAL flush.
# Each comparison starts after a checkpoint, so that neither side pays for
# writing out what the loads before it left dirty (or for the full-page images
# of the checkpoint those loads set off); the hand-written copy of the history
# is made only after the plain INSERT comparisons, so that it does not crowd
# the extension's tables out of shared buffers while they run.
# Both sides sent with the simple protocol, then both as prepared statements
# (-M prepared), as a client library sends a statement it runs often
# (psycopg after 5 runs, pgx and JDBC by default): neither side then parses
# and plans at every execution.
for mode in simple prepared; do
    label=
    if [ "$mode" = prepared ]; then label=", cached plans"; fi
    for c in 1 "$CLIENTS"; do
        for sync in off on; do
            q "CHECKPOINT"
            read -r e b <<<"$(PGOPTIONS="-c synchronous_commit=$sync" tps_pair "$c" "$ext" "$base" "$mode")"
            row "1. append: report() vs plain INSERT$label, $c clients, sync $sync" "tx/s" "$e" "$b" tps rate 0.7
        done
    done
done
q "INSERT INTO hand_history SELECT * FROM status_history.history"
q "INSERT INTO hand_objects SELECT * FROM status_history.objects"
q "INSERT INTO hand_keys SELECT * FROM status_history.replica_state"
q "VACUUM ANALYZE hand_history, hand_objects, hand_keys"
for c in 1 "$CLIENTS"; do
    for sync in off on; do
        q "CHECKPOINT"
        read -r e b <<<"$(PGOPTIONS="-c synchronous_commit=$sync $nodedup" tps_pair "$c" "$ext" "$hand" prepared)"
        row "1. append: report() vs the same work by hand (hand_report(), cached plans), $c clients, sync $sync" "tx/s" "$e" "$b" tps rate 1
    done
done
fi

# --- 5. reconnect() over every object ---------------------------------------------
if want 5; then
e=$(stmt_median_ms "SELECT count(*) FROM status_history.reconnect(nextval('bench_gen'))")
b=$(stmt_median_ms "INSERT INTO plain (occurred_at, object_id, status) SELECT clock_timestamp(), 'obj-' || i, 'running' FROM generate_series(0, $OBJECTS - 1) AS i")
row "5. reconnect() vs INSERT ... SELECT of as many rows" "$OBJECTS objects" "$e" "$b" ms time 2
fi

# --- 2. bulk append ------------------------------------------------------------------
if want 2; then
e=$(q "SELECT bench_median_stmt_ms(\$\$INSERT INTO status_history.history (object_id, status)
        SELECT 'bulk-' || (i % $OBJECTS), $statuses[1 + (i / $OBJECTS) % 5] FROM generate_series(0, $BULK - 1) AS i\$\$, 1)")
b=$(q "SELECT bench_median_stmt_ms(\$\$INSERT INTO plain (occurred_at, object_id, status)
        SELECT clock_timestamp(), 'bulk-' || (i % $OBJECTS), $statuses[1 + (i / $OBJECTS) % 5] FROM generate_series(0, $BULK - 1) AS i\$\$, 1)")
row "2. bulk append in one INSERT ... SELECT" "$BULK rows" "$e" "$b" ms time 1.5
fi

# --- 10. every key's state: replica_statuses vs DISTINCT ON (object_id, replica_id)
if want 10; then
e=$(q "SELECT bench_median_ms('SELECT * FROM status_history.replica_statuses', $REPS)")
b=$(q "SELECT bench_median_ms('SELECT DISTINCT ON (object_id, replica_id) * FROM plain ORDER BY object_id, replica_id, occurred_at DESC', $REPS)")
row "10. every key: replica_statuses vs DISTINCT ON (object_id, replica_id)" "$OBJECTS x $PER_OBJECT" "$e" "$b" ms time -
fi

# --- 11. reconnect(generation, replica_id): one replica's objects ---------------
# The load has replicas r0, r1, r2 on every object; the replica's objects are
# found through replica_state, its newest reports by stamp.
if want 11; then
e=$(stmt_median_ms "SELECT count(*) FROM status_history.reconnect(nextval('bench_gen'), 'r1')")
b=$(stmt_median_ms "INSERT INTO plain (occurred_at, object_id, status, replica_id) SELECT clock_timestamp(), 'obj-' || i, 'running', 'r1' FROM generate_series(0, $OBJECTS - 1) AS i")
row "11. reconnect(generation, replica_id) vs INSERT ... SELECT of as many rows" "$OBJECTS objects" "$e" "$b" ms time 2
fi

# --- 12. notifications: a bulk load that changes every status, notify on vs off --
# BULK new objects in one INSERT ... SELECT: BULK status changes, coalesced
# past status_history.notify_limit into one overflow notification.
if want 12; then
nt=()
nf=()
# (Which side goes first alternates by round: the table grows with every load.)
note_on()  { nt+=("$(PGOPTIONS='-c status_history.notify=on' q "SELECT bench_median_stmt_ms(\$\$INSERT INTO status_history.history (object_id, status)
            SELECT 'note-$1-' || i, 'running' FROM generate_series(0, $BULK - 1) AS i\$\$, 1)")"); }
note_off() { nf+=("$(PGOPTIONS='-c status_history.notify=off' q "SELECT bench_median_stmt_ms(\$\$INSERT INTO status_history.history (object_id, status)
            SELECT 'quiet-$1-' || i, 'running' FROM generate_series(0, $BULK - 1) AS i\$\$, 1)")"); }
for r in $(seq "$RUNS"); do
    if [ $((r % 2)) = 1 ]; then note_on "$r"; note_off "$r"; else note_off "$r"; note_on "$r"; fi
done
row "12. bulk load changing $BULK statuses: notify on vs off" "$BULK objects" "$(median "${nt[@]}")" "$(median "${nf[@]}")" ms time 1.1
fi

# --- 8. time in status over one day, every object -------------------------------
# One day of reports (QUESTION_OBJECTS x QUESTION_PER_OBJECT), imported with
# chosen stamps into a database of its own, the same rows in plain; the window
# is the day's last 18 hours, so the status in force at its start counts.  The
# baseline is the brute force a user would write: the newest report before the
# window per object (DISTINCT ON) plus the window's reports, lead() for each
# period's end, summed per object and status.
if want 8; then
q "CREATE DATABASE questions"
PGDATABASE=questions psql -X -q -v ON_ERROR_STOP=1 -f bench/setup.sql >/dev/null
qq() { PGDATABASE=questions q "$1"; }
nq=$((QUESTION_OBJECTS * QUESTION_PER_OBJECT))
day="timestamptz '2000-01-01 00:00:00+00'"
since="$day + interval '6 hours'"
until="$day + interval '1 day'"
day_rows="SELECT $day + i * (interval '1 day' / $nq) AS t, 'q-' || (i % $QUESTION_OBJECTS) AS o,
                 $statuses[1 + (i / $QUESTION_OBJECTS + i % 3) % 5] AS s
            FROM generate_series(0, $nq - 1) AS i"
qq "INSERT INTO status_history.history (occurred_at, object_id, status) SELECT t, o, s FROM ($day_rows) AS d ORDER BY t"
qq "INSERT INTO plain (occurred_at, object_id, status, stale) SELECT t, o, s, false FROM ($day_rows) AS d"
qq "VACUUM ANALYZE"
base_q="WITH r AS (
            SELECT * FROM (SELECT DISTINCT ON (object_id) object_id, occurred_at, status FROM plain
                            WHERE occurred_at < $since AND NOT stale ORDER BY object_id, occurred_at DESC) AS b
            UNION ALL
            SELECT object_id, occurred_at, status FROM plain
             WHERE occurred_at >= $since AND occurred_at < $until AND NOT stale
        ), p AS (
            SELECT object_id, status, greatest(occurred_at, $since) AS a,
                   coalesce(lead(occurred_at) OVER (PARTITION BY object_id ORDER BY occurred_at), $until) AS e
              FROM r
        )
        SELECT object_id, status, sum(e - a) AS duration,
               extract(epoch FROM sum(e - a)) / extract(epoch FROM ($until) - ($since)) AS share
          FROM p GROUP BY object_id, status HAVING sum(e - a) > interval '0'"
e=$(qq "SELECT bench_median_ms(\$\$SELECT * FROM status_history.time_in_status($since, $until)\$\$, $REPS)")
b=$(qq "SELECT bench_median_ms(\$\$$base_q\$\$, $REPS)")
row "8. time_in_status() over one day vs brute-force SQL" "$QUESTION_OBJECTS x $QUESTION_PER_OBJECT" "$e" "$b" ms time -
q "DROP DATABASE questions"
fi

# --- 6. prune(keep) against a hand-written DELETE -------------------------------------
# A database of its own: RETENTION_OBJECTS x RETENTION_PER_OBJECT reports, one
# replica per object (so prune's key is the object and both remove the same
# rows), consecutive reports of an object in different statuses (no repeats);
# the same rows in plain.  Both statements run in a subtransaction that is
# rolled back (bench_rolled_back_ms), so each of RUNS alternating rounds
# removes the same rows; the time is the statement's, the rollback is not in it.
if want 6 || want 6b; then
q "CREATE DATABASE retention"
PGDATABASE=retention psql -X -q -v ON_ERROR_STOP=1 -f bench/setup.sql >/dev/null
rq() { PGDATABASE=retention q "$1"; }
nr=$((RETENTION_OBJECTS * RETENTION_PER_OBJECT))
echo "-- retention: loading $nr reports ($RETENTION_OBJECTS objects x $RETENTION_PER_OBJECT) into each"
rq "INSERT INTO status_history.history (object_id, status, replica_id)
    SELECT 'ret-' || (i % $RETENTION_OBJECTS), $statuses[1 + (i / $RETENTION_OBJECTS) % 5], 'r1'
      FROM generate_series(0, $nr - 1) AS i"
rq "INSERT INTO plain (occurred_at, object_id, status, replica_id)
    SELECT clock_timestamp(), 'ret-' || (i % $RETENTION_OBJECTS), $statuses[1 + (i / $RETENTION_OBJECTS) % 5], 'r1'
      FROM generate_series(0, $nr - 1) AS i"
rq "VACUUM ANALYZE"
[ "$(rq "SELECT count(*) FROM status_history.history")" = "$nr" ] || { echo "retention: the history did not get $nr rows" >&2; exit 1; }
prune_sql="SELECT status_history.prune($RETENTION_KEEP)"
delete_sql="DELETE FROM plain WHERE (object_id, occurred_at) IN (
              SELECT object_id, occurred_at
                FROM (SELECT object_id, occurred_at,
                             row_number() OVER (PARTITION BY object_id ORDER BY occurred_at DESC) AS n
                        FROM plain) AS r
               WHERE n > $RETENTION_KEEP)"
pe=(); pb=(); pn=""; dn=""
for _ in $(seq "$RUNS"); do
    read -r t pn <<<"$(rq "SELECT ms || ' ' || n FROM bench_rolled_back_ms(\$\$$prune_sql\$\$)")"; pe+=("$t")
    read -r t dn <<<"$(rq "SELECT ms || ' ' || n FROM bench_rolled_back_ms(\$\$$delete_sql\$\$)")"; pb+=("$t")
done
echo "  prune($RETENTION_KEEP): ${pe[*]} ms, removes $pn rows; DELETE: ${pb[*]} ms, removes $dn rows"
[ "$pn" = "$dn" ] || echo "  WARNING: prune and the DELETE remove different numbers of rows ($pn, $dn)"
if want 6; then
row "6. prune($RETENTION_KEEP) vs DELETE with row_number() > $RETENTION_KEEP" "$RETENTION_OBJECTS x $RETENTION_PER_OBJECT, $pn removed" \
    "$(median "${pe[@]}")" "$(median "${pb[@]}")" ms time 2
fi
fi

# --- 6b. report latency while prune runs ------------------------------------------------
# CLIENTS reporters (one report per transaction on a random object of the
# retention database, every report appended: deduplication off) with
# pgbench's per-transaction log; p50 and p99 of the transactions that
# completed while prune(LATENCY_KEEP) ran (in a transaction then rolled back,
# so every round removes as much), against a run of the same length without
# prune (all but its first second).  RUNS rounds, alternating; medians.
if want 6b; then
prune_ms=$(median "${pe[@]}")
: "${LATENCY_SECONDS:=$(awk -v m="$prune_ms" 'BEGIN {s = int(3 * m / 1000) + 5; print (s < 10 ? 10 : s)}')}"
lat_rep=$(script latency_report "\\set obj random(0, $((RETENTION_OBJECTS - 1)))
\\set st random(1, 5)
SELECT status_history.report('ret-' || :obj, $statuses[:st], NULL, NULL, 'r1');")
# lat_run TAG PRUNE(0/1): prints "p50_ms p99_ms transactions rows_removed prune_s window_cut"
lat_run() {
    local tag=$1 with=$2 t0 ps pe removed=0 pgb
    rm -f "$work/$tag".*
    t0=$(date +%s.%N)
    PGOPTIONS='-c status_history.deduplicate=off' PGDATABASE=retention \
        pgbench -n -c "$CLIENTS" -j 2 -T "$LATENCY_SECONDS" -l --log-prefix="$work/$tag" -f "$lat_rep" >/dev/null 2>&1 &
    pgb=$!
    sleep 1
    ps=$(date +%s.%N)
    if [ "$with" = 1 ]; then
        removed=$(PGDATABASE=retention psql -X -q -At -v ON_ERROR_STOP=1 -c "BEGIN" \
                      -c "SELECT status_history.prune($LATENCY_KEEP)" -c "ROLLBACK")
        pe=$(date +%s.%N)
    else
        pe=$(echo "$t0 + $LATENCY_SECONDS" | bc)
    fi
    wait "$pgb"
    # Per transaction: completion time = time_epoch.time_us, latency in microseconds.
    cat "$work/$tag".[0-9]* | awk -v ps="$ps" -v pe="$pe" '$5 + $6 / 1e6 >= ps && $5 + $6 / 1e6 <= pe {print $3 / 1000}' |
        sort -g >"$work/$tag.window"
    local last cut=-
    last=$(cat "$work/$tag".[0-9]* | awk '$5 + $6 / 1e6 > m {m = $5 + $6 / 1e6} END {printf "%.6f", m}')
    # The reporters stopped before prune ended: the window is what they covered.
    [ "$(echo "$last < $pe" | bc)" = 1 ] && cut=$(echo "$last - $ps" | bc | xargs printf '%.1f')
    awk -v removed="${removed:-0}" -v secs="$(echo "$pe - $ps" | bc)" -v cut="$cut" '
        { lat[++n] = $1 }
        END {
            i50 = int(0.50 * n); if (i50 < 0.50 * n) i50++
            i99 = int(0.99 * n); if (i99 < 0.99 * n) i99++
            printf "%.3f %.3f %d %s %.1f %s\n", lat[i50], lat[i99], n, removed, secs, cut
        }' "$work/$tag.window"
}
a50=(); a99=(); p50=(); p99=()
for r in $(seq "$RUNS"); do
    read -r x50 x99 xn _ xs _ <<<"$(lat_run "lat_alone_$r" 0)"
    a50+=("$x50"); a99+=("$x99")
    echo "  latency without prune: p50 $x50 ms, p99 $x99 ms over $xn transactions in ${xs}s"
    read -r x50 x99 xn xr xs xc <<<"$(lat_run "lat_prune_$r" 1)"
    p50+=("$x50"); p99+=("$x99")
    echo "  latency during prune($LATENCY_KEEP) removing $xr rows in ${xs}s: p50 $x50 ms, p99 $x99 ms over $xn transactions"
    [ "$xc" = "-" ] || echo "  NOTE: prune outlasted the ${LATENCY_SECONDS}s reporter run: the figure covers its first ${xc}s of ${xs}s (set LATENCY_SECONDS)"
done
row "6b. report latency p50, $CLIENTS clients: during prune vs without" "prune($LATENCY_KEEP) of $xr rows" \
    "$(median "${p50[@]}")" "$(median "${a50[@]}")" ms time -
row "6b. report latency p99, $CLIENTS clients: during prune vs without" "prune($LATENCY_KEEP) of $xr rows" \
    "$(median "${p99[@]}")" "$(median "${a99[@]}")" ms time 3
fi
if want 6 || want 6b; then q "DROP DATABASE retention"; fi

# --- 9. heartbeats: repeats append nothing and cost less than reports ----------------
# CLIENTS clients, each on HEARTBEAT_OBJECTS objects of its own (replica 'w' ||
# client): repeating the same status (deduplication on, the default) against
# reports that differ each time (random details).  Before each repeat run
# every key is set to the repeated report (not timed), so the repeats must
# append no row at all.  RUNS rounds, alternating; median tps.
if want 9; then
hb_seed="SELECT count(*) FROM (SELECT status_history.report('hb-' || c || '-' || k, 'running', NULL, NULL, 'w' || c)
           FROM generate_series(0, $CLIENTS - 1) AS c, generate_series(1, $HEARTBEAT_OBJECTS) AS k) AS s"
hb_repeat=$(script hb_repeat "\\set k random(1, $HEARTBEAT_OBJECTS)
SELECT status_history.report('hb-' || :client_id || '-' || :k, 'running', NULL, NULL, 'w' || :client_id);")
hb_append=$(script hb_append "\\set k random(1, $HEARTBEAT_OBJECTS)
\\set n random(1, 1000000000)
SELECT status_history.report('hb-' || :client_id || '-' || :k, 'running', NULL, jsonb_build_object('n', :n), 'w' || :client_id);")
hr=(); ha=(); added=0; repeats=0
hb_tps() { pgbench -n -c "$CLIENTS" -j 2 -T "$DURATION" -f "$1" 2>/dev/null | sed -n -e 's/^tps = \([0-9.]*\).*/\1/p' -e 's/^number of transactions actually processed: \([0-9]*\).*/n \1/p'; }
for _ in $(seq "$RUNS"); do
    q "$hb_seed" >/dev/null
    before=$(q "SELECT count(*) FROM status_history.history")
    out=$(hb_tps "$hb_repeat")
    hr+=("$(echo "$out" | grep -v '^n ')"); repeats=$((repeats + $(echo "$out" | sed -n 's/^n //p')))
    added=$((added + $(q "SELECT count(*) FROM status_history.history") - before))
    ha+=("$(hb_tps "$hb_append" | grep -v '^n ')")
done
echo "  heartbeats: repeats ${hr[*]} tps, appending reports ${ha[*]} tps; $repeats repeats added $added rows"
row "9. heartbeats: repeats vs appending reports, $CLIENTS clients" "$CLIENTS x $HEARTBEAT_OBJECTS keys" \
    "$(median "${hr[@]}")" "$(median "${ha[@]}")" tps rate 1
row "9. history rows added by $repeats repeats" "$CLIENTS x $HEARTBEAT_OBJECTS keys" "$added" "-" rows count 0
fi

# --- 13. leases ----------------------------------------------------------------------------
# Databases of their own.  RUNS rounds of each comparison, which side goes
# first alternating by round; medians, and every round's value printed.
if want 13; then
# 13a. report() with lease => '30 seconds' against the same without, OBJECTS
# objects (one report each beforehand, replica r1): reports that append (a
# random object, status and details: never a repeat), and heartbeats (each
# client repeats 'running' on HEARTBEAT_OBJECTS keys of its own: a repeat
# appends no row either way and moves the key's last_seen_at; with the lease
# it also renews it, an update of the object's row as well).  Before each heartbeat run its keys are
# set to the repeated report (not timed), so that every timed call repeats.
q "CREATE DATABASE leases"
PGDATABASE=leases psql -X -q -v ON_ERROR_STOP=1 -f bench/setup.sql >/dev/null
lq() { PGDATABASE=leases q "$1"; }
lq "INSERT INTO status_history.history (object_id, status, replica_id)
    SELECT 'l-' || i, 'running', 'r1' FROM generate_series(0, $OBJECTS - 1) AS i"
lq "VACUUM ANALYZE"
la_ext=$(script lease_append_ext "\\set obj random(0, $((OBJECTS - 1)))
\\set st random(1, 5)
\\set n random(1, 1000000000)
SELECT status_history.report('l-' || :obj, $statuses[:st], details => jsonb_build_object('n', :n), replica_id => 'r1', lease => '30 seconds');")
la_base=$(script lease_append_base "\\set obj random(0, $((OBJECTS - 1)))
\\set st random(1, 5)
\\set n random(1, 1000000000)
SELECT status_history.report('l-' || :obj, $statuses[:st], details => jsonb_build_object('n', :n), replica_id => 'r1');")
lh_ext=$(script lease_hb_ext "\\set k random(1, $HEARTBEAT_OBJECTS)
SELECT status_history.report('hl-' || :client_id || '-' || :k, 'running', replica_id => 'w' || :client_id, lease => '30 seconds');")
lh_base=$(script lease_hb_base "\\set k random(1, $HEARTBEAT_OBJECTS)
SELECT status_history.report('hn-' || :client_id || '-' || :k, 'running', replica_id => 'w' || :client_id);")
lh_seed() {   # lh_seed PREFIX LEASE_ARGUMENT
    lq "SELECT count(*) FROM (SELECT status_history.report('$1-' || c || '-' || k, 'running', replica_id => 'w' || c$2)
          FROM generate_series(0, $CLIENTS - 1) AS c, generate_series(1, $HEARTBEAT_OBJECTS) AS k) AS s" >/dev/null
}
lease_tps() {   # lease_tps CLIENTS SCRIPT
    local jobs=$(( $1 < 2 ? 1 : 2 ))
    PGDATABASE=leases pgbench -n -c "$1" -j "$jobs" -T "$DURATION" -f "$2" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
hist_rows() { lq "SELECT count(*) FROM status_history.history WHERE object_id LIKE '$1-%'"; }
for c in 1 "$CLIENTS"; do
    lq "CHECKPOINT"
    e=(); b=()
    for r in $(seq "$RUNS"); do
        if [ $((r % 2)) = 1 ]; then e+=("$(lease_tps "$c" "$la_ext")"); b+=("$(lease_tps "$c" "$la_base")")
        else b+=("$(lease_tps "$c" "$la_base")"); e+=("$(lease_tps "$c" "$la_ext")"); fi
    done
    echo "  13a. appending reports, $c clients: with lease ${e[*]} tps, without ${b[*]} tps"
    row "13a. appending report() with lease vs without, $c clients" "$OBJECTS objects" "$(median "${e[@]}")" "$(median "${b[@]}")" tps rate 0.95
    lq "CHECKPOINT"
    e=(); b=(); he=0; hb=0
    for r in $(seq "$RUNS"); do
        lh_seed hl ", lease => '30 seconds'"; lh_seed hn ""
        x0=$(hist_rows hl); y0=$(hist_rows hn)
        if [ $((r % 2)) = 1 ]; then e+=("$(lease_tps "$c" "$lh_ext")"); b+=("$(lease_tps "$c" "$lh_base")")
        else b+=("$(lease_tps "$c" "$lh_base")"); e+=("$(lease_tps "$c" "$lh_ext")"); fi
        he=$((he + $(hist_rows hl) - x0)); hb=$((hb + $(hist_rows hn) - y0))
    done
    echo "  13a. heartbeats (repeats), $c clients: with lease ${e[*]} tps (history rows added: $he), without ${b[*]} tps (added: $hb)"
    row "13a. heartbeat (repeat) with lease (renews) vs without, $c clients" "$c x $HEARTBEAT_OBJECTS keys" "$(median "${e[@]}")" "$(median "${b[@]}")" tps rate -
done
q "DROP DATABASE leases"

# 13b. every object's current status through statuses, every column the view
# derives read (status, error, details, status_since, reported_at), over
# OBJECTS objects whose current reports have leases, every other one lapsed
# (readers derive the lapse: no worker runs in this cluster), against the same
# objects without leases, each in a database of its own.  The aggregates are
# timed as a statement (bench_median_stmt_ms: wall time, planning included):
# under bench_median_ms's count(*) the planner drops unread outputs, so
# nothing the view derives would be computed -- as in the second row, the
# scan and the view's filter alone.
ls_load() {   # ls_load DATABASE LEASE_EXPRESSION
    q "CREATE DATABASE $1"
    PGDATABASE=$1 psql -X -q -v ON_ERROR_STOP=1 -f bench/setup.sql >/dev/null
    PGDATABASE=$1 q "INSERT INTO status_history.history (object_id, status, details, replica_id, lease)
        SELECT 's-' || i, $statuses[1 + i / 2 % 5], jsonb_build_object('n', i), 'r1', $2
          FROM generate_series(0, $OBJECTS - 1) AS i"
    PGDATABASE=$1 q "VACUUM ANALYZE"
}
ls_load lease_on "CASE WHEN i % 2 = 0 THEN interval '1 microsecond' ELSE interval '1 hour' END"
ls_load lease_off "NULL::interval"
lapsed=$(PGDATABASE=lease_on q "SELECT count(*) FILTER (WHERE error LIKE 'lease expired: %') || ' of ' || count(*) FROM status_history.statuses")
echo "  13b. lease_on: $lapsed objects show a lapse"
all_cols="SELECT count(*), max(status), max(error), max(status_since), max(reported_at), count(details), max(expires_at) FROM status_history.statuses"
e=(); b=(); es=(); bs=()
for r in $(seq "$RUNS"); do
    if [ $((r % 2)) = 1 ]; then
        e+=("$(PGDATABASE=lease_on q "SELECT bench_median_stmt_ms('$all_cols', $REPS)")"); b+=("$(PGDATABASE=lease_off q "SELECT bench_median_stmt_ms('$all_cols', $REPS)")")
    else
        b+=("$(PGDATABASE=lease_off q "SELECT bench_median_stmt_ms('$all_cols', $REPS)")"); e+=("$(PGDATABASE=lease_on q "SELECT bench_median_stmt_ms('$all_cols', $REPS)")")
    fi
    es+=("$(PGDATABASE=lease_on q "SELECT bench_median_ms('SELECT * FROM status_history.statuses', $REPS)")")
    bs+=("$(PGDATABASE=lease_off q "SELECT bench_median_ms('SELECT * FROM status_history.statuses', $REPS)")")
done
echo "  13b. statuses, every derived column: with leases ${e[*]} ms, without ${b[*]} ms; count(*) over SELECT *: ${es[*]} ms, ${bs[*]} ms"
row "13b. statuses (every derived column), leases half lapsed vs no leases" "$OBJECTS objects" "$(median "${e[@]}")" "$(median "${b[@]}")" ms time 1.2
row "13b. statuses (count(*) over SELECT *), leases half lapsed vs no leases" "$OBJECTS objects" "$(median "${es[@]}")" "$(median "${bs[@]}")" ms time -
q "DROP DATABASE lease_on"
q "DROP DATABASE lease_off"

# 13c. expire() over EXPIRE_OBJECTS lapsed objects (one report each, all lapsed)
# against an INSERT ... SELECT of as many lapse-like rows into the history,
# each in a subtransaction rolled back (bench_rolled_back_ms), so that every
# round records the same lapses.
q "CREATE DATABASE lapses"
PGDATABASE=lapses psql -X -q -v ON_ERROR_STOP=1 -f bench/setup.sql >/dev/null
xq() { PGDATABASE=lapses q "$1"; }
xq "INSERT INTO status_history.history (object_id, status, replica_id, lease)
    SELECT 'x-' || i, 'running', 'r1', interval '1 microsecond' FROM generate_series(0, $EXPIRE_OBJECTS - 1) AS i"
xq "VACUUM ANALYZE"
exp_sql="SELECT status_history.expire()"
ins_sql="WITH i AS (INSERT INTO status_history.history (object_id, status, error, replica_id, reported_at)
                SELECT 'x-' || i, 'stalled', 'lease expired: no report from replica r1 since 2026-12-01 10:00:00.000000+00', 'r1', now()
                  FROM generate_series(0, $EXPIRE_OBJECTS - 1) AS i RETURNING 1)
         SELECT count(*) FROM i"
e=(); b=(); en=""; bn=""
for r in $(seq "$RUNS"); do
    xq "CHECKPOINT"
    if [ $((r % 2)) = 1 ]; then
        read -r t en <<<"$(xq "SELECT ms || ' ' || n FROM bench_rolled_back_ms(\$\$$exp_sql\$\$)")"; e+=("$t")
        read -r t bn <<<"$(xq "SELECT ms || ' ' || n FROM bench_rolled_back_ms(\$\$$ins_sql\$\$)")"; b+=("$t")
    else
        read -r t bn <<<"$(xq "SELECT ms || ' ' || n FROM bench_rolled_back_ms(\$\$$ins_sql\$\$)")"; b+=("$t")
        read -r t en <<<"$(xq "SELECT ms || ' ' || n FROM bench_rolled_back_ms(\$\$$exp_sql\$\$)")"; e+=("$t")
    fi
done
echo "  13c. expire() recording $en lapses: ${e[*]} ms; INSERT ... SELECT of $bn rows: ${b[*]} ms"
[ "$en" = "$EXPIRE_OBJECTS" ] || echo "  WARNING: expire() recorded $en lapses, not $EXPIRE_OBJECTS"
row "13c. expire() vs INSERT ... SELECT of as many rows into the history" "$EXPIRE_OBJECTS lapsed objects" "$(median "${e[@]}")" "$(median "${b[@]}")" ms time 2
q "DROP DATABASE lapses"

# 13d. the background worker's idle cost, on a second cluster (the same
# settings, plus shared_preload_libraries = 'status_history'; the main
# cluster does not preload, so no worker records the lapses the figures above
# rely on): the CPU time of the database's expire worker (utime + stime of
# /proc/<pid>/stat, and the nanoseconds of /proc/<pid>/schedstat) over
# WORKER_SECONDS, per minute, with nothing to expire (leases of an hour), at 0,
# OBJECTS and 4 x OBJECTS objects; RUNS rounds each.  Also one expire() call
# timed at each size (the median of 21 in one session).
as_pg "$pgbin/initdb" -D "$work/data2" -A trust >/dev/null
conf "$work/data2" "$((${BENCH_PORT:-54340} + 1))"
echo "shared_preload_libraries = 'status_history'" >>"$work/data2/postgresql.conf"
as_pg "$pgbin/pg_ctl" -D "$work/data2" -l "$work/server2.log" -w start >/dev/null
wq() { PGPORT=$((${BENCH_PORT:-54340} + 1)) q "$1"; }
PGPORT=$((${BENCH_PORT:-54340} + 1)) psql -X -q -v ON_ERROR_STOP=1 -f bench/setup.sql >/dev/null
interval_ms=$(wq "SHOW status_history.expire_interval")
wpid=""
for _ in $(seq 150); do
    wpid=$(wq "SELECT pid FROM pg_stat_activity WHERE backend_type = 'status_history expire worker' AND datname = current_database()")
    [ -z "$wpid" ] || break
    sleep 0.2
done
[ -n "$wpid" ] || { echo "13d: no expire worker started in 30s (see $work/server2.log)" >&2; exit 1; }
lpid=$(wq "SELECT pid FROM pg_stat_activity WHERE backend_type = 'status_history launcher'")
tick=$(getconf CLK_TCK)
cpu_ms() {   # cpu_ms PID: "stat_ms schedstat_ms"
    awk -v t="$tick" '{sub(/^.*\) /, ""); printf "%.3f ", ($12 + $13) * 1000 / t}' "/proc/$1/stat"
    if [ -r "/proc/$1/schedstat" ]; then awk '{printf "%.3f\n", $1 / 1e6}' "/proc/$1/schedstat"; else echo "-"; fi
}
loaded=0
for size in 0 "$OBJECTS" $((4 * OBJECTS)); do
    if [ "$size" -gt "$loaded" ]; then
        wq "INSERT INTO status_history.history (object_id, status, replica_id, lease)
            SELECT 'w-' || i, 'running', 'r1', interval '1 hour' FROM generate_series($loaded, $size - 1) AS i"
        wq "VACUUM ANALYZE"
        loaded=$size
    fi
    # (in one session, as the worker calls it: a new session's first call also
    # pays for its caches and plans)
    call_ms=$(wq "SELECT round(bench_median_stmt_ms('SELECT status_history.expire()', 21)::numeric, 3)")
    sleep 2
    st=(); ss=(); ls=()
    for _ in $(seq "$RUNS"); do
        read -r s0 n0 <<<"$(cpu_ms "$wpid")"; read -r l0 _ <<<"$(cpu_ms "$lpid")"; t0=$(date +%s.%N)
        sleep "$WORKER_SECONDS"
        read -r s1 n1 <<<"$(cpu_ms "$wpid")"; read -r l1 _ <<<"$(cpu_ms "$lpid")"; t1=$(date +%s.%N)
        st+=("$(awk -v a="$s0" -v b="$s1" -v t0="$t0" -v t1="$t1" 'BEGIN {printf "%.1f", (b - a) * 60 / (t1 - t0)}')")
        ss+=("$(awk -v a="$n0" -v b="$n1" -v t0="$t0" -v t1="$t1" 'BEGIN {if (a == "-") print "-"; else printf "%.1f", (b - a) * 60 / (t1 - t0)}')")
        ls+=("$(awk -v a="$l0" -v b="$l1" -v t0="$t0" -v t1="$t1" 'BEGIN {printf "%.1f", (b - a) * 60 / (t1 - t0)}')")
    done
    [ "$(wq "SELECT pid FROM pg_stat_activity WHERE backend_type = 'status_history expire worker' AND datname = current_database()")" = "$wpid" ] ||
        echo "  WARNING: the expire worker was restarted during the measurement"
    echo "  13d. expire worker (pid $wpid, interval ${interval_ms}) over $size objects with leases that do not lapse: ms CPU per minute, stat ${st[*]}; schedstat ${ss[*]}; launcher (stat) ${ls[*]}; one expire() call ${call_ms} ms"
    if [ "${ss[0]}" = - ]; then
        row "13d. expire worker idle: ms CPU per minute (stat)" "$size objects" "$(median "${st[@]}")" "-" "ms/min" value -
    else
        row "13d. expire worker idle: ms CPU per minute (schedstat)" "$size objects" "$(median "${ss[@]}")" "-" "ms/min" value -
    fi
    row "13d. one expire() call with nothing to expire" "$size objects" "$call_ms" "-" ms value -
done
as_pg "$pgbin/pg_ctl" -D "$work/data2" -m fast stop >/dev/null
fi

# --- 14. the change feed ---------------------------------------------------------------
# A database of its own, FEED_ROWS reports (one INSERT ... SELECT over OBJECTS
# objects), vacuumed.  RUNS rounds, which side goes first alternating by
# round; medians, and every round's value printed.
if want 14; then
q "CREATE DATABASE feed"
PGDATABASE=feed psql -X -q -v ON_ERROR_STOP=1 -f bench/setup.sql >/dev/null
fq() { PGDATABASE=feed q "$1"; }
fq "INSERT INTO status_history.history (object_id, status, details, replica_id)
    SELECT 'f-' || (i % $OBJECTS), $statuses[1 + (i / $OBJECTS) % 5], jsonb_build_object('n', i), 'r1'
      FROM generate_series(0, $FEED_ROWS - 1) AS i"
fq "VACUUM ANALYZE"
# 14a. reading FEED_READ rows from the start of the history, every column of
# every row handed to PL/pgSQL (a FOR loop over the query; the position is the
# last row's stamp), as a consumer loop would: in pages of FEED_PAGE rows
# (changes(position, FEED_PAGE) again and again) and in one call of max_rows
# FEED_READ, against the same loop over an index range scan of the history's
# primary key (WHERE occurred_at > position ORDER BY occurred_at LIMIT ...).
# Each timed as a statement (bench_median_stmt_ms, median of REPS).
fq "CREATE FUNCTION feed_read(feed boolean, total int, page int) RETURNS bigint LANGUAGE plpgsql AS \$f\$
DECLARE
    pos timestamptz := CASE WHEN feed THEN NULL ELSE '-infinity' END;
    r status_history.history;
    k int := 0;
    got int;
BEGIN
    LOOP
        got := 0;
        IF feed THEN
            FOR r IN SELECT * FROM status_history.changes(pos, least(page, total - k)) LOOP
                pos := r.occurred_at; got := got + 1;
            END LOOP;
        ELSE
            FOR r IN SELECT * FROM status_history.history WHERE occurred_at > pos ORDER BY occurred_at LIMIT least(page, total - k) LOOP
                pos := r.occurred_at; got := got + 1;
            END LOOP;
        END IF;
        k := k + got;
        EXIT WHEN got = 0 OR k >= total;
    END LOOP;
    RETURN k;
END \$f\$"
got_e=$(fq "SELECT feed_read(true, $FEED_READ, $FEED_PAGE)"); got_b=$(fq "SELECT feed_read(false, $FEED_READ, $FEED_PAGE)")
[ "$got_e" = "$FEED_READ" ] && [ "$got_b" = "$FEED_READ" ] || echo "  WARNING: 14a read $got_e (changes) and $got_b (range scan) rows, not $FEED_READ"
feed_ms() { fq "SELECT round(bench_median_stmt_ms('SELECT feed_read($1, $FEED_READ, $2)', $REPS)::numeric, 3)"; }
pe=(); pb=(); oe=(); ob=()
for r in $(seq "$RUNS"); do
    if [ $((r % 2)) = 1 ]; then
        pe+=("$(feed_ms true "$FEED_PAGE")"); pb+=("$(feed_ms false "$FEED_PAGE")")
        oe+=("$(feed_ms true "$FEED_READ")"); ob+=("$(feed_ms false "$FEED_READ")")
    else
        pb+=("$(feed_ms false "$FEED_PAGE")"); pe+=("$(feed_ms true "$FEED_PAGE")")
        ob+=("$(feed_ms false "$FEED_READ")"); oe+=("$(feed_ms true "$FEED_READ")")
    fi
done
pages=$(( (FEED_READ + FEED_PAGE - 1) / FEED_PAGE ))
echo "  14a. $FEED_READ of $FEED_ROWS rows in $pages pages of $FEED_PAGE: changes() ${pe[*]} ms, range scan ${pb[*]} ms; in one call: changes() ${oe[*]} ms, range scan ${ob[*]} ms"
per_page() { awk -v a="$1" -v b="$2" -v n="$pages" 'BEGIN {printf "%.1f", (a - b) * 1000 / n}'; }
mpe=$(median "${pe[@]}"); mpb=$(median "${pb[@]}"); moe=$(median "${oe[@]}"); mob=$(median "${ob[@]}")
echo "  14a. per page (paged minus one call, over $pages pages): changes() $(per_page "$mpe" "$moe") us, range scan $(per_page "$mpb" "$mob") us; per row: changes() $(awk -v a="$mpe" -v n="$FEED_READ" 'BEGIN {printf "%.2f", a * 1000 / n}') us, range scan $(awk -v a="$mpb" -v n="$FEED_READ" 'BEGIN {printf "%.2f", a * 1000 / n}') us (paged)"
row "14a. changes() vs index range scan, pages of $FEED_PAGE" "$FEED_READ of $FEED_ROWS rows" "$mpe" "$mpb" ms time -
row "14a. changes() vs index range scan, one call" "$FEED_READ of $FEED_ROWS rows" "$moe" "$mob" ms time -

# 14b. one stable_horizon() call (pgbench, 1 client, cached plans) against
# SELECT now(), with this session alone and with IDLE_SESSIONS more connected
# (pgbench clients sleeping in pg_sleep(30), application_name bench_idle,
# terminated afterwards).  Microseconds per call, 1e6 / tps.
hz_ext=$(script horizon_ext "SELECT status_history.stable_horizon();")
hz_base=$(script horizon_base "SELECT now();")
us() { awk -v t="$1" 'BEGIN {printf "%.2f", 1e6 / t}'; }
hz_pair() {   # hz_pair LABEL: RUNS rounds of both sides, alternating
    local e=() b=() r
    for r in $(seq "$RUNS"); do
        if [ $((r % 2)) = 1 ]; then
            e+=("$(PGDATABASE=feed pgbench -n -M prepared -c 1 -T "$DURATION" -f "$hz_ext" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')")
            b+=("$(PGDATABASE=feed pgbench -n -M prepared -c 1 -T "$DURATION" -f "$hz_base" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')")
        else
            b+=("$(PGDATABASE=feed pgbench -n -M prepared -c 1 -T "$DURATION" -f "$hz_base" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')")
            e+=("$(PGDATABASE=feed pgbench -n -M prepared -c 1 -T "$DURATION" -f "$hz_ext" 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')")
        fi
    done
    echo "  14b. $1: stable_horizon() ${e[*]} tps, now() ${b[*]} tps"
    local me mb
    me=$(median "${e[@]}"); mb=$(median "${b[@]}")
    echo "  14b. $1: stable_horizon() $(us "$me") us per call, now() $(us "$mb") us, difference $(awk -v a="$me" -v b="$mb" 'BEGIN {printf "%.2f", 1e6 / a - 1e6 / b}') us"
    row "14b. stable_horizon() vs SELECT now() (latency), $1" "1 client" "$(us "$me")" "$(us "$mb")" us time -
    # The same per call without the client's round trip: HZ_LOOP calls in one
    # statement (count(f()) FROM generate_series), median of REPS, per call.
    local le=() lb=()
    for r in $(seq "$RUNS"); do
        if [ $((r % 2)) = 1 ]; then le+=("$(hz_loop "status_history.stable_horizon()")"); lb+=("$(hz_loop "now()")")
        else lb+=("$(hz_loop "now()")"); le+=("$(hz_loop "status_history.stable_horizon()")"); fi
    done
    echo "  14b. $1, $HZ_LOOP calls in one statement: stable_horizon() ${le[*]} us per call, now() ${lb[*]} us"
    row "14b. stable_horizon() vs now(), per call in one statement, $1" "$HZ_LOOP calls" "$(median "${le[@]}")" "$(median "${lb[@]}")" us time -
}
: "${HZ_LOOP:=100000}"
hz_loop() { fq "SELECT round((bench_median_stmt_ms('SELECT count($1) FROM generate_series(1, $HZ_LOOP)', $REPS) * 1000 / $HZ_LOOP)::numeric, 4)"; }
hz_pair "1 backend connected"
sleeper=$(script sleeper "SELECT pg_sleep(30);")
PGAPPNAME=bench_idle PGDATABASE=feed pgbench -n -c "$IDLE_SESSIONS" -j 2 -T 3600 -f "$sleeper" >/dev/null 2>&1 &
idle_pgbench=$!
for _ in $(seq 300); do
    [ "$(q "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'bench_idle'")" -lt "$IDLE_SESSIONS" ] || break
    sleep 0.1
done
echo "  14b. $(q "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'") client backends connected (with this query's), max_connections $(q "SHOW max_connections")"
hz_pair "$((IDLE_SESSIONS + 1)) backends connected"
kill "$idle_pgbench" 2>/dev/null || true
wait "$idle_pgbench" 2>/dev/null || true
q "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'bench_idle'" >/dev/null
q "DROP DATABASE feed WITH (FORCE)"
# 14c. the report path with the horizon's bookkeeping against without it
# cannot be switched off in one build: bench/compare.sh 06f162e HEAD (the
# commit before the change feed against it) measures it; see docs/BENCHMARKS.md.
row "14c. report() with horizon bookkeeping vs without: bench/compare.sh 06f162e HEAD" "-" "-" "-" "-" n/a ">= 0.97"
fi

# --- counts: the physical work per report (bench/counts.sh) ---------------------------
if want counts; then
source bench/counts.sh
fi

# --- the table ------------------------------------------------------------------------
echo
echo "| operation | size | extension | baseline | unit | ratio (ext/base) | target | met |"
echo "|---|---|---:|---:|---|---:|---|---|"
awk -F'\t' '{
    op = $1; size = $2; e = $3; b = $4; unit = $5; kind = $6; target = $7
    if (kind == "n/a") { printf "| %s | %s | - | - | - | - | %s | - |\n", op, size, target; next }
    if (kind == "value") { printf "| %s | %s | %s | - | %s | - | %s | - |\n", op, size, e, unit, target; next }
    if (kind == "count") { printf "| %s | %s | %s | - | %s | - | = %s | %s |\n", op, size, e, unit, target, (e == target) ? "yes" : "NO"; next }
    ratio = (b > 0) ? e / b : 0
    if (target == "-") { t = "-"; met = "-" }
    else if (kind == "rate") { t = ">= " target; met = (ratio >= target) ? "yes" : "NO" }
    else { t = "<= " target; met = (ratio <= target) ? "yes" : "NO" }
    printf "| %s | %s | %.1f | %.1f | %s | %.3f | %s | %s |\n", op, size, e, b, unit, ratio, t, met
}' "$results"
echo
if want mem; then
    echo "memory: latest() over $OBJECTS objects with work_mem 4MB: backend private memory +$((peak - idle)) kB over idle"
fi

# --- the chart ------------------------------------------------------------------------
# The rows are kept beside the chart (bench/chart.sh redraws it from them); no
# chart (no gnuplot) leaves the figures above as they are.
rows_tsv=${chart%.png}.tsv
mkdir -p "$(dirname "$chart")"
cp "$results" "$rows_tsv"
echo "results: $rows_tsv"
if bench/chart.sh "$rows_tsv" "$chart" \
       "status_history bench: $OBJECTS objects x $PER_OBJECT reports, bulk $BULK, pgbench ${DURATION}s x $RUNS runs, $(date -u +%F)"; then
    [ ! -e "$chart" ] || echo "chart: $chart"
else
    echo "chart: NOT written (see above); the figures are in the table above and in $rows_tsv"
fi
