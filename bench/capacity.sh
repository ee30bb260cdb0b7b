#!/usr/bin/env bash
# bench/capacity.sh: how many reports per second one primary takes on this
# machine, the extension and a plain table side by side, and what runs out
# first.  Throw-away cluster under /tmp (as postgres when run as root), unix
# socket only; every pgbench run lasts DURATION seconds; one run per figure
# (no medians: this is a capacity survey, see docs/BENCHMARKS.md for spread).
#
#   bench/capacity.sh                 # about 4 minutes on 2 cores
#   DURATION=10 bench/capacity.sh     # longer runs
#   STANDBY=0 bench/capacity.sh       # without the hot-standby read figure
#
# Baseline: CREATE TABLE base (LIKE status_history.history), an index on
# (object_id, occurred_at DESC), stamps from clock_timestamp().
set -euo pipefail
cd "$(dirname "$0")/.."
source test/deps.sh
sh_build_install

: "${DURATION:=5}" "${OBJECTS:=10000}" "${BATCHES:=200}" "${STANDBY:=1}"
port=54350 sport=54351

work=$(mktemp -d /tmp/status_history_capacity.XXXXXX)
chmod 755 "$work"
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" -eq 0 ] && chown postgres "$work"
stop() {
    as_pg pg_ctl -D "$work/standby" -m immediate stop >/dev/null 2>&1 || true
    as_pg pg_ctl -D "$work/data" -m fast stop >/dev/null 2>&1 || true
    [ -n "${BENCH_KEEP:-}" ] || rm -rf "$work"
}
trap stop EXIT
as_pg initdb -D "$work/data" -A trust >/dev/null
# Durable defaults (synchronous_commit = on, fsync on); "sync off" runs set
# synchronous_commit = off per session.
cat >>"$work/data/postgresql.conf" <<EOF
listen_addresses = ''
port = $port
unix_socket_directories = '$work'
max_connections = 100
shared_buffers = '2GB'
max_wal_size = '16GB'
checkpoint_timeout = '30min'
work_mem = '4MB'
hot_standby_feedback = on
EOF
as_pg pg_ctl -D "$work/data" -l "$work/server.log" -w start >/dev/null
export PGHOST="$work" PGPORT=$port PGUSER=postgres PGDATABASE=postgres
q() { psql -X -q -At -v ON_ERROR_STOP=1 -c "$1"; }

statuses="(ARRAY['starting','running','paused','stalled','ceased'])"
# Object ids sort like their numbers ('o000042'), so a batch over a range of
# consecutive objects locks them in one order and batches never deadlock.
oid() { echo "'o' || lpad(($1)::text, 6, '0')"; }

psql -X -q -v ON_ERROR_STOP=1 >/dev/null <<EOF
CREATE EXTENSION status_history;
CREATE TABLE base (LIKE status_history.history);
ALTER TABLE base ALTER occurred_at SET DEFAULT clock_timestamp(),
                 ALTER stale SET DEFAULT false,
                 ALTER generation SET DEFAULT 0;
CREATE INDEX base_object_idx ON base (object_id, occurred_at DESC);
-- Wait events of active backends, sampled every 50 ms from one session.
CREATE FUNCTION sample_waits(seconds float8) RETURNS TABLE (wait text, share numeric)
LANGUAGE plpgsql AS \$\$
DECLARE n int := 0;
BEGIN
    CREATE TEMP TABLE IF NOT EXISTS w (wait text);
    TRUNCATE w;
    WHILE n < seconds * 20 LOOP
        PERFORM pg_stat_clear_snapshot();
        INSERT INTO w SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU')
          FROM pg_stat_activity
         WHERE state = 'active' AND backend_type = 'client backend' AND pid <> pg_backend_pid();
        PERFORM pg_sleep(0.05);
        n := n + 1;
    END LOOP;
    RETURN QUERY SELECT w.wait, round(100.0 * count(*) / sum(count(*)) OVER (), 0)
                   FROM w GROUP BY 1 ORDER BY 2 DESC LIMIT 4;
