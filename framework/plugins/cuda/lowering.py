"""The CUDA plugin's lowering: the skeleton's over the shared C kernels (framework/backend/c_kernels.py,
``Dialect``: element-wise ops, rows, rope, rows in and out, float products, attention, the fused
prologues), given this plugin's launch grid (blocks of threads), build options and block sizes, its
attention (split over the keys for few rows and heads: flash decoding) and its products by quantized
weights, chunk by chunk: the matrix-vector kernel for a few rows of x, the tiled one otherwise (on tensor
cores where kernels.tensor_cores says). Such a product writes the ADD that is its only reader as it
stores: a residual of its shape (the skeleton's Lowering.residual_add, the layers' x + f(x)) or a bias row
repeated over its rows (Qwen2's Q, K and V). program.py's kernel table adds the fused groups (fused.py)."""

from __future__ import annotations

from ...backend import ChunkArg, Ref, c_kernels, weight_words
from . import kernels
from .signatures import KERNELS


def _ceil(n: int, m: int) -> int:
    return -(-int(n) // m)


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


class CudaLowering(c_kernels.Dialect):
    signatures = KERNELS
    rwg, awg, ewg_max = kernels.RWG, kernels.AWG, kernels.EWG
    quant_x_lanes = 32       # a warp a group (kernels.cu's quant_x)

    def grid(self, n_items: int, block: int) -> tuple:
        """(blocks, threads a block): n_items threads in whole blocks."""
        return max(1, _ceil(n_items, block)), block

    def base_options(self, dev) -> dict:
        return kernels.base_options()

    def attention(self, lw, name: str, common: dict, o) -> None:
        """For few rows and heads, flash decoding: the keys in parts (of at least SPLIT_ATTN_KEYS, so that
        each warp has several keys to overlap), one block a (row, head, part), about MATVEC_MIN_BLOCKS
        blocks, then a combine; else one block a (row, head)."""
        th, s = common["T"] * common["H"], common["S"]
        if th < kernels.MATVEC_MIN_BLOCKS and s > 2 * kernels.SPLIT_ATTN_KEYS:
            nc = min(_ceil(s, kernels.SPLIT_ATTN_KEYS), _ceil(kernels.MATVEC_MIN_BLOCKS, th))
            c_kernels.split_attention(self.launch, lw, name, self.base_options(lw.dev), self.awg, nc, 32, common, o)
        else:
            super().attention(lw, name, common, o)

    # -- products by quantized weights ------------------------------------------------------------------
    def quant_product(self, lw, n):
        """A product by a quantized weight, with the residual or bias ADD that is its only reader added as it
        is stored."""
        add = lw.residual_add(n)
        if add is not None:
            return self._quant_mul_mat(lw, n, add)
        return self._quant_mul_mat(lw, n, bias_add(lw, n), bias=True)

    def _quant_mul_mat(self, lw, n, add, bias: bool = False):
        """Chunk by chunk: the matrix-vector kernel for a few rows of x, the tiled one otherwise; with `add`,
        its other operand added as the product is stored (a residual of the output's shape, or with `bias`
        a row repeated over the output's rows)."""
        a, x = n.src[0], lw.ref(n.src[1])
        o = lw.new_val(add if add is not None else n)
        plus = "+ADD" if add is not None else ""
        plus += "[bias]" if bias and add is not None else ""
        qt, (nrows, k) = a.dtype.name, a.shape
        m, gpr, arg = n.nelements // nrows, k // weight_words.GROUP, lw.arg_of(a)
        r = lw.ref(add.src[1]) if add is not None else None
        for ci, (row0, rows) in enumerate(lw.chunks(a)):
            common = {"a": ChunkArg(arg, ci), "x": x, "o": o, "N": rows, "K": k, "M": m, "gpr": gpr, "ld": nrows,
                      "col0": row0, "r": r, "has_r": int(add is not None), "r_ld": 0 if bias else nrows}
            if m <= kernels.MATVEC_MAX_ROWS:
                self._matvec(lw, n, qt, plus, common, bias)
            else:
                sh = kernels.matmul_shape(m, rows, kernels.tensor_cores(lw.dev))
                nt = kernels.matmul_threads(sh)
                tf32 = "-tf32" if sh["MM_MMA"] else ""
                self.launch(lw, f"MUL_MAT[tile-{sh['MM_BM']}x{sh['MM_BN']}{tf32}]{plus} {n.name}", "matmul_q",
                            {**self.quant_options(lw.dev, qt), **sh},
                            _ceil(m, sh["MM_BM"]) * _ceil(rows, sh["MM_BN"]) * nt, nt, **common)
        return [add] if add is not None else None

    def _matvec(self, lw, n, qt: str, plus: str, common: dict, bias: bool) -> None:
        """One chunk's matrix-vector product: the rows of x in 8 bits in one launch (kernels.takes_x8), else
        in launches whose f32 x fits in shared memory."""
        m, k, gpr, rows, nrows, r = (common[p] for p in ("M", "K", "gpr", "N", "ld", "r"))
        x8 = kernels.takes_x8(lw.dev, m)
        step = kernels.matvec_rows(gpr, m, x8)
        for m0 in range(0, m, step):
            mm = min(step, m - m0)
            sh = kernels.matvec_shape(gpr, mm, rows, x8=x8)
            blocks = _ceil(rows, sh["MV_WG"] // sh["MV_TPR"] * sh["MV_R"])
            args = {**common, "o": _rows_of(common["o"], m0, nrows), "M": mm, "x": _rows_of(common["x"], m0, k),
                    "r": _rows_of(r, m0, nrows) if r is not None and not bias else r}
            if x8:
                args["xq"] = self.quant_x(lw, args.pop("x"), m, k)
            self.launch(lw, f"MUL_MAT[matvec{'-x8' if x8 else ''}]{plus} {n.name}", "matvec_q8" if x8 else "matvec_q",
                        {**self.quant_options(lw.dev, qt), **sh}, blocks * sh["MV_WG"], sh["MV_WG"], **args)


DIALECT = CudaLowering()
launch = DIALECT.launch
