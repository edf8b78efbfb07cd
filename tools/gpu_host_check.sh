#!/usr/bin/env bash
# On the GPU host: build, run every test, then the benchmarks named by $1 (a filter) into $OUT,
# and ncu's kernel durations for the problems named by $2 (a filter), for the timing comparison.
#   usage: OUT=dir bash tools/gpu_host_check.sh BENCH_FILTER [NCU_FILTER]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/hotops-out}
mkdir -p "$out"
source .gpuhost/unpack.sh >/dev/null
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DHOTOPS_WITH_CUDA=ON >"$out/configure.log" 2>&1 || { tail -30 "$out/configure.log"; exit 1; }
cmake --build build-gpu -j16 >"$out/build.log" 2>&1 || { grep -E "error" "$out/build.log" | head -30; exit 1; }
echo "== ctest"
ctest --test-dir build-gpu -j8 --output-on-failure >"$out/ctest.log" 2>&1; echo "ctest rc=$?"
grep -E "tests passed|tests failed|Failed|\(Failed\)" "$out/ctest.log" | head -20
grep -c "Skipped" "$out/ctest.log" | sed 's/^/skipped: /'
if [ -n "${1:-}" ]; then
  echo "== bench $1"
  start=$(date +%s)
  build-gpu/bench --benchmark_filter="$1" --benchmark_out="$out/bench.json" --benchmark_out_format=json \
    >"$out/bench.txt" 2>&1; echo "bench rc=$? in $(( $(date +%s) - start )) s"
  grep -c "ERROR OCCURRED" "$out/bench.txt" | sed 's/^/errors: /'
fi
if [ -n "${2:-}" ]; then
  echo "== ncu $2"
  ncu --clock-control none --metrics gpu__time_duration.sum --csv -k 'regex:^(?!.*hold_kernel)' \
    --launch-count 40 build-gpu/bench --benchmark_filter="$2" --benchmark_min_time=0.000001 \
    >"$out/ncu.csv" 2>"$out/ncu.err"; echo "ncu rc=$?"
fi
