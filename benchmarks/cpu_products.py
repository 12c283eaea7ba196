"""The cpu plugin's quantized products alone, on the models' own weights: CPU time and GMAC/s per shape,
for a prefill chunk's activation rows and a decode step's one (warm: the weight read again and again, so
a decode figure here is the kernel's, not the memory's; benchmarks/cpu_profile.py times them in a model).

    python benchmarks/cpu_products.py --rows 256,1 --threads 1

Best of three timings of repeated calls (time.process_time), after one call that compiles.

    python benchmarks/cpu_products.py --cold smollm2

a decode step's layer products cold, as a model reads them: every quantized blk.* weight of the model
times one activation row, once each in file order (so each weight comes from memory, not the cache), the
pass's wall time and GB/s, best of 5 passes.

    python benchmarks/cpu_products.py --attention

a decode step's attention (one query, SmolLM2's 9 heads over 3 kv heads of 64, 300 keys), ms a call with
the keys read as the cache holds them (the plugin's path up to attention.BY_KEY_UNTIL queries) and with
the window transposed first (the prefill path), medians of 7 timings of 200 calls."""

from __future__ import annotations

import argparse
import statistics
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
    ap.add_argument("--cold", default="", metavar="MODEL", help="time a decode step's layer products cold")
    ap.add_argument("--attention", action="store_true", help="time a decode step's attention, both paths")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    print(f"numba compiles for {list(target())}, {args.threads} thread(s)")
    if args.cold:
        return cold(args.cold)
    if args.attention:
        return attention()
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


def cold(name: str) -> None:
    reader = gguf.GGUFReader(model_path(name))
    weights = [QuantizedWeight(np.array(t.data), DType[t.tensor_type.name], (int(t.shape[1]), int(t.shape[0])))
               for t in reader.tensors if t.name.startswith("blk.") and len(t.shape) == 2
               and t.tensor_type.name not in ("F32", "F16", "BF16")]
    xs = {w.shape[1]: np.random.default_rng(0).standard_normal((1, w.shape[1])).astype(np.float32) for w in weights}
    for w in weights:
        w.matmul(xs[w.shape[1]])                     # compiles each type's kernel
    nbytes = sum(w.nbytes for w in weights)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for w in weights:
            w.matmul(xs[w.shape[1]])
        best = min(best, time.perf_counter() - t0)
    print(f"{name}: {len(weights)} layer products, {nbytes / 2**20:.1f} MiB, cold pass {best * 1e3:.2f} ms "
          f"({nbytes / best / 1e9:.1f} GB/s), best of 5")


def attention() -> None:
    from framework.plugins.cpu import attention as A
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 9, 64)).astype(np.float32)
    k, v = (rng.standard_normal((300, 3, 64)).astype(np.float32) for _ in range(2))
    saved = A.BY_KEY_UNTIL
    try:
        for label, until in (("keys as the cache holds them", saved), ("window transposed first", 0)):
            A.BY_KEY_UNTIL = until
            A.flash_attn_ext(q, k, v, scale=0.125)
            runs = []
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(200):
                    A.flash_attn_ext(q, k, v, scale=0.125)
                runs.append((time.perf_counter() - t0) / 200)
            print(f"attention, 1 query, 9 heads / 3 kv heads of 64, 300 keys, {label}: "
                  f"{statistics.median(runs) * 1e3:.3f} ms a call")
    finally:
        A.BY_KEY_UNTIL = saved


if __name__ == "__main__":
    main()
