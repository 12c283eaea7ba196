"""Lowering MUL_MAT: the cooperative matrix-vector kernel (decode on a GPU), the workgroup-memory tiled
product (prefill on a GPU) with its K split, the register-tiled product (a CPU adapter), float weights
and activations; a weight split into chunks is multiplied chunk by chunk."""

from __future__ import annotations

from ...backend import ChunkArg, Ref, contiguous_strides, is_weight, pad4, weight_words
from .kernel_shapes import MATVEC_MAX_ROWS, matmul_shape, matvec_shape, tile_for
from .lower_ops import cont_params
from .steps import each, emit


def op_mul_mat(lw, n):
    a, b = n.src
    o = lw.new_val(n)
    br = lw.ref(b)
    if is_weight(a) and a.dtype.name in weight_words.QUANT_TYPES:
        _quant_mul_mat(lw, n, a, br, o)
        return
    sa, sb = pad4(a.shape), pad4(b.shape)
    nrows, k = a.shape[-2], a.shape[-1]
    m = b.shape[-2]
    if is_weight(a):
        arg = lw.arg_of(a)
        parts = [(ChunkArg(arg, ci), row0, rows) for ci, (row0, rows) in enumerate(lw.chunks(a))]
        elem = a.dtype.name
    else:
        parts = [(lw.ref(a), 0, nrows)]
        elem = "F32"
    for bind, row0, rows in parts:
        total = sb[0] * sb[1] * m * rows
        emit(lw, f"MUL_MAT {n.name}", ("mul_mat_f", elem), None, [bind, br, o],
             {"n": nrows, "m": m, "k": k, "a0": sa[0], "a1": sa[1], "b0": sb[0], "b1": sb[1], "row0": row0,
              "rows": rows, "ld": nrows}, each(total))


def _quant_mul_mat(lw, n, a, br, o):
    # x is read as vec4: its element offset must be a multiple of 4
    if br.kind == "arg":
        lw.align4.add(br.idx)
        if br.off % 4:
            raise ValueError(f"MUL_MAT operand {n.src[1].describe()} is a view at an odd offset")
    elif br.off % 4:
        moved = lw.scratch(br.shape)
        emit(lw, f"CONT (align) {n.name}", ("cont",), None, [br, moved],
             cont_params(pad4(br.shape), contiguous_strides(pad4(br.shape))), each(br.size))
        br = moved
    qt = a.dtype.name
    nrows, k = a.shape
    m = b_rows = n.nelements // nrows
    gpr = k // 32
    arg = lw.arg_of(a)
    for ci, (row0, rows) in enumerate(lw.chunks(a)):
        params = {"n": rows, "k": k, "m": b_rows, "gpr": gpr, "moff": ChunkArg(arg, ci), "ld": nrows, "col0": row0}
        binds = [ChunkArg(arg, ci), br, o]
        if m <= MATVEC_MAX_ROWS and not lw.dev.cpu_adapter:
            mm = next(x for x in (1, 2, 4, 8) if x >= m)
            sh = matvec_shape(lw.dev, gpr, mm, rows, rows * weight_words.row_bytes(qt, k))
            if sh["x8"]:        # x in 8 bits, 12 words a 32-element group
                binds[1] = _x_form(lw, br, b_rows, k, "quant_x", 12)
            key = ("matvec", qt, sh["tpr"], mm, sh["r"], sh["sg"], sh["wg"], sh["x8"])
            emit(lw, f"MUL_MAT[matvec] {n.name}", key, None, binds, params,
                 -(-rows // (sh["wg"] // sh["tpr"] * sh["r"])))
        elif m > MATVEC_MAX_ROWS and not (sh := matmul_shape(lw.dev, m, rows, gpr))["reg"]:
            _tiled_mul_mat(lw, n, qt, sh, m, rows, binds, params)
        else:
            bm, bn = tile_for(m, rows, not lw.dev.cpu_adapter)
            nbn = -(-rows // bn)
            emit(lw, f"MUL_MAT[tiled-{bm}x{bn}] {n.name}", ("matmul_reg", qt, bm, bn), None, binds,
                 params | {"nbn": nbn}, -(-(nbn * -(-m // bm)) // 64))


def _tiled_mul_mat(lw, n, qt, sh, m, rows, binds, params):
    """The workgroup-memory tiled product of one chunk; split over K, its parts go to a scratch value
    of `split` planes of (m, rows), summed into the output by a second dispatch."""
    bm, bn, kg, split, f16 = sh["bm"], sh["bn"], sh["kg"], sh["split"], sh["f16"]
    nbn = -(-rows // bn)
    rw = (False, False, True)
    if f16:       # x scaled per group, in f16 (HALF_X); bound again for its f32 scales
        xh = _x_form(lw, binds[1], m, params["k"], "half_x", 20)
        binds, rw = [binds[0], xh, binds[2], xh], rw + (False,)
    params = params | {"nbn": nbn, "gps": sh["gps"], "splits": split, "plane": 0}
    out, ld, col0 = binds[2], params["ld"], params["col0"]
    if split > 1:
        part = lw.scratch((split, m, rows))
        binds = [binds[0], binds[1], part] + binds[3:]
        params |= {"ld": rows, "col0": 0, "plane": m * rows}
    emit(lw, f"MUL_MAT[tile-{bm}x{bn}{f'/k{split}' if split > 1 else ''}{'/f16' if f16 else ''}] {n.name}",
         ("matmul_tile", qt, bm, bn, kg, f16), rw, binds, params, split * nbn * -(-m // bm))
    if split > 1:
        emit(lw, f"MUL_MAT[split-sum] {n.name}", ("matmul_split_sum",), None, [part, out],
             {"n": rows, "m": m, "splits": split, "plane": m * rows, "ld": ld, "col0": col0}, each(m * rows))


def _x_form(lw, br: Ref, m: int, k: int, kernel: str, words: int) -> Ref:
    """x (m rows of k) in another form, `words` words a 32-element group (QUANT_X: 8 bits, HALF_X:
    f16 scaled per group); made once per computed value (Q, K and V of a layer share it); an
    argument, which a step may write, each time."""
    key = (br.idx, br.off, m, k, kernel)
    if br.kind == "val" and key in lw.memo:
        return lw.memo[key]
    groups = m * k // 32
    xq = lw.scratch((groups, words))
    emit(lw, kernel.upper(), (kernel,), None, [br, xq], {"n": groups}, each(groups))
    if br.kind == "val":
        lw.memo[key] = xq
    return xq


LOWER = {"MUL_MAT": op_mul_mat}
