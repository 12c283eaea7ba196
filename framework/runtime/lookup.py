"""Prompt lookup (``--draft ngram[:N]``): drafts copied from the text itself, no draft model.

The draft is the continuation of the latest earlier occurrence of the last N tokens in the prompt and the
text generated so far (llama.cpp's lookup decoding, vLLM's n-gram proposer). It pays where the output
copies spans of the input (editing code, extracting, rewriting); on free text it rarely finds a match,
and a round without a match is an ordinary decode step. Its proposals are deterministic: as a
distribution, each is all its mass on one token, which speculative rejection sampling accepts with the
target's probability of that token, so sampling keeps the target's distribution.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

DEFAULT_MATCH = 3


def lookup(history: list[int], n_match: int, n_draft: int) -> list[int]:
    """Up to n_draft tokens that followed the latest earlier occurrence of history's last n_match tokens;
    [] where they never occurred before (or history is too short)."""
    if n_draft < 1 or len(history) <= n_match:
        return []
    h = np.asarray(history, dtype=np.int64)
    key = h[-n_match:]
    # windows that start before the key itself and have at least one token after them
    windows = sliding_window_view(h[:-1], n_match)[: len(h) - n_match]
    hits = np.flatnonzero((windows == key).all(axis=1))
    if hits.size == 0:
        return []
    start = int(hits[-1]) + n_match
    return h[start:start + n_draft].tolist()


def is_lookup(spec: str) -> bool:
    """Whether a --draft SPEC names prompt lookup (ngram or ngram:N)."""
    return spec == "ngram" or spec.startswith("ngram:")


def parse_match(spec: str) -> int:
    """N of ``ngram[:N]`` (DEFAULT_MATCH without one); ValueError naming the spec otherwise."""
    _, _, n = spec.partition(":")
    if not n:
        return DEFAULT_MATCH
    if not n.isdigit() or int(n) < 1:
        raise ValueError(f"--draft {spec}: N must be a whole number of tokens, at least 1 (ngram:N)")
    return int(n)

