#!/usr/bin/env bash
# `measure dynquant` on the nvidia-h200 machine's CPU (AMX, AVX-512 BF16 and VNNI), through the device tool.
#
# Here, once, in the repo's root: the wheels the machine cannot download, in an ignored folder
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 -d .fwcache/wheels openvino==2026.4.1 gguf==0.19.0
# Then: run(command="bash benchmarks/openvino_dynquant_h200.sh", carry=[".fwcache/wheels"], kind="nvidia-h200").
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .fwcache/wheels/*.whl
export PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export FRAMEWORK_CACHE=/tmp/fwcache FRAMEWORK_OPENVINO_CACHE_DIR=off
lscpu | grep -E 'Model name|^CPU\(s\)'
python3 benchmarks/openvino_dynquant.py "$@"
