"""Lowering the ops other than MUL_MAT: one function per op, each appending its Steps to the Lowering.
Parameters go by the names of the kernel's block (wgsl.py, ``*_PARAMS``)."""

from __future__ import annotations

from ...contract import Tensor
from . import quant, wgsl
from .kernel_shapes import SPLIT_ATTN_BELOW
from .steps import pad4
from .tensors import contig
from .verdicts import is_weight
from .wgsl import GLU_CODE, UNARY_CODE

RW2, RW3, RW5 = (False, True), (False, False, True), (False, False, False, False, True)   # the last binding written


def _each(n: int) -> int:
    """Workgroups of the one-thread-per-element kernels (256 threads)."""
    return -(-n // 256)


def rms_norm(lw, n: Tensor, norm: Tensor, gain: Tensor | None):
    """RMS_NORM `norm`, and if gain is given the MUL `n` by it, in one dispatch."""
    ncols = norm.shape[-1]
    nrows = norm.nelements // ncols
    gb = ("ref", lw.ref(gain)) if gain is not None else ("dummy",)
    label = "RMS_NORM+MUL" if gain is not None else "RMS_NORM"
    binds = [("ref", lw.ref(norm.src[0])), gb, ("ref", lw.new_val(n))]
    lw.emit(f"{label} {n.name}", ("rms_norm",), lambda: wgsl.simple("rms_norm"), RW3, binds,
            {"ncols": ncols, "nrows": nrows, "eps": float(norm.params["eps"]), "has_gain": int(gain is not None),
             "gain_len": ncols}, nrows)


def op_rms_norm(lw, n):
    """RMS_NORM alone (with its MUL by a gain, rms_norm(), where lowering.py fuses them)."""
    rms_norm(lw, n, n, None)


def op_add(lw, n):
    _binary(lw, n, 0)


def op_mul(lw, n):
    _binary(lw, n, 1)


def _binary(lw, n, code):
    sa, sb = pad4(n.src[0].shape), pad4(n.src[1].shape)
    params = {"n": n.nelements, "op": code} | {f"d{i}": sa[i] for i in range(4)} | {f"b{i}": sb[i] for i in range(4)}
    binds = [("ref", lw.ref(n.src[0])), ("ref", lw.ref(n.src[1])), ("ref", lw.new_val(n))]
    lw.simple(n, "binary", binds, RW3, params, _each(n.nelements))


def op_scale(lw, n):
    _unary(lw, n, 0, float(n.params["scale"]))


def op_unary(lw, n):
    _unary(lw, n, UNARY_CODE[n.params["op"]], 1.0)


def _unary(lw, n, code, scale):
    binds = [("ref", lw.ref(n.src[0])), ("ref", lw.new_val(n))]
    lw.simple(n, "unary", binds, RW2, {"n": n.nelements, "op": code, "scale": scale}, _each(n.nelements))


def op_glu(lw, n):
    binds = [("ref", lw.ref(n.src[0])), ("ref", lw.ref(n.src[1])), ("ref", lw.new_val(n))]
    lw.simple(n, "glu", binds, RW3, {"n": n.nelements, "op": GLU_CODE[n.params["op"]]}, _each(n.nelements))


def op_soft_max(lw, n):
    a = lw.ref(n.src[0])
    mask = ("ref", lw.ref(n.src[1])) if len(n.src) > 1 else ("dummy",)
    o = lw.new_val(n)
    s = n.shape[-1]
    rows = n.nelements // s
    t = n.shape[-2] if len(n.shape) > 1 else 1
    lw.simple(n, "soft_max", [("ref", a), mask, ("ref", o)], RW3,
              {"ncols": s, "nrows": rows, "mask_rows": t, "has_mask": int(len(n.src) > 1),
               "scale": float(n.params["scale"])}, rows)


def op_flash_attn_ext(lw, n):
    q, k, v = (lw.ref(s) for s in n.src[:3])
    mask = ("ref", lw.ref(n.src[3])) if len(n.src) > 3 else ("dummy",)
    o = lw.new_val(n)
    t, h, d = n.src[0].shape
    s, hkv, _ = n.src[1].shape
    kernel = "flash_attn"
    params = {"t": t, "h": h, "hkv": hkv, "d": d, "s": s, "has_mask": int(len(n.src) > 3),
              "scale": float(n.params["scale"])}
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
            lw.emit(f"FLASH_ATTN_EXT[split] {n.name}", ("flash_attn_split",), lambda: wgsl.simple("flash_attn_split"),
                    RW5, [("ref", q), ("ref", k), ("ref", v), mask, ("ref", part)], params | {"nc": nc, "chunk": ch},
                    t * h * nc)
            lw.emit(f"FLASH_ATTN_EXT[combine] {n.name}", ("flash_combine",), lambda: wgsl.simple("flash_combine"),
                    RW2, [("ref", part), ("ref", o)], {"rows": t * h, "d": d, "nc": nc}, t * h)
            return
    lw.simple(n, kernel, [("ref", q), ("ref", k), ("ref", v), mask, ("ref", o)], RW5, params, t * h)


def op_rope(lw, n):
    pos = lw.ref(n.src[1])
    if pos.kind != "arg":
        raise ValueError(f"ROPE positions must be an argument of the fragment ({n.src[1].describe()})")
    t, h, d = n.shape
    p = n.params
    key = (pos.idx, pos.off, int(p["n_dims"]), float(p["freq_base"]), float(p["freq_scale"]), t)
    if key not in lw.ropes:
        lw.ropes.append(key)
    binds = [("ref", lw.ref(n.src[0])), ("rope", lw.ropes.index(key)), ("ref", lw.new_val(n))]
    lw.simple(n, "rope", binds, RW3, {"t": t, "h": h, "d": d, "n_dims": int(p["n_dims"]),
                                      "neox": int(p["mode"] == "neox")}, _each(t * h * (d // 2)))


def op_set_rows(lw, n):
    dst, src, rows = (lw.ref(s) for s in n.src)
    if dst.kind != "arg" or not dst.contiguous:
        raise ValueError(f"SET_ROWS writes a cache argument in place, not {n.src[0].describe()}")
    lw.written_args.add(dst.idx)
    lw.refs[id(n)] = dst
    w = n.shape[1]
    t = n.src[2].shape[0]
    lw.simple(n, "set_rows", [("ref", src), ("ref", rows), ("ref", dst)], RW3,
              {"w": w, "t": t, "dst_rows": n.shape[0]}, _each(w * t))


def cont_params(shape, strides) -> dict:
    """CONT's block: the output's shape and the source's strides, as 4 axes."""
    shape = pad4(shape)
    strides = (0,) * (4 - len(strides)) + tuple(strides)
    return ({"n": shape[0] * shape[1] * shape[2] * shape[3]} | {f"d{i}": shape[i] for i in range(4)}
            | {f"st{i}": strides[i] for i in range(4)})


def op_cont(lw, n):
    a = lw.ref(n.src[0])
    lw.simple(n, "cont", [("ref", a), ("ref", lw.new_val(n))], RW2, cont_params(n.shape, a.strides or contig(a.shape)),
              _each(n.nelements))


def op_get_rows(lw, n):
    a, rows = n.src
    o = lw.new_val(n)
    rr = lw.ref(rows)
    w = a.shape[1]
    t = rows.shape[0]
    if not is_weight(a):
        lw.emit(f"GET_ROWS {n.name}", ("get_rows_f", "F32"), lambda: wgsl.get_rows_f("F32"), RW3,
                [("ref", lw.ref(a)), ("ref", rr), ("ref", o)], {"w": w, "t": t, "row0": 0, "rows": a.shape[0]},
                _each(w * t))
        return
    qt = a.dtype.name
    arg = lw.arg_of(a)
    for ci, (row0, nrows) in enumerate(lw.chunks(a)):
        binds = [("chunk", arg, ci), ("ref", rr), ("ref", o)]
        params = {"w": w, "t": t, "row0": row0, "rows": nrows}
        if qt in quant.FLOAT_TYPES:
            lw.emit(f"GET_ROWS {n.name}", ("get_rows_f", qt), lambda qt=qt: wgsl.get_rows_f(qt), RW3, binds, params,
                    _each(w * t))
        else:
            lw.emit(f"GET_ROWS {n.name}", ("get_rows_q", qt), lambda qt=qt: wgsl.get_rows_q(qt), RW3, binds,
                    params | {"gpr": w // 32, "moff": ("moff", arg, ci)}, _each(w // 8 * t))


LOWER = {"RMS_NORM": op_rms_norm, "ADD": op_add, "MUL": op_mul, "SCALE": op_scale, "UNARY": op_unary, "GLU": op_glu,
         "SOFT_MAX": op_soft_max, "FLASH_ATTN_EXT": op_flash_attn_ext, "ROPE": op_rope, "SET_ROWS": op_set_rows,
         "CONT": op_cont, "GET_ROWS": op_get_rows}
