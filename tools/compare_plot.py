#!/usr/bin/env python3
"""Plots of hotops runs (PNG and SVG): speed-up against batch per op or model, and a roofline.

    python3 tools/compare_plot.py RUN.json [OTHER.json] [--out DIR] [--tool PATH/hotops-compare]

- speedup_<op>.png/.svg: CPU time / GPU time against the batch, one line per variant, from
  `hotops-compare speedup RUN [OTHER] --format=json` (so the grouping is the tool's). With OTHER,
  the CPU entries come from RUN and the CUDA entries from OTHER, as in hotops-compare. The title
  names the CPU and the GPU compared, from the runs' contexts.
- roofline_<backend>.png/.svg: achieved FLOP/s against arithmetic intensity (FLOP/s / bytes/s,
  in FLOP per byte) for every entry with both counters, under the ceilings bench measured at
  start-up on the same machine (context: roofline_<backend>_copy_GBps,
  roofline_<backend>_<dtype>_gemm_TFLOPs); the title names the CPU model or the GPU. With OTHER,
  each run gets its own charts, roofline_<backend>_<host>.png, so that no entry is drawn under
  another machine's ceilings.

Needs matplotlib; it is optional for hotops. When the interpreter running this script lacks it, the
script runs itself with another python3 that has it (PATH, /usr/bin, /usr/local/bin), else says
which command installs it for this interpreter.
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
import sysconfig

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


def cpu_of(ctx):
    """The CPU a run measured, as its context names it: model, logical CPUs, host."""
    model = str(ctx.get("cpu_model") or "").strip() or "CPU model not recorded"
    cpus = f", {ctx['num_cpus']} CPUs" if ctx.get("num_cpus") else ""
    host = f" on {ctx['host_name']}" if ctx.get("host_name") else ""
    return f"{model}{cpus}{host}"


def gpu_of(ctx):
    """The GPU a run measured: gpu_name, else bench's reason for having none."""
    host = f" on {ctx['host_name']}" if ctx.get("host_name") else ""
    if ctx.get("gpu_name"):
        return f"{ctx['gpu_name']}{host}"
    if ctx.get("gpu"):
        return f"no GPU ({ctx['gpu']}){host}"
    return f"GPU not recorded{host}"


def run_tags(paths, contexts):
    """One short file-name tag per run: the host name, else the file's stem, else its position."""
    for tags in ([c.get("host_name") or "" for c in contexts],
                 [os.path.splitext(os.path.basename(p))[0] for p in paths]):
        tags = [safe(t) for t in tags]
        if all(tags) and len(set(tags)) == len(tags):
            return tags
    return [f"run{i + 1}" for i in range(len(paths))]


def save(fig, out, stem, formats):
    paths = []
    for ext in formats:
        path = os.path.join(out, f"{stem}.{ext}")
        fig.savefig(path, dpi=120, bbox_inches="tight")
        paths.append(path)
    return paths


def plot_speedups(plt, tool, runs, contexts, out, formats):
    result = subprocess.run([tool, "speedup", *runs, "--format=json"], capture_output=True, text=True)
    if result.returncode != 0:
        print(f"compare_plot: no speed-up plots: {result.stderr.strip()}", file=sys.stderr)
        return []
    data = json.loads(result.stdout)
    # As in hotops-compare: the CPU entries come from the first run, the CUDA ones from the last.
    machines = f"CPU: {cpu_of(contexts[0])}\nGPU: {gpu_of(contexts[-1])}"
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
        ax.set_title(f"{group['op']}: above 1 the GPU is faster\n{machines}", fontsize=9)
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


def ceilings_of(ctx):
    """The ceilings bench measured at start-up on the run's machine, per backend."""
    ceilings = {}
    for key, value in ctx.items():
        m = re.fullmatch(r"roofline_(cpu|cuda)_copy_GBps", key)
        if m:
            ceilings.setdefault(m.group(1), {})["copy"] = float(value) * 1e9
        m = re.fullmatch(r"roofline_(cpu|cuda)_([a-z0-9]+)_gemm_TFLOPs", key)
        if m:
            ceilings.setdefault(m.group(1), {}).setdefault("gemm", {})[m.group(2)] = float(value) * 1e12
    return ceilings


