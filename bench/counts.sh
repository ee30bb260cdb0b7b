# bench/counts.sh -- sourced by bench/run.sh for FIGURES=counts (issue 21):
# the physical work per report, counted rather than timed, so that it does
# not depend on a noisy machine.  For each workload, over its transactions:
#   WAL      records and bytes by record type: pg_waldump --stats=record over
#            the LSN range (pg_current_wal_insert_lsn() before and after);
#            record bytes and full-page-image bytes apart
#   buffers  heap + index block accesses (hit + read) of the user tables:
#            pg_statio_all_tables deltas (its idx_* columns are the tables'
#            indexes, so pg_statio_all_indexes adds nothing to the sum)
#   rows     row versions: pg_stat_all_tables n_tup_ins / n_tup_upd /
#            n_tup_hot_upd deltas
#   CPU      each backend's own CPU time (/proc/PID/schedstat, first field),
#            read by the backend itself before and after; the only figure
#            here that the machine's noise moves
# Workloads: report() one per transaction (1 client, then COUNT_CLIENTS
# sessions at once), a plain INSERT into a table with the same columns and
# one (object_id, occurred_at) index, and the same work written by hand
# (bench/setup.sql: hand_report(), figure 1's baseline) and as figure 1
# wrote it before issue 21 (one statement, no key row); reconnect() over every object against an
# INSERT ... SELECT of as many rows; a bulk INSERT ... SELECT into the
# history against the same into the plain table.  Sessions send prepared
# statements (PREPARE once, EXECUTE per transaction, autocommit), so no
# workload pays for planning per statement.  report() runs with
# status_history.deduplicate = off so that every report appends a row, as
# the baselines do.  Autovacuum is off while counting, so that no other
# process writes WAL into the range.
#
# Sizes: COUNT_OBJECTS objects (default OBJECTS), preloaded with
# COUNT_PER_OBJECT reports each (5) so that the counts are those of a steady
# state; COUNT_TX transactions per workload (10000), after COUNT_TX / 5 not
# counted (caches and plans warm, pages in memory); COUNT_BULK rows for the
# bulk figure (default BULK).
: "${COUNT_OBJECTS:=$OBJECTS}" "${COUNT_PER_OBJECT:=5}" "${COUNT_TX:=10000}" "${COUNT_CLIENTS:=$CLIENTS}"
: "${COUNT_BULK:=$BULK}"

cq() { PGDATABASE=counts q "$1"; }
q "CREATE DATABASE counts"
PGDATABASE=counts psql -X -q -v ON_ERROR_STOP=1 -f bench/setup.sql >/dev/null
echo "-- counts: $COUNT_OBJECTS objects x $COUNT_PER_OBJECT reports preloaded, $COUNT_TX transactions per workload"
cq "INSERT INTO status_history.history (object_id, status, replica_id)
    SELECT 'obj-' || (i % $COUNT_OBJECTS), $statuses[1 + (i / $COUNT_OBJECTS) % 5], 'r1'
      FROM generate_series(0, $COUNT_OBJECTS * $COUNT_PER_OBJECT - 1) AS i"
cq "INSERT INTO plain SELECT * FROM status_history.history"
cq "INSERT INTO hand_history SELECT * FROM status_history.history"
cq "INSERT INTO hand_objects SELECT * FROM status_history.objects"
cq "INSERT INTO hand_keys SELECT * FROM status_history.replica_state"
cq "VACUUM ANALYZE"
q "ALTER SYSTEM SET autovacuum = off"
q "SELECT pg_reload_conf()" >/dev/null
cq "CHECKPOINT"

counts_tsv="$work/counts.tsv"
: >"$counts_tsv"
cpu_now="SELECT split_part(pg_read_file('/proc/' || pg_backend_pid() || '/schedstat'), ' ', 1)"

