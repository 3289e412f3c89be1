#!/bin/sh
# --summary on every command that writes one (verify, audit, audit --kv-events, kernel-check,
# simulate): the Markdown file gets the verdict first and, for a failing run, the failed check
# with its reproducer before the table; each command appends to the same file.
#
#   summary_cli_test.sh KVPROOF PLUGIN_DIR SOURCE_DIR
set -u
kvproof="$1"
plugins="$2"
src="$3"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
md="$out/summary.md"
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
}
expect_exit() {  # WANT COMMAND...
  want="$1"
  shift
  "$@" >"$out/stdout" 2>&1
  rc=$?
  [ "$rc" -eq "$want" ] || fail "exit $rc, wanted $want: $* ($(tail -3 "$out/stdout"))"
}
# Line number of the first line matching a fixed string, after line $2 (0: from the start).
line_of() {
  awk -v s="$1" -v after="$2" 'NR > after && index($0, s) { print NR; exit }' "$md"
}
in_order() {  # STRING... : each found after the previous
  at=0
  for s in "$@"; do
    n=$(line_of "$s" "$at")
    if [ -z "$n" ]; then
      fail "'$s' not found after line $at of the summary"
      return
    fi
    at=$n
  done
}

expect_exit 0 "$kvproof" verify --summary "$md"
in_order "## kvproof verify: ✅ PASS" "Run: \`" "### Checks" "| logits-vs-reference[recompute] | ✅ PASS |" "oracle:"

expect_exit 0 "$kvproof" audit --summary "$md"
in_order "## kvproof audit: ✅ PASS" "### Checks" "| isolation-evidence | ✅ PASS |" "covered:"

expect_exit 1 "$kvproof" audit --kv-events "$src/fuzz/corpus/kv_events/planted_stale_after_clear.kvev" --summary "$md"
in_order "## kvproof audit --kv-events: ❌ FAIL" "### Failed (1)" "- **stale-after-clear**: batch 5, block 0x0a02" \
  "  reproduce: \`" "### Checks" "| stale-after-clear | ❌ FAIL | 1 |"

expect_exit 1 "$kvproof" kernel-check --plugin "$plugins/kvp_plugin_write_past_out.so" --max-failures 2 --summary "$md"
in_order "## kvproof kernel-check: ❌ FAIL" "### Failed (1)" "- **guard-zones**: case 0: " \
  "  reproduce: \`kvproof kernel-check --plugin $plugins/kvp_plugin_write_past_out.so --grid quick --case 0\`" \
  "### Properties" "| accuracy | ✅ PASS |" "| guard-zones | ❌ FAIL |"

expect_exit 0 "$kvproof" simulate --shape chat --requests 40 --summary "$md"
in_order "## kvproof simulate" "Run: \`" "| policy | block |" "| paged  | 16 "
grep -q "## kvproof simulate: " "$md" && fail "simulate's summary has a verdict badge"

# The five summaries, appended in order.
in_order "## kvproof verify:" "## kvproof audit:" "## kvproof audit --kv-events:" "## kvproof kernel-check:" "## kvproof simulate"

# A file that cannot be written is bad input, named.
expect_exit 2 "$kvproof" verify --summary /nonexistent-dir/s.md
grep -q -- "--summary /nonexistent-dir/s.md: cannot open for writing" "$out/stdout" || fail "unwritable summary not named"
[ "$failed" -eq 0 ] && echo "PASS: every --summary"
exit "$failed"
