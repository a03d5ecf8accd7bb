#!/usr/bin/env python3
"""Late-stage table of bench/run-kvdeq-gpu.sh: per KV format the late-stage mean ms/step with
the current decoders (NEW json) and the previous ones (PREV json, QRL_ATTNQ_DEQ=0), and the
speedup of each over the BF16 step of NEW (the same call).  Usage: kvdeq_table.py NEW [PREV]"""
import json, sys

def late(path):
    d = json.load(open(path))
    rows = [s for s in d["shapes"] if s["stage"] == "late"]
    per = {}
    for s in rows:
        for f, v in s["formats"].items():
            per.setdefault(f, []).append(v["ms_per_step"])
    return {f: sum(v) / len(v) for f, v in per.items()}, rows

new, rows = late(sys.argv[1])
prev = late(sys.argv[2])[0] if len(sys.argv) > 2 else {}
bf = new.get("bf16")
targets = {"int8": 1.7, "fp8": 2.0, "int4": 2.0, "int4-protected": 2.0}
print("late mean   %-15s %9s %9s %8s %8s %7s" % ("format", "prev ms", "new ms", "prev x", "new x", "target"))
for f in ["bf16", "int8", "fp8", "int4", "int4-protected"]:
    if f not in new:
        continue
    p = prev.get(f)
    print("            %-15s %9s %9.2f %8s %7.2fx %7s" % (
        f, "%.2f" % p if p else "-", new[f], "%.2fx" % (bf / p) if p and bf else "-", bf / new[f],
        "%.1fx" % targets[f] if f in targets else ""))
for s in rows:
    fm = s["formats"]
    b = fm.get("bf16", {}).get("ms_per_step")
    print("%4dx%-5d " % (s["batch"], s["context"]) + " ".join(
        "%s %.2f (%.2fx)" % (f, v["ms_per_step"], b / v["ms_per_step"]) for f, v in fm.items() if b))
