#!/usr/bin/env bash
# Build llama-cpp-python for this CPU without AMX (AMX instructions trap in these VMs) and
# without instruction sets the CPU lacks: GGML_NATIVE is off, so each set is chosen from
# /proc/cpuinfo. A benchmark dependency only; tests never need it.
set -euo pipefail
PY=${1:-.venv/bin/python}
if "$PY" -c "import llama_cpp" 2>/dev/null; then exit 0; fi
flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
on() { if grep -qw "$1" <<<"$flags"; then echo ON; else echo OFF; fi; }
args="-DGGML_NATIVE=OFF -DGGML_AVX=$(on avx) -DGGML_AVX2=$(on avx2) -DGGML_FMA=$(on fma) -DGGML_F16C=$(on f16c)"
args+=" -DGGML_AVX512=$(on avx512f) -DGGML_AVX512_VNNI=$(on avx512_vnni) -DGGML_AVX512_BF16=$(on avx512_bf16)"
args+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
echo "building llama-cpp-python with: $args"
CMAKE_ARGS="$args" "$PY" -m pip install --no-cache-dir --force-reinstall --no-deps 'llama-cpp-python>=0.3.16'
"$PY" -m pip install -q 'diskcache>=5.6' 'typing-extensions>=4.5'
