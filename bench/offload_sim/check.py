#!/usr/bin/env python3
"""The ctest of tide-offload-sim: runs it on a sample trace and checks its JSON and exit codes.

usage: check.py TOOL TRACE_FILE
"""
import json
import os
import subprocess
import sys
import tempfile

tool, trace = sys.argv[1], sys.argv[2]


def run(*args):
    return subprocess.run([tool, *args], capture_output=True, text=True)


def fail(msg):
    print("check.py: " + msg, file=sys.stderr)
    sys.exit(1)


# The sample's working set is 4: at capacity 5 the policies have choices to make.
out = run(trace, "--capacity", "5", "--policy", "all", "--iterations", "2", "--chunk-bytes", "1024")
if out.returncode != 0:
    fail(f"exit {out.returncode}: {out.stderr}")
rows = [json.loads(line) for line in out.stdout.splitlines()]
if [r["policy"] for r in rows] != ["belady", "lru", "fifo"]:
    fail(f"expected belady, lru, fifo; got {out.stdout}")
keys = {"policy", "capacity", "moments", "h2d", "d2h", "evictions", "allocations", "bytes_moved"}
for r in rows:
    if set(r) != keys:
        fail(f"keys {sorted(r)} != {sorted(keys)}")
    if r["capacity"] != 5 or r["moments"] != 26:
        fail(f"capacity/moments wrong: {r}")
    if r["bytes_moved"] != (r["h2d"] + r["d2h"]) * 1024:
        fail(f"bytes_moved != (h2d + d2h) * chunk bytes: {r}")
    if r["evictions"] > r["d2h"] or r["allocations"] == 0:
        fail(f"inconsistent counts: {r}")
belady = rows[0]
for r in rows[1:]:
    if r["evictions"] < belady["evictions"]:
        fail(f"{r['policy']} evicts less than belady: {r} vs {belady}")

# One policy alone prints one line, the same numbers.
one = run(trace, "--capacity", "5", "--policy", "lru", "--chunk-bytes", "1024")
if one.returncode != 0 or json.loads(one.stdout) != rows[1]:
    fail(f"--policy lru: {one.stdout} {one.stderr}")

# Bad input: exit code 2 and a message that says what to pass.
for args, says in [((trace,), "--capacity"), ((trace, "--capacity", "x"), "integer"),
                   ((trace, "--capacity", "3"), "working set of 4"), (("--capacity", "5"), "TRACE_FILE"),
                   ((trace, "--capacity", "5", "--policy", "opt"), "belady, lru, fifo"),
                   ((trace + ".missing", "--capacity", "5"), "cannot read"),
                   ((trace, "--capacity", "5", "--frobnicate", "1"), "unknown flag")]:
    bad = run(*args)
    if bad.returncode != 2 or says not in bad.stderr:
        fail(f"{args}: expected exit 2 and '{says}', got {bad.returncode}: {bad.stderr}")
# Corrupt trace files: exit code 2 and a message naming the line and the bad value; a corrupt
# chunk count is refused before anything is allocated for it.
with tempfile.TemporaryDirectory() as tmp:
    for text, says in [("chunks: 4294967295\n0 1\n", "line 1: 'chunks: 4294967295'"),
                       ("0 1\n2 4294967294\n", "line 2: chunk id 4294967294"),
                       ("chunks: 4\n0 1\n2 7\n", "line 3: chunk 7"),
                       ("0 1\n2 -3\n", "line 2: '-3' is negative"),
                       ("0 1\n2 3x\n", "line 2: '3x' is not a chunk id")]:
        path = os.path.join(tmp, "corrupt.trace")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        bad = run(path, "--capacity", "5")
        if bad.returncode != 2 or says not in bad.stderr or "corrupt" not in bad.stderr:
            fail(f"{text!r}: expected exit 2, 'corrupt' and '{says}', got {bad.returncode}: {bad.stderr}")
print("ok:", *(json.dumps(r) for r in rows), sep="\n")
