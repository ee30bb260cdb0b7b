#!/usr/bin/env bash
# Runs the TAP tests in test/t/ with PostgreSQL's own framework
# (PostgreSQL::Test::Cluster).  They start, kill and promote their own servers,
# which PostgreSQL refuses to do as root, so as root they run as postgres.
# They run from a scratch directory under /tmp holding a copy of test/, so
# that user need not be able to read the checkout.  SH_STRESS=1 runs the long
# versions; arguments name files of test/t/ to run instead of all of them.
# PG_BIN=dir runs them with the server binaries (and installed extension) of
# another installation, e.g. a private copy as bench/compare.sh makes.
# The upgrade test (005) also gets the builds of the released versions,
# made by test/releases.sh (SH_RELEASES names them).
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

# The upgrade test runs each released version's own build: built here (from
# this checkout's history) into the scratch directory, once per run.  A
# version that fails to build fails that test, not the others.
releases=""
case " ${tests[*]} " in
*/005_upgrade.pl\ *)
    releases="$scratch/releases"
    echo "== building the released versions (test/releases.sh)"
    t0=$SECONDS
    test/releases.sh "$releases" || echo "== test/releases.sh failed: 005_upgrade.pl will say which version" >&2
    echo "== built in $((SECONDS - t0)) s"
    ;;
esac

run=()
if [ "$(id -u)" -eq 0 ]; then
    chown -R postgres "$scratch"
    run=(runuser -u postgres --)
fi
cd "$scratch"
"${run[@]}" env PATH="${PG_BIN:-/usr/lib/postgresql/15/bin}:$PATH" TESTDIR="$scratch" \
    PG_REGRESS="$pgxs/../test/regress/pg_regress" SH_STRESS="${SH_STRESS:-0}" SH_RELEASES="$releases" \
    prove -I "$perl_lib" -I "$scratch/test/t" ${PROVE_FLAGS:-} "${tests[@]}"
