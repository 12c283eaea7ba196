"""Lowering the ops other than MUL_MAT: one function per op, each appending its Steps to the Lowering."""

from __future__ import annotations

from ...core.graph import Tensor
from . import quant, wgsl
from .kernel_shapes import SPLIT_ATTN_BELOW
from .steps import pad4
from .tensors import contig
from .verdicts import is_weight
from .wgsl import GLU_CODE, UNARY_CODE



def rms_norm(lw, n: Tensor, norm: Tensor, gain: Tensor | None):
    a = lw.ref(norm.src[0])
    o = lw.new_val(n)
    ncols = norm.shape[-1]
    nrows = norm.nelements // ncols
    gb = ("ref", lw.ref(gain)) if gain is not None else ("dummy",)
    label = "RMS_NORM+MUL" if gain is not None else "RMS_NORM"
    lw.emit(f"{label} {n.name}", ("rms_norm",), lambda: wgsl.simple("rms_norm"), (False, False, True),
            [("ref", a), gb, ("ref", o)],
               {8: ncols, 9: nrows, 10: float(norm.params["eps"]), 11: int(gain is not None),
                12: ncols}, nrows)


def op_rms_norm(lw, n):
    """RMS_NORM alone (with its MUL by a gain, rms_norm(), where lowering.py fuses them)."""
    rms_norm(lw, n, n, None)


def op_add(lw, n):
    _binary(lw, n, 0)


def op_mul(lw, n):
    _binary(lw, n, 1)


