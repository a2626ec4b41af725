#!/bin/sh
# tests/proxy/run.sh AGENTGUARD BUILD_DIR - the proxy with a real client: the
# official `openai` npm package (pinned, installed into BUILD_DIR/node-proxy
# with Debian's node and npm) drives a tool loop through `agentguard proxy`
# in front of a fake upstream whose model calls the same tool forever
# (openai_client.mjs). Exits 77 (a visible skip for CTest) when node or npm
# is missing or the package cannot be installed (no network); 1 on failure.
set -u
bin=$1
build=$2
OPENAI_VERSION=4.95.0
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node and npm are needed (apt-get install nodejs npm)"
  exit 77
fi
prefix=$build/node-proxy
if ! grep -q "\"version\": \"$OPENAI_VERSION\"" \
    "$prefix/node_modules/openai/package.json" 2>/dev/null; then
  mkdir -p "$prefix"
  if ! npm install --no-audit --no-fund --silent --prefix "$prefix" \
      "openai@$OPENAI_VERSION" >/dev/null 2>&1; then
    echo "SKIP: could not install openai@$OPENAI_VERSION from npm (offline?)"
    exit 77
  fi
fi
NODE_PATH=$prefix/node_modules exec node "$(dirname "$0")/openai_client.mjs" \
  "$bin" "$prefix"
