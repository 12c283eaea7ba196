"""GGUF weights to and from the tile layout of geometry.py (numpy, whole arrays, no per-element loops).

Which GGUF types keep their values (see :func:`conversion_of`):

* ``Q4_0``, ``Q4_1``, ``Q4_K`` are **repacked**: their 4-bit integers are copied as they are (a Q4_K
  super-block is 8 groups of 32 with scale ``d * sc`` and minimum ``-dmin * m``; a Q4_0 block is
  scale ``d`` and minimum ``-8 d``). Their scales and minimums are float16 (Q4_K: float32 products)
  in the file and bfloat16 in a tile, so they are *rounded to bfloat16* (8 significant bits instead
  of 11): not bit-exact, but the integers, groups and grid are the file's.
* every other type (Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q5_K, Q6_K, IQ*, F16, BF16, F32, ...) is
  **requantized**: dequantized with gguf's reference decoder, then each group of 32 values is
  rounded again to 4 bits (min/max Q4_1). That changes the model's values, so the device refuses
  those weights unless asked to requantize (FRAMEWORK_XDNA_REQUANTIZE=allow).
"""

from __future__ import annotations

import numpy as np

from ...contract import DType, dequantize, row_bytes
from .geometry import (
    CHUNK_BYTES,
    GROUP,
    NIBBLE_BYTES,
    SCALE_BYTES,
    TILE_COLS,
    TILE_ROWS,
    Grid,
)

REPACKED_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K"})
ROW_TILES_PER_PASS = 64          # rows packed or decoded per pass: 64 x 32 rows bounds the temporaries


def conversion_of(dtype_name: str) -> str:
    """'repacked' (integers kept, scales rounded to bfloat16) or 'requantized' (values re-rounded)."""
    return "repacked" if dtype_name in REPACKED_TYPES else "requantized"


def describe_conversion(dtype_name: str) -> str:
    if dtype_name in REPACKED_TYPES:
        return (f"{dtype_name} repacked: 4-bit integers kept as they are, scales and minimums rounded to "
                f"bfloat16")
    return f"{dtype_name} requantized to Q4_1 tiles: every group of 32 values rounded again to 4 bits (lossy)"


