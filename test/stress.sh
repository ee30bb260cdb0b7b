#!/usr/bin/env bash
# make stress: the long versions of the reliability tests, then make ha.
# The TAP tests in test/t/ run with SH_STRESS=1: 16 reporting clients x 20000
# transactions on 1000 objects with concurrent reconnects, then six rounds of
# load with the postmaster killed mid-way (every invariant checked after each
# round and printed with its counts), and 20000 statements of the
# differential test; then the failover test under pg_auto_failover.
# Arguments name TAP tests to run instead (and skip the failover test).
set -euo pipefail
cd "$(dirname "$0")/.."
source test/deps.sh
sh_build_install
status=0
SH_STRESS=1 PROVE_FLAGS="-v ${PROVE_FLAGS:-}" test/tap.sh "$@" || status=1
# The failover test under pg_auto_failover (make ha) belongs here too: it
# installs its own packages and takes a few minutes.
[ $# -gt 0 ] || test/ha/run.sh || status=1
exit $status
