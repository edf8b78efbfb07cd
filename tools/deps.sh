#!/usr/bin/env bash
# Installs the Debian packages hotops builds against (skips apt when they are all present).
set -euo pipefail
pkgs=(cmake ninja-build g++ libbenchmark-dev libgtest-dev libgmock-dev libdnnl-dev ocl-icd-opencl-dev
      nlohmann-json3-dev libcli11-dev)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
