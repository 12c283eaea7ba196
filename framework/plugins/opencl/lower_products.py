"""The OpenCL plugin's MUL_MAT: float weights and activations (mul_mat_f); a quantized weight, chunk by
chunk, by the register-tiled kernel (CPU devices), the matrix-vector kernels (a few rows of x; x in 8
bits for large weights, QUANT_X) or the tiled product, each writing the residual ADD that is the
product's only reader as it stores (the skeleton's Lowering.residual_add)."""

from __future__ import annotations

from ...backend import ChunkArg, Ref, is_weight, pad4
from . import kernels, layout
from .launches import ewg, float_options, launch


def op_mul_mat(lw, n):
    a, b = n.src
    if is_weight(a) and a.dtype.name in layout.QUANT_TYPES:
        add = lw.residual_add(n)
        _quant_mul_mat(lw, n, add)
        return [add] if add is not None else None
    o = lw.new_val(n)
    sa, sb = pad4(a.shape), pad4(b.shape)
    nrows, k, m = a.shape[-2], a.shape[-1], b.shape[-2]
    if is_weight(a):
        arg = lw.arg_of(a)
        parts = [(ChunkArg(arg, ci), row0, rows) for ci, (row0, rows) in enumerate(lw.chunks(a))]
        opts = float_options(lw.dev, a.dtype.name)
    else:
        parts, opts = [(lw.ref(a), 0, nrows)], kernels.base_options(lw.dev)
    for bind, row0, rows in parts:
        launch(lw, f"MUL_MAT {n.name}", "mul_mat_f", opts, sb[0] * sb[1] * m * rows, ewg(lw.dev),
               a=bind, b=lw.ref(b), o=o, N=nrows, M=m, K=k, A0=sa[0], A1=sa[1], B0=sb[0], B1=sb[1],
               row0=row0, rows=rows, ld=nrows)
    return None


def _quant_mul_mat(lw, n, add):
    """A product by a quantized weight, chunk by chunk; with `add`, the residual added as it is stored."""
    a, x = n.src[0], lw.ref(n.src[1])
    o = lw.new_val(add if add is not None else n)
    res = {"r": lw.ref(add.src[1]) if add is not None else None, "has_r": int(add is not None)}
    plus = "+ADD" if add is not None else ""
    qt = a.dtype.name
    nrows, k = a.shape
    m = n.nelements // nrows
    gpr = k // layout.GROUP
    arg = lw.arg_of(a)
    for ci, (row0, rows) in enumerate(lw.chunks(a)):
        common = {"a": ChunkArg(arg, ci), "o": o, "N": rows, "K": k, "M": m, "gpr": gpr, "ld": nrows, "col0": row0,
                  **res}
        reg = kernels.reg_shape(lw.dev, m)
        if reg is not None:
            opts = dict(kernels.quant_options(lw.dev, qt), MR_TM=reg["tm"], MR_TN=reg["tn"])
            items = -(-m // reg["tm"]) * -(-rows // reg["tn"])
            launch(lw, f"MUL_MAT[reg-{reg['tm']}x{reg['tn']}]{plus} {n.name}", "matmul_reg", opts, items,
                   reg["wg"], x=x, **common)
        elif m <= kernels.MATVEC_MAX_ROWS:
            _matvec(lw, n, qt, x, m, k, rows, plus, common)
        else:
            sh = kernels.matmul_shape(lw.dev, m, rows)
            nt = (sh["bm"] // sh["tm"]) * (sh["bn"] // sh["tn"])
            opts = dict(kernels.quant_options(lw.dev, qt), MM_BM=sh["bm"], MM_BN=sh["bn"], MM_TM=sh["tm"],
                        MM_TN=sh["tn"])
            tiles = -(-m // sh["bm"]) * -(-rows // sh["bn"])
            launch(lw, f"MUL_MAT[tile-{sh['bm']}x{sh['bn']}]{plus} {n.name}", "matmul_q", opts, tiles * nt, nt, x=x,
                   **common)


def _matvec(lw, n, qt, x, m, k, rows, plus, common):
    """One chunk's matrix-vector product (kernels.matvec_shape says which kernel and shape)."""
    sh = kernels.matvec_shape(lw.dev, k // layout.GROUP, m, rows, rows * layout.row_bytes(qt, k))
    opts = dict(kernels.quant_options(lw.dev, qt), MV_V=sh["v"], MV_WG=sh["wg"], MV_TPR=sh["tpr"],
                MV_R=sh["r"], MV_MM=sh["mm"], MV_X8=sh["x8"], MV_XL=sh["xl"], MV_XG=sh["xg"],
                PTX_DP4A=sh["dp4a"] * sh["x8"], PTX_SHFL=sh["shfl"])
    if opts["PTX_DP4A"] or opts["PTX_SHFL"]:
        opts.update(kernels.ptx_options(lw.dev))
    groups = -(-rows // (sh["wg"] // sh["tpr"] * sh["r"]))
    tag = f"matvec{'-x8' if sh['x8'] else ''}{'-v0' if not sh['v'] else ''}"
    if sh["x8"]:
        launch(lw, f"MUL_MAT[{tag}]{plus} {n.name}", "matvec_q8", opts, groups * sh["wg"], sh["wg"],
               xq=_quant_x(lw, x, m, k), **common)
    else:
        launch(lw, f"MUL_MAT[{tag}]{plus} {n.name}", "matvec_q", opts, groups * sh["wg"], sh["wg"], x=x,
               **common)


def _quant_x(lw, x: Ref, m: int, k: int) -> Ref:
    """x (m rows of k) in 8 bits, 12 words a 32-element group; made once per computed value (Q, K and
    V of a layer share it), an argument (which a launch may write) each time."""
    key = ("quant_x", x.kind, x.idx, x.off, m, k)
    if x.kind == "val" and key in lw.memo:
        return lw.memo[key]
    groups = m * k // layout.GROUP
    xq = lw.scratch((groups * 12,))     # at element 0 of its buffer: matvec_q8 reads it as uint4s
    launch(lw, "QUANT_X", "quant_x", kernels.base_options(lw.dev), groups, ewg(lw.dev), x=x, xq=xq, groups=groups)
    if x.kind == "val":
        lw.memo[key] = xq
    return xq


LOWER = {"MUL_MAT": op_mul_mat}
