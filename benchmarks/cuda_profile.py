"""What bounds the CUDA plugin's decode: benchmarks/cuda_profile.sh runs this under Nsight Systems on the
GPU machine. Two modes:

* ``run MODEL``: a short decode on cuda:0 (FRAMEWORK_CUDA_GRAPHS as the caller set it) of a random-weight
  file of MODEL's shape (benchmarks/vulkan_models.json): a prompt, warm-up steps (compiles and captures),
  then --steps decode steps timed inside cudaProfilerStart/Stop, which is what nsys records
  (--capture-range=cudaProfilerApi). Writes the decode program's steps (kernel, grid, block, the weight
  bytes a matrix-vector product reads) and the wall time a step to --meta; with --copy, a device-to-device
  copy's rate too (the bound a weight-reading kernel can reach).
* ``summarize``: from nsys's cuda_gpu_trace CSV of that range and the meta, the GPU time a step, the
  step's GPU-busy fraction (kernel time / wall time: one stream, so kernels do not overlap), the time per
  kernel (and per matrix-vector shape, with its weight bytes' rate against the copy's).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def copy_rate(nbytes: int = 1 << 30, reps: int = 10) -> float:
    """GB/s of a device-to-device copy of nbytes (read + write counted: 2 x nbytes a copy)."""
    import cupy
    a, b = cupy.ones(nbytes, np.uint8), cupy.empty(nbytes, np.uint8)
    b[:] = a
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        b[:] = a
    stop.record()
    stop.synchronize()
    return 2 * nbytes * reps / (cupy.cuda.get_elapsed_time(start, stop) / 1e3) / 1e9


def step_rows(programs) -> list[dict]:
    from framework.backend import weight_words
    rows = []
    for p in programs:
        for st in p.steps:
            opts = st.kernel.options
            qt = next((k[3:] for k in opts if k.startswith("QT_") and k not in ("QT_WPB", "QT_GPB")), None)
            nbytes = 0
            if st.kernel.kernel == "matvec_q" and qt:
                lay = weight_words.layout(qt)
                nbytes = st.params["N"] * st.params["K"] // lay.block_elems * lay.words_per_block * 4
            rows.append({"name": st.name, "kernel": st.kernel.kernel, "grid": st.grid[0], "block": st.grid[1],
                         "qt": qt, "weight_bytes": nbytes})
    return rows


def run(args) -> None:
    import ctypes

    import vulkan_bench as vb
    from framework.model.model import Model
    from framework.plugins.cuda.device import devices
    from framework.runtime.session import Session
    dev = devices()[0]
    if not dev.available:
        raise SystemExit(f"cuda:0 unavailable: {dev.unavailable_reason}")
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    rng = np.random.default_rng(0)
    model = Model(vb.write_model(args.model, specs[args.model], Path(args.work) / f"{args.model}.gguf", rng))
    s = Session(model, [dev], n_ctx=1024, n_batch=args.prompt)
    s.eval([int(t) for t in rng.integers(0, model.hp.n_vocab, size=args.prompt)])
    tok = 1
    for _ in range(8):
        tok = int(np.argmax(s.eval([tok])))
    dev.synchronize()
    driver = ctypes.CDLL("libcuda.so.1")       # cuProfilerStart/Stop: what --capture-range cudaProfilerApi waits for
    with dev.on_device():                       # (on the device's context)
        rc = driver.cuProfilerStart()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            tok = int(np.argmax(s.eval([tok])))
        wall = time.perf_counter() - t0
        dev.synchronize()
        driver.cuProfilerStop()
    if rc:
        print(f"cuProfilerStart returned CUresult {rc}: nsys may have recorded nothing")
    meta = {"model": args.model, "graphs": dev.graphs, "steps": args.steps, "wall_s_per_step": wall / args.steps,
            "report": dev.report_line(), "program": step_rows(vb._programs(s, 1))}
    if args.copy:
        meta["copy_GBps"] = copy_rate()
    Path(args.meta).write_text(json.dumps(meta, indent=1))
    print(f"{args.model} graphs={int(dev.graphs)}: {args.steps} decode steps, {1e3 * wall / args.steps:.3f} ms a step "
          f"({args.steps / wall:.0f} tok/s under nsys), {len(meta['program'])} kernels a step; {meta['report']}"
          + (f"; device copy {meta['copy_GBps']:.0f} GB/s" if args.copy else ""))


def summarize(args) -> None:
    meta = json.loads(Path(args.meta).read_text())
    copy = json.loads(Path(args.copy_meta).read_text()).get("copy_GBps") if args.copy_meta else None
    with open(args.trace) as f:
        rows = [r for r in csv.DictReader(f) if r.get("GrdX")]       # kernels only (copies have no grid)
    n = meta["steps"]
    total_ns = sum(float(r["Duration (ns)"]) for r in rows)
    gpu_ms, wall_ms = total_ns / n / 1e6, 1e3 * meta["wall_s_per_step"]
    print(f"{meta['model']} graphs={int(meta['graphs'])}: {len(rows) / n:.0f} kernels a step, GPU busy "
          f"{gpu_ms:.3f} ms of {wall_ms:.3f} ms a step: {gpu_ms / wall_ms:.0%}")
    per: dict = defaultdict(lambda: [0.0, 0])
    for r in rows:
        key = r["Name"].split("(")[0]
        per[key][0] += float(r["Duration (ns)"])
        per[key][1] += 1
    print("  kernel                     us/step  count/step  us each")
    for k, (ns, c) in sorted(per.items(), key=lambda kv: -kv[1][0]):
        print(f"  {k:26s} {ns / n / 1e3:8.1f} {c / n:10.0f} {ns / c / 1e3:8.2f}")
    # matrix-vector products by launch shape, joined to the program's steps (kernel, grid, block)
    shapes: dict = defaultdict(list)
    for st in meta["program"]:
        if st["kernel"] == "matvec_q":
            shapes[(st["grid"], st["block"])].append(st)
    mv: dict = defaultdict(list)
    for r in rows:
        if r["Name"].startswith("matvec_q"):
            mv[(int(r["GrdX"]), int(r["BlkX"]))].append(float(r["Duration (ns)"]))
    all_ns = all_bytes = 0.0
    for key, sts in sorted(shapes.items(), key=lambda kv: -kv[1][0]["weight_bytes"]):
        ds = mv.get(key, [])
        if not ds:
            continue
        each_ns = float(np.median(ds))
        nbytes = float(np.mean([s["weight_bytes"] for s in sts]))
        rate = nbytes / each_ns
        all_ns += sum(ds) / n
        all_bytes += nbytes * len(ds) / n
        of_copy = f" ({rate / copy:.0%} of the copy)" if copy else ""
        print(f"  matvec {sts[0]['qt']:5s} grid {key[0]:5d} x {key[1]:3d}: {len(ds) / n:3.0f} a step, "
              f"{each_ns / 1e3:6.2f} us each, {nbytes / 2**20:6.2f} MiB -> {rate:6.0f} GB/s{of_copy}  {sts[0]['name']}")
    if all_ns:
        print(f"  matvec all: {all_ns / 1e3:.1f} us a step for {all_bytes / 2**20:.1f} MiB of weights: "
              f"{all_bytes / all_ns:.0f} GB/s" + (f"; device copy {copy:.0f} GB/s (read+write)" if copy else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    r = sub.add_parser("run")
    r.add_argument("model")
    r.add_argument("--steps", type=int, default=64)
    r.add_argument("--prompt", type=int, default=64)
    r.add_argument("--meta", required=True)
    r.add_argument("--work", default="/tmp")
    r.add_argument("--copy", action="store_true")
    s = sub.add_parser("summarize")
    s.add_argument("--meta", required=True)
    s.add_argument("--trace", required=True)
    s.add_argument("--copy-meta")
    args = ap.parse_args()
    (run if args.mode == "run" else summarize)(args)


if __name__ == "__main__":
    main()
