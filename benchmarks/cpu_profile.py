"""Where the cpu plugin's time goes: CPU seconds per op (products by weight type and shape) over a prefill
and over decode steps, on its default path (the GGUF blocks times 8-bit activations).

    python benchmarks/cpu_profile.py -m gemma3 --threads 1

CPU time (time.process_time) rather than wall time, so that other work on a shared host shows less; the
sum over ops against the step's total is what the interpreter's own loop (numpy glue) costs."""

from __future__ import annotations

import argparse
import collections
import time

import numba
import numpy as np

from framework.bench import prompt_ids
from framework.terminal import select_devices
from framework.model.default import model_path
from framework.model.model import Model
from framework.plugins.cpu import device as cpu_device
from framework.plugins.cpu.quantized import QuantizedWeight
from framework.runtime.session import Session

STATS: dict[tuple[str, str], list[float]] = collections.defaultdict(lambda: [0.0, 0])
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
        t = time.process_time()
        out = fn(*args)
        st = STATS[(PHASE[0], _label(node, args))]
        st[0] += time.process_time() - t
        st[1] += 1
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
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    cpu_device.CpuProgram.__init__ = _init_timed
    model = Model(model_path(args.model))
    session = Session(model, select_devices("cpu"), n_ctx=max(512, args.prompt_tokens + args.decode_tokens + 8))
    ids = prompt_ids(model.tokenizer, args.prompt_tokens)
    session.eval(ids)                                     # warm-up: compiles, page faults
    totals = {"prefill": 0.0, "decode": 0.0}
    for _ in range(args.repeats):
        session.reset()
        PHASE[0] = "prefill"
        t = time.process_time()
        logits = session.eval(ids)
        totals["prefill"] += time.process_time() - t
        PHASE[0] = "decode"
        t = time.process_time()
        for _ in range(args.decode_tokens):
            logits = session.eval([int(np.argmax(logits))])
        totals["decode"] += time.process_time() - t
    print(f"{args.model}, {args.threads} thread(s), CPU time: {session.devices[0].description}")
    for phase, per in (("prefill", args.repeats), ("decode", args.repeats * args.decode_tokens)):
        rows = sorted(((v[0] / per, v[1] / per, k) for (p, k), v in STATS.items() if p == phase), reverse=True)
        in_ops, total = sum(r[0] for r in rows), totals[phase] / per
        what = f"a prefill of {len(ids)} tokens" if phase == "prefill" else "a decode step"
        print(f"-- {what}: {total * 1e3:.2f} ms ({len(ids) / total if phase == 'prefill' else 1 / total:.1f} tok/s "
              f"of CPU time), {in_ops * 1e3:.2f} ms in ops, {(total - in_ops) * 1e3:.2f} ms between them")
        for t, n, k in rows:
            if t >= 0.01 * total:
                print(f"{t * 1e3:10.3f} ms {100 * t / total:5.1f}% {n:6.0f} calls  {k}")


if __name__ == "__main__":
    main()
