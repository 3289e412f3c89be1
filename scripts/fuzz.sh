#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for SECONDS seconds
# on a scratch copy of its checked-in corpus. Fails on any crash, leak or sanitizer report,
# and when a target runs fewer executions per second than its floor (a fuzzer that barely
# runs is a fuzzer that does not test). A floor is a guard against a pathological slowdown,
# not a performance claim: it sits 2-3x under the slowest rate seen on a loaded 2-core CI
# machine, because a floor near the measured rate fails on noise (kv_ops measured about
# 2,200-2,300 exec/s over the checked-in corpus once, and 1,008-1,611 in 2026-12's CI runs,
# scheduler 175-330 with full-length inputs before it drew sliding windows, 91 over 150 s
# after, on this 2-core machine; the parsers 8-50k).
#   scripts/fuzz.sh [SECONDS] [fuzzer-name ...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
shift || true
bash scripts/build.sh fuzz fuzzers
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in build-fuzz/bin/fuzz_*; do names+=("$(basename "$f" | sed 's/^fuzz_//')"); done
fi
# Per target: executions per second at least (under ASan + UBSan), and libFuzzer options.
declare -A floor=([kv_ops]=450 [scheduler]=40 [event_log]=2000 [checkpoint]=2000 [trace]=2000 [shard_index]=2000 [golden]=2000 [kv_events]=2000)
declare -A extra=([kv_ops]="-max_len=456" [scheduler]="-max_len=200")  # at most 64 x 7 + 8 and 48 x 4 + 8 bytes
status=0
for n in "${names[@]}"; do
  bin="build-fuzz/bin/fuzz_$n"
  scratch="$(mktemp -d)"
  dict=()
  [ -f "fuzz/$n.dict" ] && dict=(-dict="fuzz/$n.dict")
  # shellcheck disable=SC2086
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 ${extra[$n]:-} \
       -artifact_prefix="$scratch/" "${dict[@]}" "$scratch" "fuzz/corpus/$n" >"$scratch/log" 2>&1; then
    execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$scratch/log" | grep -oE '[0-9]+$' || echo 0)
    rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$scratch/log" | grep -oE '[0-9]+$' || echo 0)
    min=${floor[$n]:-100}
    if [ "$rate" -lt "$min" ]; then
      echo "fuzz $n: ${seconds}s, $execs executions, $rate exec/s: FAILED, under the floor of $min exec/s"
      status=1
    else
      echo "fuzz $n: ${seconds}s, $execs executions, $rate exec/s (floor $min), no crash"
    fi
  else
    echo "fuzz $n: FAILED (crash inputs and log kept in $scratch)"; tail -40 "$scratch/log"; status=1
    continue
  fi
  rm -rf "$scratch"
done
exit $status
