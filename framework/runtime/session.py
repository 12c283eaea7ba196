"""A session: one model on a list of devices, a KV cache, and the steps that fill it.

Prefill runs in chunks of n_batch tokens, decode one token at a time. Each distinct step
shape gets its graph and plan once; the KV length a step attends over is rounded up to
a multiple of KV_PAD (as llama.cpp pads n_kv), so decode reuses a handful of plans.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..contract import Device
from ..core.scheduler import Executor, Plan, make_plan
from ..model.arch.base import KVCache
from ..model.model import Model

KV_PAD = 256


class ContextFullError(ValueError):
    """The tokens do not fit in the context."""


@dataclass
class StepStats:
    tokens: int = 0
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class Session:
    def __init__(self, model: Model, devices: list[Device], n_ctx: int = 2048, n_batch: int = 512, progress=None):
        if n_ctx < 1 or n_batch < 1:
            raise ValueError(f"n_ctx ({n_ctx}) and n_batch ({n_batch}) must be positive")
        self.model, self.devices, self.n_ctx, self.n_batch = model, devices, n_ctx, n_batch
        self.cache = KVCache(model.hp, n_ctx)
        self.executor = Executor(devices, model.weight_bytes)
        self.progress = progress
        self.n_past = 0
        self.plans: dict[tuple, tuple[Plan, object]] = {}
        self.prefill = StepStats()
        self.decode = StepStats()

    def reset(self) -> None:
        self.n_past = 0

    def plan(self, n_tokens: int, n_past: int = 0, n_out: int | None = 1) -> tuple[Plan, object]:
        n_kv = min(self.n_ctx, -(-(n_past + n_tokens) // KV_PAD) * KV_PAD)
        key = (n_tokens, n_kv, n_out)
        if key not in self.plans:
            graph, inp = self.model.build_step(n_tokens, n_kv, n_out, self.cache)
            graph.meta["phase"] = "decode" if n_tokens == 1 else "prefill"
            plan = make_plan(graph, self.devices)
            self.executor.prepare(plan, self.progress)
            self.plans[key] = (plan, inp)
        return self.plans[key]

    def eval(self, tokens: list[int], all_logits: bool = False) -> np.ndarray:
        """Append tokens to the context; return logits of the last token, or of every token."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("eval() needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(f"{self.n_past} tokens in the context plus {len(tokens)} new ones exceed the "
                                   f"context length {self.n_ctx}; raise --ctx (the model was trained with "
                                   f"{self.model.hp.n_ctx_train})")
        bad = [t for t in tokens if not 0 <= t < self.model.hp.n_vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary (0..{self.model.hp.n_vocab - 1})")
        out = []
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start:start + self.n_batch]
            out.append(self._step(chunk, all_logits))
        return np.concatenate(out) if all_logits else out[-1][-1]

    def _step(self, chunk: list[int], all_logits: bool) -> np.ndarray:
        t0 = time.perf_counter()
        n = len(chunk)
        plan, inp = self.plan(n, self.n_past, None if all_logits else 1)
        n_kv = inp.mask.shape[1]
        pos = np.arange(self.n_past, self.n_past + n, dtype=np.int32)
        values = {id(inp.tokens): np.asarray(chunk, dtype=np.int32), id(inp.pos): pos, id(inp.kv_rows): pos,
                  id(inp.mask): causal_mask(pos, n_kv, 0)}
        if inp.mask_swa is not None:
            values[id(inp.mask_swa)] = causal_mask(pos, n_kv, self.model.hp.sliding_window)
        if inp.out_ids is not None:
            values[id(inp.out_ids)] = np.array([n - 1], dtype=np.int32)
        (logits,) = self.executor.run(plan, values)
        self.n_past += n
        stats = self.decode if n == 1 else self.prefill
        stats.tokens += n
        stats.seconds += time.perf_counter() - t0
        return logits


def causal_mask(pos: np.ndarray, n_kv: int, window: int) -> np.ndarray:
    """0 where query position p may see cache row s (s <= p, and p - s < window when windowed), else -inf."""
    s = np.arange(n_kv, dtype=np.int64)[None, :]
    p = pos.astype(np.int64)[:, None]
    visible = s <= p
    if window:
        visible &= (p - s) < window
    return np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)