# The user tables' counters, summed: "buffers ins upd hot".
stat_sums() {
    cq "SELECT coalesce(sum(coalesce(s.heap_blks_hit, 0) + coalesce(s.heap_blks_read, 0)
                            + coalesce(s.idx_blks_hit, 0) + coalesce(s.idx_blks_read, 0)
                            + coalesce(s.toast_blks_hit, 0) + coalesce(s.toast_blks_read, 0)
                            + coalesce(s.tidx_blks_hit, 0) + coalesce(s.tidx_blks_read, 0)), 0)
               || ' ' || coalesce(sum(t.n_tup_ins), 0) || ' ' || coalesce(sum(t.n_tup_upd), 0)
               || ' ' || coalesce(sum(t.n_tup_hot_upd), 0)
          FROM pg_statio_all_tables AS s JOIN pg_stat_all_tables AS t USING (relid)
         WHERE s.schemaname IN ('public', 'status_history')"
}
# Buffers per relation, for the breakdown: "rel=n ..." (heap+index, hit+read).
stat_rels() {
    cq "SELECT string_agg(relname || '=' || n, ' ' ORDER BY relname) FROM (
          SELECT s.relname, coalesce(s.heap_blks_hit, 0) + coalesce(s.heap_blks_read, 0)
                 + coalesce(s.idx_blks_hit, 0) + coalesce(s.idx_blks_read, 0) AS n
            FROM pg_statio_all_tables AS s WHERE s.schemaname IN ('public', 'status_history')) AS r"
}
wal_lsn() { cq "SELECT pg_current_wal_insert_lsn()"; }

# A session's SQL: PREPARE, then N transactions (EXECUTE with random
# arguments, seeded), its CPU printed before and after.
session_sql() {   # session_sql KIND N SEED
    local kind=$1 n=$2 seed=$3
    echo "$cpu_now;"
    case $kind in
        report) echo "SET status_history.deduplicate = off;"
                echo "PREPARE w(int, int) AS SELECT status_history.report('obj-' || \$1, $statuses[\$2], NULL, NULL, 'r1', 0);" ;;
        plain)  echo "PREPARE w(int, int) AS INSERT INTO plain (occurred_at, object_id, status, replica_id) VALUES (clock_timestamp(), 'obj-' || \$1, $statuses[\$2], 'r1');" ;;
        hand)   echo "PREPARE w(int, int) AS SELECT hand_report('obj-' || \$1, $statuses[\$2], 'r1');" ;;
        hand_old) echo "PREPARE w(int, int) AS $hand_old_sql;" ;;
    esac
    awk -v n="$n" -v seed="$seed" -v objs="$COUNT_OBJECTS" \
        'BEGIN {srand(seed); for (i = 0; i < n; i++) printf "EXECUTE w(%d, %d);\n", int(rand() * objs), 1 + int(rand() * 5)}'
    echo "$cpu_now;"
}
# Figure 1's "same work by hand" statement before issue 21 (no key row;
# figure 1 sent it with the simple protocol, here it is prepared).
hand_old_sql="WITH i AS (
    INSERT INTO hand_history (occurred_at, object_id, status, replica_id)
    VALUES (status_history.monotonic_now(), 'obj-' || \$1, $statuses[\$2], 'r1')
    RETURNING *)
UPDATE hand_objects AS o
   SET occurred_at = i.occurred_at, status = i.status, error = i.error, details = i.details,
       replica_id = i.replica_id, generation = i.generation, reported_at = i.reported_at,
       status_since = CASE WHEN o.status = i.status THEN o.status_since ELSE i.occurred_at END
  FROM i
 WHERE o.object_id = i.object_id"

# Run SESSIONS sessions of KIND at once, N transactions in all; prints the
# CPU nanoseconds they used, summed.
run_sessions() {   # run_sessions KIND N SESSIONS SEED
    local kind=$1 n=$2 sessions=$3 seed=$4 pids=() total=0
    for s in $(seq "$sessions"); do
        session_sql "$kind" $((n / sessions)) $((seed + s)) >"$work/count_$s.sql"
        PGDATABASE=counts psql -X -q -At -v ON_ERROR_STOP=1 -f "$work/count_$s.sql" >"$work/count_$s.out" &
        pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p"; done
    for s in $(seq "$sessions"); do
        total=$((total + $(tail -1 "$work/count_$s.out") - $(head -1 "$work/count_$s.out")))
    done
    echo "$total"
}

