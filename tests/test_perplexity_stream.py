"""Perplexity over a file as a stream: the same token ids as tokenizing the whole text, the same scores as
the in-memory path, text consumed a batch at a time, and progress with an estimate of the time left."""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import load_model, reference, reference_text

from framework.runtime.perplexity import Progress, perplexity, perplexity_of_file
from framework.runtime.session import Session


def _text(n_chars: int) -> str:
    """Pieces of both reference texts joined by varied whitespace, non-ASCII text and digits."""
    src = reference_text(reference("smollm2")[0]) + reference_text(reference("gemma3")[0])
    rng = random.Random(4)
    parts = []
    while sum(map(len, parts)) < n_chars:
        start = rng.randrange(len(src) // 2)
        parts.append(src[start:start + rng.randrange(50, 1500)])
        parts.append(rng.choice(["\n", " ", "\n\n", "", "  \t", " 1234567 ", " naïve café 日本語 😀 "]))
    return "".join(parts)[:n_chars]


@pytest.mark.parametrize("name,n_chars", [("smollm2", 60_000), ("gemma3", 30_000)])
def test_streamed_ids_are_the_whole_texts(name, n_chars):
    tok = load_model(name).tokenizer
    text = _text(n_chars)
    consumed = []

    def pieces():
        for i in range(0, len(text), 1000):
            consumed.append(i)
            yield text[i:i + 1000]

    stream = tok.encode_stream(pieces(), window=4000, overlap=400)
    first = next(stream)
    assert len(consumed) < 10                  # the first ids come out after a few pieces: it streams
    batches = [first, *stream]
    assert len(batches) > 5
    assert [t for b in batches for t in b] == tok.encode(text)


@pytest.fixture(scope="module")
def short_session(registry):
    return Session(load_model("smollm2"), registry.select("cpu"), n_ctx=64, n_layers=2)


def test_file_and_list_give_the_same_scores_and_progress(short_session, tmp_path):
    full = reference_text(reference("smollm2")[0])
    text = full[:full.index(" ", 900)]                  # a few windows are enough
    path = tmp_path / "text.txt"
    path.write_bytes(text.encode("utf-8"))
    ids = short_session.model.tokenizer.encode(text)
    seen: list[Progress] = []
    streamed = perplexity_of_file(short_session, path, 64, progress=seen.append)
    listed = perplexity(short_session, ids, 64)
    np.testing.assert_array_equal(streamed.nll, listed.nll)
    assert streamed.n_tokens == len(ids) and streamed.perplexity == listed.perplexity
    assert [p.windows for p in seen] == list(range(1, len(seen) + 1)) and len(seen) == -(-len(ids) // 64)
    fractions = [p.fraction for p in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0 and 0 < fractions[0] < 1
    assert seen[0].seconds_left is not None and seen[0].seconds_left > 0 and seen[-1].seconds_left == 0
