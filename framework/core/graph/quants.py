"""Dequantization of GGUF tensor bytes to float32, through gguf.quants (the reference decoder)."""

from __future__ import annotations

import numpy as np
from gguf import quants

from .dtypes import DType


def dequantize(raw: np.ndarray, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values of a tensor stored as `raw` bytes of `dtype`, shaped `shape` (numpy order)."""
    if dtype == DType.F32:
        return np.ascontiguousarray(raw.view(np.float32).reshape(shape))
    if dtype == DType.F16:
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    values = quants.dequantize(np.asarray(raw).reshape(-1, raw.size // max(1, _rows(shape))), dtype)
    return np.ascontiguousarray(values.reshape(shape), dtype=np.float32)


def _rows(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[:-1]:
        n *= d
    return n
