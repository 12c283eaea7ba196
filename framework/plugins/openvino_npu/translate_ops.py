"""Every op but the attention as OpenVINO operations: one function per op, ``op_<name>(tr, node)``, taking the
translator (translator.py) for the values of the node's sources; TRANSLATE maps op names to them."""

from __future__ import annotations

import math

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from ...contract import LeafKind, Tensor, reference
from .rope import rope_partner, rope_spread
from .translate import (OV_TYPES, CacheView, CacheWrite, Feed, TranslationError, const, fused_weight, i64, reshape,
                        view, weight_product)
from .translate_attention import op_flash_attn_ext


def op_get_rows(tr, n):
    a, rows = n.src
    return ops.gather(tr.out(a), tr.out(rows), i64(0)).output(0)


def op_mul_mat(tr, n):
    a, b = n.src
    if id(n) in tr.fusion:
        return _fused_product(tr, *tr.fusion[id(n)])
    w = tr.weights.get(id(a)) if a.is_leaf and a.kind == LeafKind.WEIGHT else None
    if w is not None and len(a.shape) == 2:
        return weight_product(tr.out(b), b.shape, w, a.shape)
    av, bv = tr.out(a), tr.out(b)
    if len(a.shape) == 2:
        return ops.matmul(bv, av, False, True).output(0)
    # ggml broadcasting: b batch i uses a batch i // (nb / na), a's leading axes padded with 1
    ab = (1,) * (len(b.shape) - len(a.shape)) + tuple(a.shape[:-2])
    bb = tuple(b.shape[:-2])
    if ab != bb:
        av = reshape(av, ab + a.shape[-2:])
        expanded, target = [], []
        for na, nb in zip(ab, bb):
            expanded += [na, 1]
            target += [na, nb // na]
        av = reshape(av, tuple(expanded) + a.shape[-2:])
        av = ops.broadcast(av, i64(target + list(a.shape[-2:]))).output(0)
        av = reshape(av, bb + a.shape[-2:])
    return ops.matmul(bv, av, False, True).output(0)


def _fused_product(tr, group: list[Tensor], place: int) -> ov.Output:
    """The group's one product (the translator's fusion groups), made at its first member, split by weight."""
    first = id(group[0])
    if first not in tr.fused:
        w = fused_weight([tr.weights[id(m.src[0])] for m in group])
        b = group[0].src[1]
        y = weight_product(tr.out(b), b.shape, w, w.shape)
        split = ops.variadic_split(y, i64(-1), i64([m.src[0].shape[0] for m in group]))
        tr.fused[first] = [split.output(i) for i in range(len(group))]
    return tr.fused[first][place]


def _binary(tr, n, fn):
    a, b = n.src
    av, bv = tr.out(a), tr.out(b)
    bs = (1,) * (len(a.shape) - len(b.shape)) + tuple(b.shape)
    if any(x != 1 and x != y for x, y in zip(bs, a.shape)):      # ggml_repeat: tile whole copies
        bv = reshape(bv, bs)
        bv = ops.tile(bv, i64([y // x for x, y in zip(bs, a.shape)])).output(0)
    return fn(av, bv).output(0)


def op_add(tr, n):
    return _binary(tr, n, ops.add)


def op_mul(tr, n):
    return _binary(tr, n, ops.multiply)


def op_scale(tr, n):
    return ops.multiply(tr.out(n.src[0]), const(n.params["scale"])).output(0)


ACTIVATIONS = {"gelu": lambda x: ops.gelu(x, "tanh"), "silu": ops.swish, "tanh": ops.tanh, "sigmoid": ops.sigmoid,
               "softplus": ops.softplus}


def _act(x, op):
    if op not in ACTIVATIONS:
        raise TranslationError(f"unknown activation {op}")
    return ACTIVATIONS[op](x).output(0)


def op_unary(tr, n):
    return _act(tr.out(n.src[0]), n.params["op"])


def op_glu(tr, n):
    act = {"geglu": "gelu", "swiglu": "silu"}[n.params["op"]]
    return ops.multiply(_act(tr.out(n.src[0]), act), tr.out(n.src[1])).output(0)


def op_rms_norm(tr, n):
    x = tr.out(n.src[0])
    sq = ops.power(x, const(2.0)).output(0)
    mean = ops.reduce_mean(sq, i64([-1]), True).output(0)
    rs = ops.sqrt(ops.add(mean, const(n.params["eps"]))).output(0)
    return ops.multiply(x, ops.divide(const(1.0), rs)).output(0)


def op_soft_max(tr, n):
    x = ops.multiply(tr.out(n.src[0]), const(n.params["scale"])).output(0)
    if len(n.src) > 1:
        x = ops.add(x, tr.out(n.src[1])).output(0)
    return ops.softmax(x, -1).output(0)


def op_rope(tr, n):
    """out = x * C + swap(x) * S: C and S are the cos and (signed) sin of each dimension's pair (1 and
    0 past n_dims), swap exchanges a pair's members (interleaved pairs in mode "normal", halves in
    mode "neox") with one Gather of each dimension's partner. (A Roll over (.., d/2, 2) did the same
    through OpenVINO's reference kernel, about 10x slower; see benchmarks/openvino_measure.py rope.)"""
    x, pos = n.src
    n_dims, mode = n.params["n_dims"], n.params["mode"]
    d = x.shape[2]
    rope = (n_dims, n.params["freq_base"], n.params["freq_scale"], mode, d)
    cos, sin = _rope_table(tr, pos, rope)
    xv = tr.out(x)
    swapped = ops.gather(xv, const(rope_partner(mode, n_dims, d), np.int32), i64(2)).output(0)
    return ops.add(ops.multiply(xv, cos), ops.multiply(swapped, sin)).output(0)


def _rope_table(tr, pos: Tensor, rope: tuple):
    """The cos and sin tables of positions ``pos``, once a model (the translator's ``rope_tables``): model inputs
    computed on the host where the positions are a fragment input, else computed inside the model."""
    key = (id(pos), rope)
    if key in tr.rope_tables:
        return tr.rope_tables[key]
    n_dims, base, scale, mode, d = rope
    t = pos.shape[0]
    if id(pos) in tr.arg_index:
        idx = tr.arg_index[id(pos)]
        cos = tr.param((t, 1, d), ov.Type.f32, f"rope_cos_{n_dims}_{base:g}", Feed("rope_cos", idx, rope=rope))
        sin = tr.param((t, 1, d), ov.Type.f32, f"rope_sin_{n_dims}_{base:g}", Feed("rope_sin", idx, rope=rope))
    else:       # positions computed here: the table in float32 inside the model
        half = n_dims // 2
        inv = reference.rope_inv_freq(n_dims, base, scale)
        theta = ops.multiply(reshape(ops.convert(tr.out(pos), ov.Type.f32), (t, 1)),
                             const(inv.astype(np.float32).reshape(1, half))).output(0)
        spread = const(rope_spread(mode, n_dims, d))
        tail = np.zeros((1, 1, d), dtype=np.float32)
        tail[..., n_dims:] = 1
        cos = ops.add(reshape(ops.matmul(ops.cos(theta), spread, False, False), (t, 1, d)), const(tail)).output(0)
        sign = np.zeros((1, 1, d), dtype=np.float32)
        a, b = reference.rope_pairs(mode, n_dims)
        sign[..., a], sign[..., b] = -1.0, 1.0
        sin = ops.multiply(reshape(ops.matmul(ops.sin(theta), spread, False, False), (t, 1, d)),
                           const(sign)).output(0)
    tr.rope_tables[key] = (cos, sin)
    return cos, sin


def op_set_rows(tr, n):
    dst, src, rows = n.src
    if not (dst.is_leaf and dst.kind == LeafKind.CACHE and id(dst) in tr.arg_index):
        raise TranslationError(f"{n.describe()}: SET_ROWS writes only a pre-allocated cache given to the fragment")
    n_ctx, width = dst.shape
    window = n_ctx if id(dst) in tr.full else _window_rows(tr, n, n_ctx, width)
    idx = tr.arg_index[id(dst)]
    if idx in tr.windows:
        raise TranslationError(f"{n.describe()}: the cache {dst.name} is written twice in one fragment")
    tr.windows[idx] = window
    if tr.kv is not None and window == tr.kv:       # the rows the program's own KV length says, at run time
        win = tr.param((-1, width), OV_TYPES[dst.dtype.name], dst.name, Feed("kv_window", idx))
    else:
        win = tr.param((window, width), OV_TYPES[dst.dtype.name], dst.name, Feed("window", idx, rows=window))
    new = reshape(tr.out(src), (rows.shape[0], width))
    return CacheWrite(n, win, window, new, tr.out(rows), width)


def _window_rows(tr, n: Tensor, n_ctx: int, width: int) -> int:
    """The rows of the cache the fragment reads after this write: the largest offset-0 VIEW, or all."""
    readers = tr.consumers.get(id(n), [])
    if not readers:
        return 1 if n_ctx else 0
    need = 0
    for r in readers:
        if r.op != "VIEW" or r.params["offset"] != 0:
            return n_ctx
        need = max(need, -(-math.prod(r.params["shape"]) // width))
    return max(1, min(need, n_ctx))


def op_view(tr, n):
    src = tr.value(n.src[0])
    shape, offset = tuple(n.params["shape"]), n.params["offset"]
    if isinstance(src, CacheWrite):
        if offset == 0 and math.prod(shape) % src.width == 0:
            return CacheView(src, math.prod(shape) // src.width, shape)
        return view(tr.scattered(src), src.rows_in_window * src.width, shape, offset)
    return view(tr.out(n.src[0]), math.prod(n.src[0].shape), shape, offset)


def op_reshape(tr, n):
    return reshape(tr.out(n.src[0]), n.params["shape"])


def op_permute(tr, n):
    return ops.transpose(tr.out(n.src[0]), i64(list(n.params["axes"]))).output(0)


def op_cont(tr, n):
    return tr.out(n.src[0])


def op_concat(tr, n):
    return ops.concat([tr.out(n.src[0]), tr.out(n.src[1])], n.params["axis"]).output(0)


# op name -> its translation (device.py's SUPPORTED_OPS declares the same names without importing OpenVINO)
TRANSLATE = {"GET_ROWS": op_get_rows, "MUL_MAT": op_mul_mat, "ADD": op_add, "MUL": op_mul, "SCALE": op_scale,
             "UNARY": op_unary, "GLU": op_glu, "RMS_NORM": op_rms_norm, "SOFT_MAX": op_soft_max,
             "FLASH_ATTN_EXT": op_flash_attn_ext, "ROPE": op_rope, "SET_ROWS": op_set_rows, "VIEW": op_view,
             "RESHAPE": op_reshape, "PERMUTE": op_permute, "TRANSPOSE": op_permute, "CONT": op_cont,
             "CONCAT": op_concat}
