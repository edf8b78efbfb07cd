#!/usr/bin/env python3
"""Plots of hotops runs (PNG and SVG): speed-up against batch per op or model, and a roofline.

    python3 tools/compare_plot.py RUN.json [OTHER.json] [--out DIR] [--tool PATH/hotops-compare]

- speedup_<op>.png/.svg: CPU time / GPU time against the batch, one line per variant, from
  `hotops-compare speedup RUN [OTHER] --format=json` (so the grouping is the tool's). With OTHER,
  the CPU entries come from RUN and the CUDA entries from OTHER, as in hotops-compare.
- roofline_<backend>.png/.svg: achieved FLOP/s against arithmetic intensity (FLOP/s / bytes/s,
  in FLOP per byte) for every entry with both counters, with the ceilings bench measured at
  start-up (context: roofline_<backend>_copy_GBps, roofline_<backend>_<dtype>_gemm_TFLOPs).

Needs python3 and matplotlib (Debian: python3-matplotlib); it is optional for hotops.
"""
import argparse
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_tool(explicit):
    candidates = [explicit, os.environ.get("HOTOPS_COMPARE"), shutil.which("hotops-compare")]
    for build in sorted(os.listdir(ROOT)):
        if build.startswith("build"):
            candidates.append(os.path.join(ROOT, build, "hotops-compare"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    return None


def safe(name):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def save(fig, out, stem, formats):
    paths = []
    for ext in formats:
        path = os.path.join(out, f"{stem}.{ext}")
        fig.savefig(path, dpi=120, bbox_inches="tight")
        paths.append(path)
    return paths


def plot_speedups(plt, tool, runs, out, formats):
    result = subprocess.run([tool, "speedup", *runs, "--format=json"], capture_output=True, text=True)
    if result.returncode != 0:
        print(f"compare_plot: no speed-up plots: {result.stderr.strip()}", file=sys.stderr)
        return []
    data = json.loads(result.stdout)
    written = []
    for group in data["groups"]:
        rows = [r for r in group["rows"] if any(c["batch"] for c in r["cells"])]
        if not rows:
            continue  # no batch axis: nothing to plot against
        fig, ax = plt.subplots(figsize=(8, 5))
        for row in rows:
            cells = [c for c in row["cells"] if c["batch"] and c["speedup"]]
            label = row["variant"]
            if row["crossover_batch"] is not None:
                label += f"  (crossover {'<=' if row['crossover_at_smallest_batch'] else ''}{row['crossover_batch']})"
            ax.plot([c["batch"] for c in cells], [c["speedup"] for c in cells], marker="o", label=label)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("speed-up: CPU time / GPU time")
        ax.set_title(f"{group['op']}: above 1 the GPU is faster")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        written += save(fig, out, f"speedup_{safe(group['op'])}", formats)
        plt.close(fig)
    return written


def entries(path):
    """Median FLOP/s and bytes/s per run name, from the iteration entries of a run."""
    with open(path) as f:
        doc = json.load(f)  # Python's json reads Google Benchmark's NaN and Infinity
    per_name = {}
    for e in doc.get("benchmarks", []):
        if e.get("run_type") == "aggregate" or e.get("error_occurred") or e.get("skipped"):
            continue
        flops, bw = e.get("FLOP/s"), e.get("bytes_per_second")
        if not flops or not bw or not math.isfinite(flops) or not math.isfinite(bw) or flops <= 0 or bw <= 0:
            continue
        per_name.setdefault(e.get("run_name", e["name"]), []).append((flops, bw))
    out = []
    for name, values in per_name.items():
        parts = name.split("/")
        if len(parts) < 4 or parts[1] not in ("cpu", "cuda"):
            continue
        out.append({"name": name, "backend": parts[1], "dtype": parts[2],
                    "flops": statistics.median(v[0] for v in values), "bw": statistics.median(v[1] for v in values)})
    return out, doc.get("context", {})


def plot_rooflines(plt, runs, out, formats):
    points, ceilings = [], {}
    for path in runs:
        pts, ctx = entries(path)
        points += pts
        for key, value in ctx.items():
            m = re.fullmatch(r"roofline_(cpu|cuda)_copy_GBps", key)
            if m:
                ceilings.setdefault(m.group(1), {})["copy"] = float(value) * 1e9
            m = re.fullmatch(r"roofline_(cpu|cuda)_([a-z0-9]+)_gemm_TFLOPs", key)
            if m:
                ceilings.setdefault(m.group(1), {}).setdefault("gemm", {})[m.group(2)] = float(value) * 1e12
    written = []
    for backend in ("cpu", "cuda"):
        pts = [p for p in points if p["backend"] == backend]
        if not pts:
            continue
        fig, ax = plt.subplots(figsize=(8, 5.5))
        intensity = [p["flops"] / p["bw"] for p in pts]
        lo, hi = min(intensity) / 4, max(intensity) * 4
        dtypes = sorted({p["dtype"] for p in pts})
        for dt in dtypes:
            sel = [p for p in pts if p["dtype"] == dt]
            ax.scatter([p["flops"] / p["bw"] for p in sel], [p["flops"] for p in sel], s=14, label=f"{dt} entries")
        c = ceilings.get(backend, {})
        bw = c.get("copy")
        for dt, peak in sorted(c.get("gemm", {}).items()):
            if bw:
                ridge = peak / bw
                lo, hi = min(lo, ridge / 8), max(hi, ridge * 8)
                xs = [lo, ridge, hi]
                ax.plot(xs, [min(peak, bw * x) for x in xs], linewidth=1.2,
                        label=f"{dt} GEMM {peak / 1e12:.3g} TFLOP/s, copy {bw / 1e9:.4g} GB/s")
            else:
                ax.axhline(peak, linewidth=1.2, label=f"{dt} GEMM {peak / 1e12:.3g} TFLOP/s")
        if bw and not c.get("gemm"):
            ax.plot([lo, hi], [bw * lo, bw * hi], linewidth=1.2, label=f"copy {bw / 1e9:.4g} GB/s")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP per byte of minimal traffic)")
        ax.set_ylabel("achieved FLOP/s")
        ax.set_title(f"roofline, {backend}: ceilings measured by bench" if c else f"{backend}: no ceilings in the run")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="best")
        written += save(fig, out, f"roofline_{backend}", formats)
        plt.close(fig)
    return written


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="RUN.json [OTHER.json]")
    ap.add_argument("--out", default="plots", help="output folder (default: plots)")
    ap.add_argument("--tool", help="path of hotops-compare (default: PATH, then build*/ of the repository)")
    ap.add_argument("--formats", default="png,svg", help="comma-separated (default: png,svg)")
    args = ap.parse_args()
    if len(args.runs) > 2:
        ap.error("at most two runs: RUN.json [OTHER.json]")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("compare_plot: matplotlib is missing (Debian: apt-get install python3-matplotlib)", file=sys.stderr)
        return 2
    for r in args.runs:
        if not os.path.isfile(r):
            print(f"compare_plot: {r}: cannot open", file=sys.stderr)
            return 2
    os.makedirs(args.out, exist_ok=True)
    formats = [f for f in args.formats.split(",") if f]
    written = []
    tool = find_tool(args.tool)
    if tool:
        written += plot_speedups(plt, tool, args.runs, args.out, formats)
    else:
        print("compare_plot: hotops-compare not found (--tool): no speed-up plots", file=sys.stderr)
    try:
        written += plot_rooflines(plt, args.runs, args.out, formats)
    except (ValueError, KeyError) as e:
        print(f"compare_plot: cannot read the runs: {e}", file=sys.stderr)
        return 2
    for w in written:
        print(w)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