# -- bfloat16 -----------------------------------------------------------------------------------------
def to_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bits (uint16), rounding to nearest even."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def from_bf16(b: np.ndarray) -> np.ndarray:
    """bfloat16 bits (uint16) -> float32 (exact)."""
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (what the NPU kernels read activations as)."""
    return from_bf16(to_bf16(x))


# -- GGUF rows -> (q, scale, minimum) per group of 32 -------------------------------------------------------
def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., start:start + 2]).view(np.float16)[..., 0].astype(np.float32)


def _groups_q4_1(raw: np.ndarray, rows: int, k: int):
    b = raw.reshape(rows, k // 32, 20)
    d, m = _f16(b, 0), _f16(b, 2)
    qs = b[..., 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, k)
    return q, d, m


def _groups_q4_0(raw: np.ndarray, rows: int, k: int):
    b = raw.reshape(rows, k // 32, 18)
    d = _f16(b, 0)
    qs = b[..., 2:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, k)
    return q, d, d * np.float32(-8.0)


def _groups_q4_k(raw: np.ndarray, rows: int, k: int):
    b = raw.reshape(rows, k // 256, 144)
    d, dmin = _f16(b, 0), _f16(b, 2)
    s = b[..., 4:16].reshape(rows, k // 256, 3, 4)
    lo, mid, hi = s[..., 0, :], s[..., 1, :], s[..., 2, :]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=-1).astype(np.float32)
    mn = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], axis=-1).astype(np.float32)
    qs = b[..., 16:].reshape(rows, k // 256, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-2).reshape(rows, k)     # chunk j: groups 2j, 2j + 1
    scale = (d[..., None] * sc).reshape(rows, k // 32)
    minimum = -(dmin[..., None] * mn).reshape(rows, k // 32)
    return q, scale, minimum


_EXACT = {"Q4_1": _groups_q4_1, "Q4_0": _groups_q4_0, "Q4_K": _groups_q4_k}


def quantize_groups(values: np.ndarray):
    """Requantize float32 rows (rows, K) to Q4_1 groups, with the scale and minimum already rounded to
    bfloat16 so the integers are chosen for the values the tiles will hold."""
    rows, k = values.shape
    kg = -(-k // GROUP) * GROUP
    if kg != k:
        values = np.pad(values, ((0, 0), (0, kg - k)))
    g = values.reshape(rows, kg // GROUP, GROUP)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    scale = round_bf16((hi - lo) / np.float32(15))
    minimum = round_bf16(lo)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    q = np.rint((g - minimum[..., None]) * inv[..., None])
    q = np.clip(q, 0, 15).astype(np.uint8).reshape(rows, kg)
    return q[:, :k], scale, minimum


def groups_from_gguf(raw: np.ndarray, dtype: DType, rows: int, k: int):
    """(q uint8 (rows, K), scale float32 (rows, K/32), minimum float32 (rows, K/32)) of consecutive rows
    of a GGUF tensor given as its raw bytes. Repacked types keep their integers; others are
    requantized (and the scale/minimum of a K that is not a multiple of 32 cover the zero padding)."""
    fn = _EXACT.get(dtype.name)
    if fn is not None:
        return fn(np.asarray(raw, dtype=np.uint8), rows, k)
    return quantize_groups(dequantize(np.asarray(raw, dtype=np.uint8), dtype, (rows, k)))


# -- tiles ------------------------------------------------------------------------------------------------
def _pack_block(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray, grid: Grid, out: np.ndarray) -> None:
    """Pack a block of whole row tiles (q: (R*32, K) at most, zero-padded here to the grid) into out."""
    r_rows = out.shape[0] // (grid.col_tiles * CHUNK_BYTES) * TILE_ROWS
    ct, pc = grid.col_tiles, grid.padded_cols
    qp = np.zeros((r_rows, pc), dtype=np.uint8)
    qp[:q.shape[0], :q.shape[1]] = q
    sp = np.zeros((r_rows, pc // GROUP), dtype=np.uint16)
    mp = np.zeros((r_rows, pc // GROUP), dtype=np.uint16)
    sp[:scale.shape[0], :scale.shape[1]] = to_bf16(scale)
    mp[:minimum.shape[0], :minimum.shape[1]] = to_bf16(minimum)
    r = r_rows // TILE_ROWS
    tiles = out.reshape(r, ct, CHUNK_BYTES)
    per = TILE_COLS // GROUP
    tiles[..., :SCALE_BYTES] = sp.reshape(r, TILE_ROWS, ct, per).transpose(0, 2, 1, 3).reshape(r, ct, -1) \
        .view(np.uint8).reshape(r, ct, SCALE_BYTES)
    tiles[..., SCALE_BYTES:2 * SCALE_BYTES] = mp.reshape(r, TILE_ROWS, ct, per).transpose(0, 2, 1, 3) \
        .reshape(r, ct, -1).view(np.uint8).reshape(r, ct, SCALE_BYTES)
    q4 = qp.reshape(r, TILE_ROWS, ct, TILE_COLS).transpose(0, 2, 1, 3)
    tiles[..., 2 * SCALE_BYTES:] = (q4[..., 0::2] | (q4[..., 1::2] << 4)).reshape(r, ct, NIBBLE_BYTES)


def pack(raw: np.ndarray, dtype: DType, grid: Grid) -> np.ndarray:
    """The tile bytes (uint8, grid.nbytes) of a GGUF tensor of shape grid.shape stored as ``raw``."""
    out = np.zeros(grid.nbytes, dtype=np.uint8)
    rb = row_bytes(dtype, grid.cols)
    raw = np.asarray(raw, dtype=np.uint8).reshape(-1)
    per_tile_row = grid.col_tiles * CHUNK_BYTES
    for rt0 in range(0, -(-grid.rows // TILE_ROWS), ROW_TILES_PER_PASS):
        r0 = rt0 * TILE_ROWS
        r1 = min(grid.rows, r0 + ROW_TILES_PER_PASS * TILE_ROWS)
        q, scale, minimum = groups_from_gguf(raw[r0 * rb:r1 * rb], dtype, r1 - r0, grid.cols)
        rts = -(-(r1 - r0) // TILE_ROWS)
        _pack_block(q, scale, minimum, grid, out[rt0 * per_tile_row:(rt0 + rts) * per_tile_row])
    return out


def pack_groups(q: np.ndarray, scale: np.ndarray, minimum: np.ndarray, grid: Grid) -> np.ndarray:
    """Tile bytes from explicit groups (q (N, K), scale and minimum (N, ceil(K/32))): for tests and tools."""
    out = np.zeros(grid.nbytes, dtype=np.uint8)
    per_tile_row = grid.col_tiles * CHUNK_BYTES
    for rt0 in range(0, grid.row_tiles, ROW_TILES_PER_PASS):
        r0, r1 = rt0 * TILE_ROWS, min(q.shape[0], (rt0 + ROW_TILES_PER_PASS) * TILE_ROWS)
        rts = min(ROW_TILES_PER_PASS, grid.row_tiles - rt0)
        if r1 > r0:
            _pack_block(q[r0:r1], scale[r0:r1], minimum[r0:r1], grid,
                        out[rt0 * per_tile_row:(rt0 + rts) * per_tile_row])
    return out


def regrid(buf: np.ndarray, src: Grid, dst: Grid) -> np.ndarray:
    """The tiles of ``src`` (a wider grid) on ``dst`` (the shape's own grid), exactly: tiles are
    independent chunks, so this selects them, then clears everything outside the shape inside the
    partial tiles (whatever another packer left in its padding, the NPU then multiplies zeros by zeros
    or by finite minimums, never by NaN). Only the NPU arm needs it: its GEMMs are per grid."""
    if src.shape != dst.shape or dst.row_tiles > src.row_tiles or dst.col_tiles > src.col_tiles:
        raise ValueError(f"regrid: {src.describe()} does not contain {dst.describe()}")
    t = np.asarray(buf, dtype=np.uint8).reshape(src.row_tiles, src.col_tiles, CHUNK_BYTES)
    out = np.ascontiguousarray(t[:dst.row_tiles, :dst.col_tiles])
    per = TILE_COLS // GROUP                  # groups in a tile row: scale/minimum bytes 2 * per per row
    row_bytes = TILE_COLS // 2                # nibble bytes of a tile row
    rows_last = dst.rows - (dst.row_tiles - 1) * TILE_ROWS          # rows used in the last row tile
    if rows_last < TILE_ROWS:
        out[-1, :, rows_last * 2 * per:SCALE_BYTES] = 0
        out[-1, :, SCALE_BYTES + rows_last * 2 * per:2 * SCALE_BYTES] = 0
        out[-1, :, 2 * SCALE_BYTES + rows_last * row_bytes:] = 0
    cols_last = dst.cols - (dst.col_tiles - 1) * TILE_COLS          # columns used in the last column tile
    if cols_last < TILE_COLS:
        g0 = -(-cols_last // GROUP)                                 # first group wholly outside the shape
        for r in range(TILE_ROWS):
            out[:, -1, r * 2 * per + 2 * g0:(r + 1) * 2 * per] = 0
            out[:, -1, SCALE_BYTES + r * 2 * per + 2 * g0:SCALE_BYTES + (r + 1) * 2 * per] = 0
            base = 2 * SCALE_BYTES + r * row_bytes
            if cols_last % 2:
                out[:, -1, base + cols_last // 2] &= 0x0F
            out[:, -1, base - (-cols_last // 2):base + row_bytes] = 0
    return out.reshape(-1)


def decode(buf: np.ndarray, grid: Grid, *, crop: bool = True) -> np.ndarray:
    """float32 values of tile bytes on ``grid``: (N, K) cropped to the shape, or the padded grid."""
    buf = np.asarray(buf, dtype=np.uint8).reshape(-1)
    if buf.size != grid.nbytes:
        raise ValueError(f"decode: {buf.size} bytes for a grid of {grid.nbytes}")
    rows, cols = (grid.rows, grid.cols) if crop else grid.padded_shape
    out = np.empty((rows, cols), dtype=np.float32)
    ct = grid.col_tiles
    per = TILE_COLS // GROUP
    per_tile_row = ct * CHUNK_BYTES
    for rt0 in range(0, grid.row_tiles, ROW_TILES_PER_PASS):
        r0 = rt0 * TILE_ROWS
        if r0 >= rows:
            break
        r = min(ROW_TILES_PER_PASS, grid.row_tiles - rt0)
        tiles = buf[rt0 * per_tile_row:(rt0 + r) * per_tile_row].reshape(r, ct, CHUNK_BYTES)
        sc = from_bf16(tiles[..., :SCALE_BYTES].copy().view(np.uint16)).reshape(r, ct, TILE_ROWS, per, 1)
        mn = from_bf16(tiles[..., SCALE_BYTES:2 * SCALE_BYTES].copy().view(np.uint16)) \
            .reshape(r, ct, TILE_ROWS, per, 1)
        nib = tiles[..., 2 * SCALE_BYTES:].reshape(r, ct, TILE_ROWS, TILE_COLS // 2)
        q = np.empty((r, ct, TILE_ROWS, TILE_COLS), dtype=np.float32)
        q[..., 0::2] = nib & 0x0F
        q[..., 1::2] = nib >> 4
        vals = q.reshape(r, ct, TILE_ROWS, per, GROUP) * sc + mn
        block = vals.reshape(r, ct, TILE_ROWS, TILE_COLS).transpose(0, 2, 1, 3).reshape(r * TILE_ROWS, -1)
        r1 = min(rows, r0 + r * TILE_ROWS)
        out[r0:r1] = block[:r1 - r0, :cols]
    return out
