#!/usr/bin/env bash
# C safety: the regression and isolation suites with the extension built with
# -fsanitize=undefined, on a server running under valgrind memcheck.
#
# Debian's server is not built for AddressSanitizer, and preloading libasan
# into it deadlocks in glibc's bindtextdomain at start-up, so memory errors are
# caught by valgrind instead.  PostgreSQL itself has valgrind noise (it has
# its own suppression file, which Debian does not ship), so only errors whose
# stack passes through status_history count.  The instrumented library is
# installed for the run and the normal build is put back afterwards.  It is
# built, and the suites run, from a copy of the tree under /tmp, so the server
# (run as postgres when run as root) need not be able to read the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source test/deps.sh

work=$(mktemp -d /tmp/status_history_memcheck.XXXXXX)
chmod 755 "$work"
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
    as_pg pg_ctl -D "$work/data" -m immediate stop >/dev/null 2>&1 || true
    cd "$root" && sh_build_install
    [ -n "${SH_KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

# Build an instrumented copy of the tree (its files, tracked or not, as they are
# in the working tree), so the normal build's objects stay put.
mkdir "$work/tree"
if git rev-parse --git-dir >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ ! -e "$f" ] || cp --parents "$f" "$work/tree"; done
else
    cp -r . "$work/tree" && make -s -C "$work/tree" clean >/dev/null
fi
cd "$work/tree"
san="-fsanitize=undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
make -s PG_CONFIG="$PG_CONFIG" COPT="$san" >/dev/null
sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
$sudo make -s PG_CONFIG="$PG_CONFIG" COPT="$san" install >/dev/null

mkdir "$work/reports"
[ "$(id -u)" -eq 0 ] && chown -R postgres "$work"
as_pg initdb -D "$work/data" -A trust >/dev/null
as_pg env UBSAN_OPTIONS="print_stacktrace=1:log_path=$work/reports/ubsan" \
    valgrind --quiet --trace-children=yes --num-callers=30 \
    --suppressions="$work/tree/test/valgrind.supp" \
    --log-file="$work/reports/valgrind.%p" \
    postgres -D "$work/data" -p 54331 -k "$work" -c listen_addresses='' \
    >"$work/server.log" 2>&1 &
for _ in $(seq 1 60); do
    psql -h "$work" -p 54331 -U postgres -Xqc 'SELECT 1' postgres >/dev/null 2>&1 && break
    sleep 1
done

status=0
# The deadlocks spec relies on short lock timeouts and pauses, which a server
# running 20-50 times slower under valgrind does not keep: left out here.
iso=$(cd test/specs && ls *.spec | sed 's/\.spec$//' | grep -vx deadlocks | tr '\n' ' ')
if ! PGHOST="$work" PGPORT=54331 PGUSER=postgres make -s PG_CONFIG="$PG_CONFIG" ISOLATION="$iso" installcheck; then
    status=1
    cat regression.diffs output_iso/regression.diffs 2>/dev/null || true
fi

# A valgrind error record is the block of lines from "==PID== <message>" to
# the blank "==PID==" line; keep those that mention the extension.
ours=$(awk '/^==[0-9]+== [A-Z]/ { rec = $0; next }
            /^==[0-9]+== *$/ { if (rec ~ /status_history/) print rec "\n"; rec = ""; next }
            { if (rec != "") rec = rec "\n" $0 }' "$work"/reports/valgrind.* 2>/dev/null || true)
if [ -n "$ours" ]; then
    echo "valgrind errors in status_history:"; echo "$ours" | head -80
    status=1
fi
if ls "$work"/reports/ubsan* >/dev/null 2>&1; then
    echo "UBSan reports:"; cat "$work"/reports/ubsan*
    status=1
fi
if grep -q "terminated by signal\|exited with exit code" "$work/server.log"; then
    echo "a backend died:"; grep -A3 "terminated by signal\|exited with exit code" "$work/server.log"
    status=1
fi
[ $status -eq 0 ] && echo "memcheck: suites clean under valgrind + UBSan ($(ls "$work"/reports | wc -l) processes traced)"
exit $status
