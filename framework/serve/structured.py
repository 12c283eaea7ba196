"""Structured output: a JSON schema, any JSON object, or a GBNF grammar, as a mask over the next token.

llguidance (docs/serve.md, "Structured output", says why it and not xgrammar or outlines-core)
compiles the grammar against the model's own vocabulary, read from the GGUF file; every step, the
sampler puts the tokens the grammar forbids at -inf before it chooses (runtime/sampling.py). The
mask is computed on the host over the logits, so it works whatever device computed them.

A request asks for one grammar at most: OpenAI's `response_format` (`json_object`, `json_schema`)
or llama-server's `json_schema` or `grammar` (GBNF). A grammar llguidance cannot compile is a 400
naming the field and llguidance's words.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import llguidance as llg
import numpy as np

from ..model.tokenizer import CONTROL, UNKNOWN, Tokenizer
from .errors import ApiError
from .schemas import Generation

# compact JSON unless the schema's "x-guidance" says otherwise: free whitespace costs tokens, and a small
# model may spend its max_tokens on newlines
JSON_LAYOUT = {"whitespace_flexible": False}


@dataclass(frozen=True)
class Grammar:
    field: str     # the request field it came from, for errors
    text: str      # llguidance's grammar


def grammar_of(req: Generation) -> Grammar | None:
    """The grammar a request asks for, or None; two ways of asking at once are refused."""
    asked = [name for name in ("response_format", "json_schema", "grammar") if _asks(req, name)]
    if len(asked) > 1:
        raise ApiError(400, f"{' and '.join(repr(a) for a in asked)} each constrain the output; give one",
                       code="invalid_value", param=asked[1])
    if not asked:
        return None
    field = asked[0]
    try:
        if field == "grammar":
            return Grammar(field, llg.grammar_from("gbnf", req.grammar))
        schema = req.json_schema if field == "json_schema" else req.response_format.schema_dict()
        return Grammar(field, llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT))
    except ValueError as e:
        raise _bad(field, str(e)) from None


def _asks(req: Generation, name: str) -> bool:
    value = getattr(req, name)
    return value is not None and (name != "response_format" or value.type != "text")


def _bad(field: str, words: str) -> ApiError:
    return ApiError(400, f"'{field}' cannot be compiled into a grammar: {words}", code="invalid_grammar", param=field)


class GrammarMask:
    """The sampler's TokenMask for one request: llguidance's matcher over the model's vocabulary."""

    def __init__(self, tokenizer: Tokenizer, grammar: Grammar):
        self.n_vocab = tokenizer.n_vocab
        lltok = ll_tokenizer(tokenizer)
        failed, words = llg.LLMatcher.validate_grammar_with_warnings(grammar.text, lltok)
        if failed:
            raise _bad(grammar.field, "; ".join(words))
        self.matcher = llg.LLMatcher(lltok, grammar.text, log_level=0)
        if self.matcher.is_error():
            raise _bad(grammar.field, self.matcher.get_error())

    def allowed(self) -> np.ndarray:
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[:self.n_vocab].view(bool)

    def accept(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            # the sampler chose only among allowed tokens: this is llguidance's error, say it
            raise RuntimeError(f"the grammar refused token {token} it had allowed: {self.matcher.get_error()}")


_lltok: dict[int, tuple[Tokenizer, llg.LLTokenizer]] = {}     # id -> the tokenizer (kept, so its id stays its own)
_lltok_lock = threading.Lock()


def ll_tokenizer(tokenizer: Tokenizer) -> llg.LLTokenizer:
    """llguidance's view of a GGUF vocabulary, built once per tokenizer (a third of a second for 49k tokens)."""
    with _lltok_lock:
        if id(tokenizer) not in _lltok:
            _lltok[id(tokenizer)] = tokenizer, llg.LLTokenizer(llg.TokenizerWrapper(_Vocabulary(tokenizer)),
                                                               eos_token=sorted(tokenizer.eog_ids))
        return _lltok[id(tokenizer)][1]


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads: every token's bytes, which are special, and an encoder."""

    def __init__(self, tokenizer: Tokenizer):
        self.eos_token_id, self.bos_token_id = tokenizer.eos_id, tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(i, special=True) for i in range(tokenizer.n_vocab)]
        self.special_token_ids = [i for i, t in enumerate(tokenizer.token_types) if t in (CONTROL, UNKNOWN)]
        self._encode = tokenizer.encode

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("text, not bytes")        # the wrapper probes with bytes, then sends text
        return self._encode(text, add_bos=False)
