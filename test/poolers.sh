#!/usr/bin/env bash
# make poolers: status_history through Debian's pgbouncer (transaction and
# session pooling), and what a database owner who is not a superuser can do
# after a superuser ran CREATE EXTENSION (docs/POOLERS.md, docs/HOSTING.md).
# A throw-away server on port 56150 and pgbouncer on 56151, both run as the
# postgres user from a temporary directory.  Prints PASS/FAIL per check and
# exits non-zero on any failure.  Runs as root (apt, runuser).  KEEP=1 leaves
# the server, pgbouncer and the temporary directory for a look afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
source test/deps.sh
PGPORT_SRV=56150
PGB_PORT=56151
BIN=/usr/lib/postgresql/15/bin

# Debian's package starts a system pgbouncer on 6432: we use our own.
if command -v systemctl >/dev/null && systemctl is-active -q pgbouncer 2>/dev/null; then
    systemctl stop pgbouncer; systemctl disable -q pgbouncer 2>/dev/null || true
elif [ -x /etc/init.d/pgbouncer ] && pgrep -u postgres -x pgbouncer >/dev/null; then
    /etc/init.d/pgbouncer stop >/dev/null || true     # no systemd (a container)
fi

T=$(mktemp -d /tmp/poolers.XXXXXX)
chmod 755 "$T"
chown postgres "$T"
as_pg() { runuser -u postgres -- "$@"; }
cleanup() {
    [ -f "$T/pgbouncer.pid" ] && kill "$(cat "$T/pgbouncer.pid")" 2>/dev/null || true
    as_pg "$BIN/pg_ctl" -D "$T/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$T"
}
[ -n "${KEEP:-}" ] || trap cleanup EXIT

sh_scratch_server "$T/data" "$PGPORT_SRV" 'max_connections = 40'

# Direct to the server (as the superuser postgres) and through pgbouncer.
srv() { as_pg psql -X -q -At -h 127.0.0.1 -p $PGPORT_SRV -d "${DB:-db}" -v ON_ERROR_STOP=1 "$@"; }
pgb() { local d=$1; shift; as_pg psql -X -q -At -h 127.0.0.1 -p $PGB_PORT -d "$d" -v ON_ERROR_STOP=1 "$@"; }

srv -d postgres -c "CREATE DATABASE db"
srv -c "CREATE EXTENSION status_history" \
    -c "GRANT INSERT ON status_history.history TO PUBLIC" \
    -c "CREATE TABLE seen (pid int, client int)" \
    -c "CREATE TABLE feed (LIKE status_history.history)"

