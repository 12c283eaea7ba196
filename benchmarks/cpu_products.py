"""The cpu plugin's quantized products alone, on the models' own weights: CPU time and GMAC/s per shape,
for a prefill chunk's activation rows and a decode step's one (warm: the weight read again and again, so
a decode figure here is the kernel's, not the memory's; benchmarks/cpu_profile.py times them in a model).

    python benchmarks/cpu_products.py --rows 256,1 --threads 1

Best of three timings of repeated calls (time.process_time), after one call that compiles."""

from __future__ import annotations

import argparse
import time

import gguf
import numba
import numpy as np

from framework.contract import DType
from framework.model.default import model_path
from framework.plugins.cpu.quantized import QuantizedWeight, target

# (model, tensor): each type and shape of the two models' layers, and Gemma 3's tied output matrix
TENSORS = (("gemma3", "blk.0.ffn_gate.weight"), ("gemma3", "blk.0.attn_q.weight"), ("gemma3", "blk.0.attn_k.weight"),
           ("gemma3", "blk.0.ffn_down.weight"), ("gemma3", "blk.0.attn_output.weight"),
           ("gemma3", "blk.0.attn_v.weight"), ("smollm2", "blk.0.ffn_gate.weight"),
           ("smollm2", "blk.0.attn_k.weight"), ("gemma3", "token_embd.weight"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="256,1", help="activation rows, comma-separated")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="", help="tensor names to keep (substrings, comma-separated)")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    print(f"numba compiles for {list(target())}, {args.threads} thread(s)")
    readers: dict[str, gguf.GGUFReader] = {}
    for name, tensor in TENSORS:
        if args.only and not any(s in tensor for s in args.only.split(",")):
            continue
        reader = readers.setdefault(name, gguf.GGUFReader(model_path(name)))
        t = next(t for t in reader.tensors if t.name == tensor)
        n, k = int(t.shape[1]), int(t.shape[0])
        w = QuantizedWeight(np.array(t.data), DType[t.tensor_type.name], (n, k))
        for m in (int(v) for v in args.rows.split(",")):
            x = np.random.default_rng(0).standard_normal((m, k)).astype(np.float32)
            w.matmul(x)
            reps = max(3, int(2e9 / (m * n * k)))
            best = float("inf")
            for _ in range(3):
                t0 = time.process_time()
                for _ in range(reps):
                    w.matmul(x)
                best = min(best, (time.process_time() - t0) / reps)
            print(f"{name:8s} {tensor:26s} {t.tensor_type.name:5s} N={n:6d} K={k:5d} M={m:4d} {best * 1e3:9.3f} ms "
                  f"{m * n * k / best / 1e9:6.1f} GMAC/s", flush=True)


if __name__ == "__main__":
    main()