# WAL by record type between two LSNs, per unit: "type n bytes fpi" lines.
wal_types() {   # wal_types FROM TO UNITS
    # (wait until the range is flushed: synchronous_commit may be off)
    for _ in $(seq 50); do
        [ "$(cq "SELECT pg_current_wal_flush_lsn() >= '$2'")" = t ] && break
        sleep 0.1
    done
    as_pg "$pgbin/pg_waldump" --stats=record -p "$work/data/pg_wal" -s "$1" -e "$2" 2>/dev/null |
        awk -v u="$3" '$1 ~ /\// { gsub(/\([^)]*\)/, ""); split($0, f, " ");
                                   printf "%s %.2f %.1f %.1f\n", f[1], f[2] / u, f[3] / u, f[4] / u }'
}

# count LABEL UNITS UNIT CMD...: run CMD (which prints the CPU nanoseconds
# it used), count what it did, print and keep one row per unit.
count() {
    local label=$1 units=$2 unit=$3 l0 l1 s0 s1 cpu rels0 rels1
    shift 3
    rels0=$(stat_rels); s0=$(stat_sums); l0=$(wal_lsn)
    cpu=$("$@")
    l1=$(wal_lsn)
    # (the sessions flushed their statistics when they ended; a new session reads them)
    s1=$(stat_sums); rels1=$(stat_rels)
    local types recs bytes fpi
    types=$(wal_types "$l0" "$l1" "$units")
    recs=$(awk '{s += $2} END {printf "%.2f", s}' <<<"$types")
    bytes=$(awk '{s += $3} END {printf "%.0f", s}' <<<"$types")
    fpi=$(awk '{s += $4} END {printf "%.0f", s}' <<<"$types")
    read -r b0 i0 u0 h0 <<<"$s0"; read -r b1 i1 u1 h1 <<<"$s1"
    local per
    per() { awk -v a="$1" -v b="$2" -v u="$units" 'BEGIN {printf "%.2f", (b - a) / u}'; }
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$unit" "$recs" "$bytes" "$fpi" \
        "$(per "$b0" "$b1")" "$(per "$i0" "$i1")" "$(per "$u0" "$u1")" "$(per "$h0" "$h1")" \
        "$(awk -v c="$cpu" -v u="$units" 'BEGIN {printf "%.1f", c / 1000 / u}')" \
        "$(awk '$2 >= 0.005 {printf "%s %s; ", $1, $2}' <<<"$types")" >>"$counts_tsv"
    echo "  counts: $label: $recs WAL records, $bytes bytes (+$fpi FPI), $(per "$b0" "$b1") buffers per $unit"
    echo "    WAL by type per $unit: $(awk '$2 >= 0.005 {printf "%s %s (%s B); ", $1, $2, $3}' <<<"$types")"
    echo "    buffers by relation per $unit: $(awk -v u="$units" 'NR == FNR {for (i = 1; i <= NF; i++) {split($i, p, "="); a[p[1]] = p[2]}; next}
        {for (i = 1; i <= NF; i++) {split($i, p, "="); d = (p[2] - a[p[1]]) / u; if (d >= 0.005) printf "%s %.2f; ", p[1], d}}' \
        <(echo "$rels0") <(echo "$rels1"))"
}

# A statement in one session, with its CPU: prints the nanoseconds.
one_statement() {   # one_statement SQL
    printf '%s;\n%s;\n%s;\n' "$cpu_now" "$1" "$cpu_now" >"$work/count_stmt.sql"
    PGDATABASE=counts psql -X -q -At -v ON_ERROR_STOP=1 -f "$work/count_stmt.sql" >"$work/count_stmt.out"
    echo $(( $(tail -1 "$work/count_stmt.out") - $(head -1 "$work/count_stmt.out") ))
}

warm=$((COUNT_TX / 5))
for kind in report plain hand hand_old; do
    run_sessions "$kind" "$warm" 1 7 >/dev/null
