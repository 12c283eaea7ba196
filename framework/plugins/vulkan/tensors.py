"""What the device hands out: tensors in device buffers (or host values not yet uploaded), and weights
in their device layout, split into chunks of whole rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def contig(shape) -> tuple:
    """The strides, in elements, of a contiguous tensor of this shape."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


class VkTensor:
    """A device handle: elements of a buffer (offset and strides in elements), or host values not yet
    uploaded (``host``: from_host is lazy, so a program copies them straight into its own buffer)."""

    __slots__ = ("buffer", "dtype", "host", "lease", "offset", "shape", "strides")

    def __init__(self, buffer, offset: int, shape: tuple, dtype=np.float32, strides: tuple | None = None, host=None,
                 lease=None):
        self.buffer, self.offset, self.shape, self.dtype = buffer, int(offset), tuple(shape), np.dtype(dtype)
        self.strides = strides            # None: contiguous
        self.host = host
        self.lease = lease                # keeps a pooled output buffer out of the pool while a handle lives

    @property
    def contiguous(self) -> bool:
        return self.strides is None or self.strides == contig(self.shape)

    def __repr__(self) -> str:
        where = "host" if self.host is not None else f"buffer {self.buffer.size} bytes @{self.offset}"
        return f"VkTensor({list(self.shape)}, {self.dtype}, {where})"


@dataclass
class Chunk:
    buffer: object
    row0: int
    rows: int
    moff: int          # word offset of the scale plane in this chunk's buffer


class VkWeight:
    """A weight in its device layout (quant.py), split into chunks of whole rows where it is larger than
    one storage binding may be."""

    def __init__(self, dtype: str, shape: tuple, chunks: list[Chunk]):
        self.dtype, self.shape, self.chunks = dtype, tuple(shape), chunks
        self.nbytes = sum(c.buffer.size for c in chunks)

    # a single-chunk F32 weight is also usable as a plain tensor (a norm's gain)
    @property
    def buffer(self):
        return self.chunks[0].buffer

    offset = 0
    strides = None
    host = None

    def __repr__(self) -> str:
        return f"VkWeight({self.dtype}, {list(self.shape)}, {len(self.chunks)} chunks)"


class Lease:
    """Held by every handle of a pooled output buffer; the buffer returns to the pool when it is gone."""

    __slots__ = ("__weakref__",)
