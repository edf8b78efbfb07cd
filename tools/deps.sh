#!/usr/bin/env bash
# Installs the Debian packages hotops builds against (skips apt when they are all present), and NCCL
# for the multi-GPU entries where the CUDA toolkit is present and no NCCL is found.
set -euo pipefail
sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
pkgs=(cmake ninja-build g++ libbenchmark-dev libgtest-dev libgmock-dev libdnnl-dev ocl-icd-opencl-dev
      nlohmann-json3-dev libcli11-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# NCCL: the system's, the CUDA toolkit's, or else NVIDIA's nvidia-nccl-cu<major> wheel (it ships
# include/nccl.h and lib/libnccl.so.2), installed once into ~/.local/share/hotops/nccl, where
# cmake/HotopsNccl.cmake looks for it. HOTOPS_WITH_NCCL=OFF in the environment skips this.
nvcc=$(command -v nvcc || true)
[ -n "$nvcc" ] || [ ! -x /usr/local/cuda/bin/nvcc ] || nvcc=/usr/local/cuda/bin/nvcc
if [ -n "$nvcc" ] && [ "${HOTOPS_WITH_NCCL:-AUTO}" != OFF ]; then
  cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")")
  nccl_dir="${XDG_DATA_HOME:-$HOME/.local/share}/hotops/nccl"
  found=""
  for h in "${NCCL_ROOT:-/nonexistent}/include/nccl.h" "$cuda_root/include/nccl.h" /usr/include/nccl.h \
           /usr/local/include/nccl.h "$nccl_dir/nvidia/nccl/include/nccl.h"; do
    if [ -f "$h" ]; then found=$h; break; fi
  done
  if [ -z "$found" ] && python3 -c "import nvidia.nccl" >/dev/null 2>&1; then found="python's nvidia.nccl"; fi
  if [ -z "$found" ]; then
    major=$("$nvcc" --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
    wheel="nvidia-nccl-cu${major:-13}"
    if ! python3 -m pip --version >/dev/null 2>&1; then
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-pip
    fi
    echo "hotops: installing NCCL ($wheel) into $nccl_dir"
    python3 -m pip install --quiet --disable-pip-version-check --target "$nccl_dir" "$wheel"
  fi
fi
