"""The CPU plugin's fast path for products with quantized weights: the GGUF blocks read as they are stored.

As llama.cpp's CPU backend does, the activations are quantized to 8 bits per 32-element group (q8: one
float32 scale and 32 int8 values, plus the integer sum of the 32 for the types whose blocks carry a
minimum or an offset) and each block's product is an integer dot product, scaled once per block. The
weights stay in the file's bytes (a Q4_1 weight: 20 bytes per 32 values, not 128 in float32), which also
is what a decode step has to stream from memory. The kernels, compiled by numba (cached on disk, see
jit.py), run the rows of the weight over the CPU's threads (``prange``): up to 8 activation rows (a decode
step, speculative verification, several sequences' decode) take _matmul, which reads each block of eight
weight rows once and multiplies it by every activation row; a prefill chunk takes _matmul_tiled. The
activations are quantized once per input and run: the products that read one input (q, k and v; gate and
up) share its 8-bit form (SharedActivations).
The other weight types are multiplied in float32, their activations first rounded as llama.cpp rounds them
for that type (ACTIVATION_ROUNDING), so the path's numerics are llama.cpp's for every type.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math

import numpy as np
from numba import prange

from ...contract import DType, LeafKind, dequantize, ops, reference, release_file_pages
from .jit import cache_dir, kernel, target  # noqa: F401 (the plugin's and the tests' entry)
from .vectors import (INTERLEAVED, KINDS, LAYOUTS, SIGNED, TILE_BYTES, TILE_M, TILE_R, kind_of, row_dot, rows_dot,
                      tile_dot, unpack_row, unpack_tile)

QK = 32      # values per activation group (q8), and per block of the 32-value weight types


# -- the activations, in 8 bits -------------------------------------------------------------------------
@kernel()
def _f16(v):
    """v rounded to the nearest float16 (ties to even), as float32: the F16C conversion by which llama.cpp
    stores the scale (and the sum) of a q8_0 or q8_1 block."""
    a = abs(v)
    if a == 0.0:
        return np.float32(0.0)
    if a < 2.0 ** -14:                     # float16's subnormals: steps of 2^-24
        return np.float32(np.rint(np.float64(v) * 2.0 ** 24) * 2.0 ** -24)
    m, e = math.frexp(np.float64(v))       # 11 significant bits
    return np.float32(math.ldexp(np.rint(m * 2048.0), e - 11))


def _quantize_q8(x, xq, xd, xsum, sums_f16):
    """Each row of x (M, K) in groups of 32, as ggml's quantize_row_q8_0 / q8_1 (AVX2) round them: values
    round(x * 127 / max|x|) in int8, the scale d = max|x| / 127 kept in float16 (the block's field), and the
    group's sum of values times d (what a weight's minimum or offset multiplies): for q8_1 (sums_f16, the
    Q4_1 and Q5_1 weights) the block's float16 field fp16(d * sum), else the sum times the float16 d."""
    m_rows, k = x.shape
    for m in prange(m_rows):
        for g in range(k // QK):
            base = g * QK
            amax = np.float32(0.0)
            for i in range(QK):
                amax = max(amax, abs(x[m, base + i]))
            d = amax / np.float32(127.0)
            inv = np.float32(127.0) / amax if amax > 0 else np.float32(0.0)
            s = 0
            for i in range(QK):
                q = np.int32(np.rint(x[m, base + i] * inv))
                xq[m, base + i] = q
                s += q
            xd[m, g] = _f16(d)
            xsum[m, g] = _f16(np.float32(s) * d) if sums_f16 else np.float32(s) * xd[m, g]


# Two builds of one loop (a decode step's one row does not pay for waking the threads; see _matmul_one)
_quantize_threads = kernel(parallel=True)(_quantize_q8)
_quantize_one = kernel()(_quantize_q8)


QK_K = 256   # values per activation block for the K-quant weights (ggml's q8_K)


def _quantize_q8_k(x, xq, xd, xsum):
    """ggml's quantize_row_q8_K, which llama.cpp pairs with the K-quant weights: per 256 values one scale,
    from the value of largest magnitude (sign kept): iscale = -127 / that value, q = round(iscale * x)
    (at most 127), d = 1 / iscale. The scale is written for each of the block's 8 groups of 32 (what the
    products read), with each group's sum of values times d."""
    m_rows, k = x.shape
    for m in prange(m_rows):
        for b in range(k // QK_K):
            base = b * QK_K
            amax = np.float32(0.0)
            top = np.float32(0.0)
            for i in range(QK_K):
                ax = abs(x[m, base + i])
                if ax > amax:
                    amax = ax
                    top = x[m, base + i]
            iscale = np.float32(-127.0) / top if amax > 0 else np.float32(0.0)
            d = np.float32(1.0) / iscale if amax > 0 else np.float32(0.0)
            for g in range(QK_K // QK):
                s = 0
                for i in range(QK):
                    q = min(127, np.int32(np.rint(iscale * x[m, base + g * QK + i])))
                    xq[m, base + g * QK + i] = q
                    s += q
                xd[m, b * (QK_K // QK) + g] = d
                xsum[m, b * (QK_K // QK) + g] = np.float32(s) * d


_quantize_k_threads = kernel(parallel=True)(_quantize_q8_k)
_quantize_k_one = kernel()(_quantize_q8_k)


def quantize_activations(x: np.ndarray, k_quant: bool = False,
                         q8_1: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values int8 (M, K), scales float32 (M, K/32), group sums float32 (M, K/32)) of float32 x (M, K):
    in groups of 32 (q8_0, llama.cpp's for the 32-value types; q8_1, with its float16 sums, for Q4_1 and
    Q5_1) or, for a K-quant weight, in blocks of 256 (q8_K), as llama.cpp rounds them."""
    m, k = x.shape
    xq = np.empty((m, k), np.int8)
    xd = np.empty((m, k // QK), np.float32)
    xsum = np.empty((m, k // QK), np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if k_quant:
        (_quantize_k_threads if m >= 16 else _quantize_k_one)(x, xq, xd, xsum)
    else:
        (_quantize_threads if m >= 16 else _quantize_one)(x, xq, xd, xsum, q8_1)
    return xq, xd, xsum


# -- the products: out[m, r] = sum over k of weight[r, k] * x[m, k] --------------------------------------
# For a decode step and a few activation rows (speculative verification, several sequences' decode): eight
# weight rows at a time, each block read once and unpacked in registers, times ROWS_AT_ONCE activation rows
# (vectors.rows_dot, one intrinsic for every type and count); row_dot for the weight's last N mod 8 rows.
# From two activation rows on, the eight weight rows are turned a row a lane once a block (rows_dot's lanes)
# and each activation row's bytes broadcast, as the tiles do: no shuffles a row; one row keeps the values in
# the lanes (a transposition costs more than one row's gathering of sums), but for Q8_0 (vectors.ONE_ROW_LANES)
# and the weights held interleaved (already a row a lane).
FORMATS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q6_K", "Q5_K", "IQ4_NL", "IQ4_XS", "Q3_K")
(_q4_0_1, _q4_1_1, _q5_0_1, _q5_1_1, _q8_0_1, _q4_k_1, _q6_k_1, _q5_k_1, _iq4nl_1, _iq4xs_1,
 _q3_k_1) = (row_dot(LAYOUTS[f]) for f in FORMATS)
# then the types held interleaved where their rows come in eights (interleave, below), fmt len(FORMATS) on
_HELD = [dataclasses.replace(LAYOUTS[f], interleaved=True) for f in INTERLEAVED]
_LAYOUTS = [LAYOUTS[f] for f in FORMATS] + _HELD
# the signed types, whose few-row products on VNNI take their values biased to unsigned (vectors._bias_of)
BIASED = tuple(layout.name in SIGNED and target()[1] == "vnni" for layout in _LAYOUTS)
ROWS_AT_ONCE = (8, 4, 2, 1)  # activation rows a pass over eight weight rows multiplies, largest first
# Q4_K and Q5_K take eight activation rows as two passes of four: a block's words unpacked for eight rows' chains
# at once ran 1.5-1.7x slower than two passes on a Zen 4; the other types run faster eight at a time
# (`python benchmarks/cpu_products.py --few gemma3,smollm2 --base BASE --threads 2`,
# benchmarks/results/cpu_few_rows_biased_vnni_2threads-2026-12-07.log: Gemma 3's Q4_K ffn_down at 8 rows 0.130
# -> 0.088 ms)
EIGHT_AT_ONCE = tuple(layout.name not in ("Q4_K", "Q5_K") for layout in _LAYOUTS)
_NOT_EIGHT = frozenset(i for i, eight in enumerate(EIGHT_AT_ONCE) if not eight)     # left out of _rows8's code
_rows8, _rows4, _rows2, _rows1 = (rows_dot(_LAYOUTS, n, _NOT_EIGHT if n == 8 else frozenset()) for n in ROWS_AT_ONCE)


@kernel()
def _dot1(fmt, row, xq, xd, xsum, m):
    if fmt == 0:
        return _q4_0_1(row, xq, xd, xsum, m)
    if fmt == 1:
        return _q4_1_1(row, xq, xd, xsum, m)
    if fmt == 2:
        return _q5_0_1(row, xq, xd, xsum, m)
    if fmt == 3:
        return _q5_1_1(row, xq, xd, xsum, m)
    if fmt == 4:
        return _q8_0_1(row, xq, xd, xsum, m)
    if fmt == 5:
        return _q4_k_1(row, xq, xd, xsum, m)
    if fmt == 6:
        return _q6_k_1(row, xq, xd, xsum, m)
    if fmt == 7:
        return _q5_k_1(row, xq, xd, xsum, m)
    if fmt == 8:
        return _iq4nl_1(row, xq, xd, xsum, m)
    if fmt == 9:
        return _iq4xs_1(row, xq, xd, xsum, m)
    return _q3_k_1(row, xq, xd, xsum, m)


@kernel()
def _bias_sums(xq):
    """For a signed type's few-row products on VNNI (vectors._bias_of): 128 x the sum of each 16 activation
    values, int32 (M, K / 16), as float32 bits (the place of the group sums, which these types do not read)."""
    m_rows, halves = xq.shape[0], xq.shape[1] // 16
    sums = np.empty((m_rows, halves), np.int32)
    for m in range(m_rows):
        for h in range(halves):
            t = 0
            for i in range(16):
                t += xq[m, h * 16 + i]
            sums[m, h] = 128 * t
    return sums.view(np.float32)


def _matmul(fmt, w, xq, xd, xsum, out):
    """out (M, N) = x (M, K) @ w^T for weight rows w (N, bytes per row) of format FORMATS[fmt], for a few
    activation rows (_matmul_tiled takes many): the weight's rows in blocks of eight over the threads (numba
    splits the blocks into one contiguous run a thread, so the head's 151,936 rows go half to each of two),
    each block read once and multiplied by every activation row, eight (then four, two, one) at a time."""
    m_rows, n_rows = xq.shape[0], w.shape[0]
    if BIASED[fmt]:
        xsum = _bias_sums(xq)
    n8 = n_rows // TILE_R
    for q in prange(n8):
        r = q * TILE_R
        m = 0
        while m_rows - m >= 8 and EIGHT_AT_ONCE[fmt]:
            _rows8(fmt, w, r, xq, xd, xsum, m, out)
            m += 8
        while m_rows - m >= 4:
            _rows4(fmt, w, r, xq, xd, xsum, m, out)
            m += 4
        if m_rows - m >= 2:
            _rows2(fmt, w, r, xq, xd, xsum, m, out)
            m += 2
        if m < m_rows:
            _rows1(fmt, w, r, xq, xd, xsum, m, out)
    for r in range(n8 * TILE_R, n_rows):
        for m in range(m_rows):
            out[m, r] = _dot1(fmt, w[r], xq, xd, xsum, m)


def _matvec(fmt, w, xq, xd, xsum, out):
    """As _matmul, for one activation row (a decode step's products), in a kernel of its own: built into
    _matmul beside the few-row passes, the one-row pass ran up to 1.8x slower on an AVX2 build (the K-quants,
    benchmarks/results/cpu_few_rows_lanes_avx2_1thread-2026-12-06.log)."""
    n_rows = w.shape[0]
    n8 = n_rows // TILE_R
    if BIASED[fmt]:                   # a signed type's one row in the lanes (vectors.ONE_ROW_LANES) on VNNI
        xsum = _bias_sums(xq)
    for q in prange(n8):
        _rows1(fmt, w, q * TILE_R, xq, xd, xsum, 0, out)
    for r in range(n8 * TILE_R, n_rows):
        out[0, r] = _dot1(fmt, w[r], xq, xd, xsum, 0)


# Two builds of each loop, as attention.py: a small product does not pay for waking the threads.
_matmul_threads = kernel(parallel=True)(_matmul)
_matmul_one = kernel()(_matmul)
_matvec_threads = kernel(parallel=True)(_matvec)
_matvec_one = kernel()(_matvec)
THREADED_FROM = 1 << 18      # multiply-adds (M x N x K) from which the weight's rows go over the threads


# -- a batch of activation rows: TILE_R weight rows unpacked once into a tile (vectors.unpack_row / tile_dot) -
_unpack = [unpack_row(LAYOUTS[f]) for f in FORMATS]
_u0, _u1, _u2, _u3, _u4, _u5, _u6, _u7, _u8, _u9, _u10 = _unpack


@kernel()
def _unpack_into(fmt, row, slot, wq, wa, ws, wsf):
    if fmt == 0:
        return _u0(row, slot, wq, wa, ws, wsf)
    if fmt == 1:
        return _u1(row, slot, wq, wa, ws, wsf)
    if fmt == 2:
        return _u2(row, slot, wq, wa, ws, wsf)
    if fmt == 3:
        return _u3(row, slot, wq, wa, ws, wsf)
    if fmt == 4:
        return _u4(row, slot, wq, wa, ws, wsf)
    if fmt == 5:
        return _u5(row, slot, wq, wa, ws, wsf)
    if fmt == 6:
        return _u6(row, slot, wq, wa, ws, wsf)
    if fmt == 7:
        return _u7(row, slot, wq, wa, ws, wsf)
    if fmt == 8:
        return _u8(row, slot, wq, wa, ws, wsf)
    if fmt == 9:
        return _u9(row, slot, wq, wa, ws, wsf)
    return _u10(row, slot, wq, wa, ws, wsf)


_ut0, _ut1 = (unpack_tile(layout) for layout in _HELD)


@kernel()
def _unpack_tile_into(fmt, w, r0, wq, wa, ws, wsf):
    """Eight rows of a weight held interleaved (fmt len(FORMATS) on) into a tile; any other: a row at a time."""
    if fmt == len(FORMATS):
        return _ut0(w, r0, wq, wa, ws, wsf)
    if fmt == len(FORMATS) + 1:
        return _ut1(w, r0, wq, wa, ws, wsf)
    for j in range(min(TILE_R, w.shape[0] - r0)):
        _unpack_into(fmt, w[r0 + j], j, wq, wa, ws, wsf)
    return 0


# a tile times TILE_M activation rows, and times one, for each of vectors.KINDS
_t0, _t1, _t2 = (tile_dot(kind, TILE_M) for kind in range(len(KINDS)))
_o0, _o1, _o2 = (tile_dot(kind, 1) for kind in range(len(KINDS)))


@kernel()
def _tile(kind, wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid):
    if kind == 0:
        return _t0(wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid)
    if kind == 1:
        return _t1(wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid)
    return _t2(wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid)


@kernel()
def _tile_row(kind, wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid):
    if kind == 0:
        return _o0(wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid)
    if kind == 1:
        return _o1(wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid)
    return _o2(wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid)


def _matmul_tiled(fmt, kind, w, xq, xd, xsum, out, chunk):
    """As _matmul, for many activation rows: the weight rows in chunks of ``chunk`` (a multiple of TILE_R)
    over the threads, each chunk in tiles of TILE_R rows unpacked once (the last tile of the weight maybe
    part full), each tile times all activation rows, TILE_M at a time."""
    n_rows, k = w.shape[0], xq.shape[1]
    m_rows = xq.shape[0]
    m_full = m_rows // TILE_M * TILE_M
    n_groups = k // QK
    n_chunks = (n_rows + chunk - 1) // chunk
    for c in prange(n_chunks):
        wq = np.zeros(n_groups * TILE_BYTES, np.int8)
        wa = np.zeros(n_groups * TILE_BYTES, np.int8)
        ws = np.zeros(n_groups * 16, np.float32)
        wsf = np.zeros(n_groups * 8, np.float32)
        for r0 in range(c * chunk, min(n_rows, (c + 1) * chunk), TILE_R):
            n_valid = min(TILE_R, n_rows - r0)
            _unpack_tile_into(fmt, w, r0, wq, wa, ws, wsf)
            for m in range(0, m_full, TILE_M):
                _tile(kind, wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid)
            for m in range(m_full, m_rows):
                _tile_row(kind, wq, wa, ws, wsf, xq, xd, xsum, m, out, r0, n_valid)


_tiled_threads = kernel(parallel=True)(_matmul_tiled)
_tiled_one = kernel()(_matmul_tiled)
TILED_FROM = 9               # activation rows from which the weight rows are unpacked once per tile (fewer: _matmul)
CHUNK_ROWS = 64              # weight rows a thread takes at a time (one scratch per chunk), a multiple of TILE_R


FAST_TYPES = frozenset(DType[f] for f in FORMATS)
# activations in q8_K blocks (ggml's)
K_QUANTS = frozenset((DType.Q4_K, DType.Q6_K, DType.Q5_K, DType.Q3_K, DType.IQ4_XS))
WITH_MIN = frozenset((DType.Q4_1, DType.Q5_1))     # theirs in q8_1 blocks (the sums in float16)
_FMT = {DType[f]: i for i, f in enumerate(FORMATS)}
_KIND = {DType[f]: kind_of(LAYOUTS[f]) for f in FORMATS}     # the tile's variant (vectors.KINDS) of each type


def interleave(raw: np.ndarray, block_bytes: int) -> np.ndarray:
    """uint8 (N, bytes a row), N a multiple of 8, blocks of whole words -> the same shape, each eight rows'
    blocks reordered: word w of row 0, of row 1, .. of row 7, so that the eight rows' copies of a block's byte
    offset o (a multiple of 4) lie at 8 o .. 8 o + 31 of the block's interleaved place
    (vectors.InterleavedEmitter)."""
    n, row_bytes = raw.shape          # moved as 32-bit words: 3.8x faster than as bytes
    words = raw.view(np.uint32).reshape(n // TILE_R, TILE_R, row_bytes // block_bytes, block_bytes // 4)
    return np.ascontiguousarray(words.transpose(0, 2, 3, 1)).view(np.uint8).reshape(n, row_bytes)


class QuantizedWeight:
    """A 2-D weight (N, K) held in its GGUF blocks: ``raw`` is uint8 (N, bytes per row), the file's bytes, or for
    a type of vectors.INTERLEAVED with N a multiple of 8 a copy made at load, interleaved (see interleave)."""

    def __init__(self, raw: np.ndarray, dtype: DType, shape: tuple[int, int], interleaved: bool = True):
        self.dtype, self.shape = dtype, shape
        self.raw = np.ascontiguousarray(raw).reshape(shape[0], -1)
        self.fmt = _FMT[dtype]
        if interleaved and dtype.name in INTERLEAVED and shape[0] % TILE_R == 0:
            self.fmt = len(FORMATS) + INTERLEAVED.index(dtype.name)
            self.raw = interleave(self.raw, LAYOUTS[dtype.name].block_bytes)
            release_file_pages(raw)          # the file's pages would only add the copy's size to the peak
        self.nbytes = self.raw.nbytes
        self._float32: np.ndarray | None = None

    def blocks(self, ids: np.ndarray | None = None) -> np.ndarray:
        """The file's bytes of some rows (default: all), uint8 (rows, bytes per row): interleave undone."""
        if self.fmt < len(FORMATS):
            return self.raw if ids is None else self.raw[ids]
        bb, (n, row_bytes) = LAYOUTS[self.dtype.name].block_bytes, self.raw.shape
        turned = self.raw.reshape(n // TILE_R, row_bytes // bb, bb // 4, TILE_R, 4)
        picked = turned.transpose(0, 3, 1, 2, 4) if ids is None else turned[ids // TILE_R, :, :, ids % TILE_R]
        return picked.reshape(-1, row_bytes)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """float32 values of some rows (a token embedding lookup), through the reference decoder."""
        picked = self.blocks(np.asarray(ids, dtype=np.int64))
        return dequantize(picked.reshape(-1), self.dtype, (len(picked), self.shape[1]))

    def float32(self) -> np.ndarray:
        """All values in float32, decoded once and kept (only for an op with no kernel on the blocks)."""
        if self._float32 is None:
            self._float32 = dequantize(self.blocks().reshape(-1), self.dtype, self.shape)
        return self._float32

    @property
    def activations(self) -> tuple[bool, bool]:
        """quantize_activations' (k_quant, q8_1) for this weight's type."""
        return self.dtype in K_QUANTS, self.dtype in WITH_MIN

    def matmul(self, x: np.ndarray, quantized: tuple | None = None) -> np.ndarray:
        """x (M, K) float32 @ weight^T: (M, N) float32; ``quantized``: x as quantize_activations gives it
        for this type, where the caller has it already (SharedActivations)."""
        xq, xd, xsum = quantized if quantized is not None else quantize_activations(x, *self.activations)
        out = np.empty((x.shape[0], self.shape[0]), np.float32)
        threaded = x.shape[0] * self.shape[0] * self.shape[1] >= THREADED_FROM
        if x.shape[0] >= TILED_FROM:
            (_tiled_threads if threaded else _tiled_one)(self.fmt, _KIND[self.dtype], self.raw, xq, xd, xsum, out,
                                                         CHUNK_ROWS)
        elif x.shape[0] == 1:
            (_matvec_threads if threaded else _matvec_one)(self.fmt, self.raw, xq, xd, xsum, out)
        else:
            (_matmul_threads if threaded else _matmul_one)(self.fmt, self.raw, xq, xd, xsum, out)
        return out

    def __repr__(self) -> str:
        return f"QuantizedWeight({self.dtype.name}, {self.shape})"


def keeps_blocks(t) -> bool:
    """Whether the fast path holds this weight in its blocks (a 2-D weight of a type with a kernel)."""
    return t.dtype in FAST_TYPES and len(t.shape) == 2


def mul_mat(a, b, shared: SharedActivations | None = None, key=None):
    """MUL_MAT for the fast path: a weight in its blocks times float32 activations (..., M, K), quantized
    through ``shared`` where the program shares them (key: the input node); any other operands go to the
    reference kernel."""
    if not isinstance(a, QuantizedWeight):
        return reference.mul_mat(a, b)
    flat = b.reshape(-1, b.shape[-1])
    q8 = shared.quantized((key, a.activations), b, flat) if shared is not None else None
    return a.matmul(flat, q8).reshape(b.shape[:-1] + (a.shape[0],))


def _reads_blocks(node) -> tuple | None:
    """(input node's id, quantize_activations' kind) of a product by a weight held in its blocks, else None."""
    w = node.src[0] if node.op == "MUL_MAT" else None
    if w is None or not (w.is_leaf and w.kind == LeafKind.WEIGHT and keeps_blocks(w)):
        return None
    return id(node.src[1]), (w.dtype in K_QUANTS, w.dtype in WITH_MIN)


class SharedActivations:
    """A program's products that read one input in the same 8-bit form (q, k and v; gate and up) quantize it
    once a run: the first of them quantizes, the others take its result, and the last drops it (so a run
    holds no input longer than its products need it). Cleared at the start of each run, since a program's
    argument may be a buffer its caller rewrites between runs; an entry is used only for the very array it
    was made from."""

    def __init__(self, nodes):
        keys = [k for k in map(_reads_blocks, nodes) if k is not None]
        self.readers = {k: n for k, n in collections.Counter(keys).items() if n > 1}
        self._held: dict = {}

    def clear(self) -> None:
        self._held.clear()

    def quantized(self, key, x: np.ndarray, flat: np.ndarray) -> tuple | None:
        """x's 8-bit form for the reader ``key``, or None where no other product reads it (the caller quantizes)."""
        if key not in self.readers:
            return None
        held = self._held.get(key)
        if held is None or held[0] is not x:
            held = self._held[key] = [x, quantize_activations(flat, *key[1]), 0]
        held[2] += 1
        if held[2] == self.readers[key]:
            del self._held[key]
        return held[1]


# The weight types without a kernel here are multiplied in float32, their activations first rounded as
# llama.cpp's CPU backend rounds them for that type (its vec_dot_type): the same values a kernel on the
# blocks would multiply, so the path's numerics are llama.cpp's for every type, not only for FORMATS.
LLAMA_CPP_ROUNDING = {DType.F16: "f16", DType.BF16: "bf16", DType.IQ4_NL: "q8_0", DType.Q2_K: "q8_K",
                      DType.Q3_K: "q8_K", DType.Q5_K: "q8_K", DType.IQ4_XS: "q8_K"}
ACTIVATION_ROUNDING = {t: kind for t, kind in LLAMA_CPP_ROUNDING.items() if t not in FAST_TYPES}


def round_activations(x: np.ndarray, kind: str) -> np.ndarray:
    """float32 x (..., K) as llama.cpp rounds it before a product: to float16 or bfloat16 (nearest, ties to
    even), or to the values of its q8_0 (groups of 32) or q8_K (blocks of 256) blocks, as
    quantize_activations rounds them."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if kind == "f16":
        return x.astype(np.float16).astype(np.float32)
    if kind == "bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    flat = x.reshape(-1, x.shape[-1])
    xq, xd, _ = quantize_activations(flat, k_quant=kind == "q8_K")
    return (xq.reshape(len(flat), -1, QK) * xd[..., None]).astype(np.float32).reshape(x.shape)


def rounded_mul_mat(kind: str):
    def run(a, b):
        return reference.mul_mat(a, round_activations(b, kind))
    return run


def get_rows(a, rows):
    return a.rows(rows) if isinstance(a, QuantizedWeight) else reference.get_rows(a, rows)


def _float_args(fn):
    """An op other than MUL_MAT and GET_ROWS that reads a weight held in blocks gets it in float32."""
    def run(*args):
        return fn(*[a.float32() if isinstance(a, QuantizedWeight) else a for a in args])
    return run


def bind(node, fn, shared: SharedActivations | None = None, masks=None):
    """The kernel the fast path runs for a node whose reference kernel (parameters bound) is fn; shared: the
    program's SharedActivations, masks its attention.OpenKeys, if any."""
    if node.op == "MUL_MAT":
        w = node.src[0]
        if w.is_leaf and w.kind == LeafKind.WEIGHT and w.dtype in ACTIVATION_ROUNDING:
            return rounded_mul_mat(ACTIVATION_ROUNDING[w.dtype])
        reads = _reads_blocks(node)
        if shared is not None and reads is not None:
            return functools.partial(mul_mat, shared=shared, key=reads[0])
        return mul_mat
    if node.op == "GET_ROWS":
        return get_rows
    if node.op == "RMS_NORM":
        from .norm import rms_norm
        return functools.partial(rms_norm, eps=node.params["eps"])
    if node.op == "ROPE":
        from .rope import rope
        return functools.partial(rope, **{k: node.params[k] for k in ops.spec("ROPE").param_names})
    if node.op == "FLASH_ATTN_EXT":
        from .attention import flash_attn_ext
        return functools.partial(flash_attn_ext, scale=node.params["scale"], masks=masks)
    if any(s.is_leaf and s.kind == LeafKind.WEIGHT and keeps_blocks(s) for s in node.src):
        return _float_args(fn)
    return fn
