#!/bin/sh
# tests/proxy/metrics.sh AGENTGUARD BUILD_DIR - the proxy's /healthz,
# /readyz and /metrics with promtool and a real Prometheus server
# (metrics.mjs). Exits 77 (a visible skip for CTest) without node,
# prometheus or promtool (Debian: apt-get install nodejs prometheus).
set -u
for tool in node prometheus promtool; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: $tool is needed (apt-get install nodejs prometheus)"
    exit 77
  fi
done
exec node "$(dirname "$0")/metrics.mjs" "$1" "$2/proxy-metrics"
