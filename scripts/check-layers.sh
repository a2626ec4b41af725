#!/bin/sh
# scripts/check-layers.sh - the layer check of DESIGN.md section 1: arrows
# point down only. Reads the #include lines of src/*/*.c, src/*/*.h and
# cli/*.c and fails, naming file and line, on an include that points up or
# sideways:
#
#   base <- core <- exec <- agent <- providers (the agent's model interface
#   only); wire (the API shapes) <- base, core, the model interface;
#   providers <- wire; audit <- base, core, wire; proxy <- base, core,
#   audit, wire, the model interface (not providers);
#   cli uses only include/agentguard*.h and its own cli/*.h.
#
# A project include names its layer by its folder ("internal.h" is the
# file's own layer, "../core/internal.h" is core) or, for a public header, by
# the table below (agentguard/providers.h is the model interface, which
# belongs to the agent layer: ag_provider and its vtable). The core is also
# pure (no I/O, threads or clock: section 1), so it may not include the
# system headers for those.
#
# Usage: sh scripts/check-layers.sh [project root]. Exit 0 when clean, 1 with
# one line per violation on stderr. Run by .ci/run and by `make test` (the
# CTest test `layers`).
set -eu
cd "${1:-$(dirname "$0")/..}"

# Known exceptions, one "file include" per line, each with its reason.
# Empty: every arrow found so far was fixed.
KNOWN='
'

# layer allowed-layers... (a layer may include itself)
allowed() {
  case "$1" in
  base) echo "base" ;;
  core) echo "base core" ;;
  exec) echo "base core exec" ;;
  agent) echo "base core exec agent model" ;;
  wire) echo "base core model wire" ;;
  providers) echo "base core model wire providers" ;;
  audit) echo "base core wire audit" ;;
  proxy) echo "base core audit model wire proxy" ;;
  *) echo "" ;;
  esac
}

# The layer of a public header (include/agentguard/NAME).
public_layer() {
  case "$1" in
  common.h | base.h) echo base ;;
  core.h | content.h) echo core ;;
  exec.h) echo exec ;;
  agent.h) echo agent ;;
  providers.h) echo model ;;
  audit.h) echo audit ;;
  proxy.h) echo proxy ;;
  *) echo unknown ;;
  esac
}

# System headers the pure core may not include: files, processes, threads,
# clocks, sockets.
core_banned() {
  case "$1" in
  pthread.h | unistd.h | fcntl.h | time.h | poll.h | signal.h | dirent.h | \
    spawn.h | threads.h | sys/*) return 0 ;;
  *) return 1 ;;
  esac
}

report() { # file line message include
  if printf '%s' "$KNOWN" | grep -qxF "$1 $4"; then
    return
  fi
  echo "$1:$2: $3" >&2
}

check_file() { # file layer
  f=$1
  layer=$2
  ok=$(allowed "$layer")
  grep -n '^[[:space:]]*#[[:space:]]*include' "$f" | while IFS= read -r hit; do
    line=${hit%%:*}
    text=${hit#*:}
    name=$(printf '%s' "$text" | sed -n 's/.*include[[:space:]]*["<]\([^">]*\)[">].*/\1/p')
    [ -n "$name" ] || continue
    case "$text" in
    *'<'*)
      if [ "$layer" = core ] && core_banned "$name"; then
        report "$f" "$line" "the core includes <$name>: the core does no I/O, starts no threads and reads no clock (DESIGN.md section 1)" "<$name>"
      fi
      if [ "$layer" = cli ]; then
        case "$name" in
        agentguard.h | agentguard/*.h)
          ;;
        agentguard* | ../*)
          report "$f" "$line" "the CLI includes <$name>: it uses only include/agentguard*.h" "<$name>" ;;
        esac
      fi
      continue
      ;;
    esac
    if [ "$layer" = cli ]; then
      case "$name" in
      agentguard.h | agentguard/*.h) ;;
      */*) report "$f" "$line" "the CLI includes \"$name\": it uses only include/agentguard*.h and its own cli/*.h" "\"$name\"" ;;
      *) [ -f "cli/$name" ] || report "$f" "$line" "the CLI includes \"$name\", which is not in cli/" "\"$name\"" ;;
      esac
      continue
    fi
    case "$name" in
    agentguard.h) to=all ;;
    agentguard/*) to=$(public_layer "${name#agentguard/}") ;;
    ../*/*) to=$(printf '%s' "$name" | cut -d/ -f2) ;;
    */*) to=unknown ;;
    *) to=$layer ;;
    esac
    case " $ok " in
    *" $to "*) ;;
    *) report "$f" "$line" "$layer includes \"$name\" (layer $to): an arrow up or sideways; $layer may use: $ok (DESIGN.md section 1)" "\"$name\"" ;;
    esac
  done
}

# The while loop above runs in a subshell: count through a file instead.
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for f in src/*/*.c src/*/*.h cli/*.c cli/*.h; do
  [ -f "$f" ] || continue
  case "$f" in
  src/*) layer=$(printf '%s' "$f" | cut -d/ -f2) ;;
  cli/*) layer=cli ;;
  esac
  if [ "$layer" != cli ] && [ -z "$(allowed "$layer")" ]; then
    echo "$f: src/$layer/ is not a layer of DESIGN.md section 1" >>"$out"
    continue
  fi
  check_file "$f" "$layer" 2>>"$out"
done
if [ -s "$out" ]; then
  cat "$out" >&2
  echo "check-layers: $(wc -l <"$out") arrow(s) up or sideways" >&2
  exit 1
fi
echo "check-layers: every include points down (DESIGN.md section 1)"
