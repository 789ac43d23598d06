#!/bin/sh
# The codecs' SIMD kernel libraries are whole files compiled with -mavx2 or
# AVX-512 flags. An inline function or template they instantiate (a weak
# symbol) would be merged by the linker with the copies other files make, and
# the copy it keeps could be this one: code running before the CPU check, or
# on a CPU without those instructions, would then die of SIGILL. So these
# libraries must define no weak symbols (plugins/codecs/kernels/avx2.cpp).
# usage: no_shared_inline_copies.sh LIB.a...
status=0
for lib in "$@"; do
  # DW.ref.__gxx_personality_v0 (a weak pointer to the C++ exception
  # personality routine, emitted by some builds) is data the compiler
  # makes in every file, not code.
  weak=$(nm -C "$lib" | grep -E ' [WVu] ' | grep -v ' DW\.ref\.__gxx_personality_v0$')
  if [ -n "$weak" ]; then
    echo "$lib defines weak symbols (inline functions shared with other files):" >&2
    echo "$weak" >&2
    status=1
  else
    echo "$lib: no weak symbols"
  fi
done
exit $status
