#!/usr/bin/env bash
# benchmarks/two_gpu.py on a machine with two GPUs (the device tool's nvidia-h100-x2 or nvidia-h200-x2):
# the Qwen2.5-Coder 1.5B shape (random weights, the real tensor types) on vulkan:0 alone, split by layers
# across vulkan:0 and vulkan:1, and llama.cpp Vulkan's -sm none and -sm layer on the same file, in one call.
#
# Here, once, in the repo's root: .gl and .whl as benchmarks/vulkan_h200.sh's header says, and .llamavk
# as benchmarks/llama_vulkan_pack.sh's header says. Then, through the device tool:
#   run(command='bash benchmarks/two_gpu.sh', carry=[".gl", ".whl", ".llamavk"], kind="nvidia-h100-x2",
#       timeout_s=600)
# PLUGIN=cuda measures cuda:0 and cuda:1 instead of Vulkan's devices, once that plugin exists.
# It leaves $OUT/two_gpu.log and $OUT/two_gpu.json.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/two_gpu}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
BUILD="${LLAMAVK_BUILD:-/tmp/llamavk/build}"
{
    nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total --format=csv,noheader
    # llama-bench built from the carried llama.cpp source (unpacks the carried Vulkan loader over / first)
    LLAMAVK_STOP_AFTER=build OUT="$OUT" bash benchmarks/llama_vulkan_h200.sh >"$OUT/llama_build_stage.log" 2>&1 \
        || echo "llama-bench not built (see llama_build_stage.log): llama.cpp's split is not measured"
    wheels=()
    for name in wgpu cffi pycparser rendercanvas gguf; do wheels+=(.whl/"$name"-*.whl); done
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        "${wheels[@]}" || exit 2
    export PYTHONPATH="/tmp/site:$PWD" FRAMEWORK_CACHE=/tmp/fwcache PYTHONUNBUFFERED=1
    ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    if [ -f "$ICD" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES="$ICD"; fi
    "$PY" -m framework backends
    bench=()
    [ -x "$BUILD/bin/llama-bench" ] && bench=(--llama-bench "$BUILD/bin/llama-bench")
    OUT="$OUT" "$PY" benchmarks/two_gpu.py --plugin "${PLUGIN:-vulkan}" "${bench[@]}" "$@"
} 2>&1 | tee "$OUT/two_gpu.log"
