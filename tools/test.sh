#!/usr/bin/env bash
# Builds hotops (CUDA when a toolkit is found) and runs every test; GPU tests skip without a GPU, and
# the skipped tests are summed up at the end, grouped by the reason they gave.
#   usage: bash tools/test.sh [BUILD_DIR] [CTEST_ARGS...]      (default: build)
#   e.g.   bash tools/test.sh build -L cpu        only the CPU tests (labels: cpu, cuda, slow, compare)
#          bash tools/test.sh build -LE slow      all but the tests over 10 s
# The JUnit report stays in BUILD_DIR/ctest-junit.xml (every test's output, skipped ones included).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
build=${1:-build}
shift $(($# ? 1 : 0))
jobs=$(nproc)
start=$(date +%s)
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j"$jobs"
built=$(date +%s)

junit=$(cd "$build" && pwd)/ctest-junit.xml
rm -f "$junit"
rc=0
# --test-output-size-passed: a skipped test counts as passed, and its reason must survive in the report.
ctest --test-dir "$build" -j"$jobs" --output-on-failure --output-junit "$junit" --test-output-size-passed 16384 "$@" || rc=$?
end=$(date +%s)
echo
if [ -s "$junit" ]; then bash tools/skip_summary.sh "$junit"; fi
echo "build $((built - start)) s, tests $((end - built)) s"
exit "$rc"
