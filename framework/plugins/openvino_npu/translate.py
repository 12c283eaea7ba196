"""A fragment as an ``ov.Model`` built from OpenVINO opset operations.

Every op's semantics are the op table's (framework/core/graph/ops.py, docs/ops.md; reference.py's kernels);
shapes are numpy order on both sides, so a tensor's shape is its OpenVINO shape.

Inputs of the model, in order (the program feeds them from ``run`` arguments):
  * every fragment input that is not a weight, as a Parameter of its shape and type, except
  * a KV cache (a CACHE leaf written by SET_ROWS here): a Parameter of only the rows the fragment
    reads (the ``n_kv`` window the attention views), bound to the first rows of the cache array
    without a copy;
  * cos/sin tables for every ROPE whose positions are a fragment input, computed on the host in
    float64 by the reference's rope table (position x frequency in float32 would lose digits at long contexts).
Weights become constants (weights.py: compressed constants with their decompression pattern).

A SET_ROWS does not copy the cache inside the model. The model outputs the step's new rows (the
program writes them into the cache array in place after the run), and an attention that reads the
window just written (VIEW of the SET_ROWS) is computed over the window as it was before the write,
with the columns being rewritten masked out, plus the new rows as extra columns: the same set of
(score, value) pairs as attention over the updated window, without a copy of the window. Any other
reader of a SET_ROWS result gets a real ScatterUpdate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from ...contract import Fragment, LeafKind, Tensor, reference
from .rope import rope_partner, rope_spread
from .weights import NIBBLES, ROW_ARRAYS, OvWeight

OV_TYPES = {"F32": ov.Type.f32, "I32": ov.Type.i32, "F16": ov.Type.f16}
ELEMENTS = {"i4": ov.Type.i4, "u4": ov.Type.u4, "i8": ov.Type.i8}
SQRT_2_OVER_PI = 0.7978845608028654
# Block offsets (Q4_1, Q5_1, Q4_K, Q5_K) in a matrix product: "zero_point" (-offset / scale, subtracted in
# the decompression the FullyConnected kernel fuses) or "product" (x @ W^T + offsets @ block_sums(x), as
# llama.cpp computes it). On one thread OpenVINO's compressed kernel runs a 17920 x 1536 i4 product in 32-value
# groups 1.6 times as fast without a zero point (benchmarks/openvino_measure.py fc-forms), and the offsets'
# own product costs less than that saves (the 1.5B decodes 0.71x llama.cpp's speed against 0.57x; docs/openvino.md,
# "Weight forms"), so "product" is the default. A block with a zero scale always uses "product".
OFFSETS = "product"
# MUL_MATs of one input by weights of one form are one product (Translator._fusion_groups); False keeps every
# product separate (benchmarks/openvino_measure.py fused-model compares the two).
FUSE_PRODUCTS = True
OWN_BY_GATHER = True
# With Hkv > 1 kv heads, attention over cache rows (_attend_rows) multiplies each kv head's group of query heads by
# that head's rows alone, in one batched product ("grouped"), or every query head by every kv head's rows, keeping
# its own by OWN_BY_GATHER ("all"); "auto" groups from 2 queries a step. OpenVINO's CPU plugin does not fuse the
# rows' (S, Hkv, D) -> (Hkv, S, D) transpose into the product: the transposes cost what the Hkv times fewer
# multiply-adds save at one query, and less than they save at five (benchmarks/openvino_measure.py own-head).
ROW_ATTENTION = "auto"
# A 4-bit compressed product of more rows than this runs as products of at most this many, their outputs side by
# side: at one query OpenVINO's CPU plugin runs a 17920 x 1536 u4 product (the 1.5B's fused gate and up) at 7.7 G
# weights/s on one thread, and the same rows in parts of at most 4096 at 12.2, bit-identical (benchmarks/
# openvino_measure.py row-parts). Up to about 8192 rows a product runs fast, i4 as u4; 8-bit forms gain nothing.
PRODUCT_ROWS = 4096
ROW_ATTENTION_MAX_T = 8     # up to this many queries, attention reads the cache rows in place (_attend_rows)


class TranslationError(RuntimeError):
    pass


@dataclass
class Feed:
    """One model input: where its value comes from at run time."""

    kind: str               # "arg": args[index]; "window": args[index][:rows]; "rope_cos"/"rope_sin": table
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


def _const(value, dtype=np.float32) -> ov.Output:
    arr = np.asarray(value, dtype=dtype)
    if _SHARED is None or arr.size > 4096:
        return ops.constant(arr).output(0)
    key = (arr.dtype.str, arr.shape, arr.tobytes())
    if key not in _SHARED:
        _SHARED[key] = ops.constant(arr).output(0)
    return _SHARED[key]


def _i64(values) -> ov.Output:
    return _const(np.asarray(values, dtype=np.int64), np.int64)


def _reshape(x, shape) -> ov.Output:
    return ops.reshape(x, _i64(list(shape)), False).output(0)


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
        return out if tuple(w.shape) == shape else _reshape(out, shape)
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
        x = ops.add(x, _reshape(offsets_node(w), w.data.shape[:2] + (1,))).output(0)
    return _reshape(x, shape)


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
    return _reshape(x, (w.offset_codes.shape[0], -1))


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
    sums = ops.reduce_sum(_reshape(x, tuple(x_shape[:-1]) + (blocks, group)), _i64([-1]), False).output(0)
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


class _FullWindow(Exception):
    """A cache write must be materialised: translate again binding every row of that cache."""


class Translator:
    def __init__(self, fragment: Fragment, weights: dict[int, OvWeight], full: frozenset = frozenset()):
        self.f = fragment
        self.full = full
        self.weights = weights
        self.values: dict[int, object] = {}
        self.params: list[ov.Node] = []
        self.feeds: list[Feed] = []
        self.arg_index = {id(t): i for i, t in enumerate(fragment.inputs)}
        self.rope_tables: dict[tuple, tuple[ov.Output, ov.Output]] = {}
        self.windows: dict[int, int] = {}
        self.mask_parts: dict[tuple, tuple] = {}
        internal = {id(n) for n in fragment.nodes}
        self.consumers: dict[int, list[Tensor]] = {}
        for n in fragment.nodes:
            for s in n.src:
                self.consumers.setdefault(id(s), []).append(n)
        self.internal = internal
        self.fusion = self._fusion_groups()
        self.fused: dict[int, list[ov.Output]] = {}     # id(first member) -> the parts of its fused product

    def _fusion_groups(self) -> dict[int, tuple[list[Tensor], int]]:
        """MUL_MATs of one input by weights of one form (Q, K and V; gate and up) become one product of the
        weights' rows concatenated, split after: fewer, larger FullyConnected kernels, each of which pays a
        fixed cost per run (benchmarks/openvino_measure.py fused). id(node) -> (the group, its place). (Not
        framework.core.graph.fusion's groups: those are one-row decode kernels of the GPU plugins; this is a
        graph rewrite for any number of rows, decided by OpenVINO's weight forms, and OpenVINO fuses the rest.)"""
        groups: dict[tuple, list[Tensor]] = {}
        for n in self.f.nodes if FUSE_PRODUCTS else ():
            if n.op != "MUL_MAT":
                continue
            a, b = n.src
            w = self.weights.get(id(a)) if a.is_leaf and a.kind == LeafKind.WEIGHT else None
            key = fusion_key(w)
            if key is None or tuple(a.shape) != tuple(w.shape):
                continue
            group = groups.setdefault((id(b), key), [])
            if all(m.src[0] is not a for m in group):
                group.append(n)
        return {id(m): (g, i) for g in groups.values() if len(g) > 1 for i, m in enumerate(g)}

    # -- inputs -------------------------------------------------------------------------------
    def _param(self, shape, dtype, name, feed: Feed) -> ov.Output:
        p = ops.parameter(list(shape), dtype, name=f"in{len(self.params)}_{_safe(name)}")
        self.params.append(p)
        self.feeds.append(feed)
        return p.output(0)

    def value(self, t: Tensor):
        key = id(t)
        if key in self.values:
            return self.values[key]
        if key in self.arg_index:
            idx = self.arg_index[key]
            if t.is_leaf and t.kind == LeafKind.WEIGHT:
                w = self.weights.get(key)
                if w is None:
                    raise TranslationError(f"weight {t.describe()} was not loaded by this device")
                v = weight_node(w, t.shape)
            else:
                if t.dtype.name not in OV_TYPES:
                    raise TranslationError(f"input {t.describe()}: type {t.dtype.name} is not supported")
                v = self._param(t.shape, OV_TYPES[t.dtype.name], t.name, Feed("arg", idx))
            self.values[key] = v
            return v
        raise TranslationError(f"{t.describe()} is neither computed in the fragment nor one of its inputs")

    def out(self, t: Tensor) -> ov.Output:
        """A concrete OpenVINO value for t (materialising a lazy cache write or view)."""
        v = self.value(t)
        if isinstance(v, CacheWrite):
            return self._scattered(v)
        if isinstance(v, CacheView):
            full = self._scattered(v.write)
            return _view(full, v.write.rows_in_window * v.write.width, v.shape, 0)
        return v

    # -- the model ----------------------------------------------------------------------------
    def build(self) -> Translation:
        for n in self.f.nodes:
            self.values[id(n)] = self.node(n)
        results, outputs = [], []
        for t in self.f.outputs:
            v = self.values[id(t)]
            if t.op == "SET_ROWS" and isinstance(v, CacheWrite):
                cache_arg = self.arg_index[id(t.src[0])]
                results.append(ops.result(v.new_rows))
                new_idx = len(results) - 1
                rows_arg = self.arg_index.get(id(t.src[2]))
                rows_idx = None
                if rows_arg is None:
                    results.append(ops.result(v.rows))
                    rows_idx = len(results) - 1
                outputs.append(("cache", cache_arg, new_idx, rows_arg, rows_idx))
            else:
                results.append(ops.result(self.out(t)))
                outputs.append(("value", len(results) - 1))
        model = ov.Model(results, self.params, f"fragment_{self.f.structure}")
        # deterministic names: OpenVINO's on-disk cache hashes the serialised model, names included
        for i, node in enumerate(model.get_ordered_ops()):
            if node.get_type_name() != "Parameter":
                node.set_friendly_name(f"{node.get_type_name()}_{i}")
        for i, o in enumerate(model.outputs):
            o.get_tensor().set_names({f"out{i}"})
        return Translation(model, self.feeds, outputs, dict(self.windows))

    def node(self, n: Tensor):
        op = n.op
        fn = getattr(self, "op_" + op.lower(), None)
        if fn is None:
            raise TranslationError(f"no translation for {n.describe()}")
        return fn(n)

    # -- ops ----------------------------------------------------------------------------------
    def op_get_rows(self, n):
        a, rows = n.src
        return ops.gather(self.out(a), self.out(rows), _i64(0)).output(0)

    def op_mul_mat(self, n):
        a, b = n.src
        if id(n) in self.fusion:
            return self._fused_product(*self.fusion[id(n)])
        w = self.weights.get(id(a)) if a.is_leaf and a.kind == LeafKind.WEIGHT else None
        if w is not None and len(a.shape) == 2:
            return weight_product(self.out(b), b.shape, w, a.shape)
        av, bv = self.out(a), self.out(b)
        if len(a.shape) == 2:
            return ops.matmul(bv, av, False, True).output(0)
        # ggml broadcasting: b batch i uses a batch i // (nb / na), a's leading axes padded with 1
        ab = (1,) * (len(b.shape) - len(a.shape)) + tuple(a.shape[:-2])
        bb = tuple(b.shape[:-2])
        if ab != bb:
            av = _reshape(av, ab + a.shape[-2:])
            expanded, target = [], []
            for na, nb in zip(ab, bb):
                expanded += [na, 1]
                target += [na, nb // na]
            av = _reshape(av, tuple(expanded) + a.shape[-2:])
            av = ops.broadcast(av, _i64(target + list(a.shape[-2:]))).output(0)
            av = _reshape(av, bb + a.shape[-2:])
        return ops.matmul(bv, av, False, True).output(0)

    def _fused_product(self, group: list[Tensor], place: int) -> ov.Output:
        first = id(group[0])
        if first not in self.fused:
            w = fused_weight([self.weights[id(m.src[0])] for m in group])
            b = group[0].src[1]
            y = weight_product(self.out(b), b.shape, w, w.shape)
            split = ops.variadic_split(y, _i64(-1), _i64([m.src[0].shape[0] for m in group]))
            self.fused[first] = [split.output(i) for i in range(len(group))]
        return self.fused[first][place]

    def _binary(self, n, fn):
        a, b = n.src
        av, bv = self.out(a), self.out(b)
        bs = (1,) * (len(a.shape) - len(b.shape)) + tuple(b.shape)
        if any(x != 1 and x != y for x, y in zip(bs, a.shape)):      # ggml_repeat: tile whole copies
            bv = _reshape(bv, bs)
            bv = ops.tile(bv, _i64([y // x for x, y in zip(bs, a.shape)])).output(0)
        return fn(av, bv).output(0)

    def op_add(self, n):
        return self._binary(n, ops.add)

    def op_mul(self, n):
        return self._binary(n, ops.multiply)

    def op_scale(self, n):
        return ops.multiply(self.out(n.src[0]), _const(n.params["scale"])).output(0)

    @staticmethod
    def _act(x, op):
        if op == "gelu":
            return ops.gelu(x, "tanh").output(0)
        if op == "silu":
            return ops.swish(x).output(0)
        if op == "tanh":
            return ops.tanh(x).output(0)
        if op == "sigmoid":
            return ops.sigmoid(x).output(0)
        if op == "softplus":
            return ops.softplus(x).output(0)
        raise TranslationError(f"unknown activation {op}")

    def op_unary(self, n):
        return self._act(self.out(n.src[0]), n.params["op"])

    def op_glu(self, n):
        act = {"geglu": "gelu", "swiglu": "silu"}[n.params["op"]]
        return ops.multiply(self._act(self.out(n.src[0]), act), self.out(n.src[1])).output(0)

    def op_rms_norm(self, n):
        x = self.out(n.src[0])
        sq = ops.power(x, _const(2.0)).output(0)
        mean = ops.reduce_mean(sq, _i64([-1]), True).output(0)
        rs = ops.sqrt(ops.add(mean, _const(n.params["eps"]))).output(0)
        return ops.multiply(x, ops.divide(_const(1.0), rs)).output(0)

    def op_soft_max(self, n):
        x = ops.multiply(self.out(n.src[0]), _const(n.params["scale"])).output(0)
        if len(n.src) > 1:
            x = ops.add(x, self.out(n.src[1])).output(0)
        return ops.softmax(x, -1).output(0)

    def op_rope(self, n):
        """out = x * C + swap(x) * S: C and S are the cos and (signed) sin of each dimension's pair (1 and
        0 past n_dims), swap exchanges a pair's members (interleaved pairs in mode "normal", halves in
        mode "neox") with one Gather of each dimension's partner. (A Roll over (.., d/2, 2) did the same
        through OpenVINO's reference kernel, about 10x slower; see benchmarks/openvino_measure.py rope.)"""
        x, pos = n.src
        n_dims, mode = n.params["n_dims"], n.params["mode"]
        d = x.shape[2]
        rope = (n_dims, n.params["freq_base"], n.params["freq_scale"], mode, d)
        cos, sin = self._rope_table(pos, rope)
        xv = self.out(x)
        swapped = ops.gather(xv, _const(rope_partner(mode, n_dims, d), np.int32), _i64(2)).output(0)
        return ops.add(ops.multiply(xv, cos), ops.multiply(swapped, sin)).output(0)

    def _rope_table(self, pos: Tensor, rope: tuple):
        key = (id(pos), rope)
        if key in self.rope_tables:
            return self.rope_tables[key]
        n_dims, base, scale, mode, d = rope
        t = pos.shape[0]
        if id(pos) in self.arg_index:
            idx = self.arg_index[id(pos)]
            cos = self._param((t, 1, d), ov.Type.f32, f"rope_cos_{n_dims}_{base:g}", Feed("rope_cos", idx, rope=rope))
            sin = self._param((t, 1, d), ov.Type.f32, f"rope_sin_{n_dims}_{base:g}", Feed("rope_sin", idx, rope=rope))
        else:       # positions computed here: the table in float32 inside the model
            half = n_dims // 2
            inv = reference.rope_inv_freq(n_dims, base, scale)
            theta = ops.multiply(_reshape(ops.convert(self.out(pos), ov.Type.f32), (t, 1)),
                                 _const(inv.astype(np.float32).reshape(1, half))).output(0)
            spread = _const(rope_spread(mode, n_dims, d))
            tail = np.zeros((1, 1, d), dtype=np.float32)
            tail[..., n_dims:] = 1
            cos = ops.add(_reshape(ops.matmul(ops.cos(theta), spread, False, False), (t, 1, d)), _const(tail)).output(0)
            sign = np.zeros((1, 1, d), dtype=np.float32)
            a, b = reference.rope_pairs(mode, n_dims)
            sign[..., a], sign[..., b] = -1.0, 1.0
            sin = ops.multiply(_reshape(ops.matmul(ops.sin(theta), spread, False, False), (t, 1, d)),
                               _const(sign)).output(0)
        self.rope_tables[key] = (cos, sin)
        return cos, sin

    def op_set_rows(self, n):
        dst, src, rows = n.src
        if not (dst.is_leaf and dst.kind == LeafKind.CACHE and id(dst) in self.arg_index):
            raise TranslationError(f"{n.describe()}: SET_ROWS writes only a pre-allocated cache given to the fragment")
        n_ctx, width = dst.shape
        window = n_ctx if id(dst) in self.full else self._window_rows(n, n_ctx, width)
        idx = self.arg_index[id(dst)]
        if idx in self.windows:
            raise TranslationError(f"{n.describe()}: the cache {dst.name} is written twice in one fragment")
        self.windows[idx] = window
        win = self._param((window, width), OV_TYPES[dst.dtype.name], dst.name, Feed("window", idx, rows=window))
        new = _reshape(self.out(src), (rows.shape[0], width))
        return CacheWrite(n, win, window, new, self.out(rows), width)

    def _window_rows(self, n: Tensor, n_ctx: int, width: int) -> int:
        """The rows of the cache the fragment reads after this write: the largest offset-0 VIEW, or all."""
        readers = self.consumers.get(id(n), [])
        if not readers:
            return 1 if n_ctx else 0
        need = 0
        for r in readers:
            if r.op != "VIEW" or r.params["offset"] != 0:
                return n_ctx
            need = max(need, -(-math.prod(r.params["shape"]) // width))
        return max(1, min(need, n_ctx))

    def _scattered(self, w: CacheWrite) -> ov.Output:
        if w.scattered is None:
            dst = w.node.src[0]
            if w.rows_in_window < dst.shape[0]:       # rows may fall past a partial window: bind all rows
                raise _FullWindow(id(dst))
            w.scattered = ops.scatter_update(w.window, w.rows, w.new_rows, _i64(0)).output(0)
        return w.scattered

    def op_view(self, n):
        src = self.value(n.src[0])
        shape, offset = tuple(n.params["shape"]), n.params["offset"]
        if isinstance(src, CacheWrite):
            if offset == 0 and math.prod(shape) % src.width == 0:
                return CacheView(src, math.prod(shape) // src.width, shape)
            return _view(self._scattered(src), src.rows_in_window * src.width, shape, offset)
        return _view(self.out(n.src[0]), math.prod(n.src[0].shape), shape, offset)

    def op_reshape(self, n):
        return _reshape(self.out(n.src[0]), n.params["shape"])

    def op_permute(self, n):
        return ops.transpose(self.out(n.src[0]), _i64(list(n.params["axes"]))).output(0)

    op_transpose = op_permute

    def op_cont(self, n):
        return self.out(n.src[0])

    def op_concat(self, n):
        return ops.concat([self.out(n.src[0]), self.out(n.src[1])], n.params["axis"]).output(0)

    def _split_mask(self, rows_t: Tensor, rows, mask_t: Tensor, mv, s: int, tn: int):
        """For attention over the cache window as it was plus this step's new rows: which new rows are
        kept, the window's mask with the columns being rewritten masked, and the new rows' mask. Rows
        past the window (scratch rows of padding tokens) are read by no query: their K and V are zeroed
        (a padding row may hold anything, and 0 * NaN would leak) and their columns masked. Every layer
        shares one computation."""
        key = (id(rows_t), id(mask_t), s)
        if key not in self.mask_parts:
            ninf = _const(-np.inf)
            valid = ops.less(rows, _const(s, np.int32)).output(0)                            # (tn,)
            hit = ops.equal(_reshape(rows, (tn, 1)), _const(np.arange(s, dtype=np.int32).reshape(1, s), np.int32))
            rewritten = ops.reduce_logical_or(hit, _i64([0]), True).output(0)              # (1, s)
            mask_c = ops.select(rewritten, ninf, mv).output(0)
            at = ops.minimum(rows, _const(s - 1, np.int32)).output(0)
            mask_n = ops.select(_reshape(valid, (1, tn)), ops.gather(mv, at, _i64(1)), ninf).output(0)   # (t, tn)
            self.mask_parts[key] = (_reshape(valid, (tn, 1)), mask_c, mask_n)
        return self.mask_parts[key]

    def op_flash_attn_ext(self, n):
        q, k, v = n.src[:3]
        mask = n.src[3] if len(n.src) > 3 else None
        scale = n.params["scale"]
        t, h, d = q.shape
        s, hkv, _ = k.shape
        g = h // hkv
        qv = self.out(q)
        qh = _reshape(ops.transpose(qv, _i64([1, 0, 2])), (hkv, g * t, d)) if h > 1 else _reshape(qv, (1, t, d))
        kl, vl = self.value(k), self.value(v)
        lazy = (isinstance(kl, CacheView) and isinstance(vl, CacheView) and mask is not None
                and kl.n_rows == s and vl.n_rows == s and kl.write.rows_in_window == s
                and vl.write.rows_in_window == s and kl.write.node.src[2] is vl.write.node.src[2])
        mv = self.out(mask) if mask is not None else None

        def heads(x, rows):       # (rows, hkv, d) -> (hkv, rows, d)
            x = _reshape(x, (rows, hkv, d))
            return _reshape(x, (1, rows, d)) if hkv == 1 else ops.transpose(x, _i64([1, 0, 2])).output(0)

        def tiled(m):             # (t, cols) -> (g*t, cols), query rows grouped as in qh
            return m if g == 1 else ops.tile(m, _i64([g, 1])).output(0)

        if not lazy:
            kh, vh = heads(self.out(k), s), heads(self.out(v), s)
            sc = ops.multiply(ops.matmul(qh, kh, False, True), _const(scale)).output(0)
            if mv is not None:
                sc = ops.add(sc, tiled(mv)).output(0)
            p = ops.softmax(sc, -1).output(0)
            o = ops.matmul(p, vh, False, False).output(0)
        else:
            kw, vw = kl.write, vl.write
            tn = kw.new_rows.get_partial_shape()[0].get_length()
            keep, mask_c, mask_n = self._split_mask(kw.node.src[2], kw.rows, mask, mv, s, tn)
            zero = _const(0.0)
            kc, vc = heads(kw.window, s), heads(vw.window, s)
            kn = heads(ops.select(keep, kw.new_rows, zero).output(0), tn)
            vn = heads(ops.select(keep, vw.new_rows, zero).output(0), tn)
            if t <= ROW_ATTENTION_MAX_T:
                kn = ops.select(keep, kw.new_rows, zero).output(0)
                vn = ops.select(keep, vw.new_rows, zero).output(0)
                return _attend_rows(qv, [(kw.window, vw.window, mask_c, s), (kn, vn, mask_n, tn)], scale, hkv)
            sc_c = ops.add(ops.multiply(ops.matmul(qh, kc, False, True), _const(scale)), tiled(mask_c)).output(0)
            sc_n = ops.add(ops.multiply(ops.matmul(qh, kn, False, True), _const(scale)), tiled(mask_n)).output(0)
            p = ops.softmax(ops.concat([sc_c, sc_n], 2), -1).output(0)
            split = ops.variadic_split(p, _i64(2), _i64([s, tn]))
            o = ops.add(ops.matmul(split.output(0), vc, False, False),
                        ops.matmul(split.output(1), vn, False, False)).output(0)
        o = _reshape(o, (h, t, d))
        return ops.transpose(o, _i64([1, 0, 2])).output(0) if h > 1 else _reshape(o, (t, 1, d))


def _attend_rows(q: ov.Output, parts, scale: float, hkv: int) -> ov.Output:
    """Attention of a few queries q (T, H, D) over key/value rows kept as they are stored, (S, Hkv*D),
    in several parts [(K, V, mask (T, S), S), ...] with one softmax across the parts: no transpose or
    concatenation of the cache. With Hkv > 1 every query head meets every kv head's rows (Hkv times the
    few multiply-adds a decode step needs) and keeps its own: cheaper than moving the cache."""
    t, h, d = (q.get_partial_shape()[i].get_length() for i in range(3))
    g = h // hkv
    if hkv > 1 and (ROW_ATTENTION == "grouped" or ROW_ATTENTION == "auto" and t > 1):
        return _attend_rows_grouped(q, parts, scale, t, hkv, g, d)
    qf = _reshape(q, (t * h, d))
    onehot = None
    if hkv > 1:
        onehot = _const(np.eye(hkv, dtype=np.float32).reshape(1, hkv, 1, 1, hkv))

    # (t, kh, g) query rows: each one's own kv head
    head = np.broadcast_to(np.arange(hkv).reshape(1, hkv, 1), (t, hkv, g)).reshape(-1)
    row = np.arange(t * h)

    def own(x, inner):      # (T*H, inner*Hkv) ordered (t, kh, g) x (inner, kh') -> keep kh == kh'
        if hkv == 1:
            return _reshape(x, (t, 1, g, inner))
        if OWN_BY_GATHER:   # one Gather of the kept entries, not a product by a one-hot mask and its sum
            at = (row[:, None] * inner + np.arange(inner)[None, :]) * hkv + head[:, None]
            picked = ops.gather(_reshape(x, (t * h * inner * hkv,)), _const(at.astype(np.int32), np.int32), _i64(0))
            return _reshape(picked, (t, hkv, g, inner))
        x = _reshape(x, (t, hkv, g, inner, hkv))
        return ops.reduce_sum(ops.multiply(x, onehot), _i64([-1]), False).output(0)

    scores = []
    for k, _, mask, rows in parts:
        sc = own(ops.matmul(qf, _reshape(k, (rows * hkv, d)), False, True).output(0), rows)    # (t, hkv, g, rows)
        sc = ops.add(ops.multiply(sc, _const(scale)), _reshape(mask, (t, 1, 1, rows))).output(0)
        scores.append(sc)
    top = _top_of(scores)
    total, out = None, None
    for sc, (_, v, _, rows) in zip(scores, parts):
        e, total = _weights_of(sc, top, total)
        o = ops.matmul(_reshape(e, (t * h, rows)), v, False, False).output(0)            # (t*h, hkv*d)
        if hkv > 1 and OWN_BY_GATHER:
            o = ops.gather(_reshape(o, (t * h * hkv, d)), _const((row * hkv + head).astype(np.int32), np.int32),
                           _i64(0)).output(0)
        elif hkv > 1:
            o = _reshape(o, (t, hkv, g, hkv, d))
            o = ops.reduce_sum(ops.multiply(o, _reshape(onehot, (1, hkv, 1, hkv, 1))), _i64([3]), False).output(0)
        o = _reshape(o, (t, hkv, g, d))
        out = o if out is None else ops.add(out, o).output(0)
    return _reshape(ops.divide(out, total), (t, h, d))


def _top_of(scores) -> ov.Output:
    """The largest score of every query row over all the parts' scores (the softmax's shift)."""
    top = ops.reduce_max(scores[0], _i64([-1]), True).output(0)
    for sc in scores[1:]:
        top = ops.maximum(top, ops.reduce_max(sc, _i64([-1]), True)).output(0)
    return top


def _weights_of(sc, top, total):
    """A part's exp(scores - top), and the running total of its sums added to `total` (None at first)."""
    e = ops.exp(ops.subtract(sc, top)).output(0)
    den = ops.reduce_sum(e, _i64([-1]), True).output(0)
    return e, den if total is None else ops.add(total, den).output(0)


def _attend_rows_grouped(q: ov.Output, parts, scale: float, t: int, hkv: int, g: int, d: int) -> ov.Output:
    """_attend_rows by kv head: the (Hkv, T*G, D) queries against each kv head's own rows (Hkv, S, D), one batched
    product, so no multiply-add is spent on another head's rows. The rows' (S, Hkv, D) -> (Hkv, S, D) transpose is
    left for OpenVINO to fuse into the product or to make."""
    qg = _reshape(q, (t, hkv, g, d))
    qg = _reshape(qg if t == 1 else ops.transpose(qg, _i64([1, 0, 2, 3])), (hkv, t * g, d))

    def heads(x, rows):     # (S, Hkv*D) -> (Hkv, S, D)
        return ops.transpose(_reshape(x, (rows, hkv, d)), _i64([1, 0, 2])).output(0)

    scores = []
    for k, _, mask, rows in parts:
        sc = _reshape(ops.matmul(qg, heads(k, rows), False, True), (hkv, t, g, rows))
        scores.append(ops.add(ops.multiply(sc, _const(scale)), _reshape(mask, (1, t, 1, rows))).output(0))
    top = _top_of(scores)
    total, out = None, None
    for sc, (_, v, _, rows) in zip(scores, parts):
        e, total = _weights_of(sc, top, total)
        o = _reshape(ops.matmul(_reshape(e, (hkv, t * g, rows)), heads(v, rows), False, False), (hkv, t, g, d))
        out = o if out is None else ops.add(out, o).output(0)
    o = ops.divide(out, total).output(0)                                                  # (hkv, t, g, d)
    return _reshape(o if t == 1 else ops.transpose(o, _i64([1, 0, 2, 3])), (t, hkv * g, d))


def _view(x, n_total: int, shape, offset: int) -> ov.Output:
    n = math.prod(shape)
    flat = _reshape(x, (n_total,))
    if offset or n != n_total:
        flat = ops.slice(flat, _i64([offset]), _i64([offset + n]), _i64([1]), _i64([0])).output(0)
    return _reshape(flat, shape)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-." else "_" for c in name)[:48]


def translate(fragment: Fragment, weights: dict[int, OvWeight]) -> Translation:
    global _SHARED
    full: frozenset = frozenset()
    while True:
        _SHARED = {}
        try:
            return Translator(fragment, weights, full).build()
        except _FullWindow as e:
            full = full | {e.args[0]}
        finally:
            _SHARED = None
