#!/bin/sh
# scripts/fuzz.sh [TARGET...] - builds the libFuzzer targets of tests/fuzz/
# with clang (-fsanitize=fuzzer,address,undefined, in their own build
# folder) and runs each for a bounded time. Exits non-zero when a target
# crashes, leaks, times out, runs out of memory or breaks a property it
# checks, or when the build fails.
#
# TARGET is a name without "fuzz_" (config, scenario, trajectory, schema, proxy,
# relay, target, classify, jcs, content, stream); no TARGET: all of
# tests/fuzz/fuzz_*.c.
#
# Each target starts from its seed corpus (tests/fuzz/corpus/NAME/) and
# dictionary (tests/fuzz/NAME.dict). What it learns is kept in
# BUILD/corpus/NAME/ (never written back to the repository), so a second
# run goes on from there; a failing input is saved as
# BUILD/artifacts/NAME/crash-... (or leak-, timeout-, oom-) and the script
# prints the command that replays it.
#
# Environment:
#   FUZZ_SECONDS   time per target (default 60)
#   FUZZ_SEED      libFuzzer's -seed (default: a new one each run)
#   FUZZ_RUNS      stop each target after this many inputs (default: no
#                  limit; FUZZ_SECONDS still caps the time). With FUZZ_SEED
#                  and a fresh FUZZ_BUILD, a run is repeatable: the same
#                  inputs in the same order, so .ci/run fixes both and the
#                  same command run before landing tries what CI will try
#                  (see docs/testing.md).
#   FUZZ_BUILD     build folder (default build-fuzz)
#   FUZZ_RSS_MB    memory limit per target (default 2048)
#   FUZZ_TIMEOUT   seconds one input may take (default 10)
#   JOBS           parallel compile jobs (default 2)
#   CC             the compiler (default clang)
set -u

die() {
  echo "scripts/fuzz.sh: error: $*" >&2
  exit 1
}

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SECONDS_EACH=${FUZZ_SECONDS:-60}
BUILD=${FUZZ_BUILD:-build-fuzz}
RSS_MB=${FUZZ_RSS_MB:-2048}
TIMEOUT=${FUZZ_TIMEOUT:-10}
JOBS=${JOBS:-2}
CC=${CC:-clang}
case $SECONDS_EACH in '' | *[!0-9]*) die "FUZZ_SECONDS must be a whole number of seconds" ;; esac
SEED=${FUZZ_SEED:-}
case $SEED in *[!0-9]*) die "FUZZ_SEED must be a whole number" ;; esac
RUNS=${FUZZ_RUNS:-}
case $RUNS in *[!0-9]*) die "FUZZ_RUNS must be a whole number" ;; esac
seedopt=""
norand=""
# -reload=0: read the corpus folder once, so nothing timed changes the order;
# setarch -R: the same addresses in every run (address-dependent paths, such
# as hash tables of pointers, otherwise change the coverage the fuzzer
# follows), when the machine allows it
if [ -n "$SEED" ]; then
  seedopt="-seed=$SEED -reload=0"
  setarch "$(uname -m)" -R true 2>/dev/null && norand="setarch $(uname -m) -R"
fi
[ -n "$RUNS" ] && seedopt="$seedopt -runs=$RUNS"
[ "$SECONDS_EACH" -gt 0 ] || die "FUZZ_SECONDS must be positive"

command -v "$CC" >/dev/null 2>&1 || die "$CC not found (Debian: apt-get install clang $(sh "$(dirname "$0")/clang-rt.sh"))"
"$CC" --version 2>/dev/null | grep -q clang || die "$CC is not clang: libFuzzer needs clang"

cd "$ROOT" || die "cannot enter $ROOT"
case $BUILD in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac

if [ $# -eq 0 ]; then
  set --
  for src in tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    set -- "$@" "${name#fuzz_}"
  done
fi
for t in "$@"; do
  [ -f "tests/fuzz/fuzz_$t.c" ] || die "no target '$t' (tests/fuzz/fuzz_$t.c)"
done

echo "== fuzz: configure and build in $BUILD ($CC, address + undefined)"
mkdir -p "$BUILD" || die "cannot create $BUILD"
CC=$CC cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DAG_SANITIZE=address,undefined -DAG_FUZZ=ON -DAG_WERROR=ON \
  -DAG_BUILD_TESTS=OFF -DAG_BUILD_BENCH=OFF >"$BUILD/configure.log" 2>&1 || {
  cat "$BUILD/configure.log" >&2
  die "cmake configure failed"
}
targets=""
for t in "$@"; do targets="$targets fuzz_$t"; done
# shellcheck disable=SC2086 # a word list on purpose
cmake --build "$BUILD" -j "$JOBS" --target $targets || die "build failed"

# Leaks are reported by LeakSanitizer at the end of each input (libFuzzer's
# -detect_leaks=1, the default); UBSan findings abort (AG_SANITIZE builds
# with -fno-sanitize-recover=all).
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:symbolize=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

failed=""
summary=""
for t in "$@"; do
  work=$BUILD/corpus/$t
  art=$BUILD/artifacts/$t
  log=$BUILD/logs/$t.log
  mkdir -p "$work" "$art" "$BUILD/logs" || die "cannot create $work"
  dict=""
  [ -f "tests/fuzz/$t.dict" ] && dict="-dict=tests/fuzz/$t.dict"
  seeds=""
  [ -d "tests/fuzz/corpus/$t" ] && seeds="tests/fuzz/corpus/$t"
  echo "== fuzz_$t: ${SECONDS_EACH}s (log: $log)"
  start=$(date +%s)
  # shellcheck disable=SC2086 # norand, dict, seeds and seedopt are word lists
  $norand "$BUILD/fuzz_$t" -max_total_time="$SECONDS_EACH" -rss_limit_mb="$RSS_MB" \
    -timeout="$TIMEOUT" -print_final_stats=1 -artifact_prefix="$art/" \
    $seedopt $dict "$work" $seeds >"$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
  line=$(printf '%-12s %5ss %11s runs %7s exec/s  %-10s' "$t" "$secs" \
    "${runs:-?}" "${speed:-?}" "${cov:-cov: ?}")
  if [ "$rc" -ne 0 ]; then
    failed="$failed $t"
    summary="$summary$line  FAILED (exit $rc)
"
    echo "---- fuzz_$t failed (exit $rc); the end of its log:" >&2
    tail -n 60 "$log" >&2
    for a in "$art"/*; do
      [ -f "$a" ] && echo "replay: $BUILD/fuzz_$t $a" >&2
    done
  else
    summary="$summary$line  ok
"
  fi
done

echo "== fuzz summary (${SECONDS_EACH}s each)"
printf '%s' "$summary"
[ -z "$failed" ] || die "these fuzz targets failed:$failed"
exit 0
