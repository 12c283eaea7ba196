"""Where the cpu plugin's time goes: time per op (products by weight type and shape) over a prefill and over
decode steps, on its default path (the GGUF blocks times 8-bit activations).

    python benchmarks/cpu_profile.py -m gemma3 --threads 1
    python benchmarks/cpu_profile.py -m ~/.cache/framework/models/qwen25-coder-1.5b.gguf --threads 2 \
        --prompt-tokens 16 --decode-tokens 16 --repeats 3
    python benchmarks/cpu_profile.py -m smollm2 --threads 2 --prompt-tokens 64 --parallel 8

--parallel N also times batched decode steps of N sequences (runtime/batch.py, as `framework bench --parallel`
and the server run them: one row a sequence, each with its own cells of one cache), in turns with the one-row
steps, so the two phases' ops can be held side by side: what a step of N rows costs against one row, op by op.

Each op's wall time (time.perf_counter) and CPU time (time.process_time: all the process's threads, so CPU
over wall is how many threads were busy, an OpenMP thread's spin while it waits for the others included),
and for a product the weight's bytes, which a decode step reads once each: bytes over wall time is the
product's effective read. On a shared host the CPU time shows less of the other work than the wall time;
the sum over ops against the step's total is what the interpreter's own loop (numpy glue) costs."""

from __future__ import annotations

import argparse
import collections
import os
import time

import numba
import numpy as np

from framework.bench import prompt_ids
from framework.terminal import select_devices
from framework.model.default import resolve_model
from framework.model.model import Model
from framework.plugins.cpu import device as cpu_device
from framework.plugins.cpu.quantized import QuantizedWeight
from framework.runtime.session import Session

# (phase, op label) -> [CPU seconds, wall seconds, calls, weight bytes]
STATS: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0.0, 0, 0])
PHASE = ["warm-up"]


def _label(node, args) -> str:
    if node.op != "MUL_MAT":
        return node.op
    w = args[0]
    if isinstance(w, QuantizedWeight):
        return f"MUL_MAT {w.dtype.name} {w.shape[0]}x{w.shape[1]}"
    return f"MUL_MAT float32 {'x'.join(map(str, np.shape(w)))}"


def _timed(node, fn):
    def run(*args):
        t, w = time.process_time(), time.perf_counter()
        out = fn(*args)
        wall, cpu = time.perf_counter() - w, time.process_time() - t
        st = STATS[(PHASE[0], _label(node, args))]
        st[0] += cpu
        st[1] += wall
        st[2] += 1
        st[3] += args[0].nbytes if node.op == "MUL_MAT" and isinstance(args[0], QuantizedWeight) else 0
        return out
    return run


_init = cpu_device.CpuProgram.__init__


def _init_timed(self, fragment, fast):
    _init(self, fragment, fast)
    self.steps = [(_timed(n, fn), out, ins) for n, (fn, out, ins) in zip(fragment.nodes, self.steps)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", default="gemma3")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=1, help="also batched decode steps of this many sequences")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    cpu_device.CpuProgram.__init__ = _init_timed
    model = Model(resolve_model(os.path.expanduser(args.model)))
    session = Session(model, select_devices("cpu"), n_ctx=max(512, args.prompt_tokens + args.decode_tokens + 8))
    ids = prompt_ids(model.tokenizer, args.prompt_tokens)
    logits = session.eval(ids)                            # warm-up: compiles, page faults (prefill's kernels,
    session.eval([int(np.argmax(logits))])                # then a decode step's: one-row products, its attention)
    totals = {"prefill": [0.0, 0.0], "decode": [0.0, 0.0], "batch": [0.0, 0.0]}      # CPU, wall seconds
    batch = _batch(session, ids, args.parallel) if args.parallel > 1 else None
    for _ in range(args.repeats):
        session.reset()
        PHASE[0] = "prefill"
        t, w = time.process_time(), time.perf_counter()
        logits = session.eval(ids)
        totals["prefill"][0] += time.process_time() - t
        totals["prefill"][1] += time.perf_counter() - w
        PHASE[0] = "decode"
        t, w = time.process_time(), time.perf_counter()
        for _ in range(args.decode_tokens):
            logits = session.eval([int(np.argmax(logits))])
        totals["decode"][0] += time.process_time() - t
        totals["decode"][1] += time.perf_counter() - w
        if batch is not None:
            PHASE[0] = "batch"
            t, w = time.process_time(), time.perf_counter()
            batch(args.decode_tokens)
            totals["batch"][0] += time.process_time() - t
            totals["batch"][1] += time.perf_counter() - w
    print(f"{args.model}, {args.threads} thread(s): {session.devices[0].description}")
    print(f"load average {os.getloadavg()}")
    phases = [("prefill", args.repeats), ("decode", args.repeats * args.decode_tokens)]
    phases += [("batch", args.repeats * args.decode_tokens)] if batch is not None else []
    for phase, per in phases:
        _report(phase, per, [v / per for v in totals[phase]], len(ids), args.parallel)


def _batch(session: Session, ids: list[int], n: int):
    """A function that runs `steps` batched decode steps of n sequences, each after its own prompt of ids (made
    here, outside the profile: PHASE is 'warm-up')."""
    from framework.runtime.batch import Batch, Part
    b = Batch(Session(session.model, session.devices, n_ctx=n * session.n_ctx, share_model_with=session))
    last = [b.step([Part(seq, ids)])[0] for seq in range(n)]
    state = {"last": b.step([Part(seq, [int(np.argmax(x))]) for seq, x in enumerate(last)])}     # compiled

    def steps(count: int) -> None:
        for _ in range(count):
            state["last"] = b.step([Part(seq, [int(np.argmax(x))]) for seq, x in enumerate(state["last"])])
    return steps


def _report(phase: str, per: int, total: list[float], n_ids: int, n_seq: int) -> None:
    rows = sorted(((v[1] / per, v[0] / per, v[2] / per, v[3] / per, k) for (p, k), v in STATS.items() if p == phase),
                  reverse=True)
    cpu, wall = total
    in_ops, nbytes = sum(r[0] for r in rows), sum(r[3] for r in rows)
    what = {"prefill": f"a prefill of {n_ids} tokens", "decode": "a decode step",
            "batch": f"a batched decode step of {n_seq} sequences"}[phase]
    rate = n_ids / wall if phase == "prefill" else (n_seq if phase == "batch" else 1) / wall
    print(f"-- {what}: {wall * 1e3:.2f} ms wall ({rate:.1f} tok/s), {cpu * 1e3:.2f} ms CPU "
          f"({cpu / wall:.2f} threads busy); {in_ops * 1e3:.2f} ms in ops, {(wall - in_ops) * 1e3:.2f} ms between "
          f"them; products' weights {nbytes / 2**20:.1f} MiB ({nbytes / wall / 1e9:.2f} GB/s over the whole step)")
    print(f"{'wall ms':>10s} {'%':>5s} {'busy':>5s} {'calls':>6s} {'MiB':>8s} {'GB/s':>6s}  op")
    for t, c, n, b, k in rows:
        if t >= 0.005 * wall:
            rate = f"{b / t / 1e9:6.2f}" if b else f"{'':6s}"
            print(f"{t * 1e3:10.3f} {100 * t / wall:5.1f} {c / t:5.2f} {n:6.0f} {b / 2**20:8.2f} {rate}  {k}")


if __name__ == "__main__":
    main()
