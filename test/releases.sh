#!/usr/bin/env bash
# test/releases.sh OUTDIR: builds every released version of the extension, for
# the upgrade test (test/t/005_upgrade.pl), which runs each one's own library
# before it upgrades to the current build.
#
# The released versions and their commits are the "Released at `<commit>`"
# lines of CHANGELOG.md (the one list of them).  Each is built from `git
# archive <commit>` with its own Makefile (the compiler flags it shipped
# with) and the server's PGXS, and installed with DESTDIR into a private copy
# of the PostgreSQL installation, OUTDIR/<version>/ (the server's binaries,
# libraries and share directory, without the installed status_history, plus
# that version's build), as bench/compare.sh does; the system's installation
# is not touched.  The versions build in parallel.
#
# Writes OUTDIR/releases, one line per version that built:
#   <version> <commit> <installation directory (holds bin/, lib/)>
# OUTDIR/<version>.log with each build's output, and OUTDIR/<version>.README.md,
# the README.md of the release commit (the upgrade test applies that version's
# own recipe of roles and privileges before it upgrades).  Exits non-zero when a
# version is listed wrongly or fails to build (the others are still built).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: test/releases.sh OUTDIR" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
out=$1
mkdir -p "$out"
out=$(cd "$out" && pwd)
pg_config=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
bindir=$("$pg_config" --bindir)
instdir=$(dirname "$bindir")               # /usr/lib/postgresql/15: bin/, lib/
sharedir=$("$pg_config" --sharedir)         # /usr/share/postgresql/15
pkglibdir=$("$pg_config" --pkglibdir)
# (A checkout owned by another user than root is still one git may read.)
git=(git -C "$repo" -c safe.directory="$repo")

# The released versions: a "## <version> ..." heading, then in its section
# one line "Released at `<40-hex commit>` ...".
releases=$(awk '
    /^## / { v = $2 }
    /^Released at `[0-9a-f]+`/ {
        c = $0; sub(/^Released at `/, "", c); sub(/`.*/, "", c)
        print v, c
    }' "$repo/CHANGELOG.md")
[ -n "$releases" ] || { echo "releases.sh: no \"Released at\" line in CHANGELOG.md" >&2; exit 1; }

status=0
# A version listed wrongly is not built; why goes to its log too, which the
# upgrade test shows.
refuse() { echo "releases.sh: $2" | tee "$out/$1.log" >&2; status=1; }
pids=()
: >"$out/releases.tmp"
declare -A seen
while read -r v commit; do
    if [ -n "${seen[$v]:-}" ]; then
        refuse "$v" "CHANGELOG.md: $v is released twice (at ${seen[$v]} and $commit)"
        continue
    fi
    seen[$v]=$commit
    if ! [[ $commit =~ ^[0-9a-f]{40}$ ]] || ! "${git[@]}" rev-parse -q --verify "$commit^{commit}" >/dev/null; then
        refuse "$v" "CHANGELOG.md: $v is released at \"$commit\", which is not a full commit hash of this repository"
        continue
    fi
    shipped=$("${git[@]}" show "$commit:status_history.control" | sed -n "s/^default_version *= *'\(.*\)'/\1/p")
    if [ "$shipped" != "$v" ]; then
        refuse "$v" "CHANGELOG.md: $v is released at $commit, whose status_history.control has default_version '$shipped'"
        continue
    fi
    (
        set -e
        d="$out/$v"
        mkdir -p "$out/src-$v" "$d$(dirname "$instdir")" "$d$(dirname "$sharedir")"
        "${git[@]}" archive "$commit" | tar -x -C "$out/src-$v"
        cp "$out/src-$v/README.md" "$out/$v.README.md"
        cp -a "$instdir" "$d$(dirname "$instdir")/"
        cp -a "$sharedir" "$d$(dirname "$sharedir")/"
        rm -rf "$d$sharedir"/extension/status_history[-.]* "$d$pkglibdir"/status_history.so \
            "$d$pkglibdir"/bitcode/status_history "$d$pkglibdir"/bitcode/status_history.index.bc
        make -C "$out/src-$v" -j2 PG_CONFIG="$pg_config"
        make -C "$out/src-$v" PG_CONFIG="$pg_config" install DESTDIR="$d"
        rm -rf "$out/src-$v"
        echo "$v $commit $d$instdir" >>"$out/releases.tmp"
    ) >"$out/$v.log" 2>&1 &
    pids+=("$!:$v")
done <<<"$releases"
for p in "${pids[@]}"; do
    if ! wait "${p%%:*}"; then
        echo "releases.sh: ${p#*:} did not build (its output: $out/${p#*:}.log):" >&2
        tail -n 20 "$out/${p#*:}.log" >&2
        status=1
    fi
done
sort -V "$out/releases.tmp" >"$out/releases"
rm -f "$out/releases.tmp"
exit $status
