"""Lowering the ops other than MUL_MAT: one function per op, each appending its Steps to the Lowering.
Parameters go by the names of the kernel's block (wgsl.py, ``*_PARAMS``)."""

from __future__ import annotations

from ...backend import ChunkArg, c_kernels, contiguous_strides, is_weight, pad4, weight_words
from ...contract import Tensor
from .kernel_shapes import SPLIT_ATTN_BELOW, split_of
from .steps import each, emit, simple
from .wgsl import GLU_CODE, UNARY_CODE

BINARY_CODE = {"ADD": 0, "MUL": 1}


def rms_norm(lw, n: Tensor, norm: Tensor, gain: Tensor | None):
    """RMS_NORM `norm`, and if gain is given the MUL `n` by it, in one dispatch."""
    ncols = norm.shape[-1]
    nrows = norm.nelements // ncols
    gb = lw.ref(gain) if gain is not None else None
    label = "RMS_NORM+MUL" if gain is not None else "RMS_NORM"
    emit(lw, f"{label} {n.name}", ("rms_norm",), None, [lw.ref(norm.src[0]), gb, lw.new_val(n)],
         {"ncols": ncols, "nrows": nrows, "eps": float(norm.params["eps"]), "has_gain": int(gain is not None),
          "gain_len": ncols}, nrows)


def op_rms_norm(lw, n):
    """RMS_NORM, with the MUL by a gain that is its only reader where there is one (unless rms_mul is off)."""
    mul = lw.sole_reader(n, "MUL") if "rms_mul" not in lw.fusions_off else None
    if mul is not None and lw.gain_ok(n, mul.src[1]):
        rms_norm(lw, mul, n, mul.src[1])
        return [mul]
    rms_norm(lw, n, n, None)
    return None


def op_binary(lw, n):
    sa, sb = pad4(n.src[0].shape), pad4(n.src[1].shape)
    params = ({"n": n.nelements, "op": BINARY_CODE[n.op]} | {f"d{i}": sa[i] for i in range(4)}
              | {f"b{i}": sb[i] for i in range(4)})
    simple(lw, n, "binary", [lw.ref(n.src[0]), lw.ref(n.src[1]), lw.new_val(n)], params, each(n.nelements))


def op_unary(lw, n):
    """UNARY, and SCALE (the unary kernel's op 0)."""
    code, scale = (0, float(n.params["scale"])) if n.op == "SCALE" else (UNARY_CODE[n.params["op"]], 1.0)
    simple(lw, n, "unary", [lw.ref(n.src[0]), lw.new_val(n)], {"n": n.nelements, "op": code, "scale": scale},
           each(n.nelements))


def op_glu(lw, n):
    binds = [lw.ref(n.src[0]), lw.ref(n.src[1]), lw.new_val(n)]
    simple(lw, n, "glu", binds, {"n": n.nelements, "op": GLU_CODE[n.params["op"]]}, each(n.nelements))


def op_soft_max(lw, n):
    mask = lw.ref(n.src[1]) if len(n.src) > 1 else None
    s = n.shape[-1]
    rows = n.nelements // s
    t = n.shape[-2] if len(n.shape) > 1 else 1
    simple(lw, n, "soft_max", [lw.ref(n.src[0]), mask, lw.new_val(n)],
           {"ncols": s, "nrows": rows, "mask_rows": t, "has_mask": int(len(n.src) > 1),
            "scale": float(n.params["scale"])}, rows)


