#!/usr/bin/env bash
# Builds the CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer (CMake preset `asan`:
# CUDA off, the test binary only, build-asan) and runs them; any sanitizer report fails the run.
# .ci/run calls it after the README's test command.
#   usage: bash tools/test_asan.sh [GTEST_FILTER]   (default: every test but the heavy ones below)
#
# What runs: every test of hotops_tests (every family's CPU cases at their small test shapes, the
# harness tests) except the few whole-model tests that take 20 s to 3 min each under ASan: the
# bert/vit training steps and batch-3 and thread-sweep cases of the OpTest (batch 1 infer of both
# still runs), the bf16 bounds and planted-error sweeps of model_bert, and the loss-falls training
# runs of model_bert and model_bilstm. They run unsanitized in tools/test.sh. The binary runs
# directly, split in one shard per core (one process per test under ctest costs more than the tests).
# The preset adds -Wno-maybe-uninitialized: GCC 12 gives false positives of it inside std::regex and
# std::function when the sanitizers instrument them. It compiles at -O1 with line tables only (-g1:
# a report's stack still names file and line): on a 2-core build machine that halved the build
# (460 s against 925 s at RelWithDebInfo's -O2 -g), and the tests ran as fast (125 s both).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/deps.sh
root=$(pwd)

# halt_on_error: the first report ends the run; detect_leaks: LeakSanitizer at exit. The
# suppression files say, entry by entry, why each one is there.
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:suppressions=$root/tools/sanitizers/ubsan.supp"
export LSAN_OPTIONS="suppressions=$root/tools/sanitizers/lsan.supp:print_suppressions=0"
# OpenMP threads sleep at barriers: one shard per core, each with its own threads, share the cores.
export OMP_WAIT_POLICY=PASSIVE

heavy="ModelBilstmTraining.LossFallsCpu:ModelBertTraining.LossFallsCpu:ModelBertVerify.Bf16Bounds*:ModelBertVerify.PlantedErrorsFail"
heavy+=":Registry/OpTest.MatchesReference/model_bert_layer_cpu_f32_train*:Registry/OpTest.MatchesReference/model_vit_layer_cpu_f32_train*"
heavy+=":Registry/OpTest.MatchesReference/model_bert_layer_cpu_f32_infer_batch_3*:Registry/OpTest.MatchesReference/*_layer_cpu_f32_*_threads_*"
filter=${1:-"*-$heavy"}

cmake --preset asan >/dev/null
# The build runs the test binary to list its tests (gtest_discover_tests), under the options above.
cmake --build --preset asan -j"$(nproc)"

start=$(date +%s)
shards=$(nproc)
logs=build-asan/asan-logs
mkdir -p "$logs"
pids=()
for ((i = 0; i < shards; ++i)); do
  GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i build-asan/test/hotops_tests --gtest_filter="$filter" --gtest_brief=1 \
    >"$logs/shard$i.log" 2>&1 &
  pids+=($!)
done
status=0
for ((i = 0; i < shards; ++i)); do
  if wait "${pids[$i]}"; then
    echo "shard $i/$shards: $(grep -E '^\[  PASSED  \]' "$logs/shard$i.log" | head -1)"
  else
    status=1
    echo "shard $i/$shards FAILED ($logs/shard$i.log):"
    grep -E -A30 "ERROR: (Address|Leak)Sanitizer|runtime error|\[  FAILED  \]" "$logs/shard$i.log" | head -60
  fi
done
echo "ASan/UBSan tests: $(( $(date +%s) - start )) s"
exit $status
