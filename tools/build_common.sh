# Sourced by tools/bench.sh and tools/test.sh: configures a build directory quietly and says in one
# line which backends it builds and why (CMake's own "hotops:" status lines), the whole log on failure.
#   usage: hotops_configure ROOT BUILD_DIR [cmake arguments...]

hotops_configure() {
  local root=$1 build=$2 log
  shift 2
  mkdir -p "$build"
  log="$build/hotops-configure.log"
  # HOTOPS_WITH_CUDA stays AUTO (or what the cache holds): CMake builds the CPU part alone when it
  # finds no nvcc, cuBLAS or cuDNN.
  if ! cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "hotops: configuring $build failed (the log above is also in $log)" >&2
    return 1
  fi
  sed -n 's/^-- \(hotops\(-compare\)\{0,1\}[: ].*\)$/\1/p' "$log" >&2
}
