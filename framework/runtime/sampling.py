"""Choosing the next token from logits: greedy, or temperature with top-k, top-p and min-p; optionally
under a token mask (structured output) and watched by an observer (log-probabilities)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class TokenMask(Protocol):
    """What a grammar says of the next token (serve/structured.py holds the one the server uses)."""

    def allowed(self) -> np.ndarray:
        """A bool per token id of the vocabulary: may it come next?"""

    def accept(self, token: int) -> None:
        """The token chosen; the mask of the next step follows it."""


# called with the logits a token was drawn from (masked, before temperature) and the token drawn
Observer = Callable[[np.ndarray, int], None]


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0     # 0: greedy
    top_k: int = 40              # 0: no top-k cut
    top_p: float = 0.95          # 1.0: no nucleus cut
    seed: int | None = None
    min_p: float = 0.0           # 0: no cut; else drop tokens less likely than min_p times the likeliest

    def check(self) -> "SamplingParams":
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"--temp must be 0 (greedy) or positive (and finite), got {self.temperature}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"--seed must be 0 or more, got {self.seed}")
        if self.top_k < 0:
            raise ValueError(f"--top-k must be 0 (off) or positive, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"--min-p must be in [0, 1], got {self.min_p}")
        return self


class Sampler:
    """``mask`` (optional): the tokens a grammar allows, applied to the logits of every step, on the host
    whatever device computed them. ``observe`` (optional): told of every step's logits and its token."""

    def __init__(self, params: SamplingParams, mask: TokenMask | None = None, observe: Observer | None = None):
        self.params = params.check()
        self.rng = np.random.default_rng(params.seed)
        self.mask, self.observe = mask, observe

    @property
    def greedy(self) -> bool:
        return self.params.temperature == 0

    def __call__(self, logits: np.ndarray) -> int:
        if self.mask is not None:
            logits = masked(logits, self.mask.allowed())
        if self.greedy:
            token = int(np.argmax(logits))
        else:
            idx, probs = self.candidates(logits)
            token = int(idx[self.rng.choice(len(idx), p=probs)])
        if self.observe is not None:
            self.observe(logits, token)
        if self.mask is not None:
            self.mask.accept(token)
        return token

    def candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The token ids sampling can pick (temperature, then top-k, top-p, min-p) and their probabilities."""
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
        if p.min_p > 0.0:          # probs are sorted: the likeliest first
            keep = int(np.count_nonzero(probs >= p.min_p * probs[0]))
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


def masked(logits: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """The logits with every token the mask forbids at -inf. The model's rows may be longer than the
    tokenizer's vocabulary (padding): tokens past the mask are forbidden too."""
    n = min(len(allowed), logits.shape[-1])
    out = np.full(logits.shape[-1], -np.inf, dtype=np.float32)
    out[:n] = np.where(allowed[:n], logits[:n], -np.inf)
    return out
