#!/usr/bin/env bash
# Builds hotops and runs the benchmarks; arguments go to ./bench (e.g. --benchmark_filter=addmm).
#   usage: bash tools/bench.sh [bench arguments...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target bench
cd build && ./bench "$@"
