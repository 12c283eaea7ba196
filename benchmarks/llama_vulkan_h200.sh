#!/usr/bin/env bash
# llama.cpp's own Vulkan backend on the nvidia-h200 machine, next to the framework's vulkan:0, in one run:
# llama-bench built there from llama-cpp-python's source distribution (vendor/llama.cpp), on random-weight
# GGUF files of the two models' shapes and tensor types (benchmarks/vulkan_models.json: SmolLM2-135M Q4_1
# and Gemma 3 270M Q4_K_M), then benchmarks/vulkan_h200.sh's vulkan:0 figures on files of the same spec.
#
# Here, once, in the repo's root: the carried Vulkan loaders and wheels (benchmarks/vulkan_h200.sh's header),
# then what the build needs (benchmarks/llama_vulkan_pack.sh's header says what and why; about 10 MB):
#   bash benchmarks/llama_vulkan_pack.sh
# Then, through the device tool (about 3 minutes of a warm machine: the build took 109 s, then llama-bench,
# then vulkan:0):
#   run(command='bash benchmarks/llama_vulkan_h200.sh', carry=[".gl", ".whl", ".llamavk"], kind="nvidia-h200",
#       timeout_s=400)
# (The tool sends the checkout it was started in: from another git worktree of this repo, copy that
# worktree's files with .gl, .whl and .llamavk into an ignored folder of that checkout, carry the folder,
# and begin the command with a cd into it.) Within 30 s of a call the machine is still warm and keeps
# the build and the model files: LLAMAVK_REUSE=1 measures again without building (LLAMAVK_REPS sets
# llama-bench's -r, default 5; LLAMAVK_VK_RUNS vulkan_bench.py's --runs, default the same).
# It leaves $OUT/llama_vulkan_h200.log (everything), $OUT/llama_build.log, $OUT/llama_bench_<model>.json
# (llama-bench's own records) and .stderr, $OUT/vulkan_h200.json and .log (vulkan:0's), and ends with a
# SUMMARY table of both. LLAMAVK_STOP_AFTER=configure|build stops early; LLAMAVK_LOCAL=1 is a dry run
# here (nothing unpacked over /; with LLAMAVK_ROOT=/tmp/llamavk-opt LLAMAVK_STOP_AFTER=configure it
# checks that CMake configures, glslc through trixie's loader, in about 15 s).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/llama_vulkan_h200}"
mkdir -p "$OUT"
LOG="$OUT/llama_vulkan_h200.log"
PY="${PYTHON:-python3}"
JOBS="${JOBS:-$(nproc)}"
VK="${LLAMAVK_ROOT:-/opt/llamavk}"          # Debian sid's Vulkan headers, loader, SPIR-V headers, glslc
RT="$VK/rt"                                  # trixie's C and C++ runtime: glslc through its own loader
SRC="${LLAMAVK_SRC:-/tmp/llamavk/src}"
BUILD="${LLAMAVK_BUILD:-/tmp/llamavk/build}"
MODELS_DIR="${LLAMAVK_MODELS:-/tmp/llamavk/models}"
PROMPT="${LLAMAVK_PROMPT:-256}"
DECODE="${LLAMAVK_DECODE:-128}"
REPS="${LLAMAVK_REPS:-5}"                  # llama-bench -r
VK_RUNS="${LLAMAVK_VK_RUNS:-$REPS}"         # vulkan_bench.py --runs
STOP_AFTER="${LLAMAVK_STOP_AFTER:-}"
T0=$(date +%s)
stage() { echo; echo "=== [$(( $(date +%s) - T0 )) s] $*"; }
die() { echo "llama_vulkan_h200.sh: $*" >&2; exit 1; }