def _binary(lw, n, code):
    a, b = lw.ref(n.src[0]), lw.ref(n.src[1])
    o = lw.new_val(n)
    sa, sb = pad4(n.src[0].shape), pad4(n.src[1].shape)
    params = {8: n.nelements, 17: code}
    for i in range(4):
        params[9 + i] = sa[i]
        params[13 + i] = sb[i]
    lw.simple(n, "binary", [("ref", a), ("ref", b), ("ref", o)], (False, False, True), params,
              -(-n.nelements // 256))


def op_scale(lw, n):
    _unary(lw, n, 0, float(n.params["scale"]))


def op_unary(lw, n):
    _unary(lw, n, UNARY_CODE[n.params["op"]], 1.0)


def _unary(lw, n, code, scale):
    a = lw.ref(n.src[0])
    o = lw.new_val(n)
    lw.simple(n, "unary", [("ref", a), ("ref", o)], (False, True), {8: n.nelements, 9: code, 10: scale},
              -(-n.nelements // 256))


def op_glu(lw, n):
    g, u = lw.ref(n.src[0]), lw.ref(n.src[1])
    o = lw.new_val(n)
    lw.simple(n, "glu", [("ref", g), ("ref", u), ("ref", o)], (False, False, True),
              {8: n.nelements, 9: GLU_CODE[n.params["op"]]}, -(-n.nelements // 256))


def op_soft_max(lw, n):
    a = lw.ref(n.src[0])
    mask = ("ref", lw.ref(n.src[1])) if len(n.src) > 1 else ("dummy",)
    o = lw.new_val(n)
    s = n.shape[-1]
    rows = n.nelements // s
    t = n.shape[-2] if len(n.shape) > 1 else 1
    lw.simple(n, "soft_max", [("ref", a), mask, ("ref", o)], (False, False, True),
              {8: s, 9: rows, 10: t, 11: int(len(n.src) > 1), 12: float(n.params["scale"])}, rows)


def op_flash_attn_ext(lw, n):
    q, k, v = (lw.ref(s) for s in n.src[:3])
    mask = ("ref", lw.ref(n.src[3])) if len(n.src) > 3 else ("dummy",)
    o = lw.new_val(n)
    t, h, d = n.src[0].shape
    s, hkv, _ = n.src[1].shape
    kernel = "flash_attn"
    params = {8: t, 9: h, 10: hkv, 11: d, 12: s, 13: int(len(n.src) > 3), 14: float(n.params["scale"])}
    if d % 4 == 0 and all(r.off % 4 == 0 for r in (q, k, v, o)):
        kernel = "flash_attn4"
        lw.align4.update(r.idx for r in (q, k, v) if r.kind == "arg")
        if not lw.dev.cpu_adapter and t * h < SPLIT_ATTN_BELOW and s > 64:
            # flash decoding: keys in chunks, one workgroup per (row, head, chunk), then a combine
            nc = min(-(-s // 64), max(2, SPLIT_ATTN_BELOW * 2 // (t * h)))
            per = -(-s // nc)
            ch = -(-per // 64) * 64
            nc = -(-s // ch)
            part = lw.scratch((t * h * nc * (d + 4),))
            lw.emit(f"FLASH_ATTN_EXT[split] {n.name}", ("flash_attn_split",),
                    lambda: wgsl.simple("flash_attn_split"), (False, False, False, False, True),
                    [("ref", q), ("ref", k), ("ref", v), mask, ("ref", part)], {**params, 15: nc, 16: ch},
                    t * h * nc)
            lw.emit(f"FLASH_ATTN_EXT[combine] {n.name}", ("flash_combine",), lambda: wgsl.simple("flash_combine"),
                    (False, True), [("ref", part), ("ref", o)], {8: t * h, 9: d, 10: nc}, t * h)
            return
    lw.simple(n, kernel, [("ref", q), ("ref", k), ("ref", v), mask, ("ref", o)],
              (False, False, False, False, True), params, t * h)


def op_rope(lw, n):
    a = lw.ref(n.src[0])
    pos = lw.ref(n.src[1])
    if pos.kind != "arg":
        raise ValueError(f"ROPE positions must be an argument of the fragment ({n.src[1].describe()})")
    o = lw.new_val(n)
    t, h, d = n.shape
    p = n.params
    key = (pos.idx, pos.off, int(p["n_dims"]), float(p["freq_base"]), float(p["freq_scale"]), t)
    if key not in lw.ropes:
        lw.ropes.append(key)
    ti = lw.ropes.index(key)
    lw.simple(n, "rope", [("ref", a), ("rope", ti), ("ref", o)], (False, False, True),
              {8: t, 9: h, 10: d, 11: int(p["n_dims"]), 12: int(p["mode"] == "neox")},
              -(-(t * h * (d // 2)) // 256))


def op_set_rows(lw, n):
    dst, src, rows = (lw.ref(s) for s in n.src)
    if dst.kind != "arg" or not dst.contiguous:
        raise ValueError(f"SET_ROWS writes a cache argument in place, not {n.src[0].describe()}")
    lw.written_args.add(dst.idx)
    lw.refs[id(n)] = dst
    w = n.shape[1]
    t = n.src[2].shape[0]
    lw.simple(n, "set_rows", [("ref", src), ("ref", rows), ("ref", dst)], (False, False, True),
              {8: w, 9: t, 10: n.shape[0]}, -(-(w * t) // 256))


def op_cont(lw, n):
    a = lw.ref(n.src[0])
    o = lw.new_val(n)
    shape = pad4(n.shape)
    st = a.strides or contig(a.shape)
    st = (0,) * (4 - len(st)) + tuple(st)
    params = {8: n.nelements}
    for i in range(4):
        params[9 + i] = shape[i]
        params[13 + i] = st[i]
    lw.simple(n, "cont", [("ref", a), ("ref", o)], (False, True), params, -(-n.nelements // 256))


def op_get_rows(lw, n):
    a, rows = n.src
    o = lw.new_val(n)
    rr = lw.ref(rows)
    w = a.shape[1]
    t = rows.shape[0]
    if not is_weight(a):
        lw.emit(f"GET_ROWS {n.name}", ("get_rows_f", "F32"), lambda: wgsl.get_rows_f("F32"),
                (False, False, True), [("ref", lw.ref(a)), ("ref", rr), ("ref", o)],
                {8: w, 9: t, 10: 0, 11: a.shape[0]}, -(-(w * t) // 256))
        return
    qt = a.dtype.name
    arg = lw.arg_of(a)
    for ci, (row0, nrows) in enumerate(lw.chunks(a)):
        if qt in quant.FLOAT_TYPES:
            lw.emit(f"GET_ROWS {n.name}", ("get_rows_f", qt), lambda qt=qt: wgsl.get_rows_f(qt),
                    (False, False, True), [("chunk", arg, ci), ("ref", rr), ("ref", o)],
                    {8: w, 9: t, 10: row0, 11: nrows}, -(-(w * t) // 256))
        else:
            lw.emit(f"GET_ROWS {n.name}", ("get_rows_q", qt), lambda qt=qt: wgsl.get_rows_q(qt),
                    (False, False, True), [("chunk", arg, ci), ("ref", rr), ("ref", o)],
                    {8: w, 9: t, 10: row0, 11: nrows, 12: w // 32, 13: ("moff", arg, ci)},
                    -(-(w // 8 * t) // 256))


LOWER = {"RMS_NORM": op_rms_norm, "ADD": op_add, "MUL": op_mul, "SCALE": op_scale, "UNARY": op_unary, "GLU": op_glu,
         "SOFT_MAX": op_soft_max, "FLASH_ATTN_EXT": op_flash_attn_ext, "ROPE": op_rope, "SET_ROWS": op_set_rows,
         "CONT": op_cont, "GET_ROWS": op_get_rows}
