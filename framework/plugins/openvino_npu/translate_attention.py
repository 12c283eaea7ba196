"""FLASH_ATTN_EXT as OpenVINO operations: over the keys and values as given, or, for an attention that reads
the cache window just written (translate.py: a lazy CacheWrite), over the window as it was plus the step's
new rows, with the rows being rewritten masked out; a few queries read the cache rows in place (attend_rows)."""

from __future__ import annotations

import numpy as np
import openvino as ov
from openvino import opset13 as ops

from ...contract import Tensor
from .kv_programs import DynamicKVError
from .translate import CacheView, const, i64, reshape

OWN_BY_GATHER = True
# With Hkv > 1 kv heads, attention over cache rows (attend_rows) multiplies each kv head's group of query heads by
# that head's rows alone, in one batched product ("grouped"), or every query head by every kv head's rows, keeping
# its own by OWN_BY_GATHER ("all"); "auto" groups from 2 queries a step. OpenVINO's CPU plugin does not fuse the
# rows' (S, Hkv, D) -> (Hkv, S, D) transpose into the product: the transposes cost what the Hkv times fewer
# multiply-adds save at one query, and less than they save at five (benchmarks/openvino_measure.py own-head).
ROW_ATTENTION = "auto"
ROW_ATTENTION_MAX_T = 8     # up to this many queries, attention reads the cache rows in place (attend_rows)


def split_mask(tr, rows_t: Tensor, rows, mask_t: Tensor, mv, s: int, tn: int):
    """For attention over the cache window as it was plus this step's new rows: which new rows are
    kept, the window's mask with the columns being rewritten masked, and the new rows' mask. Rows
    past the window (scratch rows of padding tokens) are read by no query: their K and V are zeroed
    (a padding row may hold anything, and 0 * NaN would leak) and their columns masked. Every layer
    shares one computation (the translator's ``mask_parts``)."""
    key = (id(rows_t), id(mask_t), s)
    if key not in tr.mask_parts:
        ninf = const(-np.inf)
        if tr.kv is None:
            s_at, cols = const(s, np.int32), const(np.arange(s, dtype=np.int32).reshape(1, s), np.int32)
            last = const(s - 1, np.int32)
        else:                   # the window's rows are the mask's columns, whatever the program's KV length
            s_at = ops.convert(ops.gather(ops.shape_of(mv), i64(1), i64(0)), ov.Type.i32).output(0)
            cols = reshape(ops.range(const(0, np.int32), s_at, const(1, np.int32), ov.Type.i32), (1, -1))
            last = ops.subtract(s_at, const(1, np.int32)).output(0)
        valid = ops.less(rows, s_at).output(0)                                          # (tn,)
        hit = ops.equal(reshape(rows, (tn, 1)), cols)
        rewritten = ops.reduce_logical_or(hit, i64([0]), True).output(0)              # (1, s)
        mask_c = ops.select(rewritten, ninf, mv).output(0)
        at = ops.minimum(rows, last).output(0)
        mask_n = ops.select(reshape(valid, (1, tn)), ops.gather(mv, at, i64(1)), ninf).output(0)   # (t, tn)
        tr.mask_parts[key] = (reshape(valid, (tn, 1)), mask_c, mask_n)
    return tr.mask_parts[key]


