#!/usr/bin/env python3
"""bench/audit_reference.py FILE_OR_DIR... - the reference reader for
bench/audit_vs_script.sh: what a user would write instead of
`agentguard audit` to find where recorded runs loop.

It reads each run with the standard library's json.load and replays it,
step by step, through seven rules as the source documents state them
(the peers' rules, with their own thresholds):

  1. identical calls: the same tool with the same arguments 5 times in a
     row (HPD-Agent);
  2. cycles: the last calls repeating with a period of 2 or 3, 5 times
     (HPD-Agent's A-B-A-B);
  3. identical errors: the same error text 5 times (Forge);
  4. consecutive failing steps: 3 (HPD-Agent);
  5. per-tool error budget: 3 failures of one tool in a row (12-factor);
  6. total error budget: 10 failures (12-factor);
  7. error pattern: 3 errors in a row of one category (Monadic Chat),
     the category from a few regular expressions.

Arguments are signed as agentguard signs them: SHA-256 of the name, ':'
and the canonical JSON of the arguments (sorted keys, no spaces). A run is
the neutral format's {"steps": [{"calls": [...], "results": [...]}]}.
Prints one line per run that a rule stops (file, step, rule) and a count;
the timing is the caller's.
"""
import hashlib
import json
import os
import re
import sys

CATEGORIES = [
    ("timeout", re.compile(r"timed? ?out|deadline", re.I)),
    ("not_found", re.compile(r"not found|no such file|does not exist", re.I)),
    ("permission", re.compile(r"permission denied|forbidden|not allowed", re.I)),
    ("syntax", re.compile(r"syntax ?error|invalid syntax|parse error", re.I)),
    ("network", re.compile(r"connection (refused|reset)|unreachable", re.I)),
]


def category(text):
    for name, rx in CATEGORIES:
        if rx.search(text):
            return name
    return "unknown"


def signature(call):
    args = call.get("args")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    canon = json.dumps(args, sort_keys=True, separators=(",", ":"),
                       ensure_ascii=False)
    return hashlib.sha256(
        (str(call.get("name", "")) + ":" + canon).encode()).hexdigest()


def replay(run):
    """The first (step, rule) that stops the run, or None."""
    same_run = {}          # tool -> (sig, count)
    history = []           # the signatures of the calls, in order
    error_counts = {}      # error text -> count
    failing_steps = 0
    tool_fails = {}        # tool -> failures in a row
    total_fails = 0
    last_cats = []
    for i, step in enumerate(run.get("steps") or []):
        calls = step.get("calls") or []
        results = step.get("results") or []
        for call in calls:
            name = call.get("name", "")
            sig = signature(call)
            prev = same_run.get(name)
            count = prev[1] + 1 if prev and prev[0] == sig else 1
            same_run[name] = (sig, count)
            if count >= 5:
                return i, "identical_calls"
            history.append(sig)
            for period in (2, 3):
                need = period * 5
                if len(history) >= need and len(set(history[-period:])) > 1:
                    tail = history[-need:]
                    if all(tail[k] == tail[k % period] for k in range(need)):
                        return i, "cyclic_calls"
        failed = False
        for k, res in enumerate(results):
            name = calls[k].get("name", "") if k < len(calls) else ""
            if res.get("ok", True):
                tool_fails[name] = 0
                continue
            failed = True
            text = str(res.get("text", ""))
            error_counts[text] = error_counts.get(text, 0) + 1
            if error_counts[text] >= 5:
                return i, "identical_errors"
            tool_fails[name] = tool_fails.get(name, 0) + 1
            if tool_fails[name] >= 3:
                return i, "tool_error_budget"
            total_fails += 1
            if total_fails >= 10:
                return i, "total_error_budget"
            last_cats = (last_cats + [category(text)])[-3:]
            if len(last_cats) == 3 and last_cats[0] != "unknown" and \
                    len(set(last_cats)) == 1:
                return i, "error_pattern"
        failing_steps = failing_steps + 1 if failed else 0
        if failing_steps >= 3:
            return i, "consecutive_errors"
    return None


def files(args):
    for a in args:
        if os.path.isdir(a):
            for n in sorted(os.listdir(a)):
                if n.endswith(".json"):
                    yield os.path.join(a, n)
        else:
            yield a


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: audit_reference.py FILE_OR_DIR...")
    n = stopped = 0
    for path in files(sys.argv[1:]):
        with open(path, "rb") as f:
            run = json.load(f)
        n += 1
        hit = replay(run)
        if hit is not None:
            stopped += 1
            print("%s\tstep %d\t%s" % (os.path.basename(path), hit[0] + 1,
                                       hit[1]))
    print("reference: %d runs, %d stopped" % (n, stopped))


if __name__ == "__main__":
    main()
