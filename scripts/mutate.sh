#!/usr/bin/env bash
# Mutation testing of the checkers: applies one plausible slip at a time to a scratch copy of
# the tree, rebuilds incrementally, runs the spec's tests and reports each mutant killed (a
# test failed), survived (every test passed: a property no test states), equivalent (survived,
# and the spec says why no test can tell) or not built. Slow by nature: not part of CI.
#
#   scripts/mutate.sh SPEC [SPEC...]       e.g. scripts/mutate.sh scripts/mutants/kv_events.spec
#
# KVP_MUTATE_ONLY=REGEX runs only the mutants whose description matches (after a new test, to
# see the survivor it was written for killed).
#
# The scratch copy is a git worktree of HEAD plus the working tree's uncommitted changes, in
# $KVP_MUTATE_DIR (default /tmp/kvp-mutate), built with the default preset in its own build/;
# it is kept between runs so that later runs build incrementally. Exit status: 0 when no
# mutant survived unexplained, 1 otherwise, 2 on a bad spec or a suite that fails unmutated.
#
# A spec (docs/mutation-testing.md) is lines of:
#   targets T [T...]          CMake targets the tests need (built once unmutated, then per mutant)
#   test COMMAND              run from the scratch tree's root; exit 0 = every test passed
#   @ FILE  DESCRIPTION       a mutant of FILE (relative to the root)
#   - TEXT                    a line fragment that occurs exactly once in FILE ...
#   + TEXT                    ... and what it becomes (several -/+ pairs: one mutant)
#   = REASON                  the mutant is equivalent (no behaviour can tell it apart): why
# Blank lines and lines starting with # are ignored. Leading spaces after "- "/"+ " are kept.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
scratch="${KVP_MUTATE_DIR:-/tmp/kvp-mutate}"
timeout_s="${KVP_MUTATE_TIMEOUT:-600}"
[ $# -ge 1 ] || { sed -n '2,24p' "$0" >&2; exit 2; }

# ---- the scratch tree: HEAD plus uncommitted changes ----
if [ ! -d "$scratch/.git" ] && [ ! -f "$scratch/.git" ]; then
  git -C "$root" worktree add --detach "$scratch" HEAD >/dev/null 2>&1 || {
    echo "mutate: cannot create the worktree $scratch" >&2
    exit 2
  }
fi
# Back to a clean HEAD of the source tree (the last run's patch and copies undone; build/ is
# ignored, so it stays and later builds are incremental).
if ! { git -C "$scratch" reset -q --hard && git -C "$scratch" clean -qfd &&
  git -C "$scratch" checkout -q --detach "$(git -C "$root" rev-parse HEAD)"; }; then
  echo "mutate: cannot reset the scratch worktree $scratch" >&2
  exit 2
fi
git -C "$root" diff HEAD --binary >"$scratch/.mutate-local.patch"
if [ -s "$scratch/.mutate-local.patch" ]; then
  git -C "$scratch" apply --whitespace=nowarn "$scratch/.mutate-local.patch" || {
    echo "mutate: the working tree's changes do not apply to HEAD in $scratch" >&2
    exit 2
  }
fi
for f in $(git -C "$root" ls-files --others --exclude-standard); do
  mkdir -p "$scratch/$(dirname "$f")" && cp "$root/$f" "$scratch/$f"
done
rm -f "$scratch/.mutate-local.patch"
bash "$root/scripts/install-deps.sh"
if [ ! -f "$scratch/build/build.ninja" ]; then
  (cd "$scratch" && cmake --preset default >/dev/null) || { echo "mutate: configure failed" >&2; exit 2; }
fi

total_killed=0
total_survived=0
total_equivalent=0
total_unbuilt=0
survivors=()

run_spec() {
  local spec="$1"
  local targets="" test_cmd=""
  local -a files=() descs=() equivs=() edits=()
  local n=-1
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
      '' | '#'*) ;;
      'targets '*) targets="${line#targets }" ;;
      'test '*) test_cmd="${line#test }" ;;
      '@ '*)
        n=$((n + 1))
        local rest="${line#@ }"
        files[n]="${rest%%  *}"
        descs[n]="${rest#*  }"
        equivs[n]=""
        edits[n]=""
        ;;
      '- '* | '+ '*)
        [ "$n" -ge 0 ] || { echo "mutate: $spec: an edit before any '@ FILE' line" >&2; return 2; }
        edits[n]+="${line}"$'\n'
        ;;
      '= '*) equivs[n]="${line#= }" ;;
      *) echo "mutate: $spec: cannot read the line: $line" >&2; return 2 ;;
    esac
  done <"$spec"
  [ -n "$targets" ] && [ -n "$test_cmd" ] || { echo "mutate: $spec: needs a 'targets' and a 'test' line" >&2; return 2; }

  echo "=== $spec: $((n + 1)) mutants; targets: $targets"
  local -a target_args=()
  for t in $targets; do target_args+=(--target "$t"); done
  if ! (cd "$scratch" && cmake --build build -j "$(nproc)" "${target_args[@]}" >/tmp/kvp-mutate-build.log 2>&1); then
    echo "mutate: the unmutated tree does not build (see /tmp/kvp-mutate-build.log)" >&2
    return 2
  fi
  if ! (cd "$scratch" && timeout "$timeout_s" bash -c "$test_cmd" >/tmp/kvp-mutate-test.log 2>&1); then
    echo "mutate: the tests fail without a mutant (see /tmp/kvp-mutate-test.log): fix them first" >&2
    return 2
  fi

  local killed=0 survived=0 equivalent=0 unbuilt=0
  for i in $(seq 0 "$n"); do
    if [ -n "${KVP_MUTATE_ONLY:-}" ] && ! grep -qE -- "$KVP_MUTATE_ONLY" <<<"${descs[i]}"; then continue; fi
    local file="${files[i]}"
    local path="$scratch/$file"
    [ -f "$path" ] || { echo "mutate: $spec: mutant $((i + 1)): no file $file" >&2; return 2; }
    cp "$path" "$path.orig"
    # Applies the -/+ pairs; each '-' fragment must occur exactly once (a spec gone stale says so).
    if ! EDITS="${edits[i]}" python3 - "$path" <<'EOF'; then
