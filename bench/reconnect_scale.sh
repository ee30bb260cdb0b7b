#!/usr/bin/env bash
# bench/reconnect_scale.sh N CACHE...: reconnect() per object over N objects
# (issue 21, the cliff above status_history.cache_max_objects).  Loads N
# objects with one report each into a database "reconnect_scale" (dropped
# first) on the server PGHOST/PGPORT/PGUSER name, then runs one reconnect()
# over all of them per CACHE given (cache_max_objects = CACHE; generation 1,
# 2, ...), each in its own session, and prints per object: the backend's CPU
# (/proc/PID/schedstat), the wall time, WAL bytes (insert LSN), row versions
# updated and buffer accesses (pg_stat / pg_statio deltas of the extension's
# tables).  Counts do not depend on the machine's noise; CPU and wall do.
#
#   PGHOST=/tmp/dev PGPORT=55432 PGUSER=postgres bench/reconnect_scale.sh 1000000 2000000 262144
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/reconnect_scale.sh N CACHE..." >&2; exit 2; }
P=(psql -X -q -At -v ON_ERROR_STOP=1)
N=$1; shift
"${P[@]}" -d postgres -c "DROP DATABASE IF EXISTS reconnect_scale" -c "CREATE DATABASE reconnect_scale" 2>/dev/null
P+=(-d reconnect_scale)
"${P[@]}" -c "CREATE EXTENSION status_history" \
    -c "INSERT INTO status_history.history (object_id, status, replica_id) SELECT 'o' || i, 'running', 'r1' FROM generate_series(1, $N) AS i" \
    -c "VACUUM ANALYZE"
st="SELECT sum(n_tup_upd) || ' ' || (SELECT sum(heap_blks_hit + heap_blks_read + coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0))
                                       FROM pg_statio_all_tables WHERE schemaname = 'status_history')
      FROM pg_stat_all_tables WHERE schemaname = 'status_history'"
probe="SELECT split_part(pg_read_file('/proc/' || pg_backend_pid() || '/schedstat'), ' ', 1),
              extract(epoch FROM clock_timestamp()), pg_current_wal_insert_lsn() - '0/0'::pg_lsn"
g=0
for C in "$@"; do
    g=$((g + 1))
    read -r u0 b0 <<<"$("${P[@]}" -c "$st")"
    out=$("${P[@]}" -F ' ' -c "SET status_history.cache_max_objects = $C" -c "$probe" \
              -c "SELECT count(*) FROM status_history.reconnect($g)" -c "$probe")
    sleep 1   # (the session's statistics are flushed when it ends)
    read -r u1 b1 <<<"$("${P[@]}" -c "$st")"
    read -r c0 t0 l0 rows c1 t1 l1 <<<"$(echo $out)"
    awk -v n="$N" -v c="$C" -v g="$g" -v rows="$rows" -v c0="$c0" -v c1="$c1" -v t0="$t0" -v t1="$t1" \
        -v l0="$l0" -v l1="$l1" -v u0="$u0" -v u1="$u1" -v b0="$b0" -v b1="$b1" 'BEGIN {
        printf "%d objects, cache_max_objects %d, generation %d, %d copies: CPU %.1f us/object, wall %.1f s, WAL %.0f B/object, rows updated %.2f/object, buffers %.2f/object\n",
               n, c, g, rows, (c1 - c0) / 1000 / n, t1 - t0, (l1 - l0) / n, (u1 - u0) / n, (b1 - b0) / n }'
done
