"""What bounds the CUDA plugin's decode: benchmarks/cuda_profile.sh runs this under Nsight Systems on the
GPU machine. Two modes:

* ``run MODEL``: a short decode on cuda:0 (FRAMEWORK_CUDA_GRAPHS as the caller set it; --greedy: through
  runtime/greedy.py's queued steps, else eval's logits and np.argmax step by step) of a random-weight
  file of MODEL's shape (benchmarks/vulkan_models.json): a prompt, warm-up steps (compiles and captures),
  then --steps decode steps timed inside cudaProfilerStart/Stop, which is what nsys records
  (--capture-range=cudaProfilerApi). Writes the decode program's steps (kernel, grid, block, the weight
  bytes a matrix-vector product reads) and the wall time a step to --meta; with --copy, a device-to-device
  copy's rate too (the bound a weight-reading kernel can reach).
* ``events MODEL``: no Nsight at all (its importer failed on the lent H100): CUDA events. The wall time of
  a decode step (graphs as the caller set them), the GPU time of the captured graph replayed alone (events
  around --steps replays: the step without its host share), the GPU time of every kernel of the step
  (launched one by one behind a spinning kernel, so the host's launch cost never shows between them, an
  event before each), summed by kernel and by product shape with the weight bytes' rate against a device
  copy, and the host functions that take most of a step (cProfile).
* ``verify MODEL``: the cost of a verification step of 2, 4, 5 and 8 rows (every row's logits: what a
  speculative round's target step is; 5: four drafts and the target's own) against a decode step, on cuda:0
  and vulkan:0 (--cuda-only: cuda:0 alone; lookup_bench's step_costs, on the random-weight file).
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


def prompted_session(args, n_ctx: int = 1024):
    """cuda:0, and a Session on it over a random-weight file of args.model's shape, its prompt evaluated."""
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
    s = Session(model, [dev], n_ctx=n_ctx, n_batch=max(args.prompt, getattr(args, "rows", 1)))
    s.eval([int(t) for t in rng.integers(0, model.hp.n_vocab, size=args.prompt)])
    return dev, s


def run(args) -> None:
    import ctypes

    import vulkan_bench as vb
    from framework.runtime.greedy import greedy_tokens
    dev, s = prompted_session(args)
    if args.greedy:         # runtime/greedy.py: the argmax on the device, each step queued before its token is read
        tokens = greedy_tokens(s, [1], args.steps + 9)

        def step():
            return next(tokens)
    else:
        tok = [1]

        def step():
            tok[0] = int(np.argmax(s.eval([tok[0]])))
    for _ in range(8):
        step()
    dev.synchronize()
    driver = ctypes.CDLL("libcuda.so.1")       # cuProfilerStart/Stop: what --capture-range cudaProfilerApi waits for
    with dev.on_device():                       # (on the device's context)
        rc = driver.cuProfilerStart()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
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


SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {}
}
"""


def weight_bytes(st) -> int:
    """Bytes of quantized weight a product launch reads (matvec_q: N x K; rowvec: F_NW weights of N x F_K)."""
    from framework.backend import weight_words
    opts = st.kernel.options
    qt = next((k[3:] for k in opts if k.startswith("QT_") and k not in ("QT_WPB", "QT_GPB")), None)
    if not qt or st.kernel.kernel not in ("matvec_q", "rowvec", "matmul_q"):
        return 0
    lay = weight_words.layout(qt)
    k = opts.get("F_K") or st.params["K"]
    return opts.get("F_NW", 1) * st.params["N"] * k // lay.block_elems * lay.words_per_block * 4


def kernel_times(dev, prog, run, reps: int) -> list[list[float]]:
    """Each launch's GPU time (us) in `reps` runs of `run` (a decode step, or a prefill) launch by launch
    (graphs off), a spinning kernel first so that every launch is queued before the GPU reaches it, an
    event before each."""
    import cupy
    spin = cupy.RawKernel(SPIN, "spin")
    graphs, dev.graphs = dev.graphs, False
    times = []
    try:
        for _ in range(reps):
            events, wrapped = [], []
            for fn, grid, ops, fixed in prog.launches:
                def call(g, b, a, fn=fn):
                    events.append(dev.stream.record())
                    fn(g, b, a)
                wrapped.append((call, grid, ops, fixed))
            held, prog.launches = prog.launches, wrapped
            try:
                with dev.on_device():
                    spin((1,), (1,), (np.int64(200_000_000),))   # ~0.1 s at 2 GHz
                run()
                with dev.on_device():
                    events.append(dev.stream.record())
                    events[-1].synchronize()
            finally:
                prog.launches = held
            times.append([cupy.cuda.get_elapsed_time(a, b) * 1e3 for a, b in zip(events, events[1:])])
    finally:
        dev.graphs = graphs
    return times


def step_class(st) -> str:
    """A launch's class for the ablation: its op label and kernel; products also by weight shape."""
    key = st.name.split(" ")[0] + " " + st.kernel.kernel
    if weight_bytes(st):
        k = st.kernel.options.get("F_K") or st.params.get("K")
        key += f" N{st.params['N']} K{k}"
    return key