def plot_rooflines(plt, runs, out, formats):
    """One chart per run and backend: each machine's entries under that machine's own ceilings."""
    loaded = [entries(path) for path in runs]
    tags = run_tags(runs, [ctx for _, ctx in loaded]) if len(runs) > 1 else [None]
    written = []
    for (points, ctx), tag in zip(loaded, tags):
        ceilings = ceilings_of(ctx)
        for backend in ("cpu", "cuda"):
            pts = [p for p in points if p["backend"] == backend]
            if not pts:
                continue
            machine = cpu_of(ctx) if backend == "cpu" else gpu_of(ctx)
            written += roofline_chart(plt, pts, ceilings.get(backend, {}), backend, machine, out,
                                      f"roofline_{backend}" + (f"_{tag}" if tag else ""), formats)
    return written


def roofline_chart(plt, pts, c, backend, machine, out, stem, formats):
    fig, ax = plt.subplots(figsize=(8, 5.5))
    intensity = [p["flops"] / p["bw"] for p in pts]
    lo, hi = min(intensity) / 4, max(intensity) * 4
    for dt in sorted({p["dtype"] for p in pts}):
        sel = [p for p in pts if p["dtype"] == dt]
        ax.scatter([p["flops"] / p["bw"] for p in sel], [p["flops"] for p in sel], s=14, label=f"{dt} entries")
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
    what = "ceilings measured by bench on this machine" if c else "no ceilings in the run"
    ax.set_title(f"roofline, {backend}: {machine}\n{what}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    written = save(fig, out, stem, formats)
    plt.close(fig)
    return written


def install_hint():
    """The command that installs matplotlib for the interpreter running this script."""
    exe = sys.executable or "python3"
    in_venv = sys.prefix != getattr(sys, "base_prefix", sys.prefix)
    managed = os.path.isfile(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))
    if managed and not in_venv and os.path.realpath(exe).startswith("/usr/bin/") and shutil.which("apt-get"):
        # Debian's own python3 refuses pip outside a virtual environment (PEP 668).
        return ("" if os.geteuid() == 0 else "sudo ") + "apt-get install python3-matplotlib"
    return f"{exe} -m pip install matplotlib"


def other_python_with_matplotlib():
    """Another python3 that imports matplotlib: Debian's python3-matplotlib belongs to
    /usr/bin/python3, which a pyenv or virtual-environment python3 on PATH hides."""
    me = os.path.realpath(sys.executable) if sys.executable else None
    for c in (shutil.which("python3"), "/usr/bin/python3", "/usr/local/bin/python3"):
        if not c or not os.access(c, os.X_OK) or os.path.realpath(c) == me:
            continue
        probe = subprocess.run([c, "-c", "import matplotlib"], capture_output=True)
        if probe.returncode == 0:
            return c
    return None


def import_pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        matplotlib.rcParams["svg.fonttype"] = "none"  # SVG text stays text: searchable, selectable
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        pass
    if not os.environ.get("HOTOPS_PLOT_REEXEC"):
        other = other_python_with_matplotlib()
        if other:
            print(f"compare_plot: {sys.executable} has no matplotlib; running with {other}", file=sys.stderr)
            sys.stdout.flush()
            os.environ["HOTOPS_PLOT_REEXEC"] = "1"
            os.execv(other, [other, os.path.abspath(__file__), *sys.argv[1:]])
    print(f"compare_plot: matplotlib is missing for {sys.executable} and no other python3 here has it;"
          f" install it with: {install_hint()}", file=sys.stderr)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="RUN.json [OTHER.json]")
    ap.add_argument("--out", default="plots", help="output folder (default: plots)")
    ap.add_argument("--tool", help="path of hotops-compare (default: PATH, then build*/ of the repository)")
    ap.add_argument("--formats", default="png,svg", help="comma-separated (default: png,svg)")
    args = ap.parse_args()
    if len(args.runs) > 2:
        ap.error("at most two runs: RUN.json [OTHER.json]")
    for r in args.runs:
        if not os.path.isfile(r):
            print(f"compare_plot: {r}: cannot open", file=sys.stderr)
            return 2
    plt = import_pyplot()
    if plt is None:
        return 2
    os.makedirs(args.out, exist_ok=True)
    formats = [f for f in args.formats.split(",") if f]
    written = []
    try:
        contexts = [entries(r)[1] for r in args.runs]
        tool = find_tool(args.tool)
        if tool:
            written += plot_speedups(plt, tool, args.runs, contexts, args.out, formats)
        else:
            print("compare_plot: hotops-compare not found (--tool): no speed-up plots", file=sys.stderr)
        written += plot_rooflines(plt, args.runs, args.out, formats)
    except (ValueError, KeyError, TypeError) as e:
        print(f"compare_plot: cannot read the runs: {e}", file=sys.stderr)
        return 2
    for w in written:
        print(w)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
