#!/usr/bin/env python3
"""ctest for tide-schedule: every schedule prints valid JSON with the closed-form makespan and
peaks, the ASCII grid has one row per stage, the SVG renders (rsvg-convert), and a bad flag or an
impossible shape exits with status 2 and one line."""
import json, os, subprocess, sys, tempfile

tool = sys.argv[1]

def run(*args):
    return subprocess.run([tool, *args], capture_output=True, text=True)

p, m = 4, 8
expect = {"gpipe": (33, [8, 8, 8, 8]), "one_f_one_b": (33, [4, 3, 2, 1]), "zb_h1": (27, [4, 4, 4, 4]),
          "zb_h2": (27, [7, 7, 7, 7]), "zb_v": (25.5, None), "interleaved": (28.5, None),
          "dualpipe_v": (25.5, None)}
for name, (makespan, peaks) in expect.items():
    extra = ["--virtual", "2"] if name == "interleaved" else []
    r = run("--schedule", name, "--stages", str(p), "--micro", str(m), "--format", "json", *extra)
    assert r.returncode == 0, (name, r.stderr)
    j = json.loads(r.stdout)
    assert j["makespan"] == makespan, (name, j["makespan"])
    assert 0 <= j["bubble_fraction"] < 1, name
    assert len(j["per_stage"]) == p and len(j["actions"]) == p, name
    if peaks:
        assert [s["peak_activations"] for s in j["per_stage"]] == peaks, (name, j["per_stage"])
    a = run("--schedule", name, "--stages", str(p), "--micro", str(m), "--format", "ascii", *extra)
    assert a.returncode == 0 and sum(l.startswith("stage ") for l in a.stdout.splitlines()) == p, (name, a.stdout)
    s = run("--schedule", name, "--stages", str(p), "--micro", str(m), "--format", "svg", *extra)
    assert s.returncode == 0 and s.stdout.count('<rect class="action') == sum(len(x) for x in j["actions"]), name
    with tempfile.TemporaryDirectory() as d:
        svg, png = os.path.join(d, "s.svg"), os.path.join(d, "s.png")
        open(svg, "w").write(s.stdout)
        assert subprocess.run(["rsvg-convert", "-o", png, svg]).returncode == 0, name
        assert open(png, "rb").read(4) == b"\x89PNG", name

costed = json.loads(run("--schedule", "gpipe", "--stages", "4", "--micro", "8", "--costs", "1,1,1,0.5",
                        "--format", "json").stdout)
assert costed["makespan"] == 33 + 2 * 3 * 0.5, costed["makespan"]

for bad in (["--stages", "0"], ["--schedule", "dualpipe_v", "--micro", "7"], ["--schedule", "interleaved", "--micro", "6", "--virtual", "2"], ["--schedule", "x"],
            ["--format", "png"], ["--costs", "1,1"], ["--costs", "1,1,1,0,5"], ["--costs", "1,1,1,0,"],
            ["--costs", "inf,1,1,0"], ["--micro"], ["--nope", "1"], ["--virtual", "2"]):
    r = run(*bad)
    assert r.returncode == 2 and r.stderr.startswith("tide-schedule: ") and r.stderr.count("\n") == 1, (bad, r.stderr)
print("tide-schedule: all checks passed")
