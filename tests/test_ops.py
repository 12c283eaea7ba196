"""The reference kernels (framework.core.graph.reference) against independent float64 numpy references,
and through the real device path (the CPU plugin runs them).

Error metric: ggml's test-backend-ops NMSE, sum((out - ref)^2) / sum(ref^2). Shapes are numpy order
(ggml's ne reversed).
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from framework.core.graph import F32, I32, VIEW_OPS, Graph, GraphBuilder, LeafKind, Tensor, leaf
from framework.core.graph import ops as op_table
from framework.core.graph import reference as K
from framework.core.graph.quants import dequantize
from framework.core.scheduler import CapabilityError, Executor, make_plan
from framework.core.scheduler.verdicts import ask
from framework.plugins.cpu.device import CpuDevice

NMSE_DEFAULT = 1e-7
NMSE_MATMUL = 5e-4     # MUL_MAT and attention, as ggml's test-backend-ops


def nmse(out, ref) -> float:
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, f"shape {out.shape} != reference {ref.shape}"
    assert np.all(np.isfinite(out)), "output has non-finite values"
    return float(np.sum((out - ref) ** 2) / np.sum(ref ** 2))


def check(out, ref, tol=NMSE_DEFAULT):
    err = nmse(out, ref)
    assert err < tol, f"NMSE {err:.3e} >= {tol:.0e}"
    assert np.asarray(out).dtype == np.float32


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def f32(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# float64 references, written independently of the kernels (loops are fine here)
# ---------------------------------------------------------------------------------------------

def ref_get_rows(a, rows):
    return np.stack([a[int(r)].astype(np.float64) for r in rows])


def ref_mul_mat(a, b):
    """ggml_mul_mat: out[..., m, n] = sum_k a[..., n, k] * b[..., m, k]; b batch i uses a batch i // ratio."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    if a.ndim == 2:
        return np.einsum("...mk,nk->...mn", b, a)
    batch_b = b.shape[:-2]
    batch_a = (1,) * (len(batch_b) - (a.ndim - 2)) + a.shape[:-2]
    a = a.reshape(batch_a + a.shape[-2:])
    out = np.zeros(batch_b + (b.shape[-2], a.shape[-2]))
    for idx in np.ndindex(*batch_b):
        a_idx = tuple(i // (nb // na) for i, nb, na in zip(idx, batch_b, batch_a))
        out[idx] = b[idx] @ a[a_idx].T
    return out


def ref_repeat_binary(a, b, fn):
    """ggml_add/mul with b repeated to a's shape: element i of an axis uses b's element i % n."""
    a = a.astype(np.float64)
    b = b.astype(np.float64).reshape((1,) * (a.ndim - b.ndim) + b.shape)
    out = np.empty_like(a)
    for idx in np.ndindex(*a.shape):
        out[idx] = fn(a[idx], b[tuple(i % n for i, n in zip(idx, b.shape))])
    return out


def ref_gelu(x):
    x = x.astype(np.float64)
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def ref_silu(x):
    x = x.astype(np.float64)
    return x / (1.0 + np.exp(-x))


def ref_rms_norm(x, eps):
    x = x.astype(np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def ref_softmax_rows(x):
    out = np.zeros_like(x, dtype=np.float64)
    for idx in np.ndindex(*x.shape[:-1]):
        row = x[idx].astype(np.float64)
        m = np.max(row)
        e = np.exp(row - m)
        out[idx] = e / e.sum()
    return out


def ref_soft_max(a, mask, scale):
    x = a.astype(np.float64) * scale
    if mask is not None:
        x = x + mask.astype(np.float64)
    return ref_softmax_rows(x)


def ref_attention(q, k, v, mask, scale):
    t, h, d = q.shape
    s, hkv, _ = k.shape
    group = h // hkv
    out = np.zeros((t, h, d))
    for head in range(h):
        kh = head // group                 # ggml: query head h reads kv head h / (H / Hkv)
        scores = q[:, head, :].astype(np.float64) @ k[:, kh, :].astype(np.float64).T * scale
        if mask is not None:
            scores = scores + mask
        out[:, head, :] = ref_softmax_rows(scores) @ v[:, kh, :].astype(np.float64)
    return out


def ref_rope(x, pos, n_dims, mode, base, freq_scale=1.0):
    t, h, d = x.shape
    out = x.astype(np.float64).copy()
    for ti in range(t):
        for hi in range(h):
            for i in range(n_dims // 2):
                theta = freq_scale * float(pos[ti]) * base ** (-2.0 * i / n_dims)
                c, s = math.cos(theta), math.sin(theta)
                if mode == "normal":
                    j0, j1 = 2 * i, 2 * i + 1
                else:
                    j0, j1 = i, i + n_dims // 2
                x0, x1 = float(x[ti, hi, j0]), float(x[ti, hi, j1])
                out[ti, hi, j0] = x0 * c - x1 * s
                out[ti, hi, j1] = x0 * s + x1 * c
    return out


def causal_mask(t, s, n_past):
    """Query i sits at position n_past + i and sees cache rows 0..n_past + i."""
    mask = np.full((t, s), -np.inf, dtype=np.float32)
    for i in range(t):
        mask[i, : n_past + i + 1] = 0.0
    return mask


@pytest.mark.parametrize("window", [0, 1, 3, 300])
def test_session_masks_of_one_row_equal_the_general_ones(window):
    """The session builds a decode step's mask (one query) another way than a prefill chunk's: both are the
    loop's here, windowed where window is set (query p sees rows p - window + 1 .. p)."""
    from framework.runtime.context import causal_mask as session_mask
    for n_past, n_kv in [(0, 256), (5, 256), (255, 256), (256, 512), (511, 512)]:
        want = causal_mask(1, n_kv, n_past)
        if window:
            want[0, :max(0, n_past - window + 1)] = -np.inf
        pos = np.array([n_past], dtype=np.int32)
        got = session_mask(pos, n_kv, window)
        assert got.shape == (1, n_kv) and got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
        both = session_mask(np.array([n_past, n_past], dtype=np.int32), n_kv, window)    # the general path
        np.testing.assert_array_equal(both[:1], want)


# ---------------------------------------------------------------------------------------------
# the metric itself must be able to fail
# ---------------------------------------------------------------------------------------------

def test_nmse_detects_errors():
    ref = np.arange(1, 11, dtype=np.float64)
    assert nmse(ref.astype(np.float32), ref) == 0.0
    assert nmse(ref * 1.01, ref) > NMSE_DEFAULT
    with pytest.raises(AssertionError):
        check((ref * 1.01).astype(np.float32), ref)


# ---------------------------------------------------------------------------------------------
# kernels, called directly
# ---------------------------------------------------------------------------------------------

def test_get_rows(rng):
    a = f32(rng, 10, 7)
    rows = np.array([3, 0, 9, 3], dtype=np.int32)
    out = K.get_rows(a, rows)
    assert out.shape == (4, 7)
    check(out, ref_get_rows(a, rows))
    np.testing.assert_array_equal(out, a[[3, 0, 9, 3]])


@pytest.mark.parametrize("m", [1, 5], ids=["decode", "batch"])
def test_mul_mat_2d_weight(rng, m):
    a = f32(rng, 24, 32)          # weight (N, K)
    b = f32(rng, m, 32)           # activations (M, K)
    out = K.mul_mat(a, b)
    assert out.shape == (m, 24)
    check(out, ref_mul_mat(a, b), NMSE_MATMUL)


def test_mul_mat_2d_weight_3d_activations(rng):
    a = f32(rng, 12, 16)
    b = f32(rng, 3, 5, 16)
    out = K.mul_mat(a, b)
    assert out.shape == (3, 5, 12)
    check(out, ref_mul_mat(a, b), NMSE_MATMUL)


@pytest.mark.parametrize("a_batch,b_batch", [((2,), (6,)), ((1,), (3,)), ((4,), (4,)), ((1, 2), (3, 4)),
                                             ((2, 2), (4, 6)), ((2,), (3, 4))])
def test_mul_mat_batched_broadcast(rng, a_batch, b_batch):
    a = f32(rng, *a_batch, 8, 16)
    b = f32(rng, *b_batch, 5, 16)
    out = K.mul_mat(a, b)
    assert out.shape == b_batch + (5, 8)
    check(out, ref_mul_mat(a, b), NMSE_MATMUL)


def test_mul_mat_broadcast_is_i_div_ratio_not_i_mod_n(rng):
    """With a's 2 batches and b's 4, b batch 1 must use a batch 0 (ggml), not a batch 1 (tiling)."""
    a = f32(rng, 2, 3, 4)
    b = f32(rng, 4, 2, 4)
    out = K.mul_mat(a, b)
    np.testing.assert_allclose(out[1], b[1] @ a[0].T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[2], b[2] @ a[1].T, rtol=1e-5, atol=1e-5)
    assert not np.allclose(out[1], b[1] @ a[1].T)


@pytest.mark.parametrize("op,fn", [("add", np.add), ("mul", np.multiply)])
@pytest.mark.parametrize("a_shape,b_shape", [((4, 6), (4, 6)), ((4, 6), (6,)), ((3, 4, 6), (1, 6)),
                                             ((4, 6), (2, 6)), ((3, 4, 6), (4, 1)), ((2, 3, 4), (2, 1, 4))])
def test_add_mul_broadcast(rng, op, fn, a_shape, b_shape):
    a = f32(rng, *a_shape)
    b = f32(rng, *b_shape)
    out = getattr(K, op)(a, b)
    assert out.shape == a_shape
    check(out, ref_repeat_binary(a, b, fn))


def test_scale(rng):
    a = f32(rng, 3, 17)
    check(K.scale(a, scale=-0.37), a.astype(np.float64) * -0.37)


@pytest.mark.parametrize("op", ["gelu", "silu", "tanh"])
def test_unary(rng, op):
    x = f32(rng, 4, 33, scale=3.0)
    ref = {"gelu": ref_gelu, "silu": ref_silu, "tanh": lambda v: np.tanh(v.astype(np.float64))}[op](x)
    check(K.unary(x, op=op), ref)


def test_gelu_is_the_tanh_approximation():
    # at x = 1 the tanh form gives 0.841192, the erf form 0.841345: far apart at float32 precision
    out = K.unary(np.array([1.0], dtype=np.float32), op="gelu")
    assert abs(float(out[0]) - 0.8411920) < 2e-6


@pytest.mark.parametrize("op,act", [("swiglu", ref_silu), ("geglu", ref_gelu)])
def test_glu(rng, op, act):
    gate = f32(rng, 5, 40, scale=2.0)
    up = f32(rng, 5, 40)
    check(K.glu(gate, up, op=op), act(gate) * up.astype(np.float64))


@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rms_norm(rng, eps):
    x = f32(rng, 3, 4, 64, scale=0.1)
    check(K.rms_norm(x, eps=eps), ref_rms_norm(x, eps))


def test_soft_max_with_mask_and_scale(rng):
    a = f32(rng, 3, 5, 9, scale=2.0)                  # (heads, T, S)
    mask = causal_mask(5, 9, 4)
    mask[1, 0] = -np.inf
    a_before = a.copy()
    out = K.soft_max(a, mask, scale=0.7)
    check(out, ref_soft_max(a, mask, 0.7))
    np.testing.assert_array_equal(a, a_before)         # the input is not modified
    assert np.all(out[..., mask == -np.inf] == 0.0)
    np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-5)


def test_soft_max_without_mask(rng):
    a = f32(rng, 4, 11)
    check(K.soft_max(a, None, scale=1.3), ref_soft_max(a, None, 1.3))


@pytest.mark.parametrize("h,hkv", [(4, 4), (6, 2), (8, 1)])
@pytest.mark.parametrize("masked", [True, False])
def test_flash_attn_ext(rng, h, hkv, masked):
    t, s, d = 4, 10, 16
    q, k, v = f32(rng, t, h, d), f32(rng, s, hkv, d), f32(rng, s, hkv, d)
    mask = causal_mask(t, s, 6) if masked else None
    scale = 1.0 / math.sqrt(d)
    out = K.flash_attn_ext(q, k, v, mask, scale=scale)
    assert out.shape == (t, h, d)
    check(out, ref_attention(q, k, v, mask, scale), NMSE_MATMUL)


def test_flash_attn_ext_causal_ignores_future_rows(rng):
    """Changing K/V rows a query may not see must not change its output."""
    t, s, d = 3, 6, 8
    q, k, v = f32(rng, t, 4, d), f32(rng, s, 2, d), f32(rng, s, 2, d)
    mask = causal_mask(t, s, 0)                      # query i sees rows 0..i
    out1 = K.flash_attn_ext(q, k, v, mask, scale=0.3)
    k2, v2 = k.copy(), v.copy()
    k2[1:] += 5.0
    v2[1:] -= 5.0
    out2 = K.flash_attn_ext(q, k2, v2, mask, scale=0.3)
    np.testing.assert_array_equal(out1[0], out2[0])
    assert not np.allclose(out1[1], out2[1])
    # query 0 sees exactly one row: its output is that row of V, per kv head
    np.testing.assert_allclose(out1[0, 0], v[0, 0], rtol=1e-6)
    np.testing.assert_allclose(out1[0, 3], v[0, 1], rtol=1e-6)


@pytest.mark.parametrize("mode", ["normal", "neox"])
@pytest.mark.parametrize("n_dims", [16, 8])
def test_rope(rng, mode, n_dims):
    t, h, d = 5, 3, 16
    x = f32(rng, t, h, d)
    pos = np.array([0, 1, 7, 100, 2047], dtype=np.int32)
    out = K.rope(x, pos, n_dims=n_dims, mode=mode, freq_base=10000.0, freq_scale=1.0)
    check(out, ref_rope(x, pos, n_dims, mode, 10000.0))
    np.testing.assert_array_equal(out[0], x[0])                 # position 0: identity
    np.testing.assert_array_equal(out[..., n_dims:], x[..., n_dims:])   # the tail passes through


def test_rope_modes_differ_and_freq_scale_applies(rng):
    x = f32(rng, 2, 2, 8)
    pos = np.array([3, 9], dtype=np.int32)
    normal = K.rope(x, pos, n_dims=8, mode="normal", freq_base=500.0, freq_scale=1.0)
    neox = K.rope(x, pos, n_dims=8, mode="neox", freq_base=500.0, freq_scale=1.0)
    assert nmse(normal, ref_rope(x, pos, 8, "neox", 500.0)) > 1e-3
    check(neox, ref_rope(x, pos, 8, "neox", 500.0))
    scaled = K.rope(x, pos, n_dims=8, mode="normal", freq_base=500.0, freq_scale=0.25)
    check(scaled, ref_rope(x, pos, 8, "normal", 500.0, 0.25))


def test_set_rows(rng):
    dst = f32(rng, 8, 6)
    before = dst.copy()
    src = f32(rng, 3, 2, 3)                  # 3 rows of 6 elements, reshaped by the kernel
    rows = np.array([5, 0, 2], dtype=np.int32)
    out = K.set_rows(dst, src, rows)
    ref = before.copy()
    for i, r in enumerate(rows):
        ref[r] = src[i].reshape(-1)
    np.testing.assert_array_equal(out, ref)
    assert out is dst                        # in place, as ggml_set_rows


def test_view_reshape_permute_cont(rng):
    a = f32(rng, 4, 6)
    np.testing.assert_array_equal(K.view(a, shape=(2, 5), offset=7), a.reshape(-1)[7:17].reshape(2, 5))
    np.testing.assert_array_equal(K.reshape(a, shape=(3, 8)), a.reshape(3, 8))
    x = f32(rng, 2, 3, 4)
    p = K.permute(x, axes=(2, 0, 1))
    assert p.shape == (4, 2, 3)
    for i, j, k in np.ndindex(4, 2, 3):
        assert p[i, j, k] == x[j, k, i]
    c = K.cont(p)
    assert c.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(c.reshape(-1), np.array([x[j, k, i] for i, j, k in np.ndindex(4, 2, 3)]))


# ---------------------------------------------------------------------------------------------
# the real device path: GraphBuilder -> make_plan([CpuDevice()]) -> Executor
# ---------------------------------------------------------------------------------------------

def run_graph(b: GraphBuilder, outputs: list[Tensor], inputs: dict, weights: dict | None = None):
    graph = b.build(outputs)
    cpu = CpuDevice()
    plan = make_plan(graph, [cpu])
    assert all(plan.device_of(n) == "cpu" for n in graph.nodes)
    assert not plan.fallbacks and not plan.copies
    weights = weights or {}
    ex = Executor([cpu], lambda t: weights[t.name])
    return ex.run(plan, inputs), ex


def _device_case(name, rng):
    """(builder, outputs, inputs, reference, tolerance) for one op."""
    b = GraphBuilder()
    if name == "GET_ROWS":
        a, rows = f32(rng, 9, 5), np.array([8, 1, 1], dtype=np.int32)
        ta, tr = b.input("a", F32, a.shape), b.input("rows", I32, rows.shape)
        return b, [b.get_rows(ta, tr)], {id(ta): a, id(tr): rows}, ref_get_rows(a, rows), NMSE_DEFAULT
    if name == "MUL_MAT":
        a, x = f32(rng, 2, 6, 8), f32(rng, 4, 3, 8)
        ta, tx = b.input("a", F32, a.shape), b.input("x", F32, x.shape)
        return b, [b.mul_mat(ta, tx)], {id(ta): a, id(tx): x}, ref_mul_mat(a, x), NMSE_MATMUL
    if name in ("ADD", "MUL"):
        a, r = f32(rng, 3, 7), f32(rng, 7)
        ta, tr = b.input("a", F32, a.shape), b.input("r", F32, r.shape)
        out = (b.add if name == "ADD" else b.mul)(ta, tr)
        fn = np.add if name == "ADD" else np.multiply
        return b, [out], {id(ta): a, id(tr): r}, ref_repeat_binary(a, r, fn), NMSE_DEFAULT
    if name == "SCALE":
        a = f32(rng, 3, 7)
        ta = b.input("a", F32, a.shape)
        return b, [b.scale(ta, 2.5)], {id(ta): a}, a * 2.5, NMSE_DEFAULT
    if name == "UNARY":
        a = f32(rng, 3, 7)
        ta = b.input("a", F32, a.shape)
        return b, [b.unary(ta, "gelu")], {id(ta): a}, ref_gelu(a), NMSE_DEFAULT
    if name == "GLU":
        g, u = f32(rng, 3, 7), f32(rng, 3, 7)
        tg, tu = b.input("g", F32, g.shape), b.input("u", F32, u.shape)
        return b, [b.glu(tg, tu, "swiglu")], {id(tg): g, id(tu): u}, ref_silu(g) * u, NMSE_DEFAULT
    if name == "RMS_NORM":
        a = f32(rng, 3, 32)
        ta = b.input("a", F32, a.shape)
        return b, [b.rms_norm(ta, 1e-5)], {id(ta): a}, ref_rms_norm(a, 1e-5), NMSE_DEFAULT
    if name == "SOFT_MAX":
        a, m = f32(rng, 2, 4, 6), causal_mask(4, 6, 2)
        ta, tm = b.input("a", F32, a.shape), b.input("mask", F32, m.shape)
        return b, [b.soft_max_ext(ta, tm, 0.5)], {id(ta): a, id(tm): m}, ref_soft_max(a, m, 0.5), NMSE_DEFAULT
    if name == "FLASH_ATTN_EXT":
        q, k, v, m = f32(rng, 3, 4, 8), f32(rng, 7, 2, 8), f32(rng, 7, 2, 8), causal_mask(3, 7, 4)
        tq, tk, tv, tm = (b.input(n, F32, x.shape) for n, x in (("q", q), ("k", k), ("v", v), ("mask", m)))
        out = b.flash_attn_ext(tq, tk, tv, tm, 0.35)
        return (b, [out], {id(tq): q, id(tk): k, id(tv): v, id(tm): m}, ref_attention(q, k, v, m, 0.35),
                NMSE_MATMUL)
    if name == "ROPE":
        x, pos = f32(rng, 3, 2, 12), np.array([4, 5, 6], dtype=np.int32)
        tx, tp = b.input("x", F32, x.shape), b.input("pos", I32, pos.shape)
        out = b.rope_ext(tx, tp, 8, "neox", 10000.0)
        return b, [out], {id(tx): x, id(tp): pos}, ref_rope(x, pos, 8, "neox", 10000.0), NMSE_DEFAULT
    if name == "VIEWS":   # RESHAPE, PERMUTE, VIEW and CONT of a computed tensor
        a = f32(rng, 2, 3, 4)
        ta = b.input("a", F32, a.shape)
        s = b.scale(ta, 1.0)
        r = b.reshape(s, (6, 4))
        p = b.permute(r, (1, 0))
        c = b.cont(p)
        vw = b.view(c, (2, 6), offset=6)
        out = b.scale(vw, 1.0)
        ref = a.reshape(6, 4).T.reshape(-1)[6:18].reshape(2, 6)
        return b, [out], {id(ta): a}, ref, NMSE_DEFAULT
    raise AssertionError(name)


DEVICE_OPS = ["GET_ROWS", "MUL_MAT", "ADD", "MUL", "SCALE", "UNARY", "GLU", "RMS_NORM", "SOFT_MAX",
              "FLASH_ATTN_EXT", "ROPE", "VIEWS"]


@pytest.mark.parametrize("name", DEVICE_OPS)
def test_device_path(rng, name):
    b, outputs, inputs, ref, tol = _device_case(name, rng)
    (out,), ex = run_graph(b, outputs, inputs)
    check(out, ref, tol)
    assert ex.stats["cpu"]["runs"] == 1 and ex.stats["cpu"]["compiles"] == 1


def test_device_path_set_rows_writes_the_cache(rng):
    b = GraphBuilder()
    cache = leaf("cache_k_l0", F32, (6, 8), LeafKind.CACHE)
    src = f32(rng, 2, 2, 4)
    rows = np.array([4, 1], dtype=np.int32)
    ts, tr = b.input("k", F32, src.shape), b.input("rows", I32, rows.shape)
    written = b.set_rows(b.use(cache), b.reshape(ts, (2, 8)), tr)
    seen = b.view(written, (3, 2, 8))            # read back through a view, as attention does
    out = b.scale(seen, 1.0)
    (res,), ex = run_graph(b, [out], {id(ts): src, id(tr): rows})
    ref = np.zeros((6, 8), dtype=np.float32)
    ref[4], ref[1] = src[0].reshape(-1), src[1].reshape(-1)
    np.testing.assert_array_equal(res, ref.reshape(3, 2, 8))
    np.testing.assert_array_equal(ex.caches[id(cache)][1], ref)     # the cache itself holds the rows


def test_device_path_quantized_weight(rng):
    """A Q8_0 weight leaf goes through Executor -> CpuDevice.load_weight -> MUL_MAT."""
    w = f32(rng, 16, 64)
    raw = gguf_quants.quantize(w, GGMLQuantizationType.Q8_0).reshape(-1)
    w_deq = gguf_quants.dequantize(raw.reshape(16, -1), GGMLQuantizationType.Q8_0)
    b = GraphBuilder()
    tw = leaf("blk.0.attn_q.weight", GGMLQuantizationType.Q8_0, (16, 64), LeafKind.WEIGHT)
    x = f32(rng, 3, 64)
    tx = b.input("x", F32, x.shape)
    (out,), ex = run_graph(b, [b.mul_mat(b.use(tw), tx)], {id(tx): x}, {tw.name: raw})
    check(out, ref_mul_mat(w_deq, x), NMSE_MATMUL)
    np.testing.assert_array_equal(ex.weights[("cpu", id(tw))], w_deq)


def test_device_path_same_structure_compiles_once(rng):
    """Two fragments/runs of one structure share a program; a second run compiles nothing."""
    a = f32(rng, 3, 7)
    b = GraphBuilder()
    ta = b.input("a", F32, a.shape)
    graph = b.build([b.rms_norm(ta, 1e-6)])
    cpu = CpuDevice()
    plan = make_plan(graph, [cpu])
    ex = Executor([cpu], lambda t: None)
    (o1,) = ex.run(plan, {id(ta): a})
    (o2,) = ex.run(plan, {id(ta): a * 2})
    assert ex.stats["cpu"]["compiles"] == 1 and ex.stats["cpu"]["runs"] == 2
    check(o1, ref_rms_norm(a, 1e-6))
    check(o2, ref_rms_norm(a * 2, 1e-6))


@pytest.mark.parametrize("case", ["chain", "output"])
def test_device_path_views_of_an_input_leaf(rng, case):
    a = f32(rng, 2, 3, 4)
    b = GraphBuilder()
    ta = b.input("a", F32, a.shape)
    r = b.reshape(ta, (6, 4))
    if case == "chain":
        out, ref = b.cont(b.permute(r, (1, 0))), a.reshape(6, 4).T
    else:
        out, ref = r, a.reshape(6, 4)
    (res,), _ = run_graph(b, [out], {id(ta): a})
    np.testing.assert_array_equal(res, ref)


def test_device_path_reshape_of_an_input_leaf(rng):
    """A single view of a leaf read by a computing node is placed with that node."""
    a = f32(rng, 2, 3, 4)
    b = GraphBuilder()
    ta = b.input("a", F32, a.shape)
    out = b.cont(b.reshape(ta, (6, 4)))
    (res,), _ = run_graph(b, [out], {id(ta): a})
    np.testing.assert_array_equal(res, a.reshape(6, 4))


def test_an_op_outside_the_table_is_refused_without_a_kernel():
    node = Tensor(name="nope-0", dtype=F32, shape=(4, 8), op="NO_SUCH_OP")
    verdict = ask(CpuDevice(), node)
    assert verdict.ok is False and not verdict
    assert verdict.code == "unsupported_op"
    assert "NO_SUCH_OP" in verdict.reason and "op table" in verdict.reason
    ok = ask(CpuDevice(), Tensor(name="s", dtype=F32, shape=(4,), op="SCALE"))
    assert ok.ok is True


def test_plan_with_an_unsupported_op_names_node_and_device():
    x = leaf("x", F32, (4, 8), LeafKind.INPUT)
    node = Tensor(name="nope-0", dtype=F32, shape=(4, 8), op="NO_SUCH_OP", src=(x,))
    with pytest.raises(CapabilityError) as err:
        make_plan(Graph(nodes=[node], leaves=[x], outputs=[node]), [CpuDevice()])
    assert err.value.code == "no_device_for_node"
    assert err.value.node == "nope-0"
    assert "NO_SUCH_OP" in str(err.value) and "cpu" in str(err.value)


# ---------------------------------------------------------------------------------------------
# dequantization
# ---------------------------------------------------------------------------------------------

Q = GGMLQuantizationType
ROWS = 3


def _random_k_blocks(rng, qtype, n_blocks):
    """Random Q4_K / Q6_K blocks with finite f16 scales. gguf.quants has no quantizer for the
    K-quants (quantize raises NotImplementedError), but every bit pattern of their quant and
    sub-scale bytes is a valid block; only the f16 super-block scales must be finite."""
    per_block, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    scales = (rng.uniform(0.001, 0.05, size=(n_blocks, 2))).astype(np.float16).view(np.uint8)
    if qtype == Q.Q4_K:        # d, dmin, scales[12], qs[128]
        blocks[:, 0:4] = scales.reshape(n_blocks, 4)
    elif qtype == Q.Q6_K:      # ql[128], qh[64], scales[16], d
        blocks[:, -2:] = scales[:, :2]
    else:
        raise AssertionError(qtype)
    return blocks


def quantized(rng, qtype, shape):
    rows = int(np.prod(shape[:-1]))
    if qtype in (Q.Q4_K, Q.Q6_K):
        per_block, _ = GGML_QUANT_SIZES[qtype]
        raw = _random_k_blocks(rng, qtype, rows * shape[-1] // per_block).reshape(rows, -1)
    else:
        raw = gguf_quants.quantize(f32(rng, rows, shape[-1]), qtype)
        if qtype == Q.F16:
            raw = raw.view(np.uint8)
    assert raw.dtype == np.uint8
    return np.ascontiguousarray(raw)


QTYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.F16]


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(ROWS, 256), (2, ROWS, 256)], ids=["2d", "3d"])
def test_dequantize_matches_gguf(rng, qtype, shape):
    raw = quantized(rng, qtype, shape)                     # (rows, bytes per row)
    ref = gguf_quants.dequantize(raw, qtype).reshape(shape)
    assert np.all(np.isfinite(ref)) and np.any(ref != 0)
    flat = raw.reshape(-1)                                 # as a GGUF memory map hands it over
    for given in (flat, raw):
        out = dequantize(given, qtype, shape)
        assert out.shape == shape
        assert out.dtype == np.float32
        assert out.flags["C_CONTIGUOUS"]
        np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("qtype", QTYPES, ids=lambda q: q.name)
