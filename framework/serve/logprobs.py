"""Log-probabilities of the chosen tokens, and of the likeliest others, in OpenAI's two shapes.

The sampler's observer (runtime/sampling.py) hands over each step's logits (after any grammar's mask,
before the temperature: the model's own distribution) and the token chosen; an end-of-generation
token is not part of the answer and gets no entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..model.tokenizer import Tokenizer


@dataclass
class Entry:
    token: int
    logprob: float
    top: list[tuple[int, float]]      # the likeliest tokens, likeliest first


class Logprobs:
    """The Observer of one request: an Entry per token, taken a step at a time by the stream."""

    def __init__(self, tokenizer: Tokenizer, n_top: int):
        self.tok, self.n_top = tokenizer, n_top
        self.entries: list[Entry] = []
        self._taken = 0

    def __call__(self, logits: np.ndarray, token: int) -> None:
        if token in self.tok.eog_ids:
            return
        row = logits[:self.tok.n_vocab].astype(np.float64)
        finite = row[np.isfinite(row)]
        lp = row - (finite.max() + np.log(np.exp(finite - finite.max()).sum()))
        top = np.argpartition(-lp, self.n_top)[:self.n_top] if self.n_top else np.array([], dtype=int)
        top = top[np.argsort(-lp[top])]
        self.entries.append(Entry(token, float(lp[token]), [(int(i), float(lp[i])) for i in top]))

    def take(self) -> list[Entry]:
        """The entries since the last take."""
        new, self._taken = self.entries[self._taken:], len(self.entries)
        return new

    def text(self, token: int) -> str:
        return self.tok.token_bytes(token).decode("utf-8", errors="replace")

    def chat(self, entries: list[Entry]) -> dict:
        """OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs}], "refusal": None}."""
        def one(token: int, logprob: float) -> dict:
            return {"token": self.text(token), "logprob": _finite(logprob),
                    "bytes": list(self.tok.token_bytes(token))}
        return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, p) for t, p in e.top]}
                            for e in entries], "refusal": None}

    def completion(self, entries: list[Entry], offset: int) -> dict:
        """OpenAI's completions shape: tokens, token_logprobs, top_logprobs (text -> logprob), text_offset."""
        offsets, at = [], offset
        for e in entries:
            offsets.append(at)
            at += len(self.text(e.token))
        return {"tokens": [self.text(e.token) for e in entries],
                "token_logprobs": [_finite(e.logprob) for e in entries],
                "top_logprobs": [{self.text(t): _finite(p) for t, p in e.top} for e in entries],
                "text_offset": offsets}


def _finite(x: float) -> float:
    # JSON has no -inf: a token the grammar forbade (only in a top list) gets OpenAI's floor, -9999
    return x if np.isfinite(x) else -9999.0
