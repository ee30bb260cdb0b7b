#!/usr/bin/env bash
# Every ```sql block of README.md, docs/*.md and examples/**/README.md, run in
# the order written on a fresh database per page, its shown output compared
# (test/docs.pl says how).  Pages may be named: test/docs.sh docs/REFERENCE.md
# Uses the server in PGHOST/PGPORT when one answers, else a throw-away one.
set -euo pipefail
pages=()
for p in "$@"; do pages+=("$(realpath "$p")"); done
cd "$(dirname "$0")/.."
set -- ${pages[@]+"${pages[@]}"}
source test/deps.sh
if [ $# -eq 0 ]; then
    set -- README.md docs/*.md $(find examples -name README.md 2>/dev/null | sort)
fi
if [ -n "${PGHOST:-}" ] && psql -X -q -d postgres -c 'SELECT 1' >/dev/null 2>&1; then
    exec perl test/docs.pl "$@"
fi
sh_build_install
exec pg_virtualenv -t -v 15 perl test/docs.pl "$@"
