"""`framework bench`: load time, prefill and decode speed, bytes per token and the bandwidth they
imply, the machine's own bandwidth measured in the same run, and llama.cpp on the same file,
prompt and threads when llama-cpp-python is installed. Medians of --repeats runs."""

from __future__ import annotations

import os
import statistics
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from .cli.common import err, select_devices

PARAGRAPH = ("The history of computing is a story of machines that learned to do arithmetic faster and "
             "faster, and of people who found new things to ask of them. Early mechanical calculators "
             "gave way to electronic circuits, and those circuits shrank until millions fit on a chip. ")


def prompt_ids(tokenizer, n: int) -> list[int]:
    ids = tokenizer.encode(PARAGRAPH * (n // 20 + 2))
    return ids[:n]


def measure_bandwidth(mib: int = 1024, repeats: int = 5) -> dict:
    """Memory bandwidth two ways: a copy (read + write) and a float32 matrix-vector product (read)."""
    a = np.ones(mib * 2**20 // 4, dtype=np.float32)
    b = np.empty_like(a)
    copy = _median(lambda: np.copyto(b, a), repeats)
    w = a.reshape(-1, 1024)
    x = np.ones(1024, dtype=np.float32)
    gemv = _median(lambda: w @ x, repeats)
    return {"copy_GBps": 2 * a.nbytes / copy / 1e9, "gemv_GBps": a.nbytes / gemv / 1e9}


def _median(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode_weight_bytes(session) -> int:
    """Bytes of weights one decode step reads: every weight a MUL_MAT streams (a GET_ROWS reads one row)."""
    plan = next(p for p, _ in session.plans.values() if p.graph.meta.get("phase") == "decode")
    total = 0
    for frag in plan.fragments:
        seen = set()
        for n in frag.nodes:
            w = n.src[0] if n.op == "MUL_MAT" else None
            if w is not None and w.is_leaf and id(w) not in seen:
                seen.add(id(w))
                handle = session.executor.weights[(frag.device, id(w))]
                total += int(getattr(handle, "nbytes", w.nbytes))
    return total


def bench_framework(model_path, devices, n_prompt: int, n_decode: int, repeats: int) -> dict:
    from .model.model import Model
    from .runtime.session import Session
    t0 = time.perf_counter()
    model = Model(model_path)
    session = Session(model, devices, n_ctx=max(512, n_prompt + n_decode + 8))
    ids = prompt_ids(model.tokenizer, n_prompt)
    session.plan(len(ids), 0)
    session.plan(1, len(ids))
    load = time.perf_counter() - t0
    for d in devices:                         # compiled models: how many, how long, from the on-disk cache
        if callable(getattr(d, "compile_summary", None)):
            print(d.compile_summary())
    prefill, decode = [], []
    for _ in range(repeats + 1):          # the first round warms caches and is not counted
        session.reset()
        t = time.perf_counter()
        logits = session.eval(ids)
        prefill.append(len(ids) / (time.perf_counter() - t))
        t = time.perf_counter()
        for _ in range(n_decode):
            logits = session.eval([int(np.argmax(logits))])
        decode.append(n_decode / (time.perf_counter() - t))
    return {"model": model, "load_s": load, "prefill": statistics.median(prefill[1:]),
            "decode": statistics.median(decode[1:]), "bytes_per_token": decode_weight_bytes(session),
            "ids": ids}


def bench_llama_cpp(model_path, ids: list[int], n_decode: int, repeats: int, threads: int) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(str(model_path), n_ctx=max(512, len(ids) + n_decode + 8), n_batch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    prefill, decode = [], []
    for _ in range(repeats + 1):
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        prefill.append(len(ids) / (time.perf_counter() - t))
        t = time.perf_counter()
        for _ in range(n_decode):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        decode.append(n_decode / (time.perf_counter() - t))
    llm.close()
    return {"prefill": statistics.median(prefill[1:]), "decode": statistics.median(decode[1:])}


def bench_reservation(model_path, devices, n_prompt: int, repeats: int = 5) -> list[tuple]:
    """Median milliseconds to build and to reserve (plan and check) the prefill and decode graphs."""
    from .core.scheduler import reserve
    from .model.model import Model
    from .runtime.session import Session
    model = Model(model_path)
    rows = []
    for phase, n_tokens, n_past in (("prefill", n_prompt, 0), ("decode", 1, n_prompt)):
        session = Session(model, devices, n_ctx=max(512, n_prompt + 8))
        key = session._key(n_tokens, n_past, 1)
        build, plan = [], []
        for _ in range(repeats):
            session.graphs.clear()
            t0 = time.perf_counter()
            graph, _ = session._graph(key)
            t1 = time.perf_counter()
            reserve({phase: graph}, devices, session.residence)
            plan.append(time.perf_counter() - t1)
            build.append(t1 - t0)
        rows.append((phase, len(graph.nodes), statistics.median(build) * 1e3, statistics.median(plan) * 1e3))
    return rows


def run_bench(args) -> int:
    from .model.default import MODELS as paths
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [n for n in names if n not in paths]
    if unknown:
        raise ValueError(f"unknown model(s) {unknown} for bench; known: {', '.join(paths)}")
    devices = select_devices(args.backends)
    err.print(f"threads: {args.threads} (numpy's BLAS and llama.cpp), {os.cpu_count()} CPUs; "
              f"prompt {args.prompt_tokens} tokens, {args.decode_tokens} decoded, median of {args.repeats}")
    res = Table(title="reservation (build the graph, then plan and check it; median of 5)", title_justify="left")
    for col in ("model", "graph", "nodes", "build ms", "reserve ms", "total ms"):
        res.add_column(col, justify="left" if col in ("model", "graph") else "right")
    for name in names:
        for phase, nodes, build, plan in bench_reservation(paths[name](), devices, args.prompt_tokens):
            res.add_row(name, phase, str(nodes), f"{build:.1f}", f"{plan:.1f}", f"{build + plan:.1f}")
    Console(soft_wrap=True, width=200).print(res)
    if args.reservation_only:
        return 0
    bw = measure_bandwidth()
    table = Table(title=f"framework bench on {', '.join(d.name for d in devices)}", title_justify="left")
    for col in ("model", "load s", "prefill tok/s", "decode tok/s", "weights MB/token", "effective GB/s",
                "of gemv GB/s", "llama.cpp prefill", "llama.cpp decode", "prefill ratio", "decode ratio"):
        table.add_column(col, justify="left" if col == "model" else "right")
    for name in names:
        path = paths[name]()
        r = bench_framework(path, devices, args.prompt_tokens, args.decode_tokens, args.repeats)
        eff = r["bytes_per_token"] * r["decode"] / 1e9
        ref = None if args.no_llama_cpp else bench_llama_cpp(path, r["ids"], args.decode_tokens, args.repeats,
                                                             args.threads)
        cells = [f"{ref['prefill']:.1f}", f"{ref['decode']:.1f}", f"{r['prefill'] / ref['prefill']:.2f}x",
                 f"{r['decode'] / ref['decode']:.2f}x"] if ref else ["not installed"] + ["-"] * 3
        table.add_row(name, f"{r['load_s']:.1f}", f"{r['prefill']:.1f}", f"{r['decode']:.1f}",
                      f"{r['bytes_per_token'] / 1e6:.0f}", f"{eff:.1f}", f"{eff / bw['gemv_GBps']:.0%}", *cells)
    Console(soft_wrap=True, width=200).print(table)
    print(f"machine bandwidth (same run): copy {bw['copy_GBps']:.1f} GB/s (read + write), "
          f"float32 gemv {bw['gemv_GBps']:.1f} GB/s (read)")
    return 0
