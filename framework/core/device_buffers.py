"""For plugins whose tensors live in device buffers (exported by the backend skeleton, framework.backend):
the handles they give the executor, what a lowered program's operands are, and the buffers a program run
needs (scratch, pooled outputs), with weights loaded in the word layout of weight_words.py.

The device (framework.backend.BackendDevice) gives ``new_buffer(nbytes)``, ``buffer_with(array)`` (a
buffer holding the array's bytes), ``read_buffer(buffer, byte_offset, count, dtype)`` (a flat array),
``max_chunk_bytes`` (the most one weight chunk may hold: its buffer type's max_size) and, where its
kernels read scale planes in word pairs, ``even_chunks = True``."""

from __future__ import annotations

from operator import itemgetter

import math
import weakref
from dataclasses import dataclass

import numpy as np

from . import weight_words
from .graph import Tensor


def contiguous_strides(shape) -> tuple:
    """The strides, in elements, of a contiguous tensor of this shape."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


class DeviceTensor:
    """A device handle: elements of a buffer (offset and strides in elements), or host values not yet
    uploaded (``host``: from_host is lazy, so a program copies them straight into a buffer of its own)."""

    __slots__ = ("buffer", "dtype", "host", "lease", "offset", "shape", "strides")

    def __init__(self, buffer, offset: int, shape: tuple, dtype=np.float32, strides: tuple | None = None, host=None,
                 lease=None):
        self.buffer, self.offset, self.shape, self.dtype = buffer, int(offset), tuple(shape), np.dtype(dtype)
        self.strides = strides            # None: contiguous
        self.host = host
        self.lease = lease                # keeps a pooled output buffer out of the pool while a handle lives

    @property
    def contiguous(self) -> bool:
        return self.strides is None or self.strides == contiguous_strides(self.shape)

    def __repr__(self) -> str:
        where = "host" if self.host is not None else f"buffer of {self.buffer.size} bytes at element {self.offset}"
        return f"DeviceTensor({list(self.shape)}, {self.dtype}, {where})"


@dataclass
class Chunk:
    buffer: object
    row0: int
    rows: int
    moff: int          # word offset of the scale plane in the chunk's buffer


class DeviceWeight:
    """A weight in its device layout (weight_words.py), in chunks of whole rows."""

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
        return f"DeviceWeight({self.dtype}, {list(self.shape)}, {len(self.chunks)} chunks)"


class Lease:
    """Held by every handle of a pooled output buffer; the buffer returns to the pool when it is gone."""

    __slots__ = ("__weakref__",)


@dataclass(frozen=True)
class Ref:
    """An operand of a lowered program: an argument or a value computed in it, plus an element offset,
    a shape and strides."""
    kind: str                    # "arg" or "val"
    idx: int
    off: int
    shape: tuple
    strides: tuple | None = None     # None: contiguous

    @property
    def contiguous(self) -> bool:
        return self.strides is None or self.strides == contiguous_strides(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class BufferPools:
    """The buffers a device keeps for program runs, and weights loaded in chunks (mixed into a Device)."""

    even_chunks = False

    def init_pools(self) -> None:
        self._scratch: list = []
        self._pool: dict[int, list] = {}
        self._dummy = None

    def dummy(self):
        """A 16-byte buffer for bindings a kernel does not read."""
        if self._dummy is None:
            self._dummy = self.new_buffer(16)
        return self._dummy

    def scratch(self, i: int, nbytes: int):
        """Scratch buffer i, at least nbytes: internal values of a program run, shared by all programs
        (the queue runs them in order and no internal value outlives its run)."""
        while len(self._scratch) <= i:
            self._scratch.append(None)
        buf = self._scratch[i]
        if buf is None or buf.size < nbytes:
            buf = self._scratch[i] = self.new_buffer(max(nbytes, 256))
        return buf

    def output_buffer(self, nbytes: int):
        """(buffer, lease) for a program's output: the buffer returns to a pool once the lease, held by
        every handle of the buffer, is gone (later commands on the in-order queue see every earlier
        use of it through)."""
        size = max(256, -(-int(nbytes) // 256) * 256)
        free = self._pool.setdefault(size, [])
        buf = free.pop() if free else self.new_buffer(size)
        lease = Lease()
        weakref.finalize(lease, free.append, buf)
        return buf, lease

    def chunk_plan(self, dtype: str, shape: tuple) -> list[tuple[int, int]]:
        return weight_words.chunk_rows(dtype, shape, self.max_chunk_bytes, self.even_chunks)

    def load_weight(self, tensor: Tensor, raw: np.ndarray) -> DeviceWeight:
        dtype = tensor.dtype.name
        if dtype not in weight_words.SUPPORTED:
            raise ValueError(f"{self.name} keeps no {dtype} weights ({tensor.describe()}); supported: "
                             f"{', '.join(sorted(weight_words.SUPPORTED))}")
        raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
        rb = weight_words.row_bytes(dtype, tensor.shape[-1])
        chunks = []
        for row0, rows in self.chunk_plan(dtype, tensor.shape):
            words, moff = weight_words.pack(dtype, raw[row0 * rb:(row0 + rows) * rb])
            chunks.append(Chunk(self.buffer_with(words), row0, rows, moff))
        return DeviceWeight(dtype, tensor.shape, chunks)

    def from_host(self, array: np.ndarray) -> DeviceTensor:
        array = np.asarray(array)
        if array.dtype not in (np.float32, np.int32):
            array = array.astype(np.int32 if np.issubdtype(array.dtype, np.integer) else np.float32)
        return DeviceTensor(None, 0, array.shape, array.dtype, host=array)

    def to_host(self, handle) -> np.ndarray:
        if isinstance(handle, np.ndarray):
            return handle
        if isinstance(handle, DeviceWeight):
            raise TypeError(f"{self.name}: weights are not read back ({handle})")
        if handle.host is not None:
            return np.asarray(handle.host)
        shape, strides = handle.shape, handle.strides or contiguous_strides(handle.shape)
        if math.prod(shape) == 0:
            return np.zeros(shape, handle.dtype)
        span = 1 + sum((d - 1) * s for d, s in zip(shape, strides))
        flat = self.read_buffer(handle.buffer, handle.offset * 4, span, handle.dtype)
        if handle.strides is None:
            return np.array(flat[:math.prod(shape)].reshape(shape), copy=True)
        return np.array(np.lib.stride_tricks.as_strided(flat, shape, tuple(s * 4 for s in strides)), copy=True)


def picker(idx: list[int]):
    """A function of a run's arguments (or a program's results) that returns those at idx, as a tuple: the
    handles a run compares by identity with the last run's (weights, caches)."""
    if not idx:
        return lambda args: ()
    if len(idx) == 1:
        return lambda args: (args[idx[0]],)
    return itemgetter(*idx)
