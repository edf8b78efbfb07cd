#!/usr/bin/env bash
# Builds hotops (bench and hotops-compare, in build/ of the repository) and runs the benchmarks in
# the caller's directory, so that relative paths such as --benchmark_out=out.json land there.
#   usage: bash tools/bench.sh [bench arguments...]      (e.g. --benchmark_filter=addmm)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/tools/deps.sh"
# shellcheck source=tools/build_common.sh
source "$root/tools/build_common.sh"
hotops_configure "$root" "$root/build"
cmake --build "$root/build" -j"$(nproc)" --target bench hotops-compare
exec "$root/build/bench" "$@"
