"""FLASH_ATTN_EXT for the CPU plugin's fast path: one query row and head at a time, the keys in order.

The reference kernel (numpy) multiplies all queries by all keys in a few large BLAS products, whose
rounding depends on how many queries a call holds; with 8-bit activations after it, a last-bit change
there can flip an activation's rounding step and grow through the layers. Here each (query, head)
output is computed by itself, the keys the mask hides skipped, every sum in a fixed order (a key's
score in eight running sums over its D products, combined in a fixed tree; the keys side by side in vector
lanes), and no fast-math: a row's result
is the same bits in a prefill chunk of any size and in a decode step, on any CPU and thread count."""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import prange

from .jit import kernel
from .vectors import lanes8_dot, lanes8_dot4, prefetch_floats

_NO_MASK = np.zeros((1, 1), np.float32)


def _keys_seen(mask, i, n_keys, has_mask):
    """How many keys query i sees: those past the last one its mask leaves open weigh exactly 0."""
    seen = n_keys
    if has_mask:
        while seen > 0 and mask[i, seen - 1] == np.float32(-np.inf):
            seen -= 1
    return seen


def _softmax_values(scores, keys, n, mask, i, has_mask, scale, v, g, out, head):
    """_weigh_heads for one head (kv head g), the prefill path's: its arithmetic in the same order (the same bits),
    with scalars: _weigh_heads of one head made the prefill's attention markedly slower (a comparison of the two in
    one process, not kept)."""
    d = out.shape[2]
    neg_inf = np.float32(-np.inf)
    top = neg_inf
    for j in range(n):
        m = mask[i, keys[j]] if has_mask else np.float32(0.0)
        sc = scores[j] * scale + m if m != neg_inf else neg_inf
        scores[j] = sc
        top = max(top, sc)
    acc = np.zeros(d, np.float32)
    total = np.float32(0.0)
    for j in range(n):
        if scores[j] == neg_inf:
            continue
        p = np.exp(scores[j] - top)
        total += p
        s = keys[j]
        for c in range(d):
            acc[c] += p * v[s, g, c]
    inv = np.float32(1.0) / total if total > 0 else np.float32(0.0)
    for c in range(d):
        out[i, head, c] = acc[c] * inv


def _weigh_heads(scores, keys, n, mask, i, has_mask, scale, v, group, h0, out):
    """Query i's raw scores (heads, n) of its n keys at positions keys[:n] (ascending) for heads h0 .. h0 + heads - 1
    scaled and masked, their softmax (shifted by each head's largest), and the values they weigh into out[i, head]
    (each key's value row read once for all those heads): the one order every kernel below shares, a head's sums
    the same whichever heads it is weighed with. A key the mask hides weighs exactly 0, listed or not."""
    nh, d = scores.shape[0], out.shape[2]
    neg_inf = np.float32(-np.inf)
    top = np.full(nh, neg_inf, np.float32)
    for j in range(n):
        m = mask[i, keys[j]] if has_mask else np.float32(0.0)
        for hh in range(nh):
            sc = scores[hh, j] * scale + m if m != neg_inf else neg_inf
            scores[hh, j] = sc
            top[hh] = max(top[hh], sc)
    acc = np.zeros((nh, d), np.float32)
    total = np.zeros(nh, np.float32)
    kv = np.empty(nh, np.int64)           # each head's kv head, worked out once (a division per key and head cost)
    for hh in range(nh):
        kv[hh] = (h0 + hh) // group
    for j in range(n):
        s = keys[j]
        for hh in range(nh):
            if scores[hh, j] == neg_inf:
                continue
            p = np.exp(scores[hh, j] - top[hh])
            total[hh] += p
            g = kv[hh]
            for c in range(d):
                acc[hh, c] += p * v[s, g, c]
    for hh in range(nh):
        inv = np.float32(1.0) / total[hh] if total[hh] > 0 else np.float32(0.0)
        for c in range(d):
            out[i, h0 + hh, c] = acc[hh, c] * inv


_weigh = kernel()(_weigh_heads)
_weigh_one = kernel()(_softmax_values)
_seen = kernel()(_keys_seen)


