#!/usr/bin/env bash
# One command on a machine with an NVIDIA GPU: build, run the CUDA backend's tests (which
# must really run there, not be skipped), then the GPU benchmarks: the trainer against
# PyTorch (bench:native --gpu) and the inference engine against transformers' generate
# (bench:engine --gpu, which gets --python when it is given). Each runs the default CUDA
# paths, which have passed on a GPU, and each opt-in one, which has not yet (the tests force
# them through SEARCHR1_* variables; the benchmarks with --opt-in), so one run here confirms
# or refutes every row of docs/gpu-status.md.
# Everything printed also goes to bench/gpu-results.txt: first the date, commit and GPU, each
# test by name with its result (vitest's verbose reporter), the benchmarks' tables, and last
# one line per part, "gpu.sh: <part> passed|FAILED", from which that table is updated.
#
# Usage: bench/gpu.sh [options of `npm run bench:native -- --gpu`, e.g. --steps 10
#                      --micro-batch-size 4 --recompute --python /path/to/python3]
# GPU_PARTS picks the parts (default: all four, "tests native engine profile"), so that a
# machine lent for a few minutes at a time can run them in separate calls. profile: the
# trainer's and the engine's device time per operation (bench:native and bench:engine with
# --profile: the engine's table per workload, batch 1 apart from batch 256).
# Needs: nvidia-smi (the driver), node >= 20 and npm, cmake, g++, libopenblas-dev, nvcc
# (the CUDA toolkit, to build the backend) and, for the comparisons, a Python with torch
# built for CUDA and transformers (default: python3 on the PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
exec > >(tee bench/gpu-results.txt) 2>&1

fail() {
  echo "bench/gpu.sh: $*" >&2
  exit 1
}

command -v nvidia-smi >/dev/null || fail "nvidia-smi not found: this needs an NVIDIA GPU and its driver"
# What ran, for docs/gpu-status.md: when, which commit, on which GPU.
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD || commit+=" + uncommitted changes"
else
  commit="unknown (not a git checkout)"
fi
echo "gpu.sh: $(date -u +%Y-%m-%dT%H:%MZ), commit $commit"
echo "gpu.sh: GPU $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
nvidia-smi
command -v nvcc >/dev/null || fail "nvcc not found: put the CUDA toolkit's bin on the PATH to build the backend"
command -v npm >/dev/null || fail "npm not found: install Node.js >= 20"

[ -d node_modules ] || npm ci
npm run build

# Libraries carried with a bundle built elsewhere (bench/gpu-libs.sh).
if [ -d .gpu/lib ]; then export LD_LIBRARY_PATH="$PWD/.gpu/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi

# The tests skip their GPU part when the trainer cannot use CUDA; here that is a failure.
trainer="${SEARCHR1_NATIVE_DIR:-native/build}/searchr1-trainer"
# A build made on another machine may link libraries this one lacks (Gloo, for CPU ranks).
missing=$(ldd "$trainer" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' ')
[ -z "$missing" ] || fail "$trainer needs $missing which this machine lacks: install them (Gloo: apt-get install libgloo0), carry them in .gpu/lib (bench/gpu-libs.sh), or build here"
info="$("$trainer" info)"
echo "$info"
case "$info" in
*'"available":true'*) ;;
*) fail "searchr1-trainer cannot use the GPU (see 'reason' above); if it says the build has no CUDA backend, delete native/build and run this again" ;;
esac

parts="${GPU_PARTS:-tests native engine profile}"
for part in $parts; do
  case "$part" in tests | native | engine | profile) ;; *) fail "GPU_PARTS: unknown part '$part' (tests, native, engine, profile)" ;; esac
done
wants() { [[ " $parts " == *" $1 "* ]]; }

# The benchmark runs even when a test fails, so one session on a GPU gives both reports.
# Each part's result, for the summary at the end.
summary=()
record() { summary+=("gpu.sh: $1 $([ "$2" -eq 0 ] && echo passed || echo "FAILED (exit $2)")"); }
tests=0
# cuda.test.ts: the training backend, grad --loss ppo and serve; engine/cuda.test.ts: the
# inference engine (paged KV cache and attention, head dims, KV release), each against the
# CPU; ranks.test.ts: NCCL (a communicator of one rank runs every call, ZeRO included);
# index-cuda.test.ts: the dense index on the GPU; bert-encoder.test.ts: the dense encoder
# (bidirectional attention) against transformers; profile.test.ts: --profile's tables (CUDA
# events).
if wants tests; then
  npx vitest run --reporter=verbose test/native/cuda.test.ts test/engine/cuda.test.ts \
    test/native/ranks.test.ts test/retrieval/index-cuda.test.ts \
    test/retrieval/bert-encoder.test.ts test/native/profile.test.ts || tests=$?
  record tests "$tests"
fi
# Likewise each benchmark runs even when the one before it failed.
benches=0
if wants native; then
  status=0
  npm run bench:native -- --gpu --opt-in "$@" || status=$?
  record native "$status"
  [ "$status" -eq 0 ] || benches=$status
fi
# bench:engine takes --python of these options (the others are bench:native's).
engine_opts=()
prev=""
for arg in "$@"; do
  [ "$prev" = "--python" ] && engine_opts=(--python "$arg")
  case "$arg" in --python=*) engine_opts=("$arg") ;; esac
  prev="$arg"
done
if wants engine; then
  status=0
  npm run bench:engine -- --gpu --eager --opt-in ${engine_opts[@]+"${engine_opts[@]}"} || status=$?
  record engine "$status"
  [ "$status" -eq 0 ] || benches=$status
fi
if wants profile; then
  status=0
  npm run bench:native -- --gpu --profile --steps 1 "$@" || status=$?
  npm run bench:engine -- --gpu --profile --shapes 0.5b ${engine_opts[@]+"${engine_opts[@]}"} || status=$?
  record profile "$status"
  [ "$status" -eq 0 ] || benches=$status
fi
printf '%s\n' ${summary[@]+"${summary[@]}"}
[ "$tests" -eq 0 ] || fail "the CUDA tests failed (see above)"
[ "$benches" -eq 0 ] || fail "a GPU benchmark failed (see above)"
