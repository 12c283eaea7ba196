"""RMS_NORM for the CPU plugin's fast path: each row by itself, its sum of squares in a fixed order.

The reference kernel takes a decode step's one row through BLAS's dot product and a prefill's rows
through einsum, two summation orders; the 8-bit activations after a norm turn that last-bit difference
into a rounding step (see attention.py). Here a row's result is the same bits in any batch, on any CPU."""

from __future__ import annotations

import numpy as np
from numba import prange

from .jit import kernel


def _rms_norm(x, eps, out):
    rows, n = x.shape
    n8 = n // 8 * 8
    inv_n = np.float32(1.0) / np.float32(n)
    for r in prange(rows):
        a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = np.float32(0.0)
        for j in range(0, n8, 8):
            a0 += x[r, j] * x[r, j]
            a1 += x[r, j + 1] * x[r, j + 1]
            a2 += x[r, j + 2] * x[r, j + 2]
            a3 += x[r, j + 3] * x[r, j + 3]
            a4 += x[r, j + 4] * x[r, j + 4]
            a5 += x[r, j + 5] * x[r, j + 5]
            a6 += x[r, j + 6] * x[r, j + 6]
            a7 += x[r, j + 7] * x[r, j + 7]
        tail = np.float32(0.0)
        for j in range(n8, n):
            tail += x[r, j] * x[r, j]
        ms = ((((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))) + tail) * inv_n
        scale = np.float32(1.0) / np.sqrt(ms + eps)
        for j in range(n):
            out[r, j] = x[r, j] * scale


_norm_threads = kernel(parallel=True)(_rms_norm)
_norm_one = kernel()(_rms_norm)
THREADED_FROM = 1 << 16      # values from which the rows go over the threads


def rms_norm(x, *, eps):
    """As reference.rms_norm: x (..., n) / sqrt(mean of its squares over the last axis + eps), float32."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    out = np.empty_like(flat)
    (_norm_threads if flat.size >= THREADED_FROM else _norm_one)(flat, np.float32(eps), out)
    return out.reshape(x.shape)
