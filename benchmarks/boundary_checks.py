"""What the executor's fragment-boundary checks cost: decode tokens per second with and without them.

    .venv/bin/python benchmarks/boundary_checks.py [--model smollm2] [--runs 7] [--tokens 16]

The checks (core/scheduler/executor.py): every program's outputs are counted and their shapes and
dtypes compared with the fragment's tensors (always), the logits are checked to be finite (always),
and every output's values are checked to be finite for devices of plugins outside this distribution
(the example plugin here) or for all with --check-values. "without" replaces the check of each
fragment's outputs by nothing (the logits check stays: it is one vector). Three set-ups, each timed
with and without, interleaved run by run so that the machine's drift hits both alike:

  cpu                   the CPU plugin alone: one fragment per step
  cpu --check-values    the same, its outputs' values checked too
  example:0,cpu         the example plugin refusing ROPE: two fragments per layer, example:0's values
                        checked (it is outside this distribution), copies between the devices

Prints the median decode tok/s of each and the ratio (with / without); the order of the two is
swapped every run. On a shared machine whole-run rates drift by more than the checks cost, so it also
prints the time spent inside the checks themselves per decode step, against the step's time: the
direct measure of their cost.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from framework.core.scheduler.executor import Executor  # noqa: E402


def decode_rate(session, prompt: list[int], tokens: int, after_prefill=lambda: None) -> float:
    session.reset()
    logits = session.eval(prompt)
    after_prefill()
    t0 = time.perf_counter()
    for _ in range(tokens):
        logits = session.eval([int(np.argmax(logits))])
    return tokens / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2", choices=("smollm2", "gemma3"))
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=16, help="decode tokens per run")
    args = ap.parse_args()

    from framework.registry import default_registry
    from framework.model.default import MODELS
    from framework.model.model import Model
    from framework.runtime.session import Session
    from framework_plugin_example import ExampleDevice

    model = Model(MODELS[args.model]())
    cpu = default_registry().select("cpu")[0]
    prompt = model.tokenizer.encode("The capital of France is")
    setups = {"cpu": ([cpu], False), "cpu --check-values": ([cpu], True),
              "example:0,cpu": ([ExampleDevice(refuse="ROPE"), cpu], False)}
    checked = Executor._check_outputs
    inside = [0.0]

    def timed(*a, **k):
        t0 = time.perf_counter()
        try:
            return checked(*a, **k)
        finally:
            inside[0] += time.perf_counter() - t0

    rates: dict[tuple[str, str], list[float]] = {}
    shares: dict[str, list[float]] = {}
    inside_ms: dict[str, list[float]] = {}
    for name, (devices, check_values) in setups.items():
        session = Session(model, devices, n_ctx=256, check_values=check_values)
        decode_rate(session, prompt, 2)                                     # plans, loads, compiles
        for i in range(args.runs):
            for mode in (("with", "without") if i % 2 == 0 else ("without", "with")):
                Executor._check_outputs = timed if mode == "with" else (lambda *a, **k: None)
                try:
                    rate = decode_rate(session, prompt, args.tokens, lambda: inside.__setitem__(0, 0.0))
                finally:
                    Executor._check_outputs = checked
                rates.setdefault((name, mode), []).append(rate)
                if mode == "with":
                    shares.setdefault(name, []).append(inside[0] / (args.tokens / rate))
                    inside_ms.setdefault(name, []).append(inside[0] / args.tokens * 1e3)
    print(f"{args.model}, decode tok/s, median of {args.runs} runs of {args.tokens} tokens each")
    print(f"{'set-up':<22}{'with checks':>12}{'without':>10}{'ratio':>8}{'checks ms/token':>17}{'of the step':>13}")
    for name in setups:
        w, wo = statistics.median(rates[(name, "with")]), statistics.median(rates[(name, "without")])
        ms, share = statistics.median(inside_ms[name]), statistics.median(shares[name])
        print(f"{name:<22}{w:>12.1f}{wo:>10.1f}{w / wo:>8.3f}{ms:>17.3f}{share:>13.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
