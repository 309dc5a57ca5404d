#!/usr/bin/env bash
# Copies into .gpu/lib the shared libraries that the GPU bundle's native build links and a
# bare GPU machine may lack: Gloo (the CPU ranks' collectives) and what it pulls in (hiredis,
# libibverbs, libnl). Run it here after ../shared/tools/gpu-bundle.sh; carry .gpu/lib with the
# bundle; bench/gpu.sh puts it on LD_LIBRARY_PATH when it is there.
#
# Usage (repository root): bash bench/gpu-libs.sh [SM, default 90]
set -euo pipefail
cd "$(dirname "$0")/.."
build=".gpu/build-sm${1:-90}"
[ -x "$build/searchr1-trainer" ] || { echo "gpu-libs: no $build/searchr1-trainer: run ../shared/tools/gpu-bundle.sh first" >&2; exit 1; }
mkdir -p .gpu/lib
libs=$(for exe in searchr1-trainer searchr1-engine searchr1-index; do ldd "$build/$exe"; done |
  awk '$3 ~ /^\// && $1 ~ /^lib(gloo|hiredis|ibverbs|nl-3|nl-route-3)\./ {print $3}' | sort -u)
[ -n "$libs" ] || { echo "gpu-libs: the build links none of them (built without Gloo?)"; exit 0; }
for lib in $libs; do cp -L "$lib" .gpu/lib/; done
echo "gpu-libs: $(echo "$libs" | wc -l) libraries in .gpu/lib ($(du -sh .gpu/lib | cut -f1)):"
ls .gpu/lib
