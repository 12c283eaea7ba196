#!/usr/bin/env bash
# The CUDA plugin on the lent GPU machine (nvidia-h100-x1 or nvidia-h200: CuPy is on its image), next to
# the Vulkan and OpenCL plugins on the same GPU: benchmarks/cuda_bench.py, whose docstring lists the figures
# (conformance on cuda:0, the three model shapes against the CPU plugin, prefill and decode tok/s, the
# brief's one-chip case).
#
# Here, once, in the repo's root (both folders are git-ignored; the device tool carries them): the same
# .whl (gguf, wgpu, pyopencl and their dependencies, for Python 3.12) and .gl (libvulkan1 and GL's
# dispatch libraries) as benchmarks/opencl_h200.sh's header makes.
# Then, through the device tool: run(command="bash benchmarks/cuda_h100.sh", carry=[".gl", ".whl"]). It
# prints the figures and leaves $OUT/cuda_bench.json (written after each part) and $OUT/cuda_bench.log.
# The tool sends the checkout its session started in: from another worktree, put `git archive HEAD` of it
# in an ignored folder of that checkout (build/x/tree.tar), carry that folder too, and start the command
# with `mkdir -p /tmp/wt && tar -xf build/x/tree.tar -C /tmp/wt && cp -r .whl .gl /tmp/wt && cd /tmp/wt &&`.
# docs/cuda.md's figures: `bash benchmarks/cuda_h100.sh --runs 3 --conformance-s 120` (about 50 s on an H100).
# Arguments go to cuda_bench.py (--models smollm2, --skip-conformance, --decode 32 shorten the run).
#
# `bash benchmarks/cuda_h100.sh profile` runs benchmarks/cuda_profile.sh instead (Nsight Systems over a
# short decode on cuda:0, graphs on and off): $OUT/cuda_profile.log.
#
# `bash benchmarks/cuda_h100.sh events [MODEL...]` runs cuda_profile.py's events mode instead (CUDA events, no
# Nsight: the GPU time of each kernel of a decode step, the graph's replay alone, the host's share):
# appended to $OUT/cuda_events.log.
#
# `bash benchmarks/cuda_h100.sh ab BASE.tar [MODEL...]`: that events mode on a base tree (`git archive` of the
# commit compared with, carried in an ignored folder) and on this tree in turns, model by model:
# $OUT/cuda_ab.log.
#
# `bash benchmarks/cuda_h100.sh prefill BASE.tar [MODEL,...]`: prefill and decode on cuda:0 alone, the base tree
# and this one taking turns (cuda_bench.py), then this tree's logits against the CPU plugin: $OUT/cuda_prefill.log.
#
# `bash benchmarks/cuda_h100.sh verify [MODEL...]`: the cost of verification steps of 2, 4 and 8 rows against a
# decode step on cuda:0 and vulkan:0 (cuda_profile.py's verify mode; VERIFY_ARGS=--cuda-only: cuda:0 alone; the
# settings in the environment, FRAMEWORK_CUDA_X8=off for f32 x): appended to $OUT/cuda_verify.log.
#
# `bash benchmarks/cuda_h100.sh tests` runs the tests that need a CUDA GPU (tests/test_cuda.py: CI skips them,
# naming the reason) with pytest from .whl (make it here with `pip download pytest iniconfig packaging pluggy
# quicktok-v1 --python-version 3.12 --only-binary :all: --no-deps -d .whl`): $OUT/cuda_tests.log.
#
# `bash benchmarks/cuda_h100.sh local` is the dry run where there is no CUDA GPU (this repo's machines):
# opencl:0 (PoCL) stands in for cuda:0, with a short prompt and decode, on SmolLM2's shape only.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = local ]; then
  shift
  exec python3 benchmarks/cuda_bench.py --stand-in opencl:0 --models smollm2 --prompt 16 --decode 4 --runs 1 \
    --skip-conformance "$@"
