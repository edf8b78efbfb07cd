#!/usr/bin/env bash
# Builds hotops (CUDA when a toolkit is found) and runs every test; GPU tests skip without a GPU.
#   usage: bash tools/test.sh [BUILD_DIR]        (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
build=${1:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$(nproc)"
ctest --test-dir "$build" -j"$(nproc)" --output-on-failure
