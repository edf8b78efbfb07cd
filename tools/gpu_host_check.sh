#!/usr/bin/env bash
# On the GPU host: build, run every test, run the benchmarks matching $BENCH into $OUT, and time
# each benchmark named in $NCU (space-separated exact names, no suffix) under ncu for comparison.
#   usage: OUT=dir BENCH=filter NCU="name1 name2" bash tools/gpu_host_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/hotops-out}
logs=/tmp/hotops-logs
mkdir -p "$out" "$logs/ncu"
source .gpuhost/unpack.sh >/dev/null
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DHOTOPS_WITH_CUDA=ON >"$logs/configure.log" 2>&1 || { tail -30 "$logs/configure.log"; exit 1; }
cmake --build build-gpu -j16 >"$logs/build.log" 2>&1 || { grep -E "error" "$logs/build.log" | head -30; exit 1; }
if [ "${TESTS:-1}" = 1 ]; then
  echo "== ctest"
  start=$(date +%s)
  ctest --test-dir build-gpu -j8 --output-on-failure >"$out/ctest.log" 2>&1; echo "ctest rc=$? in $(( $(date +%s) - start )) s"
  grep -E "tests passed|tests failed|\(Failed\)" "$out/ctest.log" | head -20
  echo "skipped: $(grep -c 'Skipped' "$out/ctest.log")"
fi
if [ -n "${BENCH:-}" ]; then
  echo "== bench $BENCH"
  start=$(date +%s)
  build-gpu/bench --benchmark_filter="$BENCH" --benchmark_out="$out/bench.json" --benchmark_out_format=json \
    ${BENCH_ARGS:-} >"$out/bench.txt" 2>&1; echo "bench rc=$? in $(( $(date +%s) - start )) s"
  echo "errors: $(grep -c 'ERROR OCCURRED' "$out/bench.txt")"
fi
for name in ${NCU:-}; do
  f="$logs/ncu/$(echo "$name" | tr '/' '~').csv"
  ncu --clock-control none ${NCU_ARGS:-} --metrics gpu__time_duration.sum --csv -k 'regex:^(?!.*hold_kernel)' \
    --launch-count 12 build-gpu/bench --benchmark_filter="^$name/" --benchmark_min_time=0.000001 >"$f" 2>/dev/null
done
# Whole CUDA graphs (the warm-L2 sample: runs_per_sample executions) as ncu sees them.
for name in ${NCU_GRAPH:-}; do
  f="$logs/ncu/$(echo "$name" | tr '/' '~')~~graph.csv"
  ncu --clock-control none ${NCU_ARGS:-} --graph-profiling graph --metrics gpu__time_duration.sum --csv \
    -k 'regex:^(?!.*hold_kernel)' --launch-count 12 build-gpu/bench --benchmark_filter="^$name/" \
    --benchmark_min_time=0.000001 >"$f" 2>/dev/null
  grep '^"' "$f" | head -3 | cut -c1-300
done
[ -n "${NCU:-}${NCU_GRAPH:-}" ] && python3 tools/ncu_compare.py "$out/bench.json" "$logs"/ncu/*.csv
exit 0
