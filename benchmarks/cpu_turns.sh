#!/usr/bin/env bash
# The cpu plugin's prefill and decode beside llama-bench, the engines taking turns on a quiet machine:
#
#   bash benchmarks/cpu_turns.sh MODEL THREADS ROUNDS [CHECKOUT ...]
#
# MODEL: a packaged model's name (smollm2, gemma3) or a GGUF file. Each round runs `framework bench --backends
# cpu --prompt-tokens 256 --decode-tokens 32 --repeats 3` in each CHECKOUT (its own tree, from its own folder;
# default: this one) for each of BACKENDS (space-separated, default cpu: BACKENDS="cpu openvino:CPU" takes both
# plugins in turns), then llama-bench (-p 256 -n 32 -d 0,256 -r 3) from benchmarks/build_llama_tools.sh's build
# (LLAMA_BENCH=PATH for another). Every engine warms up once before the first round. llama-bench's decode is
# read at depth 256 (`tg32 @ d256`: after 256 tokens, as ours follows its 256-token prompt; its plain `tg32`
# starts from an empty cache, so its attention reads no keys), its prefill at depth 0 (`pp256`).
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,8p "$0"; exit 2; }
model=$1 threads=$2 rounds=$3
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
checkouts=("$@")
[ ${#checkouts[@]} -gt 0 ] || checkouts=("$here")
py=$here/.venv/bin/python
bench=${LLAMA_BENCH:-$HOME/.cache/framework/llama.cpp/build-0.3.36/bin/llama-bench}
[ -x "$bench" ] || { echo "no llama-bench at $bench: bash benchmarks/build_llama_tools.sh builds it" >&2; exit 2; }
gguf=$(cd "$here" && "$py" -c "import sys; from framework.model.default import resolve_model; print(resolve_model(sys.argv[1]))" "$model")

read -r -a backends <<< "${BACKENDS:-cpu}"

ours() {   # a checkout's framework bench on backend $2, run from its own folder so that its own tree is imported
  (cd "$1" && "$py" -c "import sys; from framework.cli import main; sys.exit(main(sys.argv[1:]))" bench \
     --backends "$2" -m "$gguf" --prompt-tokens 256 --decode-tokens 32 --repeats 3 -t "$threads" --no-llama-cpp)
}
theirs() { "$bench" -m "$gguf" -t "$threads" -p 256 -n 32 -d 0,256 -r 3; }

echo "# $(date -u) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) $gguf t=$threads"
for c in "${checkouts[@]}"; do for b in "${backends[@]}"; do ours "$c" "$b" >/dev/null 2>&1; done; done   # warm-up
theirs >/dev/null 2>&1
for r in $(seq "$rounds"); do
  for c in "${checkouts[@]}"; do
    for b in "${backends[@]}"; do
      echo "### round $r $c at $(git -C "$c" rev-parse --short HEAD) on $b load $(cut -d' ' -f1 /proc/loadavg)"
      ours "$c" "$b" 2>&1 | grep -E '^(prefill|decode) tok/s'
    done
  done
  echo "### round $r llama-bench load $(cut -d' ' -f1 /proc/loadavg)"
  theirs 2>&1 | grep -E 'pp256 \||tg32 @ d256'
done
