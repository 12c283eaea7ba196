"""What a fragment's ``ov.Model`` is made of (translator.py builds it): the settings the translation reads when
a model is translated (so that a benchmark can set them), the Translation with its feeds and the lazy values of
a cache write, the small node helpers every op translation uses, and the nodes of the weights and their
products.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from ...contract import LeafKind, Tensor
from .weights import NIBBLES, ROW_ARRAYS, OvWeight

OV_TYPES = {"F32": ov.Type.f32, "I32": ov.Type.i32, "F16": ov.Type.f16}
ELEMENTS = {"i4": ov.Type.i4, "u4": ov.Type.u4, "i8": ov.Type.i8}
# Block offsets (Q4_1, Q5_1, Q4_K, Q5_K) in a matrix product: "zero_point" (-offset / scale, subtracted in
# the decompression the FullyConnected kernel fuses) or "product" (x @ W^T + offsets @ block_sums(x), as
# llama.cpp computes it). On one thread OpenVINO's compressed kernel runs a 17920 x 1536 i4 product in 32-value
# groups 1.6 times as fast without a zero point (benchmarks/openvino_measure.py fc-forms), and the offsets'
# own product costs less than that saves (the 1.5B decodes 0.71x llama.cpp's speed against 0.57x; docs/openvino.md,
# "Weight forms"), so "product" is the default. A block with a zero scale always uses "product".
OFFSETS = "product"
# MUL_MATs of one input by weights of one form are one product (fusion_groups); False keeps every
# product separate (benchmarks/openvino_measure.py fused-model compares the two).
FUSE_PRODUCTS = True
# A 4-bit compressed product of more rows than this runs as products of at most this many, their outputs side by
# side: at one query OpenVINO's CPU plugin runs a 17920 x 1536 u4 product (the 1.5B's fused gate and up) at 7.7 G
# weights/s on one thread, and the same rows in parts of at most 4096 at 12.2, bit-identical (benchmarks/
# openvino_measure.py row-parts). Up to about 8192 rows a product runs fast, i4 as u4; 8-bit forms gain nothing.
PRODUCT_ROWS = 4096


class TranslationError(RuntimeError):
    pass


@dataclass
class Feed:
    """One model input: where its value comes from at run time."""

    kind: str               # "arg": args[index]; "window": args[index][:rows]; "kv_window": args[index][:the
                            # program's KV length] (kv_programs.py); "rope_cos"/"rope_sin": table
    index: int
    rows: int = 0
    rope: tuple = ()        # (n_dims, freq_base, freq_scale)


@dataclass
class CacheWrite:
    """The value of a SET_ROWS, kept lazy: the cache window before the write, the new rows, their rows."""

    node: Tensor
    window: ov.Output       # (rows, width) cache rows as they were before this step
    rows_in_window: int
    new_rows: ov.Output     # (T, width)
    rows: ov.Output         # (T,) int32
    width: int
    scattered: ov.Output | None = None


@dataclass
class CacheView:
    write: CacheWrite
    n_rows: int
    shape: tuple


@dataclass
class Translation:
    model: ov.Model
    feeds: list[Feed]
    # per fragment output: ("value", model output index) or ("cache", arg index of the cache,
    # model output index of the new rows, arg index of the rows or None, model output index of rows)
    outputs: list[tuple]
    windows: dict[int, int] = field(default_factory=dict)    # arg index of a cache -> rows bound


_SHARED: dict | None = None     # small constants of the model being built, shared by value


@contextlib.contextmanager
def shared_constants():
    """Small constants made while the body runs (one model's translation) are shared by value."""
    global _SHARED
    _SHARED = {}
    try:
        yield
    finally:
        _SHARED = None


def const(value, dtype=np.float32) -> ov.Output:
    arr = np.asarray(value, dtype=dtype)
    if _SHARED is None or arr.size > 4096:
        return ops.constant(arr).output(0)
    key = (arr.dtype.str, arr.shape, arr.tobytes())
    if key not in _SHARED:
        _SHARED[key] = ops.constant(arr).output(0)
    return _SHARED[key]


def i64(values) -> ov.Output:
    return const(np.asarray(values, dtype=np.int64), np.int64)


def reshape(x, shape) -> ov.Output:
    return ops.reshape(x, i64(list(shape)), False).output(0)


def weight_node(w: OvWeight, shape: tuple | None = None, offsets: bool = True) -> ov.Output:
    """The weight as a float32 value of its shape: a constant, or compressed constants and their
    decompression (i4/u4/i8 -> Convert -> Multiply scale -> Reshape). ``offsets=False`` leaves out the
    per-block offsets of the types that have them (a matrix product adds them itself: see mul_mat)."""
    shape = tuple(shape or w.shape)
    c = w._constants
    if w.kind == "plain":
        if "data" not in c:
            c["data"] = ops.constant(w.data, shared_memory=True)
        out = c["data"].output(0)
        if w.data.dtype != np.float32:
            out = ops.convert(out, ov.Type.f32).output(0)
        return out if tuple(w.shape) == shape else reshape(out, shape)
    if "data" not in c:
        et = ELEMENTS[w.element]
        if w.element in NIBBLES:        # the nibbles as they are held (weights.pack_nibbles): shared, not copied
            rows, blocks, _ = w.data.shape
            c["data"] = ops.constant(ov.Tensor(w.data, ov.Shape([rows, blocks, w.group]), et))
        else:
            c["data"] = ops.constant(w.data, shared_memory=True)
        c["scale"] = ops.constant(w.scale, shared_memory=True)
    x = ops.convert(c["data"], ov.Type.f32).output(0)
    scale = c["scale"].output(0)
    if w.scale.dtype != np.float32:
        scale = ops.convert(scale, ov.Type.f32).output(0)
    if offsets == "zero_point" and w.offset_form is not None:
        if "zp" not in c:
            c["zp_values"] = (-w.offsets[..., None] / w.scale.astype(np.float32)).astype(np.float32)
            c["zp"] = ops.constant(c["zp_values"], shared_memory=True)
        x = ops.subtract(x, c["zp"]).output(0)
        offsets = False
    x = ops.multiply(x, scale).output(0)
    if offsets and w.offset_form is not None:
        x = ops.add(x, reshape(offsets_node(w), w.data.shape[:2] + (1,))).output(0)
    return reshape(x, shape)


def offsets_node(w: OvWeight) -> ov.Output:
    """The (rows, blocks) float32 block offsets: a constant, or the K-quants' minimum codes times -dmin, which
    OpenVINO's CPU plugin runs as a compressed product (u8 codes, groups of 8) where the float32 matrix was a
    plain one of 3.2 times the bytes (benchmarks/openvino_measure.py offset-forms)."""
    c = w._constants
    if w.offset_form == "float32":
        if "offset" not in c:
            c["offset"] = ops.constant(w.offset, shared_memory=True)
        return c["offset"].output(0)
    if "offset_codes" not in c:
        c["offset_codes"] = ops.constant(ov.Tensor(w.offset_codes, ov.Shape(list(w.offset_codes.shape)), ov.Type.u8))
        c["offset_scale"] = ops.constant(w.offset_scale, shared_memory=True)
    x = ops.multiply(ops.convert(c["offset_codes"], ov.Type.f32), ops.convert(c["offset_scale"], ov.Type.f32))
    return reshape(x, (w.offset_codes.shape[0], -1))


def fusion_key(w: OvWeight | None) -> tuple | None:
    """What weights must share to be one product: their rows concatenated make one weight of the same
    form (element type, blocks and block size, scale type, offsets or none; or one plain dtype), None
    for a weight that is not fused."""
    if w is None or len(w.shape) != 2:
        return None
    if w.kind == "plain":
        return ("plain", w.data.dtype.str, w.shape[1])
    if w.offset_form is not None and OFFSETS == "zero_point" and not zero_point_ok(w):
        return None
    return ("compressed", w.element, w.data.shape[1], w.group, w.scale.dtype.str, w.offset_form)


def fusion_groups(nodes: list[Tensor], weights: dict[int, OvWeight]) -> dict[int, tuple[list[Tensor], int]]:
    """MUL_MATs of one input by weights of one form (Q, K and V; gate and up) become one product of the
    weights' rows concatenated, split after: fewer, larger FullyConnected kernels, each of which pays a
    fixed cost per run (benchmarks/openvino_measure.py fused). id(node) -> (the group, its place). (Not
    framework.core.graph.fusion's groups: those are one-row decode kernels of the GPU plugins; this is a
    graph rewrite for any number of rows, decided by OpenVINO's weight forms, and OpenVINO fuses the rest.)"""
    groups: dict[tuple, list[Tensor]] = {}
    for n in nodes if FUSE_PRODUCTS else ():
        if n.op != "MUL_MAT":
            continue
        a, b = n.src
        w = weights.get(id(a)) if a.is_leaf and a.kind == LeafKind.WEIGHT else None
        key = fusion_key(w)
        if key is None or tuple(a.shape) != tuple(w.shape):
            continue
        group = groups.setdefault((id(b), key), [])
        if all(m.src[0] is not a for m in group):
            group.append(n)
    return {id(m): (g, i) for g in groups.values() if len(g) > 1 for i, m in enumerate(g)}


def fused_weight(ws: list[OvWeight]) -> OvWeight:
    """One weight whose rows are those of ``ws`` in order, made once for every model that fuses them. The
    parts' arrays then become views of the fused ones, so the values are held once."""
    c = ws[0]._constants
    key = ("fused",) + tuple(w.name for w in ws)
    if key not in c:
        fields = ROW_ARRAYS if ws[0].kind == "compressed" else ("data",)
        whole = {f: np.concatenate([getattr(w, f) for w in ws]) if getattr(ws[0], f) is not None else None
                 for f in fields}
        start = 0
        for w in ws:
            rows = w.shape[0]
            for f, arr in whole.items():
                if arr is not None:
                    setattr(w, f, arr[start:start + rows])
            start += rows
        c[key] = OvWeight("+".join(w.name for w in ws), "+".join(w.dtype for w in ws), (start, ws[0].shape[1]),
                          ws[0].kind, whole["data"], element=ws[0].element, scale=whole.get("scale"),
                          offset=whole.get("offset"), offset_codes=whole.get("offset_codes"),
                          offset_scale=whole.get("offset_scale"))
    return c[key]


def zero_point_ok(w: OvWeight) -> bool:
    return w.kind == "compressed" and w.offset_form is not None and bool(np.all(w.scale != 0))


def offset_product(w: OvWeight, x: ov.Output, x_shape: tuple) -> ov.Output | None:
    """offsets (N, blocks) @ block sums of x (..., K): what the block offsets add to x @ W^T."""
    if w.kind != "compressed" or w.offset_form is None:
        return None
    blocks, group = w.data.shape[1], w.group
    sums = ops.reduce_sum(reshape(x, tuple(x_shape[:-1]) + (blocks, group)), i64([-1]), False).output(0)
    return ops.matmul(sums, offsets_node(w), False, True).output(0)


def row_parts(w: OvWeight) -> list[OvWeight]:
    """The weight as products of at most PRODUCT_ROWS rows each: a 4-bit compressed weight of more rows is cut into
    equal parts (views of its arrays, made once for each limit), every other weight is one part."""
    rows, limit = w.data.shape[0], PRODUCT_ROWS
    if w.kind != "compressed" or w.element not in NIBBLES or rows <= limit:
        return [w]
    key = ("row_parts", limit)
    if key not in w._constants:
        parts = math.ceil(rows / limit)
        step = math.ceil(rows / parts)
        w._constants[key] = [
            OvWeight(f"{w.name}[{a}:{min(a + step, rows)}]", w.dtype, (min(a + step, rows) - a, w.shape[1]), w.kind,
                     **{f: None if getattr(w, f) is None else getattr(w, f)[a:a + step] for f in ROW_ARRAYS},
                     element=w.element)
            for a in range(0, rows, step)]
    return w._constants[key]


def weight_product(x: ov.Output, x_shape: tuple, w: OvWeight, shape: tuple) -> ov.Output:
    """x @ W^T for a weight of the given (N, K) shape, one or fused: the block offsets subtracted as a zero point in
    the decompression (OFFSETS "zero_point", where no block's scale is 0) or added as their own product. A 4-bit
    weight of many rows runs as products of fewer (row_parts), their outputs side by side."""
    zero_point = OFFSETS == "zero_point" and zero_point_ok(w)
    ys = [ops.matmul(x, weight_node(p, (p.shape[0], shape[1]), offsets="zero_point" if zero_point else False),
                     False, True).output(0)
          for p in row_parts(w)]
    y = ys[0] if len(ys) == 1 else ops.concat(ys, -1).output(0)
    extra = None if zero_point else offset_product(w, x, x_shape)
    return y if extra is None else ops.add(y, extra).output(0)


class FullWindow(Exception):
    """A cache write must be materialised: translate again binding every row of that cache."""


def view(x, n_total: int, shape, offset: int) -> ov.Output:
    n = math.prod(shape)
    flat = reshape(x, (n_total,))
    if offset or n != n_total:
        flat = ops.slice(flat, i64([offset]), i64([offset + n]), i64([1]), i64([0])).output(0)
    return reshape(flat, shape)


def safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name)[:48]

