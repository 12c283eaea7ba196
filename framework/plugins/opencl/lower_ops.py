"""The OpenCL plugin's kernels for each op (its kernel table's functions, which the skeleton's lowering
calls node by node: framework/backend/lowering.py). Each appends its launches (launches.py) and returns
the readers it took into its own kernel, which make none:

* RMS_NORM followed by its only reader, a MUL by a gain vector, is one launch;
* a quantized product or such a norm whose only reader is an ADD of a residual of the same shape (the
  layers' x + f(x)) writes the sum itself, so the ADD costs no launch;
* a ROPE whose only reader is a SCALE (Gemma's query scaling) is one launch with it.
"""

from __future__ import annotations

import numpy as np

from ...backend import ChunkArg, Ref, c_kernels, is_weight
from ...contract import Tensor, reference
from . import kernels, layout
from .launches import each, ewg, float_options, launch


def _ceil(n: int, m: int) -> int:
    return -(-int(n) // m)


# -- element-wise and rows --------------------------------------------------------------------------
def _rms_norm(lw, n: Tensor, norm: Tensor, gain: Tensor | None, add: Tensor | None = None):
    a = lw.ref(norm.src[0])
    o = lw.new_val(add if add is not None else n)
    ncols = norm.shape[-1]
    nrows = norm.nelements // ncols
    label = "RMS_NORM" + ("+MUL" if gain is not None else "") + ("+ADD" if add is not None else "")
    launch(lw, f"{label} {n.name}", "rms_norm", kernels.base_options(lw.dev), nrows * kernels.RWG, kernels.RWG,
           a=a, gain=lw.ref(gain) if gain is not None else None,
           r=lw.ref(add.src[1]) if add is not None else None, o=o, ncols=ncols,
           eps=float(norm.params["eps"]), has_gain=int(gain is not None), glen=ncols,
           has_r=int(add is not None))


def op_rms_norm(lw, n):
    mul = lw.sole_reader(n, "MUL") if "rms_mul" not in lw.fusions_off else None
    if mul is not None and lw.gain_ok(n, mul.src[1]):
        add = lw.residual_add(mul)
        _rms_norm(lw, mul, n, mul.src[1], add)
        return [t for t in (mul, add) if t is not None]
    _rms_norm(lw, n, n, None)
    return None


def op_soft_max(lw, n):
    s = n.shape[-1]
    rows = n.nelements // s
    masked = len(n.src) > 1
    launch(lw, f"SOFT_MAX {n.name}", "soft_max", kernels.base_options(lw.dev), rows * kernels.RWG, kernels.RWG,
           a=lw.ref(n.src[0]), mk=lw.ref(n.src[1]) if masked else None, o=lw.new_val(n), ncols=s,
           t=n.shape[-2] if len(n.shape) > 1 else 1, has_mask=int(masked), scale=float(n.params["scale"]))


# -- attention and rope --------------------------------------------------------------------------------
def op_flash_attn_ext(lw, n):
    q, k, v = (lw.ref(s) for s in n.src[:3])
    masked = len(n.src) > 3
    mk = lw.ref(n.src[3]) if masked else None
    o = lw.new_val(n)
    t, h, d = n.src[0].shape
    s, hkv, _ = n.src[1].shape
    common = dict(q=q, k=k, v=v, mk=mk, T=t, H=h, Hkv=hkv, D=d, S=s, has_mask=int(masked),
                  scale=float(n.params["scale"]))
    opts, awg = kernels.base_options(lw.dev), kernels.AWG
    if lw.dev.is_cpu and d % 4 == 0:
        launch(lw, f"FLASH_ATTN_EXT[seq] {n.name}", "flash_attn_seq", opts, t * h, min(8, ewg(lw.dev)), o=o, **common)
        return
    if not lw.dev.is_cpu and t * h < kernels.SPLIT_ATTN_BELOW and s > awg:
        # flash decoding: the keys in parts, one work-group per (row, head, part), then a combine
        nc = min(_ceil(s, awg), max(2, kernels.SPLIT_ATTN_BELOW * 2 // (t * h)))   # parts of whole blocks
        return c_kernels.split_attention(launch, lw, n.name, opts, awg, nc, awg, common, o)
    launch(lw, f"FLASH_ATTN_EXT {n.name}", "flash_attn", opts, t * h * awg, awg, o=o, **common)


def op_rope(lw, n):
    """ROPE, times the SCALE that is its only reader where there is one (one launch for both)."""
    scale = lw.sole_reader(n, "SCALE")
    t, h, d = n.shape
    p = n.params
    n_dims = int(p["n_dims"])
    # the reference's frequencies (float64), in the kernel's angle type
    inv = reference.rope_inv_freq(n_dims, float(p["freq_base"]), float(p["freq_scale"]))
    factors = lw.ref(n.src[2]) if len(n.src) > 2 else None
    launch(lw, f"ROPE{'+SCALE' if scale is not None else ''} {n.name}", "rope", kernels.base_options(lw.dev),
           t * h * (d // 2), ewg(lw.dev), a=lw.ref(n.src[0]), pos=lw.ref(n.src[1]),
           inv=inv if lw.dev.fp64 else inv.astype(np.float32), ff=factors,
           o=lw.new_val(scale if scale is not None else n), T=t, H=h, D=d, n_dims=n_dims,
           neox=c_kernels.ROPE_NEOX[p["mode"]], has_ff=int(factors is not None),
           s=float(scale.params["scale"]) if scale is not None else 1.0)
    return [scale] if scale is not None else None


# -- memory ----------------------------------------------------------------------------------------------
def op_set_rows(lw, n):
    src, rows = lw.ref(n.src[1]), lw.ref(n.src[2])
    dst = lw.in_place(n)
    w, t = n.shape[1], n.src[2].shape[0]
    each(lw, n, "set_rows", w * t, s=src, rows=rows, dst=dst, W=w, T=t, nrows=n.shape[0])


def op_get_rows(lw, n):
    a, rows = n.src
    o = lw.new_val(n)
    w, t = a.shape[1], rows.shape[0]
    rr = lw.ref(rows)
    if not is_weight(a):
        launch(lw, f"GET_ROWS {n.name}", "get_rows_f", kernels.base_options(lw.dev), w * t, ewg(lw.dev),
               a=lw.ref(a), rows=rr, o=o, W=w, T=t, row0=0, nrows=a.shape[0])
        return
    qt, arg = a.dtype.name, lw.arg_of(a)
    for ci, (row0, nrows) in enumerate(lw.chunks(a)):
        if qt in layout.FLOAT_TYPES:
            launch(lw, f"GET_ROWS {n.name}", "get_rows_f", float_options(lw.dev, qt), w * t, ewg(lw.dev),
                   a=ChunkArg(arg, ci), rows=rr, o=o, W=w, T=t, row0=row0, nrows=nrows)
        else:
            launch(lw, f"GET_ROWS {n.name}", "get_rows_q", kernels.quant_options(lw.dev, qt), w // 8 * t,
                   ewg(lw.dev), a=ChunkArg(arg, ci), rows=rr, o=o, W=w, T=t, row0=row0, nrows=nrows,
                   gpr=w // layout.GROUP)


LOWER = {**c_kernels.elementwise(each), "RMS_NORM": op_rms_norm, "SOFT_MAX": op_soft_max,
         "FLASH_ATTN_EXT": op_flash_attn_ext, "ROPE": op_rope, "SET_ROWS": op_set_rows,
         "GET_ROWS": op_get_rows}
__all__ = ["LOWER", "Ref"]
