#!/usr/bin/env bash
# Nsight Compute over a few decode steps' kernels on cuda:0 (the GPU machine, through the device tool): what
# bounds each matrix-vector product and the attention (speed of light, memory workload, occupancy, launch,
# warp stalls). benchmarks/cuda_profile.py's run mode makes the random-weight file of the model's shape and
# decodes inside cudaProfilerStart/Stop; ncu profiles only that range (--profile-from-start off), kernels
# launched one by one (FRAMEWORK_CUDA_GRAPHS=0: the same kernels a graph replays). Log: $OUT/cuda_ncu.log.
#   run(command='bash benchmarks/cuda_ncu.sh qwen25-coder-1.5b', carry=[".gl", ".whl"])
# NCU_KERNELS: a regex of kernel names (default the products and the attention); NCU_COUNT: kernels profiled
# (default 12: each of the decode step's kinds of launch a few times).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/cuda_ncu}"
mkdir -p "$out"
source benchmarks/gpu_machine_setup.sh || exit 2
NCU="$(command -v ncu || find /opt /usr/local /usr/lib /usr/bin /root -maxdepth 7 -name ncu -type f -perm -u+x 2>/dev/null | head -1)"
if [ -z "$NCU" ]; then echo "ncu not found (PATH, /opt, /usr/local, /usr/lib, /usr/bin, /root)"; exit 1; fi
work=/tmp/cuda_ncu
mkdir -p "$work"
{
  "$NCU" --version | tail -1
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  for model in ${*:-qwen25-coder-1.5b}; do
    echo "=== $model"
    FRAMEWORK_CUDA_GRAPHS=0 timeout -k 10 "${RUN_LIMIT:-400}" "$NCU" --profile-from-start off \
      --kernel-name "regex:${NCU_KERNELS:-rowvec|matvec_q|flash_attn_part|flash_combine|rope_kv}" \
      --launch-count "${NCU_COUNT:-12}" --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section Occupancy --section LaunchStats --section WarpStateStats --print-summary none \
      python3 benchmarks/cuda_profile.py run "$model" --steps 2 --meta "$work/$model.json" --work "$work"
  done
} 2>&1 | tee "$out/cuda_ncu.log"
