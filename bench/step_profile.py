#!/usr/bin/env python3
"""Where one decode step's time goes, kernel by kernel (issue 22).

Input: the CSV of `ncu --csv --page raw --print-units base --graph-profiling node
--metrics gpu__time_duration.sum bench/decode --shape BxC ...` (every kernel of the run,
in launch order).  The last decode step is found as the shortest tail that repeats right
before itself (a graph replay launches the same kernels each step; the final norm, LM head
and greedy kernels keep one layer's period from matching).  Prints that step's kernels
grouped by name: count, total us, share of the step; with several files, one column each.

  python3 bench/step_profile.py LABEL=ncu.csv [LABEL=ncu.csv ...] [--json OUT]
"""
import csv
import json
import re
import sys


def read(path):
    names, ns = [], []
    with open(path, newline="") as fh:
        rows = [r for r in csv.reader(fh)]
    head = None
    for i, r in enumerate(rows):
        if "Kernel Name" in r and "gpu__time_duration.sum" in r:
            head = i
            break
    if head is None:
        raise SystemExit(f"{path}: no ncu raw CSV header (Kernel Name, gpu__time_duration.sum)")
    kn, td = rows[head].index("Kernel Name"), rows[head].index("gpu__time_duration.sum")
    unit = rows[head + 1][td] if head + 1 < len(rows) else ""
    scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
             "second": 1e6, "s": 1e6}.get(unit)
    start = head + 2 if scale is not None else head + 1
    for r in rows[start:]:
        if len(r) <= max(kn, td):
            continue
        try:
            v = float(r[td].replace(",", ""))
        except ValueError:
            continue
        names.append(short(r[kn]))
        ns.append(v * (scale if scale is not None else 1e-3))
    return names, ns


def short(name):
    """Kernel name without its argument list and template arguments' noise."""
    name = re.sub(r"\(.*\)$", "", name.strip())
    name = re.sub(r"^void ", "", name)
    return name[:70]


def last_step(names):
    n = len(names)
    for p in range(8, n // 2 + 1):
        if names[n - p:] == names[n - 2 * p:n - p]:
            return p
    return None


def layer_view(step):
    """The layers' kernels in launch order, each position's mean us over the layers: the
    shortest period q from the second kernel on (the first is the embedding) that repeats
    at least twice; [] if none."""
    names = [n for n, _ in step]
    for q in range(2, len(names) // 2):
        if names[1:1 + q] != names[1 + q:1 + 2 * q]:
            continue
        L = 1
        while names[1 + L * q:1 + (L + 1) * q] == names[1:1 + q]:
            L += 1
        return [(names[1 + i], sum(step[1 + j * q + i][1] for j in range(L)) / L, L) for i in range(q)]
    return []


def main(argv):
    out, runs = None, []
    it = iter(argv)
    for a in it:
        if a == "--json":
            out = next(it)
        else:
            label, _, path = a.partition("=")
            runs.append((label, path))
    cols = []
    for label, path in runs:
        names, us = read(path)
        p = last_step(names)
        if not p:
            print(f"{label}: no repeating step found in {len(names)} kernels", file=sys.stderr)
            continue
        step = list(zip(names[-p:], us[-p:]))
        by = {}
        for nm, t in step:
            c, s = by.get(nm, (0, 0.0))
            by[nm] = (c + 1, s + t)
        cols.append({"label": label, "kernels": p, "step_us": sum(t for _, t in step), "by_name": by,
                     "layer": layer_view(step)})
    if not cols:
        return 1
    keys = sorted({k for c in cols for k in c["by_name"]},
                  key=lambda k: -max(c["by_name"].get(k, (0, 0))[1] for c in cols))
    print("| kernel | " + " | ".join(f"{c['label']} n / us / %" for c in cols) + " |")
    print("| --- |" + " ---: |" * len(cols))
    for k in keys:
        cells = []
        for c in cols:
            n, t = c["by_name"].get(k, (0, 0.0))
            cells.append(f"{n} / {t:.0f} / {100 * t / c['step_us']:.1f}" if n else "")
        print(f"| {k} | " + " | ".join(cells) + " |")
    print("| step (sum of kernels) | " + " | ".join(f"{c['kernels']} / {c['step_us']:.0f} / 100" for c in cols) + " |")
    for c in cols:
        if c["layer"]:
            print(f"\n{c['label']}: one layer in launch order, mean us over {c['layer'][0][2]} layers")
            for nm, t, _ in c["layer"]:
                print(f"  {t:8.1f}  {nm}")
    if out:
        with open(out, "w") as fh:
            json.dump([{**c, "by_name": {k: {"count": v[0], "us": v[1]} for k, v in c["by_name"].items()}}
                       for c in cols], fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
