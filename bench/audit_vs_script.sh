#!/bin/sh
# bench/audit_vs_script.sh BUILD_DIR [DIR] - `agentguard audit` against a
# script a user would write instead: bench/audit_reference.py reads every
# run with Python's json.load and replays seven peer rules (see its head).
# Rounds interleave the three (the script, audit --jobs 1, audit with one
# job per core) so that a slow spell of the shared machine hits all;
# printed: each round's wall times, the medians and ranges, the ratios
# audit / script (the goal: at most 1/3), the load average before and
# after. Figures only: it never fails on speed; it exits non-zero, saying
# why, when something is missing or a side fails.
#
# DIR: the runs (default $AG_SHARED_DIR/data/runs, else ../shared/data/runs
# beside the project). AG_AVS_ROUNDS=N rounds (default 5); AG_AVS_COPIES=N
# reads the folder N times per round (default 1; 4 makes the 640
# development runs about 70 MB, the issue's size).
set -u
die() {
  echo "audit_vs_script: $*" >&2
  exit 2
}
BUILD=${1:-build}
AG=$BUILD/agentguard
HERE=$(cd "$(dirname "$0")" && pwd)
[ -x "$AG" ] || die "no $AG (build first: make build)"
command -v python3 >/dev/null 2>&1 || die "python3 not found"
DIR=${2:-${AG_SHARED_DIR:-$HERE/../../shared}/data/runs}
[ -d "$DIR" ] || die "no runs at $DIR (give DIR, or set AG_SHARED_DIR)"
ROUNDS=${AG_AVS_ROUNDS:-5}
COPIES=${AG_AVS_COPIES:-1}
JOBS=$(nproc)
set --
i=0
while [ $i -lt "$COPIES" ]; do
  set -- "$@" "$DIR"
  i=$((i + 1))
done
now() { date +%s.%N; }
TMP=$(mktemp -d /tmp/ag-avs.XXXXXX) || die "mktemp failed"
trap 'rm -rf "$TMP"' EXIT INT TERM
bytes=$(du -sb "$DIR" | cut -f1)
runs=$(ls "$DIR" | grep -c '\.json$')
echo "audit_vs_script: $runs runs x $COPIES ($((bytes * COPIES / 1048576)) MB) a round, $ROUNDS rounds; $JOBS cores"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %10s %10s %10s\n' round script_s jobs1_s jobs${JOBS}_s
r=1
while [ $r -le "$ROUNDS" ]; do
  t0=$(now)
  python3 "$HERE/audit_reference.py" "$@" >"$TMP/ref.txt" || die "the script failed"
  t1=$(now)
  "$AG" audit --preset default --quiet --jobs 1 "$@" >"$TMP/a1.txt" 2>&1
  rc=$?
  [ $rc -le 1 ] || die "audit --jobs 1 failed ($rc): $(cat "$TMP/a1.txt")"
  t2=$(now)
  "$AG" audit --preset default --quiet --jobs "$JOBS" "$@" >"$TMP/an.txt" 2>&1
  rc=$?
  [ $rc -le 1 ] || die "audit --jobs $JOBS failed ($rc): $(cat "$TMP/an.txt")"
  t3=$(now)
  awk -v r="$r" -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" \
    'BEGIN { printf "%-6s %10.3f %10.3f %10.3f\n", r, b - a, c - b, d - c }' |
    tee -a "$TMP/sum"
  r=$((r + 1))
done
awk '{ n++; s[n] = $2; a[n] = $3; b[n] = $4; ra[n] = $3 / $2; rb[n] = $4 / $2 }
     function med(x, n,   i, j, t) {
       for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
         if (x[j] < x[i]) { t = x[i]; x[i] = x[j]; x[j] = t }
       return n % 2 ? x[(n + 1) / 2] : (x[n / 2] + x[n / 2 + 1]) / 2 }
     function rng(x, n,   i, lo, hi) { lo = hi = x[1]
       for (i = 2; i <= n; i++) { if (x[i] < lo) lo = x[i]; if (x[i] > hi) hi = x[i] }
       return sprintf("%.3f-%.3f", lo, hi) }
     END {
       printf "script %.3f s (%s); audit --jobs 1 %.3f s (%s); audit --jobs N %.3f s (%s)\n",
         med(s, n), rng(s, n), med(a, n), rng(a, n), med(b, n), rng(b, n)
       printf "audit / script: --jobs 1 %.2f (%s), --jobs N %.2f (%s); goal <= 0.33\n",
         med(ra, n), rng(ra, n), med(rb, n), rng(rb, n)
     }' "$TMP/sum"
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
