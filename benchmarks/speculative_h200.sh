#!/usr/bin/env bash
# Self-speculative decoding's step costs on the nvidia-h200 machine (through the device tool): vulkan:0
# (the NVIDIA driver) and its 16-core cpu, with the models' real shapes and tensor types and random
# weights (the model files cannot be carried there: benchmarks/vulkan_models.json, written to GGUF files
# there), combined with the acceptance measured on the real weights (benchmarks/speculative_acceptance.json,
# written by benchmarks/speculative_bench.py) into the speed-up each K and N would give.
#
# Set up once as benchmarks/vulkan_h200.sh says (.gl and .whl), then through the device tool:
#   run(command="bash benchmarks/speculative_h200.sh", carry=[".gl", ".whl"], kind="nvidia-h200")
# It prints the figures and leaves $OUT/speculative_h200.json (a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_machine_setup.sh
echo "loader: $(ldconfig -p | grep -m1 libvulkan.so.1 || echo 'libvulkan.so.1 missing')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 benchmarks/speculative_bench.py --random-weights --backends vulkan:0,cpu --backends cpu \
  --acceptance benchmarks/speculative_acceptance.json --repeats 5 --out "${OUT:-/tmp}/speculative_h200.json" "$@"
