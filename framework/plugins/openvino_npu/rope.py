"""The rope tables of the translation, in numpy: the device fills a step's cos and sin from them on the
host, and the translation gathers each dimension's pair partner. Kept apart from translate.py so that
the device module imports without OpenVINO (a machine without it lists the devices as unavailable)."""

from __future__ import annotations

import numpy as np

from ...contract import reference


def rope_partner(mode: str, n_dims: int, d: int) -> np.ndarray:
    """(d,) int32: the index of each dimension's pair partner (itself past n_dims, where sin is 0)."""
    a, b = reference.rope_pairs(mode, n_dims)
    idx = np.arange(d, dtype=np.int32)
    idx[a], idx[b] = b, a
    return idx


def rope_spread(mode: str, n_dims: int, d: int) -> np.ndarray:
    """(n_dims/2, d): frequency i to both members of pair i."""
    a, b = reference.rope_pairs(mode, n_dims)
    m = np.zeros((n_dims // 2, d), dtype=np.float32)
    m[np.arange(n_dims // 2), a] = 1.0
    m[np.arange(n_dims // 2), b] = 1.0
    return m


def rope_table(pos: np.ndarray, rope: tuple) -> tuple[np.ndarray, np.ndarray]:
    """C and S (T, 1, d): the cos and sin of every dimension's pair, spread from the reference's rope
    table (1 and 0 past n_dims)."""
    n_dims, base, scale, mode, d = rope
    a, b = reference.rope_pairs(mode, n_dims)
    cos = np.ones((len(pos), 1, d), dtype=np.float32)
    sin = np.zeros((len(pos), 1, d), dtype=np.float32)
    c, s_ = reference.rope_cos_sin(pos, n_dims, base, scale)
    cos[:, 0, a], cos[:, 0, b] = c, c
    sin[:, 0, a], sin[:, 0, b] = -s_, s_         # out[a] = x[a] c - x[b] s, out[b] = x[b] c + x[a] s
    return cos, sin
