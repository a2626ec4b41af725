#!/bin/sh
# tests/proxy/nginx.sh AGENTGUARD BUILD_DIR - two proxies behind Debian's
# nginx, round robin (nginx.mjs). Exits 77 (a visible skip for CTest)
# without node or nginx (Debian: apt-get install nodejs nginx-light).
set -u
PATH=$PATH:/usr/sbin
if ! command -v node >/dev/null 2>&1 || ! command -v nginx >/dev/null 2>&1; then
  echo "SKIP: node and nginx are needed (apt-get install nodejs nginx-light)"
  exit 77
fi
exec node "$(dirname "$0")/nginx.mjs" "$1" "$2/proxy-nginx"
