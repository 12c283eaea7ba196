"""The cpu plugin's quantized products alone, on the models' own weights: CPU time and GMAC/s per shape,
for a prefill chunk's activation rows and a decode step's one (warm: the weight read again and again, so
a decode figure here is the kernel's, not the memory's; benchmarks/cpu_profile.py times them in a model).

    python benchmarks/cpu_products.py --rows 256,1 --threads 1

Best of three timings of repeated calls (time.process_time), after one call that compiles.

    python benchmarks/cpu_products.py --cold smollm2

a decode step's layer products cold, as a model reads them: every quantized blk.* weight of the model
times one activation row, once each in file order (so each weight comes from memory, not the cache), the
pass's wall time and GB/s, best of 5 passes.

    python benchmarks/cpu_products.py --quantize smollm2,~/.cache/framework/models/qwen25-coder-1.5b.gguf

what a few rows pay for besides the products: quantizing 1, 2, 4 and 8 activation rows to 8 bits (q8_0 /
q8_1 / q8_K) at each input width of the model's layer products, per call and per decode step (every layer
product quantizing its own input, as before the products reading one input shared it, and once per input),
medians of 7 timings.

    python benchmarks/cpu_products.py --attention

a decode step's attention (one query, SmolLM2's 9 heads over 3 kv heads of 64, 300 keys; the 1.5B's 12 over 2 of
128, 257 keys), and a batched decode
step's of 8 sequences each seeing its own cells of a shared cache (Gemma 3's heads), ms a call with the keys read
as the cache holds them (the plugin's path up to attention.BY_KEY_UNTIL queries, and for rows that see at most
attention.BY_KEY_SHARE of the window) and with the window transposed first (the prefill path), medians of 7
timings of 200 calls."""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numba
import numpy as np

from framework.contract import DType
from framework.model.default import model_path, resolve_model
from framework.plugins.cpu.quantized import QuantizedWeight, quantize_activations, target

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
    ap.add_argument("--few", default="", metavar="MODELS", help="time products of 1, 2, 4, 8 activation rows")
    ap.add_argument("--quantize", default="", metavar="MODELS", help="time the activations' quantization")
    ap.add_argument("--base", default="", help="with --few: a checkout whose plugin takes turns with this one")
    ap.add_argument("--turns", type=int, default=5, help="with --few: turns of each engine")
    ap.add_argument("--plain", action="store_true", help="hold every weight as the file's bytes (not interleaved, "
                    "quantized.QuantizedWeight's interleaved=False): the layout before, for a comparison")
    ap.add_argument("--one-turn", default="", help=argparse.SUPPRESS)      # one engine's turn (a child)
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    if args.one_turn:
        return print(json.dumps(one_turn(args.one_turn)))
    if args.few:
        return few(args.few.split(","), args.base, args.turns, args.threads)
    if args.quantize:
        return [quantize(model) for model in args.quantize.split(",")]
    print(f"numba compiles for {list(target())}, {args.threads} thread(s), weights held "
          f"{'as the file holds them' if args.plain else 'interleaved where their type is'}")
    if args.cold:
        return cold(args.cold, not args.plain)
    if args.attention:
        return attention()
    readers: dict[str, gguf.GGUFReader] = {}
    for name, tensor in TENSORS:
        if args.only and not any(s in tensor for s in args.only.split(",")):
            continue
        reader = readers.setdefault(name, gguf.GGUFReader(model_path(name)))
        t = next(t for t in reader.tensors if t.name == tensor)
        n, k = int(t.shape[1]), int(t.shape[0])
        w = QuantizedWeight(np.array(t.data), DType[t.tensor_type.name], (n, k), interleaved=not args.plain)
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


def cold(name: str, interleaved: bool = True) -> None:
    reader = gguf.GGUFReader(resolve_model(os.path.expanduser(name)))
    weights = [QuantizedWeight(np.array(t.data), DType[t.tensor_type.name], (int(t.shape[1]), int(t.shape[0])),
                               interleaved) for t in reader.tensors if t.name.startswith("blk.") and len(t.shape) == 2
               and t.tensor_type.name not in ("F32", "F16", "BF16")]
    xs = {w.shape[1]: np.random.default_rng(0).standard_normal((1, w.shape[1])).astype(np.float32) for w in weights}
    for w in weights:
        w.matmul(xs[w.shape[1]])                     # compiles each type's kernel
    nbytes = sum(w.nbytes for w in weights)
    best, by_type = float("inf"), {}
    for _ in range(5):
        t0, spent = time.perf_counter(), collections.Counter()
        for w in weights:
            t1 = time.perf_counter()
            w.matmul(xs[w.shape[1]])
            spent[w.dtype.name] += time.perf_counter() - t1
        if time.perf_counter() - t0 < best:
            best, by_type = time.perf_counter() - t0, spent
    types = ", ".join(f"{t} {sec * 1e3:.2f} ms ({sum(w.nbytes for w in weights if w.dtype.name == t) / sec / 1e9:.1f}"
                      f" GB/s)" for t, sec in sorted(by_type.items()))
    print(f"{name}: {len(weights)} layer products, {nbytes / 2**20:.1f} MiB, cold pass {best * 1e3:.2f} ms "
          f"({nbytes / best / 1e9:.1f} GB/s), best of 5; by type: {types}")