main() {
stage "machine"
grep -m1 PRETTY_NAME /etc/os-release || true
ldd --version | head -1
gcc --version | head -1
cmake --version | head -1
echo "ninja $(ninja --version 2>/dev/null || echo missing); $(nproc) cores; building with -j$JOBS"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true

[ -f .llamavk/llama.cpp-vulkan.tar.xz ] || die "no .llamavk/llama.cpp-vulkan.tar.xz: run benchmarks/llama_vulkan_pack.sh here and carry .llamavk"
if [ "${LLAMAVK_LOCAL:-0}" != 1 ]; then
    # the loaders that vulkan:0 (wgpu) uses, over / as the device tool's README says
    shopt -s nullglob
    debs=(.gl/*.deb)
    [ ${#debs[@]} -gt 0 ] || die "no .gl/*.deb: carry .gl (see benchmarks/vulkan_h200.sh's header)"
    for f in "${debs[@]}"; do dpkg -x "$f" /; done
    ldconfig
    shopt -u nullglob
    ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    if [ -f "$ICD" ] && [ -z "${VK_DRIVER_FILES:-}" ]; then export VK_DRIVER_FILES="$ICD"; fi
fi

stage "Debian's Vulkan 1.4 headers, loader and glslc (.llamavk/debs), unpacked under $VK (not over /)"
mkdir -p "$VK" "$RT"
for f in .llamavk/debs/*.deb; do
    case "$(basename "$f")" in
        libc6_*|libstdc++6_*|libgcc-s1_*) dpkg -x "$f" "$RT" ;;
        *) dpkg -x "$f" "$VK" ;;
    esac
done
VKLIB="$VK/usr/lib/x86_64-linux-gnu"
RTLIB="$RT/usr/lib/x86_64-linux-gnu"
# glslc runs as it is where the C library is 2.38 or newer, else through trixie's own dynamic loader
if LD_LIBRARY_PATH="$VKLIB" "$VK/usr/bin/glslc" --version >/dev/null 2>&1; then
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$VKLIB" "$VK/usr/bin/glslc" >"$VK/glslc"
    NATIVE_GLSLC=1
else
    echo "the carried glslc does not load on this C library; running it through trixie's ld.so"
    LD_LIBRARY_PATH="$VKLIB" "$VK/usr/bin/glslc" --version 2>&1 | head -2
    printf '#!/bin/sh\nexec %s --library-path %s:%s %s "$@"\n' "$RTLIB/ld-linux-x86-64.so.2" "$RTLIB" "$VKLIB" \
        "$VK/usr/bin/glslc" >"$VK/glslc"
    NATIVE_GLSLC=0
fi
chmod +x "$VK/glslc"
"$VK/glslc" --version || die "glslc does not run, neither as it is nor through trixie's loader"
# llama-bench loads the carried loader (1.4.363) where it runs, else the system's
if [ "$NATIVE_GLSLC" = 1 ]; then RUN_LD="$VKLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; else RUN_LD="${LD_LIBRARY_PATH:-}"; fi

if [ "${LLAMAVK_REUSE:-0}" = 1 ] && [ -x "$BUILD/bin/llama-bench" ] && [ -s "$MODELS_DIR/gemma3-random-vocab.gguf" ]; then
    stage "reusing $BUILD/bin/llama-bench and $MODELS_DIR (LLAMAVK_REUSE=1: a warm machine keeps them)"
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
else
    stage "llama.cpp from llama-cpp-python $(cat .llamavk/llama-cpp-python.version 2>/dev/null)'s source distribution"
    rm -rf "$SRC" && mkdir -p "$SRC"
    tar -xJf .llamavk/llama.cpp-vulkan.tar.xz -C "$SRC" || die "could not unpack .llamavk/llama.cpp-vulkan.tar.xz"
    SRC="$SRC/llama.cpp"
    mkdir -p "$BUILD" "$MODELS_DIR"
    cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
        -DGGML_VULKAN=ON -DGGML_CUDA=OFF -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_COMMON=ON -DBUILD_SHARED_LIBS=OFF \
        -DCMAKE_PREFIX_PATH="$VK/usr" -DVulkan_INCLUDE_DIR="$VK/usr/include" -DVulkan_LIBRARY="$VKLIB/libvulkan.so" \
        -DVulkan_GLSLC_EXECUTABLE="$VK/glslc" || die "cmake could not configure llama.cpp (above)"
    [ "$STOP_AFTER" = configure ] && exit 0

    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
    if [ "${LLAMAVK_LOCAL:-0}" != 1 ]; then
        w=(.whl/gguf-*.whl)
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/llamavk/site \
            "${w[0]}" || die "could not install ${w[0]}"
        export PYTHONPATH="/tmp/llamavk/site:$PYTHONPATH"
    fi
    # the random-weight files are written while the build runs (one core of the machine's)
    (cd benchmarks && "$PY" llama_vulkan_models.py "$MODELS_DIR") >"$MODELS_DIR.log" 2>&1 &
    models_pid=$!

    stage "building llama-bench (-j$JOBS; cut at ${LLAMAVK_BUILD_TIMEOUT:-270} s)"
    tb=$(date +%s)
    timeout -k 5 "${LLAMAVK_BUILD_TIMEOUT:-270}" cmake --build "$BUILD" --target llama-bench -j "$JOBS" \
        >"$OUT/llama_build.log" 2>&1
    rc=$?
    tail -n 15 "$OUT/llama_build.log"
    [ "$rc" -eq 0 ] || { grep -m 20 -iE "error|FAILED" "$OUT/llama_build.log"; kill "$models_pid" 2>/dev/null; die "the build failed (rc $rc; $OUT/llama_build.log)"; }
    echo "built in $(( $(date +%s) - tb )) s: $(ls -l "$BUILD/bin/llama-bench")"
    spv="$BUILD/ggml/src/ggml-vulkan/vulkan-shaders.spv"
    echo "SPIR-V shaders built: $(ls "$spv" | wc -l); cooperative matrix 2 (NV, *_cm2*): $(ls "$spv" | grep -c _cm2);" \
         "cooperative matrix (KHR, *_cm1*): $(ls "$spv" | grep -c _cm1); integer dot (*q8_1*): $(ls "$spv" | grep -c q8_1)"
    [ "$STOP_AFTER" = build ] && exit 0

    stage "random-weight GGUF files with a placeholder vocabulary (benchmarks/llama_vulkan_models.py)"
    wait "$models_pid" || { cat "$MODELS_DIR.log"; die "could not write the model files"; }
    cat "$MODELS_DIR.log"
    ls -l "$MODELS_DIR"
fi

stage "llama-bench's devices"
LD_LIBRARY_PATH="$RUN_LD" "$BUILD/bin/llama-bench" --list-devices 2>&1
for name in smollm2 gemma3; do
    stage "llama-bench $name: -ngl 99 -p $PROMPT -n $DECODE -r $REPS (Vulkan)"
    LD_LIBRARY_PATH="$RUN_LD" timeout -k 5 120 "$BUILD/bin/llama-bench" -m "$MODELS_DIR/$name-random-vocab.gguf" \
        -ngl 99 -p "$PROMPT" -n "$DECODE" -r "$REPS" -o json >"$OUT/llama_bench_$name.json" \
        2>"$OUT/llama_bench_$name.stderr"
    echo "rc $?"
    grep -E "ggml_vulkan|Vulkan|llama_model_load|error" "$OUT/llama_bench_$name.stderr" | head -12
    "$PY" - "$OUT/llama_bench_$name.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    kind = f"pp{r['n_prompt']}" if r["n_prompt"] else f"tg{r['n_gen']}"
    print(f"  {kind}: {r['avg_ts']:.1f} tok/s (sd {r['stddev_ts']:.1f}; {r['backends']} on {r.get('gpu_info', '?')}, "
          f"flash_attn {r.get('flash_attn')} (-1: auto), type {r['model_type']}, {r['model_size'] / 2**20:.1f} MiB); "
          f"each run: {[round(x) for x in r.get('samples_ts', [])]}")
EOF
done

stage "vulkan:0 on files of the same spec (benchmarks/vulkan_h200.sh)"
VULKAN_H200_TIMEOUT="${VULKAN_H200_TIMEOUT:-150}" bash benchmarks/vulkan_h200.sh --skip-torch --skip-check \
    --skip-matvec --skip-matmul --conformance none --prompt "$PROMPT" --decode "$DECODE" --runs "$VK_RUNS" \
    >/dev/null 2>&1
echo "rc $?"
grep -E "adapter:|vulkan:0 prefill|Error|error" "$OUT/vulkan_h200.log" | head -8

stage "SUMMARY (tok/s; llama-bench: mean of $REPS; vulkan:0: median of $VK_RUNS prefill runs)"
"$PY" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
ours = json.loads((out / "vulkan_h200.json").read_text()).get("models", {}) if (out / "vulkan_h200.json").exists() else {}
print(f"{'model':8} {'llama.cpp Vulkan pp':>20} {'tg':>8} {'vulkan:0 prefill':>17} {'decode':>8} {'pp ratio':>9} "
      f"{'tg ratio':>9}")
for name in ("smollm2", "gemma3"):
    p = out / f"llama_bench_{name}.json"
    rows = json.loads(p.read_text()) if p.exists() and p.stat().st_size else []
    pp = next((r["avg_ts"] for r in rows if r["n_prompt"]), None)
    tg = next((r["avg_ts"] for r in rows if r["n_gen"]), None)
    v = ours.get(name, {}).get("vulkan", {})
    vp, vd = v.get("prefill_tok_s"), v.get("decode_tok_s")
    f = lambda x: f"{x:.1f}" if x else "-"
    r = lambda a, b: f"{a / b:.2f}x" if a and b else "-"
    print(f"{name:8} {f(pp):>20} {f(tg):>8} {f(vp):>17} {f(vd):>8} {r(vp, pp):>9} {r(vd, tg):>9}")
EOF
echo "total $(( $(date +%s) - T0 )) s"
}
main "$@" 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