def test_cpu_load_weight_matches_gguf(rng, qtype):
    shape = (ROWS, 256)
    raw = quantized(rng, qtype, shape)
    ref = gguf_quants.dequantize(raw, qtype)
    t = leaf("w", qtype, shape, LeafKind.WEIGHT)
    assert t.nbytes == raw.nbytes
    out = CpuDevice().load_weight(t, raw.reshape(-1))
    assert out.dtype == np.float32 and out.flags["C_CONTIGUOUS"] and out.shape == shape
    np.testing.assert_array_equal(out, ref)


def test_quantization_round_trip_is_close(rng):
    """The quantizer used above is sane: Q8_0 reproduces its input to about 1e-4 NMSE."""
    x = f32(rng, ROWS, 256)
    raw = gguf_quants.quantize(x, Q.Q8_0)
    assert nmse(dequantize(raw.reshape(-1), Q.Q8_0, x.shape), x) < 1e-4


def test_dequantize_f32_is_a_view_of_the_bytes(rng):
    x = f32(rng, 2, 8)
    out = dequantize(x.view(np.uint8).reshape(-1), Q.F32, (2, 8))
    np.testing.assert_array_equal(out, x)
    assert out.dtype == np.float32 and out.flags["C_CONTIGUOUS"]


# ---------------------------------------------------------------------------------------------
# the op table (framework.core.graph.ops) and the page generated from it
# ---------------------------------------------------------------------------------------------

