#!/usr/bin/env bash
# The installed tree works on its own: no LD_LIBRARY_PATH, no
# CMF_PLUGIN_PATH; libcmf finds its plugins next to itself.
set -euo pipefail
builddir="$1"
dest="$(mktemp -d)"
trap 'rm -rf "$dest"' EXIT
meson install -C "$builddir" --destdir "$dest" --no-rebuild --quiet >/dev/null
host="$(find "$dest" -path '*/bin/cmfhost' -type f | head -n1)"
[ -x "$host" ] || { echo "cmfhost not installed"; exit 1; }
out="$(env -u LD_LIBRARY_PATH -u CMF_PLUGIN_PATH "$host" plugins)"
echo "$out"
echo "$out" | grep -q '^codec    f16 ' || { echo "f16 codec not loaded from the installed tree"; exit 1; }
echo "$out" | grep -q '^backend  cpu ' || { echo "cpu backend not loaded from the installed tree"; exit 1; }
echo "$out" | grep -q "$dest" || { echo "plugins were not loaded from the installed tree"; exit 1; }
