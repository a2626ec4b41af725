#!/bin/sh
# tests/proxy/otlp.sh AGENTGUARD BUILD_DIR - the proxy's OpenTelemetry
# traces checked against the official OpenTelemetry JS packages
# (otlp.mjs): pinned @opentelemetry/* installed into BUILD_DIR/node-otlp
# with Debian's node and npm. Exits 77 (a visible skip for CTest) when node
# or npm is missing or the packages cannot be installed (no network); 1 on
# failure.
set -u
bin=$1
build=$2
TRANSFORMER_VERSION=0.301.1
SDK_VERSION=3.1.1
API_VERSION=1.10.0
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node and npm are needed (apt-get install nodejs npm)"
  exit 77
fi
prefix=$build/node-otlp
check=$prefix/node_modules/@opentelemetry/otlp-transformer/package.json
if ! grep -q "\"version\": \"$TRANSFORMER_VERSION\"" "$check" 2>/dev/null; then
  mkdir -p "$prefix"
  if ! npm install --no-audit --no-fund --silent --prefix "$prefix" \
      "@opentelemetry/otlp-transformer@$TRANSFORMER_VERSION" \
      "@opentelemetry/sdk-trace@$SDK_VERSION" \
      "@opentelemetry/resources@$SDK_VERSION" \
      "@opentelemetry/api@$API_VERSION" >/dev/null 2>&1; then
    echo "SKIP: could not install the @opentelemetry packages from npm (offline?)"
    exit 77
  fi
fi
exec node "$(dirname "$0")/otlp.mjs" "$bin" "$prefix"
