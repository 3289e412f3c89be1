#!/usr/bin/env bash
# Installs the Debian packages kvproof needs. Idempotent and quiet when nothing is missing.
# The CUDA toolkit is optional and never installed here: CMake finds it at /usr/local/cuda
# or on PATH when present.
set -euo pipefail

packages=(
  build-essential cmake ninja-build git
  libeigen3-dev librapidcheck-dev libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libcli11-dev libssl-dev
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev
  clang clang-format libclang-rt-14-dev llvm valgrind
  python3 python3-matplotlib python3-dev python3-numpy
  chromium poppler-utils
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
