"""Choosing the next token from logits: greedy, or temperature with top-k and top-p."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0     # 0: greedy
    top_k: int = 40              # 0: no top-k cut
    top_p: float = 0.95          # 1.0: no nucleus cut
    seed: int | None = None

    def check(self) -> "SamplingParams":
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"--temp must be 0 (greedy) or positive (and finite), got {self.temperature}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"--seed must be 0 or more, got {self.seed}")
        if self.top_k < 0:
            raise ValueError(f"--top-k must be 0 (off) or positive, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        return self


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params.check()
        self.rng = np.random.default_rng(params.seed)

    @property
    def greedy(self) -> bool:
        return self.params.temperature == 0

    def __call__(self, logits: np.ndarray) -> int:
        if self.greedy:
            return int(np.argmax(logits))
        idx, probs = self.candidates(logits)
        return int(idx[self.rng.choice(len(idx), p=probs)])

    def candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The token ids sampling can pick (temperature, then top-k, then top-p) and their probabilities."""
        p = self.params
        logits = logits.astype(np.float64) / p.temperature
        idx = np.argsort(-logits)
        if p.top_k:
            idx = idx[:p.top_k]
        probs = np.exp(logits[idx] - logits[idx[0]])
        probs /= probs.sum()
        if p.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1
            idx, probs = idx[:keep], probs[:keep] / probs[:keep].sum()
        return idx, probs

    def distribution(self, logits: np.ndarray) -> np.ndarray:
        """The probability of every token id under this sampler (what __call__ draws from), float64."""
        out = np.zeros(logits.shape[-1], dtype=np.float64)
        if self.greedy:
            out[int(np.argmax(logits))] = 1.0
            return out
        idx, probs = self.candidates(logits)
        out[idx] = probs
        return out
