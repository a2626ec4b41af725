#!/bin/sh
# tests/readme/walk.sh AGENTGUARD SOURCE_DIR WORK_DIR - runs every
# `build/agentguard ...` command of README.md's shell blocks as written, in
# a scratch folder that looks like a clone (build/agentguard, examples/),
# so that README's first page stays true. What a line needs is provided
# around it, never by editing the line: the files it names as its own
# (my_scenario.json, my.json), a ~/project, and for `run` a model - the
# fake API of tests/agents/upstream.mjs (MODEL=normal: one call, then an
# answer), reached through AGENTGUARD_BASE_URL, or on port 11434 for the
# Ollama line. Bracketed parts of a synopsis line ([--workdir DIR]) are
# left out. A `run` without a TASK is an interactive session: it gets a
# pseudo-terminal (util-linux's script), one message and "exit", and must
# end with 0. `proxy` is started, must say it listens, and must end with 0
# on SIGTERM. Every other line must exit with a code docs/cli.md gives for
# a run that was not refused: 0 (done) or 3 (stopped), never 2 (refused)
# or a crash. Exits 77 (a visible skip) without node.
set -u
BIN=$1 SRC=$2 WORK=$3
command -v node >/dev/null 2>&1 || { echo "SKIP: node is needed (apt-get install nodejs)"; exit 77; }
rm -rf "$WORK" && mkdir -p "$WORK/build" "$WORK/home/project" || exit 1
ln -s "$BIN" "$WORK/build/agentguard"
ln -s "$SRC/examples" "$WORK/examples"
cp "$SRC/examples/scenarios/forge_identical_errors.json" "$WORK/my_scenario.json"
printf '{"preset": "hpd", "loop": {"max_iterations": 30}}\n' >"$WORK/my.json"
cd "$WORK" || exit 1
export HOME="$WORK/home" AGENTGUARD_NO_CONFIG=1 NO_COLOR=1

# the fake model, on 11434 when free (README's Ollama line), else any port
up() { # port
  PORT=$1 MODEL=normal node "$SRC/tests/agents/upstream.mjs" >"$WORK/up$1.out" 2>&1 &
  echo $! >"$WORK/up$1.pid"
  i=0
  while [ $i -lt 100 ] && ! grep -q '^port ' "$WORK/up$1.out"; do sleep 0.1; i=$((i + 1)); done
  sed -n 's/^port //p' "$WORK/up$1.out"
}
PORT_ANY=$(up 0)
PORT_OLLAMA=$(up 11434)
trap 'kill $(cat "$WORK"/up*.pid) 2>/dev/null' EXIT
[ -n "$PORT_ANY" ] || { echo "FAIL: the fake model did not start"; cat "$WORK/up0.out"; exit 1; }
export AGENTGUARD_BASE_URL="http://127.0.0.1:$PORT_ANY/v1"

# README's shell blocks, the lines that start (after VAR=value words) with
# build/agentguard; a trailing "# comment" and [optional parts] dropped.
awk '/^```/ { f = !f; next } f' "$SRC/README.md" |
  grep -E '^([A-Z_]+=[^ ]+ )*build/agentguard ' |
  sed -e 's/  *#.*$//' -e 's/ \[[^]]*\]//g' >"$WORK/lines"
n=$(wc -l <"$WORK/lines")
[ "$n" -ge 5 ] || { echo "FAIL: only $n commands found in README.md"; exit 1; }

fail=0 k=0
while IFS= read -r line; do
  k=$((k + 1))
  case $line in
  *"--base-url http://localhost:11434"*)
    if [ -z "$PORT_OLLAMA" ]; then
      echo "skip $k: port 11434 is taken: $line"; continue
    fi ;;
  esac
  case $line in
  *"build/agentguard proxy "*)
    sh -c "exec $line" </dev/null >"$WORK/out$k" 2>"$WORK/err$k" &
    pid=$! i=0
    while [ $i -lt 100 ] && ! grep -q 'listening on' "$WORK/err$k"; do sleep 0.1; i=$((i + 1)); done
    kill -TERM $pid 2>/dev/null
    wait $pid
    rc=$?
    if grep -q 'listening on' "$WORK/err$k" && [ $rc -eq 0 ]; then
      echo "ok   $k (listened, then exit 0 on SIGTERM): $line"
    else
      echo "FAIL $k: exit $rc: $line"; sed 's/^/  /' "$WORK/err$k"; fail=1
    fi
    continue ;;
  esac
  case $line in
  *"build/agentguard run "*\"*) sh -c "$line" </dev/null >"$WORK/out$k" 2>"$WORK/err$k" ;;
  *"build/agentguard run "*)
    command -v script >/dev/null 2>&1 || { echo "skip $k: no script(1): $line"; continue; }
    printf 'Say hello\nexit\n' | script -qec "$line" /dev/null >"$WORK/out$k" 2>"$WORK/err$k"
    rc=$?
    if [ $rc -eq 0 ] && grep -q 'All done' "$WORK/out$k"; then
      echo "ok   $k (a session on a terminal: answered, exit 0): $line"
    else
      echo "FAIL $k: exit $rc: $line"; sed 's/^/  /' "$WORK/out$k" "$WORK/err$k" | head -30; fail=1
    fi
    continue ;;
  *) sh -c "$line" </dev/null >"$WORK/out$k" 2>"$WORK/err$k" ;;
  esac
  rc=$?
  case $line in
  *"build/agentguard run "*) grep -q 'All done' "$WORK/out$k" || rc="$rc, no answer" ;;
  esac
  case $rc in
  0 | 3) echo "ok   $k (exit $rc): $line" ;;
  *) echo "FAIL $k: exit $rc: $line"; sed 's/^/  /' "$WORK/err$k" | head -20; fail=1 ;;
  esac
done <"$WORK/lines"
exit $fail
