"""Perplexity: score every token of each window after its first, given all tokens before it.

A text file is read as a stream: bytes in blocks, decoded as UTF-8 (a byte that is not is an error
naming the file and its offset), tokenized in batches that give the ids of the whole text
(Tokenizer.encode_stream), scored window by window. Memory stays bounded by a window's logits and a
batch of text, whatever the file's size.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import caches
from .batch import Batch, Part, batching_refusal
from .session import Session

READ_BLOCK = 1 << 20        # bytes read from the file at a time
ROWS = 64                   # logits rows turned into float64 at a time


class TextFileError(ValueError):
    """The text file is missing, unreadable, or not UTF-8."""


@dataclass
class PerplexityResult:
    perplexity: float
    nll: np.ndarray          # per scored token
    top1: np.ndarray         # the model's top-1 prediction at every position of every window
    n_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.n_tokens / self.seconds if self.seconds else 0.0


@dataclass
class Progress:
    """Where a perplexity run is: passed to the progress callback after every window."""

    windows: int             # windows scored so far
    tokens: int              # tokens read so far
    fraction: float          # of the input read (bytes of a file; tokens of a list)
    seconds: float

    @property
    def seconds_left(self) -> float | None:
        """An estimate from the pace so far (None until something is done)."""
        if self.fraction <= 0 or self.seconds <= 0:
            return None
        return self.seconds * (1 - self.fraction) / self.fraction


def perplexity(session: Session, ids: list[int], window: int,
               progress: Callable[[Progress], None] | None = None) -> PerplexityResult:
    if len(ids) < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, the text has {len(ids)}")
    n = len(ids)
    batches = ((ids[s:s + window], (s + window) / n) for s in range(0, n, window))
    return _score(session, batches, window, progress)


def perplexity_of_file(session: Session, path: str | Path, window: int,
                       progress: Callable[[Progress], None] | None = None) -> PerplexityResult:
    """Perplexity of a UTF-8 text file, read and tokenized as a stream (ids as encode() of the whole text)."""
    path = Path(path)
    reader = _TextReader(path)
    batches = _windows(session.model.tokenizer.encode_stream(reader), window, reader)
    result = _score(session, batches, window, progress)
    if result.n_tokens < 2:
        raise ValueError(f"perplexity needs at least 2 tokens, {path} has {result.n_tokens}")
    return result


def _windows(batches: Iterator[list[int]], window: int, reader: _TextReader) -> Iterator[tuple[list[int], float]]:
    """Windows of ids from the tokenizer's batches, each with the share of the text's tokens up to its
    end (the file's tokens estimated from the tokens per byte of what has been read so far)."""
    chunk: list[int] = []
    done = tokenized = 0
    for batch in batches:
        tokenized += len(batch)
        total = tokenized / reader.fraction if reader.fraction < 1.0 else tokenized
        for t in batch:
            chunk.append(t)
            if len(chunk) == window:
                done += window
                yield chunk, min(1.0, done / total)
                chunk = []
    if chunk:
        yield chunk, 1.0


def windows_per_step(model, devices: list, window: int, n_batch: int) -> int:
    """Windows scored together in one batched step (runtime/batch.py): as many as --batch holds; one where
    the model or a device cannot batch. The session's cache must hold that many windows."""
    if batching_refusal(model, devices) is not None:
        return 1
    return max(1, n_batch // window)


def _score(session: Session, batches: Iterable[tuple[list[int], float]], window: int,
           progress: Callable[[Progress], None] | None) -> PerplexityResult:
    if window < 2:
        raise ValueError(f"the window (--ctx) must be at least 2 tokens, got {window}")
    per_step = min(windows_per_step(session.model, session.devices, window, session.n_batch),
                   session.n_ctx // window)
    batch = Batch(session) if per_step > 1 else None
    nll, top1, n_tokens, windows = [], [], 0, 0
    clock = caches.Stopwatch()                 # a first run's kernel compiles are not scoring time
    for group in _groups(batches, per_step):
        n_tokens += sum(len(chunk) for chunk, _ in group)
        chunks = [chunk for chunk, _ in group if len(chunk) >= 2]
        for chunk, logits in zip(chunks, _evaluate(session, batch, chunks)):
            a, b = _window_scores(logits, chunk)
            nll.append(a)
            top1.append(b)
            windows += 1
        if progress and chunks:
            progress(Progress(windows, n_tokens, group[-1][1], clock.seconds))
        if len(chunks) < len(group):         # a last window of one token: nothing to score
            break
    if not nll:
        return PerplexityResult(float("nan"), np.zeros(0), np.zeros(0, dtype=np.int64), n_tokens,
                                clock.seconds)
    nll_all = np.concatenate(nll)
    return PerplexityResult(float(np.exp(nll_all.mean())), nll_all, np.concatenate(top1), n_tokens,
                            clock.seconds)


def _groups(batches: Iterable[tuple[list[int], float]], n: int) -> Iterator[list[tuple[list[int], float]]]:
    group = []
    for item in batches:
        group.append(item)
        if len(group) == n:
            yield group
            group = []
    if group:
        yield group


def _evaluate(session: Session, batch: Batch | None, chunks: list[list[int]]) -> list[np.ndarray]:
    """Every token's logits of each window: the windows as sequences of one batched step, or one by one."""
    if batch is None:
        out = []
        for chunk in chunks:
            session.reset()
            out.append(session.eval(chunk, all_logits=True))
        return out
    try:
        return batch.step([Part(i, chunk, all_logits=True) for i, chunk in enumerate(chunks)])
    finally:
        for i in range(len(chunks)):
            batch.free(i)


def _window_scores(logits: np.ndarray, chunk: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Negative log-likelihood of each next token, and the top-1 prediction at every position; a few
    rows at a time in float64: a whole window at once would take 8 bytes a logit in each of three
    temporaries (about 3 GB for 500 positions of a 262144-token vocabulary)."""
    n = len(chunk)
    target = np.asarray(chunk[1:], dtype=np.int64)
    nll = np.empty(n - 1, dtype=np.float64)
    for r0 in range(0, n - 1, ROWS):
        r1 = min(r0 + ROWS, n - 1)
        rows = logits[r0:r1].astype(np.float64)
        top = rows.max(axis=1, keepdims=True)
        lse = np.log(np.exp(rows - top).sum(axis=1)) + top[:, 0]
        nll[r0:r1] = lse - rows[np.arange(r1 - r0), target[r0:r1]]
    return nll, logits.argmax(axis=1)


class _TextReader:
    """The text of a file in pieces, decoded strictly as UTF-8; knows how far it has read."""

    def __init__(self, path: Path):
        if path.is_dir():
            raise TextFileError(f"text file {path} is a folder")
        if not path.is_file():
            raise TextFileError(f"text file not found: {path}")
        self.path = path
        self.size = path.stat().st_size
        self.read = 0

    @property
    def fraction(self) -> float:
        return self.read / self.size if self.size else 1.0

    def __iter__(self) -> Iterator[str]:
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise TextFileError(f"text file {self.path} cannot be read: {e.strerror or e}") from None
        with f:
            while True:
                block = f.read(READ_BLOCK)
                final = not block
                pending = len(decoder.getstate()[0])
                try:
                    text = decoder.decode(block, final=final)
                except UnicodeDecodeError as e:
                    offset = self.read - pending + e.start
                    bad = e.object[e.start:e.start + 1]
                    raise TextFileError(f"{self.path} is not UTF-8 text: byte 0x{bad.hex()} at byte offset {offset} "
                                        f"({e.reason}); perplexity reads UTF-8 text") from None
                self.read += len(block)
                if text:
                    yield text
                if final:
                    return
