#!/bin/sh
# tests/readme/man.sh AGENTGUARD SOURCE_DIR - docs/agentguard.1 renders
# without a warning (groff -ww), and names every option that each
# command's own help lists, so that the manual cannot fall behind the
# program. Exits 77 (a visible skip) without groff.
set -u
BIN=$1 MAN=$2/docs/agentguard.1
command -v groff >/dev/null 2>&1 || { echo "SKIP: groff is needed (apt-get install groff-base)"; exit 77; }
fail=0
warn=$(groff -man -Tutf8 -ww -z "$MAN" 2>&1)
[ -z "$warn" ] || { echo "FAIL: groff warns:"; echo "$warn"; fail=1; }
# the page as text, with roff's \- turned back into -
text=$(sed 's/\\-/-/g' "$MAN")
for cmd in run simulate audit proxy presets check-config; do
  opts=$("$BIN" help "$cmd" | grep -oE '(^|[ ,[])--[a-z][a-z-]*' | sed 's/^[ ,[]//' | sort -u)
  [ -n "$opts" ] || [ "$cmd" = check-config ] || [ "$cmd" = presets ] ||
    { echo "FAIL: no option found in 'agentguard help $cmd'"; fail=1; }
  for o in $opts; do
    case $text in
    *"$o"*) ;;
    *) echo "FAIL: agentguard(1) does not name $cmd's $o"; fail=1 ;;
    esac
  done
  case $text in
  *".SS $cmd"*) ;;
  *) echo "FAIL: agentguard(1) has no section for $cmd"; fail=1 ;;
  esac
done
[ $fail -eq 0 ] && echo "ok: agentguard(1) renders cleanly and names every command's options"
exit $fail