def ablation(dev, prog, reps: int = 20) -> None:
    """What each class of launch costs inside the step's CUDA graph: graphs of the step captured without
    that class (the same buffers, so the values are garbage: only times count), replayed `reps` times
    behind events; the class's cost is the whole graph's time less the graph without it. Also each
    class captured alone (its time with the weights it reads warm in L2 where they fit)."""
    import cupy
    a, outs, slots = prog._ablation_args
    held = prog.launches

    def graph_ms(launches) -> float:
        prog.launches = launches
        try:
            with dev.on_device():
                dev.stream.begin_capture()
                try:
                    prog._launch_all(a, outs, slots)
                finally:
                    g = dev.stream.end_capture()
                for _ in range(3):
                    g.launch(stream=dev.stream)
                e0 = dev.stream.record()
                for _ in range(reps):
                    g.launch(stream=dev.stream)
                e1 = dev.stream.record()
                e1.synchronize()
        finally:
            prog.launches = held
        return cupy.cuda.get_elapsed_time(e0, e1) / reps

    classes: dict = defaultdict(list)
    for i, st in enumerate(prog.steps):
        classes[step_class(st)].append(i)
    whole = graph_ms(held)
    print(f"  ablation: the step's graph {whole * 1e3:.1f} us ({len(held)} kernels, {reps} replays)")
    print("  class                                            n   without: saves us   alone us   us each alone")
    rows = []
    for c, idx in classes.items():
        keep = set(idx)
        without = graph_ms([ln for i, ln in enumerate(held) if i not in keep])
        alone = graph_ms([held[i] for i in idx])
        rows.append((whole - without, c, len(idx), alone))
    for saves, c, n, alone in sorted(rows, reverse=True):
        print(f"  {c:48s} {n:3d}   {saves * 1e3:8.1f}        {alone * 1e3:8.1f}   {alone * 1e3 / n:8.2f}")
    print(f"  sum of the classes' savings {sum(r[0] for r in rows) * 1e3:.1f} us of {whole * 1e3:.1f}")