def _attend(q, kt, v, mask, has_mask, scale, out):
    """kt: the keys by kv head, transposed (Hkv, D, S), so that a query's scores are loops over the keys
    (vectorized, no reduction across lanes). A key's dot product keeps the order of a loop over its D
    products in eight running sums (element j into sum j mod 8, then ((s0 + s1) + (s2 + s3)) + ((s4 + s5)
    + (s6 + s7)), then the tail past a multiple of 8): each key's eight sums are a row of ``parts``."""
    t, h, d = q.shape
    n_keys = kt.shape[2]
    group = h // kt.shape[0]
    d8 = d // 8 * 8
    for job in prange(t * h):
        i = job // h
        head = job - i * h
        g = head // group
        seen = _seen(mask, i, n_keys, has_mask)
        parts = np.zeros((8, seen), np.float32)
        for j0 in range(0, d8, 8):
            for lane in range(8):
                qj = q[i, head, j0 + lane]
                for s in range(seen):
                    parts[lane, s] += qj * kt[g, j0 + lane, s]
        tail = np.zeros(seen, np.float32)
        for j in range(d8, d):
            qj = q[i, head, j]
            for s in range(seen):
                tail[s] += qj * kt[g, j, s]
        scores = np.empty(seen, np.float32)
        for s in range(seen):
            scores[s] = (((parts[0, s] + parts[1, s]) + (parts[2, s] + parts[3, s]))
                         + ((parts[4, s] + parts[5, s]) + (parts[6, s] + parts[7, s]))) + tail[s]
        _weigh_one(scores, np.arange(seen), seen, mask, i, has_mask, scale, v, g, out, head)


def _attend_keys(q, k, v, mask, has_mask, scale, keys, counts, out, parts, prefetch):
    """As _attend, with the keys as the cache holds them (S, Hkv, D), for a few queries (a decode step, or the
    decode rows of several sequences, each seeing only its own cells): where transposing the whole window for
    every call cost more than the scores. Only the keys a query's mask leaves open are scored (keys[i, :counts[i]],
    _open_keys); each key's D products go into its eight running sums in the same order (element j into sum j
    mod 8, j ascending, then the same tree and tail), so each score, and the output, is the same bits as
    _attend's. A job for each query and each of ``parts`` runs of its heads, each key's and value's row read once,
    in order, for all the heads of a run: whole kv heads a run where parts <= Hkv (1: every head), else runs of
    about H / parts heads (H: a head a job). prefetch: ask for each key's value row while scoring it."""
    t, h, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    d8 = d // 8 * 8
    for job in prange(t * parts):
        i = job // parts
        part = job - i * parts
        if parts <= hkv:                  # whole kv heads a job: each of their rows read by this job alone
            g0, g1 = part * hkv // parts, (part + 1) * hkv // parts
            h0, h1 = g0 * group, g1 * group
        else:
            h0, h1 = part * h // parts, (part + 1) * h // parts
            g0, g1 = h0 // group, (h1 - 1) // group + 1
        n = counts[i]
        scores = np.empty((h1 - h0, n), np.float32)
        for j in range(n):
            s = keys[i, j]
            if prefetch:
                prefetch_floats(v, (s * hkv + g0) * d, (g1 - g0) * d)
            for g in range(g0, g1):       # the heads of kv head g (no division in this loop: it is per key)
                head, last = max(h0, g * group), min(h1, (g + 1) * group)
                while head + 4 <= last and d8 == d:
                    s0, s1, s2, s3 = lanes8_dot4(q, (i * h + head) * d, d, k, (s * hkv + g) * d, d8)
                    scores[head - h0, j], scores[head - h0 + 1, j] = s0, s1
                    scores[head - h0 + 2, j], scores[head - h0 + 3, j] = s2, s3
                    head += 4
                while head < last:
                    tail = np.float32(0.0)
                    for c in range(d8, d):
                        tail += q[i, head, c] * k[s, g, c]
                    scores[head - h0, j] = lanes8_dot(q, (i * h + head) * d, k, (s * hkv + g) * d, d8) + tail
                    head += 1
        _weigh(scores, keys[i], n, mask, i, has_mask, scale, v, group, h0, out)


@kernel()
def _open_keys(mask, t, n_keys, has_mask):
    """Each query's open keys, in order, and how many: (keys (t, n_keys) int64, counts (t,) int64)."""
    keys = np.empty((t, n_keys), np.int64)
    counts = np.zeros(t, np.int64)
    for i in range(t):
        n = 0
        for s in range(n_keys):
            if not has_mask or mask[i, s] != np.float32(-np.inf):
                keys[i, n] = s
                n += 1
        counts[i] = n
    return keys, counts


_by_key_one = kernel()(_attend_keys)
_by_key_threads = kernel(parallel=True)(_attend_keys)
BY_KEY_UNTIL = 4             # queries up to which the keys are read as the cache holds them (not transposed)
# ... and beyond it, while the queries see at most this share of the window's (query, key) pairs: the rows of
# several sequences in one step, each seeing its own cells of the shared cache
BY_KEY_SHARE = 0.5
# a decode step's heads go over the threads from a window of a few hundred keys (SmolLM2's 9 heads of 64: 228
# keys): there the attention is a tenth of a small model's step, which one thread left the other waiting for
BY_KEY_THREADED_FROM = 1 << 17


