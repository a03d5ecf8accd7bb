#!/usr/bin/env python3
"""Tables of bench/run-w8a8-gpu.sh: bench/decode runs of one call, one JSON per weight
precision or A/B variant (label=path; the first is the BF16-weights anchor), every
(weights, KV format) cell against the anchor's bf16-weights / bf16-KV step at the same
shape.  Prints the issue-22 W8A8 targets as met or missed, the late-stage means and the
per-shape table; --merge OUT writes every run into one JSON (bench/results).

Usage: w8a8_decode_table.py [--merge OUT] LABEL=JSON [LABEL=JSON ...]"""
import json, sys

args = sys.argv[1:]
merge = None
if len(args) > 1 and args[0] == "--merge":
    merge, args = args[1], args[2:]
runs = []
for a in args:
    label, path = a.split("=", 1)
    try:
        runs.append((label, json.load(open(path))))
    except (OSError, ValueError) as e:
        print("skip %s: %s" % (label, e))
if not runs:
    sys.exit("no runs")

def key(s):
    return (s["stage"], s["batch"], s["context"])

anchor = {key(s): s["formats"]["bf16"]["ms_per_step"] for s in runs[0][1]["shapes"]
          if "bf16" in s["formats"]}
cells = {}  # (label, kv) -> {shape key: ms}
order = []
for label, d in runs:
    for s in d["shapes"]:
        for kv, v in s["formats"].items():
            c = (label, kv)
            if c not in cells:
                cells[c] = {}
                order.append(c)
            cells[c][key(s)] = v["ms_per_step"]
shapes = sorted({k for c in cells.values() for k in c},
                key=lambda k: (k[0] != "late", k[0] == "late" and -k[1], k[1], k[2]))

def x(c, k):
    ms = cells[c].get(k)
    return anchor[k] / ms if ms and k in anchor else None

def name(c):
    return "%s/%s" % c

print("%-26s" % "weights/kv  ms (x bf16)" + "".join(" %15s" % ("%dx%d" % (k[1], k[2])) for k in shapes))
for c in order:
    print("%-26s" % name(c) + "".join(
        " %15s" % ("%.2f (%.2fx)" % (cells[c][k], x(c, k)) if k in cells[c] and x(c, k) else "-")
        for k in shapes))

late = [k for k in shapes if k[0] == "late"]
print("\nlate-stage means (equal weight, %d shapes): ms | speedup over bf16/bf16" % len(late))
for c in order:
    xs = [x(c, k) for k in late if x(c, k)]
    if len(xs) == len(late) and late:
        print("  %-28s %8.2f ms %6.2fx" % (name(c), sum(cells[c][k] for k in late) / len(late),
                                          sum(xs) / len(xs)))

def target(desc, c, ks, bound, mean=False):
    xs = [(x(c, k), k) for k in ks if c in cells and x(c, k)]
    if not xs:
        print("target %s: not measured" % desc)
        return
    v = sum(a for a, _ in xs) / len(xs) if mean else min(xs)[0]
    worst = min(xs)
    print("target %s: %s %.2fx (%s) %s" % (
        desc, "mean" if mean else "min", v,
        ", ".join("%dx%d %.2fx" % (k[1], k[2], a) for a, k in xs) if not mean else
        "worst %dx%d %.2fx" % (worst[1][1], worst[1][2], worst[0]), "MET" if v >= bound else "MISSED"))

labels = [l for l, _ in runs]
fp8 = next((l for l in labels if l == "w8a8-fp8"), None)
i8 = next((l for l in labels if l == "w8a8-int8"), None)
big = [k for k in shapes if k[1] >= 128]
small = [k for k in shapes if k[1] <= 64]
print()
target("w8a8-fp8 >= 1.3x bf16 at batch >= 128", (fp8, "bf16"), big, 1.3)
target("w8a8-fp8 >= 1.1x bf16 at batch 1-64", (fp8, "bf16"), small, 1.1)
target("w8a8-int8 never below 1.0x", (i8, "bf16"), shapes, 1.0)
target("w8a8-fp8 + int4-protected >= 2.5x bf16 (late mean)", (fp8, "int4-protected"), late, 2.5, mean=True)

if merge:
    json.dump({"device": runs[0][1].get("device"), "model": runs[0][1].get("model"),
               "copy_bandwidth_gbps": runs[0][1].get("copy_bandwidth_gbps"),
               "anchor": "%s weights, bf16 kv" % labels[0],
               "runs": {l: d for l, d in runs}}, open(merge, "w"), indent=1)
