#!/usr/bin/env bash
# Builds hotops-compare's libFuzzer target (clang, AddressSanitizer + UBSan) in build-fuzz and
# fuzzes the JSON reading for SECONDS (default 60), starting from compare/fuzz/corpus/.
# New inputs go to build-fuzz/corpus (the checked-in seed corpus stays as it is); a crash leaves
# its input in build-fuzz/ and makes this script fail.
#   usage: bash tools/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
cxx=${CXX_FUZZ:-clang++}
# libFuzzer comes with clang (Debian: clang and libclang-rt-dev); install them when missing.
missing=()
for p in clang libclang-rt-dev; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})) && command -v apt-get >/dev/null; then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
command -v "$cxx" >/dev/null || { echo "fuzz.sh: $cxx not found (Debian: apt-get install clang)" >&2; exit 2; }
cmake -S compare -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
      -DHOTOPS_FUZZ=ON -DHOTOPS_BUILD_TESTS=OFF >/dev/null
cmake --build build-fuzz --target compare_fuzz_read -j"$(nproc)"
mkdir -p build-fuzz/corpus
cd build-fuzz
# -max_len: the seed corpus holds real runs of up to ~12 kB; larger inputs only slow the search.
rc=0
./compare_fuzz_read corpus ../compare/fuzz/corpus -max_total_time="$seconds" -max_len=16384 \
                    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=./ >fuzz.log 2>&1 || rc=$?
# The crash's headline (what was thrown, which sanitizer fired, where the input was saved), then the totals.
grep -E "^(terminate called|  what\(\)|==[0-9]+==ERROR|SUMMARY|artifact_prefix|Done [0-9]+ runs)" fuzz.log || true
grep -E "^stat::" fuzz.log || true
if ((rc)); then
  echo "fuzz.sh: the fuzzer failed (exit $rc): build-fuzz/fuzz.log has the report" >&2
  echo "fuzz: 0 passed, 1 failed"
else
  echo "fuzz: 1 passed, 0 failed"
fi
exit "$rc"
