"""FLASH_ATTN_EXT for the CPU plugin's fast path: one query row and head at a time, the keys in order.

The reference kernel (numpy) multiplies all queries by all keys in a few large BLAS products, whose
rounding depends on how many queries a call holds; with 8-bit activations after it, a last-bit change
there can flip an activation's rounding step and grow through the layers. Here each (query, head)
output is computed by itself, the keys the mask hides skipped, every sum in a fixed order (eight
running lanes over the head's values, then combined in a fixed tree), and no fast-math: a row's result
is the same bits in a prefill chunk of any size and in a decode step, on any CPU and thread count."""

from __future__ import annotations

import numpy as np
from numba import prange

from .jit import kernel

_NO_MASK = np.zeros((1, 1), np.float32)


def _attend(q, k, v, mask, has_mask, scale, out):
    t, h, d = q.shape
    n_keys = k.shape[0]
    group = h // k.shape[1]
    d8 = d // 8 * 8
    neg_inf = np.float32(-np.inf)
    for job in prange(t * h):
        i = job // h
        head = job - i * h
        g = head // group
        scores = np.empty(n_keys, np.float32)
        top = neg_inf
        for s in range(n_keys):
            m = np.float32(0.0)
            if has_mask:
                m = mask[i, s]
                if m == neg_inf:
                    scores[s] = neg_inf
                    continue
            a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
            for j in range(0, d8, 8):
                a0 += q[i, head, j] * k[s, g, j]
                a1 += q[i, head, j + 1] * k[s, g, j + 1]
                a2 += q[i, head, j + 2] * k[s, g, j + 2]
                a3 += q[i, head, j + 3] * k[s, g, j + 3]
                a4 += q[i, head, j + 4] * k[s, g, j + 4]
                a5 += q[i, head, j + 5] * k[s, g, j + 5]
                a6 += q[i, head, j + 6] * k[s, g, j + 6]
                a7 += q[i, head, j + 7] * k[s, g, j + 7]
            tail = np.float32(0.0)
            for j in range(d8, d):
                tail += q[i, head, j] * k[s, g, j]
            dot = (((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))) + tail
            sc = dot * scale + m
            scores[s] = sc
            top = max(top, sc)
        acc = np.zeros(d, np.float32)
        total = np.float32(0.0)
        for s in range(n_keys):
            if scores[s] == neg_inf:
                continue
            p = np.exp(scores[s] - top)
            total += p
            for j in range(d):
                acc[j] += p * v[s, g, j]
        inv = np.float32(1.0) / total if total > 0 else np.float32(0.0)
        for j in range(d):
            out[i, head, j] = acc[j] * inv


# Two builds of one loop: a decode step's few (query, head) pairs do not pay for waking the threads (on a
# busy host a thread's wake-up can take a time slice, milliseconds); the same arithmetic either way.
_attend_threads = kernel(parallel=True)(_attend)
_attend_one = kernel()(_attend)
THREADED_FROM = 1 << 20      # multiply-adds (T x H x S x D) from which the pairs go over the threads


def flash_attn_ext(q, k, v, mask=None, *, scale):
    """As reference.flash_attn_ext: q (T, H, D), k and v (S, Hkv, D), mask (T, S) -> (T, H, D) float32."""
    out = np.empty(q.shape, np.float32)
    m = _NO_MASK if mask is None else np.ascontiguousarray(mask, dtype=np.float32)
    run = _attend_threads if q.shape[0] * q.shape[1] * k.shape[0] * q.shape[2] >= THREADED_FROM else _attend_one
    run(np.ascontiguousarray(q, dtype=np.float32), np.ascontiguousarray(k, dtype=np.float32),
            np.ascontiguousarray(v, dtype=np.float32), m, mask is not None, np.float32(scale), out)
    return out
