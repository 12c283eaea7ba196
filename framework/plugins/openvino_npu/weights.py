"""GGUF weights as OpenVINO compressed constants.

Every block-quantized GGUF type this module knows is repacked, exactly, into integers with a
scale per block of the file (its own block size), which OpenVINO's CPU plugin runs with its
compressed-weight kernels (FullyConnected over i4/u4/i8 constants, Gather over them) instead of float32
copies::

    Constant(i4 | u4 | i8, (rows, blocks, G)) -> Convert(f32) -> Multiply(scale (rows, blocks, 1))
        -> Reshape(rows, cols) -> MatMul(transpose_b)            (or Gather, for an embedding)

| GGUF   | element | G  | scale        | block offset              | value                     |
| ------ | ------- | -- | ------------ | ------------------------- | ------------------------- |
| Q4_0   | i4      | 32 | d (f16)      | -                         | d * (q - 8)               |
| Q4_1   | i4      | 32 | d (f16)      | m + 8 d                   | d * q + m                 |
| Q5_0   | i8      | 32 | d (f16)      | -                         | d * (q - 16)              |
| Q5_1   | i8      | 32 | d (f16)      | m + 16 d                  | d * q + m                 |
| Q8_0   | i8      | 32 | d (f16)      | -                         | d * q                     |
| Q4_K   | u4      | 32 | d * sc (f32) | m (u8) * -dmin (f16)      | d * sc * q - dmin * m     |
| Q5_K   | i8      | 32 | d * sc (f32) | m (u8) * -dmin (f16)      | d * sc * q - dmin * m     |
| Q6_K   | i8      | 16 | d * sc (f32) | -                         | d * sc * (q - 32)         |

The stored integers of the types without a minimum, and of Q4_1 and Q5_1, are the file's q minus the
middle of its range (8, 16 or 32), so they fit a signed type; the K-quants with a minimum keep the file's
q as it is (Q4_K's as u4). The scales are the file's own (an f16 scale times a 6- or 8-bit sub-scale is
exact in f32). Types with a block minimum (Q4_1, Q5_1, Q4_K, Q5_K) keep it as a per-block offset, which the
matrix product applies either as a zero point (-offset / scale, subtracted inside the decompression
that the FullyConnected kernel fuses) or as ``offsets @ block_sums(x)`` added to the product, as
llama.cpp computes these types (translate.OFFSETS says which, and why). Q4_1's and Q5_1's offsets are
float32 values; the K-quants' are the file's own 6-bit minimums m with -dmin as the scale of each
super-block's eight, so that product is a compressed one too (``offset_codes``, ``offset_scale``), exact
as the rest. Either differs from the file's values by float32 rounding only.

5-bit and 6-bit values have no OpenVINO element type: they take one byte (still the file's integers
with its scales). ``bits=8`` stores the 4-bit types one byte per value too (i8).

F32 stays f32, F16 stays f16 (converted in the graph). Every other type (BF16, Q2_K, Q3_K, the IQ
and TQ types, MXFP4, ...) is **converted at load** to float32 and recorded in
:data:`CONVERTED` (type name -> why), which the device reports.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...contract import DType, block_shape, dequantize

# dtype name -> reason, for every type met that had no exact compressed form
CONVERTED: dict[str, str] = {}

COMPRESSED_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
# a compressed weight's arrays with one entry a row (axis 0): what fusing concatenates and cutting slices
ROW_ARRAYS = ("data", "scale", "offset", "offset_codes", "offset_scale")
NIBBLES = ("i4", "u4")      # elements held two a byte (pack_nibbles)


@dataclass(eq=False)
class OvWeight:
    """A weight ready to become OpenVINO constants.

    kind "plain": ``data`` holds the values (float32 or float16) in the tensor's shape.
    kind "compressed": ``data`` the integers of (rows, blocks, G) values stored as ``element``: for "i8" int8
    (rows, blocks, G); for "i4" and "u4" two values a byte, low nibble first, uint8 (rows, blocks, G / 2), the layout of
    OpenVINO's i4 constants (so the weight is held once, as the model's constant reads it, not also one byte a
    value); ``scale`` (rows, blocks, 1) float16/float32, ``offset`` None or (rows, blocks) float32:
    value = scale * q + offset; the K-quants' offsets are held as codes instead: ``offset_codes`` (rows, blocks / 8, 8)
    uint8 times ``offset_scale`` (rows, blocks / 8, 1) float16 (``offset`` None). ``offsets`` gives either as float32.
    """

    name: str
    dtype: str                      # the GGUF type it came from
    shape: tuple[int, ...]
    kind: str
    data: np.ndarray
    element: str = ""
    scale: np.ndarray | None = None
    offset: np.ndarray | None = None
    offset_codes: np.ndarray | None = None
    offset_scale: np.ndarray | None = None
    note: str = ""                  # set when converted at load
    _constants: dict = field(default_factory=dict, repr=False)   # OpenVINO constants, made once

    @property
    def group(self) -> int:
        """Values a block (compressed weights)."""
        return self.data.shape[-1] * (2 if self.element in NIBBLES else 1)

    @property
    def codes(self) -> np.ndarray:
        """(rows, blocks, G) int8: the stored integers, one a byte (unpacked from nibbles for i4 and u4)."""
        if self.element not in NIBBLES:
            return self.data
        return unpack_nibbles(self.data, signed=self.element == "i4")

    @property
    def offset_form(self) -> str | None:
        """How the block offsets are held: "codes" (offset_codes * offset_scale), "float32" or None (none)."""
        return "codes" if self.offset_codes is not None else "float32" if self.offset is not None else None

    @property
    def offsets(self) -> np.ndarray | None:
        """(rows, blocks) float32 block offsets, whichever form holds them; None for a type without."""
        if self.offset_codes is None:
            return self.offset
        rows = self.offset_codes.shape[0]
        return (self.offset_codes.astype(np.float32) * self.offset_scale.astype(np.float32)).reshape(rows, -1)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (getattr(self, f) for f in ROW_ARRAYS) if a is not None)


def packed_nbytes(element: str, count: int) -> int:
    return (count + 1) // 2 if element in NIBBLES else count


def pack_nibbles(q: np.ndarray) -> np.ndarray:
    """(..., G) integers in -8..7 (or 0..15) -> (..., G / 2) uint8, element 2i in the low nibble of byte i
    (OpenVINO's i4 and u4)."""
    u = q.view(np.uint8) if q.dtype == np.int8 else q.astype(np.int8).view(np.uint8)
    return np.ascontiguousarray((u[..., 0::2] & 0x0F) | ((u[..., 1::2] & 0x0F) << 4))


def unpack_nibbles(packed: np.ndarray, signed: bool = True) -> np.ndarray:
    """The inverse of :func:`pack_nibbles`: (..., G / 2) uint8 -> (..., G) int8 (-8..7, or 0..15 unsigned)."""
    lo = (packed & 0x0F).astype(np.int8)
    hi = (packed >> 4).astype(np.int8)
    out = np.stack([lo, hi], axis=-1).reshape(packed.shape[:-1] + (packed.shape[-1] * 2,))
    return np.where(out > 7, out - 16, out).astype(np.int8) if signed else out


def _blocks(raw: np.ndarray, dtype: DType, shape) -> np.ndarray:
    per, nbytes = block_shape(dtype)
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    flat = np.asarray(raw).reshape(-1)
    want = rows * (shape[-1] // per) * nbytes
    if shape[-1] % per or flat.size != want:
        raise ValueError(f"{dtype.name} tensor of shape {list(shape)} needs {want} bytes "
                         f"({shape[-1]} columns in blocks of {per}), got {flat.size}")
    return flat.reshape(rows * (shape[-1] // per), nbytes)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles_split(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32): low nibbles are elements 0..15, high nibbles 16..31 (Q4_0/Q4_1/Q5_x)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes, little-endian u32 -> (n, 32) bits."""
    return np.unpackbits(qh, axis=-1, bitorder="little")


def _k4_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], axis=-1)
    mn = np.concatenate([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], axis=-1)
    return sc, mn


def unpack(raw: np.ndarray, dtype: DType, shape) -> tuple[np.ndarray, np.ndarray, np.ndarray | tuple | None, int]:
    """(q (n_groups, G) integers, scale (n_groups,), offset, G): value = scale*q + offset, where offset is None,
    (n_groups,) float32, or for the K-quants (m (n_groups,) uint8, -dmin (n_groups / 8,) float16): -dmin * m."""
    name = dtype.name
    b = _blocks(raw, dtype, shape)
    if name == "Q8_0":
        return b[:, 2:].view(np.int8), _f16(b[:, :2])[:, 0], None, 32
    if name == "Q4_0":
        return _nibbles_split(b[:, 2:]).astype(np.int8) - 8, _f16(b[:, :2])[:, 0], None, 32
    if name == "Q4_1":
        return _nibbles_split(b[:, 4:]), _f16(b[:, :2])[:, 0], _f16(b[:, 2:4])[:, 0], 32
    if name == "Q5_0":
        q = _nibbles_split(b[:, 6:]) | (_high_bits(b[:, 2:6]) << 4)
        return q.astype(np.int8) - 16, _f16(b[:, :2])[:, 0], None, 32
    if name == "Q5_1":
        q = _nibbles_split(b[:, 8:]) | (_high_bits(b[:, 4:8]) << 4)
        return q, _f16(b[:, :2])[:, 0], _f16(b[:, 2:4])[:, 0], 32
    if name in ("Q4_K", "Q5_K"):
        n = b.shape[0]
        d = _f16(b[:, 0:2])
        sc, mn = _k4_scales(b[:, 4:16])
        if name == "Q4_K":
            qs = b[:, 16:].reshape(n, 4, 1, 32)
            q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
        else:
            qh = b[:, 16:48].reshape(n, 1, 32)
            qs = b[:, 48:].reshape(n, 4, 1, 32)
            q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(n, 8, 32)
            hi = (qh >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)) & 1
            q = q | (hi << 4)
        scale = (d * sc.astype(np.float32)).reshape(-1)
        minus_dmin = (-np.ascontiguousarray(b[:, 2:4]).view(np.float16)).reshape(-1)
        return q.reshape(n * 8, 32), scale, (mn.astype(np.uint8).reshape(-1), minus_dmin), 32
    if name == "Q6_K":
        n = b.shape[0]
        ql, qh = b[:, :128], b[:, 128:192]
        sc = b[:, 192:208].view(np.int8).astype(np.float32)
        d = _f16(b[:, 208:210])
        lo = ql.reshape(n, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        lo = (lo & 0x0F).reshape(n, 8, 32)
        hi = qh.reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)
        hi = (hi & 0x03).reshape(n, 8, 32)
        q = (lo | (hi << 4)).astype(np.int8) - 32
        return q.reshape(n * 16, 16), (d * sc).reshape(-1), None, 16
    raise KeyError(name)


MIDDLE = {"Q4_1": 8, "Q5_1": 16}     # the K-quants keep q as it is: their offsets are -dmin * m (codes)


def load(name: str, dtype: DType, shape, raw: np.ndarray, bits: int = 4) -> OvWeight:
    """Repack a GGUF tensor's bytes (see the module docstring)."""
    shape = tuple(int(s) for s in shape)
    tname = dtype.name
    if tname == "F32":
        return OvWeight(name, tname, shape, "plain", np.array(np.asarray(raw).view(np.float32).reshape(shape)))
    if tname == "F16":
        return OvWeight(name, tname, shape, "plain", np.array(np.asarray(raw).view(np.float16).reshape(shape)))
    if tname not in COMPRESSED_TYPES:
        why = (f"{tname} has no exact compressed form in OpenVINO's weight-compression pattern: converted to "
               f"float32 at load")
        CONVERTED[tname] = why
        return OvWeight(name, tname, shape, "plain", dequantize(np.asarray(raw), dtype, shape), note=why)
    q, scale, offset, group = unpack(raw, dtype, shape)
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    blocks = shape[-1] // group
    offset_codes = offset_scale = None
    if isinstance(offset, tuple):   # K-quants: the minimums' codes, eight a super-block, and -dmin as their scale
        m, minus_dmin = offset
        offset_codes = np.ascontiguousarray(m.reshape(rows, blocks // 8, 8))
        offset_scale = np.ascontiguousarray(minus_dmin.reshape(rows, blocks // 8, 1))
        offset = None
    elif offset is not None:        # value = scale * q + offset = scale * (q - mid) + (offset + mid * scale)
        mid = MIDDLE[tname]
        q = q.astype(np.int8) - np.int8(mid)
        offset = (offset + np.float32(mid) * scale).astype(np.float32)
    element = ("u4" if tname == "Q4_K" else "i4") if tname in ("Q4_0", "Q4_1", "Q4_K") and bits == 4 else "i8"
    q = q.reshape(rows, blocks, group)
    data = pack_nibbles(q.astype(np.int8, copy=False)) if element in NIBBLES else np.array(q, dtype=np.int8)
    exact_f16 = tname in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")       # d is the file's f16 value
    scale_arr = np.ascontiguousarray(scale.astype(np.float16 if exact_f16 else np.float32).reshape(rows, blocks, 1))
    off_arr = None if offset is None else np.ascontiguousarray(offset.reshape(rows, blocks))
    return OvWeight(name, tname, shape, "compressed", data, element=element, scale=scale_arr, offset=off_arr,
                    offset_codes=offset_codes, offset_scale=offset_scale)


def values(w: OvWeight) -> np.ndarray:
    """float32 values of a loaded weight (for tests and for handing a weight to the host)."""
    if w.kind == "plain":
        return w.data.astype(np.float32).reshape(w.shape)
    x = w.codes.astype(np.float32) * w.scale.astype(np.float32)
    if w.offset_form is not None:
        x = x + w.offsets[..., None]
    return x.reshape(w.shape)


def nbytes_for(dtype: DType, shape, bits: int = 4) -> int:
    """Bytes :func:`load` will hold for a tensor of this type and shape (without loading it)."""
    n = int(np.prod(shape))
    tname = dtype.name
    if tname == "F32":
        return n * 4
    if tname == "F16":
        return n * 2
    if tname not in COMPRESSED_TYPES:
        return n * 4
    group = 16 if tname == "Q6_K" else 32
    blocks = n // group
    data = n // 2 if tname in ("Q4_0", "Q4_1", "Q4_K") and bits == 4 else n
    scale = blocks * (2 if tname in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0") else 4)
    offset = blocks * 4 if tname in MIDDLE else blocks + blocks // 8 * 2 if tname in ("Q4_K", "Q5_K") else 0
    return data + scale + offset
