#!/usr/bin/env bash
# make monitoring: the real prometheus-postgres-exporter (Debian's package)
# with monitoring/queries.yaml, against a throw-away server with a known
# workload; every metric scraped from /metrics is checked against the same
# quantity computed in SQL just before and just after the scrape (a moving
# value must lie between the two), and monitoring/alerts.yml with promtool.
# Server on port 56140, exporter on 56141, both run as the postgres user from
# a temporary directory; the exporter connects as a login role that is only a
# member of grant_roles()'s reader role, read-only.  Prints PASS/FAIL per
# metric and exits non-zero on any failure.  Runs as root (apt, runuser).
# KEEP=1 leaves the server, the exporter and the directory for a look.
set -euo pipefail
cd "$(dirname "$0")/.."
source test/deps.sh
PORT=56140
EXPORTER_PORT=56141
BIN=/usr/lib/postgresql/15/bin

# Debian's packages may start system services: we run our own exporter.
for svc in prometheus-postgres-exporter prometheus; do
    if command -v systemctl >/dev/null && systemctl is-active -q "$svc" 2>/dev/null; then
        systemctl stop "$svc"; systemctl disable -q "$svc" 2>/dev/null || true
    fi
done

failed=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=1; }

echo "== promtool check rules monitoring/alerts.yml"
if promtool check rules monitoring/alerts.yml; then pass "alerts.yml"; else fail "alerts.yml"; fi

T=$(mktemp -d /tmp/exporter.XXXXXX)
chmod 755 "$T"
chown postgres "$T"
as_pg() { runuser -u postgres -- "$@"; }
cleanup() {
    [ -f "$T/exporter.pid" ] && kill "$(cat "$T/exporter.pid")" 2>/dev/null || true
    as_pg "$BIN/pg_ctl" -D "$T/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$T"
}
[ -n "${KEEP:-}" ] || trap cleanup EXIT

sh_scratch_server "$T/data" "$PORT" 'max_prepared_transactions = 2'
sql() { as_pg psql -X -q -At -h 127.0.0.1 -p $PORT -d "${DB:-mon}" -v ON_ERROR_STOP=1 "$@"; }
DB=postgres sql -c "CREATE DATABASE mon"

echo "== the workload"
# Roles as README "Roles" makes them; the exporter's login is only a reader.
sql >/dev/null <<'EOF'
CREATE EXTENSION status_history;
CREATE ROLE sh_reporter NOLOGIN; CREATE ROLE sh_controller NOLOGIN;
CREATE ROLE sh_reader NOLOGIN;   CREATE ROLE sh_admin NOLOGIN;
SELECT status_history.grant_roles(reporter => 'sh_reporter', controller => 'sh_controller',
                                  reader => 'sh_reader', admin => 'sh_admin', public_reads => false);
CREATE ROLE exporter LOGIN IN ROLE sh_reader;
ALTER ROLE exporter SET default_transaction_read_only = on;
-- Imports into the past (before any horizon is given out): long-standing
-- statuses, keys silent for a long time, a stale row older than a minute.
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, error) VALUES
  (now() - interval '60 minutes', 'paused-obj',  'paused',  'r5',     NULL),   -- paused: not expected to report
  (now() - interval '50 minutes', 'dropped-obj', 'running', 'r4',     NULL),   -- dropped below: left out
  (now() - interval '40 minutes', 'gone-obj',    'running', 'r-gone', NULL),   -- retired below: left out
  (now() - interval '20 minutes', 'silent',      'running', 'r3',     NULL),   -- the oldest silent key
  (now() - interval '10 minutes', 'old-stalled', 'stalled', 'r1',     'broker unreachable');
INSERT INTO status_history.history (occurred_at, object_id, status, replica_id, stale) VALUES
  (now() - interval '5 minutes', 'silent', 'stalled', 'r-old', true);          -- stale, but not in the last minute
SELECT status_history.report('dropped-obj', 'dropped') IS NOT NULL;
SELECT status_history.retire_replica('r-gone');
SELECT count(*) FROM status_history.report_many(ARRAY['a1', 'a2', 'st1', 'c1', 'multi'],
       ARRAY['running', 'running', 'starting', 'ceased', 'running'],
       replica_ids => ARRAY['r1', 'r1', 'r2', 'r2', 'r9']);
