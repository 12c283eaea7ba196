"""Tokenizers rebuilt from GGUF metadata that reproduce llama.cpp's token ids.

Two ``tokenizer.ggml.model`` types are supported:

- ``"gpt2"``: byte-level BPE.  The merging is done by the HF ``tokenizers`` library, which
  applies merges by rank exactly like llama.cpp's llm_tokenizer_bpe; the pre-tokenizer is
  rebuilt from llama.cpp's regex list for ``tokenizer.ggml.pre``.
- ``"llama"``: SentencePiece-style BPE (llama.cpp's llm_tokenizer_spm): adjacent symbols are
  merged by highest token score, unknown characters fall back to ``<0xXX>`` byte tokens.
  ``tokenizers`` has no score-driven merge model, so this part is hand-written.

Both share llama.cpp's special-token partitioning (``tokenizer_st_partition``): user-defined
tokens are cut out of the text before the BPE runs, even when ``parse_special`` is False;
control and unknown tokens only when it is True.  Reference: llama.cpp src/llama-vocab.cpp.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from .metadata import MetadataError, get_bool, get_int, get_list, get_str

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SUPPORTED_MODELS = ("gpt2", "llama")

# Token texts llama.cpp recognises by text when the GGUF has no explicit id (llama_vocab::load).
# Each detected token is forced to CONTROL type, which matters for partitioning and decoding.
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# Texts that end generation wherever they appear in the vocabulary.
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
              "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
              "<end_of_utterance>")

# llama.cpp's pre-tokenizers of gpt2 vocabularies, by tokenizer.ggml.pre (llm_tokenizer_bpe's
# regex_exprs, applied in order, and the flags llama_vocab::load sets for each).
_GPT2_REGEX = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3_REGEX = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_QWEN2_REGEX = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_QWEN35_REGEX = (_CONTRACTIONS + "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
                 "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


@dataclass(frozen=True)
class PreTokenizer:
    regexes: tuple[str, ...]        # each splits the pieces the one before left ("isolated")
    ignore_merges: bool = False     # a piece that is a token is that token, without merging
    add_bos: bool = False           # default of tokenizer.ggml.add_bos_token
    clean_spaces: bool = False      # decoding removes spaces before punctuation (llama_detokenize)


_SMOLLM = PreTokenizer(("\\p{N}", _GPT2_REGEX))
_LLAMA3 = PreTokenizer((_LLAMA3_REGEX,), ignore_merges=True, add_bos=True, clean_spaces=True)
PRE_TOKENIZERS = {
    "smollm": _SMOLLM, "command-r": _SMOLLM,
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3,
    "qwen2": PreTokenizer((_QWEN2_REGEX,)), "deepseek-r1-qwen": PreTokenizer((_QWEN2_REGEX,)),
    "qwen35": PreTokenizer((_QWEN35_REGEX,)),
}

_SPACE_MARK = "\u2581"  # SentencePiece's visible space
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class TokenizerError(ValueError):
    """The tokenizer the metadata describes cannot be built, or a text cannot be tokenized."""


class Tokenizer:
    """Shared part: vocabulary, special-token partitioning, pieces and decoding.

    Subclasses implement ``_encode_fragments`` (the BPE of one model type) and
    ``_normal_piece`` (bytes of a NORMAL/BYTE token's piece).
    """

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int], *,
                 bos_id: int | None, eos_id: int | None, eog_ids: Iterable[int],
                 add_bos: bool, chat_template: str | None = None) -> None:
        self.tokens = list(tokens)
        self.token_types = list(token_types)
        self.n_vocab = len(self.tokens)
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eog_ids = frozenset(eog_ids)
        self.add_bos = bool(add_bos)
        self.chat_template = chat_template
        # llama.cpp's token_to_id: a later duplicate text wins, as in its load loop.
        self._vocab = {text: i for i, text in enumerate(self.tokens)}
        self._piece_cache: dict[int, bytes] = {}
        self._special_all, self._special_user = self._special_lists()

    def _special_lists(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        # llama.cpp's cache_special_tokens: control, user-defined and unknown tokens, longest
        # (in bytes) first, so a long token is cut out before a shorter one inside it.
        # Equal lengths keep id order (llama.cpp's std::sort leaves them unspecified).
        kinds = (CONTROL, USER_DEFINED, UNKNOWN)
        ids = [i for i, t in enumerate(self.token_types) if t in kinds]
        ids.sort(key=lambda i: -len(self.tokens[i].encode("utf-8")))
        every = [(self.tokens[i], i) for i in ids]
        user = [(self.tokens[i], i) for i in ids if self.token_types[i] == USER_DEFINED]
        return every, user

    def encode(self, text: str, add_bos: bool | None = None,
               parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, as llama_tokenize(add_special=add_bos, parse_special)."""
        if add_bos is None:
            add_bos = self.add_bos
        if not isinstance(text, str):
            raise TokenizerError(f"the text to tokenize is a {type(text).__name__}, not a str")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:     # lone surrogates: bytes that were not UTF-8 (an argv, a file)
            raise TokenizerError(f"the text is not valid Unicode: character {e.start} is {text[e.start]!r}, a "
                                 f"lone surrogate (the input held bytes that are not UTF-8)") from None
        ids = [self.bos_id] if add_bos and self.bos_id is not None else []
        ids.extend(self._encode_fragments(self._partition(text, parse_special)))
        return ids

    def encode_stream(self, pieces: Iterable[str], add_bos: bool | None = None, window: int = 1 << 16,
                      overlap: int = 1 << 11) -> Iterator[list[int]]:
        """The ids of a long text given in pieces, in batches, holding about ``window`` characters at a
        time: the same ids as encode() of the whole text. The text is cut only at token boundaries
        where the tokenization of what follows, started afresh at the cut, agrees with the
        tokenization across it for ``overlap`` characters (tokenizers look only that far around a
        point); where no such cut is found the window grows."""
        buf, first, size = "", True, window
        for piece in pieces:
            buf += piece
            while len(buf) >= size + 2 * overlap:
                done = self._cut(buf[:size + 2 * overlap], first, add_bos, size, overlap)
                if done is None:
                    size *= 2                      # no safe cut in this stretch: look at more text
                    continue
                ids, used = done
                yield ids
                buf, first, size = buf[used:], False, window
        if buf or first:
            yield self._encode_part(buf, first, add_bos)

    def _encode_part(self, text: str, first: bool, add_bos: bool | None) -> list[int]:
        if first:
            return self.encode(text, add_bos=add_bos)
        return self._encode_fragments(self._partition(text, False), continuation=True)

    def _cut(self, head: str, first: bool, add_bos: bool | None, size: int,
             overlap: int) -> tuple[list[int], int] | None:
        """(ids of head[:c], c) for a safe cut c near ``size``, or None."""
        ids = self._encode_part(head, first, add_bos)
        ends, pos, text = [], 0, head.encode("utf-8")
        lead = 1 if first and getattr(self, "add_space_prefix", False) else 0   # SPM's added space
        for tid in ids:
            pos += len(self.token_bytes(tid))      # BOS and other control tokens: no bytes
            ends.append(pos - lead)
        if not ends or ends[-1] != len(text):
            return None                            # pieces do not spell the text back (rare vocabularies)
        # candidates: token starts between size // 2 and len - overlap, latest first, those at a space or a
        # line break (where pre-tokenizers split) before the others; a few tries at most
        starts = [(k, ends[k - 1]) for k in range(len(ends) - 1, 0, -1)
                  if size // 2 <= ends[k - 1] <= len(text) - overlap]
        starts.sort(key=lambda kc: (text[kc[1]:kc[1] + 1] not in (b" ", b"\n"), -kc[1]))
        for k, c in starts[:16]:
            try:
                chars = len(text[:c].decode("utf-8"))
            except UnicodeDecodeError:
                continue                           # inside a character: not a boundary of the text
            after = self._encode_part(head[chars:chars + 2 * overlap], False, None)
            agree = [t for t, e in zip(ids[k:], ends[k:]) if e <= c + overlap]
            if agree and after[:len(agree)] == agree and len(agree) < len(after):
                return ids[:k], chars
        return None

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special-token strings out of ``text`` (llama.cpp's tokenizer_st_partition).

        Returns raw-text pieces (str) and special token ids (int) in order.  Tokens are
        applied one at a time, longest first, each splitting every remaining raw piece at
        its non-overlapping left-to-right occurrences, exactly as llama.cpp does.
        """
        frags: list[str | int] = [text] if text else []
        specials = self._special_all if parse_special else self._special_user
        for piece, tid in specials:
            if piece not in text:  # cheap filter: most special tokens never occur
                continue
            out: list[str | int] = []
            for frag in frags:
                if isinstance(frag, int) or piece not in frag:
                    out.append(frag)
                    continue
                for k, part in enumerate(frag.split(piece)):
                    if k:
                        out.append(tid)
                    if part:
                        out.append(part)
            frags = out
        return frags

    def _encode_fragments(self, frags: list[str | int], continuation: bool = False) -> list[int]:
        """ids of partitioned text; ``continuation``: the text continues an earlier part (no space
        prefix at its start)."""
        raise NotImplementedError

    def token_bytes(self, id: int, special: bool = False) -> bytes:
        """Raw bytes of one token's piece (llama.cpp's token_to_piece).

        Control and unknown tokens give b"" unless ``special``; user-defined tokens give their
        text verbatim; unused tokens give b"".  Bytes may be a partial UTF-8 sequence, so a
        streamer should join them before decoding.
        """
        ttype = self.token_types[id]
        if ttype in (CONTROL, UNKNOWN):
            return self.tokens[id].encode("utf-8") if special else b""
        if ttype == USER_DEFINED:
            return self.tokens[id].encode("utf-8")
        piece = self._piece_cache.get(id)
        if piece is None:
            piece = self._piece_cache[id] = self._normal_piece(id)
        return piece

    def _normal_piece(self, id: int) -> bytes:
        raise NotImplementedError

    def decode(self, ids: Iterable[int]) -> str:
        """Text of a whole id sequence; control tokens (BOS, EOS...) render as nothing."""
        data = b"".join(self.token_bytes(int(i)) for i in ids)
        return data.decode("utf-8", errors="replace")


class SPMTokenizer(Tokenizer):
    """tokenizer.ggml.model == "llama": llama.cpp's llm_tokenizer_spm."""

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int],
                 scores: Sequence[float], *, add_space_prefix: bool, **kwargs) -> None:
        super().__init__(tokens, token_types, **kwargs)
        self.scores = [float(s) for s in scores]
        bad = next((i for i, s in enumerate(self.scores) if math.isnan(s)), None)
        if bad is not None:
            raise TokenizerError(f"tokenizer.ggml.scores: the score of token {bad} ({self.tokens[bad]!r}) is NaN")
        for i, t in enumerate(self.token_types):
            if t == BYTE and not _BYTE_TOKEN.fullmatch(self.tokens[i]):
                raise TokenizerError(f"tokenizer.ggml.token_type: token {i} ({self.tokens[i][:20]!r}) is typed BYTE "
                                     f"({BYTE}) but its text is not of the form <0xXX>")
        self.add_space_prefix = bool(add_space_prefix)
        self._byte_ids = [self._byte_token(b) for b in range(256)]
        # llama.cpp's SPM tokenizer spells a character that is no token with byte tokens, and aborts where
        # one is missing: such a vocabulary cannot tokenize every text, so it is refused when built
        missing = [b for b, tid in enumerate(self._byte_ids) if tid is None]
        if missing:
            shown = ", ".join(f"<0x{b:02X}>" for b in missing[:4]) + (", ..." if len(missing) > 4 else "")
            raise TokenizerError(f"tokenizer.ggml.model is 'llama' (SentencePiece), but the vocabulary has no "
                                 f"byte-fallback token for {len(missing)} of the 256 bytes ({shown}): text holding "
                                 f"them could not be tokenized")

    def _byte_token(self, b: int) -> int | None:
        # llama.cpp's byte_to_token: "<0xXX>", else the byte itself as a one-char token.
        tid = self._vocab.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self._vocab.get(chr(b))
        return tid

    def _encode_fragments(self, frags: list[str | int], continuation: bool = False) -> list[int]:
        ids: list[int] = []
        prev_special = not continuation  # a space prefix goes at the start and after special tokens
        for frag in frags:
            if isinstance(frag, int):
                ids.append(frag)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                frag = " " + frag
            # llama_escape_whitespace: only ' ' becomes '▁'; tabs and newlines stay.
            ids.extend(self._merge(frag.replace(" ", _SPACE_MARK)))
            prev_special = False
        return ids

    def _merge(self, text: str) -> list[int]:
        """Merge adjacent symbols by best score (llm_tokenizer_spm_session::tokenize).

        Symbols start as single characters; symbol i always begins at character i, so a
        symbol is identified by its start and tracked by length and linked-list neighbours.
        The heap pops the highest score first, ties going to the leftmost pair, exactly as
        llama.cpp's priority queue; stale pairs are recognised by their length.
        """
        n = len(text)
        length = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        if n:
            nxt[-1] = -1
        heap: list[tuple[float, int, int, int]] = []
        vocab, scores = self._vocab, self.scores

        def push(left: int, right: int) -> None:
            end = right + length[right]
            tid = vocab.get(text[left:end])
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, end - left))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue  # one side was merged elsewhere since this pair was queued
            length[left] = size
            length[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            if prev[left] >= 0:
                push(prev[left], left)
            if nxt[left] >= 0:
                push(left, nxt[left])
        return self._symbols_to_ids(text, length, nxt)

    def _symbols_to_ids(self, text: str, length: list[int], nxt: list[int]) -> list[int]:
        # Every merged symbol is a token by construction; a leftover single character that
        # is not in the vocabulary becomes its UTF-8 bytes (llama.cpp's resegment).
        ids: list[int] = []
        i = 0 if text else -1
        while i != -1:
            piece = text[i:i + length[i]]
            tid = self._vocab.get(piece)
            if tid is not None:
                ids.append(tid)
            else:
                for b in piece.encode("utf-8", errors="surrogatepass"):
                    byte_id = self._byte_ids[b]
                    if byte_id is None:
                        raise TokenizerError(f"the text holds {piece!r}, which is not in the vocabulary, and the "
                                             f"vocabulary has no byte-fallback token <0x{b:02X}> for it")
                    ids.append(byte_id)
            i = nxt[i]
        return ids

    def _normal_piece(self, id: int) -> bytes:
        ttype = self.token_types[id]
        if ttype == NORMAL:
            return self.tokens[id].replace(_SPACE_MARK, " ").encode("utf-8")
        if ttype == BYTE:  # "<0xXX>"
            return bytes([int(self.tokens[id][3:5], 16)])
        return b""  # unused / undefined tokens print nothing in llama.cpp


def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character stand-ins for bytes, inverted (char -> byte)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = iter(range(256, 512))
    return {chr(b if b in keep else next(extra)): b for b in range(256)}


class BPETokenizer(Tokenizer):
    """tokenizer.ggml.model == "gpt2": byte-level BPE through HF ``tokenizers``."""

    def __init__(self, tokens: Sequence[str], token_types: Sequence[int],
                 merges: Sequence[str], *, pre: str, **kwargs) -> None:
        super().__init__(tokens, token_types, **kwargs)
        self.pre = pre
        self._hf = self._build_hf(merges, pre)
        self._byte_of = _byte_decoder()

    def _build_hf(self, merges: Sequence[str], pre: str):
        from tokenizers import Regex, models, pre_tokenizers
        from tokenizers import Tokenizer as HFTokenizer

        spec = PRE_TOKENIZERS.get(pre)
        if spec is None:
            raise TokenizerError(f"unsupported tokenizer.ggml.pre {pre!r} for a gpt2 tokenizer; "
                                 f"supported: {', '.join(sorted(PRE_TOKENIZERS))}")
        try:
            model = models.BPE(vocab=self._vocab, merges=self._merge_pairs(merges), ignore_merges=spec.ignore_merges)
        except BaseException as e:          # tokenizers' Rust panics are BaseExceptions
            if isinstance(e, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                raise
            raise TokenizerError(f"the gpt2 vocabulary and merges do not make a BPE model: {type(e).__name__}: "
                                 f"{e}") from None
        hf = HFTokenizer(model)
        # llama.cpp runs each regex over the pieces the previous one left (unicode_regex_split), then maps
        # bytes to GPT-2's characters: HF's Split(isolated) in sequence, then ByteLevel without its regex
        steps = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec.regexes]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        hf.pre_tokenizer = pre_tokenizers.Sequence(steps)
        return hf

    def _merge_pairs(self, merges: Sequence[str]) -> list[tuple[str, str]]:
        # llama.cpp splits at the first space after position 0.  Pairs whose parts or result
        # are not tokens are dropped: HF refuses them, and such merges can never produce a
        # token in llama.cpp either.
        pairs = []
        for merge in merges:
            pos = merge.find(" ", 1)
            if pos < 0:
                continue
            a, b = merge[:pos], merge[pos + 1:]
            if a in self._vocab and b in self._vocab and a + b in self._vocab:
                pairs.append((a, b))
        return pairs

    def _encode_fragments(self, frags: list[str | int], continuation: bool = False) -> list[int]:
        ids: list[int] = []
        for frag in frags:
            if isinstance(frag, int):
                ids.append(frag)
            else:
                ids.extend(self._hf.encode(frag, add_special_tokens=False).ids)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        data = b"".join(self.token_bytes(int(i)) for i in ids)
        if PRE_TOKENIZERS[self.pre].clean_spaces:
            data = clean_spaces(data)
        return data.decode("utf-8", errors="replace")

    def _normal_piece(self, id: int) -> bytes:
        if self.token_types[id] != NORMAL:
            return b""  # llama.cpp prints nothing for unused/byte/undefined BPE tokens
        text = self.tokens[id]
        try:
            return bytes(self._byte_of[c] for c in text)
        except KeyError:  # not a byte-level piece; keep its text
            return text.encode("utf-8")


def clean_spaces(text: bytes) -> bytes:
    """llama_detokenize's clean-up (clean_up_tokenization_spaces) in its three passes: no space before
    ? ! . , ; " ' " becomes "'"; no space before 's 'm 're 've."""
    out = bytearray(text[:1])
    for i in range(1, len(text)):
        if text[i - 1] == 0x20 and text[i] in b"?!.," and out:
            out.pop()
        out.append(text[i])
    text = bytes(out)
    out, i = bytearray(text[:1]), 1
    while i < len(text):
        x = text[i]
        if x == 0x27 and i + 1 < len(text) and text[i - 1] == 0x20 and text[i + 1] == 0x20:
            if out:
                out.pop()
            out.append(x)
            i += 2
            continue
        out.append(x)
        i += 1
    text = bytes(out)
    out = bytearray(text[:1])
    for i in range(1, len(text)):
        if text[i - 1] == 0x20 and text[i] == 0x27 and i + 1 < len(text) and out:
            x1 = text[i + 1:i + 2]
            x12 = text[i + 1:i + 3]
            if x1 in (b"s", b"m") or (i + 2 < len(text) and x12 in (b"re", b"ve")):
                out.pop()
        out.append(text[i])
    return bytes(out)


def _token_id(fields: Mapping[str, object], key: str, default: int | None,
              n_vocab: int) -> int | None:
    # llama.cpp keeps the default when the key is missing or out of range.
    value = get_int(fields, key, None)
    if value is None or not 0 <= value < n_vocab:
        return default if default is None or 0 <= default < n_vocab else None
    return value


def _end_of_generation(fields: Mapping[str, object], vocab: Mapping[str, int],
                       types: list[int], eos_id: int | None) -> frozenset[int]:
    """End-of-generation ids, derived as llama.cpp does; retypes detected tokens CONTROL."""
    n = len(types)
    found: dict[str, int | None] = {}
    for name, texts in (("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), *_FIM_TEXTS.items()):
        tid = _token_id(fields, f"tokenizer.ggml.{name}_token_id", None, n)
        if tid is None:
            hits = [vocab[t] for t in texts if t in vocab]
            tid = min(hits) if hits else None  # llama.cpp takes whichever it meets first
            if tid is not None:
                types[tid] = CONTROL
        found[name] = tid
    eog = {found[k] for k in ("fim_pad", "fim_rep", "fim_sep") if found[k] is not None}
    for text in _EOG_TEXTS:
        if text in vocab:
            eog.add(vocab[text])
            types[vocab[text]] = CONTROL
    eog.update(t for t in (eos_id, found["eot"], found["eom"]) if t is not None)
    return frozenset(eog)


def tokenizer_from_metadata(fields: Mapping[str, object]) -> Tokenizer:
    """Build the tokenizer described by GGUF metadata (key -> python value). Every key is checked for
    its type where it is read (MetadataError names the key); a vocabulary that cannot make a
    tokenizer is a TokenizerError."""
    model = get_str(fields, "tokenizer.ggml.model")
    if model not in SUPPORTED_MODELS:
        raise TokenizerError(f"unsupported tokenizer model {model!r} (tokenizer.ggml.model); "
                             f"supported: {', '.join(repr(m) for m in SUPPORTED_MODELS)}")
    texts = get_list(fields, "tokenizer.ggml.tokens", "strings")
    if not texts:
        raise MetadataError("metadata key 'tokenizer.ggml.tokens' is an empty array; expected the vocabulary")
    # llama.cpp renames empty texts so they never match inside text.
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(texts)]
    n = len(tokens)
    types = list(get_list(fields, "tokenizer.ggml.token_type", "integers", [NORMAL] * n, length=n))
    bad = next((i for i, t in enumerate(types) if not 0 <= t <= BYTE), None)
    if bad is not None:
        raise MetadataError(f"metadata key 'tokenizer.ggml.token_type': element {bad} is {types[bad]}; expected a "
                            f"token type from 0 to {BYTE} (llama.cpp's llama_token_type)")
    # Defaults per model type, as llama_vocab::load before reading the GGUF keys.
    bos_default, eos_default, add_bos_default = (1, 2, True) if model == "llama" else (11, 11, False)
    pre = get_str(fields, "tokenizer.ggml.pre", "") or "default"
    if model == "gpt2" and pre in PRE_TOKENIZERS:
        add_bos_default = PRE_TOKENIZERS[pre].add_bos
    bos_id = _token_id(fields, "tokenizer.ggml.bos_token_id", bos_default, n)
    eos_id = _token_id(fields, "tokenizer.ggml.eos_token_id", eos_default, n)
    vocab = {t: i for i, t in enumerate(tokens)}
    common = dict(
        bos_id=bos_id, eos_id=eos_id,
        eog_ids=_end_of_generation(fields, vocab, types, eos_id),
        add_bos=get_bool(fields, "tokenizer.ggml.add_bos_token", add_bos_default),
        chat_template=get_str(fields, "tokenizer.chat_template", None),
    )
    if model == "llama":
        scores = get_list(fields, "tokenizer.ggml.scores", "numbers", [0.0] * n, length=n)
        add_prefix = get_bool(fields, "tokenizer.ggml.add_space_prefix", True)
        return SPMTokenizer(tokens, types, scores, add_space_prefix=add_prefix, **common)
    merges = get_list(fields, "tokenizer.ggml.merges", "strings")
    return BPETokenizer(tokens, types, merges, pre=pre, **common)
