#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs and stages it, debug info stripped, in a folder that
# `gpu-check.sh --prebuilt` runs on a GPU machine without building anything there:
#
#   BUNDLE/bin      kvproof, the gtest programs of ctest's gpu and kernel labels, the CUDA
#                   benchmarks
#   BUNDLE/plugins  the plug-ins kernel-check and verify load (kernel_check_test's included)
#   BUNDLE/lib      what the CUDA benchmarks link besides glibc: Debian's Google Benchmark is
#                   shared only (they find it through their RUNPATH, $ORIGIN/../lib)
#
# Everything else is linked statically (KVPROOF_PORTABLE_BINARIES, CMakeLists.txt); the bundle
# is checked with tests/portable_ldd_test.sh and its size printed (the device tool carries at
# most 64 MiB of ignored paths).
#
#   bash scripts/gpu-bundle.sh [BUILD_DIR [BUNDLE_DIR]]   # default: build build/gpu-bundle
#
# BUILD_DIR must be configured with CUDA (the default preset where nvcc is found). Building
# runs `nice`, with $JOBS jobs (default: every core).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
BUNDLE=${2:-$BUILD/gpu-bundle}
JOBS=${JOBS:-$(nproc)}
PROGRAMS=(kvproof simt_test gemm_test cuda_kernels_test kernel_check_test simt_gpu_test
  backend_conformance_gpu_test cuda_kernels_gpu_test cuda_attention_bench cuda_engine_bench)

[ -f "$BUILD/CMakeCache.txt" ] || { echo "gpu-bundle: $BUILD is not configured (cmake --preset default)" >&2; exit 2; }
grep -q '^KVPROOF_PORTABLE_BINARIES:BOOL=ON' "$BUILD/CMakeCache.txt" ||
  { echo "gpu-bundle: $BUILD is not built with KVPROOF_PORTABLE_BINARIES=ON" >&2; exit 2; }
nice -n 15 cmake --build "$BUILD" -j "$JOBS" --target "${PROGRAMS[@]}" kvp_plugin_kvproof_cuda kvp_cuda_resource_usage

rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin" "$BUNDLE/plugins" "$BUNDLE/lib"
for p in "${PROGRAMS[@]}"; do
  strip --strip-debug -o "$BUNDLE/bin/$p" "$BUILD/bin/$p"
done
for p in "$BUILD"/plugins/*.so; do
  strip --strip-debug -o "$BUNDLE/plugins/${p##*/}" "$p"
done
cp "$BUILD/cuda_resource_usage.txt" "$BUNDLE/"

# The benchmarks' shared libraries beyond glibc, under their sonames.
glibc='^(linux-vdso|linux-gate|libc|libm|libpthread|libdl|librt|ld-linux.*)\.so'
carried=()
while read -r name path; do
  if ! [[ $name =~ $glibc ]] && [ ! -e "$BUNDLE/lib/$name" ]; then
    cp -L "$path" "$BUNDLE/lib/$name"
    carried+=("$name")
  fi
done < <(ldd "$BUILD/bin/cuda_attention_bench" "$BUILD/bin/cuda_engine_bench" | awk '$2 == "=>" {print $1, $3}')
also=$(
  IFS=,
  echo "${carried[*]}"
)

bash tests/portable_ldd_test.sh "$BUNDLE"/bin/*_test "$BUNDLE/bin/kvproof" "$BUNDLE"/plugins/*.so \
  --also "$also" "$BUNDLE/bin/cuda_attention_bench" --also "$also" "$BUNDLE/bin/cuda_engine_bench"
# The benchmarks must find what is carried in the bundle, not on this machine.
for b in cuda_attention_bench cuda_engine_bench; do
  while read -r name path; do
    if [ -e "$BUNDLE/lib/$name" ] && [ "$(realpath "$path")" != "$(realpath "$BUNDLE/lib/$name")" ]; then
      echo "gpu-bundle: $b loads $name from $path, not from $BUNDLE/lib" >&2
      exit 1
    fi
  done < <(ldd "$BUNDLE/bin/$b" | awk '$2 == "=>" {print $1, $3}')
done
echo "gpu-bundle: $BUNDLE $(du -sh "$BUNDLE" | cut -f1) (carried for the benchmarks: ${carried[*]})"