def op_flash_attn_ext(tr, n):
    q, k, v = n.src[:3]
    mask = n.src[3] if len(n.src) > 3 else None
    scale = n.params["scale"]
    t, h, d = q.shape
    s, hkv, _ = k.shape
    g = h // hkv
    qv = tr.out(q)
    qh = reshape(ops.transpose(qv, i64([1, 0, 2])), (hkv, g * t, d)) if h > 1 else reshape(qv, (1, t, d))
    kl, vl = tr.value(k), tr.value(v)
    lazy = (isinstance(kl, CacheView) and isinstance(vl, CacheView) and mask is not None
            and kl.n_rows == s and vl.n_rows == s and kl.write.rows_in_window == s
            and vl.write.rows_in_window == s and kl.write.node.src[2] is vl.write.node.src[2])
    mv = tr.out(mask) if mask is not None else None

    def heads(x, rows):       # (rows, hkv, d) -> (hkv, rows, d)
        x = reshape(x, (rows, hkv, d))
        return reshape(x, (1, rows, d)) if hkv == 1 else ops.transpose(x, i64([1, 0, 2])).output(0)

    def tiled(m):             # (t, cols) -> (g*t, cols), query rows grouped as in qh
        return m if g == 1 else ops.tile(m, i64([g, 1])).output(0)

    if not lazy and tr.kv is not None:       # the forms below fix the window's rows
        raise DynamicKVError(f"{n.describe()} does not read the cache window just written in place")
    if not lazy:
        kh, vh = heads(tr.out(k), s), heads(tr.out(v), s)
        sc = ops.multiply(ops.matmul(qh, kh, False, True), const(scale)).output(0)
        if mv is not None:
            sc = ops.add(sc, tiled(mv)).output(0)
        p = ops.softmax(sc, -1).output(0)
        o = ops.matmul(p, vh, False, False).output(0)
    else:
        kw, vw = kl.write, vl.write
        tn = kw.new_rows.get_partial_shape()[0].get_length()
        keep, mask_c, mask_n = split_mask(tr, kw.node.src[2], kw.rows, mask, mv, s, tn)
        zero = const(0.0)
        kn = ops.select(keep, kw.new_rows, zero).output(0)
        vn = ops.select(keep, vw.new_rows, zero).output(0)
        rows = -1 if tr.kv is not None else s     # the window's rows: -1 where the KV length is left dynamic
        if t <= ROW_ATTENTION_MAX_T:
            return attend_rows(qv, [(kw.window, vw.window, mask_c, rows), (kn, vn, mask_n, tn)], scale, hkv,
                               tr.mask_parts if rows < 0 else None)
        kc, vc, kn, vn = heads(kw.window, rows), heads(vw.window, rows), heads(kn, tn), heads(vn, tn)
        sc_c = ops.add(ops.multiply(ops.matmul(qh, kc, False, True), const(scale)), tiled(mask_c)).output(0)
        sc_n = ops.add(ops.multiply(ops.matmul(qh, kn, False, True), const(scale)), tiled(mask_n)).output(0)
        p = ops.softmax(ops.concat([sc_c, sc_n], 2), -1).output(0)
        split = ops.variadic_split(p, i64(2), i64([rows, tn]))
        o = ops.add(ops.matmul(split.output(0), vc, False, False),
                    ops.matmul(split.output(1), vn, False, False)).output(0)
    o = reshape(o, (h, t, d))
    return ops.transpose(o, i64([1, 0, 2])).output(0) if h > 1 else reshape(o, (t, 1, d))


def attend_rows(q: ov.Output, parts, scale: float, hkv: int, shared: dict | None = None) -> ov.Output:
    """Attention of a few queries q (T, H, D) over key/value rows kept as they are stored, (S, Hkv*D),
    in several parts [(K, V, mask (T, S), S), ...] with one softmax across the parts: no transpose or
    concatenation of the cache. With Hkv > 1 every query head meets every kv head's rows (Hkv times the
    few multiply-adds a decode step needs) and keeps its own: cheaper than moving the cache. A part of -1 rows
    has as many as its keys (a dynamic KV length): the Gather's indices are then made in the model from the
    rows' count (a one-hot product and sum instead ran SmolLM2's decode at 0.88x: docs/openvino.md), once for
    every layer of the model (``shared``: the translator's, keyed by the mask they are made from)."""
    t, h, d = (q.get_partial_shape()[i].get_length() for i in range(3))
    g = h // hkv
    if hkv > 1 and (ROW_ATTENTION == "grouped" or ROW_ATTENTION == "auto" and t > 1):
        return _attend_rows_grouped(q, parts, scale, t, hkv, g, d)
    qf = reshape(q, (t * h, d))
    onehot = None
    if hkv > 1:
        onehot = const(np.eye(hkv, dtype=np.float32).reshape(1, hkv, 1, 1, hkv))

    # (t, kh, g) query rows: each one's own kv head
    head = np.broadcast_to(np.arange(hkv).reshape(1, hkv, 1), (t, hkv, g)).reshape(-1)
    row = np.arange(t * h)

    def own(x, inner, mask):   # (T*H, inner*Hkv) ordered (t, kh, g) x (inner, kh') -> keep kh == kh'
        if hkv == 1:
            return reshape(x, (t, 1, g, inner))
        if OWN_BY_GATHER and inner >= 0:   # one Gather of the kept entries, not a product by a one-hot mask and its sum
            at = (row[:, None] * inner + np.arange(inner)[None, :]) * hkv + head[:, None]
            picked = ops.gather(reshape(x, (t * h * inner * hkv,)), const(at.astype(np.int32), np.int32), i64(0))
            return reshape(picked, (t, hkv, g, inner))
        if OWN_BY_GATHER:   # the same Gather, its indices made for the rows at hand (a dynamic KV length)
            picked = ops.gather(reshape(x, (-1,)), dynamic_own(mask, shared), i64(0))
            return reshape(picked, (t, hkv, g, -1))
        x = reshape(x, (t, hkv, g, inner, hkv))
        return ops.reduce_sum(ops.multiply(x, onehot), i64([-1]), False).output(0)

    def dynamic_own(mask, shared):      # at[i, c] = (row i * rows + c) * hkv + head i, rows the mask's columns
        key = ("own", mask.get_node().get_instance_id(), mask.get_index(), hkv, t, g)
        if shared is not None and key in shared:
            return shared[key]
        n = ops.multiply(ops.convert(ops.gather(ops.shape_of(mask), i64(1), i64(0)), ov.Type.i32),
                         const(hkv, np.int32)).output(0)                                     # rows * hkv
        cols = ops.range(const(0, np.int32), n, const(hkv, np.int32), ov.Type.i32).output(0)   # c * hkv
        first = ops.multiply(const(row[:, None].astype(np.int32), np.int32), n)             # where x row i starts
        at = ops.add(ops.add(first, reshape(cols, (1, -1))), const(head[:, None].astype(np.int32), np.int32)).output(0)
        if shared is not None:
            shared[key] = at
        return at

    scores = []
    for k, _, mask, rows in parts:
        keys = reshape(k, (rows * hkv if rows >= 0 else -1, d))
        sc = own(ops.matmul(qf, keys, False, True).output(0), rows, mask)                    # (t, hkv, g, rows)
        sc = ops.add(ops.multiply(sc, const(scale)), reshape(mask, (t, 1, 1, rows))).output(0)
        scores.append(sc)
    top = _top_of(scores)
    total, out = None, None
    for sc, (_, v, _, rows) in zip(scores, parts):
        e, total = _weights_of(sc, top, total)
        o = ops.matmul(reshape(e, (t * h, rows)), v, False, False).output(0)            # (t*h, hkv*d)
        if hkv > 1 and OWN_BY_GATHER:
            o = ops.gather(reshape(o, (t * h * hkv, d)), const((row * hkv + head).astype(np.int32), np.int32),
                           i64(0)).output(0)
        elif hkv > 1:
            o = reshape(o, (t, hkv, g, hkv, d))
            o = ops.reduce_sum(ops.multiply(o, reshape(onehot, (1, hkv, 1, hkv, 1))), i64([3]), False).output(0)
        o = reshape(o, (t, hkv, g, d))
        out = o if out is None else ops.add(out, o).output(0)
    return reshape(ops.divide(out, total), (t, h, d))