def by_key_jobs(t: int, h: int, work: int):
    """(build, parts, prefetch) of _attend_keys for t queries of h heads and ``work`` multiply-adds: as few runs of
    a query's heads as give every thread a job (a query a job where the queries are as many as the threads), each
    key's and value's row read once for all the heads of a run; on one thread below BY_KEY_THREADED_FROM, all of a
    query's heads in one run. Value rows prefetched for several queries. A head a job, as before, read the rows
    again for every head: `python benchmarks/attention_jobs.py` measures the ways in turns (docs/benchmarks.md,
    "Decode attention a query a job")."""
    if work < BY_KEY_THREADED_FROM:
        return _by_key_one, 1, t > 1
    return _by_key_threads, min(h, -(-numba.get_num_threads() // t)), t > 1


# Two builds of one loop: a decode step's few (query, head) pairs do not pay for waking the threads (on a
# busy host a thread's wake-up can take a time slice, milliseconds); the same arithmetic either way.
_attend_threads = kernel(parallel=True)(_attend)
_attend_one = kernel()(_attend)
THREADED_FROM = 1 << 20      # multiply-adds (T x H x S x D) from which the pairs go over the threads


class OpenKeys:
    """What a program's attention calls read in a mask, found once a run (every layer's FLASH_ATTN_EXT gets the
    same mask, as wide as the cells a batched step's sequences share). Cleared at the start of each run (a caller
    may rewrite an argument's buffer between runs); an entry serves only the very array it was made from."""

    def __init__(self):
        self._held: dict = {}

    def clear(self) -> None:
        self._held.clear()

    def of(self, mask: np.ndarray) -> "_Window":
        held = self._held.get(id(mask))
        if held is None or held[0] is not mask:
            held = self._held[id(mask)] = (mask, _Window.of(mask))
        return held[1]


class _Window:
    """A mask's keys for t queries: n, those up to the last any query sees (the rest are not read); open_pairs, the
    (query, key) pairs it leaves open; mm, its first n columns; keys, each query's open ones (made on first use)."""

    def __init__(self, mm: np.ndarray, t: int, n: int, open_pairs: int, has_mask: bool):
        self.mm, self.t, self.n, self.open_pairs, self.has_mask = mm, t, n, open_pairs, has_mask

    @classmethod
    def of(cls, mask: np.ndarray) -> "_Window":
        m = np.ascontiguousarray(mask, dtype=np.float32)
        finite = np.isfinite(m)
        seen = np.flatnonzero(finite.any(axis=0))
        n = int(seen[-1]) + 1 if seen.size else 1
        return cls(np.ascontiguousarray(m[:, :n]), m.shape[0], n, int(np.count_nonzero(finite)), True)

    @classmethod
    def whole(cls, t: int, n_keys: int) -> "_Window":      # no mask: every query sees every key
        return cls(_NO_MASK, t, n_keys, t * n_keys, False)

    @functools.cached_property
    def keys(self) -> tuple[np.ndarray, np.ndarray]:
        return _open_keys(self.mm, self.t, self.n, self.has_mask)


def flash_attn_ext(q, k, v, mask=None, *, scale, masks: OpenKeys | None = None):
    """As reference.flash_attn_ext: q (T, H, D), k and v (S, Hkv, D), mask (T, S) -> (T, H, D) float32.
    masks: the program's OpenKeys, where its calls share their masks' scans."""
    out = np.empty(q.shape, np.float32)
    if mask is None:
        w = _Window.whole(q.shape[0], k.shape[0])
    else:
        w = masks.of(mask) if masks is not None else _Window.of(mask)
    n = w.n
    qc, vc = np.ascontiguousarray(q, dtype=np.float32), np.ascontiguousarray(v, dtype=np.float32)
    if q.shape[0] <= BY_KEY_UNTIL or w.open_pairs <= BY_KEY_SHARE * q.shape[0] * n:
        work = w.open_pairs * q.shape[1] * q.shape[2]
        by_key, parts, prefetch = by_key_jobs(q.shape[0], q.shape[1], work)
        keys, counts = w.keys
        by_key(qc, np.ascontiguousarray(k[:n], dtype=np.float32), vc, w.mm, w.has_mask, np.float32(scale), keys,
               counts, out, parts, prefetch)
        return out
    run = _attend_threads if q.shape[0] * q.shape[1] * k.shape[0] * q.shape[2] >= THREADED_FROM else _attend_one
    kt = np.ascontiguousarray(np.asarray(k[:n], dtype=np.float32).transpose(1, 2, 0))
    run(qc, kt, vc, w.mm, w.has_mask, np.float32(scale), out)
    return out
