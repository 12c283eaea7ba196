"""Perplexity: score every token of each window after its first, given all tokens before it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .session import Session

ROWS = 64


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
        logits = session.eval(chunk, all_logits=True)
        for r in range(0, len(chunk), ROWS):
            # float64, a block of rows at a time: a whole window at once would take 8 bytes a logit in each of
            # three temporaries (about 3 GB for 500 positions of a 262144-token vocabulary)
            block = logits[r:r + ROWS].astype(np.float64)
            top = block.max(axis=1, keepdims=True)
            lse = np.log(np.exp(block - top).sum(axis=1)) + top[:, 0]
            scored = np.arange(r, min(r + ROWS, len(chunk) - 1))
            nll.append(lse[:len(scored)] - block[scored - r, np.asarray(chunk)[scored + 1]])
            top1.append(block.argmax(axis=1))
        if progress:
            progress(i + 1, len(starts))
    nll_all = np.concatenate(nll)
    return PerplexityResult(float(np.exp(nll_all.mean())), nll_all, np.concatenate(top1), len(ids),
                            time.perf_counter() - t0)
