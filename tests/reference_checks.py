"""The bounds of tests/reference/README.md, as functions any device's tests can call.

- teacher-forced greedy: at every position llama.cpp's token is the top-1 or within 1.0 of the
  top logit, and it is the top-1 at 90% or more of the positions;
- perplexity on the text within 1% of llama.cpp's;
- top-1 agreement with llama.cpp on the text at 94% or more of positions.
"""

from __future__ import annotations

import numpy as np

from framework.runtime.perplexity import perplexity

MAX_GAP = 1.0
MIN_GREEDY_AGREEMENT = 0.90
MAX_PPL_RATIO_ERROR = 0.01
MIN_TOP1_AGREEMENT = 0.94


def _forced_rows(session, p: dict):
    """(position, llama.cpp's token, our logits there): the prompt and llama.cpp's tokens in one prefill."""
    session.reset()
    logits = session.eval(p["ids"] + p["greedy_ids"], all_logits=True)
    start = len(p["ids"]) - 1
    for i, want in enumerate(p["greedy_ids"]):
        yield i, want, logits[start + i]


def _decoded_rows(session, p: dict):
    """The same through the decode path: the prompt in one prefill, then llama.cpp's tokens one decode
    step at a time (the matrix-vector kernels, the cache read back every step)."""
    session.reset()
    row = session.eval(p["ids"])
    for i, want in enumerate(p["greedy_ids"]):
        yield i, want, row
        if i + 1 < len(p["greedy_ids"]):
            row = session.eval([want])


def teacher_forced(session, ref: dict, by_decode: bool = False) -> tuple[int, int, float, list]:
    """Feed each prompt plus llama.cpp's greedy tokens; compare every prediction."""
    agree = total = 0
    worst = 0.0
    misses = []
    for p in ref["prompts"]:
        for i, want, row in (_decoded_rows if by_decode else _forced_rows)(session, p):
            gap = float(row.max() - row[want])
            total += 1
            agree += int(row.argmax() == want)
            worst = max(worst, gap)
            if gap > MAX_GAP:
                misses.append((p["prompt"], i, want, int(row.argmax()), gap))
    return agree, total, worst, misses


def assert_teacher_forced(session, ref: dict, by_decode: bool = False) -> None:
    agree, total, worst, misses = teacher_forced(session, ref, by_decode)
    assert not misses, f"llama.cpp's token sat more than {MAX_GAP} below the top logit: {misses}"
    assert agree >= MIN_GREEDY_AGREEMENT * total, f"greedy top-1 agreement {agree}/{total} is under 90%"


def assert_text_metrics(session, ref: dict, arrays: dict, tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    assert ids == ref["text"]["ids"]
    result = perplexity(session, ids, window=len(ids))
    want = ref["text"]["perplexity"]
    assert abs(result.perplexity / want - 1) <= MAX_PPL_RATIO_ERROR, \
        f"perplexity {result.perplexity:.4f} vs llama.cpp's {want:.4f}"
    top1 = arrays[ref["text"]["top1_key"]]
    agreement = float(np.mean(result.top1[:len(top1)] == top1))
    assert agreement >= MIN_TOP1_AGREEMENT, f"top-1 agreement with llama.cpp {agreement:.3f} is under 0.94"


def assert_decode_equals_prefill(session, ref: dict, n_follow: int, tol: float) -> None:
    """Decoding llama.cpp's greedy tokens one at a time gives the logits one prefill of the whole
    sequence gives (so the KV cache is written and read at the right rows)."""
    p = ref["prompts"][0]
    follow = p["greedy_ids"][:n_follow]
    session.reset()
    whole = session.eval(p["ids"] + follow, all_logits=True)
    session.reset()
    session.eval(p["ids"])
    for i, tok in enumerate(follow):
        np.testing.assert_allclose(session.eval([tok]), whole[len(p["ids"]) + i], rtol=tol, atol=tol)
