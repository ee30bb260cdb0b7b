#!/usr/bin/env bash
# make stress: the long versions of the reliability tests.  The TAP tests in
# test/t/ run with SH_STRESS=1: 16 reporters x 20000 reports on 1000 objects
# with concurrent reconnects, then six rounds of load with the postmaster
# killed mid-way; every invariant is checked after each round and printed
# with its counts.  Takes about 10 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
source test/deps.sh
sh_build_install
SH_STRESS=1 PROVE_FLAGS="-v ${PROVE_FLAGS:-}" exec test/tap.sh "$@"