-- two stale reports now: below a1's fence
SELECT count(*) FROM status_history.reconnect(5, object_ids => ARRAY['a1']);
SELECT stale FROM status_history.report('a1', 'running', replica_id => 'r1', generation => 1);
SELECT stale FROM status_history.report('a1', 'stalled', replica_id => 'r1', generation => 1, error => 'x');
-- lapsed leases: one recorded by expire(), one not, one of a key that is not current
SELECT stale FROM status_history.report('leased2', 'running', replica_id => 'r7', lease => '1 second');
SELECT stale FROM status_history.report('multi', 'running', replica_id => 'r8', lease => '1 second');
SELECT stale FROM status_history.report('multi', 'running', replica_id => 'r9', error => 'other');
SELECT pg_sleep(1.2);
SELECT status_history.expire();
SELECT stale FROM status_history.report('leased', 'running', replica_id => 'r6', lease => '1 second');
SELECT pg_sleep(1.2);
-- the feed held back: a prepared transaction holds a stamp below a committed row
BEGIN;
SELECT stale FROM status_history.report('held', 'running', replica_id => 'r1');
PREPARE TRANSACTION 'hold';
SELECT stale FROM status_history.report('after-held', 'running', replica_id => 'r1');
EOF
sleep 1.5   # the writers' statistics (n_live_tup) are flushed when their sessions end

cp monitoring/queries.yaml "$T/queries.yaml"
chmod 644 "$T/queries.yaml"
# (exec: the pid written is the exporter's own, for the cleanup to stop)
DATA_SOURCE_NAME="host=127.0.0.1 port=$PORT user=exporter dbname=mon sslmode=disable" \
    runuser -u postgres -- sh -c 'echo $$ >"$1/exporter.pid"; exec /usr/bin/prometheus-postgres-exporter \
        --web.listen-address=127.0.0.1:$2 --extend.query-path="$1/queries.yaml" \
        --disable-default-metrics --disable-settings-metrics \
        --no-collector.database --no-collector.bgwriter' sh "$T" "$EXPORTER_PORT" >"$T/exporter.log" 2>&1 &
for _ in $(seq 50); do
    curl -sf "http://127.0.0.1:$EXPORTER_PORT/" >/dev/null 2>&1 && break
    sleep 0.2
done

# The reference: the same quantities from the documented views and plain
# SQL, as "metric{labels} value" lines, sorted.
reference() {
    sql <<'EOF' | sort
WITH s(status) AS (SELECT unnest(ARRAY['starting', 'running', 'paused', 'stalled', 'ceased', 'dropped'])),
     cur AS (SELECT status, status_since FROM status_history.statuses
             UNION ALL
             SELECT l.status, o.status_since FROM status_history.latest(include_dropped => true) AS l
               JOIN status_history.objects AS o USING (object_id) WHERE l.status = 'dropped')
SELECT format('status_history_objects{status="%s"} %s', s.status,
              (SELECT count(*) FROM cur WHERE cur.status = s.status)) FROM s
UNION ALL
SELECT format('status_history_longest_in_status_seconds{status="%s"} %s', s.status,
              COALESCE((SELECT extract(epoch FROM clock_timestamp() - min(status_since)) FROM cur
                         WHERE cur.status = s.status), 0)) FROM s
UNION ALL
SELECT format('status_history_stale_reports_per_minute %s',
              count(*) FILTER (WHERE stale AND occurred_at > clock_timestamp() - interval '1 minute'))
  FROM status_history.history
UNION ALL
SELECT format('status_history_lapsed_leases %s', count(*))
  FROM status_history.replica_statuses AS r
 WHERE NOT r.retired AND r.error LIKE 'lease expired: %'
   AND r.object_id NOT IN (SELECT object_id FROM status_history.latest(include_dropped => true) WHERE status = 'dropped')
UNION ALL
SELECT format('status_history_oldest_silent_key_seconds %s',
              COALESCE(extract(epoch FROM clock_timestamp() - min(r.last_seen_at)), 0))
  FROM status_history.replica_statuses AS r
 WHERE NOT r.retired AND r.status IN ('starting', 'running', 'stalled')
   AND r.object_id NOT IN (SELECT object_id FROM status_history.latest(include_dropped => true) WHERE status = 'dropped')
UNION ALL
SELECT format('status_history_clock_lead_seconds %s',
              GREATEST(0, extract(epoch FROM max(occurred_at) - clock_timestamp())))
  FROM status_history.history
UNION ALL
SELECT format('status_history_history_rows %s', count(*)) FROM status_history.history
UNION ALL
SELECT format('status_history_history_bytes %s',
              pg_table_size('status_history.history') + pg_indexes_size('status_history.history'))
UNION ALL
SELECT format('status_history_feed_horizon_lag_seconds %s',
              COALESCE(extract(epoch FROM clock_timestamp() - min(occurred_at)), 0))
  FROM status_history.history WHERE occurred_at >= status_history.stable_horizon()
UNION ALL
SELECT format('status_history_feed_horizon_timestamp_seconds %s', extract(epoch FROM status_history.stable_horizon()));
EOF
}