FEW_ROWS = (1, 2, 4, 8)


def _groups(path: str) -> dict[str, list]:
    """Each quantized (type, shape) of the model's layers -> its tensors (one a layer), and the output matrix."""
    reader = gguf.GGUFReader(resolve_model(os.path.expanduser(path)))
    groups: dict[str, list] = collections.defaultdict(list)
    names = {t.name for t in reader.tensors}
    head = "output.weight" if "output.weight" in names else "token_embd.weight"
    for t in reader.tensors:
        if len(t.shape) != 2 or t.tensor_type.name in ("F32", "F16", "BF16"):
            continue
        if not (t.name.startswith("blk.") or t.name == head):
            continue
        n, k = int(t.shape[1]), int(t.shape[0])
        label = "head" if t.name == head else t.name.split(".", 2)[2].removesuffix(".weight")
        w = QuantizedWeight(np.array(t.data), DType[t.tensor_type.name], (n, k))
        groups[f"{t.tensor_type.name} {n}x{k}"].append((label, w))
    return groups


def one_turn(path: str) -> dict:
    """{"type NxK": {"times": {M: wall seconds a product}, "cpu": {M: CPU seconds}, ...}} for one engine, the
    medians of 3 passes over the group's tensors."""
    out = {}
    for key, ws in _groups(path).items():
        k = ws[0][1].shape[1]
        out[key] = {"tensors": sorted({label for label, _ in ws}), "bytes": ws[0][1].nbytes, "count": len(ws),
                    "times": {}, "cpu": {}}
        for m in FEW_ROWS:
            x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
            for _, w in ws:
                w.matmul(x)                          # compiles, and pages the weights in
            walls, cpus = [], []
            for _ in range(3):
                t0, c0 = time.perf_counter(), time.process_time()
                for _, w in ws:
                    w.matmul(x)
                walls.append((time.perf_counter() - t0) / len(ws))
                cpus.append((time.process_time() - c0) / len(ws))
            out[key]["times"][m] = statistics.median(walls)
            out[key]["cpu"][m] = statistics.median(cpus)
    return out


def few(models: list[str], base: str, turns: int, threads: int) -> None:
    here = Path(__file__).resolve().parent.parent
    engines = {"base": Path(base).resolve(), "this": here} if base else {"this": here}
    for engine, root in engines.items():
        print(f"{engine}: {root} at {_commit(root)}")
    print(f"load average before: {os.getloadavg()}")
    for model in models:
        runs: dict[str, list[dict]] = {e: [] for e in engines}
        for _ in range(turns):
            for engine, root in engines.items():
                env = {**os.environ, "PYTHONPATH": str(root), "NUMBA_NUM_THREADS": str(threads)}
                done = subprocess.run([sys.executable, __file__, "--threads", str(threads), "--one-turn", model],
                                      env=env, capture_output=True, text=True, check=True)
                runs[engine].append(json.loads(done.stdout.strip().splitlines()[-1]))
        for clock, what in (("times", "wall"), ("cpu", "CPU (all threads)")):
            _table(runs, engines, model, threads, turns, clock, what)
    print(f"load average after: {os.getloadavg()}")


def _table(runs: dict, engines: dict, model: str, threads: int, turns: int, clock: str, what: str) -> None:
    print(f"\n{model}, {threads} thread(s), {what} time, medians of {turns} turns, ms a product (GB/s read):")
    cols = "".join(f" | M={m} {e}" for m in FEW_ROWS for e in engines)
    print(f"| type and shape | tensors | MiB{cols} | M=2/4/8 over M=1 ({', '.join(engines)}) |")
    print("| --- " * (3 + len(FEW_ROWS) * len(engines) + 1) + "|")
    for key, info in runs["this"][0].items():
        t = {e: {m: statistics.median(r[key][clock][str(m)] for r in runs[e]) for m in FEW_ROWS} for e in engines}
        cells = [f"{t[e][m] * 1e3:.3f} ({info['bytes'] / t[e][m] / 1e9:.1f})" for m in FEW_ROWS for e in engines]
        ratios = "; ".join("/".join(f"{t[e][m] / t[e][1]:.2f}" for m in FEW_ROWS[1:]) for e in engines)
        print(f"| {key} | {','.join(info['tensors'])} | {info['bytes'] / 2**20:.2f} | " + " | ".join(cells)
              + f" | {ratios} |", flush=True)
    # a whole step's products (every tensor once): what a decode step, or a verification of M rows, costs
    for e in engines:
        step = {m: sum(info["count"] * statistics.median(r[key][clock][str(m)] for r in runs[e])
                       for key, info in runs["this"][0].items()) for m in FEW_ROWS}
        nbytes = sum(info["count"] * info["bytes"] for info in runs["this"][0].values())
        print(f"{e}: a step's products, M = {', '.join(map(str, FEW_ROWS))}: "
              + ", ".join(f"{step[m] * 1e3:.1f} ms" for m in FEW_ROWS)
              + f" ({nbytes / step[1] / 1e9:.1f} GB/s at M=1); over M=1: "
              + "/".join(f"{step[m] / step[1]:.2f}" for m in FEW_ROWS[1:]))


