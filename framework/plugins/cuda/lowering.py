"""The CUDA plugin's kernel table, which the skeleton's lowering (framework/backend/lowering.py) asks
for every node: each op's function appends its launches (launches.py's ``launch``: arguments by name,
as signatures.py lists them) and returns the readers it took into its own kernel, which make none:

* RMS_NORM followed by its only reader, a MUL by a gain vector, is one launch;
* a quantized product or such a norm whose only reader is an ADD of a residual of the same shape (the
  layers' x + f(x)) writes the sum itself, so the ADD costs no launch;
* a ROPE whose only reader is a SCALE (Gemma's query scaling) is one launch with it.

The core's fusion groups (framework/core/graph/fusion.py) for decode's products are fused.py's: a
group's nodes make none here."""

from __future__ import annotations

from ...backend import ChunkArg, KernelTable, Ref, c_kernels, is_weight, pad4, weight_words
from ...contract import reference
from . import fused, kernels
from .attention import attention
from .launches import each, launch


def _ceil(n: int, m: int) -> int:
    return -(-int(n) // m)


# -- element-wise and rows --------------------------------------------------------------------------
def op_rms_norm(lw, n):
    mul = lw.sole_reader(n, "MUL")
    gain = mul.src[1] if mul is not None and lw.gain_ok(n, mul.src[1]) else None
    out = mul if gain is not None else n
    add = lw.residual_add(out) if gain is not None else None
    ncols = n.shape[-1]
    label = "RMS_NORM" + ("+MUL" if gain is not None else "") + ("+ADD" if add is not None else "")
    launch(lw, f"{label} {n.name}", "rms_norm", kernels.base_options(), n.nelements // ncols * kernels.RWG,
           kernels.RWG, a=lw.ref(n.src[0]), gain=lw.ref(gain) if gain is not None else None,
           r=lw.ref(add.src[1]) if add is not None else None, o=lw.new_val(add if add is not None else out),
           ncols=ncols, eps=float(n.params["eps"]), has_gain=int(gain is not None), glen=ncols,
           has_r=int(add is not None))
    return [t for t in (mul if gain is not None else None, add) if t is not None]


def op_soft_max(lw, n):
    s = n.shape[-1]
    masked = len(n.src) > 1
    launch(lw, f"SOFT_MAX {n.name}", "soft_max", kernels.base_options(), n.nelements // s * kernels.RWG, kernels.RWG,
           a=lw.ref(n.src[0]), mk=lw.ref(n.src[1]) if masked else None, o=lw.new_val(n), ncols=s,
           t=n.shape[-2] if len(n.shape) > 1 else 1, has_mask=int(masked), scale=float(n.params["scale"]))


# -- attention and rope --------------------------------------------------------------------------------
def op_flash_attn_ext(lw, n):
    t, h, d = n.src[0].shape
    s, hkv, _ = n.src[1].shape
    q, k, v = (lw.ref(x) for x in n.src[:3])
    attention(lw, n.name, q, k, v, lw.ref(n.src[3]) if len(n.src) > 3 else None, lw.new_val(n), t, h, hkv, d, s,
              float(n.params["scale"]))


def op_rope(lw, n):
    """ROPE, times the SCALE that is its only reader where there is one (one launch for both)."""
    scale = lw.sole_reader(n, "SCALE")
    t, h, d = n.shape
    p = n.params
    n_dims = int(p["n_dims"])
    factors = lw.ref(n.src[2]) if len(n.src) > 2 else None
    launch(lw, f"ROPE{'+SCALE' if scale is not None else ''} {n.name}", "rope", kernels.base_options(),
           t * h * (d // 2), kernels.EWG, a=lw.ref(n.src[0]), pos=lw.ref(n.src[1]),
           inv=reference.rope_inv_freq(n_dims, float(p["freq_base"]), float(p["freq_scale"])), ff=factors,
           o=lw.new_val(scale if scale is not None else n), T=t, H=h, D=d, n_dims=n_dims,
           neox=c_kernels.ROPE_NEOX[p["mode"]], has_ff=int(factors is not None),
           s=float(scale.params["scale"]) if scale is not None else 1.0)
    return [scale] if scale is not None else None


# -- memory ----------------------------------------------------------------------------------------------
def op_set_rows(lw, n):
    w, t = n.shape[1], n.src[2].shape[0]
    each(lw, n, "set_rows", w * t, s=lw.ref(n.src[1]), rows=lw.ref(n.src[2]), dst=lw.in_place(n), W=w, T=t,
         nrows=n.shape[0])


def op_get_rows(lw, n):
    a, rows = n.src
    o, rr = lw.new_val(n), lw.ref(rows)
    w, t = a.shape[1], rows.shape[0]
    if not is_weight(a):
        launch(lw, f"GET_ROWS {n.name}", "get_rows_f", kernels.base_options(), w * t, kernels.EWG,
               a=lw.ref(a), rows=rr, o=o, W=w, T=t, row0=0, nrows=a.shape[0])
        return
    qt, arg = a.dtype.name, lw.arg_of(a)
    for ci, (row0, nrows) in enumerate(lw.chunks(a)):
        common = dict(a=ChunkArg(arg, ci), rows=rr, o=o, W=w, T=t, row0=row0, nrows=nrows)
        if qt in weight_words.FLOAT_TYPES:
            launch(lw, f"GET_ROWS {n.name}", "get_rows_f", kernels.float_options(qt), w * t, kernels.EWG, **common)
        else:
            launch(lw, f"GET_ROWS {n.name}", "get_rows_q", kernels.quant_options(qt), w // 8 * t, kernels.EWG,
                   gpr=w // weight_words.GROUP, **common)


# -- products --------------------------------------------------------------------------------------------
def op_mul_mat(lw, n):
    a, b = n.src
    if is_weight(a) and a.dtype.name in weight_words.QUANT_TYPES:
        add = lw.residual_add(n)
        return _quant_mul_mat(lw, n, add) if add is not None else _quant_mul_mat(lw, n, bias_add(lw, n), bias=True)
    o = lw.new_val(n)
    sa, sb = pad4(a.shape), pad4(b.shape)
    nrows, k, m = a.shape[-2], a.shape[-1], b.shape[-2]
    if is_weight(a):
        arg = lw.arg_of(a)
        parts = [(ChunkArg(arg, ci), row0, rows) for ci, (row0, rows) in enumerate(lw.chunks(a))]
        opts = kernels.float_options(a.dtype.name)
    else:
        parts, opts = [(lw.ref(a), 0, nrows)], kernels.base_options()
    for bind, row0, rows in parts:
        launch(lw, f"MUL_MAT {n.name}", "mul_mat_f", opts, sb[0] * sb[1] * m * rows, kernels.EWG,
               a=bind, b=lw.ref(b), o=o, N=nrows, M=m, K=k, A0=sa[0], A1=sa[1], B0=sb[0], B1=sb[1],
               row0=row0, rows=rows, ld=nrows)
    return None


def _rows_of(ref, m0: int, width: int):
    """The rows from m0 on of a contiguous (rows, width) value or argument."""
    return ref if m0 == 0 else Ref(ref.kind, ref.idx, ref.off + m0 * width, ref.shape)


def bias_add(lw, n):
    """The ADD that is n's only reader and adds a bias to it (a row of n's width repeated over its rows, as
    Qwen2's Q, K and V products have): the kernel adds it as it stores, one launch fewer a product."""
    add = lw.sole_reader(n, "ADD")
    if add is None or id(add) in lw.fusion.absorbed or add.src[0] is not n or add.src[1] is n:
        return None
    return add if tuple(add.shape) == tuple(n.shape) and lw.gain_ok(n, add.src[1]) else None


def _quant_mul_mat(lw, n, add, bias: bool = False):
    """A product by a quantized weight, chunk by chunk: the matrix-vector kernel for a few rows of x, the
    tiled one otherwise; with `add`, its other operand added as the product is stored (a residual of the
    output's shape, or with `bias` a row repeated over the output's rows)."""
    a, x = n.src[0], lw.ref(n.src[1])
    o = lw.new_val(add if add is not None else n)
    plus = "+ADD" if add is not None else ""
    plus += "[bias]" if bias and add is not None else ""
    qt = a.dtype.name
    nrows, k = a.shape
    m, gpr, arg = n.nelements // nrows, k // weight_words.GROUP, lw.arg_of(a)
    r = lw.ref(add.src[1]) if add is not None else None
    for ci, (row0, rows) in enumerate(lw.chunks(a)):
        common = {"a": ChunkArg(arg, ci), "x": x, "o": o, "N": rows, "K": k, "M": m, "gpr": gpr, "ld": nrows,
                  "col0": row0, "r": r, "has_r": int(add is not None), "r_ld": 0 if bias else nrows}
        if m <= kernels.MATVEC_MAX_ROWS:
            step = kernels.matvec_rows(gpr, m)
            for m0 in range(0, m, step):        # rows of x in launches whose x fits in shared memory
                mm = min(step, m - m0)
                sh = kernels.matvec_shape(gpr, mm, rows)
                blocks = _ceil(rows, sh["MV_WG"] // sh["MV_TPR"] * sh["MV_R"])
                part = {"x": _rows_of(x, m0, k), "o": _rows_of(o, m0, nrows), "M": mm,
                        "r": _rows_of(r, m0, nrows) if r is not None and not bias else r}
                launch(lw, f"MUL_MAT[matvec]{plus} {n.name}", "matvec_q", {**kernels.quant_options(qt), **sh},
                       blocks * sh["MV_WG"], sh["MV_WG"], **{**common, **part})
        else:
            sh = kernels.matmul_shape(m, rows, kernels.tensor_cores(lw.dev))
            nt = kernels.matmul_threads(sh)
            tiles = _ceil(m, sh["MM_BM"]) * _ceil(rows, sh["MM_BN"])
            tf32 = "-tf32" if sh["MM_MMA"] else ""
            launch(lw, f"MUL_MAT[tile-{sh['MM_BM']}x{sh['MM_BN']}{tf32}]{plus} {n.name}", "matmul_q",
                   {**kernels.quant_options(qt), **sh}, tiles * nt, nt, **common)
    return [add] if add is not None else None


TABLE = KernelTable({**c_kernels.elementwise(each), "RMS_NORM": op_rms_norm, "SOFT_MAX": op_soft_max,
                     "FLASH_ATTN_EXT": op_flash_attn_ext,
                     "ROPE": op_rope, "SET_ROWS": op_set_rows, "GET_ROWS": op_get_rows,
                     "MUL_MAT": op_mul_mat}, fused.lower_group, fused.plan)
