#!/bin/sh
# tests/proxy/run.sh AGENTGUARD BUILD_DIR MODE - the proxy with real clients
# (clients.mjs): MODE plain, stream, responses, responses-stream or
# responses-stored uses the official `openai` npm package; agents,
# agents-responses and agents-conversation the OpenAI Agents SDK
# (@openai/agents, with zod) on Chat Completions, on its default API
# (Responses) and with a conversation the upstream keeps;
# azure and azure-stream its AzureOpenAI client (Azure's deployment paths);
# anthropic and anthropic-stream the official @anthropic-ai/sdk,
# anthropic-vertex and anthropic-vertex-stream @anthropic-ai/vertex-sdk; gemini
# and gemini-stream the official @google/genai, gemini-vertex and
# gemini-vertex-stream the same on Vertex AI; ollama and ollama-stream
# the official `ollama` package against Ollama's /api/chat. The
# packages are pinned and installed into BUILD_DIR/node-proxy-MODE with
# Debian's node and npm. Exits 77 (a visible skip for CTest) when node or
# npm is missing or the packages cannot be installed (no network); 1 on
# failure.
set -u
bin=$1
build=$2
mode=$3
OPENAI_VERSION=4.95.0
AGENTS_VERSION=0.20.0
ZOD_VERSION=4.1.12
ANTHROPIC_VERSION=0.71.0
VERTEX_VERSION=1.1.3
VERTEX_ANTHROPIC_VERSION=1.14.0
GENAI_VERSION=2.32.0
OLLAMA_VERSION=0.6.4
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node and npm are needed (apt-get install nodejs npm)"
  exit 77
fi
if [ "${mode#anthropic-vertex}" != "$mode" ]; then
  prefix=$build/node-proxy-anthropic-vertex
  pkgs="@anthropic-ai/vertex-sdk@$VERTEX_VERSION @anthropic-ai/sdk@$VERTEX_ANTHROPIC_VERSION"
  check=$prefix/node_modules/@anthropic-ai/vertex-sdk/package.json
  want=$VERTEX_VERSION
elif [ "$mode" = anthropic ] || [ "$mode" = anthropic-stream ]; then
  prefix=$build/node-proxy-anthropic
  pkgs="@anthropic-ai/sdk@$ANTHROPIC_VERSION"
  check=$prefix/node_modules/@anthropic-ai/sdk/package.json
  want=$ANTHROPIC_VERSION
elif [ "${mode#ollama}" != "$mode" ]; then
  prefix=$build/node-proxy-ollama
  pkgs="ollama@$OLLAMA_VERSION"
  check=$prefix/node_modules/ollama/package.json
  want=$OLLAMA_VERSION
elif [ "${mode#gemini}" != "$mode" ]; then
  prefix=$build/node-proxy-gemini
  pkgs="@google/genai@$GENAI_VERSION"
  check=$prefix/node_modules/@google/genai/package.json
  want=$GENAI_VERSION
elif [ "${mode#agents}" != "$mode" ]; then
  prefix=$build/node-proxy-agents
  pkgs="@openai/agents@$AGENTS_VERSION zod@$ZOD_VERSION"
  check=$prefix/node_modules/@openai/agents/package.json
  want=$AGENTS_VERSION
else
  prefix=$build/node-proxy-openai
  pkgs="openai@$OPENAI_VERSION"
  check=$prefix/node_modules/openai/package.json
  want=$OPENAI_VERSION
fi
if ! grep -q "\"version\": \"$want\"" "$check" 2>/dev/null; then
  mkdir -p "$prefix"
  # shellcheck disable=SC2086
  if ! npm install --no-audit --no-fund --silent --prefix "$prefix" \
      $pkgs >/dev/null 2>&1; then
    echo "SKIP: could not install $pkgs from npm (offline?)"
    exit 77
  fi
fi
exec node "$(dirname "$0")/clients.mjs" "$bin" "$prefix" "$mode"
