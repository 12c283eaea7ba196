"""Device layouts of the weight types: GGUF blocks, kept quantized, in 32-bit words.

GGUF blocks are byte arrays of sizes that are not all multiples of 4 (Q4_0: 18 bytes, Q5_0: 22,
Q8_0: 34, Q6_K: 210). A shader reads 32-bit words, so each block's f16 scale ``d`` moves to a plane
of its own after the blocks (two scales a word), and the rest of the block, now a whole number of
words, stays as it is. Q4_1 (20 bytes) and Q4_K (144 bytes) are already word-sized and are kept
byte for byte. The bits are the file's: nothing is dequantized, and the device holds as many bytes
as the file (plus at most one padding word per chunk).

A weight larger than the adapter's storage-binding limit is split into chunks of whole rows, each
its own buffer, and kernels run once per chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

# type -> (byte offset of the f16 d moved to the scale plane, or None to keep the block whole)
D_OFFSET = {"Q4_0": 0, "Q5_0": 0, "Q8_0": 0, "Q6_K": 208, "Q4_1": None, "Q4_K": None}
QUANT_TYPES = tuple(D_OFFSET)
FLOAT_TYPES = ("F32", "F16")
SUPPORTED = frozenset(QUANT_TYPES + FLOAT_TYPES)


@dataclass
class Layout:
    name: str
    block_elems: int
    block_bytes: int
    d_offset: int | None

    @property
    def words_per_block(self) -> int:
        kept = self.block_bytes - (2 if self.d_offset is not None else 0)
        return kept // 4


def layout(qtype_name: str) -> Layout:
    per, size = GGML_QUANT_SIZES[Q[qtype_name]]
    return Layout(qtype_name, per, size, D_OFFSET.get(qtype_name))


def row_bytes(qtype_name: str, n_cols: int) -> int:
    per, size = GGML_QUANT_SIZES[Q[qtype_name]]
    return n_cols // per * size


def repack(qtype_name: str, raw: np.ndarray) -> tuple[np.ndarray, int]:
    """A chunk's file bytes -> (uint32 words for the device, word offset of the scale plane)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if qtype_name in FLOAT_TYPES:
        if raw.size % 4:
            raw = np.concatenate([raw, np.zeros(4 - raw.size % 4, np.uint8)])
        return raw.view(np.uint32), 0
    lay = layout(qtype_name)
    blocks = raw.reshape(-1, lay.block_bytes)
    n = blocks.shape[0]
    if lay.d_offset is None:
        return np.ascontiguousarray(blocks).reshape(-1).view(np.uint32), 0
    o = lay.d_offset
    d = np.ascontiguousarray(blocks[:, o:o + 2]).reshape(-1)
    rest = np.ascontiguousarray(np.concatenate([blocks[:, :o], blocks[:, o + 2:]], axis=1)).reshape(-1)
    if n % 2:
        d = np.concatenate([d, np.zeros(2, np.uint8)])
    words = np.concatenate([rest.view(np.uint32), d.view(np.uint32)])
    return words, rest.size // 4
