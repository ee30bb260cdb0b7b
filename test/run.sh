#!/usr/bin/env bash
# The whole test suite on a throw-away cluster:
#   pg_regress (sql/, expected/), isolation specs (test/specs/),
#   pgTAP (test/*.sql, via pg_prove), and the TAP tests that start, crash
#   and promote their own servers (test/t/*.pl, run as the postgres user),
#   the README's scenario (test/demo.sh, make demo), the regression suites
#   again under valgrind with a UBSan build, and the failover test under
#   pg_auto_failover (test/ha/run.sh, make ha), the client examples across a
#   failover (test/clients.sh, make clients), pgbouncer and hosting
#   (test/poolers.sh, make poolers), the exporter's metrics (test/exporter.sh,
#   make monitoring), and every SQL block of the docs
#   (test/docs.sh, make doctest).  make stress runs the same
#   TAP tests longer (test/stress.sh: SH_STRESS=1, a random seed).
# Installs what it needs first.  Exits non-zero when any test fails.
#
#   ./test/run.sh         everything (what CI runs, .ci/run)
#   ./test/run.sh quick   for development: pg_regress, isolation, pgTAP and the
#                         docs' SQL blocks only (a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
source test/deps.sh
sh_build_install
quick=0
[ "${1:-}" = quick ] && quick=1

passed=0
failed=0
t0=$(date +%s)
# Count one suite's outcome and say how long it took.
suite() {
    if [ "$1" -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
    echo "-- $([ "$1" -eq 0 ] && echo passed || echo FAILED) after $(( $(date +%s) - t0 )) s in all"
}

echo "== pg_regress, isolation and pgTAP on a throw-away cluster"
# Each suite writes its exit code to a file, so one failing does not hide the others.
results=$(mktemp -d)
chmod 777 "$results"
pg_virtualenv -t -v 15 sh -c "
    make -s PG_CONFIG=$PG_CONFIG installcheck
    echo \$? > $results/regress
    [ -f regression.diffs ] && cat regression.diffs
    [ -f output_iso/regression.diffs ] && cat output_iso/regression.diffs
    psql -X -q -c 'CREATE DATABASE sh_tap' postgres &&
    pg_prove -d sh_tap test/*.sql
    echo \$? > $results/pgtap
    true
" || true
for s in regress pgtap; do suite "$(cat "$results/$s" 2>/dev/null || echo 1)"; done

echo "== every SQL block of README.md and docs/, in page order, output compared (test/docs.sh)"
if test/docs.sh; then suite 0; else suite 1; fi

if [ $quick -eq 1 ]; then
    rm -rf "$results"
    echo "suites (quick): $passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
fi

echo "== the README's scenario (make demo): runs to the end without an error"
if test/demo.sh >/dev/null; then suite 0; else suite 1; fi

echo "== TAP tests with their own servers (as postgres)"
if test/tap.sh; then suite 0; else suite 1; fi

echo "== the client examples (examples/*/run.sh) against a primary and a synchronous standby, the primary killed once (test/clients.sh)"
if test/clients.sh; then suite 0; else suite 1; fi

echo "== pgbouncer, transaction and session pooling; what a database owner can do (test/poolers.sh, test/hosting.sh)"
if test/poolers.sh; then suite 0; else suite 1; fi

echo "== monitoring: the real prometheus-postgres-exporter with monitoring/queries.yaml, scraped and checked against SQL; alert rules checked by promtool (test/exporter.sh)"
if test/exporter.sh; then suite 0; else suite 1; fi

echo "== C safety: regression and isolation suites under valgrind, library built with UBSan"
if test/memcheck.sh; then suite 0; else suite 1; fi

echo "== failover under pg_auto_failover: two kill -9s of the primary under load (as postgres)"
if test/ha/run.sh; then suite 0; else suite 1; fi

rm -rf "$results"
echo "suites: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