def test_docs_ops_page_is_generated_from_the_table():
    """docs/ops.md is the table's own markdown: edit ops.py, then regenerate the page."""
    page = Path(__file__).resolve().parents[1] / "docs" / "ops.md"
    assert page.read_text() == op_table.markdown(), (
        "docs/ops.md is out of step with framework/core/graph/ops.py: run "
        "`python -m framework.core.graph --markdown > docs/ops.md`")
    for name in op_table.OPS:
        assert f"## {name}\n" in page.read_text()


def test_every_op_has_a_kernel_that_takes_its_parameters():
    """A table entry's sources and parameters are what its reference kernel takes, by name and count."""
    for name, s in op_table.OPS.items():
        sig = inspect.signature(s.kernel)
        keywords = [p.name for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY]
        positional = [p for p in sig.parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
        assert keywords == list(s.param_names), name
        assert len(positional) == len(s.sources), name
        assert [p.default is not p.empty for p in positional] == [o.optional for o in s.sources], name
        assert s.semantics and s.nmse in (op_table.NMSE_DEFAULT, 1e-6, op_table.NMSE_MATMUL), name


def test_sub_ops_and_rope_modes_are_the_kernels_own():
    assert set(op_table.UNARY_OPS) == set(K.UNARY) and set(op_table.GLU_OPS) == set(K.GLU)
    assert op_table.ROPE_MODES == ("normal", "neox")
    a, b = K.rope_pairs("normal", 8)
    assert list(a) == [0, 2, 4, 6] and list(b) == [1, 3, 5, 7]
    a, b = K.rope_pairs("neox", 8)
    assert list(a) == [0, 1, 2, 3] and list(b) == [4, 5, 6, 7]


def test_kinds_name_views_and_in_place_writes():
    assert VIEW_OPS == {"VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE"}
    assert [op for op in op_table.OPS if op_table.writes_source(op)] == ["SET_ROWS"]
    assert not op_table.makes_memory("SET_ROWS") and not op_table.makes_memory("VIEW")
    assert op_table.makes_memory("CONT") and op_table.makes_memory("MUL_MAT")
    assert op_table.kind("NO_SUCH_OP") is None and not op_table.is_view("NO_SUCH_OP")


def test_unknown_op_names_are_refused_with_the_table():
    with pytest.raises(op_table.UnknownOpError, match="unknown op 'MULMAT'.*MUL_MAT"):
        op_table.names("MUL_MAT", "MULMAT")
    with pytest.raises(op_table.UnknownOpError, match="unknown op 'NOPE'"):
        op_table.spec("NOPE")
    assert op_table.names("ADD", "MUL") == {"ADD", "MUL"}


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_models_use_only_table_ops_with_the_table_parameters(name):
    """Every node a model's graph holds is an op of the table carrying exactly its parameters, with
    values among the table's choices."""
    from framework.model.arch.base import KVCache
    from conftest import load_model
    model = load_model(name)
    graph, _ = model.build_step(4, 256, 1, KVCache(model.hp, 256), n_layers=1)
    for n in graph.nodes:
        s = op_table.spec(n.op)
        assert set(n.params) == set(s.param_names), n.describe()
        for p in s.params:
            assert not p.choices or n.params[p.name] in p.values, n.describe()


def test_bind_gives_the_kernel_with_the_node_parameters(rng):
    b = GraphBuilder()
    x, pos = b.input("x", F32, (3, 2, 8)), b.input("pos", I32, (3,))
    node = b.rope_ext(x, pos, 8, "neox", 500.0, 0.5)
    xv, pv = f32(rng, 3, 2, 8), np.array([1, 2, 9], dtype=np.int32)
    np.testing.assert_array_equal(op_table.bind(node)(xv, pv),
                                  K.rope(xv, pv, n_dims=8, mode="neox", freq_base=500.0, freq_scale=0.5))
    assert op_table.bind(b.cont(x)) is K.cont


def test_one_rope_table_serves_every_plugin(rng):
    """The CPU kernel, the Vulkan table and the OpenVINO table all read reference.rope_cos_sin."""
    from framework.backend import rope_table as vk_rope_table
    from framework.plugins.openvino_npu.rope import rope_table as ov_rope_table

    pos = np.array([0, 5, 4000], dtype=np.int32)
    cos, sin = K.rope_cos_sin(pos, 16, 10000.0, 0.5)
    theta = pos.astype(np.float64)[:, None] * 0.5 * 10000.0 ** (-np.arange(8) * 2.0 / 16)
    np.testing.assert_array_equal(cos, np.cos(theta).astype(np.float32))
    np.testing.assert_array_equal(sin, np.sin(theta).astype(np.float32))
    np.testing.assert_array_equal(vk_rope_table(pos, 16, 10000.0, 0.5), np.stack([cos, sin], axis=-1))
    c, s = ov_rope_table(pos, (16, 10000.0, 0.5, "neox", 20))
    np.testing.assert_array_equal(c[:, 0, :8], cos)
    np.testing.assert_array_equal(s[:, 0, 8:16], sin)
    assert np.all(c[:, 0, 16:] == 1) and np.all(s[:, 0, 16:] == 0)
