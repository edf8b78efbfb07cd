#!/usr/bin/env python3
"""Compares hotops' reported GPU times with the kernel durations ncu measured for the same problems.

usage: ncu_compare.py BENCH_JSON NCU_CSV [NCU_CSV ...]
Each NCU_CSV comes from `ncu --csv --metrics gpu__time_duration.sum ... bench --benchmark_filter=F`
with F matching exactly one benchmark; the file name's stem must be the benchmark name with '/'
replaced by '~'. Prints bench time, the sum over the run's kernels of ncu's median duration, and the ratio.
"""
import csv, json, os, statistics, sys
from collections import defaultdict


def ncu_kernels(path):
    rows = defaultdict(list)
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "nsecond")
        v = float(r["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit, 1e-3)
        rows[r["Kernel Name"][:60]].append(v * scale)
    return rows


def main():
    bench = {b["name"]: b for b in json.load(open(sys.argv[1]))["benchmarks"]}
    for path in sys.argv[2:]:
        want = os.path.basename(path)[:-4].replace("~~graph", "").replace("~", "/")
        match = [n for n in bench if n.startswith(want)]
        if not match:
            print(f"{want}: not in the bench JSON")
            continue
        b = bench[match[0]]
        k = ncu_kernels(path)
        if path.endswith("~~graph.csv"):
            # The graph of runs_per_sample executions, as calibrated in the profiled process (its
            # console output is in the same file), against ncu's duration of the whole graph.
            runs = [float(l.split("runs_per_sample=")[1].split()[0]) for l in open(path) if "runs_per_sample=" in l]
            graph = [v for n, v in k.items() if n.startswith("graph")]
            graph = [x for v in graph for x in v]
            per_run = statistics.median(graph) / runs[0] if graph and runs else float("nan")
        else:
            # Per run: each distinct kernel once, at its median (warm-up launches included).
            per_run = sum(statistics.median(v) for v in k.values())
        t = b["real_time"] * {"us": 1, "ms": 1e3, "ns": 1e-3}[b["time_unit"]]
        ratio = t / per_run if per_run else float("nan")
        print(f"{match[0]}\n   bench {t:10.3f} us   ncu {per_run:10.3f} us   bench/ncu {ratio:6.3f}   kernels: "
              + ", ".join(f"{n[:40]} x{len(v)}" for n, v in k.items()))


if __name__ == "__main__":
    main()