def op_argmax(lw, n):
    """Each row's columns in parts, a workgroup a part, then a workgroup a row combining them (the shared C
    kernels' split, c_kernels.Dialect.argmax)."""
    s, rows, nb = c_kernels.argmax_parts(n)
    part = lw.scratch((rows * nb * 3,))
    emit(lw, f"ARGMAX[parts] {n.name}", ("argmax_part",), None, [lw.ref(n.src[0]), part],
         {"ncols": s, "nrows": rows, "nb": nb, "per": -(-s // nb)}, rows * nb)
    emit(lw, f"ARGMAX {n.name}", ("argmax",), None, [part, lw.new_val(n)], {"nrows": rows, "nb": nb}, rows)


def op_flash_attn_ext(lw, n):
    q, k, v = (lw.ref(s) for s in n.src[:3])
    mask = lw.ref(n.src[3]) if len(n.src) > 3 else None
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
            nc, ch = split_of(s, t * h)
            part = lw.scratch((t * h * nc * (d + 4),))
            emit(lw, f"FLASH_ATTN_EXT[split] {n.name}", ("flash_attn_split",), None, [q, k, v, mask, part],
                 params | {"nc": nc, "chunk": ch}, t * h * nc)
            emit(lw, f"FLASH_ATTN_EXT[combine] {n.name}", ("flash_combine",), None, [part, o],
                 {"rows": t * h, "d": d, "nc": nc}, t * h)
            return
    simple(lw, n, kernel, [q, k, v, mask, o], params, t * h)


def op_rope(lw, n):
    t, h, d = n.shape
    p = n.params
    binds = [lw.ref(n.src[0]), lw.rope(n, t), lw.new_val(n)]
    simple(lw, n, "rope", binds, {"t": t, "h": h, "d": d, "n_dims": int(p["n_dims"]), "neox": int(p["mode"] == "neox")},
           each(t * h * (d // 2)))


def op_set_rows(lw, n):
    w = n.shape[1]
    t = n.src[2].shape[0]
    simple(lw, n, "set_rows", [lw.ref(n.src[1]), lw.ref(n.src[2]), lw.in_place(n)],
           {"w": w, "t": t, "dst_rows": n.shape[0]}, each(w * t))


def cont_params(shape, strides) -> dict:
    """CONT's block: the output's shape and the source's strides, as 4 axes."""
    shape = pad4(shape)
    strides = (0,) * (4 - len(strides)) + tuple(strides)
    return ({"n": shape[0] * shape[1] * shape[2] * shape[3]} | {f"d{i}": shape[i] for i in range(4)}
            | {f"st{i}": strides[i] for i in range(4)})


def op_cont(lw, n):
    a = lw.ref(n.src[0])
    simple(lw, n, "cont", [a, lw.new_val(n)], cont_params(n.shape, a.strides or contiguous_strides(a.shape)),
           each(n.nelements))


def op_get_rows(lw, n):
    a, rows = n.src
    o = lw.new_val(n)
    rr = lw.ref(rows)
    w = a.shape[1]
    t = rows.shape[0]
    if not is_weight(a):
        emit(lw, f"GET_ROWS {n.name}", ("get_rows_f", "F32"), None, [lw.ref(a), rr, o],
             {"w": w, "t": t, "row0": 0, "rows": a.shape[0]}, each(w * t))
        return
    qt = a.dtype.name
    arg = lw.arg_of(a)
    for ci, (row0, nrows) in enumerate(lw.chunks(a)):
        binds = [ChunkArg(arg, ci), rr, o]
        params = {"w": w, "t": t, "row0": row0, "rows": nrows}
        if qt in weight_words.FLOAT_TYPES:
            emit(lw, f"GET_ROWS {n.name}", ("get_rows_f", qt), None, binds, params, each(w * t))
        else:
            emit(lw, f"GET_ROWS {n.name}", ("get_rows_q", qt), None, binds,
                 params | {"gpr": w // 32, "moff": ChunkArg(arg, ci)}, each(w // 8 * t))


LOWER = {"RMS_NORM": op_rms_norm, "ADD": op_binary, "MUL": op_binary, "SCALE": op_unary, "UNARY": op_unary,
         "GLU": op_glu, "SOFT_MAX": op_soft_max, "ARGMAX": op_argmax, "FLASH_ATTN_EXT": op_flash_attn_ext,
         "ROPE": op_rope, "SET_ROWS": op_set_rows, "CONT": op_cont, "GET_ROWS": op_get_rows}
