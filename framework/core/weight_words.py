"""Device layouts of the weight types for plugins whose kernels read 32-bit words (the Vulkan and OpenCL
plugins): GGUF blocks, kept quantized.

GGUF blocks are byte arrays whose sizes are not all multiples of 4 (Q4_0: 18 bytes, Q5_0: 22, Q8_0: 34,
Q6_K: 210), and whose f16 scale ``d`` sits where it breaks the word alignment of the codes. For those
types each block's ``d`` moves to a plane after the blocks (an array of f16, one a block, two a word) and
the rest of the block, now a whole number of words (16-byte vectors for Q4_0, Q8_0 and Q6_K), stays as it
is; Q4_1 (20 bytes) and Q4_K (144) keep their blocks byte for byte. Nothing is dequantized: the device
holds the file's bytes, plus at most one padding word a chunk.

A weight larger than what one buffer (or one binding) of a device may hold is split into chunks of whole
rows (``chunk_rows``), each its own buffer; kernels run once per chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

# type -> byte offset of the f16 d that moves to the scale plane (None: the block stays whole)
D_OFFSET = {"Q4_0": 0, "Q4_1": None, "Q5_0": 0, "Q8_0": 0, "Q4_K": None, "Q6_K": 208}
QUANT_TYPES = tuple(D_OFFSET)
FLOAT_TYPES = ("F32", "F16")
SUPPORTED = frozenset(QUANT_TYPES + FLOAT_TYPES)
GROUP = 32          # the kernels' unit of K: 32 elements, one block or one sub-block of a K-quant


@dataclass(frozen=True)
class Layout:
    name: str
    block_elems: int
    block_bytes: int
    d_offset: int | None

    @property
    def words_per_block(self) -> int:
        return (self.block_bytes - (2 if self.d_offset is not None else 0)) // 4


def layout(dtype: str) -> Layout:
    per, size = GGML_QUANT_SIZES[Q[dtype]]
    return Layout(dtype, per, size, D_OFFSET.get(dtype))


def row_bytes(dtype: str, n_cols: int) -> int:
    per, size = GGML_QUANT_SIZES[Q[dtype]]
    return n_cols // per * size


def chunk_rows(dtype: str, shape: tuple, max_bytes: int, even: bool = False) -> list[tuple[int, int]]:
    """(first row, rows) of each chunk of a weight: whole rows, each chunk's packed bytes within
    max_bytes (the scale plane and its padding included); `even`: chunks of an even number of rows, so
    that each chunk's scale plane is whole words of two scales (a kernel that reads them in pairs)."""
    rows = math.prod(shape[:-1]) if len(shape) > 1 else 1
    rb = row_bytes(dtype, shape[-1])
    per = max(1, (max_bytes - 64) // max(1, rb))
    if per >= rows:
        return [(0, rows)]
    if even and per > 1:
        per -= per % 2
    return [(r, min(per, rows - r)) for r in range(0, rows, per)]


def pack(dtype: str, raw: np.ndarray) -> tuple[np.ndarray, int]:
    """A chunk's file bytes -> (uint32 words for the device, word offset of its scale plane; 0 if none)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if dtype in FLOAT_TYPES or D_OFFSET[dtype] is None:
        if raw.size % 4:
            raw = np.concatenate([raw, np.zeros(4 - raw.size % 4, np.uint8)])
        return raw.view(np.uint32), 0
    lay = layout(dtype)
    blocks = raw.reshape(-1, lay.block_bytes)
    o = lay.d_offset
    d = np.ascontiguousarray(blocks[:, o:o + 2]).reshape(-1)
    rest = np.ascontiguousarray(np.concatenate([blocks[:, :o], blocks[:, o + 2:]], axis=1)).reshape(-1)
    if d.size % 4:
        d = np.concatenate([d, np.zeros(4 - d.size % 4, np.uint8)])
    return np.concatenate([rest.view(np.uint32), d.view(np.uint32)]), rest.size // 4


def packed_nbytes(dtype: str, shape: tuple, max_bytes: int, even: bool = False) -> int:
    """Device bytes of a weight, all its chunks together."""
    rb = row_bytes(dtype, shape[-1])
    pad = 0 if dtype in FLOAT_TYPES or D_OFFSET[dtype] is None else 4
    return sum(rows * rb + pad for _, rows in chunk_rows(dtype, shape, max_bytes, even))
