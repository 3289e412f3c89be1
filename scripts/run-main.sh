#!/usr/bin/env bash
# The main job: builds kvproof if needed, then runs `kvproof verify` on the built-in default
# model (tiny) and workload (mixed): the paged engine against the reference transformer, once
# on the cpu backend and once on the CUDA backend, on the GPU (`cuda`) when kvproof sees one,
# else its kernels emulated on the CPU (`cuda-emu`). Exit status non-zero when either run
# fails. Extra arguments replace the default ones (one run, as given).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh default kvproof
if [ $# -gt 0 ]; then
  exec build/bin/kvproof "$@"
fi
cuda=cuda-emu
if grep -q '^  cuda  *runs here$' <<<"$(build/bin/kvproof info --preset tiny)"; then cuda=cuda; fi
rc=0
build/bin/kvproof verify || rc=$?
cuda_rc=0
build/bin/kvproof verify --backend "$cuda" || cuda_rc=$?
[ "$rc" -ne 0 ] || rc=$cuda_rc
exit "$rc"
