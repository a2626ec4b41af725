#!/bin/sh
# tests/schema/run.sh SPEC BUILD_DIR FIXTURES_DIR - the OpenAI schema check
# (check_openai.mjs) with ajv from npm, pinned, installed into BUILD_DIR/node
# with Debian's node and npm. Exits 77 (a visible skip for CTest) when the
# spec (../shared) is absent, node or npm is missing, or ajv cannot be
# installed (no network); 1 when anything is invalid.
set -u
spec=$1
build=$2
fixtures=$3
AJV_VERSION=8.17.1
if [ ! -f "$spec" ]; then
  echo "SKIP: $spec not found (../shared is absent): schema check not run"
  exit 77
fi
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node and npm are needed (apt-get install nodejs npm)"
  exit 77
fi
prefix=$build/node
if ! grep -q "\"version\": \"$AJV_VERSION\"" \
    "$prefix/node_modules/ajv/package.json" 2>/dev/null; then
  mkdir -p "$prefix"
  if ! npm install --no-audit --no-fund --silent --prefix "$prefix" \
      "ajv@$AJV_VERSION" >/dev/null 2>&1; then
    echo "SKIP: could not install ajv@$AJV_VERSION from npm (offline?)"
    exit 77
  fi
fi
AJV_PREFIX=$prefix exec node "$(dirname "$0")/check_openai.mjs" "$spec" \
  "$build/http-requests" "$fixtures"
