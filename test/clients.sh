#!/usr/bin/env bash
# The client examples (examples/<lang>/run.sh, examples/README.md) against real
# servers.  For each language, on a pair of its own -- a primary and a streaming
# standby (pg_basebackup -R) that the primary waits for at every commit
# (synchronous_standby_names), so that what a client was acknowledged survives
# the primary's death -- it checks, from the database:
#   1. reporter: COUNT reports through the multi-host connection string while
#      the primary is killed (kill -9) and the standby promoted; every acked
#      report is stored, the heartbeats added no rows, the object is running
#      and its heartbeats went on on the new primary;
#   2. controller: `controller 2 r1` re-stamps the object at generation 2; a
#      late report of generation 1 is stored stale and not current;
#   3. consumer: from -infinity it prints exactly the history, in stamp order,
#      also a row stamped before later rows and committed after them (which a
#      loop over the history past its last stamp would miss); without
#      notifications it says no `woken`; with status_history.notify on, a
#      consumer waiting for rows reported after it started prints one.
# A directory of examples/ without an executable run.sh fails.
# Roles as docs/OPERATIONS.md's Roles section: grant_roles() over four NOLOGIN groups,
# and login roles reporter, controller, consumer in them.
#
#   ./test/clients.sh              every examples/*/run.sh
#   ./test/clients.sh python go    those languages only
#   CLIENTS_INSTALL=0              do not build and install the extension first
#   CLIENTS_KEEP=1                 keep the scratch directory (logs, data)
#
# Runs as root (servers as postgres) or as a user who may run PostgreSQL;
# TCP ports 56100-56119 on 127.0.0.1.  Prints PASS/FAIL per language and
# check and exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
source test/deps.sh
[ "${CLIENTS_INSTALL:-1}" = 0 ] || sh_build_install
root=$(pwd)

COUNT=${CLIENTS_COUNT:-100}   # reports per reporter
KILL_AT=30                    # kill the primary once the reporter has this many acks
BASE_PORT=56100               # language i: primary BASE_PORT+2i, standby +1; 56119 the template

as_pg=()
if [ "$(id -u)" -eq 0 ]; then as_pg=(runuser -u postgres --); fi
# The same text for timestamps in every session: the servers run in UTC, and
# no client may ask for another zone through libpq's environment.
unset PGTZ PGDATESTYLE PGOPTIONS PGHOST PGPORT PGUSER PGDATABASE PGSERVICE || true

scratch=$(mktemp -d /tmp/sh_clients.XXXXXX)
chmod 755 "$scratch"
[ -z "${as_pg[*]}" ] || chown postgres "$scratch"
export SH_EXAMPLES_CACHE="$scratch/cache"   # where the examples build (examples/go/run.sh)
datadirs=()
bgpids=()
cleanup() {
    local p d
    for p in "${bgpids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
    for d in "${datadirs[@]}"; do
        if [ -f "$d/postmaster.pid" ]; then
            "${as_pg[@]}" pg_ctl -D "$d" -m immediate stop >/dev/null 2>&1 || true
        fi
    done
    if [ -n "${CLIENTS_KEEP:-}" ]; then echo "kept $scratch"; else rm -rf "$scratch"; fi
}
trap cleanup EXIT

passed=0
failed=0
result() {   # result 0|1 LANG WHAT [why]
    if [ "$1" -eq 0 ]; then
        passed=$((passed + 1)); echo "PASS $2 $3"
    else
        failed=$((failed + 1)); echo "FAIL $2 $3${4:+: $4}"
    fi
}

verdict() {   # verdict LANG WHAT: PASS when $why is empty, else FAIL saying why
    if [ -z "$why" ]; then result 0 "$1" "$2"; else result 1 "$1" "$2" "$why"; fi
}

pg_start() {   # pg_start DATADIR PORT
    datadirs+=("$1")
    "${as_pg[@]}" pg_ctl -D "$1" -w -t 60 -l "$1.log" -o "-p $2" start >/dev/null
}
# psql as the superuser on a server's socket (PORT), the database app.
q() { local port=$1; shift; "${as_pg[@]}" psql -X -q -At -v ON_ERROR_STOP=1 -h "$scratch" -p "$port" -d app "$@"; }

