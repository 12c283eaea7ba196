"""The reference kernels: numpy, in float32, one per op of the table (ops.py says what each means).

Each takes its sources as arrays (positional, in ``node.src`` order) and its parameters as keywords,
and returns an array; no loop in Python runs over elements or rows. The CPU plugin runs on them, the
conformance suite compares every device against them, and a plugin may reuse them for ops it does
not compute itself. Their own accuracy is tested against float64 references (tests/test_ops.py).
"""

from __future__ import annotations

import math

import numpy as np

SQRT_2_OVER_PI = np.float32(0.7978845608028654)
DECODE_MAX_T = 8        # attention of up to this many queries reads K and V in place


def get_rows(a, rows):
    return a[rows]


# Products and attention of up to this many rows run one row at a time, as a decode step's one row does: BLAS's
# matrix-matrix products sum in another order, so a row's result would depend on how many rows the step holds, and
# a speculative verification's rows must be bit for bit what one-row steps give (docs/speculative.md).
EXACT_ROWS = 8


def mul_mat(a, b):
    """b @ a^T, with a's batch axes repeated to b's (ggml: b batch i uses a batch i // ratio)."""
    if a.ndim == 2:
        if b.ndim == 2 and b.shape[0] <= EXACT_ROWS:     # BLAS's matrix-vector product streams faster, too
            return np.stack([a @ row for row in b]) if len(b) else b @ a.T
        return b @ a.T
    for axis in range(a.ndim - 2):
        off = b.ndim - a.ndim
        if a.shape[axis] != b.shape[axis + off]:
            a = np.repeat(a, b.shape[axis + off] // a.shape[axis], axis=axis)
    return b @ np.swapaxes(a, -1, -2)


def _tile_to(b, shape):
    """ggml_repeat: tile b to `shape` when plain broadcasting does not apply."""
    b = b.reshape((1,) * (len(shape) - b.ndim) + b.shape)
    return np.tile(b, [s // d for s, d in zip(shape, b.shape)])


def add(a, b):
    try:
        return a + b
    except ValueError:
        return a + _tile_to(b, a.shape)


def mul(a, b):
    try:
        return a * b
    except ValueError:
        return a * _tile_to(b, a.shape)


def scale(a, *, scale):
    return a * np.float32(scale)


def gelu(x):
    """The tanh approximation, as ggml_gelu."""
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)))


def silu(x):
    return x / (np.float32(1.0) + np.exp(-x))


def sigmoid(x):
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-x))


def softplus(x):
    """ggml_vec_softplus_f32: log(1 + e^x), and x itself above 20 (where they agree in float32)."""
    return np.where(x > np.float32(20.0), x, np.log1p(np.exp(np.minimum(x, np.float32(20.0))))).astype(np.float32)


UNARY = {"gelu": gelu, "silu": silu, "tanh": np.tanh, "sigmoid": sigmoid, "softplus": softplus}
GLU = {"geglu": gelu, "swiglu": silu}


def unary(a, *, op):
    return UNARY[op](a)


def glu(gate, up, *, op):
    return GLU[op](gate) * up


def rms_norm(x, *, eps):
    if x.ndim == 2 and x.shape[0] <= EXACT_ROWS:     # a dot product a row beats einsum's set-up (and EXACT_ROWS)
        ms = np.array([np.dot(r, r) for r in x], dtype=np.float32)[:, None] * np.float32(1.0 / x.shape[-1])
    else:
        ms = np.einsum("...i,...i->...", x, x)[..., None] * np.float32(1.0 / x.shape[-1])
    return x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps)))


