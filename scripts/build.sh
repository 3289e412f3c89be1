#!/usr/bin/env bash
# Installs dependencies, configures and builds one CMake preset; quiet when nothing needs
# doing, and prints the build log only when something fails.
#   scripts/build.sh [preset] [targets...]
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-default}"
shift || true
bash scripts/install-deps.sh
dir=$(case "$preset" in default) echo build ;; *) echo "build-$preset" ;; esac)
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
if [ ! -f "$dir/build.ninja" ]; then
  if ! cmake --preset "$preset" >"$log" 2>&1; then cat "$log"; exit 1; fi
fi
target_args=()
for t in "$@"; do target_args+=(--target "$t"); done
if ! cmake --build "$dir" -j "$(nproc)" "${target_args[@]}" >"$log" 2>&1; then
  grep -E 'error|Error|FAILED' "$log" | head -50
  echo "build of preset '$preset' failed; full log above is truncated, rerun: cmake --build $dir" >&2
  exit 1
fi
