#!/usr/bin/env bash
# Build llama.cpp's own CPU tools (llama-server, llama-speculative, llama-lookup, llama-bench,
# llama-completion) from the llama.cpp that llama-cpp-python's source distribution carries under
# vendor/llama.cpp, so benchmarks/serve_load.py --llama-server and
# benchmarks/llama_speculative_bench.py compare us with the same llama.cpp install_llama_cpp.sh uses.
# Flags as install_llama_cpp.sh: GGML_NATIVE off, each instruction set chosen from /proc/cpuinfo,
# AMX off (AMX instructions trap in these VMs); no CUDA, no Vulkan. A benchmark dependency only;
# tests never need it. Idempotent: a second run prints where the tools are and builds nothing.
#   usage: benchmarks/build_llama_tools.sh [python]   (python runs pip download; default .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
ROOT=${LLAMA_TOOLS_DIR:-$HOME/.cache/framework/llama.cpp}
SRC=$ROOT/llama_cpp_python-$VERSION/vendor/llama.cpp
BUILD=$ROOT/build-$VERSION
TOOLS="llama-server llama-speculative llama-lookup llama-bench llama-completion"

built() { for t in $TOOLS; do [ -x "$BUILD/bin/$t" ] || return 1; done; }
if built; then echo "llama.cpp tools (llama-cpp-python $VERSION) already built in $BUILD/bin"; exit 0; fi

mkdir -p "$ROOT"
sdist=$ROOT/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$sdist" ]; then
  "$PY" -m pip download --no-binary :all: --no-deps "llama-cpp-python==$VERSION" -d "$ROOT"
fi
# A marker, not CMakeLists.txt, says the whole tree was unpacked (an interrupted tar leaves a part).
if [ ! -f "$ROOT/.unpacked-$VERSION" ]; then
  rm -rf "$ROOT/llama_cpp_python-$VERSION" && tar xzf "$sdist" -C "$ROOT" && touch "$ROOT/.unpacked-$VERSION"
fi

flags=$(grep -m1 '^flags' /proc/cpuinfo || true)
on() { if grep -qw "$1" <<<"$flags"; then echo ON; else echo OFF; fi; }
args=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF
  "-DGGML_AVX=$(on avx)" "-DGGML_AVX2=$(on avx2)" "-DGGML_FMA=$(on fma)" "-DGGML_F16C=$(on f16c)"
  "-DGGML_AVX512=$(on avx512f)" "-DGGML_AVX512_VNNI=$(on avx512_vnni)"
  "-DGGML_AVX512_BF16=$(on avx512_bf16)"
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
  -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_OPENCL=OFF
  # The tools run offline: no prebuilt web UI fetched at build time, no HTTPS, no tests.
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF
  -DLLAMA_BUILD_TESTS=OFF)
echo "building llama.cpp tools with: ${args[*]}"
cmake -S "$SRC" -B "$BUILD" -G Ninja "${args[@]}"
# -j2: the machines these benchmarks run on have two cores.
# shellcheck disable=SC2086
cmake --build "$BUILD" -j2 --target $TOOLS
built || { echo "llama.cpp build in $BUILD did not produce all of: $TOOLS" >&2; exit 1; }
echo "llama.cpp tools (llama-cpp-python $VERSION) built in $BUILD/bin: $TOOLS"