def soft_max(a, mask=None, *, scale):
    x = a * np.float32(scale)
    if mask is not None:
        x = x + mask
    x = x - np.max(x, axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= np.sum(x, axis=-1, keepdims=True)
    return x


def argmax(a):
    idx = np.argmax(a, axis=-1).astype(np.int32)
    return np.where(np.isfinite(a).all(axis=-1), idx, np.int32(-1)).astype(np.int32)


def flash_attn_ext(q, k, v, mask=None, *, scale):
    """q (T, H, D), k and v (S, Hkv, D), mask (T, S): softmax(q k^T * scale + mask) v -> (T, H, D)."""
    t, h, d = q.shape
    if 1 < t <= EXACT_ROWS and mask is not None:       # each query as a one-row step computes it (EXACT_ROWS)
        return np.concatenate([flash_attn_ext(q[i:i + 1], k, v, mask[i:i + 1], scale=scale) for i in range(t)])
    hkv = k.shape[1]
    g = h // hkv
    if mask is not None:        # keys past the last one any query may see weigh exactly 0: skip them
        seen = np.flatnonzero(np.isfinite(mask).any(axis=0))
        n = int(seen[-1]) + 1 if seen.size else 1
        if n < k.shape[0]:
            k, v, mask = k[:n], v[:n], mask[:, :n]
    qh = q.reshape(t, hkv, g, d).transpose(1, 2, 0, 3).reshape(hkv, g * t, d)   # query heads by kv head
    if t > DECODE_MAX_T:
        # contiguous per-head K and V let BLAS take large batched products at full speed
        kh, vh = np.ascontiguousarray(k.transpose(1, 0, 2)), np.ascontiguousarray(v.transpose(1, 0, 2))
    else:
        # a few queries: BLAS reads the cache rows in place (a copy of K and V would cost more)
        kh, vh = k.transpose(1, 0, 2), v.transpose(1, 0, 2)
    scores = np.matmul(qh, kh.transpose(0, 2, 1)).reshape(hkv, g, t, -1)
    probs = soft_max(scores, mask, scale=scale)
    out = np.matmul(probs.reshape(hkv, g * t, -1), vh)                          # (hkv, g*t, d)
    return out.reshape(hkv, g, t, d).transpose(2, 0, 1, 3).reshape(t, h, d)


_ROPE_TABLES: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def rope_inv_freq(n_dims: int, freq_base: float, freq_scale: float, factors=None) -> np.ndarray:
    """float64 (n_dims/2,): the angle per position of pair i, freq_scale * freq_base^(-2i / n_dims), divided
    by factor i when there are frequency factors (ROPE's third source: Llama 3's rope_freqs.weight)."""
    inv = freq_scale * freq_base ** (-np.arange(n_dims // 2, dtype=np.float64) * 2.0 / n_dims)
    return inv if factors is None else inv / np.asarray(factors, dtype=np.float64)


def rope_cos_sin(pos, n_dims: int, freq_base: float, freq_scale: float, factors=None) -> tuple[np.ndarray, np.ndarray]:
    """float32 (T, n_dims/2) cos and sin of every (position, pair): the one rope table of the project.

    The angles are computed in float64 and rounded once (position x frequency in float32 would lose
    digits at long contexts). Every layer of a step asks for the same table, so the last few are kept.
    """
    pos = np.asarray(pos)
    fkey = None if factors is None else np.asarray(factors).tobytes()
    key = (pos.dtype.str, pos.shape, pos.tobytes(), n_dims, freq_base, freq_scale, fkey)
    table = _ROPE_TABLES.get(key)
    if table is None:
        inv = rope_inv_freq(n_dims, freq_base, freq_scale, factors)
        theta = pos.astype(np.float64).reshape(-1)[:, None] * inv[None, :]
        table = (np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32))
        if len(_ROPE_TABLES) > 64:
            _ROPE_TABLES.clear()
        _ROPE_TABLES[key] = table
    return table


def rope_pairs(mode: str, n_dims: int) -> tuple[np.ndarray, np.ndarray]:
    """The two members (x0, x1) of every rotated pair i: (2i, 2i+1) in mode "normal", (i, i + n_dims/2)
    in mode "neox". Pair i turns by angle i of rope_cos_sin."""
    half = n_dims // 2
    if mode == "neox":
        return np.arange(half), np.arange(half) + half
    return np.arange(half) * 2, np.arange(half) * 2 + 1


def rope(x, pos, factors=None, *, n_dims, mode, freq_base, freq_scale):
    half = n_dims // 2
    cos, sin = rope_cos_sin(pos, n_dims, freq_base, freq_scale, factors)
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., n_dims:] = x[..., n_dims:]
    if mode == "neox":      # slices, not the index arrays of rope_pairs: the same pairs, without a gather
        x0, x1 = x[..., :half], x[..., half:n_dims]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_dims] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., 0:n_dims:2], x[..., 1:n_dims:2]
        out[..., 0:n_dims:2] = x0 * cos - x1 * sin
        out[..., 1:n_dims:2] = x0 * sin + x1 * cos
    return out


def concat(a, b, *, axis):
    return np.concatenate([a, b], axis=axis)


def ssm_conv(sx, c):
    """result[s, t, ch] = sum_k sx[s, ch, t + k] * c[ch, k] (ggml_compute_forward_ssm_conv_f32)."""
    windows = np.lib.stride_tricks.sliding_window_view(sx, c.shape[1], axis=-1)      # (S, C, T, K)
    return np.einsum("sctk,ck->stc", windows, c, optimize=True).astype(np.float32)


def gated_delta_net(q, k, v, g, beta, state):
    """The recurrence of ggml_compute_forward_gated_delta_net_f32, all heads at once, token by token."""
    t, hk, s = q.shape
    h = v.shape[1]
    heads = np.arange(h) % hk                       # value head h reads key head h % Hk
    m = np.array(state, dtype=np.float32)           # (H, S, S): m[h, j, i]
    decay = np.exp(g)                               # (T, H, 1) or (T, H, S)
    out = np.empty((t, h, s), dtype=np.float32)
    scale = np.float32(1.0 / math.sqrt(s))
    for i in range(t):
        kt, qt = k[i, heads], q[i, heads]           # (H, S)
        m *= decay[i][:, None, :]                   # scalar gate: (H, 1, 1); per-element (KDA): (H, 1, S)
        d = (v[i] - np.matmul(m, kt[:, :, None])[..., 0]) * beta[i]
        m += d[:, :, None] * kt[:, None, :]
        out[i] = np.matmul(m, qt[:, :, None])[..., 0] * scale
    return np.concatenate([out.reshape(t, h * s), m.reshape(s, h * s)], axis=0)


def set_rows(dst, src, rows):
    dst[rows] = src.reshape(rows.shape[0], -1)
    return dst


def view(a, *, shape, offset):
    n = math.prod(shape)
    return a.reshape(-1)[offset:offset + n].reshape(shape)


def reshape(a, *, shape):
    return a.reshape(shape)


def permute(a, *, axes):
    return a.transpose(axes)


def cont(a):
    return np.ascontiguousarray(a)

