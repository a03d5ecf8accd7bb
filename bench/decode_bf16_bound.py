#!/usr/bin/env python3
"""Issue 22's BF16 target: >= 80% of the floor at every shape with batch >= 64, or the shape's
compute bound stated.  From bench/decode's JSON (BF16 weights, the bf16 KV rows): the byte
floor (weights + KV bytes / copy bandwidth, as measured in the run) and a roofline that also
counts the projections' arithmetic: the GEMMs take at least max(weight bytes / bandwidth,
2 B P / peak) (B rows, P linear parameters incl. the LM head, peak = the dense BF16
tensor-core rate, default 989 TFLOP/s: H100/H200 SXM datasheet), the attention at least its
KV bytes / bandwidth.

  bench/decode_bf16_bound.py DECODE.json [--peak-tflops 989] [--min-batch 64]
"""
import argparse
import json

# Qwen3-4B / -8B linear parameters per layer (qkv, o, gate+up, down) and LM head
MODELS = {
    "qwen3-4b": dict(d=2560, f=9728, q=4096, kv=1024, layers=36, vocab=151936),
    "qwen3-8b": dict(d=4096, f=12288, q=4096, kv=1024, layers=36, vocab=151936),
}


def linear_params(m):
    per = m["d"] * (m["q"] + 2 * m["kv"]) + m["q"] * m["d"] + m["d"] * 2 * m["f"] + m["f"] * m["d"]
    return per * m["layers"] + m["vocab"] * m["d"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("json")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--min-batch", type=int, default=64)
    a = ap.parse_args()
    d = json.load(open(a.json))
    m = MODELS[d.get("model", "qwen3-4b")]
    P = linear_params(m)
    bw = d["copy_bandwidth_gbps"] * 1e9
    wbytes = 2.0 * P  # BF16 linear weights (norms are noise)
    print(f"BF16 step vs its floors ({d['device']}, copy bandwidth {bw / 1e9:.0f} GB/s, "
          f"compute roof {a.peak_tflops:.0f} TFLOP/s, {P / 1e9:.2f} G linear parameters)")
    print("| batch×ctx | ms/step | byte floor ms | floor/t | GEMM bytes ms | GEMM flops ms | roofline ms | roofline/t | >= 80% of |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    met = total = 0
    for s in d["shapes"]:
        r = s["formats"].get("bf16")
        if not r or s["batch"] < a.min_batch:
            continue
        B = s["batch"]
        t = r["ms_per_step"]
        floor = r["floor_ms"]
        kv_ms = floor - wbytes / bw * 1e3
        g_bytes = wbytes / bw * 1e3
        g_flops = 2.0 * B * P / (a.peak_tflops * 1e12) * 1e3
        roof = max(g_bytes, g_flops) + kv_ms
        which = "floor" if floor / t >= 0.8 else ("roofline (compute-bound GEMMs)" if roof / t >= 0.8 and g_flops > g_bytes
                                                  else ("roofline" if roof / t >= 0.8 else "neither"))
        total += 1
        met += which != "neither"
        print(f"| {B}×{s['context']} | {t:.2f} | {floor:.2f} | {100 * floor / t:.1f}% | {g_bytes:.2f} | "
              f"{g_flops:.2f} | {roof:.2f} | {100 * roof / t:.1f}% | {which} |")
    print(f"BF16 >= 80% of the byte floor or of the roofline at {met} of {total} shapes with batch >= {a.min_batch}")


if __name__ == "__main__":
    main()
