#!/bin/sh
# The trade-off table of docs/detection.md: each candidate mechanism or
# threshold on top of (or taken out of) the default preset, scored on the
# development set of real runs by shared/tools/score-detection.
#   scripts/detection-tradeoffs.sh [build/agentguard] [../shared]
set -eu
bin=${1:-build/agentguard}
shared=${2:-../shared}
score="$shared/tools/score-detection"
[ -x "$score" ] || { echo "skipped: $score not found" >&2; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
row() { # label, JSON config
  printf '%s\n' "$2" >"$tmp/c.json"
  "$score" "$bin" --config "$tmp/c.json" >"$tmp/out" 2>&1
  awk -v label="$1" '
    $1 == "all" { rs = $3 " = " $5; saved = $6 " = " $8 }
    /^annotated/ { caught = $4; sub(/,$/, "", caught);
                   m = $0; sub(/.*false alarms: /, "", m); sub(/ .*/, "", m); fa = m }
    END { printf "| %s | %s | %s | %s | %s |\n", label, rs, saved, caught, fa }
  ' "$tmp/out"
}
D='"preset": "default"'
echo "| configuration | resolved runs stopped | unresolved steps saved | annotated loops caught | false alarms |"
echo "|---|---|---|---|---|"
row "old default: cap 40, mechanisms 12-16 off" "{$D, \"loop\": {\"max_iterations\": 40, \"max_refused_replies\": 0, \"max_denied_calls\": 0, \"max_empty_replies\": 0, \"repeated_result_limit\": 0, \"repeated_failure_limit\": 0}}"
row "seeds' mechanisms only (3, 4, 5, 7), cap 150" "{$D, \"loop\": {\"max_refused_replies\": 0, \"repeated_result_limit\": 0, \"repeated_failure_limit\": 0}}"
row "**default** (all of the below)" "{$D}"
row "default, cap 40 (M.E.AI's)" "{$D, \"loop\": {\"max_iterations\": 40}}"
row "default, cap 100 (Gemini CLI's turn limit)" "{$D, \"loop\": {\"max_iterations\": 100}}"
row "default, no cap" "{$D, \"loop\": {\"max_iterations\": 0}}"
row "default without 16 (repeated call+result)" "{$D, \"loop\": {\"repeated_result_limit\": 0, \"repeated_failure_limit\": 0}}"
row "16: failures at 4" "{$D, \"loop\": {\"repeated_failure_limit\": 4}}"
row "16: failures at 2" "{$D, \"loop\": {\"repeated_failure_limit\": 2}}"
row "16: successes at 3" "{$D, \"loop\": {\"repeated_result_limit\": 3}}"
row "16: failures only" "{$D, \"loop\": {\"repeated_result_limit\": 0}}"
row "12: refused replies at 3 (SWE-agent's requeries)" "{$D, \"loop\": {\"max_refused_replies\": 3}}"
row "12: refused replies at 5" "{$D, \"loop\": {\"max_refused_replies\": 5}}"
row "7: consecutive errors 4" "{$D, \"errors\": {\"max_consecutive_errors\": 4}}"
row "7: consecutive errors 5" "{$D, \"errors\": {\"max_consecutive_errors\": 5}}"
row "7: consecutive errors off" "{$D, \"errors\": {\"max_consecutive_errors\": 0}}"
row "7: any_failed (M.E.AI's rule)" "{$D, \"errors\": {\"failing_iteration\": \"any_failed\"}}"
row "5-8: every failure counts (counted_failures all)" "{$D, \"errors\": {\"counted_failures\": \"all\"}}"
row "5: identical errors 3" "{$D, \"errors\": {\"max_identical_errors\": 3}}"
row "3: identical calls 3" "{$D, \"loop\": {\"identical_call_limit\": 3}}"
row "3: identical calls 4 in call_and_result scope (OpenHands)" "{$D, \"loop\": {\"identical_call_limit\": 4, \"identical_call_scope\": \"call_and_result\"}}"
row "4: cycles 3" "{$D, \"loop\": {\"cycle_limit\": 3}}"
row "6 and 8: twelve-factor's budgets (3 per tool, 10 per turn)" "{$D, \"errors\": {\"max_tool_errors\": 3, \"max_total_errors\": 10}}"
row "9: monadic's error pattern (3 of a category)" "{$D, \"errors\": {\"similar_error_limit\": 3}}"
