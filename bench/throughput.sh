#!/bin/sh
# bench/throughput.sh BUILD_DIR - the proxy's pass-through against the
# direct path, with one load generator (wrk, Debian's) for both, rounds
# interleaved (direct, proxy, direct, proxy, ...) so that a slow spell of
# the shared machine hits both sides.
#
# The upstream is Debian's nginx (one worker) answering every POST with a
# canned Chat Completions reply, one port per form:
#   whole   a chat.completion without calls;
#   stream  50 chunks of text, then the finish and [DONE], each event its
#           own write (nginx's echo module, echo_flush), as a server that
#           streams sends them - with no pause between them, so the
#           upstream is as fast as it can be;
#   burst   the same events in one write (nginx's return): every event
#           reaches the proxy at once; the proxy's CPU per stream under the
#           most pressure, against a direct path that no streaming server
#           would be. The request (bench/throughput.lua) is a guarded one: a turn
# with tools and one answered call, so the proxy reads it, replays it
# through a fresh guard and checks the reply - the whole decision, every
# time. The proxy runs with the default preset and no access log.
#
# Printed per round and summed up: requests/s direct and through the
# proxy and their ratio; latency p50 and p99 of each side (wrk --latency)
# and the proxy's added latency; the proxy's CPU per request (its user +
# system time from /proc over the requests of its rounds); the load
# average before and after. Figures only: it never fails on speed. It exits
# non-zero, saying why, when something is missing or broken.
#
# Environment:
#   AG_TP_ROUNDS=N      interleaved rounds of each side (default 3)
#   AG_TP_SECONDS=S     seconds per round (default 5)
#   AG_TP_CONNS=N       wrk connections (default 64)
#   AG_TP_THREADS=N     wrk threads (default 2)
#   AG_TP_MODES="whole stream burst"  which replies to measure
set -u
PATH=$PATH:/usr/sbin
die() {
  echo "throughput: $*" >&2
  exit 2
}
BUILD=${1:-build}
AG=$BUILD/agentguard
[ -x "$AG" ] || die "no $AG (build first: make build)"
command -v wrk >/dev/null 2>&1 || die "wrk not found (Debian: apt-get install wrk)"
command -v nginx >/dev/null 2>&1 || die "nginx not found (Debian: apt-get install nginx-light)"
ROUNDS=${AG_TP_ROUNDS:-3}
SECS=${AG_TP_SECONDS:-5}
CONNS=${AG_TP_CONNS:-64}
THREADS=${AG_TP_THREADS:-2}
MODES=${AG_TP_MODES:-whole stream burst}
ECHO_MOD=/usr/lib/nginx/modules/ngx_http_echo_module.so
[ -f "$ECHO_MOD" ] ||
  die "no $ECHO_MOD (the streamed upstream; Debian: apt-get install libnginx-mod-http-echo)"
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d /tmp/ag-throughput.XXXXXX) || die "mktemp failed"
NGINX_PID=""
PROXY_PID=""
cleanup() {
  # shellcheck disable=SC2086 # two pids
  [ -n "$PROXY_PID" ] && kill $PROXY_PID 2>/dev/null
  [ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null
  wait 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

# A free port (bound then released by the kernel's choice).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
command -v python3 >/dev/null 2>&1 || die "python3 not found (to pick free ports)"
P_WHOLE=$(free_port)
P_STREAM=$(free_port)
P_BURST=$(free_port)
P_PROXY_W=$(free_port)
P_PROXY_S=$(free_port)
P_PROXY_B=$(free_port)

# The canned replies.
WHOLE='{"id":"chatcmpl-bench","object":"chat.completion","created":1,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"The file says hello."},"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":6,"total_tokens":126}}'
# (short chunks after the first, which names the reply: nginx's return
# takes at most 4 KB)
FIRST='data: {"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1,"model":"bench","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}\n\n'
LAST='data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
# nginx's strings are quoted: their quotes escaped
quote() { printf '%s' "$1" | sed 's/"/\\"/g'; }
q_whole=$(quote "$WHOLE")
q_burst=$(quote "$FIRST")
e_stream="echo -n \"$(quote "$FIRST")\"; echo_flush;"
i=0
while [ $i -lt 50 ]; do
  ev=$(quote "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"w$i \"}}]}\n\n")
  q_burst="$q_burst$ev"
  e_stream="$e_stream echo -n \"$ev\"; echo_flush;"
  i=$((i + 1))
done
q_burst="$q_burst$(quote "$LAST")"
e_stream="$e_stream echo -n \"$(quote "$LAST")\";"
mkdir -p "$TMP/nginx/logs" || die "cannot create $TMP/nginx"
cat >"$TMP/nginx/nginx.conf" <<EOF
load_module $ECHO_MOD;
worker_processes 1;
daemon off;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$P_WHOLE;
    location / { default_type application/json; return 200 "$q_whole"; }
  }
  server {
    listen 127.0.0.1:$P_STREAM;
    location / { default_type text/event-stream; $e_stream }
  }
  server {
    listen 127.0.0.1:$P_BURST;
    location / { default_type text/event-stream; return 200 "$q_burst"; }
  }
}
EOF
nginx -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" 2>"$TMP/nginx/start.log" &
NGINX_PID=$!

