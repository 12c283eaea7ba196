#!/usr/bin/env bash
# The OpenCL plugin's speed on the nvidia-h200 machine (through the device tool), next to the Vulkan
# plugin and PyTorch eager on the same GPU: benchmarks/opencl_bench.py, whose docstring lists the figures.
#
# Here, once, in the repo's root (both folders are git-ignored; the device tool carries them):
#   mkdir -p .gl /tmp/amd64/partial; o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
#   apt-get $o update; (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pyopencl==2026.1.4 platformdirs pytools siphash24 typing_extensions \
#     wgpu==0.32.0 cffi==2.1.1 pycparser==3.12 rendercanvas==2.7.2 sniffio==1.3.1 gguf==0.19.0
# Then, through the device tool: run(command="bash benchmarks/opencl_h200.sh", carry=[".gl", ".whl"],
# kind="nvidia-h200"). It prints the figures and leaves $OUT/opencl_h200.json (written after each part, so a
# run stopped at its limit keeps what it measured) and $OUT/opencl_h200.log. Arguments go to
# opencl_bench.py (its --help; --skip-vulkan, --skip-torch, --skip-matmul, --skip-check, --models smollm2
# shorten the run). FRAMEWORK_OPENCL_UNFUSE=all (or some of attn,combine,norm,add,glu) in the command measures
# opencl:0's decode with its fused kernels off, to compare.
#
# `bash benchmarks/opencl_h200.sh sweep` (docs/opencl.md, under 6 minutes): the matrix-vector kernels'
# settings (FRAMEWORK_OPENCL_MATVEC) on an (N, 4096) weight of 512 MiB per type and on every product of
# both models' decode steps at their real sizes and types (random weights made there; device time, the
# L2 cache flushed before each run; each result checked against numpy), as GB/s and shares of OpenCL's
# measured device copy, a decode step's product time by setting; both models' prefill and decode on
# opencl:0 with the plugin's choice (what bounds decode) and with v=0, the first kernel; the conformance
# suite and the models' logits against the CPU plugin on that GPU. Settings still unmeasured at
# SWEEP_DEADLINE seconds are listed as skipped; the whole run stops at RUN_LIMIT seconds.
#
# `bash benchmarks/opencl_h200.sh enqueue` (about a minute): only what an enqueue costs the host there
# (benchmarks/opencl_enqueue_cost.py --by-arguments --threads 2: by a kernel's arguments and global size,
# and two host threads enqueueing at once), the log $OUT/opencl_enqueue_cost.log.
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_machine_setup.sh
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
out="${OUT:-/tmp}"
mkdir -p "$out"
limit="${RUN_LIMIT:-0}"
if [ "${1:-}" = enqueue ]; then
  shift
  timeout -k 10 "${RUN_LIMIT:-240}" python3 benchmarks/opencl_enqueue_cost.py --by-arguments --threads 2 "$@" 2>&1 \
    | tee "$out/opencl_enqueue_cost.log"
  exit "${PIPESTATUS[0]}"
fi
if [ "${1:-}" = sweep ]; then
  shift
  limit="${RUN_LIMIT:-320}"
  set -- --skip-vulkan --skip-torch --skip-matmul --model-matvecs --decode-variants ';v=0' \
    --big-variants 'v=0;;x8=0;x8=1,dp4a=0;shfl=0;r=2;r=8;wg=128;tpr=16' \
    --variants 'v=0;;x8=0;x8=1;x8=0,xl=0;shfl=0;x8=1,dp4a=0;r=1;r=2;r=4;tpr=8;tpr=32;wg=64;wg=128;wg=256' \
    --deadline "${SWEEP_DEADLINE:-280}" "$@"
fi
echo "opencl_bench.py $*"
set -o pipefail
# timeout 0 is no limit; the JSON of every finished part is already written when it stops a run
rc=0
timeout -k 10 "$limit" python3 benchmarks/opencl_bench.py --out "$out" "$@" 2>&1 | tee "$out/opencl_h200.log" || rc=$?
if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
  echo "opencl_bench.py stopped at RUN_LIMIT=$limit s: $out/opencl_h200.json holds the parts that finished"
  exit 3
fi
exit "$rc"