# a layer's products by the input they read: q, k and v the attention's norm, gate and up the FFN's
SAME_INPUT = {"attn_q": "attn", "attn_k": "attn", "attn_v": "attn", "ffn_gate": "ffn", "ffn_up": "ffn"}


def quantize(path: str) -> None:
    """quantize_activations' time per call at each (input width, 8-bit form) of the model's layer products, and
    per decode step: each product quantizing its input, and each input once (q, k, v; gate, up)."""
    products: collections.Counter = collections.Counter()
    inputs: dict = collections.defaultdict(set)
    layers = 0
    for ws in _groups(path).values():
        for label, w in ws:
            if label == "head":
                continue
            form = (w.shape[1], *w.activations)
            products[form] += 1
            inputs[form].add(SAME_INPUT.get(label, label))
            layers += label == "attn_q"
    print(f"\n{path}: quantizing the activations, us a call (medians of 7 timings of 200 calls), {layers} layers")
    step = {m: [0.0, 0.0] for m in FEW_ROWS}
    for form, n in sorted(products.items()):
        k, k_quant, q8_1 = form
        cells = []
        for m in FEW_ROWS:
            x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
            quantize_activations(x, k_quant, q8_1)
            runs = []
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(200):
                    quantize_activations(x, k_quant, q8_1)
                runs.append((time.perf_counter() - t0) / 200)
            t = statistics.median(runs)
            cells.append(f"M={m} {t * 1e6:.1f}")
            step[m][0] += n * t
            step[m][1] += len(inputs[form]) * layers * t
        print(f"K={k} {'q8_K' if k_quant else 'q8_1' if q8_1 else 'q8_0'}, {n} products a step reading "
              f"{len(inputs[form]) * layers} inputs: " + ", ".join(cells))
    print("a step, each product quantizing / each input once: "
          + ", ".join(f"M={m} {a * 1e3:.2f} / {b * 1e3:.2f} ms" for m, (a, b) in step.items()))


def _commit(root: Path) -> str:
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() or "(not a git checkout)"


def _call_ms(fn) -> float:
    """Median of 7 timings of 200 calls, after one, in ms a call."""
    fn()
    runs = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(200):
            fn()
        runs.append((time.perf_counter() - t0) / 200)
    return statistics.median(runs) * 1e3


def attention() -> None:
    from framework.plugins.cpu import attention as A
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 9, 64)).astype(np.float32)
    k, v = (rng.standard_normal((300, 3, 64)).astype(np.float32) for _ in range(2))
    # the 1.5B's decode step after 256 tokens: 12 heads over 2 kv heads of 128
    q12 = rng.standard_normal((1, 12, 128)).astype(np.float32)
    k12, v12 = (rng.standard_normal((257, 2, 128)).astype(np.float32) for _ in range(2))
    # a batched decode step of 8 sequences (Gemma 3's 4 heads over 1 kv head of 256), each seeing its own 64
    # cells of a shared cache of 512, interleaved as a unified cache places them
    q8 = rng.standard_normal((8, 4, 256)).astype(np.float32)
    k8, v8 = (rng.standard_normal((512, 1, 256)).astype(np.float32) for _ in range(2))
    mask8 = np.where(np.arange(512)[None, :] % 8 == np.arange(8)[:, None], 0.0, -np.inf).astype(np.float32)
    saved = A.BY_KEY_UNTIL, A.BY_KEY_SHARE
    try:
        for label, until, share in (("keys as the cache holds them", saved[0], saved[1]),
                                    ("window transposed first", 0, 0.0)):
            A.BY_KEY_UNTIL, A.BY_KEY_SHARE = until, share
            one = _call_ms(lambda: A.flash_attn_ext(q, k, v, scale=0.125))
            print(f"attention, 1 query, 9 heads / 3 kv heads of 64, 300 keys, {label}: {one:.3f} ms a call")
            wide = _call_ms(lambda: A.flash_attn_ext(q12, k12, v12, scale=0.088))
            print(f"attention, 1 query, 12 heads / 2 kv heads of 128, 257 keys, {label}: {wide:.3f} ms a call")
            eight = _call_ms(lambda: A.flash_attn_ext(q8, k8, v8, mask8, scale=0.0625))
            print(f"attention, 8 sequences' queries, 4 heads / 1 kv head of 256, 64 of 512 cells each, {label}"
                  f"{' (the open keys only)' if share else ''}: {eight:.3f} ms a call")
    finally:
        A.BY_KEY_UNTIL, A.BY_KEY_SHARE = saved


if __name__ == "__main__":
    main()
