#!/bin/sh
# The programs and plug-ins scripts/gpu-check.sh runs start on a machine without the Debian
# -dev packages (CMakeLists.txt, KVPROOF_PORTABLE_BINARIES): `ldd` on each lists glibc's own
# libraries and nothing else. Fails naming each file and each library that breaks this.
#
#   portable_ldd_test.sh [--also SONAME[,SONAME...]] FILE ...
#
# --also: libraries the next FILE may need besides glibc's, because gpu-bundle.sh carries them
# beside it (the CUDA benchmarks' libbenchmark.so.1, which Debian ships shared only).
set -u
glibc='linux-vdso.so.1 linux-gate.so.1 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1'
failed=0
also=''
checked=0
while [ $# -gt 0 ]; do
  if [ "$1" = --also ]; then
    also=$(echo "$2" | tr ',' ' ')
    shift 2
    continue
  fi
  file=$1
  shift
  if [ ! -f "$file" ]; then
    echo "FAIL $file: not built"
    failed=1
    continue
  fi
  if ! out=$(ldd "$file" 2>&1); then
    echo "FAIL $file: ldd: $out"
    failed=1
    continue
  fi
  extra=''
  # Each line: "name => path (address)", "name (address)" or "/path/ld-linux... (address)";
  # "statically linked" for a library that needs none.
  for lib in $(echo "$out" | grep -v '^[[:space:]]*statically linked$' | awk '{print $1}'); do
    name=${lib##*/}
    case "$name" in ld-linux*.so.*) continue ;; esac
    ok=0
    for allowed in $glibc $also; do
      [ "$name" = "$allowed" ] && ok=1
    done
    [ $ok -eq 1 ] || extra="$extra $name"
  done
  if [ -n "$extra" ]; then
    echo "FAIL $file: links beyond glibc:$extra"
    echo "$out" | sed 's/^/    /'
    failed=1
  else
    echo "ok   $file"
  fi
  checked=$((checked + 1))
  also=''
done
echo "portable_ldd_test: $checked files checked"
exit $failed
