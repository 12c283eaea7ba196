#!/usr/bin/env bash
# The Vulkan plugin's speed on the nvidia-h200 machine (through the device tool), next to PyTorch eager.
#
# Here, once, in the repo's root (see the device tool's README, "Headless rendering" and "Notes"):
#   echo /.gl/ >>.git/info/exclude; echo /.whl/ >>.git/info/exclude
#   mkdir -p .gl /tmp/amd64/partial; o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
#   apt-get $o update; (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     wgpu==0.32.0 cffi==2.1.1 pycparser==3.12 rendercanvas==2.7.2 gguf==0.19.0
#   python benchmarks/vulkan_model_spec.py        # refreshes benchmarks/vulkan_models.json (tracked)
#
# Then, through the device tool, decode and prefill of both models (random weights, the real shapes and
# tensor types), fused and unfused, against PyTorch eager bf16, in one run of about 3-5 minutes (the
# conformance cases after the models stop at --deadline-s; the whole run is cut at VULKAN_H200_TIMEOUT):
#   run(command='bash benchmarks/vulkan_h200.sh --skip-matvec --skip-matmul --unfuse-variants ";attn,combine,norm,add,glu" --deadline-s 200',
#       carry=[".gl", ".whl"], kind="nvidia-h200", timeout_s=600)
# With no options it measures everything (the copy, each matrix-vector kernel, the tiled product, both
# models). It prints the figures, a SUMMARY table, and leaves $OUT/vulkan_h200.json (written after each
# stage) and $OUT/vulkan_h200.log.
#
# A dry run here, on lavapipe (nothing unpacked or installed; a GPU's kernels forced, no PyTorch):
#   VULKAN_H200_LOCAL=1 PYTHON=.venv/bin/python OUT=/tmp/vk_out bash benchmarks/vulkan_h200.sh \
#     --allow-cpu-adapter --gpu-kernels --skip-torch --skip-matvec --skip-matmul --conformance decode \
#     --prompt 8 --decode 2 --runs 1 --unfuse-variants ";attn,combine,norm,add,glu"
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/vulkan_h200}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
if [ "${VULKAN_H200_LOCAL:-0}" != 1 ]; then
    # the Vulkan loader (Debian's libvulkan1 and friends), unpacked as the device tool's README says
    shopt -s nullglob
    debs=(.gl/*.deb)
    [ ${#debs[@]} -gt 0 ] || { echo "no .gl/*.deb: carry .gl (see this script's header)" >&2; exit 2; }
    for f in "${debs[@]}"; do dpkg -x "$f" /; done
    ldconfig
    # only the wheels this benchmark needs: the others in .whl must not shadow the image's packages
    wheels=()
    for name in wgpu cffi pycparser rendercanvas gguf; do
        w=(.whl/"$name"-*.whl)
        [ ${#w[@]} -eq 1 ] || { echo "expected one .whl/$name-*.whl, found ${#w[@]}: carry .whl" >&2; exit 2; }
        wheels+=("${w[0]}")
    done
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "${wheels[@]}"
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
    ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    if [ -f "$ICD" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES="$ICD"; fi
    export FRAMEWORK_CACHE=/tmp/fwcache
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
{
    echo "loader: $(ldconfig -p | grep -m1 libvulkan.so.1 || echo 'libvulkan.so.1 missing')"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
    "$PY" -c 'import sys, numpy, gguf, wgpu; print("python", sys.version.split()[0], "numpy", numpy.__version__,
                 "wgpu", wgpu.__version__)'
} 2>&1 | tee "$OUT/vulkan_h200.log"
set +e
timeout -k 10 "${VULKAN_H200_TIMEOUT:-450}" "$PY" benchmarks/vulkan_bench.py --out "$OUT" "$@" 2>&1 \
    | tee -a "$OUT/vulkan_h200.log"
rc=${PIPESTATUS[0]}
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "vulkan_h200.sh: stopped after ${VULKAN_H200_TIMEOUT:-450} s; $OUT/vulkan_h200.json holds what was measured"
    [ -f "$OUT/vulkan_h200.json" ] && "$PY" benchmarks/vulkan_bench.py --summary-of "$OUT/vulkan_h200.json"
fi 2>&1 | tee -a "$OUT/vulkan_h200.log"
exit "$rc"