scrape_and_check() {
    reference >"$T/before"
    curl -sf "http://127.0.0.1:$EXPORTER_PORT/metrics" >"$T/metrics" || { fail "scrape"; return; }
    reference >"$T/after"
    grep -q '^pg_exporter_last_scrape_error 0$' "$T/metrics" && pass "no scrape error" \
        || fail "pg_exporter_last_scrape_error is not 0 (see $T/exporter.log)"
    grep -q '^pg_exporter_user_queries_load_error{.*} 0$' "$T/metrics" && pass "query file loaded" \
        || fail "pg_exporter_user_queries_load_error is not 0"
    # The scraped value, without the server label, next to both bounds.
    sed -n 's/^\(status_history_[a-z_]*\){server="[^"]*",*\([^}]*\)} \(.*\)/\1{\2} \3/p' "$T/metrics" \
        | sed 's/{}//' | sort >"$T/scraped"
    # moving values: between before and after (a microsecond of slack for printing)
    join -a1 -a2 -e MISSING -o 0,1.2,1.3,2.2 \
        <(join -a1 -a2 -e MISSING -o 0,1.2,2.2 "$T/before" "$T/after") "$T/scraped" |
    awk '{ name = $1; b = $2; a = $3; v = $4
           if (b == "MISSING" || a == "MISSING" || v == "MISSING") { print "FAIL", name, "before", b, "after", a, "scraped", v; bad = 1; next }
           lo = (b + 0 < a + 0) ? b : a; hi = (b + 0 < a + 0) ? a : b
           if (v + 0 >= lo - 1e-6 && v + 0 <= hi + 1e-6) print "PASS", name, v, "in [" lo ", " hi "]"
           else { print "FAIL", name, v, "not in [" lo ", " hi "] (SQL before/after)"; bad = 1 } }
         END { exit bad }' || failed=1
}

echo "== scrape 1: the workload"
scrape_and_check
# the values the workload makes (so that the reference cannot be trivially equal)
for want in 'status_history_objects{status="stalled"} 3' 'status_history_objects{status="running"} 5' \
            'status_history_lapsed_leases 3' 'status_history_stale_reports_per_minute 2'; do
    grep -qxF "$want" "$T/scraped" && pass "$want" || fail "want $want, got: $(grep -F "${want% *}" "$T/scraped")"
done
awk '$1 == "status_history_oldest_silent_key_seconds" && $2 > 1190 && $2 < 1300 { ok = 1 } END { exit !ok }' "$T/scraped" \
    && pass "oldest silent key is the one silent for 20 minutes" || fail "oldest silent key: $(grep silent_key "$T/scraped")"
awk '$1 == "status_history_feed_horizon_lag_seconds" && $2 > 0 { ok = 1 } END { exit !ok }' "$T/scraped" \
    && pass "the prepared transaction holds the feed back" || fail "feed lag: $(grep horizon_lag "$T/scraped")"
# Every metric an alert rule names must be one the exporter serves (promtool
# checks only the syntax: an alert on a misspelt metric never fires).
for m in $(grep -o 'status_history_[a-z_]*' monitoring/alerts.yml | sort -u); do
    grep -q "^$m[{ ]" "$T/scraped" && pass "alerts.yml names a served metric: $m" \
        || fail "alerts.yml names $m, which the exporter does not serve"
done

echo "== scrape 2: the prepared transaction committed, a stamp imported 8 s ahead"
sql -q -c "COMMIT PREPARED 'hold'" \
    -c "INSERT INTO status_history.history (occurred_at, object_id, status, replica_id) VALUES (now() + interval '8 seconds', 'ahead', 'running', 'r1')"
sleep 1.5
scrape_and_check
awk '$1 == "status_history_clock_lead_seconds" && $2 > 0 && $2 < 8 { ok = 1 } END { exit !ok }' "$T/scraped" \
    && pass "the clock runs ahead" || fail "clock lead: $(grep clock_lead "$T/scraped")"
grep -qxF 'status_history_feed_horizon_lag_seconds 0' "$T/scraped" && pass "nothing held back" \
    || fail "feed lag: $(grep horizon_lag "$T/scraped")"

if [ "$failed" -ne 0 ]; then
    echo "== exporter log"; cat "$T/exporter.log"
    echo "FAILED"; exit 1
fi
echo "all passed"
