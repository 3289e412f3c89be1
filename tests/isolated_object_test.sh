#!/bin/sh
# An object compiled for a wider ISA than the rest of the build must not define anything the
# linker could merge with the host-ISA build's copy (reference/products_avx512.cc): a weak or
# unique symbol outside its private namespace would let the linker keep the AVX-512 copy for
# every caller, and a CPU without AVX-512 would die of SIGILL. Also checks the object does
# hold AVX-512 code (zmm registers), so that an empty or wrongly compiled object cannot pass.
#
#   isolated_object_test.sh NAMESPACE OBJECT...
set -u
ns="$1"
shift
failed=0
for obj in "$@"; do
  if ! syms=$(nm -C --defined-only "$obj"); then
    echo "FAIL $obj: nm could not read it"
    failed=1
    continue
  fi
  # W/V: weak; u: unique global. DW.ref.__gxx_personality_v0 is a pointer to the C++
  # personality routine, the same in every object.
  shared=$(echo "$syms" | awk '$2 ~ /^[WVu]$/' | grep -v " $ns::" | grep -v ' DW\.ref\.__gxx_personality_v0$')
  if [ -n "$shared" ]; then
    echo "FAIL $obj: mergeable definitions outside $ns::"
    echo "$shared"
    failed=1
  fi
  private=$(echo "$syms" | awk '$2 ~ /^[WVu]$/' | grep -c " $ns::")
  zmm=$(objdump -d --no-show-raw-insn "$obj" | grep -c '%zmm')
  if [ "$zmm" -eq 0 ]; then
    echo "FAIL $obj: no instruction uses a zmm register (not compiled for AVX-512?)"
    failed=1
  fi
  echo "$obj: $private weak definitions, all in $ns::; $zmm instructions on zmm registers"
done
[ $# -gt 0 ] || { echo "FAIL: no object given"; failed=1; }
exit $failed