END \$\$;
EOF
echo "== loading $OBJECTS objects x 5 reports into each"
q "INSERT INTO status_history.history (object_id, status, replica_id)
   SELECT $(oid "i % $OBJECTS"), ${statuses}[1 + (i / $OBJECTS) % 5], 'r1' FROM generate_series(0, 5 * $OBJECTS - 1) i"
q "INSERT INTO base (object_id, status, replica_id)
   SELECT $(oid "i % $OBJECTS"), ${statuses}[1 + (i / $OBJECTS) % 5], 'r1' FROM generate_series(0, 5 * $OBJECTS - 1) i"
q "VACUUM ANALYZE"
q "CHECKPOINT"

results="$work/results.tsv"
: >"$results"
row() {   # row WHAT CLIENTS SYNC EXT BASE UNIT NOTE
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$results"
    printf '  %-46s %3s %-4s %10s %10s %-9s %s\n' "$@"
}
script() { printf '%s\n' "$2" >"$work/$1.sql"; echo "$work/$1.sql"; }
# tps CLIENTS SCRIPT [HOST PORT]: pgbench's tps (excluding nothing: -n, no vacuum)
tps() {
    local c=$1 f=$2 j=$(( $1 < 2 ? 1 : 2 ))
    pgbench -n -c "$c" -j "$j" -T "$DURATION" -h "${3:-$PGHOST}" -p "${4:-$PGPORT}" -f "$f" 2>"$work/pgbench.err" \
        | sed -n 's/^tps = \([0-9.]*\).*/\1/p' | awk '{printf "%.0f", $1}'
    if grep -q 'error\|abort' "$work/pgbench.err"; then echo "pgbench failed on $f:" >&2; head -3 "$work/pgbench.err" >&2; fi
}
# CPU use (vmstat us+sy, wa) and the top wait events while a command runs.
sampled() {   # sampled LABEL CMD...: runs CMD, prints its output, logs samples
    local label=$1; shift
    vmstat 1 "$DURATION" >"$work/vmstat" &
    local vm=$!
    q "SELECT string_agg(wait || ' ' || share || '%', ', ') FROM sample_waits($DURATION - 1)" >"$work/waits" &
    local sw=$!
    "$@"
    wait "$vm" "$sw" || true
    local cpu
    cpu=$(awk 'NR > 3 {us += $13; sy += $14; id += $15; wa += $16; n++}
               END {if (n) printf "cpu us+sy %d%%, idle %d%%, iowait %d%%", (us + sy) / n, id / n, wa / n}' "$work/vmstat")
    printf '%s: %s; waits: %s\n' "$label" "$cpu" "$(cat "$work/waits")" >>"$work/samples"
}

echo "== reports/s, pgbench ${DURATION}s per run"
# --- one report per transaction ------------------------------------------------
ext=$(script one_ext "\\set obj random(0, $((OBJECTS - 1)))
\\set st random(1, 5)
SELECT status_history.report($(oid ":obj"), ${statuses}[:st], NULL, NULL, 'r1', 0);")
base=$(script one_base "\\set obj random(0, $((OBJECTS - 1)))
\\set st random(1, 5)
INSERT INTO base (object_id, status, replica_id) VALUES ($(oid ":obj"), ${statuses}[:st], 'r1');")
for sync in on off; do
    for c in 1 8 32; do
        e='' b=''
        sampled "one report/tx, $c clients, sync $sync, extension" \
            eval 'e=$(PGOPTIONS="-c synchronous_commit=$sync" tps "$c" "$ext")'
        sampled "one report/tx, $c clients, sync $sync, baseline" \
            eval 'b=$(PGOPTIONS="-c synchronous_commit=$sync" tps "$c" "$base")'
        row "one report per transaction" "$c" "$sync" "$e" "$b" "reports/s" "report() vs INSERT"
    done
done

# --- 100 reports per statement -----------------------------------------------------
# 100 consecutive objects from a random start, in id order.
ins_ext=$(script ins_ext "\\set s random(0, $((OBJECTS - 100)))
INSERT INTO status_history.history (object_id, status, replica_id)
SELECT $(oid ":s + i"), ${statuses}[1 + (:s + i) % 5], 'r1' FROM generate_series(0, 99) i;")
ins_base=$(script ins_base "\\set s random(0, $((OBJECTS - 100)))
INSERT INTO base (object_id, status, replica_id)
SELECT $(oid ":s + i"), ${statuses}[1 + (:s + i) % 5], 'r1' FROM generate_series(0, 99) i;")
many_ext=$(script many_ext "\\set s random(0, $((OBJECTS - 100)))
SELECT count(*) FROM status_history.report_many(
  ARRAY(SELECT $(oid ":s + i") FROM generate_series(0, 99) i),
  ARRAY(SELECT ${statuses}[1 + (:s + i) % 5] FROM generate_series(0, 99) i),
  replica_ids => array_fill('r1'::text, ARRAY[100]));")
for c in 1 8; do
    e=$(tps "$c" "$ins_ext"); b=$(tps "$c" "$ins_base")
    row "100 per statement: INSERT ... SELECT" "$c" on "$((e * 100))" "$((b * 100))" "reports/s" "statements/s x 100"
    e=$(tps "$c" "$many_ext")
    row "100 per statement: report_many()" "$c" on "$((e * 100))" "-" "reports/s" "statements/s x 100"
done

# COPY of 100 rows: pgbench cannot COPY, so each client is a psql running a
# file of BATCHES "COPY ... FROM STDIN" statements of 100 rows each (data
# inline, each COPY its own transaction); reports/s = rows / wall time.
copy_file() {   # copy_file TABLE CLIENT
    awk -v t="$1" -v n="$OBJECTS" -v b="$BATCHES" -v seed="$2" 'BEGIN {
        srand(seed); split("starting running paused stalled ceased", st, " ")
        for (k = 0; k < b; k++) {
            s = int(rand() * (n - 100))
            print "COPY " t " (object_id, status, replica_id) FROM STDIN;"
            for (i = 0; i < 100; i++) printf "o%06d\t%s\tr1\n", s + i, st[1 + (s + i) % 5]
            print "\\."
        }
    }' >"$work/copy_$1_$2.sql"
}
copy_rate() {   # copy_rate TABLE CLIENTS -> reports/s
    local t0 t1 i
    for i in $(seq "$2"); do copy_file "$1" "$i"; done
    t0=$(date +%s.%N)
    for i in $(seq "$2"); do psql -X -q -v ON_ERROR_STOP=1 -f "$work/copy_$1_$i.sql" >/dev/null & done
    wait
    t1=$(date +%s.%N)
    awk -v r=$(( $2 * BATCHES * 100 )) -v a="$t0" -v b="$t1" 'BEGIN {printf "%.0f", r / (b - a)}'
}
for c in 1 8; do
    e=$(copy_rate status_history.history "$c"); b=$(copy_rate base "$c")
    row "100 per statement: COPY FROM STDIN" "$c" on "$e" "$b" "reports/s" "$((c * BATCHES)) COPYs of 100 rows, psql"
done

# --- point reads of the current status while 8 reporters write --------------------
read_ext=$(script read_ext "\\set obj random(0, $((OBJECTS - 1)))
SELECT * FROM status_history.statuses WHERE object_id = $(oid ":obj");")
read_base=$(script read_base "\\set obj random(0, $((OBJECTS - 1)))
SELECT * FROM base WHERE object_id = $(oid ":obj") ORDER BY occurred_at DESC LIMIT 1;")
e=$(tps 8 "$read_ext"); b=$(tps 8 "$read_base")
row "point reads of the current status, alone" 8 - "$e" "$b" "reads/s" "statuses vs ORDER BY ... LIMIT 1"
mixed() {   # mixed READ WRITE [HOST PORT] -> "reads writes"
    tps 8 "$2" >"$work/w.tps" &
    local w=$!
    local r
    r=$(tps 8 "$1" "${3:-$PGHOST}" "${4:-$PGPORT}")
    wait "$w"
    echo "$r $(cat "$work/w.tps")"
}
read -r er ew <<<"$(mixed "$read_ext" "$ext")"
read -r br bw <<<"$(mixed "$read_base" "$base")"
row "point reads, while 8 reporters write" 8 on "$er" "$br" "reads/s" "statuses vs ORDER BY ... LIMIT 1"
row "  ... the 8 reporters meanwhile" 8 on "$ew" "$bw" "reports/s" "report() vs INSERT"

# --- one hot object -------------------------------------------------------------------
hot_ext=$(script hot_ext "\\set st random(1, 5)
SELECT status_history.report('hot', ${statuses}[:st], NULL, NULL, 'r1', 0);")
hot_base=$(script hot_base "\\set st random(1, 5)
INSERT INTO base (object_id, status, replica_id) VALUES ('hot', ${statuses}[:st], 'r1');")
for sync in on off; do
    e='' b=''
    sampled "hot object, 8 clients, sync $sync, extension" \
        eval 'e=$(PGOPTIONS="-c synchronous_commit=$sync" tps 8 "$hot_ext")'
    b=$(PGOPTIONS="-c synchronous_commit=$sync" tps 8 "$hot_base")
    row "one hot object, one report per transaction" 8 "$sync" "$e" "$b" "reports/s" "report() vs INSERT"
done

# --- the same point reads on a streaming hot standby ------------------------------
if [ "$STANDBY" = 1 ]; then
    as_pg pg_basebackup -h "$work" -p "$port" -U postgres -D "$work/standby" -R -X stream -c fast
    cat >>"$work/standby/postgresql.conf" <<EOF
port = $sport
EOF
    as_pg pg_ctl -D "$work/standby" -l "$work/standby.log" -w start >/dev/null
    until [ "$(psql -X -At -p $sport -c 'SELECT pg_is_in_recovery()')" = t ]; do sleep 0.2; done
    e=$(tps 8 "$read_ext" "$work" "$sport"); b=$(tps 8 "$read_base" "$work" "$sport")
    row "point reads on a hot standby, alone" 8 - "$e" "$b" "reads/s" "statuses vs ORDER BY ... LIMIT 1"
    read -r er ew <<<"$(mixed "$read_ext" "$ext" "$work" "$sport")"
    read -r br bw <<<"$(mixed "$read_base" "$base" "$work" "$sport")"
    row "point reads on the standby, 8 reporters on primary" 8 on "$er" "$br" "reads/s" "same machine: they share the 2 cores"
    row "  ... the 8 reporters meanwhile" 8 on "$ew" "$bw" "reports/s" "report() vs INSERT, async standby"
    lag=$(q "SELECT coalesce(max(pg_wal_lsn_diff(sent_lsn, replay_lsn)), 0) FROM pg_stat_replication")
    echo "  standby replay lag at the end: $lag bytes"
fi

rows=$(q "SELECT count(*) || ' rows, ' || pg_total_relation_size('status_history.history') / count(*) || ' bytes per row with its 3 indexes' FROM status_history.history")
brows=$(q "SELECT count(*) || ' rows, ' || pg_total_relation_size('base') / count(*) || ' bytes per row with its index' FROM base")
objs=$(q "SELECT pg_total_relation_size('status_history.objects') / count(*) || ' bytes per object' FROM status_history.objects")
echo "  history at the end: $rows; base: $brows; status_history.objects: $objs"

# --- the table --------------------------------------------------------------------------
echo
echo "| workload | clients | synchronous_commit | extension | baseline | unit | ext/base | note |"
echo "|---|---:|---|---:|---:|---|---:|---|"
awk -F'\t' '{
    r = ($5 > 0 && $4 != "-") ? sprintf("%.2f", $4 / $5) : "-"
    printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, r, $7
}' "$results"
echo
echo "Sampled during the runs (vmstat every 1 s; wait events of active client backends every 50 ms):"
sed 's/^/  /' "$work/samples"