import os, sys
path = sys.argv[1]
text = open(path).read()
lines = os.environ["EDITS"].splitlines()
if len(lines) % 2 or not lines:
    sys.exit("mutate: an edit needs a '- TEXT' line followed by a '+ TEXT' line")
for old, new in zip(lines[0::2], lines[1::2]):
    if not (old.startswith("- ") and new.startswith("+ ")):
        sys.exit("mutate: an edit needs a '- TEXT' line followed by a '+ TEXT' line")
    old, new = old[2:], new[2:]
    count = text.count(old)
    if count != 1:
        sys.exit(f"mutate: {path}: '{old}' occurs {count} times (it must occur once)")
    text = text.replace(old, new)
open(path, "w").write(text)
EOF
      mv "$path.orig" "$path"
      return 2
    fi
    local verdict
    if ! (cd "$scratch" && cmake --build build -j "$(nproc)" "${target_args[@]}" >/tmp/kvp-mutate-build.log 2>&1); then
      verdict="not built"
      unbuilt=$((unbuilt + 1))
    elif (cd "$scratch" && timeout "$timeout_s" bash -c "$test_cmd" >/tmp/kvp-mutate-test.log 2>&1); then
      if [ -n "${equivs[i]}" ]; then
        verdict="equivalent (${equivs[i]})"
        equivalent=$((equivalent + 1))
      else
        verdict="SURVIVED"
        survived=$((survived + 1))
        survivors+=("$spec: $file: ${descs[i]}")
      fi
    else
      verdict="killed"
      killed=$((killed + 1))
    fi
    mv "$path.orig" "$path"
    printf '  %-9s %s: %s\n' "${verdict%% (*}" "$file" "${descs[i]}"
    [ "$verdict" = "${verdict%% (*}" ] || printf '            %s\n' "${verdict#* }"
  done
  # Leaves the scratch build matching the unmutated sources for the next spec.
  (cd "$scratch" && cmake --build build -j "$(nproc)" "${target_args[@]}" >/dev/null 2>&1)
  echo "--- $spec: $((n + 1)) mutants: $killed killed, $survived survived, $equivalent equivalent, $unbuilt not built"
  total_killed=$((total_killed + killed))
  total_survived=$((total_survived + survived))
  total_equivalent=$((total_equivalent + equivalent))
  total_unbuilt=$((total_unbuilt + unbuilt))
  return 0
}

for spec in "$@"; do
  run_spec "$spec" || exit 2
done
echo
echo "mutate: $total_killed killed, $total_survived survived, $total_equivalent equivalent, $total_unbuilt not built"
for s in "${survivors[@]}"; do echo "  SURVIVED $s"; done
[ "$total_survived" -eq 0 ]
