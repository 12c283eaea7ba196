#!/usr/bin/env bash
# llama.cpp's intermediate tensors of one step on the CPU backend, for benchmarks/q8_vs_ggml_ops.py to
# compare op by op with the cpu plugin's nodes. Uses the llama.cpp build of benchmarks/build_llama_tools.sh
# (llama-cpp-python 0.3.36's vendored llama.cpp, the instruction sets of /proc/cpuinfo, AMX off) and adds
# two things to it when missing: llama.cpp's own llama-eval-callback (its one target, built in that
# folder), whose printout (name, op, shape, a few values, the sum of every tensor) goes to
# OUTDIR/eval-callback.txt, and benchmarks/ggml_dump.cpp, which writes every tensor whole in float32
# (OUTDIR/index.tsv, OUTDIR/N.f32) and the prompt's token ids (OUTDIR/tokens.txt).
#   usage: [PREFILL=N] [FLASH_ATTN=on|off|auto] benchmarks/ggml_intermediates.sh MODEL.gguf PROMPT OUTDIR [THREADS]
# PREFILL=N: the first N tokens in one prefill, the others a decode step each, the last step written.
# FLASH_ATTN=on|off|auto: llama.cpp's attention (default auto, its tools' default: on for the CPU;
# llama-cpp-python's Llama, which made tests/reference, defaults to off).
set -euo pipefail
MODEL=$1 PROMPT=$2 OUT=$3 THREADS=${4:-2} PREFILL=${PREFILL:-0} FLASH_ATTN=${FLASH_ATTN:-auto}
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
ROOT=${LLAMA_TOOLS_DIR:-$HOME/.cache/framework/llama.cpp}
SRC=$ROOT/llama_cpp_python-$VERSION/vendor/llama.cpp
BUILD=$ROOT/build-$VERSION
HERE=$(cd "$(dirname "$0")" && pwd)

if [ ! -f "$BUILD/build.ninja" ]; then
  echo "no llama.cpp build in $BUILD: run benchmarks/build_llama_tools.sh first" >&2; exit 1
fi
if [ ! -x "$BUILD/bin/llama-eval-callback" ]; then
  # -j2: the machines these benchmarks run on have two cores.
  cmake --build "$BUILD" -j2 --target llama-eval-callback
fi
DUMP=$BUILD/bin/ggml_dump
if [ ! -x "$DUMP" ] || [ "$HERE/ggml_dump.cpp" -nt "$DUMP" ]; then
  "${CXX:-g++}" -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" "$HERE/ggml_dump.cpp" -o "$DUMP" \
    -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD/bin"
fi

mkdir -p "$OUT"
# llama-eval-callback prints the prompt's prefill (its printout is checked against a prefill's dump)
"$BUILD/bin/llama-eval-callback" -m "$MODEL" -p "$PROMPT" -t "$THREADS" -c 512 -fa "$FLASH_ATTN" \
  > "$OUT/eval-callback.txt" 2> "$OUT/eval-callback.err" \
  || { echo "llama-eval-callback failed: its messages are in $OUT/eval-callback.err" >&2; exit 1; }
"$DUMP" "$MODEL" "$PROMPT" "$OUT" "$THREADS" "$PREFILL" "$FLASH_ATTN" 2> "$OUT/ggml_dump.err" \
  || { echo "ggml_dump failed: its messages are in $OUT/ggml_dump.err" >&2; exit 1; }
echo "llama-eval-callback's printout: $OUT/eval-callback.txt; every tensor whole: $OUT/index.tsv"