# The pgbouncer config: three entries for one database.
#   tp: transaction pooling, 2 server connections for everyone (the default);
#   one: transaction pooling with a single server connection, so that which
#        client gets which backend is certain;
#   sp: session pooling.
cat >"$T/userlist.txt" <<EOF
"postgres" ""
EOF
cat >"$T/pgbouncer.ini" <<EOF
[databases]
tp  = host=127.0.0.1 port=$PGPORT_SRV dbname=db
one = host=127.0.0.1 port=$PGPORT_SRV dbname=db pool_size=1
sp  = host=127.0.0.1 port=$PGPORT_SRV dbname=db pool_mode=session

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir =
auth_type = trust
auth_file = $T/userlist.txt
pool_mode = transaction
default_pool_size = 2
max_client_conn = 100
logfile = $T/pgbouncer.log
pidfile = $T/pgbouncer.pid
admin_users = postgres
EOF
chown postgres "$T"/*.ini "$T"/userlist.txt
as_pg pgbouncer -d -q "$T/pgbouncer.ini"
for _ in $(seq 50); do pgb tp -c "SELECT 1" >/dev/null 2>&1 && break; sleep 0.2; done

fails=0
check() {   # check NAME EXPECTED ACTUAL
    if [ "$2" = "$3" ]; then echo "PASS $1"
    else echo "FAIL $1: expected [$2], got [$3]"; fails=$((fails + 1)); fi
}

# ---- 1. report() with a lease from 6 concurrent clients over 2 server connections
cat >"$T/report.sql" <<'EOF'
\set o random(1, 20)
BEGIN;
INSERT INTO seen VALUES (pg_backend_pid(), :client_id);
SELECT status FROM status_history.report('obj-' || :o, CASE WHEN random() < 0.5 THEN 'running' ELSE 'stalled' END,
       replica_id => 'r' || :client_id, generation => 1, lease => interval '1 hour');
COMMIT;
EOF
chown postgres "$T/report.sql"
as_pg pgbench -n -M simple -h 127.0.0.1 -p $PGB_PORT -c 6 -j 2 -t 50 -f "$T/report.sql" tp >"$T/pgbench1.log" 2>&1 \
    || { cat "$T/pgbench1.log"; check "pgbench report() through transaction pooling" ok failed; }
check "report(): 6 clients, 300 transactions" "6 300" "$(srv -F' ' -c "SELECT count(DISTINCT client), count(*) FROM seen")"
check "report(): clients shared at most 2 server connections" t "$(srv -c "SELECT count(DISTINCT pid) <= 2 FROM seen")"
check "report(): every key got its lease (expires_at about 1 h ahead)" t \
    "$(srv -c "SELECT count(*) > 0 AND bool_and(expires_at > now() + interval '59 minutes') FROM status_history.replica_state WHERE object_id LIKE 'obj-%'")"
check "report(): rows stored, none stale" "t 0" \
    "$(srv -F' ' -c "SELECT count(*) > 20, count(*) FILTER (WHERE stale) FROM status_history.history WHERE object_id LIKE 'obj-%'")"

# ---- 2. SET LOCAL of the extension's settings inside a transaction
cat >"$T/dedup.sql" <<'EOF'
BEGIN;
SET LOCAL status_history.deduplicate = off;
SELECT status FROM status_history.report('dup', 'running', generation => 1);
COMMIT;
EOF
chown postgres "$T/dedup.sql"
as_pg pgbench -n -M simple -h 127.0.0.1 -p $PGB_PORT -c 4 -j 2 -t 25 -f "$T/dedup.sql" tp >"$T/pgbench2.log" 2>&1 \
    || { cat "$T/pgbench2.log"; check "pgbench SET LOCAL deduplicate" ok failed; }
check "SET LOCAL deduplicate = off: 100 equal reports, 100 rows" 100 \
    "$(srv -c "SELECT count(*) FROM status_history.history WHERE object_id = 'dup'")"
for _ in 1 2 3 4; do pgb tp -c "SELECT status FROM status_history.report('dup', 'running', generation => 1)" >/dev/null; done
check "SET LOCAL did not leak: later repeats through the pool append nothing" 100 \
    "$(srv -c "SELECT count(*) FROM status_history.history WHERE object_id = 'dup'")"

# ---- 3. reconnect() through the pooler fences the reporters of generation 1
pgb tp -c "SELECT count(*) FROM status_history.reconnect(2, NULL, ARRAY(SELECT 'obj-' || g FROM generate_series(1, 20) g))" >/dev/null
check "reconnect(2, objects) through transaction pooling: fences at 2" "20 2" \
    "$(srv -F' ' -c "SELECT count(*), min(fence) FROM status_history.objects WHERE object_id LIKE 'obj-%'")"
srv -c "CREATE TABLE mark AS SELECT status_history.monotonic_now() AS t"
as_pg pgbench -n -M simple -h 127.0.0.1 -p $PGB_PORT -c 6 -j 2 -t 20 -f "$T/report.sql" tp >"$T/pgbench3.log" 2>&1 \
    || { cat "$T/pgbench3.log"; check "pgbench reports after reconnect" ok failed; }
check "reports of generation 1 after reconnect(2) are all stale" "0" \
    "$(srv -c "SELECT count(*) FILTER (WHERE NOT stale) FROM status_history.history h, mark WHERE object_id LIKE 'obj-%' AND generation = 1 AND occurred_at > mark.t")"
check "statuses: every object's current report is of generation 2" "2 2" \
    "$(srv -F' ' -c "SELECT min(generation), max(generation) FROM status_history.statuses WHERE object_id LIKE 'obj-%'")"
# notice_stale with SET LOCAL: this client sees the NOTICE, the next one not.
out=$(pgb one -c "BEGIN" -c "SET LOCAL status_history.notice_stale = on" \
      -c "SELECT status FROM status_history.report('obj-1', 'ceased', generation => 1)" -c "COMMIT" 2>&1)
check "SET LOCAL notice_stale = on: a stale report raises a NOTICE" yes "$(grep -q NOTICE <<<"$out" && echo yes || echo no)"
out=$(pgb one -c "SELECT status FROM status_history.report('obj-1', 'paused', generation => 1)" 2>&1)
check "SET LOCAL notice_stale did not leak to the next client" no "$(grep -q NOTICE <<<"$out" && echo yes || echo no)"
# reconnect() without objects must start its transaction (25001), alone it works.
out=$(pgb tp -v VERBOSITY=verbose -c "BEGIN" -c "SELECT status FROM status_history.report('obj-1', 'running', generation => 2)" \
      -c "SELECT count(*) FROM status_history.reconnect(3)" -c "COMMIT" 2>&1 || true)
check "reconnect(3) without objects after a report in its transaction: 25001" 25001 \
    "$(grep -o '^ERROR:  [0-9A-Z]\{5\}' <<<"$out" | cut -c9-)"
pgb tp -c "SELECT count(*) FROM status_history.reconnect(3)" >/dev/null
check "reconnect(3) without objects as its own transaction: floor at 3" 3 \
    "$(srv -c "SELECT max(generation) FROM status_history.floors")"

# ---- 4. a changes() consumer polling through the pooler while 4 clients report
cat >"$T/gen3.sql" <<'EOF'
\set o random(1, 50)
SELECT status FROM status_history.report('feed-' || :o, CASE WHEN random() < 0.5 THEN 'running' ELSE 'stalled' END, generation => 3);
EOF
chown postgres "$T/gen3.sql"
as_pg pgbench -n -M simple -h 127.0.0.1 -p $PGB_PORT -c 4 -j 2 -t 150 -f "$T/gen3.sql" tp >"$T/pgbench4.log" 2>&1 &
bench=$!
poll="INSERT INTO feed SELECT * FROM status_history.changes((SELECT max(occurred_at) FROM feed), 40)"
while kill -0 $bench 2>/dev/null; do pgb tp -c "$poll" >/dev/null; done
wait $bench || { cat "$T/pgbench4.log"; check "pgbench during changes()" ok failed; }
for _ in $(seq 200); do   # drain: until a poll returns nothing
    [ "$(pgb tp -c "WITH i AS ($poll RETURNING 1) SELECT count(*) FROM i")" = 0 ] && break
done
check "changes() loop through transaction pooling: every row once" "t t" \
    "$(srv -F' ' -c "SELECT (SELECT count(*) FROM feed) = (SELECT count(*) FROM status_history.history),
                            (SELECT count(DISTINCT (occurred_at, object_id)) FROM feed) = (SELECT count(*) FROM feed)")"

# ---- 5. a session SET leaks to the next client of the server connection
pgb one -c "SET status_history.deduplicate = off" >/dev/null
check "session SET through transaction pooling leaks to another client" off \
    "$(pgb one -c "SHOW status_history.deduplicate")"
n0=$(srv -c "SELECT count(*) FROM status_history.history WHERE object_id = 'dup'")
pgb one -c "SELECT status FROM status_history.report('dup', 'running', generation => 3)" >/dev/null
pgb one -c "SELECT status FROM status_history.report('dup', 'running', generation => 3)" >/dev/null
check "... and that client's repeats append rows (2 reports, 2 rows)" 2 \
    "$(srv -c "SELECT count(*) - $n0 FROM status_history.history WHERE object_id = 'dup'")"
pgb one -c "RESET status_history.deduplicate" >/dev/null
check "session pooling: a session SET stays in its session" on \
    "$(pgb sp -c "SET status_history.deduplicate = off" >/dev/null; pgb sp -c "SELECT current_setting('status_history.deduplicate') FROM status_history.stable_horizon()")"

# ---- 6. LISTEN: transaction pooling misdelivers, session pooling delivers
listen() {   # listen DB OUTFILE: a psql that LISTENs, fed through fd 3
    rm -f "$T/fifo"; mkfifo "$T/fifo"; chown postgres "$T/fifo"
    as_pg psql -X -h 127.0.0.1 -p $PGB_PORT -d "$1" <"$T/fifo" >"$2" 2>&1 &
    lpid=$!
    exec 3>"$T/fifo"
    echo "LISTEN status_history;" >&3
    for _ in $(seq 100); do grep -q '^LISTEN' "$2" 2>/dev/null && break; sleep 0.1; done
}
unlisten() { echo "SELECT 'after';" >&3; echo '\q' >&3; exec 3>&-; wait $lpid || true; }
notify_sql() { echo "BEGIN; SET LOCAL status_history.notify = on;
  SELECT status FROM status_history.report('$1', '$2', generation => 3); COMMIT;"; }

listen one "$T/listen_tp.out"
out=$(pgb one -c "$(notify_sql note-tp running)" 2>&1)
unlisten
check "LISTEN through transaction pooling: the listener gets nothing" no \
    "$(grep -q 'notification "status_history"' "$T/listen_tp.out" && echo yes || echo no)"
check "... the notification went to the other client on that connection" yes \
    "$(grep -q 'notification "status_history"' <<<"$out" && echo yes || echo no)"

listen sp "$T/listen_sp.out"
pgb tp -c "$(notify_sql note-sp running)" >/dev/null
pgb tp -c "$(notify_sql note-sp stalled)" >/dev/null
unlisten
check "LISTEN through session pooling: both notifications delivered" 2 \
    "$(grep -c 'notification "status_history" with payload .*note-sp' "$T/listen_sp.out" || true)"

# ---- 7. hosting: a database owner who is not a superuser
source test/hosting.sh

echo "poolers: $fails failed"
[ $fails -eq 0 ]
