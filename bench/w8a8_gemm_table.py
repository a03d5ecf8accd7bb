#!/usr/bin/env python3
"""Per-layer GEMM time of bench/w8a8's JSON (qkv + o + gate_up + down, µs) per kernel and
row count, and the per-projection winner among the W8A8 kernels.

Usage: w8a8_gemm_table.py W8A8_JSON"""
import json, sys

d = json.load(open(sys.argv[1]))
rows = d["gemm_us"]
cols = ["bf16", "i8-skinny", "i8-cublas", "i8-cublasu", "i8-auto", "f8-skinny", "f8-cublas",
        "f8-cublasu", "f8-auto"]
Ts = sorted({r["T"] for r in rows})
print("%s: per-layer GEMM µs (4 projections), x36 = step ms" % d.get("model_shapes"))
print("%5s" % "T" + "".join(" %10s" % c for c in cols))
for T in Ts:
    rs = [r for r in rows if r["T"] == T]
    print("%5d" % T + "".join(" %10.1f" % sum(r.get(c, 0) for r in rs) for c in cols))
print("\nfastest W8A8 kernel per projection (µs; bf16 for reference)")
for T in Ts:
    out = []
    for r in (r for r in rows if r["T"] == T):
        for p in ("i8", "f8"):
            ks = {k: v for k, v in r.items() if k.startswith(p + "-") and k not in (p + "-auto",)}
            b = min(ks, key=ks.get)
            out.append("%s %s %s %.1f (auto %.1f)" % (r["proj"], p, b[3:], ks[b], r[p + "-auto"]))
        out[-1] += " | bf16 %.1f" % r["bf16"]
    print("%5d  " % T + "; ".join(out))
