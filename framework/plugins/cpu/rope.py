"""ROPE for the CPU plugin's fast path: one compiled loop in place of the reference kernel's dozen numpy
calls, which for a decode step's one row (9 heads of 64) cost about 15 us a layer, most of it the calls'
own overhead. The same table (reference.rope_cos_sin) and the same float32 operations in the same order
(x0 * cos - x1 * sin, each product rounded, no fused multiply-add): the reference's bits."""

from __future__ import annotations

import numpy as np
from numba import prange

from ...contract import reference
from .jit import kernel


def _rotate(x, cos, sin, n_dims, neox, out):
    t, h, d = x.shape
    half = n_dims // 2
    for job in prange(t * h):
        i = job // h
        j = job - i * h
        for p in range(half):
            a = p if neox else 2 * p
            b = p + half if neox else 2 * p + 1
            x0 = x[i, j, a]
            x1 = x[i, j, b]
            out[i, j, a] = x0 * cos[i, p] - x1 * sin[i, p]
            out[i, j, b] = x0 * sin[i, p] + x1 * cos[i, p]
        for k in range(n_dims, d):
            out[i, j, k] = x[i, j, k]


_rotate_threads = kernel(parallel=True)(_rotate)
_rotate_one = kernel()(_rotate)
THREADED_FROM = 1 << 16      # values from which the (row, head) pairs go over the threads


def rope(x, pos, factors=None, *, n_dims, mode, freq_base, freq_scale):
    """As reference.rope, for float32 x (T, H, D); anything else goes to the reference kernel."""
    if x.ndim != 3 or x.dtype != np.float32:
        return reference.rope(x, pos, factors, n_dims=n_dims, mode=mode, freq_base=freq_base, freq_scale=freq_scale)
    cos, sin = reference.rope_cos_sin(pos, n_dims, freq_base, freq_scale, factors)
    out = np.empty(x.shape, np.float32)
    run = _rotate_threads if x.size >= THREADED_FROM else _rotate_one
    run(x, cos, sin, n_dims, mode == "neox", out)
    return out
