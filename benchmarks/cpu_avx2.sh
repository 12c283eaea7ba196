#!/usr/bin/env bash
# The cpu plugin against llama.cpp with both built for the AVX2-only CPU class (no AVX-512, no VNNI, no
# AMX), on whatever x86 machine runs it: an AVX2 *build* on this machine, not an AVX2-only CPU (an AVX-512
# CPU's caches, memory and clocks stay its own).
#
#   bash benchmarks/cpu_avx2.sh build SRC OUT     llama.cpp's libraries for AVX2 into OUT/lib, from SRC
#                                                 (a llama.cpp source tree, e.g. llama-cpp-python's sdist's
#                                                 vendor/llama.cpp); one job, niced (4 minutes here)
#   bash benchmarks/cpu_avx2.sh bench OUT/lib [framework bench options]
#                                                 `framework bench` with numba compiling for Haswell with
#                                                 AVX-512 switched off and llama.cpp loading OUT/lib (its
#                                                 Python binding, llama_cpp, must be importable: PYTHONPATH)
#
# Both sides print what they were built for before the run: numba's target and product instructions
# (expect ['haswell', 'avx2']) and llama.cpp's system info (expect AVX2 = 1, AVX512 = 0).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
PY=${PY:-$here/.venv/bin/python}
# the host's features as numba reads them, AVX-512, AMX and AVX-VNNI switched off (as tests/test_cpu_quantized.py)
avx2_features() {
    "$PY" - <<'EOF2'
from llvmlite import binding
f = binding.get_host_cpu_features()
print(",".join(("-" if k.startswith(("avx512", "amx", "avxvnni")) or not v else "+") + k for k, v in f.items()))
EOF2
}
cmd=${1:?usage: cpu_avx2.sh build SRC OUT | bench LIB [framework bench options]}
shift
case "$cmd" in
build)
    src=${1:?llama.cpp source tree}; out=${2:?output folder}
    args="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
    args+=" -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF"
    args+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_CPU_ALL_VARIANTS=OFF -DGGML_BACKEND_DL=OFF"
    args+=" -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF"
    args+=" -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DCMAKE_BUILD_TYPE=Release"
    # shellcheck disable=SC2086
    nice -n 10 cmake -S "$src" -B "$out/build" $args
    CMAKE_BUILD_PARALLEL_LEVEL=1 nice -n 10 cmake --build "$out/build" --target llama -j 1
    mkdir -p "$out/lib"
    find "$out/build" -name '*.so*' -exec cp -a {} "$out/lib/" \;
    ls "$out/lib"
    ;;
bench)
    lib=${1:?the folder of llama.cpp libraries built for AVX2}; shift
    features=$(avx2_features)
    export NUMBA_CPU_NAME=haswell NUMBA_CPU_FEATURES=$features LLAMA_CPP_LIB_PATH=$lib
    "$PY" -c 'from framework.plugins.cpu.quantized import target; print("numba compiles for", list(target()))'
    "$PY" -c 'import llama_cpp; print("llama.cpp:", llama_cpp.llama_print_system_info().decode())'
    "$PY" -m framework bench --backends cpu "$@"
    ;;
*)
    echo "cpu_avx2.sh: unknown command '$cmd' (build or bench)" >&2
    exit 2
    ;;
esac
