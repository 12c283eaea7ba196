#!/usr/bin/env bash
# Sourced, not run, by the GPU machine's scripts (cuda_h100.sh, llama_cuda_h100.sh, opencl_h200.sh,
# speculative_h200.sh), in the repo's root: the carried Vulkan loader and GL libraries (.gl), the carried wheels
# (.whl, for Python 3.12) in /tmp/site, the NVIDIA Vulkan and OpenCL drivers named where the image leaves them
# unnamed. Wheels already installed from the same .whl are not installed again, so two scripts may run side by
# side once one of them has set up (a second `pip install --upgrade` would replace packages under the first).
# $PY (default python3) is the interpreter.
GPU_PY="${PY:-python3}"
for f in .gl/*.deb; do if [ -e "$f" ]; then dpkg -x "$f" /; fi; done
ldconfig
gpu_whl_stamp="$(ls -l .whl 2>/dev/null | sha1sum | cut -c1-16)"
if [ "$(cat /tmp/site/.whl-stamp 2>/dev/null)" != "$gpu_whl_stamp" ]; then
    "$GPU_PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_machine_setup.sh: could not install .whl/*.whl into /tmp/site (above)" >&2; return 1; }
    echo "$gpu_whl_stamp" >/tmp/site/.whl-stamp
fi
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
gpu_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -f "$gpu_icd" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES="$gpu_icd"; fi
# NVIDIA's OpenCL platform needs an ICD file naming its library (on the loader path there)
gpu_has_nvidia='import sys, pyopencl as cl; sys.exit(0 if any("NVIDIA" in p.name for p in cl.get_platforms()) else 1)'
if ! "$GPU_PY" -c "$gpu_has_nvidia" 2>/dev/null; then
    mkdir -p /etc/OpenCL/vendors && echo libnvidia-opencl.so.1 >/etc/OpenCL/vendors/nvidia.icd
    echo "wrote /etc/OpenCL/vendors/nvidia.icd"
fi
