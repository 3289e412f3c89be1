#!/usr/bin/env bash
# The main job: builds kvproof if needed, then runs it on the built-in default model.
# Until the paged engine lands this is reference generation on the tiny preset; extra
# arguments replace the default ones.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh default kvproof
if [ $# -eq 0 ]; then
  set -- generate --preset tiny --prompt 1,2,3 --max-tokens 16
fi
exec build/bin/kvproof "$@"
