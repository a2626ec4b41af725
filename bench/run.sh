#!/bin/sh
# bench/run.sh BUILD_DIR - what `make bench` runs after building.
#
# 1. Runs every other benchmark in BUILD_DIR (bench_* executables other than
#    bench_guard) and prints its output.
# 2. Runs BUILD_DIR/bench_guard --stream-only, which generates the four call
#    streams (fixed seeds) and writes them as JSON Lines for step 4.
# 3. Installs @google/gemini-cli-core (pinned) into bench/.gemini/ unless it
#    is already there.
# 4. Interleaves the two sides on the same streams: bench_guard --no-memory
#    (the guard and SHA-256 alone), then bench/gemini/bench.mjs (Gemini CLI's
#    LoopDetectionService), then the guard again, and so on, AG_BENCH_RUNS
#    times each, so that a slow spell of the shared machine hits both sides.
#    Then bench_guard --memory-only: the guard's memory.
# 5. Prints a summary: for each stream and side, the median and the range
#    (min-max) over the runs of each run's median ns per call; the ratio
#    Gemini / guard of each run's pair, median and range; the targets; the
#    machine's load average before and after.
#
# Benchmarks print figures and never fail on speed. This script exits
# non-zero, saying why, when something is broken: a bench crashes or reports
# an error, node is missing, npm install fails.
#
# Environment:
#   AG_BENCH_QUICK=1       short smoke run (small stream, few rounds, 2 runs)
#   AG_BENCH_RUNS=N        interleaved runs of each side (default 5)
#   AG_BENCH_GEMINI_DIR    npm prefix for the Gemini package
#                          (default: bench/.gemini beside this script)
#   AG_BENCH_SKIP_GEMINI=1 skip steps 3-4 (no node needed)
set -u

GEMINI_CORE_VERSION=0.61.0
NODE_MIN_MAJOR=20

die() {
  echo "bench/run.sh: error: $*" >&2
  exit 1
}

[ $# -eq 1 ] || die "usage: sh bench/run.sh BUILD_DIR"
BUILD_DIR=$1
[ -d "$BUILD_DIR" ] || die "build directory $BUILD_DIR does not exist (run make build first)"
BUILD_DIR=$(cd "$BUILD_DIR" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
GUARD_BENCH=$BUILD_DIR/bench_guard
GEMINI_DIR=${AG_BENCH_GEMINI_DIR:-$ROOT/bench/.gemini}
[ -x "$GUARD_BENCH" ] ||
  die "$GUARD_BENCH not found: configure with -DAG_BUILD_BENCH=ON and build"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/agentguard-bench.XXXXXX") ||
  die "cannot create a temporary directory"
trap 'rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

GUARD_ARGS=""
NODE_ARGS=""
RUNS=${AG_BENCH_RUNS:-5}
if [ "${AG_BENCH_QUICK:-0}" = 1 ]; then
  GUARD_ARGS="--quick"
  NODE_ARGS="--rounds 3 --warmup 1"
  RUNS=${AG_BENCH_RUNS:-2}
fi
case $RUNS in
'' | *[!0-9]* | 0) die "AG_BENCH_RUNS must be a positive integer, not '$RUNS'" ;;
esac

# Runs "$@" with its output shown and also saved to the file $OUT; sets RC to
# its exit status (a plain pipe into tee would hide it).
run_logged() {
  { "$@" 2>&1; echo $? >"$WORK/rc"; } | tee "$OUT"
  RC=$(cat "$WORK/rc")
}

failed=""

# ---- 1. the other benchmarks ----
for exe in "$BUILD_DIR"/bench_*; do
  if [ ! -f "$exe" ] || [ ! -x "$exe" ]; then continue; fi
  name=$(basename "$exe")
  [ "$name" = bench_guard ] && continue
  echo "==== $name"
  OUT=$WORK/$name.txt
  run_logged "$exe"
  if [ "$RC" != 0 ]; then
    echo "bench/run.sh: $name failed (exit $RC)" >&2
    failed="$failed $name"
  fi
  echo
done

# ---- 2. the call streams ----
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")
# shellcheck disable=SC2086 # GUARD_ARGS is a word list on purpose
"$GUARD_BENCH" --stream-only --write-stream "$WORK/stream.jsonl" $GUARD_ARGS ||
  die "bench_guard --stream-only failed"
[ -s "$WORK/stream.jsonl" ] || die "bench_guard wrote no call stream"

# ---- 3. Gemini CLI's loop detector, installed ----
GEMINI=1
if [ "${AG_BENCH_SKIP_GEMINI:-0}" = 1 ]; then
  echo
  echo "==== gemini: skipped (AG_BENCH_SKIP_GEMINI=1)"
  GEMINI=0
else
  command -v node >/dev/null 2>&1 ||
    die "node not found; the Gemini comparison needs Node.js >= $NODE_MIN_MAJOR (or set AG_BENCH_SKIP_GEMINI=1)"
  command -v npm >/dev/null 2>&1 || die "npm not found (needed to install @google/gemini-cli-core)"
  node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null) ||
    die "node does not run"
  [ "$node_major" -ge "$NODE_MIN_MAJOR" ] 2>/dev/null ||
    die "node $(node --version) is too old; @google/gemini-cli-core needs >= $NODE_MIN_MAJOR"

  pkg_json=$GEMINI_DIR/node_modules/@google/gemini-cli-core/package.json
  have=""
  [ -f "$pkg_json" ] && have=$(node -p "require(process.argv[1]).version" "$pkg_json" 2>/dev/null)
  echo
  if [ "$have" = "$GEMINI_CORE_VERSION" ]; then
    echo "==== gemini: @google/gemini-cli-core $have already in $GEMINI_DIR"
  else
    echo "==== gemini: installing @google/gemini-cli-core@$GEMINI_CORE_VERSION into $GEMINI_DIR"
    mkdir -p "$GEMINI_DIR" || die "cannot create $GEMINI_DIR"
    # --ignore-scripts: the detector is plain JavaScript; the package's native
    # optional parts (pty, keychain, tree-sitter) are not needed, and no
    # install script has to run for a benchmark.
    if ! npm install --no-audit --no-fund --ignore-scripts \
      --prefix "$GEMINI_DIR" "@google/gemini-cli-core@$GEMINI_CORE_VERSION" \
      >"$WORK/npm.log" 2>&1; then
      echo "---- npm install output (last 40 lines)" >&2
      tail -n 40 "$WORK/npm.log" >&2
      die "npm install of @google/gemini-cli-core@$GEMINI_CORE_VERSION failed (is the npm registry reachable?)"
    fi
    have=$(node -p "require(process.argv[1]).version" "$pkg_json" 2>/dev/null)
    [ "$have" = "$GEMINI_CORE_VERSION" ] ||
      die "npm install finished but $pkg_json does not say version $GEMINI_CORE_VERSION"
  fi

