#!/usr/bin/env bash
# llama.cpp's own CUDA backend on the lent GPU machine (nvidia-h100-x1 or nvidia-h200), beside the framework's
# cuda:0, vulkan:0 and opencl:0, taking turns in one machine's session: llama-bench built there from
# llama-cpp-python's source distribution (benchmarks/llama_source_pack.sh cuda .llamacu), on random-weight GGUF files of the
# three models' shapes and tensor types (benchmarks/vulkan_models.json: SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M,
# Qwen2.5-Coder 1.5B Q4_K_M, with a placeholder vocabulary: benchmarks/llama_vulkan_models.py), and the same
# files given to benchmarks/cuda_bench.py.
#
# Here, once, in the repo's root: the carried Vulkan loaders and wheels (benchmarks/vulkan_h200.sh's header)
# and `bash benchmarks/llama_source_pack.sh cuda .llamacu` (.llamacu/, 2 MB). Then, through the device tool:
#   run(command='bash benchmarks/llama_cuda_h100.sh build', carry=[".gl", ".whl", ".llamacu"], timeout_s=600)
#   run(command='bash benchmarks/llama_cuda_h100.sh bench', carry=[".gl", ".whl", ".llamacu"], timeout_s=600)
# The build (nvcc, one architecture: the GPU's, about 100 CUDA files) may take more than one call: `build` is
# cut at LLAMACU_BUILD_TIMEOUT (default 540 s) and a second `build` within the machine's idle window (30 s)
# goes on where the first stopped (the build and the model files stay in /tmp/llamacu while it is warm).
# `bench` runs LLAMACU_ROUNDS rounds (default 2), each llama-bench on the three files (-ngl 99 -p 256 -n 128
# -r LLAMACU_REPS, default 5), then cuda_bench.py on the same files (cuda:0, vulkan:0 and opencl:0, --runs
# LLAMACU_REPS; the first round also checks cuda:0's logits against the CPU plugin), and ends with a SUMMARY.
# Everything goes to $OUT/llama_cuda.log; llama-bench's records to $OUT/llama_cuda_<model>_<round>.json.
# LLAMACU_LOCAL=1 LLAMACU_STOP_AFTER=configure is a dry run here (CMake configures against this machine's nvcc).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/llama_cuda}"
mkdir -p "$OUT"
PHASE="${1:-build}"
LOG="$OUT/llama_cuda_$PHASE.log"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
ROOT=/tmp/llamacu
SRC="$ROOT/src/llama.cpp"
BUILD="$ROOT/build"
MODELS="$ROOT/models"
WORK="$ROOT/work"             # cuda_bench.py's --work: links to the same files
MODEL_NAMES="${LLAMACU_MODELS:-smollm2,gemma3,qwen25-coder-1.5b}"
REPS="${LLAMACU_REPS:-5}"
T0=$(date +%s)
stage() { echo; echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
die() { echo "llama_cuda_h100.sh: $*" >&2; exit 1; }

setup() {
    [ -f .llamacu/llama.cpp-cuda.tar.xz ] || die "no .llamacu/llama.cpp-cuda.tar.xz: run benchmarks/llama_source_pack.sh cuda .llamacu here and carry .llamacu"
    if [ "${LLAMACU_LOCAL:-0}" != 1 ]; then
        source benchmarks/gpu_machine_setup.sh || die "the GPU machine's set-up failed (above)"
    fi
    export PYTHONUNBUFFERED=1
    local lib
    lib="$(cublas_dir)"
    if [ -n "$lib" ]; then export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
}

cublas_dir() {    # where libcublas lies when the CUDA toolkit beside nvcc has none (pip's nvidia-cublas)
    local tk
    tk="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
    if ls "$tk"/lib64/libcublas.so* "$tk"/targets/*/lib/libcublas.so* >/dev/null 2>&1; then return 0; fi
    local roots="${LLAMACU_CUBLAS_SEARCH:-$("$PY" -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)}"
    # shellcheck disable=SC2086
    find $roots -path '*nvidia*' -name 'libcublas.so*' 2>/dev/null | head -1 | xargs -r dirname
}

cublas_args() {   # the cmake arguments that name pip's cuBLAS, or none where the toolkit has it
    local lib inc
    lib="$(cublas_dir)"
    [ -n "$lib" ] || return 0
    inc="$(dirname "$lib")/include"
    echo "cuBLAS from $lib (the toolkit beside nvcc has none), headers $inc" >&2
    [ -f "$inc/cublas_v2.h" ] || echo "no cublas_v2.h in $inc" >&2
    echo "-DCUDA_cublas_LIBRARY=$(ls "$lib"/libcublas.so* | head -1) -DCUDA_cublasLt_LIBRARY=$(ls "$lib"/libcublasLt.so* | head -1)"
    echo "-DCMAKE_CUDA_FLAGS=-I$inc -DCMAKE_CXX_FLAGS=-I$inc"
}

build() {
    stage "machine"
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 || true
    nvcc --version | tail -2
    echo "cmake $(cmake --version | head -1 | awk '{print $3}'), ninja $(ninja --version 2>/dev/null || echo missing); $(nproc) cores, -j$JOBS"
    if [ ! -f "$BUILD/build.ninja" ]; then
        stage "llama.cpp from llama-cpp-python $(cat .llamacu/llama-cpp-python.version)'s source distribution"
        rm -rf "$ROOT/src" && mkdir -p "$ROOT/src" "$BUILD"
        tar -xJf .llamacu/llama.cpp-cuda.tar.xz -C "$ROOT/src" || die "could not unpack .llamacu/llama.cpp-cuda.tar.xz"
        arch="${LLAMACU_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d .)}"
        cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="${arch:-90}" \
            -DGGML_CUDA=ON -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
            -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON \
            -DLLAMA_BUILD_COMMON=ON -DBUILD_SHARED_LIBS=OFF $(cublas_args | tr '\n' ' ') || die "cmake could not configure llama.cpp (above)"
    else
        stage "going on with the build in $BUILD"
    fi
    [ "${LLAMACU_STOP_AFTER:-}" = configure ] && exit 0
    if [ ! -s "$MODELS/qwen25-coder-1.5b-random-vocab.gguf" ]; then      # written while the build runs
        (cd benchmarks && "$PY" llama_vulkan_models.py "$MODELS" --models "$MODEL_NAMES") >"$MODELS.log" 2>&1 &
    fi
    stage "building llama-bench (-j$JOBS; cut at ${LLAMACU_BUILD_TIMEOUT:-540} s)"
    tb=$(date +%s)
    timeout -k 5 "${LLAMACU_BUILD_TIMEOUT:-540}" cmake --build "$BUILD" --target llama-bench -j "$JOBS" \
        >"$OUT/llama_cuda_build.log" 2>&1
    rc=$?
    tail -n 5 "$OUT/llama_cuda_build.log"
    wait
    cat "$MODELS.log" 2>/dev/null
    if [ "$rc" -eq 124 ]; then echo "BUILD CUT at the limit after $(( $(date +%s) - tb )) s: run build again"; exit 3; fi
    [ "$rc" -eq 0 ] || { grep -m 20 -iE "error|FAILED" "$OUT/llama_cuda_build.log"; die "the build failed (rc $rc)"; }
    echo "BUILT in $(( $(date +%s) - tb )) s: $(ls -l "$BUILD/bin/llama-bench")"
}

llama_round() {   # ROUND
    for name in ${MODEL_NAMES//,/ }; do
        stage "llama-bench $name: -ngl 99 -p 256 -n 128 -r $REPS (CUDA), round $1"
        timeout -k 5 150 "$BUILD/bin/llama-bench" -m "$MODELS/$name-random-vocab.gguf" -ngl 99 -p 256 -n 128 \
            -r "$REPS" -o json >"$OUT/llama_cuda_${name}_$1.json" 2>"$OUT/llama_cuda_${name}_$1.stderr"
        echo "rc $?"
        grep -m 3 -E "CUDA|error" "$OUT/llama_cuda_${name}_$1.stderr"
        "$PY" - "$OUT/llama_cuda_${name}_$1.json" <<'PYEOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    kind = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    print(f"  {kind}: {r['avg_ts']:.1f} tok/s (sd {r['stddev_ts']:.1f}; {r['backends']} on {r.get('gpu_info', '?')}, "
          f"flash_attn {r.get('flash_attn')}, type {r['model_type']}); each run: {[round(x) for x in r.get('samples_ts', [])]}")
PYEOF
    done
}

ours_round() {    # ROUND
    stage "cuda_bench.py on the same files, round $1"
    mkdir -p "$WORK"
    for name in ${MODEL_NAMES//,/ }; do ln -sf "$MODELS/$name-random-vocab.gguf" "$WORK/$name-random.gguf"; done
    mkdir -p "$OUT/ours_$1"
    check=(--skip-check)
    [ "$1" = 1 ] && check=()
    timeout -k 10 "${LLAMACU_OURS_TIMEOUT:-240}" "$PY" benchmarks/cuda_bench.py --skip-conformance --keep-models \
        --work "$WORK" --models "$MODEL_NAMES" --devices cuda,vulkan,opencl --runs "$REPS" "${check[@]}" \
        --out "$OUT/ours_$1" 2>&1 | grep -v -E "CompilerWarning|lambda: self._prg.build"
}

summary() {
    stage "SUMMARY (tok/s: llama-bench the mean of $REPS runs; ours the median)"
    "$PY" - "$OUT" "$MODEL_NAMES" <<'PYEOF'
import json, sys
from pathlib import Path
out, names = Path(sys.argv[1]), sys.argv[2].split(",")
print(f"{'round':5} {'model':18} {'llama CUDA pp256':>16} {'tg128':>7} {'cuda:0 pp':>10} {'tg':>7} {'pp x':>6} {'tg x':>6}"
      f" {'vulkan:0 pp':>11} {'tg':>6} {'opencl:0 pp':>11} {'tg':>6}")
for rnd in (1, 2, 3):
    ours_p = out / f"ours_{rnd}" / "cuda_bench.json"
    ours = json.loads(ours_p.read_text()).get("models", {}) if ours_p.exists() else {}
    for name in names:
        p = out / f"llama_cuda_{name}_{rnd}.json"
        if not p.exists():
            continue
        rows = json.loads(p.read_text()) if p.stat().st_size else []
        pp = next((r["avg_ts"] for r in rows if r["n_prompt"]), None)
        tg = next((r["avg_ts"] for r in rows if r["n_gen"]), None)
        m = ours.get(name, {})
        get = lambda k, f: (m.get(k) or {}).get(f)
        cp, cd = get("cuda", "prefill_tok_s"), get("cuda", "decode_tok_s")
        f = lambda x: f"{x:.0f}" if x else "-"
        x = lambda a, b: f"{a / b:.2f}" if a and b else "-"
        print(f"{rnd:5} {name:18} {f(pp):>16} {f(tg):>7} {f(cp):>10} {f(cd):>7} {x(cp, pp):>6} {x(cd, tg):>6}"
              f" {f(get('vulkan', 'prefill_tok_s')):>11} {f(get('vulkan', 'decode_tok_s')):>6}"
              f" {f(get('opencl', 'prefill_tok_s')):>11} {f(get('opencl', 'decode_tok_s')):>6}")
PYEOF
}

main() {
    setup
    case "$PHASE" in
        build) build ;;
        bench)
            [ -x "$BUILD/bin/llama-bench" ] || die "no $BUILD/bin/llama-bench: run build first (the machine was given back?)"
            stage "llama-bench's devices"; "$BUILD/bin/llama-bench" --list-devices 2>&1 | tail -3
            for r in $(seq 1 "${LLAMACU_ROUNDS:-2}"); do llama_round "$r"; ours_round "$r"; done
            summary ;;
        *) die "phase $PHASE: build or bench" ;;
    esac
    echo "total $(( $(date +%s) - T0 )) s"
}
main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
