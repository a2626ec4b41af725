#!/bin/sh
# tests/agents/run.sh AGENTGUARD BUILD_DIR AGENT MODEL - a real agent CLI
# through `agentguard proxy` (agents.mjs): AGENT gemini (Gemini CLI),
# claude (Claude Code), codex (Codex CLI), qwen (Qwen Code), opencode, cn
# (Continue's CLI), cline (Cline's CLI), grok (Grok CLI), copilot-chat,
# copilot-responses,
# copilot-anthropic (GitHub Copilot CLI with its own provider, on each API)
# or pi-chat, pi-responses, pi-anthropic, pi-google (pi, on each API it
# speaks; one package for the four);
# MODEL loop (the fake model repeats one harmless call forever: the proxy
# must stop it, the agent must exit 0 showing the stop) or normal (one
# call, then an answer: nothing stopped). Each CLI is a pinned npm package
# installed into BUILD_DIR/node-agent-NAME (AGENT up to its first '-')
# with Debian's node and npm, and
# run in BUILD_DIR/agents/AGENT-MODEL. Exits 77 (a visible skip for CTest)
# when node or npm is missing or the package cannot be installed (no
# network); 1 on failure.
set -u
bin=$1
build=$2
agent=$3
model=$4
case $agent in
gemini) pkg=@google/gemini-cli version=0.61.0 ;;
claude) pkg=@anthropic-ai/claude-code version=2.1.328 ;;
codex) pkg=@openai/codex version=0.169.0 ;;
qwen) pkg=@qwen-code/qwen-code version=0.24.4 ;;
opencode) pkg=opencode-ai version=1.18.33 ;;
cn) pkg=@continuedev/cli version=1.5.47 ;;
cline) pkg=cline version=3.0.65 ;;
grok) pkg=@vibe-kit/grok-cli version=0.0.34 ;;
copilot-chat | copilot-responses | copilot-anthropic)
  pkg=@github/copilot version=1.0.102
  ;;
pi-chat | pi-responses | pi-anthropic | pi-google)
  pkg=@mariozechner/pi-coding-agent version=0.73.1
  ;;
*)
  echo "tests/agents/run.sh: unknown agent $agent" >&2
  exit 1
  ;;
esac
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  echo "SKIP: node and npm are needed (apt-get install nodejs npm)"
  exit 77
fi
prefix=$build/node-agent-${agent%%-*}
if ! grep -q "\"version\": \"$version\"" \
  "$prefix/node_modules/$pkg/package.json" 2>/dev/null; then
  mkdir -p "$prefix"
  if ! npm install --no-audit --no-fund --silent --prefix "$prefix" \
    "$pkg@$version" >/dev/null 2>&1; then
    echo "SKIP: could not install $pkg@$version from npm (offline?)"
    exit 77
  fi
fi
exec node "$(dirname "$0")/agents.mjs" "$bin" "$prefix" "$agent" "$model" \
  "$build/agents/$agent-$model"
