#!/usr/bin/env bash
# Self-speculative decoding's step costs on the nvidia-h200 machine's Vulkan driver (through the device
# tool), with the models' real shapes and tensor types and random weights (the model files cannot be
# carried there), combined with the acceptance measured here on the real weights
# (benchmarks/speculative_acceptance.json, written by benchmarks/speculative_bench.py).
#
# Set up once as benchmarks/vulkan_h200.sh says (.gl and .whl), then through the device tool:
#   run(command="bash benchmarks/speculative_h200.sh", carry=[".gl", ".whl"], kind="nvidia-h200")
# It prints the figures and leaves $OUT/speculative_h200.json.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -f "$ICD" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES="$ICD"; fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 benchmarks/speculative_bench.py --random-weights --backends vulkan:0,cpu \
  --acceptance benchmarks/speculative_acceptance.json --repeats 5 --out "${OUT:-/tmp}/speculative_h200.json" "$@"