fi
source benchmarks/gpu_machine_setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 -c 'import cupy; print("cupy", cupy.__version__, "cuda runtime", cupy.cuda.runtime.runtimeGetVersion())' || true
out="${OUT:-/tmp}"
mkdir -p "$out"
if [ "${1:-}" = tests ]; then
  # the tests that need a CUDA GPU (CI skips them with the reason): tests/test_cuda.py on cuda:0
  shift
  timeout -k 10 "${RUN_LIMIT:-560}" python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py "$@" 2>&1 \
    | tee "$out/cuda_tests.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = ab ]; then
  # engines taking turns: cuda_profile.py's events mode on the base tree (a `git archive` of the commit to
  # compare with, its framework/ run by this tree's benchmarks/) and on this tree, model by model
  base_tar="$2"
  shift 2
  mkdir -p /tmp/base && tar -xf "$base_tar" -C /tmp/base && rm -rf /tmp/base/benchmarks && cp -r benchmarks /tmp/base/
  for model in ${*:-smollm2 gemma3 qwen25-coder-1.5b}; do
    for tree in /tmp/base "$PWD"; do
      echo "=== $model: $tree"
      timeout -k 10 "${RUN_LIMIT:-560}" python3 "$tree/benchmarks/cuda_profile.py" events "$model" --work /tmp \
        ${EVENTS_ARGS:---ablation-only}
    done
  done 2>&1 | grep -v '^ \+[0-9]\+ \+[0-9.]\+ \+[0-9.]' | tee "$out/cuda_ab.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = prefill ]; then
  # engines taking turns on prefill and decode: cuda_bench.py on cuda:0 alone, in the base tree (a `git archive`
  # as for ab) and in this tree, twice each, the random-weight files written once; this tree's logits checked
  # against the CPU plugin's once, at the end. PREFILL_ARGS: more of cuda_bench.py's arguments
  base_tar="$2"
  shift 2
  mkdir -p /tmp/base && tar -xf "$base_tar" -C /tmp/base && rm -rf /tmp/base/benchmarks && cp -r benchmarks /tmp/base/
  models="${*:-smollm2,gemma3,qwen25-coder-1.5b}"
  common=(--skip-conformance --devices cuda --keep-models --work /tmp/models --models "$models" --runs 5 --decode 64)
  for tree in /tmp/base "$PWD" /tmp/base "$PWD"; do
    echo "=== $tree"
    timeout -k 10 "${RUN_LIMIT:-560}" python3 "$tree/benchmarks/cuda_bench.py" "${common[@]}" --skip-check \
      --out /tmp ${PREFILL_ARGS:-}
  done 2>&1 | tee "$out/cuda_prefill.log"
  echo "=== $PWD: logits against the cpu plugin" | tee -a "$out/cuda_prefill.log"
  timeout -k 10 "${RUN_LIMIT:-560}" python3 benchmarks/cuda_bench.py "${common[@]}" --runs 1 --decode 8 --out /tmp \
    ${PREFILL_ARGS:-} 2>&1 | grep -v "tok/s" | tee -a "$out/cuda_prefill.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = verify ]; then
  shift
  for model in ${*:-smollm2 qwen25-coder-1.5b}; do
    timeout -k 10 "${RUN_LIMIT:-560}" python3 benchmarks/cuda_profile.py verify "$model" --work /tmp ${VERIFY_ARGS:-}
  done 2>&1 | tee -a "$out/cuda_verify.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = events ]; then
  shift
  for model in ${*:-smollm2 gemma3 qwen25-coder-1.5b}; do
    timeout -k 10 "${RUN_LIMIT:-560}" python3 benchmarks/cuda_profile.py events "$model" --work /tmp ${EVENTS_ARGS:-}
  done 2>&1 | tee -a "$out/cuda_events.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = profile ]; then
  shift
  exec timeout -k 10 "${RUN_LIMIT:-560}" bash benchmarks/cuda_profile.sh "$out" "$@"
fi
timeout -k 10 "${RUN_LIMIT:-560}" python3 benchmarks/cuda_bench.py --out "$out" "$@" 2>&1 | tee "$out/cuda_bench.log"
exit "${PIPESTATUS[0]}"
