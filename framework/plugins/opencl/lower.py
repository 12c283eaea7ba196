"""Lowering a fragment to a list of kernel launches (``Launch``): which kernel of which build, its
global and local sizes, and its arguments by name (signatures.py). Nothing here touches OpenCL:
program.py turns launches into kernel objects and runs them.

Values: every tensor of the fragment is a ``Ref``: an argument of the fragment (weight, input, cache,
a value from another fragment) or a value computed here, plus an element offset, a shape and strides.
View ops (VIEW, RESHAPE, PERMUTE, TRANSPOSE) only make new Refs.

Fusions: for decode on a GPU, the groups of nodes the core's matcher finds (fused.py) are one kernel
each, emitted at the group's last node. Elsewhere: RMS_NORM followed by its only reader, a MUL by a
gain vector, is one launch; a quantized product or such a norm whose only reader is an ADD of a
residual of the same shape (the layers' x + f(x)) writes the sum itself, so the ADD costs no launch; a
ROPE whose only reader is a SCALE (Gemma's query scaling) is one launch with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...contract import Ref, Tensor, contiguous_strides, ops, reference
from . import fused as fused_kernels
from . import kernels, layout
from .coverage import BINARY_CODE, GLU_ACTIVATION, ROPE_NEOX, UNARY_CODE, is_weight


@dataclass(frozen=True)
class ChunkArg:
    """Chunk `chunk` of the weight that is argument `arg`."""
    arg: int
    chunk: int


@dataclass
class Launch:
    name: str                    # "OP[variant] node": what the profile and the tests see
    kernel: str
    options: dict
    gsize: int
    lsize: int | None
    args: dict                   # parameter name -> Ref | ChunkArg | None (no tensor) | number | table (ndarray)
    vec4: tuple = ()             # tensor parameters the kernel reads as float4: their offsets must be multiples of 4


def _pad4(shape) -> tuple:
    return (1,) * (4 - len(shape)) + tuple(int(d) for d in shape)


def _ceil(n: int, m: int) -> int:
    return -(-int(n) // m)


def _round_up(n: int, m: int) -> int:
    return max(m, -(-int(n) // m) * m)


class Lowering:
    def __init__(self, dev, fragment):
        self.dev = dev
        self.refs: dict[int, Ref] = {id(t): Ref("arg", i, 0, tuple(t.shape)) for i, t in enumerate(fragment.inputs)}
        self.inputs = list(fragment.inputs)
        self.val_sizes: list[int] = []        # elements (4 bytes each) of every computed value
        self.launches: list[Launch] = []
        self.written_args: set[int] = set()
        self.xq: dict[tuple, Ref] = {}        # x -> its 8-bit form, made once per computed value
        self.ewg = min(kernels.EWG, dev.max_wg)
        self.fusions_off = off = fused_kernels.fusions_off()
        self.fusion = fused_kernels.plan(dev, fragment, off)
        readers: dict[int, list[Tensor]] = {}
        for n in fragment.nodes:
            for s in n.src:
                readers.setdefault(id(s), []).append(n)
        outs = {id(t) for t in fragment.outputs}
        fused: set[int] = set()
        for n in fragment.nodes:
            group = self.fusion.anchor.get(id(n))
            if group is not None:
                fused_kernels.emit(self, group)
                continue
            if id(n) in fused or id(n) in self.fusion.absorbed:
                continue
            if n.op in ops.VIEW_OPS:
                self.refs[id(n)] = self._view(n)
                continue
            if n.op == "RMS_NORM" and id(n) not in outs and "rms_mul" not in off:
                r = readers.get(id(n), [])
                if len(r) == 1 and r[0].op == "MUL" and r[0].src[0] is n and self._gain_ok(n, r[0].src[1]):
                    add = self._residual_add(r[0], readers, outs)
                    self._rms_norm(r[0], n, r[0].src[1], add)
                    fused.update(id(t) for t in (r[0], add) if t is not None)
                    continue
            if n.op == "ROPE":
                r = readers.get(id(n), [])
                scale = r[0] if id(n) not in outs and len(r) == 1 and r[0].op == "SCALE" else None
                self._rope(n, scale)
                if scale is not None:
                    fused.add(id(scale))
                continue
            if n.op == "MUL_MAT" and is_weight(n.src[0]) and n.src[0].dtype.name in layout.QUANT_TYPES:
                add = self._residual_add(n, readers, outs)
                self._quant_mul_mat(n, add)
                if add is not None:
                    fused.add(id(add))
                continue
            getattr(self, "_op_" + n.op.lower())(n)

    # -- helpers ----------------------------------------------------------------------------
    def ref(self, t: Tensor) -> Ref:
        return self.refs[id(t)]

    def new_val(self, n: Tensor | None = None, size: int | None = None) -> Ref:
        size = n.nelements if n is not None else size
        self.val_sizes.append(int(size))
        r = Ref("val", len(self.val_sizes) - 1, 0, tuple(n.shape) if n is not None else (int(size),))
        if n is not None:
            self.refs[id(n)] = r
        return r

    def arg_of(self, t: Tensor) -> int:
        r = self.ref(t)
        assert r.kind == "arg", t.describe()
        return r.idx

    def launch(self, name: str, kernel: str, options: dict, n_items: int, lsize: int | None, /, **args) -> None:
        gsize = _round_up(n_items, lsize) if lsize else int(n_items)
        self.launches.append(Launch(name, kernel, options, gsize, lsize, args))

    def each(self, node: Tensor, kernel: str, n_items: int, /, **args) -> None:
        """A one-thread-an-element kernel of the base build."""
        self.launch(f"{node.op} {node.name}", kernel, kernels.base_options(self.dev), n_items, self.ewg, **args)

    # -- views ------------------------------------------------------------------------------
    def _view(self, n: Tensor) -> Ref:
        s = self.ref(n.src[0])
        if n.op == "RESHAPE":
            return Ref(s.kind, s.idx, s.off, tuple(n.shape), s.strides)
        if n.op == "VIEW":
            return Ref(s.kind, s.idx, s.off + int(n.params["offset"]), tuple(n.shape))
        st = s.strides or contiguous_strides(s.shape)
        return Ref(s.kind, s.idx, s.off, tuple(n.shape), tuple(st[a] for a in n.params["axes"]))

    def _residual_add(self, n: Tensor, readers: dict, outs: set) -> Tensor | None:
        """The ADD that is n's only reader and adds to n a residual of its own shape, if there is one."""
        r = readers.get(id(n), [])
        if id(n) in outs or len(r) != 1 or r[0].op != "ADD" or r[0].src[0] is not n:
            return None
        add, res = r[0], r[0].src[1]
        if id(add) in self.fusion.absorbed:      # a fused kernel's prologue takes it
            return None
        ref = self.refs.get(id(res))
        if res is n or tuple(res.shape) != tuple(add.shape) or ref is None or ref.strides is not None:
            return None
        return add

    # -- element-wise and rows ----------------------------------------------------------------
    def _gain_ok(self, norm: Tensor, g: Tensor) -> bool:
        if g.dtype.name != "F32" or not g.contiguous or id(g) not in self.refs:
            return False
        if is_weight(g) and len(self.dev.chunk_plan("F32", g.shape)) > 1:
            return False
        return g.nelements == norm.shape[-1] and all(d == 1 for d in g.shape[:-1])

    def _rms_norm(self, n: Tensor, norm: Tensor, gain: Tensor | None, add: Tensor | None = None):
        a = self.ref(norm.src[0])
        o = self.new_val(add if add is not None else n)
        ncols = norm.shape[-1]
        nrows = norm.nelements // ncols
        label = "RMS_NORM" + ("+MUL" if gain is not None else "") + ("+ADD" if add is not None else "")
        self.launch(f"{label} {n.name}", "rms_norm", kernels.base_options(self.dev), nrows * kernels.RWG, kernels.RWG,
                    a=a, gain=self.ref(gain) if gain is not None else None,
                    r=self.ref(add.src[1]) if add is not None else None, o=o, ncols=ncols,
                    eps=float(norm.params["eps"]), has_gain=int(gain is not None), glen=ncols,
                    has_r=int(add is not None))

    def _op_rms_norm(self, n):
        self._rms_norm(n, n, None)

    def _binary(self, n):
        self.each(n, "binary", n.nelements, a=self.ref(n.src[0]), b=self.ref(n.src[1]), o=self.new_val(n),
                  n=n.nelements, ashape=_pad4(n.src[0].shape), bshape=_pad4(n.src[1].shape), op=BINARY_CODE[n.op])

    _op_add = _op_mul = _binary

    def _op_scale(self, n):
        self.each(n, "unary", n.nelements, a=self.ref(n.src[0]), o=self.new_val(n), n=n.nelements,
                  op=UNARY_CODE["scale"], s=float(n.params["scale"]))

    def _op_unary(self, n):
        self.each(n, "unary", n.nelements, a=self.ref(n.src[0]), o=self.new_val(n), n=n.nelements,
                  op=UNARY_CODE[n.params["op"]], s=1.0)

    def _op_glu(self, n):
        self.each(n, "glu", n.nelements, g=self.ref(n.src[0]), v=self.ref(n.src[1]), o=self.new_val(n),
                  n=n.nelements, op=UNARY_CODE[GLU_ACTIVATION[n.params["op"]]])

    def _op_soft_max(self, n):
        s = n.shape[-1]
        rows = n.nelements // s
        masked = len(n.src) > 1
        self.launch(f"SOFT_MAX {n.name}", "soft_max", kernels.base_options(self.dev), rows * kernels.RWG, kernels.RWG,
                    a=self.ref(n.src[0]), mk=self.ref(n.src[1]) if masked else None, o=self.new_val(n), ncols=s,
                    t=n.shape[-2] if len(n.shape) > 1 else 1, has_mask=int(masked), scale=float(n.params["scale"]))

    # -- attention and rope -------------------------------------------------------------------
    def _op_flash_attn_ext(self, n):
        q, k, v = (self.ref(s) for s in n.src[:3])
        masked = len(n.src) > 3
        mk = self.ref(n.src[3]) if masked else None
        o = self.new_val(n)
        t, h, d = n.src[0].shape
        s, hkv, _ = n.src[1].shape
        common = dict(q=q, k=k, v=v, mk=mk, T=t, H=h, Hkv=hkv, D=d, S=s, has_mask=int(masked),
                      scale=float(n.params["scale"]))
        opts, awg = kernels.base_options(self.dev), kernels.AWG
        if self.dev.is_cpu and d % 4 == 0:
            self.launch(f"FLASH_ATTN_EXT[seq] {n.name}", "flash_attn_seq", opts, t * h, min(8, self.ewg), o=o, **common)
            return
        if not self.dev.is_cpu and t * h < kernels.SPLIT_ATTN_BELOW and s > awg:
            # flash decoding: the keys in parts, one work-group per (row, head, part), then a combine
            nc = min(_ceil(s, awg), max(2, kernels.SPLIT_ATTN_BELOW * 2 // (t * h)))
            per = _ceil(_ceil(s, nc), awg) * awg          # keys a part, in whole blocks
            nc = _ceil(s, per)
            part = self.new_val(size=t * h * nc * (d + 2))
            self.launch(f"FLASH_ATTN_EXT[split] {n.name}", "flash_attn_part", opts, t * h * nc * awg, awg,
                        p=part, nc=nc, per=per, **common)
            self.launch(f"FLASH_ATTN_EXT[combine] {n.name}", "flash_combine", opts, t * h * awg, awg,
                        p=part, o=o, TH=t * h, D=d, nc=nc)
            return
        self.launch(f"FLASH_ATTN_EXT {n.name}", "flash_attn", opts, t * h * awg, awg, o=o, **common)

    def _rope(self, n, scale: Tensor | None):
        """ROPE, times the SCALE that is its only reader where there is one (one launch for both)."""
        t, h, d = n.shape
        p = n.params
        n_dims = int(p["n_dims"])
        # the reference's frequencies (float64), in the kernel's angle type
        inv = reference.rope_inv_freq(n_dims, float(p["freq_base"]), float(p["freq_scale"]))
        factors = self.ref(n.src[2]) if len(n.src) > 2 else None
        self.launch(f"ROPE{'+SCALE' if scale is not None else ''} {n.name}", "rope", kernels.base_options(self.dev),
                    t * h * (d // 2), self.ewg, a=self.ref(n.src[0]), pos=self.ref(n.src[1]),
                    inv=inv if self.dev.fp64 else inv.astype(np.float32), ff=factors,
                    o=self.new_val(scale if scale is not None else n), T=t, H=h, D=d, n_dims=n_dims,
                    neox=ROPE_NEOX[p["mode"]], has_ff=int(factors is not None),
                    s=float(scale.params["scale"]) if scale is not None else 1.0)

    # -- memory -------------------------------------------------------------------------------
    def _op_set_rows(self, n):
        dst, src, rows = (self.ref(s) for s in n.src)
        self.written_args.add(dst.idx)
        self.refs[id(n)] = dst
        w, t = n.shape[1], n.src[2].shape[0]
        self.each(n, "set_rows", w * t, s=src, rows=rows, dst=dst, W=w, T=t, nrows=n.shape[0])

    def _op_cont(self, n):
        a = self.ref(n.src[0])
        st = a.strides or contiguous_strides(a.shape)
        self.each(n, "cont", n.nelements, a=a, o=self.new_val(n), n=n.nelements, shape=_pad4(n.shape),
                  strides=(0,) * (4 - len(st)) + tuple(st))

    def _op_get_rows(self, n):
        a, rows = n.src
        o = self.new_val(n)
        w, t = a.shape[1], rows.shape[0]
        rr = self.ref(rows)
        if not is_weight(a):
            self.launch(f"GET_ROWS {n.name}", "get_rows_f", kernels.base_options(self.dev), w * t, self.ewg,
                        a=self.ref(a), rows=rr, o=o, W=w, T=t, row0=0, nrows=a.shape[0])
            return
        qt, arg = a.dtype.name, self.arg_of(a)
        for ci, (row0, nrows) in enumerate(self.dev.chunk_plan(qt, a.shape)):
            if qt in layout.FLOAT_TYPES:
                self.launch(f"GET_ROWS {n.name}", "get_rows_f", self._float_options(qt), w * t, self.ewg,
                            a=ChunkArg(arg, ci), rows=rr, o=o, W=w, T=t, row0=row0, nrows=nrows)
            else:
                self.launch(f"GET_ROWS {n.name}", "get_rows_q", kernels.quant_options(self.dev, qt), w // 8 * t,
                            self.ewg, a=ChunkArg(arg, ci), rows=rr, o=o, W=w, T=t, row0=row0, nrows=nrows,
                            gpr=w // layout.GROUP)

    def _float_options(self, dtype: str) -> dict:
        opts = kernels.base_options(self.dev)
        if dtype == "F16":
            opts.update(ELEM="half", ELEM_HALF=1)
        return opts

    # -- matrix products -----------------------------------------------------------------------
    def _op_mul_mat(self, n):
        a, b = n.src
        o = self.new_val(n)
        sa, sb = _pad4(a.shape), _pad4(b.shape)
        nrows, k, m = a.shape[-2], a.shape[-1], b.shape[-2]
        if is_weight(a):
            arg = self.arg_of(a)
            chunks = self.dev.chunk_plan(a.dtype.name, a.shape)
            parts = [(ChunkArg(arg, ci), row0, rows) for ci, (row0, rows) in enumerate(chunks)]
            opts = self._float_options(a.dtype.name)
        else:
            parts, opts = [(self.ref(a), 0, nrows)], kernels.base_options(self.dev)
        for bind, row0, rows in parts:
            self.launch(f"MUL_MAT {n.name}", "mul_mat_f", opts, sb[0] * sb[1] * m * rows, self.ewg,
                        a=bind, b=self.ref(b), o=o, N=nrows, M=m, K=k, A0=sa[0], A1=sa[1], B0=sb[0], B1=sb[1],
                        row0=row0, rows=rows, ld=nrows)

    def _quant_mul_mat(self, n, add: Tensor | None):
        """A product by a quantized weight, chunk by chunk; with `add`, the residual added as it is stored."""
        a, x = n.src[0], self.ref(n.src[1])
        o = self.new_val(add if add is not None else n)
        res = {"r": self.ref(add.src[1]) if add is not None else None, "has_r": int(add is not None)}
        plus = "+ADD" if add is not None else ""
        qt = a.dtype.name
        nrows, k = a.shape
        m = n.nelements // nrows
        gpr = k // layout.GROUP
        arg = self.arg_of(a)
        for ci, (row0, rows) in enumerate(self.dev.chunk_plan(qt, a.shape)):
            common = {"a": ChunkArg(arg, ci), "o": o, "N": rows, "K": k, "M": m, "gpr": gpr, "ld": nrows, "col0": row0,
                      **res}
            reg = kernels.reg_shape(self.dev, m)
            if reg is not None:
                opts = dict(kernels.quant_options(self.dev, qt), MR_TM=reg["tm"], MR_TN=reg["tn"])
                items = -(-m // reg["tm"]) * -(-rows // reg["tn"])
                self.launch(f"MUL_MAT[reg-{reg['tm']}x{reg['tn']}]{plus} {n.name}", "matmul_reg", opts, items,
                            reg["wg"], x=x, **common)
                continue
            if m <= kernels.MATVEC_MAX_ROWS:
                sh = kernels.matvec_shape(self.dev, gpr, m, rows, rows * layout.row_bytes(qt, k))
                opts = dict(kernels.quant_options(self.dev, qt), MV_V=sh["v"], MV_WG=sh["wg"], MV_TPR=sh["tpr"],
                            MV_R=sh["r"], MV_MM=sh["mm"], MV_X8=sh["x8"], MV_XL=sh["xl"], MV_XG=sh["xg"],
                            PTX_DP4A=sh["dp4a"] * sh["x8"], PTX_SHFL=sh["shfl"])
                if opts["PTX_DP4A"] or opts["PTX_SHFL"]:
                    opts.update(kernels.ptx_options(self.dev))
                groups = -(-rows // (sh["wg"] // sh["tpr"] * sh["r"]))
                tag = f"matvec{'-x8' if sh['x8'] else ''}{'-v0' if not sh['v'] else ''}"
                if sh["x8"]:
                    self.launch(f"MUL_MAT[{tag}]{plus} {n.name}", "matvec_q8", opts, groups * sh["wg"], sh["wg"],
                                xq=self._quant_x(x, m, k), **common)
                else:
                    self.launch(f"MUL_MAT[{tag}]{plus} {n.name}", "matvec_q", opts, groups * sh["wg"], sh["wg"], x=x,
                                **common)
                continue
            sh = kernels.matmul_shape(self.dev, m, rows)
            nt = (sh["bm"] // sh["tm"]) * (sh["bn"] // sh["tn"])
            opts = dict(kernels.quant_options(self.dev, qt), MM_BM=sh["bm"], MM_BN=sh["bn"], MM_TM=sh["tm"],
                        MM_TN=sh["tn"])
            tiles = -(-m // sh["bm"]) * -(-rows // sh["bn"])
            self.launch(f"MUL_MAT[tile-{sh['bm']}x{sh['bn']}]{plus} {n.name}", "matmul_q", opts, tiles * nt, nt, x=x,
                        **common)

    def _quant_x(self, x: Ref, m: int, k: int) -> Ref:
        """x (m rows of k) in 8 bits, 12 words a 32-element group; made once per computed value (Q, K and
        V of a layer share it), an argument (which a launch may write) each time."""
        key = (x.kind, x.idx, x.off, m, k)
        if x.kind == "val" and key in self.xq:
            return self.xq[key]
        groups = m * k // layout.GROUP
        xq = self.new_val(size=groups * 12)     # at element 0 of its buffer: matvec_q8 reads it as uint4s
        self.launch("QUANT_X", "quant_x", kernels.base_options(self.dev), groups, self.ewg, x=x, xq=xq, groups=groups)
        if x.kind == "val":
            self.xq[key] = xq
        return xq
