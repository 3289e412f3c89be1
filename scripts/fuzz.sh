#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for SECONDS seconds
# on a scratch copy of its checked-in corpus. Fails on any crash, leak or sanitizer report.
#   scripts/fuzz.sh [SECONDS] [fuzzer-name ...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
shift || true
bash scripts/build.sh fuzz
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in build-fuzz/bin/fuzz_*; do names+=("$(basename "$f" | sed 's/^fuzz_//')"); done
fi
status=0
for n in "${names[@]}"; do
  bin="build-fuzz/bin/fuzz_$n"
  scratch="$(mktemp -d)"
  dict=()
  [ -f "fuzz/$n.dict" ] && dict=(-dict="fuzz/$n.dict")
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
       -artifact_prefix="$scratch/" "${dict[@]}" "$scratch" "fuzz/corpus/$n" >"$scratch/log" 2>&1; then
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$scratch/log" | grep -oE '[0-9]+$' || echo "?")
    echo "fuzz $n: ${seconds}s, $execs executions, no crash"
  else
    echo "fuzz $n: FAILED (crash inputs and log kept in $scratch)"; tail -40 "$scratch/log"; status=1
    continue
  fi
  rm -rf "$scratch"
done
exit $status
