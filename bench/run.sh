#!/bin/sh
# bench/run.sh BUILD_DIR - what `make bench` runs after building.
#
# 1. Runs every other benchmark in BUILD_DIR (bench_* executables other than
#    bench_guard) and prints its output.
# 2. Runs BUILD_DIR/bench_guard, which generates the call stream (fixed seed),
#    writes it as JSON Lines for step 4, and measures the guard, SHA-256 alone
#    and the guard's memory.
# 3. Installs @google/gemini-cli-core (pinned) into bench/.gemini/ unless it
#    is already there.
# 4. Runs bench/gemini/bench.mjs: Gemini CLI's LoopDetectionService on the
#    same stream, in the same run.
# 5. Prints a summary: ns per call for both, the ratios and the targets.
#
# Benchmarks print figures and never fail on speed. This script exits
# non-zero, saying why, when something is broken: a bench crashes or reports
# an error, node is missing, npm install fails.
#
# Environment:
#   AG_BENCH_QUICK=1       short smoke run (small stream, few rounds)
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
if [ "${AG_BENCH_QUICK:-0}" = 1 ]; then
  GUARD_ARGS="--quick"
  NODE_ARGS="--rounds 3 --warmup 1"
fi

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

# ---- 2. the guard ----
echo "==== bench_guard"
OUT=$WORK/guard.txt
# shellcheck disable=SC2086 # GUARD_ARGS is a word list on purpose
run_logged "$GUARD_BENCH" --write-stream "$WORK/stream.jsonl" $GUARD_ARGS
[ "$RC" = 0 ] || die "bench_guard failed (exit $RC); see its output above"
[ -s "$WORK/stream.jsonl" ] || die "bench_guard wrote no call stream"

# ---- 3. and 4. Gemini CLI's loop detector ----
if [ "${AG_BENCH_SKIP_GEMINI:-0}" = 1 ]; then
  echo
  echo "==== gemini: skipped (AG_BENCH_SKIP_GEMINI=1)"
  : >"$WORK/gemini.txt"
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

  echo
  echo "==== gemini: bench/gemini/bench.mjs"
  OUT=$WORK/gemini.txt
  # shellcheck disable=SC2086
  run_logged node "$ROOT/bench/gemini/bench.mjs" --prefix "$GEMINI_DIR" \
    --stream "$WORK/stream.jsonl" $NODE_ARGS
  [ "$RC" = 0 ] || die "the Gemini bench failed (exit $RC); see its output above"
fi

# ---- 5. summary ----
echo
cat "$WORK/guard.txt" "$WORK/gemini.txt" | awk '
  # collect "metric [key=value ...] value=N" lines
  /^[a-z0-9_]+ .*value=/ {
    key = $1
    for (i = 2; i < NF; i++) key = key " " $i
    v = $NF; sub(/^value=/, "", v)
    m[key] = v
  }
  function get(k) { return (k in m) ? m[k] : "" }
  function ratio(a, b) { return (a != "" && b != "" && b + 0 > 0) ? sprintf("%.2fx", a / b) : "-" }
  function verdict(ok) { return ok ? "met" : "NOT met" }
  END {
    print "==== summary (ns per call, medians over rounds; same stream for both)"
    printf "%-5s %10s %12s %10s %10s %13s %10s\n", "size", "guard", "guard check", "SHA-256", "gemini", "gemini/guard", "guard/SHA"
    n = split("64 1k", sizes, " ")
    for (i = 1; i <= n; i++) {
      s = sizes[i]
      g = get("guard_ns_per_call size=" s); c = get("guard_check_ns_per_call size=" s)
      h = get("sha256_ns_per_call size=" s); q = get("gemini_ns_per_call size=" s)
      printf "%-5s %10s %12s %10s %10s %13s %10s\n", s, g, c, h, (q == "" ? "-" : q), ratio(q, g), ratio(g, h)
    }
    print ""
    print "targets (figures only: benchmarks never fail on speed)"
    g64 = get("guard_ns_per_call size=64"); g1k = get("guard_ns_per_call size=1k")
    q64 = get("gemini_ns_per_call size=64"); q1k = get("gemini_ns_per_call size=1k")
    h1k = get("sha256_ns_per_call size=1k")
    if (q64 != "") printf "  >= 6x faster than Gemini at ~64 B:  %s  %s\n", ratio(q64, g64), verdict(q64 / g64 >= 6)
    if (q1k != "") printf "  >= 3x faster than Gemini at ~1 KiB: %s  %s\n", ratio(q1k, g1k), verdict(q1k / g1k >= 3)
    printf "  <= 2x SHA-256 alone at ~1 KiB:      %s  %s\n", ratio(g1k, h1k), verdict(g1k / h1k <= 2)
    printf "  (the issue measured Gemini at ~1700 / ~3600 ns: 6x and 3x of those are <= %.0f / %.0f ns;\n", 1700 / 6, 3600 / 3
    printf "   guard here: %s / %s ns)\n", g64, g1k
    print ""
    printf "loops stopped per pass of the stream: guard %s / gemini %s (64), guard %s / gemini %s (1k)\n", \
      get("guard_stops_per_pass size=64"), (get("gemini_loops_per_pass size=64") == "" ? "-" : get("gemini_loops_per_pass size=64")), \
      get("guard_stops_per_pass size=1k"), (get("gemini_loops_per_pass size=1k") == "" ? "-" : get("gemini_loops_per_pass size=1k"))
    for (k in m) if (k ~ /^guard_heap_bytes checks=/) { split(k, a, "="); checks[a[2]] = 1 }
    lo = 1e18; hi = 0
    for (c in checks) { if (c + 0 < lo) lo = c + 0; if (c + 0 > hi) hi = c + 0 }
    print ""
    print "guard memory (heap: bytes malloc has handed out since before ag_guard_new; RSS: whole process)"
    printf "  %-22s %14s %12s\n", "", "heap (bytes)", "RSS (KiB)"
    printf "  %-22s %14s %12s\n", "before ag_guard_new", "0", get("guard_rss_before_new_kib")
    printf "  %-22s %14s %12s\n", "after ag_guard_new", get("guard_new_heap_bytes"), get("guard_new_rss_kib")
    if (hi > 0) {
      printf "  %-22s %14s %12s\n", sprintf("after %d checks", lo), get("guard_heap_delta_bytes checks=" lo), get("guard_rss_kib checks=" lo)
      printf "  %-22s %14s %12s\n", sprintf("after %d checks", hi), get("guard_heap_delta_bytes checks=" hi), get("guard_rss_kib checks=" hi)
    }
  }'

if [ -n "$failed" ]; then
  die "these benchmarks failed:$failed"
fi
exit 0