# A template cluster, made once and copied for each language's primary:
# the extension created in the database app, the roles.
echo "== a template cluster"
tmpl=$scratch/template
"${as_pg[@]}" initdb -D "$tmpl" -A trust -U postgres --no-sync >/dev/null
cat >> "$tmpl/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
unix_socket_directories = '$scratch'
timezone = 'UTC'
fsync = off                 # only processes are killed here, never the machine
wal_keep_size = '64MB'
EOF
pg_start "$tmpl" $((BASE_PORT + 19))
q $((BASE_PORT + 19)) -d postgres -c 'CREATE DATABASE app'
q $((BASE_PORT + 19)) >/dev/null <<'EOF'
CREATE EXTENSION status_history;
CREATE ROLE sh_reporter NOLOGIN;
CREATE ROLE sh_controller NOLOGIN;
CREATE ROLE sh_reader NOLOGIN;
CREATE ROLE sh_admin NOLOGIN;
SELECT status_history.grant_roles(reporter => 'sh_reporter', controller => 'sh_controller',
                                  reader => 'sh_reader', admin => 'sh_admin', public_reads => false);
CREATE ROLE reporter LOGIN IN ROLE sh_reporter;
CREATE ROLE controller LOGIN IN ROLE sh_controller;
CREATE ROLE consumer LOGIN IN ROLE sh_reader;
EOF
"${as_pg[@]}" pg_ctl -D "$tmpl" -w stop >/dev/null

# wait_for FILE PATTERN N PID: until FILE has N lines matching PATTERN, or PID
# has exited, or 600 s passed (a first build may be slow); 0 when it has them.
wait_for() {
    local i
    for ((i = 0; i < 12000; i++)); do
        [ "$(count "$2" "$1")" -ge "$3" ] && return 0
        kill -0 "$4" 2>/dev/null || { [ "$(count "$2" "$1")" -ge "$3" ]; return; }
        sleep 0.05
    done
    return 1
}
count() { local c; c=$(grep -c -- "$1" "$2" 2>/dev/null) || true; echo "${c:-0}"; }   # count PATTERN FILE

# Run a client command; stdout to OUT, stderr to OUT.err.
client() {   # client RUN_SH OUT ROLE COMMAND ARGS...
    local run=$1 out=$2 user=$3; shift 3
    SH_DSN="$dsn user=$user" timeout -k 5 600 "$run" "$@" >"$out" 2>"$out.err"
}
show() {   # the tail of a client's output, indented, after a FAIL
    local f
    for f in "$@"; do [ -s "$f" ] && tail -n 5 "$f" | sed "s|^|    ${f##*/}: |"; done
    true
}

# The history as every client prints it (examples/README.md: the interface).
history_rows() {
    q "$1" -c "SELECT 'row ' || occurred_at::text || ' ' || object_id || ' ' || status || ' ' || generation || ' ' || stale::text
                 FROM status_history.history ORDER BY occurred_at"
}
# A client's row lines, stale as true/false (stale::text; t/f accepted).
client_rows() { grep '^row ' "$1" | sed -E 's/ t$/ true/; s/ f$/ false/' || true; }

