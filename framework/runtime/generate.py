"""Generation: prefill the prompt, then decode token by token, streaming text."""

from __future__ import annotations

import codecs
from collections.abc import Iterator
from dataclasses import dataclass

from .sampling import Sampler
from .session import Session


@dataclass
class Piece:
    token: int
    text: str      # the text this token completes (may be "" inside a multi-byte character)


def generate(session: Session, prompt_ids: list[int], n_predict: int, sampler: Sampler,
             stop_ids: frozenset[int] = frozenset()) -> Iterator[Piece]:
    """Yield each new token and its text; stops after n_predict tokens or at a stop id."""
    tok = session.model.tokenizer
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    logits = session.eval(prompt_ids)
    for _ in range(n_predict):
        token = sampler(logits)
        if token in stop_ids:
            return
        yield Piece(token, decoder.decode(tok.token_bytes(token)))
        if session.n_past >= session.n_ctx:
            return
        logits = session.eval([token])
