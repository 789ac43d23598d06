# Sourced by test drivers that run programs meson did not build (the
# language bindings' tests, the SDK examples), with CMF_LIBRARY set to the
# libcmf they load. In a sanitizer build (libcmf links the ASan runtime) such
# a program must have the sanitizer runtimes loaded first:
# $SANITIZER_PRELOAD (':'-separated) is what goes in LD_PRELOAD for the
# tests' programs, never for the compilers; it is empty in other builds.
# Leak checking is off there: the language runtimes (Go's, CPython's) keep
# memory until exit by design.
SANITIZER_PRELOAD=""
if readelf -d "$CMF_LIBRARY" 2>/dev/null | grep -q 'NEEDED.*libasan'; then
  SANITIZER_PRELOAD="$(gcc -print-file-name=libasan.so)"
  if readelf -d "$CMF_LIBRARY" | grep -q 'NEEDED.*libubsan'; then
    SANITIZER_PRELOAD="$SANITIZER_PRELOAD:$(gcc -print-file-name=libubsan.so)"
  fi
  export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
fi
# with_sanitizers COMMAND...: runs COMMAND with the runtimes preloaded.
with_sanitizers() {
  if [ -n "$SANITIZER_PRELOAD" ]; then LD_PRELOAD="$SANITIZER_PRELOAD" "$@"; else "$@"; fi
}
