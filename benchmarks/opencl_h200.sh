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
# kind="nvidia-h200"). It prints the figures and leaves $OUT/opencl_h200.json. Arguments go to
# opencl_bench.py (--variants "v=0;;x8=0" compares matrix-vector settings, "" the plugin's choice, and
# --model-matvecs adds them on the models' heads and largest layer weights; --matvec-only,
# --models smollm2, --skip-vulkan, --skip-torch, --skip-matmul, --skip-check shorten the run).
# The sweep of the matrix-vector kernels with both models' decode (docs/opencl.md, about 5 minutes):
#   bash benchmarks/opencl_h200.sh --skip-vulkan --skip-torch --skip-matmul --model-matvecs \
#     --variants 'v=0;;x8=0;x8=0,xl=0;x8=0,shfl=0;shfl=0;x8=1,dp4a=0;r=2;r=8;wg=128'
set -euo pipefail
cd "$(dirname "$0")/.."
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -f "$ICD" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES="$ICD"; fi
# NVIDIA's OpenCL platform needs an ICD file naming its library (on the loader path here)
has_nvidia='import sys, pyopencl as cl; sys.exit(0 if any("NVIDIA" in p.name for p in cl.get_platforms()) else 1)'
if ! python3 -c "$has_nvidia" 2>/dev/null; then
  mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
  echo "wrote /etc/OpenCL/vendors/nvidia.icd"
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
python3 benchmarks/opencl_bench.py --out "${OUT:-/tmp}" "$@"
