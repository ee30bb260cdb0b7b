#!/usr/bin/env bash
# bench/chart.sh RESULTS.tsv CHART.png [TITLE]: a chart of bench/run.sh's
# figures, one horizontal bar per figure that has a target, at its ratio
# against that target -- (ext / base) / target for a rate (higher is better),
# target / (ext / base) for a time (lower is better) -- so that 1 is exactly
# at the target and more is better for every bar: a bar right of the line at
# 1 is met (green), left of it is not (red).  Log scale, so 2x better and 2x
# worse are as long.  Rows without a target ("-") or that are no ratio
# (counts) are left out.  Run by bench/run.sh; redraws a kept results file.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: bench/chart.sh RESULTS.tsv CHART.png [TITLE]" >&2; exit 2; }
tsv=$1 png=$2 title=${3:-status_history bench}

if ! command -v gnuplot >/dev/null; then
    echo "chart: gnuplot is not installed (Debian: apt-get install gnuplot-nox; test/deps.sh installs it): no chart written" >&2
    exit 3
fi

data=$(mktemp)
trap 'rm -f "$data"' EXIT
# index, score (>= 1: met), met, label, value text; then a line "N lo hi":
# how many rows, the lowest and the highest score.
chart_rows() {
    awk -F'\t' -v OFS='\t' '
        ($6 == "rate" || $6 == "time") && $7 != "-" && $3 > 0 && $4 > 0 {
            ratio = $3 / $4
            if ($6 == "rate") { score = ratio / $7; cmp = ">=" } else { score = $7 / ratio; cmp = "<=" }
            if (n == 0 || score < lo) lo = score
            if (n == 0 || score > hi) hi = score
            print n++, score, (score >= 1), $1, sprintf("%.2f %s  (ext/base %.3f, target %s %s)", score, (score >= 1) ? "met" : "NOT met", ratio, cmp, $7)
        }
        END { printf "%d\t%g\t%g\n", n, (n ? lo : 1), (n ? hi : 1) }' "$1"
}
chart_rows "$tsv" >"$data"
read -r n lo hi <<<"$(tail -n 1 "$data")"
sed -i '$d' "$data"
if [ "$n" = 0 ]; then
    echo "chart: no figure with a target among the rows of $tsv: no chart written" >&2
    exit 0
fi
met=$(awk -F'\t' '$3 == 1' "$data" | wc -l)

# pngcairo where gnuplot has it (antialiased), else libgd's png.
term=png
gnuplot -e 'set terminal pngcairo' >/dev/null 2>&1 && term=pngcairo
mkdir -p "$(dirname "$png")"
gnuplot <<EOF
set terminal $term size 1500,$((140 + 30 * n)) font "DejaVu Sans,10" noenhanced
set output "$png"
set datafile separator "\t"
set title "${title//\"/}\n$met of $n figures at or past their target (right of the line)"
set xlabel "ratio against the target: (ext/base) / target for rates, target / (ext/base) for times  (1 = at the target, > 1 = met)"
set logscale x 2
set format x "%g"
set xrange [$(awk -v lo="$lo" -v hi="$hi" 'BEGIN { if (lo > 0.5) lo = 0.5; if (hi < 2) hi = 2; printf "%g:%g", lo / 1.5, hi * 8 }')]
set yrange [$n - 0.4:-0.6]
set ytics nomirror scale 0
set grid xtics
set style fill solid 0.85 noborder
set arrow from 1, graph 0 to 1, graph 1 nohead lw 2 lc rgb "black" front
unset key
plot "$data" using 2:1:(\$2 < 1 ? \$2 : 1):(\$2 < 1 ? 1 : \$2):(\$1 - 0.35):(\$1 + 0.35):(\$3 > 0 ? 0x2e8b57 : 0xc0392b):ytic(4) \
         with boxxyerror lc rgb variable, \
     "$data" using (\$2 < 1 ? 1 : \$2):1:5 with labels left offset char 0.6, 0
EOF
echo "chart: $met of $n figures with a target met"