fi

# ---- 4. the two sides, interleaved; then the guard's memory ----
run=1
while [ "$run" -le "$RUNS" ]; do
  echo
  echo "==== run $run of $RUNS: bench_guard"
  OUT=$WORK/guard.$run.txt
  # shellcheck disable=SC2086
  run_logged "$GUARD_BENCH" --no-memory $GUARD_ARGS
  [ "$RC" = 0 ] || die "bench_guard failed (exit $RC); see its output above"
  if [ "$GEMINI" = 1 ]; then
    echo
    echo "==== run $run of $RUNS: gemini (bench/gemini/bench.mjs)"
    OUT=$WORK/gemini.$run.txt
    # shellcheck disable=SC2086
    run_logged node "$ROOT/bench/gemini/bench.mjs" --prefix "$GEMINI_DIR" \
      --stream "$WORK/stream.jsonl" $NODE_ARGS
    [ "$RC" = 0 ] || die "the Gemini bench failed (exit $RC); see its output above"
  fi
  run=$((run + 1))
done
echo
echo "==== bench_guard --memory-only"
OUT=$WORK/memory.txt
# shellcheck disable=SC2086
run_logged "$GUARD_BENCH" --memory-only $GUARD_ARGS
[ "$RC" = 0 ] || die "bench_guard --memory-only failed (exit $RC)"
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?")

