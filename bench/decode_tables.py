#!/usr/bin/env python3
"""Markdown tables for docs/performance.md from bench/decode's JSON (run here):
   bench/decode_tables.py [bench/results/decode-h200.json]"""
import json, sys

d = json.load(open(sys.argv[1] if len(sys.argv) > 1 else "bench/results/decode-h200.json"))
F = ["bf16", "int8", "fp8", "int4", "int4-protected"]
print("| stage | " + " | ".join(F) + " |\n| --- |" + " ---: |" * len(F))
for st, m in d["stage_means"].items():
    print(f"| {st} | " + " | ".join(f"{m[f]['ms_per_step']:.2f} / {m[f]['tokens_per_s']:.0f} / {m[f]['speedup_vs_bf16']:.2f}×"
                                   for f in F) + " |")

def name(s):
    n = f"{s['batch']}×{s['context']}"
    return n + (f" (of {s['batch_requested']})" if s["batch"] != s["batch_requested"] else "")

print("\n| batch×ctx | kv | ms/step | tokens/s | GB/step | GB/s | floor ms | floor/t | vs bf16 |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for s in d["shapes"]:
    if s["stage"] != "late":
        continue
    for i, f in enumerate(F):
        r = s["formats"][f]
        print(f"| {name(s) if i == 0 else ''} | {f} | {r['ms_per_step']:.2f} | {r['tokens_per_s']:.0f} | "
              f"{r['gb_per_step']:.2f} | {r['achieved_gbps']:.0f} | {r['floor_ms']:.2f} | "
              f"{100 * r['fraction_of_floor_speed']:.1f}% | {r['speedup_vs_bf16']:.2f}× |")
print("\n| stage | batch×ctx | " + " | ".join(F) + " |\n| --- | --- |" + " ---: |" * len(F))
for s in d["shapes"]:
    fm = s["formats"]
    print(f"| {s['stage']} | {name(s)} | {fm['bf16']['ms_per_step']:.2f} | " +
          " | ".join(f"{fm[f]['ms_per_step']:.2f} ({fm[f]['speedup_vs_bf16']:.2f}×)" for f in F[1:]) + " |")
