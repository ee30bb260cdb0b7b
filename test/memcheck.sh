#!/usr/bin/env bash
# C safety: the regression and isolation suites with the extension built with
# -fsanitize=undefined, on servers running under valgrind memcheck.
#
# Debian's server is not built for AddressSanitizer, and preloading libasan
# into it deadlocks in glibc's bindtextdomain at start-up, so memory errors are
# caught by valgrind instead.  PostgreSQL itself has valgrind noise (it has
# its own suppression file, which Debian does not ship), so only errors whose
# stack passes through status_history count.  The instrumented library is
# installed into a private copy of the server's directories (PostgreSQL finds
# its libraries relative to its binaries), so the system's installation is
# never touched.  It is built, and the suites run, from a copy of the tree
# under /tmp, so the server (run as postgres when run as root) need not be
# able to read the checkout.  The tests are dealt to two servers that run at
# once (a server under valgrind keeps one core busy).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source test/deps.sh

pg=""
# (no "status_history" in the name: errors are told ours by that word in their stacks)
work=$(mktemp -d /tmp/sh_memcheck.XXXXXX)
chmod 755 "$work"
as_pg() { if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
cleanup() {
    [ -z "$pg" ] || for d in "$work"/data*; do as_pg "$pg/bin/pg_ctl" -D "$d" -m immediate stop >/dev/null 2>&1 || true; done
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

# The private installation: the server's directories, then the instrumented build.
pg="$work/root/usr/lib/postgresql/15"
mkdir -p "$work/root/usr/lib/postgresql" "$work/root/usr/share/postgresql"
cp -a /usr/lib/postgresql/15 "$work/root/usr/lib/postgresql/"
cp -a /usr/share/postgresql/15 "$work/root/usr/share/postgresql/"
rm -f "$work"/root/usr/share/postgresql/15/extension/status_history*
make -s PG_CONFIG="$PG_CONFIG" COPT="$san" DESTDIR="$work/root" install >/dev/null

# The deadlocks spec relies on short lock timeouts and pauses, which a server
# running 20-50 times slower under valgrind does not keep: left out here.
regress=($(ls sql/*.sql | sed 's|^sql/||; s/\.sql$//' | grep -v '^status_history'))
iso=($(cd test/specs && ls *.spec | sed 's/\.spec$//' | grep -vx deadlocks))

mkdir "$work/reports"
cp -a "$work/tree" "$work/tree1"
[ "$(id -u)" -eq 0 ] && chown -R postgres "$work"
pids=()
for n in 0 1; do
    as_pg "$pg/bin/initdb" -D "$work/data$n" -A trust >/dev/null
    as_pg env UBSAN_OPTIONS="print_stacktrace=1:log_path=$work/reports/ubsan" \
        valgrind --quiet --trace-children=yes --num-callers=30 \
        --suppressions="$work/tree/test/valgrind.supp" \
        --log-file="$work/reports/valgrind.%p" \
        "$pg/bin/postgres" -D "$work/data$n" -p $((54331 + n)) -k "$work" -c listen_addresses='' \
        >"$work/server$n.log" 2>&1 &
done
for n in 0 1; do
    for _ in $(seq 1 60); do
        psql -h "$work" -p $((54331 + n)) -U postgres -Xqc 'SELECT 1' postgres >/dev/null 2>&1 && break
        sleep 1
    done
done

# Deal the tests out to the two servers, every other one (they are listed
# alphabetically, not by cost, so this is about even).
half() { local k=0 t; for t in "${@:2}"; do [ $((k++ % 2)) -eq "$1" ] && printf '%s ' "$t"; done; true; }
for n in 0 1; do
    tree="$work/tree"; [ $n -eq 1 ] && tree="$work/tree1"
    ( cd "$tree" &&
      PGHOST="$work" PGPORT=$((54331 + n)) PGUSER=postgres make -s PG_CONFIG="$PG_CONFIG" \
          REGRESS="$(half $n "${regress[@]}")" ISOLATION="$(half $n "${iso[@]}")" installcheck \
          >"$work/suite$n.out" 2>&1 ||
      { cat regression.diffs output_iso/regression.diffs 2>/dev/null; exit 1; } >>"$work/suite$n.out" ) &
    pids+=($!)
done
status=0
for n in 0 1; do
    if ! wait "${pids[$n]}"; then status=1; fi
    cat "$work/suite$n.out"
done

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
if cat "$work"/server*.log >"$work/server.log"; grep -q "terminated by signal\|exited with exit code" "$work/server.log"; then
    echo "a backend died:"; grep -A3 "terminated by signal\|exited with exit code" "$work/server.log"
    status=1
fi
[ $status -eq 0 ] && echo "memcheck: suites clean under valgrind + UBSan ($(ls "$work"/reports | wc -l) processes traced)"
exit $status
