"""The OpenCL plugin's lowering: the skeleton's over the shared C kernels (framework/backend/c_kernels.py,
``Dialect``), given this plugin's launch grid (global and local sizes), build options and work-groups,
its attention (sequential with float4 reads on a CPU device; on a GPU split over the keys for few rows)
and its products by quantized weights, chunk by chunk: the register-tiled kernel (CPU devices), the
matrix-vector kernels (a few rows of x; x in 8 bits for large weights, QUANT_X) or the tiled product,
each writing the residual ADD that is the product's only reader as it stores. program.py's kernel
table adds the fused groups (fused.py)."""

from __future__ import annotations

import numpy as np

from ...backend import ChunkArg, c_kernels, weight_words
from . import kernels
from .signatures import KERNELS

GROUP = weight_words.GROUP


def _ceil(n: int, m: int) -> int:
    return -(-int(n) // m)


class ClLowering(c_kernels.Dialect):
    signatures = KERNELS
    rwg, awg, ewg_max = kernels.RWG, kernels.AWG, kernels.EWG

    def grid(self, n_items: int, lsize: int | None) -> tuple:
        """(global size, local size): n_items rounded up to whole work-groups."""
        return (max(lsize, _ceil(n_items, lsize) * lsize) if lsize else int(n_items)), lsize

    def base_options(self, dev) -> dict:
        return kernels.base_options(dev)

    def quant_options(self, dev, dtype: str) -> dict:
        return {**super().quant_options(dev, dtype), **({"HAS_DOT4": 1} if dev.int_dot else {})}

    def ewg(self, dev) -> int:
        return min(kernels.EWG, dev.max_wg)

    def angles(self, dev, inv):
        return inv if dev.fp64 else inv.astype(np.float32)

    def attention(self, lw, name: str, common: dict, o) -> None:
        """Sequential on a CPU device (float4 reads of whole heads); on a GPU, for few rows and heads, flash
        decoding: the keys in parts of whole blocks, one work-group per (row, head, part), then a combine."""
        dev, t, h, s = lw.dev, common["T"], common["H"], common["S"]
        if dev.is_cpu and common["D"] % 4 == 0:
            self.launch(lw, f"FLASH_ATTN_EXT[seq] {name}", "flash_attn_seq", self.base_options(dev), t * h,
                        min(8, self.ewg(dev)), o=o, **common)
        elif not dev.is_cpu and t * h < kernels.SPLIT_ATTN_BELOW and s > self.awg:
            nc = min(_ceil(s, self.awg), max(2, kernels.SPLIT_ATTN_BELOW * 2 // (t * h)))
            c_kernels.split_attention(self.launch, lw, name, self.base_options(dev), self.awg, nc, self.awg, common, o)
        else:
            super().attention(lw, name, common, o)

    # -- products by quantized weights ------------------------------------------------------------------
    def quant_product(self, lw, n):
        """A product by a quantized weight, chunk by chunk; with the residual ADD that is its only reader
        added as it is stored."""
        add = lw.residual_add(n)
        a, x = n.src[0], lw.ref(n.src[1])
        o = lw.new_val(add if add is not None else n)
        plus = "+ADD" if add is not None else ""
        qt, (nrows, k) = a.dtype.name, a.shape
        m, arg = n.nelements // nrows, lw.arg_of(a)
        for ci, (row0, rows) in enumerate(lw.chunks(a)):
            common = {"a": ChunkArg(arg, ci), "o": o, "N": rows, "K": k, "M": m, "gpr": k // GROUP, "ld": nrows,
                      "col0": row0, "r": lw.ref(add.src[1]) if add is not None else None, "has_r": int(add is not None)}
            reg = kernels.reg_shape(lw.dev, m)
            if reg is not None:
                opts = dict(self.quant_options(lw.dev, qt), MR_TM=reg["tm"], MR_TN=reg["tn"])
                self.launch(lw, f"MUL_MAT[reg-{reg['tm']}x{reg['tn']}]{plus} {n.name}", "matmul_reg", opts,
                            _ceil(m, reg["tm"]) * _ceil(rows, reg["tn"]), reg["wg"], x=x, **common)
            elif m <= kernels.MATVEC_MAX_ROWS:
                self._matvec(lw, n, qt, x, m, k, rows, plus, common)
            else:
                sh = kernels.matmul_shape(lw.dev, m, rows)
                nt = (sh["bm"] // sh["tm"]) * (sh["bn"] // sh["tn"])
                opts = dict(self.quant_options(lw.dev, qt), MM_BM=sh["bm"], MM_BN=sh["bn"], MM_TM=sh["tm"],
                            MM_TN=sh["tn"])
                self.launch(lw, f"MUL_MAT[tile-{sh['bm']}x{sh['bn']}]{plus} {n.name}", "matmul_q", opts,
                            _ceil(m, sh["bm"]) * _ceil(rows, sh["bn"]) * nt, nt, x=x, **common)
        return [add] if add is not None else None

    def _matvec(self, lw, n, qt, x, m, k, rows, plus, common):
        """One chunk's matrix-vector product (kernels.matvec_shape says which kernel and shape)."""
        sh = kernels.matvec_shape(lw.dev, k // GROUP, m, rows, rows * weight_words.row_bytes(qt, k))
        opts = dict(self.quant_options(lw.dev, qt), MV_V=sh["v"], MV_WG=sh["wg"], MV_TPR=sh["tpr"],
                    MV_R=sh["r"], MV_MM=sh["mm"], MV_X8=sh["x8"], MV_XL=sh["xl"], MV_XG=sh["xg"],
                    PTX_DP4A=sh["dp4a"] * sh["x8"], PTX_SHFL=sh["shfl"])
        if opts["PTX_DP4A"] or opts["PTX_SHFL"]:
            opts.update(kernels.ptx_options(lw.dev))
        items = _ceil(rows, sh["wg"] // sh["tpr"] * sh["r"]) * sh["wg"]
        tag = f"MUL_MAT[matvec{'-x8' if sh['x8'] else ''}{'-v0' if not sh['v'] else ''}]{plus} {n.name}"
        if sh["x8"]:
            self.launch(lw, tag, "matvec_q8", opts, items, sh["wg"], xq=self.quant_x(lw, x, m, k), **common)
        else:
            self.launch(lw, tag, "matvec_q", opts, items, sh["wg"], x=x, **common)

DIALECT = ClLowering()
launch = DIALECT.launch
