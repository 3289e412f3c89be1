#!/usr/bin/env bash
# Builds everything (default preset) and runs the test suite: every label but gpu and slow.
# Extra arguments go to ctest, e.g. scripts/run-tests.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh default
exec ctest --preset default "$@"
