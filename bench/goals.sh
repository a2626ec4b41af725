#!/bin/sh
# bench/goals.sh BUILD_DIR [RUNS_DIR] - the throughput goals side by side in
# one run: the proxy's pass-through against the direct path (non-streamed
# and streamed, bench/throughput.sh), the audit against a script
# (bench/audit_vs_script.sh), structured arguments against SHA-256
# (BUILD_DIR/bench_jcs, every shape, and BUILD_DIR/bench_guard --only
# dense, the whole guard). Each part's own output is printed as it runs,
# then one table: each figure as a ratio, its goal, and whether this run
# met it, with the load average before and after.
#
# Figures only: it never fails on speed. A part that cannot run (no wrk or
# nginx, no runs to audit) is named in the table as not measured, and the
# script exits 2; it exits 0 when every part ran, met or not.
#
# RUNS_DIR: the recorded runs for the audit (default: what
# audit_vs_script.sh takes: $AG_SHARED_DIR/data/runs, else ../shared
# beside the project). Environment: AG_GOALS_ROUNDS (default 3, the
# rounds of the proxy and of the audit), AG_GOALS_SECONDS (5, a proxy
# round's length), AG_GOALS_COPIES (4: the audit reads the runs that many
# times a round - 640 runs four times is about the 69 MB of the goal).
set -u
die() {
  echo "goals: $*" >&2
  exit 2
}
[ $# -ge 1 ] || die "usage: sh bench/goals.sh BUILD_DIR [RUNS_DIR]"
BUILD=$1
[ -d "$BUILD" ] || die "no build directory $BUILD (run make build first)"
HERE=$(cd "$(dirname "$0")" && pwd)
ROUNDS=${AG_GOALS_ROUNDS:-3}
SECS=${AG_GOALS_SECONDS:-5}
COPIES=${AG_GOALS_COPIES:-4}
TMP=$(mktemp -d /tmp/ag-goals.XXXXXX) || die "mktemp failed"
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM
load() { cut -d' ' -f1-3 /proc/loadavg; }
LOAD0=$(load)
missing=0

echo "goals: load average before: $LOAD0; cores: $(nproc)"
echo ""
echo "== the proxy's pass-through (bench/throughput.sh)"
AG_TP_ROUNDS=$ROUNDS AG_TP_SECONDS=$SECS AG_TP_MODES="whole stream" \
  sh "$HERE/throughput.sh" "$BUILD" 2>&1 | tee "$TMP/tp"
echo ""
echo "== the audit against a script (bench/audit_vs_script.sh)"
AG_AVS_ROUNDS=$ROUNDS AG_AVS_COPIES=$COPIES \
  sh "$HERE/audit_vs_script.sh" "$BUILD" ${2:+"$2"} 2>&1 | tee "$TMP/avs"
echo ""
echo "== structured arguments against SHA-256 (bench_jcs, bench_guard --only dense)"
if [ -x "$BUILD/bench_jcs" ]; then
  "$BUILD/bench_jcs" 2>&1 | tee "$TMP/jcs"
else
  echo "no $BUILD/bench_jcs (configure with -DAG_BUILD_BENCH=ON)" | tee "$TMP/jcs"
fi
if [ -x "$BUILD/bench_guard" ]; then
  "$BUILD/bench_guard" --no-memory --only dense 2>&1 | tee "$TMP/guard"
else
  echo "no $BUILD/bench_guard" | tee "$TMP/guard"
fi
LOAD1=$(load)

# The summary line of a throughput.sh mode ("whole" or "stream").
tp_summary() {
  awk -v m="== $1 replies" 'index($0, m) == 1 { on = 1; next }
       on && /^summary:/ { print; exit }' "$TMP/tp"
}
# row LABEL VALUE GOAL OP LIMIT: one line of the table; VALUE empty when the
# part did not run.
row() {
  if [ -z "$2" ]; then
    printf '%-52s %16s  %-10s %s\n' "$1" "-" "$3" "not measured"
    missing=1
    return
  fi
  if [ "$4" = "-" ]; then
    printf '%-52s %16s  %-10s %s\n' "$1" "$2" "-" "(no goal)"
    return
  fi
  met=$(awk -v v="$2" -v op="$4" -v l="$5" \
    'BEGIN { ok = op == ">=" ? v + 0 >= l + 0 : v + 0 <= l + 0
             print ok ? "met" : "not met" }')
  printf '%-52s %16s  %-10s %s\n' "$1" "$2" "$3" "$met"
}
field() { # the number after TEXT in LINE
  printf '%s\n' "$2" | sed -n "s|.*$1 \([-0-9.]*\).*|\1|p"
}

whole=$(tp_summary whole)
stream=$(tp_summary stream)
w_ratio=$(field "requests/s median" "$whole")
w_p50=$(field "added p50" "$whole")
w_p99=$(field "added p99" "$whole")
w_cpu=$(field "CPU per request" "$whole")
s_ratio=$(field "requests/s median" "$stream")
avs=$(grep '^audit / script:' "$TMP/avs")
a_n=$(field "--jobs N" "$avs")
a_1=$(field "--jobs 1" "$avs")
# bench_jcs: the highest sig/SHA of any shape, and which; the row's label
# is the text before its byte count
jcs_worst=$(awk '/^args/ { on = 1; next } on && NF >= 10 && $(NF - 1) ~ /^[0-9.]+$/ {
    v = $(NF - 1); l = substr($0, 1, 8); gsub(/ +$/, "", l)
    if (v + 0 > w + 0) { w = v; wl = l } }
  END { if (wl != "") printf "%s %s\n", w, wl }' "$TMP/jcs")
j_ratio=${jcs_worst%% *}
j_shape=${jcs_worst#* }
g_ratio=$(sed -n 's/^guard_over_sha256 size=dense value=\([0-9.]*\)$/\1/p' "$TMP/guard")

echo ""
echo "== goals (issue 23), this run; load average before $LOAD0, after $LOAD1"
printf '%-52s %16s  %-10s %s\n' "figure" "measured" "goal" ""
row "non-streamed: proxy / direct requests/s (median)" "$w_ratio" ">= 0.35" ">=" 0.35
row "non-streamed: added latency p50, ms" "$w_p50" "<= 1" "<=" 1
row "non-streamed: added latency p99, ms" "$w_p99" "<= 5" "<=" 5
row "streamed: proxy / direct requests/s (median)" "$s_ratio" ">= 0.85" ">=" 0.85
row "proxy CPU per non-streamed request, us" "$w_cpu" "<= 60" "<=" 60
row "audit / script wall time (--jobs $(nproc))" "$a_n" "<= 0.33" "<=" 0.33
row "audit / script wall time (--jobs 1)" "$a_1" "-" "-" -
row "signature / SHA-256, worst shape (${j_shape:-?})" "$j_ratio" "<= 3" "<=" 3
row "guard per call / SHA-256, dense structured stream" "$g_ratio" "<= 3" "<=" 3
[ $missing -eq 0 ] || exit 2
exit 0
