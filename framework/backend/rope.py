"""Rope tables by position, made on the host: each (n_dims, base, scale) table's rows for positions
0..n, made once and made again twice as long when a position reaches past them, so that a decode
step's table is its position's row and computes no trigonometry (a dozen numpy calls on a cold cache
were a tenth of a decode step's host time)."""

from __future__ import annotations

import numpy as np

from ..core.graph import reference


def rope_table(pos: np.ndarray, n_dims: int, base: float, scale: float) -> np.ndarray:
    """(T, n_dims/2) pairs of (cos, sin): the reference's rope table, interleaved."""
    return np.stack(reference.rope_cos_sin(pos, n_dims, base, scale), axis=-1)


class RopeRows:
    """The rows of every rope table a device's programs use, by position."""

    FIRST = 1024          # positions a table holds at first

    def __init__(self):
        self.rows: dict[tuple, np.ndarray] = {}

    def table(self, pos: np.ndarray, n_dims: int, base: float, scale: float) -> np.ndarray:
        if len(pos) == 0:
            return rope_table(pos, n_dims, base, scale)
        key = (n_dims, base, scale)
        rows = self.rows.get(key)
        if len(pos) == 1:
            lo = hi = int(pos[0])
        else:
            lo, hi = int(pos.min()), int(pos.max())
        if lo < 0:                                      # no rows for those: the table of the positions themselves
            return rope_table(pos, n_dims, base, scale)
        if rows is None or hi >= len(rows):
            n = max(self.FIRST, 2 * (hi + 1), 0 if rows is None else 2 * len(rows))
            rows = self.rows[key] = rope_table(np.arange(n, dtype=np.int64), n_dims, base, scale)
        return rows[lo:lo + 1] if len(pos) == 1 else rows[pos]
