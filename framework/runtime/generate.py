"""Generation: prefill the prompt, then decode token by token, streaming text."""

from __future__ import annotations

import codecs
from collections.abc import Generator
from dataclasses import dataclass

from .greedy import greedy_tokens
from .sampling import Sampler
from .session import Session


@dataclass
class Piece:
    token: int
    text: str      # the text this token completes (may be "" inside a multi-byte character)


FINISH_STOP = "stop"        # a stop id (end of generation) was sampled
FINISH_LENGTH = "length"    # n_predict tokens, or the context is full


def generate(session: Session, prompt_ids: list[int], n_predict: int, sampler: Sampler,
             stop_ids: frozenset[int] = frozenset()) -> Generator[Piece, None, str]:
    """Yield each new token and its text; stops after n_predict tokens or at a stop id, and returns
    why (FINISH_STOP or FINISH_LENGTH, the value of the StopIteration).

    The first token comes from the prefill's logits; each later one from a decode step on the token
    before it. The last token is not run through the model (nothing would read its logits), so n tokens
    take n - 1 decode steps, as llama.cpp counts them ("eval time ... / n - 1 runs")."""
    tok = session.model.tokenizer
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    if sampler.greedy and sampler.mask is None and sampler.observe is None:
        tokens = greedy_tokens(session, prompt_ids, n_predict)    # the argmax where the logits are made
        try:
            for token in tokens:
                if token in stop_ids:
                    return FINISH_STOP
                yield Piece(token, decoder.decode(tok.token_bytes(token)))
        finally:
            tokens.close()          # a step queued past the caller's last token leaves the context
        return FINISH_LENGTH
    logits = session.eval(prompt_ids, prompt=True)
    for i in range(n_predict):
        token = sampler(logits)
        if token in stop_ids:
            return FINISH_STOP
        yield Piece(token, decoder.decode(tok.token_bytes(token)))
        if i == n_predict - 1 or session.n_past >= session.n_ctx:     # the last token's logits are not needed
            return FINISH_LENGTH
        logits = session.eval([token])
    return FINISH_LENGTH    # n_predict == 0
