#!/usr/bin/env bash
# Runs the TAP tests in test/t/ with PostgreSQL's own framework
# (PostgreSQL::Test::Cluster).  They start, kill and promote their own servers,
# which PostgreSQL refuses to do as root, so as root they run as postgres.
# They run from a scratch directory under /tmp holding a copy of test/, so
# that user need not be able to read the checkout.  SH_STRESS=1 runs the long
# versions; arguments name files of test/t/ to run instead of all of them.
# PG_BIN=dir runs them with the server binaries (and installed extension) of
# another installation, e.g. a private copy as bench/compare.sh makes.
set -euo pipefail
cd "$(dirname "$0")/.."
pgxs=$(dirname "$(/usr/lib/postgresql/15/bin/pg_config --pgxs)")
perl_lib="$pgxs/../test/perl"
scratch=$(mktemp -d /tmp/status_history_tap.XXXXXX)
trap '[ -n "${SH_KEEP:-}" ] || rm -rf "$scratch"' EXIT
cp -r test "$scratch/test"
tests=()
for t in "$@"; do tests+=("$scratch/test/t/$(basename "$t")"); done
[ ${#tests[@]} -gt 0 ] || tests=("$scratch"/test/t/*.pl)

run=()
if [ "$(id -u)" -eq 0 ]; then
    chown -R postgres "$scratch"
    run=(runuser -u postgres --)
fi
cd "$scratch"
"${run[@]}" env PATH="${PG_BIN:-/usr/lib/postgresql/15/bin}:$PATH" TESTDIR="$scratch" \
    PG_REGRESS="$pgxs/../test/regress/pg_regress" SH_STRESS="${SH_STRESS:-0}" \
    prove -I "$perl_lib" -I "$scratch/test/t" ${PROVE_FLAGS:-} "${tests[@]}"