done
for c in 1 "$COUNT_CLIENTS"; do
    count "report(), $c sessions" "$COUNT_TX" report run_sessions report "$COUNT_TX" "$c" $((100 * c))
    count "plain INSERT, $c sessions" "$COUNT_TX" report run_sessions plain "$COUNT_TX" "$c" $((100 * c))
    count "by hand (hand_report()), $c sessions" "$COUNT_TX" report run_sessions hand "$COUNT_TX" "$c" $((100 * c))
    count "by hand before issue 21 (one statement, no key row), $c sessions" "$COUNT_TX" report run_sessions hand_old "$COUNT_TX" "$c" $((100 * c))
done
count "reconnect() over every object" "$COUNT_OBJECTS" object \
    one_statement "SELECT count(*) FROM status_history.reconnect(1)"
count "INSERT ... SELECT of as many rows (reconnect's baseline)" "$COUNT_OBJECTS" object \
    one_statement "INSERT INTO plain (occurred_at, object_id, status, replica_id, generation) SELECT clock_timestamp(), object_id, status, replica_id, 1 FROM status_history.objects"
count "bulk INSERT ... SELECT into the history" "$COUNT_BULK" row \
    one_statement "INSERT INTO status_history.history (object_id, status, replica_id, generation) SELECT 'obj-' || (i % $COUNT_OBJECTS), $statuses[1 + (i / $COUNT_OBJECTS) % 5], 'r1', 1 FROM generate_series(0, $COUNT_BULK - 1) AS i"
count "bulk INSERT ... SELECT into plain" "$COUNT_BULK" row \
    one_statement "INSERT INTO plain (occurred_at, object_id, status, replica_id, generation) SELECT clock_timestamp(), 'obj-' || (i % $COUNT_OBJECTS), $statuses[1 + (i / $COUNT_OBJECTS) % 5], 'r1', 1 FROM generate_series(0, $COUNT_BULK - 1) AS i"
count "bulk INSERT ... SELECT into the history, new objects" "$COUNT_BULK" row \
    one_statement "INSERT INTO status_history.history (object_id, status, replica_id, generation) SELECT 'new-' || (i % $COUNT_OBJECTS), $statuses[1 + (i / $COUNT_OBJECTS) % 5], 'r1', 1 FROM generate_series(0, $COUNT_BULK - 1) AS i"
count "bulk INSERT ... SELECT into plain, new objects" "$COUNT_BULK" row \
    one_statement "INSERT INTO plain (occurred_at, object_id, status, replica_id, generation) SELECT clock_timestamp(), 'new-' || (i % $COUNT_OBJECTS), $statuses[1 + (i / $COUNT_OBJECTS) % 5], 'r1', 1 FROM generate_series(0, $COUNT_BULK - 1) AS i"
# COPY, rows made by a program on the server (the same rows as above, into existing objects).
copy_rows="awk 'BEGIN {split(\"starting running paused stalled ceased\", s, \" \"); for (i = 0; i < $COUNT_BULK; i++) printf \"obj-%d\\t%s\\tr1\\t1\\n\", i % $COUNT_OBJECTS, s[1 + int(i / $COUNT_OBJECTS) % 5]}'"
count "COPY into the history" "$COUNT_BULK" row \
    one_statement "COPY status_history.history (object_id, status, replica_id, generation) FROM PROGRAM \$\$$copy_rows\$\$"
count "COPY into plain (occurred_at by its default, clock_timestamp())" "$COUNT_BULK" row \
    one_statement "ALTER TABLE plain ALTER COLUMN occurred_at SET DEFAULT clock_timestamp(); COPY plain (object_id, status, replica_id, generation) FROM PROGRAM \$\$$copy_rows\$\$"

q "ALTER SYSTEM RESET autovacuum"
q "SELECT pg_reload_conf()" >/dev/null
q "DROP DATABASE counts"

echo
echo "Counts ($COUNT_OBJECTS objects x $COUNT_PER_OBJECT preloaded; $COUNT_TX transactions per workload, prepared statements, one per transaction; synchronous_commit $(q "SHOW synchronous_commit"))"
echo
echo "| workload | per | WAL records | WAL bytes | FPI bytes | buffers (heap+index, hit+read) | rows inserted | rows updated | of them HOT | backend CPU, us |"
echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10}' "$counts_tsv"
echo
echo "WAL records by type (per unit):"
awk -F'\t' '{printf "- %s: %s\n", $1, $11}' "$counts_tsv"
echo
