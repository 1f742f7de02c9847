#!/usr/bin/env python3
"""Runs tide's benchmarks and prints their figures as a Markdown table.

  bench.py BUILD_DIR [NAME...]   run bench_* from BUILD_DIR/bench (or those named), save the JSON
                                 lines under bench-results/, print a table
  bench.py --check EXE           run one benchmark and check every line it prints is a figure
"""
import json
import math
import os
import subprocess
import sys
import time

KEYS = ["bench", "figure", "value", "unit", "anchor", "anchor_value", "ratio", "higher_is_better"]


def parse(lines, source):
    figures = []
    for line in lines:
        line = line.strip()
        if not line:
            continue
        fig = json.loads(line)
        missing = [k for k in KEYS if k not in fig]
        if missing:
            raise ValueError(f"{source}: figure without {missing}: {line}")
        figures.append(fig)
    if not figures:
        raise ValueError(f"{source}: printed no figure")
    return figures


def run(exe):
    out = subprocess.run([exe], check=True, stdout=subprocess.PIPE, text=True).stdout
    return parse(out.splitlines(), exe)


def fmt(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def verdict(f):
    goal, ratio = f.get("goal"), f.get("ratio")
    if goal is None or ratio is None:
        return ""
    ok = ratio >= goal if f["higher_is_better"] else ratio <= goal
    return ("meets " if ok else "misses ") + ("≥ " if f["higher_is_better"] else "≤ ") + fmt(goal)


def main(argv):
    if argv[:1] == ["--check"]:
        figs = run(argv[1])
        print(f"{len(figs)} figures from {os.path.basename(argv[1])}: " + ", ".join(f["figure"] for f in figs))
        return 0
    build, names = argv[0], argv[1:]
    bench_dir = os.path.join(build, "bench")
    exes = sorted(e for e in os.listdir(bench_dir) if e.startswith("bench_") and os.access(os.path.join(bench_dir, e), os.X_OK)
                  and os.path.isfile(os.path.join(bench_dir, e)))
    if names:
        wanted = {n if n.startswith("bench_") else "bench_" + n for n in names}
        unknown = wanted - set(exes)
        if unknown:
            print(f"no such benchmark: {', '.join(sorted(unknown))}; there are: {', '.join(exes)}", file=sys.stderr)
            return 2
        exes = [e for e in exes if e in wanted]
    os.makedirs("bench-results", exist_ok=True)
    out_path = os.path.join("bench-results", time.strftime("%Y%m%d-%H%M%S") + ".jsonl")
    figures = []
    with open(out_path, "w") as out:
        for exe in exes:
            print(f"[tide] running {exe}", file=sys.stderr, flush=True)
            figs = run(os.path.join(bench_dir, exe))
            for f in figs:
                out.write(json.dumps(f) + "\n")
            figures += figs
    print("| figure | value | unit | anchor | anchor value | ratio | goal |")
    print("|---|---|---|---|---|---|---|")
    for f in figures:
        print(f"| {f['figure']} | {fmt(f['value'])} | {f['unit']} | {f['anchor']} | {fmt(f['anchor_value'])} "
              f"| {fmt(f['ratio'])} | {verdict(f)} |")
    print(f"\nJSON lines: {out_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