# ---- 5. summary ----
echo
{
  for f in "$WORK"/guard.*.txt "$WORK"/gemini.*.txt; do
    [ -f "$f" ] || continue
    r=${f%.txt}; r=${r##*.}
    sed -n "s/^\([a-z0-9_]* size=[a-z0-9]*\) value=\(.*\)$/\1 run=$r value=\2/p" "$f"
  done
  sed -n 's/^\([a-z0-9_]*.*\) value=\(.*\)$/\1 run=mem value=\2/p' "$WORK/memory.txt"
} | awk -v runs="$RUNS" -v nproc="$(nproc 2>/dev/null || echo '?')" \
  -v cpu="$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)" \
  -v load_before="$LOAD_BEFORE" -v load_after="$LOAD_AFTER" '
  # lines: "<metric> [size=S] run=R value=V"
  {
    v = $NF; sub(/^value=/, "", v)
    r = $(NF - 1); sub(/^run=/, "", r)
    key = $1
    for (i = 2; i < NF - 1; i++) key = key " " $i
    if (r == "mem") { mem[key] = v; next }
    n[key]++; val[key, n[key]] = v; byrun[key, r] = v
    if (key ~ /^guard_ns_per_call size=/) { s = key; sub(/.*size=/, "", s); if (!(s in seen)) { seen[s] = 1; sets[++nsets] = s } }
  }
  function sortn(a, m,   i, j, t) { for (i = 2; i <= m; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t } }
  function med(a, m) { return m % 2 ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2 }
  # "median [min-max]" of the per-run values of key k
  function stat(k, fmt,   m, i, a) {
    m = n[k]; if (m == 0) return "-"
    for (i = 1; i <= m; i++) a[i] = val[k, i] + 0
    sortn(a, m)
    M[k] = med(a, m)
    return sprintf(fmt " [" fmt "-" fmt "]", med(a, m), a[1], a[m])
  }
  # the per-run ratio a/b (same run number), median and range
  function rstat(ka, kb,   m, i, a, r) {
    m = 0
    for (r = 1; r <= runs; r++) if (((ka, r) in byrun) && ((kb, r) in byrun) && byrun[kb, r] + 0 > 0) a[++m] = byrun[ka, r] / byrun[kb, r]
    if (m == 0) return "-"
    sortn(a, m)
    R = med(a, m)
    return sprintf("%.2fx [%.2f-%.2f]", med(a, m), a[1], a[m])
  }
  END {
    if (n["gemini_ns_per_call size=" sets[1]] > 0)
      printf "==== summary: %d interleaved runs of each side (guard, gemini, guard, ...) on the same streams\n", runs
    else
      printf "==== summary: %d runs of the guard (Gemini skipped)\n", runs
    printf "machine: %s cores, %s; load average (1, 5, 15 min) %s before, %s after\n", nproc, cpu, load_before, load_after
    print "each cell: the median over the runs of each run'"'"'s median ns per call [lowest-highest run]"
    print ""
    printf "%-6s %-24s %-24s %-24s %-26s %-22s %-20s\n", "stream", "guard", "guard check", "SHA-256 alone", "gemini", "gemini/guard", "guard/SHA"
    for (i = 1; i <= nsets; i++) {
      s = sets[i]
      g = stat("guard_ns_per_call size=" s, "%.1f"); gm[s] = M["guard_ns_per_call size=" s]
      c = stat("guard_check_ns_per_call size=" s, "%.1f")
      h = stat("sha256_ns_per_call size=" s, "%.1f")
      q = stat("gemini_ns_per_call size=" s, "%.1f")
      rq = rstat("gemini_ns_per_call size=" s, "guard_ns_per_call size=" s); ratio_q[s] = (rq == "-") ? "" : R
      rh = rstat("guard_ns_per_call size=" s, "sha256_ns_per_call size=" s); ratio_h[s] = R
      printf "%-6s %-24s %-24s %-24s %-26s %-22s %-20s\n", s, g, c, h, q, rq, rh
    }
    print ""
    print "targets (figures only: benchmarks never fail on speed; ratios are medians of the runs'"'"' own ratios)"
    if (ratio_q["64"] != "") printf "  >= 6x faster than Gemini at ~64 B:  %.2fx  %s\n", ratio_q["64"], (ratio_q["64"] >= 6 ? "met" : "NOT met")
    if (ratio_q["1k"] != "") printf "  >= 3x faster than Gemini at ~1 KiB: %.2fx  %s\n", ratio_q["1k"], (ratio_q["1k"] >= 3 ? "met" : "NOT met")
    if (ratio_h["1k"] != "") printf "  <= 2x SHA-256 alone at ~1 KiB:      %.2fx  %s\n", ratio_h["1k"], (ratio_h["1k"] <= 2 ? "met" : "NOT met")
    print ""
    printf "loops stopped per pass of each stream (guard / gemini):"
    for (i = 1; i <= nsets; i++) {
      s = sets[i]; kq = "gemini_loops_per_pass size=" s
      printf " %s %s / %s", s, byrun["guard_stops_per_pass size=" s, 1], ((kq, 1) in byrun) ? byrun[kq, 1] : "-"
    }
    print ""
    lo = 1e18; hi = 0
    for (k in mem) if (k ~ /^guard_heap_bytes checks=/) { c = k; sub(/.*checks=/, "", c); if (c + 0 < lo) lo = c + 0; if (c + 0 > hi) hi = c + 0 }
    print ""
    print "guard memory (heap: bytes malloc has handed out since before ag_guard_new; RSS: whole process)"
    printf "  %-22s %14s %12s\n", "", "heap (bytes)", "RSS (KiB)"
    printf "  %-22s %14s %12s\n", "before ag_guard_new", "0", mem["guard_rss_before_new_kib"]
    printf "  %-22s %14s %12s\n", "after ag_guard_new", mem["guard_new_heap_bytes"], mem["guard_new_rss_kib"]
    if (hi > 0) {
      printf "  %-22s %14s %12s\n", sprintf("after %d checks", lo), mem["guard_heap_delta_bytes checks=" lo], mem["guard_rss_kib checks=" lo]
      printf "  %-22s %14s %12s\n", sprintf("after %d checks", hi), mem["guard_heap_delta_bytes checks=" hi], mem["guard_rss_kib checks=" hi]
    }
  }'

if [ -n "$failed" ]; then
  die "these benchmarks failed:$failed"
fi
exit 0
