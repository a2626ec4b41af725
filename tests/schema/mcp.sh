#!/bin/sh
# tests/schema/mcp.sh AGENTGUARD BUILD_DIR - a real MCP server's tool
# schemas through agentguard (mcp.mjs): @modelcontextprotocol/server-
# filesystem, pinned, installed into BUILD_DIR/node-mcp with Debian's node
# and npm. Exits 77 (a visible skip for CTest) without node, npm or the
# registry.
set -u
version=2026.8.31
pkg=@modelcontextprotocol/server-filesystem
prefix=$2/node-mcp
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node and npm are needed (apt-get install nodejs npm)"
  exit 77
fi
if ! grep -q "\"version\": \"$version\"" \
  "$prefix/node_modules/$pkg/package.json" 2>/dev/null; then
  mkdir -p "$prefix"
  if ! npm install --no-audit --no-fund --silent --prefix "$prefix" \
    "$pkg@$version" >/dev/null 2>&1; then
    echo "SKIP: could not install $pkg@$version from npm (offline?)"
    exit 77
  fi
fi
exec node "$(dirname "$0")/mcp.mjs" "$1" "$prefix" "$2/schema-mcp"