# consume OUT off|on STATUS...: a consumer from -infinity for the rows there
# are plus one held back plus one per STATUS.  Once it has printed the rows
# there were (it LISTENs before its first changes()), a transaction reports on
# held-$lang-on/off and stays open while the STATUSes are reported on feed-$lang,
# 0.3 s apart (each a status change, so each sends a notification when they
# are on); the held transaction commits 1 s after them.  Its row is stamped
# before theirs and committed after them: a consumer that reads the history
# past its last stamp instead of following changes() misses it (and is
# killed 60 s later).  Sets why.
consume() {
    local out=$1 notify=$2 n rc=0 s woken i; shift 2
    n=$(q $p2 -c 'SELECT count(*) FROM status_history.history')
    client "$run" "$out" consumer consumer -infinity $((n + 1 + $#)) &
    local cpid=$!
    bgpids+=("$cpid")
    if wait_for "$out" '^row ' "$n" $cpid; then
        rm -f "$out.release"
        { echo "BEGIN; SELECT 1 FROM status_history.report('held-$lang-$notify', 'running', replica_id => 'r8');"
          echo '\echo held'
          while [ ! -e "$out.release" ]; do sleep 0.1; done
          echo "COMMIT;"; } | q $p2 >"$out.held" 2>&1 &
        bgpids+=($!)
        wait_for "$out.held" '^held$' 1 $!
        for s in "$@"; do
            sleep 0.3
            q $p2 -c "SELECT 1 FROM status_history.report('feed-$lang', '$s', replica_id => 'r9')" >/dev/null
        done
        sleep 1
        touch "$out.release"
    fi
    for ((i = 0; i < 600; i++)); do kill -0 "$cpid" 2>/dev/null || break; sleep 0.1; done
    kill "$cpid" 2>/dev/null || true
    wait "$cpid" || rc=$?
    woken=$(count '^woken$' "$out")
    if [ "$rc" -ne 0 ]; then
        why="the consumer exited with $rc"
    elif ! diff <(history_rows $p2) <(client_rows "$out") >"$out.diff"; then
        why="its rows differ from the history (< history, > consumer): $(head -c 600 "$out.diff")"
    elif [ "$notify" = on ] && [ "$woken" != 1 ]; then
        why="it printed 'woken' $woken times, not once"
    elif [ "$notify" = off ] && [ "$woken" != 0 ]; then
        why="it printed 'woken', but notifications are off"
    fi
    [ -z "$why" ] || show "$out.err"
}

run_language() {   # run_language LANG INDEX
    local lang=$1 i=$2 run=$root/examples/$1/run.sh
    local p1=$((BASE_PORT + 2 * i)) p2=$((BASE_PORT + 2 * i + 1))
    local d=$scratch/$lang obj=src-$lang
    mkdir -p "$d"; chmod 755 "$d"
    [ -z "${as_pg[*]}" ] || chown postgres "$d"
    echo "== $lang (ports $p1, $p2)"

    # The pair: the primary a copy of the template; the standby cloned from
    # it; then the primary made to wait for the standby at every commit.
    cp -a "$tmpl" "$d/primary"
    pg_start "$d/primary" $p1
    "${as_pg[@]}" pg_basebackup -D "$d/standby" -R -X stream -h "$scratch" -p $p1 -U postgres
    pg_start "$d/standby" $p2
    echo "synchronous_standby_names = '*'" >> "$d/primary/postgresql.conf"
    q $p1 -c 'SELECT pg_reload_conf()' >/dev/null
    local k
    for ((k = 0; k < 600; k++)); do
        [ "$(q $p1 -c "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")" = 1 ] && break
        sleep 0.1
    done
    dsn="host=127.0.0.1,127.0.0.1 port=$p1,$p2 dbname=app target_session_attrs=read-write"

    # 1. A reporter across a failover.
    local out=$d/reporter.out
    client "$run" "$out" reporter reporter "$obj" r1 1 "$COUNT" &
    local rpid=$!
    bgpids+=("$rpid")
    local why="" promoted_at=""
    if wait_for "$out" '^ack ' $KILL_AT $rpid; then
        # kill -9 the primary: its postmaster and every child, by pid, at once.
        local pm
        pm=$(head -n 1 "$d/primary/postmaster.pid")
        # shellcheck disable=SC2046
        kill -KILL "$pm" $(ps -o pid= --ppid "$pm") 2>/dev/null || true
        local acked_at_kill
        acked_at_kill=$(count '^ack ' "$out")
        # A second with no writable server: the client's connection attempts
        # meanwhile find the old primary gone and the standby read-only.
        sleep 1
        "${as_pg[@]}" pg_ctl -D "$d/standby" -w -t 60 promote >/dev/null
        promoted_at=$(q $p2 -c 'SELECT clock_timestamp()')
        echo "   killed the primary after $acked_at_kill acks; promoted the standby"
    else
        why="the reporter did not get to $KILL_AT acks"
    fi
    local rc=0
    wait "$rpid" || rc=$?
    [ -n "$why" ] || [ "$rc" -eq 0 ] || why="the reporter exited with $rc"
    local acks
    acks=$(count '^ack ' "$out")
    if [ -z "$why" ]; then
        local seqs
        seqs=$(awk '/^ack /{print $2}' "$out" | tr '\n' ' ')
        [ "$seqs" = "$(seq -s ' ' 1 "$COUNT") " ] || why="acks are not 1..$COUNT once each: $acks lines"
    fi
    if [ -z "$why" ]; then
        # Every acked stamp is one of the object's rows on the new primary.
        local missing
        missing=$(awk '/^ack /{print $3" "$4}' "$out" | sort -u | while read -r day time; do
            [ "$(q $p2 -c "SELECT count(*) FROM status_history.history
                             WHERE object_id = '$obj' AND occurred_at = '$day $time'")" = 1 ] || echo "$day $time"
        done)
        [ -z "$missing" ] || why="acked but not stored: ${missing//$'\n'/, }"
    fi
    verdict "$lang" "reporter: $COUNT reports acked across the failover, each stored"
    [ -z "$why" ] || show "$out" "$out.err"
    why=""
    local rows
    rows=$(q $p2 -c "SELECT string_agg(status || ':' || stale, ',' ORDER BY occurred_at)
                       FROM status_history.history WHERE object_id = '$obj'")
    [ "$rows" = "starting:false,running:false" ] ||
        why="the object's rows are $rows, not starting:false,running:false (a report in doubt re-sent must be a repeat)"
    verdict "$lang" "reporter: heartbeats and retries appended no rows"
    why=""
    local state
    state=$(q $p2 -c "SELECT format('%s %s %s %s', s.status, s.generation, s.expires_at > now(),
                                    r.last_seen_at > '${promoted_at:-infinity}')
                        FROM status_history.statuses s
                        JOIN status_history.replica_statuses r USING (object_id)
                       WHERE object_id = '$obj' AND r.replica_id = 'r1'")
    [ "$state" = "running 1 t t" ] ||
        why="status, generation, lease holds (blank: no lease), seen after the promotion: '$state', not 'running 1 t t'"
    verdict "$lang" "reporter: running, its lease renewed on the new primary"

    # 2. A controller taking over with generation 2; then a late report of
    # generation 1 (the reporter once more, COUNT 1).
    why=""
    out=$d/controller.out
    rc=0
    client "$run" "$out" controller controller 2 r1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        why="the controller exited with $rc"
    elif [ "$(cat "$out")" != "reconnected 1" ]; then
        why="it printed '$(cat "$out")', not 'reconnected 1'"
    fi
    if [ -z "$why" ]; then
        out=$d/late.out
        rc=0
        client "$run" "$out" reporter reporter "$obj" r1 1 1 || rc=$?
        if [ "$rc" -ne 0 ]; then
            why="the late reporter exited with $rc"
        else
            local late stale current
            late=$(awk '/^ack 1 /{print $3" "$4}' "$out")
            stale=$(q $p2 -c "SELECT stale FROM status_history.history
                               WHERE object_id = '$obj' AND occurred_at = '${late:-infinity}'")
            current=$(q $p2 -c "SELECT status || ' ' || generation || ' ' || replica_id
                                  FROM status_history.statuses WHERE object_id = '$obj'")
            [ "$stale" = t ] || why="the late report of generation 1 (ack '$late') is stored with stale '$stale', not t"
            [ -n "$why" ] || [ "$current" = "running 2 r1" ] ||
                why="the current report is '$current', not 'running 2 r1'"
        fi
    fi
    verdict "$lang" "controller: reconnect(2, r1) fences; a late generation 1 is stale"
    [ -z "$why" ] || show "$d/controller.out" "$d/controller.out.err" "$d/late.out" "$d/late.out.err"

    # 3. Consumers from the start, each waiting for rows reported after it
    # printed the history there was: first with notifications off (its poll
    # finds them; it must not say woken), then on (a notification must wake
    # it: it says woken once).
    why=""
    consume "$d/consumer.out" off starting
    verdict "$lang" "consumer: the history from -infinity row for row, polling (notifications off)"
    why=""
    q $p2 -c "ALTER DATABASE app SET status_history.notify = on"
    consume "$d/consumer2.out" on running stalled paused
    verdict "$lang" "consumer: the history from -infinity row for row, woken by LISTEN (notifications on)"

    "${as_pg[@]}" pg_ctl -D "$d/standby" -m immediate stop >/dev/null 2>&1 || true
}

langs=("$@")
if [ ${#langs[@]} -eq 0 ]; then
    for dir in examples/*/; do langs+=("$(basename "$dir")"); done
fi
i=0
for lang in "${langs[@]}"; do
    if [ ! -d "examples/$lang" ]; then
        result 1 "$lang" "exists" "no directory examples/$lang"
    elif [ ! -x "examples/$lang/run.sh" ]; then
        # A language without its executable run.sh is not tested: a failure
        # (a lost +x bit must not make CI green with a client untested).
        result 1 "$lang" "has an executable run.sh" "examples/$lang/run.sh is missing or not executable: NOT TESTED"
    else
        run_language "$lang" $i
        i=$((i + 1))
    fi
done
[ $((passed + failed)) -gt 0 ] || result 1 clients "ran" "no examples/*/run.sh found"
echo "clients: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
