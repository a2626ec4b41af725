#!/bin/sh
# Prints docs/configuration.md's preset table (every key of every preset) from
# the built program: scripts/preset-table.sh build/agentguard
set -eu
bin=${1:-build/agentguard}
python3 - "$bin" <<'PY'
import json, subprocess, sys
b = sys.argv[1]
names = ["default", "none", "hpd", "development", "production", "long-running",
         "forge", "twelve-factor", "monadic", "meai"]
cfg = {n: json.loads(subprocess.check_output([b, "presets", n])) for n in names}
print("| key | " + " | ".join(names) + " |")
print("|---" * (len(names) + 1) + "|")
def cell(v):
    if isinstance(v, bool): return "true" if v else "false"
    if isinstance(v, list): return json.dumps(v, separators=(",", ":"))
    return str(v)
for sec in ["loop", "errors", "retry", "network"]:
    for key in sorted(cfg["default"][sec]):
        print("| `%s.%s` | %s |" % (sec, key, " | ".join(cell(cfg[n][sec][key]) for n in names)))
PY