def host_split(dev, s, progs, tok: int, n: int) -> str:
    """Where a decode step's wall time goes, ms a step over n steps (perf_counter around the pieces, no
    profiler): the session's eval, the executor's run inside it, the program's run (values staged, the
    graph launched), the wait for the GPU, the read-back of the logits, the executor's finite check of
    them, and the loop's argmax."""
    acc: dict = defaultdict(float)

    def timed(name, fn):
        def call(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                acc[name] += time.perf_counter() - t0
        return call
    ex = s.executor
    patched = [(s, "eval"), (ex, "run"), (dev, "synchronize"), (dev, "read_buffer"), (ex, "_check_finite")]
    patched += [(p, "run") for p in progs]
    for obj, name in patched:
        setattr(obj, name, timed(f"{type(obj).__name__}.{name}", getattr(obj, name)))
    argmax = timed("argmax", np.argmax)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            tok = int(argmax(s.eval([tok])))
        wall = time.perf_counter() - t0
    finally:
        for obj, name in patched:
            delattr(obj, name)
    parts = ", ".join(f"{k} {v / n * 1e3:.3f}" for k, v in acc.items())
    return f"host split, ms a step (wall {wall / n * 1e3:.3f}): {parts}"


def keep_args(dev, prog, step) -> None:
    """One step launched kernel by kernel, keeping the arguments its launches took (for ablation)."""
    graphs, dev.graphs = dev.graphs, False
    launch_all = prog._launch_all

    def keep(a, outs, slots):
        prog._ablation_args = (a, outs, slots)
        return launch_all(a, outs, slots)
    prog._launch_all = keep
    try:
        step()
    finally:
        del prog._launch_all
        dev.graphs = graphs


def prefill_listing(args, dev, s, step) -> None:
    """--prefill: the programs a prefill of --rows rows runs (those its first run made), each launch's GPU
    time, and the prefill's wall time."""
    before = set(s.executor.programs)
    step()
    progs = [p for k, p in s.executor.programs.items() if k not in before]
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    dev.synchronize()
    wall_ms = (time.perf_counter() - t0) / args.steps * 1e3
    print(f"{args.model}: a prefill of {args.rows} rows: wall {wall_ms:.3f} ms "
          f"({args.rows / wall_ms * 1e3:.0f} tok/s), {len(progs)} programs")
    copy = copy_rate()
    for prog in progs:
        listing(dev, prog, step, copy, None)


def events(args) -> None:
    import cProfile
    import io
    import pstats

    import cupy

    import vulkan_bench as vb
    from cuda_bench import set_constants
    set_constants(args.set)                   # a sweep of the kernel shapes' constants (not a user setting)
    dev, s = prompted_session(args, args.ctx)
    tok = 1
    for _ in range(8):
        tok = int(np.argmax(s.eval([tok])))
    dev.synchronize()
    sweep = f", {' '.join(args.set)}" if args.set else ""
    print(f"{args.model}: {args.prompt} prompt tokens, n_ctx {args.ctx}{sweep}"
          + (f"; steps of {args.rows} rows with every row's logits (a verification step)"
             if args.rows > 1 and not args.prefill else ""))
    base, rows = s.n_past, list(range(100, 100 + args.rows))

    def step():
        if args.rows == 1:
            return s.eval([tok])
        s.rewind(base)
        return s.eval(rows, all_logits=not args.prefill, prompt=args.prefill)
    if args.prefill:
        return prefill_listing(args, dev, s, step)
    for _ in range(3):
        step()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        tok = int(np.argmax(step()[-1] if args.rows > 1 else step()))
    wall_ms = (time.perf_counter() - t0) / args.steps * 1e3
    progs = vb._programs(s, args.rows)
    line = f"{args.model}: wall {wall_ms:.3f} ms a step ({1e3 / wall_ms:.0f} steps/s), graphs={int(dev.graphs)}"
    graph_ms = None
    if len(progs) == 1 and progs[0].graph is not None:
        with dev.on_device():
            a, b = dev.stream.record(), None
            for _ in range(args.steps):
                progs[0].graph.launch(stream=dev.stream)
            b = dev.stream.record()
            b.synchronize()
        graph_ms = cupy.cuda.get_elapsed_time(a, b) / args.steps
        line += f"; the graph replayed alone {graph_ms:.3f} ms ({graph_ms / wall_ms:.0%} of the wall)"
    print(line)
    if args.rows > 1:              # the ablation alone
        for prog in progs:
            keep_args(dev, prog, step)
            ablation(dev, prog)
        return
    print(host_split(dev, s, progs, tok, args.steps))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(args.steps):
        tok = int(np.argmax(s.eval([tok])))
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(18)
    print("host functions by own time, over", args.steps, "steps (cProfile adds its own cost):")
    print("\n".join(ln for ln in buf.getvalue().splitlines()[6:] if ln.strip())[:4000])
    copy = copy_rate()
    for prog in progs:
        keep_args(dev, prog, step)
        ablation(dev, prog)
        if args.ablation_only:
            continue
        listing(dev, prog, lambda: s.eval([tok]), copy, graph_ms)


def listing(dev, prog, run, copy: float, graph_ms: float | None) -> None:
    """The GPU time of every launch of prog in a run of `run`, summed by kernel and by product shape (with
    the weight bytes' rate against a device copy's), and the slowest launches."""
    reps = kernel_times(dev, prog, run, 5)
    each = np.median(np.array(reps), axis=0)
    total = float(each.sum())
    print(f"{prog.name if hasattr(prog, 'name') else 'program'}: {len(each)} kernels, their GPU times summed "
          f"{total / 1e3:.3f} ms (launched one by one behind a spin; medians of 5 steps)"
          + (f"; graph replay {graph_ms:.3f} ms" if graph_ms else ""))
    by_kind: dict = defaultdict(lambda: [0.0, 0, 0])
    for st, us in zip(prog.steps, each):
        key = st.name.split(" ")[0] + " " + st.kernel.kernel
        by_kind[key][0] += us
        by_kind[key][1] += 1
        by_kind[key][2] += weight_bytes(st)
    print("  what                                     us/step  count  us each   GB/s (weights)")
    for k, (us, c, nb) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        rate = f"{nb / us / 1e3:7.0f}" if nb else ""
        print(f"  {k:40s} {us:8.1f} {c:6d} {us / c:8.2f}  {rate}")
    shapes: dict = defaultdict(lambda: [0.0, 0, 0, None])
    for st, us in zip(prog.steps, each):
        nb = weight_bytes(st)
        if nb:
            opts = st.kernel.options
            qt = next(k[3:] for k in opts if k.startswith("QT_") and k[3:] not in ("WPB", "GPB"))
            key = (st.kernel.kernel, st.params["N"], opts.get("F_K") or st.params.get("K"), st.grid, qt)
            sh = shapes[key]
            sh[0] += us
            sh[1] += 1
            sh[2] += nb
            sh[3] = st.name
    print(f"  products by shape (device copy {copy:.0f} GB/s, read + write):")
    for (kern, n, k, grid, qt), (us, c, nb, name) in sorted(shapes.items(), key=lambda kv: -kv[1][0]):
        print(f"  {kern:8s} {qt:5s} N {n:6d} K {k:5d} grid {grid[0]:5d} x {grid[1]:3d}: {c:3d} a step, "
              f"{us / c:7.2f} us each, {nb / c / 2**20:7.2f} MiB, {nb / us / 1e3:6.0f} GB/s  {name}")
    top = sorted(zip(each, prog.steps), key=lambda x: -x[0])[:12]
    print("  slowest launches: " + "; ".join(f"{st.name} {us:.1f} us" for us, st in top))


def verify(args) -> None:
    from lookup_bench import step_costs

    import vulkan_bench as vb
    from framework.model.model import Model
    from framework.plugins.cuda.device import devices
    from framework.plugins.vulkan.device import devices as vulkan_devices
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    model = Model(vb.write_model(args.model, specs[args.model], Path(args.work) / f"{args.model}.gguf",
                                 np.random.default_rng(0)))
    for dev in (devices()[0], *(vulkan_devices()[:1] if not args.cuda_only else ())):
        if not dev.available:
            print(f"{dev.name}: unavailable: {dev.unavailable_reason}")
            continue
        print(f"{args.model} on {dev.describe()[:90]}: verification of T rows over a decode step: "
              f"{step_costs(model, [dev], rows=(2, 4, 5, 8))}")


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
    r.add_argument("--greedy", action="store_true", help="decode through runtime/greedy.py (the argmax on the device, "
                   "each step queued before its token is read), not eval's logits and np.argmax")
    e = sub.add_parser("events")
    e.add_argument("model")
    e.add_argument("--steps", type=int, default=50)
    e.add_argument("--prompt", type=int, default=64)
    e.add_argument("--work", default="/tmp")
    e.add_argument("--ablation-only", action="store_true")
    e.add_argument("--ctx", type=int, default=1024)
    e.add_argument("--rows", type=int, default=1, help="steps of this many rows with every row's logits")
    e.add_argument("--prefill", action="store_true", help="--rows rows as a prefill (the last row's logits): "
                   "each launch's GPU time")
    e.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="a constant of framework.plugins.cuda.kernels, for a sweep of the kernels' shapes")
    v = sub.add_parser("verify")
    v.add_argument("model")
    v.add_argument("--work", default="/tmp")
    v.add_argument("--cuda-only", action="store_true", help="cuda:0 alone (vulkan:0 too by default)")
    s = sub.add_parser("summarize")
    s.add_argument("--meta", required=True)
    s.add_argument("--trace", required=True)
    s.add_argument("--copy-meta")
    args = ap.parse_args()
    {"run": run, "events": events, "verify": verify, "summarize": summarize}[args.mode](args)


if __name__ == "__main__":
    main()
