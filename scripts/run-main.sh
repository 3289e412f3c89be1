#!/usr/bin/env bash
# The main job: builds kvproof if needed, then runs `kvproof verify` on the built-in default
# model (tiny) and workload (mixed): the paged engine against the reference transformer.
# Exit status non-zero on any failed check. Extra arguments replace the default ones.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh default kvproof
if [ $# -eq 0 ]; then
  set -- verify
fi
exec build/bin/kvproof "$@"
