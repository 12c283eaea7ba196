"""Dispatches a step of both models on vulkan:0, by kernel, with each FRAMEWORK_VULKAN_UNFUSE setting: the
plugin lowers the step's graph (nothing runs, no weight is loaded), so this is the same figure on any
Vulkan adapter for the same path. --gpu-kernels takes the kernels a GPU adapter takes where the adapter
is a CPU one (lavapipe), as the tests do; on a GPU it changes nothing.

    python benchmarks/vulkan_dispatches.py --gpu-kernels                  # decode, every fusion on / off
    python benchmarks/vulkan_dispatches.py --tokens 256 --unfuse ";all"   # prefill of 256 tokens

The decode step attends over n_kv = 512 cache rows, as the H200 benchmark's steps do (256 prompt tokens,
then 128 generated, padded to a multiple of 256).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from framework.core.scheduler import make_plan
from framework.model.arch.base import KVCache
from framework.model.default import model_path
from framework.model.model import Model
from framework.plugins.vulkan.device import devices
from framework.plugins.vulkan.fusion import UNFUSE_ENV


def dispatches(dev, model, n_tokens: int, n_kv: int) -> collections.Counter:
    graph, _ = model.build_step(n_tokens, n_kv, 1, KVCache(model.hp, max(n_kv, n_tokens)))
    kinds: collections.Counter = collections.Counter()
    for f in make_plan(graph, [dev]).fragments:
        kinds.update(st.name.split(" ")[0] for st in dev.compile(f).steps)
    return kinds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--tokens", type=int, default=1, help="tokens of the step (1: decode)")
    ap.add_argument("--kv", type=int, default=512, help="cache rows the step attends over")
    ap.add_argument("--unfuse", default=";all", help="';'-separated FRAMEWORK_VULKAN_UNFUSE settings")
    ap.add_argument("--gpu-kernels", action="store_true", help="a CPU adapter takes a GPU's kernels (and fusions)")
    args = ap.parse_args()
    dev = devices()[0]
    if not dev.available:
        raise SystemExit(f"vulkan:0 is unavailable: {dev.unavailable_reason}")
    if args.gpu_kernels:
        dev.cpu_adapter = False
    print(f"{dev.name}: {dev.data['adapter']}" + (" (a GPU's kernels)" if args.gpu_kernels else ""))
    for name in args.models.split(","):
        model = Model(model_path(name))
        for setting in args.unfuse.split(";"):
            os.environ[UNFUSE_ENV] = setting
            kinds = dispatches(dev, model, args.tokens, args.kv)
            by_kind = ", ".join(f"{k} {v}" for k, v in sorted(kinds.items(), key=lambda kv: -kv[1]))
            print(f"{name}, {args.tokens} token(s), {UNFUSE_ENV}={setting!r}: {sum(kinds.values())} dispatches "
                  f"({by_kind})")
    os.environ.pop(UNFUSE_ENV, None)


if __name__ == "__main__":
    main()