"$AG" proxy --listen "127.0.0.1:$P_PROXY_W" --upstream "http://127.0.0.1:$P_WHOLE/v1" \
  --quiet 2>"$TMP/proxy-w.log" &
PROXY_W=$!
"$AG" proxy --listen "127.0.0.1:$P_PROXY_S" --upstream "http://127.0.0.1:$P_STREAM/v1" \
  --quiet 2>"$TMP/proxy-s.log" &
PROXY_S=$!
"$AG" proxy --listen "127.0.0.1:$P_PROXY_B" --upstream "http://127.0.0.1:$P_BURST/v1" \
  --quiet 2>"$TMP/proxy-b.log" &
PROXY_B=$!
PROXY_PID="$PROXY_W $PROXY_S $PROXY_B"

wait_port() {
  n=0
  while ! python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null; do
    n=$((n + 1))
    [ $n -gt 100 ] && return 1
    sleep 0.1
  done
}
for p in $P_WHOLE $P_STREAM $P_BURST; do
  wait_port "$p" || die "nginx did not start: $(cat "$TMP/nginx/start.log" "$TMP/nginx/logs/error.log" 2>/dev/null)"
done
wait_port "$P_PROXY_W" || die "the proxy did not start: $(cat "$TMP/proxy-w.log")"
wait_port "$P_PROXY_S" || die "the proxy did not start: $(cat "$TMP/proxy-s.log")"
wait_port "$P_PROXY_B" || die "the proxy did not start: $(cat "$TMP/proxy-b.log")"

# CPU seconds (user + system) of a process so far.
cpu_s() {
  awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"
}

# One wrk round: prints "REQS RPS P50_MS P99_MS".
round() { # url body_file
  out=$(AG_TP_BODY=$2 wrk -t"$THREADS" -c"$CONNS" -d"${SECS}s" --latency \
    -s "$HERE/throughput.lua" "$1" 2>&1) || die "wrk failed: $out"
  if echo "$out" | grep -q 'Non-2xx'; then
    curl -s -o /dev/stderr -w '%{http_code}\n' -H 'content-type: application/json' \
      --data-binary "@$2" "$1" >&2
    die "non-2xx answers from $1: $out"
  fi
  reqs=$(echo "$out" | sed -n 's/^ *\([0-9]*\) requests in.*/\1/p')
  rps=$(echo "$out" | sed -n 's/^Requests\/sec: *\([0-9.]*\).*/\1/p')
  p50=$(echo "$out" | awk '$1 == "50%" { print $2 }')
  p99=$(echo "$out" | awk '$1 == "99%" { print $2 }')
  [ -n "$reqs" ] && [ -n "$rps" ] || die "cannot read wrk's output: $out"
  echo "$reqs $rps $(ms "$p50") $(ms "$p99")"
}
# wrk's latency ("812.00us", "1.20ms", "2.01s") in ms.
ms() {
  echo "$1" | awk '/us$/ { sub(/us$/, ""); print $0 / 1000; next }
                   /ms$/ { sub(/ms$/, ""); print $0; next }
                   /s$/ { sub(/s$/, ""); print $0 * 1000; next }
                   { print $0 }'
}

