"""Perplexity: score every token of each window after its first, given all tokens before it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .session import Session


@dataclass
class PerplexityResult:
    perplexity: float
    nll: np.ndarray          # per scored token
    top1: np.ndarray         # the model's top-1 prediction at every position of every window
    n_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / self.seconds if self.seconds else 0.0


def perplexity(session: Session, ids: list[int], window: int, progress=None) -> PerplexityResult:
    if len(ids) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, the text has {len(ids)}")
    if window < 2:
        raise ValueError(f"the window (--ctx) must be at least 2 tokens, got {window}")
    nll, top1 = [], []
    t0 = time.perf_counter()
    starts = list(range(0, len(ids), window))
    for i, start in enumerate(starts):
        chunk = ids[start:start + window]
        if len(chunk) < 2:
            break
        session.reset()
        logits = session.eval(chunk, all_logits=True).astype(np.float64)
        top = logits.max(axis=1, keepdims=True)
        lse = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
        nll.append(lse[:-1] - logits[np.arange(len(chunk) - 1), chunk[1:]])
        top1.append(logits.argmax(axis=1))
        if progress:
            progress(i + 1, len(starts))
    nll_all = np.concatenate(nll)
    return PerplexityResult(float(np.exp(nll_all.mean())), nll_all, np.concatenate(top1), len(ids),
                            time.perf_counter() - t0)
