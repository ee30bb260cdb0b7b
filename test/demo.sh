#!/usr/bin/env bash
# Runs the front page's scenario (docs/demo.sql) on a throw-away cluster and prints what an
# operator would look at.  Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
source test/deps.sh
sh_build_install
pg_virtualenv -t -v 15 sh -c '
    psql -X -q -c "CREATE EXTENSION status_history" &&
    psql -X -q -v ON_ERROR_STOP=1 -f docs/demo.sql
' 2>&1 | grep -v "^Dropping cluster"
