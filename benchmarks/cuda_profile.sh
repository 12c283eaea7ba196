#!/usr/bin/env bash
# Nsight Systems over a short decode on cuda:0 (benchmarks/cuda_profile.py's docstring says what it records),
# per model, with CUDA graphs on and off, and with graphs on and the fusions off (FRAMEWORK_CUDA_UNFUSE=all), or
# the runs PROFILE_RUNS names (graphs1-greedy: graphs on, decoding through runtime/greedy.py's queued steps):
# nsys's kernel and API summaries of the decode steps, then cuda_profile.py's summary (GPU time a step, GPU-busy fraction, time per kernel, the matrix-vector
# products' weight rate against a device copy). Run through `bash benchmarks/cuda_h100.sh profile` (which
# sets up the Python path); the log is $1/cuda_profile.log. Further arguments: the models (default
# smollm2 gemma3).
set -uo pipefail
out="$1"
shift
models="${*:-smollm2 gemma3}"
NSYS="$(command -v nsys || find /opt /usr/local /usr/lib /usr/bin /root -maxdepth 7 -name nsys -type f -perm -u+x 2>/dev/null | head -1)"
if [ -z "$NSYS" ]; then echo "nsys not found (PATH, /opt, /usr/local, /usr/lib, /usr/bin, /root)"; exit 1; fi
work=/tmp/cuda_profile
mkdir -p "$work"
# nsys's importer needs libdw.so.1, which the lent machine's image lacks (2026-12-06): elfutils' libdw1 and
# libelf1, carried in .gl/nsys (here: `mkdir -p .gl/nsys && cd .gl/nsys && apt-get download libdw1 libelf1`),
# unpacked apart from the system's libraries and put on the loader's path of nsys and its importer alone
if ! ldconfig -p | grep -q "libdw.so.1" && ls .gl/nsys/libdw1_*.deb >/dev/null 2>&1; then
  for f in .gl/nsys/*.deb; do dpkg -x "$f" /tmp/nsys_libs; done
  NSYS_LIBS=/tmp/nsys_libs/usr/lib/x86_64-linux-gnu
fi
nsys_env=(env ${NSYS_LIBS:+LD_LIBRARY_PATH=$NSYS_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}})
log="$out/cuda_profile.log"
{
  "$NSYS" --version
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  copy=""
  for model in $models; do
    for run in ${PROFILE_RUNS:-graphs1 graphs0 graphs1-unfused}; do
      tag="$model-$run"
      graphs=0; unfuse=""
      case "$run" in graphs1*) graphs=1;; esac
      case "$run" in *unfused) unfuse=all;; esac
      extra=()
      case "$run" in *greedy) extra=(--greedy);; esac
      if [ -z "$copy" ]; then extra+=(--copy); copy="$work/$tag.json"; fi
      echo "=== $tag (FRAMEWORK_CUDA_GRAPHS=$graphs FRAMEWORK_CUDA_UNFUSE=$unfuse)"
      FRAMEWORK_CUDA_GRAPHS=$graphs FRAMEWORK_CUDA_UNFUSE=$unfuse "${nsys_env[@]}" "$NSYS" profile --force-overwrite true --trace cuda \
        --cuda-graph-trace node --capture-range cudaProfilerApi --capture-range-end stop -o "$work/$tag" \
        python3 benchmarks/cuda_profile.py run "$model" --meta "$work/$tag.json" --work "$work" "${extra[@]}"
      if [ ! -f "$work/$tag.nsys-rep" ] && [ -f "$work/$tag.qdstrm" ]; then
        # nsys could not import its own capture (on the lent H100 of 2026-12-06: "Importer error status: An
        # unknown error occurred"): the importer's own words, its missing libraries, and the raw capture kept
        imp="$(find "$(dirname "$(readlink -f "$NSYS")")/.." -maxdepth 3 -name QdstrmImporter -type f | head -1)"
        echo "importing $tag.qdstrm by hand: $imp"
        if [ -n "$imp" ]; then "${nsys_env[@]}" ldd "$imp" | grep "not found"; "${nsys_env[@]}" "$imp" -i "$work/$tag.qdstrm" 2>&1 | tail -5; fi
        cp "$work/$tag.qdstrm" "$out/" 2>/dev/null
      fi
      "${nsys_env[@]}" "$NSYS" stats --force-export true --report cuda_gpu_kern_sum --report cuda_api_sum --format table \
        "$work/$tag.nsys-rep" 2>&1 | cut -c1-200
      # --force-export: the export the table above made can read as older than the capture (same second), and
      # nsys then refuses (2026-12-07 on an H100: "Existing SQLite export found", no trace, no summary)
      "${nsys_env[@]}" "$NSYS" stats --force-export true --report cuda_gpu_trace --format csv --output "$work/$tag" \
        "$work/$tag.nsys-rep" >/dev/null
      trace="$(ls "$work/${tag}"_*cuda_gpu_trace*.csv 2>/dev/null | head -1)"
      python3 benchmarks/cuda_profile.py summarize --meta "$work/$tag.json" --copy-meta "$copy" --trace "$trace"
    done
  done
} 2>&1 | tee "$log"