load() { cut -d' ' -f1-3 /proc/loadavg; }
echo "throughput: wrk -t$THREADS -c$CONNS ${SECS}s x $ROUNDS rounds each side; nginx (1 worker) as the upstream"
echo "load average before: $(load)"
echo "cores: $(nproc)"
for mode in $MODES; do
  case $mode in
  whole) up=$P_WHOLE pp=$P_PROXY_W pid=$PROXY_W stream=false ;;
  stream) up=$P_STREAM pp=$P_PROXY_S pid=$PROXY_S stream=true ;;
  burst) up=$P_BURST pp=$P_PROXY_B pid=$PROXY_B stream=true ;;
  *) die "unknown mode '$mode' (whole, stream, burst)" ;;
  esac
  sed "s/@STREAM@/$stream/" "$HERE/throughput.json" >"$TMP/body-$mode.json" ||
    die "cannot write the body"
  echo ""
  echo "== $mode replies (stream: $stream)"
  printf '%-6s %10s %10s %7s %9s %9s %9s %9s %10s\n' round direct/s proxy/s ratio d.p50ms p.p50ms d.p99ms p.p99ms cpu_us/req
  r=1
  : >"$TMP/sum-$mode"
  while [ $r -le "$ROUNDS" ]; do
    set -- $(round "http://127.0.0.1:$up/v1/chat/completions" "$TMP/body-$mode.json")
    [ $# -eq 4 ] || exit 2
    d_rps=$2 d_p50=$3 d_p99=$4
    c0=$(cpu_s "$pid")
    set -- $(round "http://127.0.0.1:$pp/v1/chat/completions" "$TMP/body-$mode.json")
    [ $# -eq 4 ] || exit 2
    c1=$(cpu_s "$pid")
    p_reqs=$1 p_rps=$2 p_p50=$3 p_p99=$4
    awk -v r="$r" -v d="$d_rps" -v p="$p_rps" -v dp50="$d_p50" -v pp50="$p_p50" \
      -v dp99="$d_p99" -v pp99="$p_p99" -v c0="$c0" -v c1="$c1" -v n="$p_reqs" \
      'BEGIN { printf "%-6s %10.0f %10.0f %7.3f %9.2f %9.2f %9.2f %9.2f %10.0f\n",
               r, d, p, p / d, dp50, pp50, dp99, pp99, (c1 - c0) * 1e6 / n }' |
      tee -a "$TMP/sum-$mode"
    r=$((r + 1))
  done
  awk '{ n++; ratio[n] = $4; a50[n] = $6 - $5; a99[n] = $8 - $7; cpu[n] = $9 }
       function med(a, n,   i, j, t) {
         for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
           if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
         return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
       function lo(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] < m) m = a[i]; return m }
       function hi(a, n,   i, m) { m = a[1]; for (i = 2; i <= n; i++) if (a[i] > m) m = a[i]; return m }
       END {
         printf "summary: proxy/direct requests/s median %.3f (%.3f-%.3f); ", med(ratio, n), lo(ratio, n), hi(ratio, n)
         printf "added p50 %.2f ms (%.2f-%.2f), added p99 %.2f ms (%.2f-%.2f); ", med(a50, n), lo(a50, n), hi(a50, n), med(a99, n), lo(a99, n), hi(a99, n)
         printf "proxy CPU per request %.0f us (%.0f-%.0f)\n", med(cpu, n), lo(cpu, n), hi(cpu, n)
       }' "$TMP/sum-$mode"
done
echo ""
echo "load average after: $(load)"
