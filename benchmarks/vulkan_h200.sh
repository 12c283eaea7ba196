#!/usr/bin/env bash
# The Vulkan plugin's speed on the nvidia-h200 machine (through the device tool), next to PyTorch.
#
# Here, once, in the repo's root (see the device tool's README, "Headless rendering" and "Notes"):
#   echo /.gl/ >>.git/info/exclude; echo /.whl/ >>.git/info/exclude
#   mkdir -p .gl /tmp/amd64/partial; o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
#   apt-get $o update; (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     wgpu==0.32.0 cffi==2.1.1 pycparser==3.12 rendercanvas==2.7.2 sniffio==1.3.1 gguf==0.19.0
#   python benchmarks/vulkan_model_spec.py        # refreshes benchmarks/vulkan_models.json (tracked)
# Then, through the device tool: run(command="bash benchmarks/vulkan_h200.sh", carry=[".gl", ".whl"],
# kind="nvidia-h200"). It prints the figures and leaves $OUT/vulkan_h200.json.
set -euo pipefail
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -f "$ICD" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES="$ICD"; fi
export PYTHONUNBUFFERED=1
echo "loader: $(ldconfig -p | grep -m1 libvulkan.so.1 || echo 'libvulkan.so.1 missing')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 benchmarks/vulkan_bench.py --out "${OUT:-/tmp}" "$@"