def _top_of(scores) -> ov.Output:
    """The largest score of every query row over all the parts' scores (the softmax's shift)."""
    top = ops.reduce_max(scores[0], i64([-1]), True).output(0)
    for sc in scores[1:]:
        top = ops.maximum(top, ops.reduce_max(sc, i64([-1]), True)).output(0)
    return top


def _weights_of(sc, top, total):
    """A part's exp(scores - top), and the running total of its sums added to `total` (None at first)."""
    e = ops.exp(ops.subtract(sc, top)).output(0)
    den = ops.reduce_sum(e, i64([-1]), True).output(0)
    return e, den if total is None else ops.add(total, den).output(0)


def _attend_rows_grouped(q: ov.Output, parts, scale: float, t: int, hkv: int, g: int, d: int) -> ov.Output:
    """attend_rows by kv head: the (Hkv, T*G, D) queries against each kv head's own rows (Hkv, S, D), one batched
    product, so no multiply-add is spent on another head's rows. The rows' (S, Hkv, D) -> (Hkv, S, D) transpose is
    left for OpenVINO to fuse into the product or to make."""
    qg = reshape(q, (t, hkv, g, d))
    qg = reshape(qg if t == 1 else ops.transpose(qg, i64([1, 0, 2, 3])), (hkv, t * g, d))

    def heads(x, rows):     # (S, Hkv*D) -> (Hkv, S, D)
        return ops.transpose(reshape(x, (rows, hkv, d)), i64([1, 0, 2])).output(0)

    scores = []
    for k, _, mask, rows in parts:
        sc = reshape(ops.matmul(qg, heads(k, rows), False, True), (hkv, t, g, rows))
        scores.append(ops.add(ops.multiply(sc, const(scale)), reshape(mask, (1, t, 1, rows))).output(0))
    top = _top_of(scores)
    total, out = None, None
    for sc, (_, v, _, rows) in zip(scores, parts):
        e, total = _weights_of(sc, top, total)
        o = reshape(ops.matmul(reshape(e, (hkv, t * g, rows)), heads(v, rows), False, False), (hkv, t, g, d))
        out = o if out is None else ops.add(out, o).output(0)
    o = ops.divide(out, total).output(0)                                                  # (hkv, t, g, d)
    return reshape(o if t == 1 else ops.transpose(o, i64([1, 0, 2, 3])), (t, hkv * g, d))
