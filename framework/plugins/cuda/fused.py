"""The fused decode products of a CUDA device: which runs of nodes become one kernel is the core's
decision (framework.backend.fusion, asked here with this device's limits; FRAMEWORK_CUDA_UNFUSE turns
fusions off by name), and each product group becomes one launch of kernels.cu's rowvec a weight chunk:
x made by its prologue in shared memory (the norm, with the residual add, post-norm or scale before it),
one weight or gate and up, the residual add or GLU in the epilogue.

The attention blocks (``attn``, and ``combine``, which needs them) are not taken: this plugin has no
attention-block kernel, so its attention stays its own launches (rope, cache writes, split attention)."""

from __future__ import annotations

from ...backend import ChunkArg, fusion, weight_words
from ...contract import settings
from . import kernels
from .coverage import GLU_ACTIVATION, UNARY_CODE
from .launches import launch
from .options import UNFUSE_ENV

NOT_TAKEN = frozenset({"attn", "combine"})
SHARED_BYTES = 48 << 10       # a block's static shared memory
PRO = {"plain": 0, "norm": 1}
PRE = {"": 0, "add": 1, "prenorm": 2, "scale": 3}


class Target:
    """The core matcher's questions, answered for one CUDA device."""
    weight_types = frozenset(weight_words.QUANT_TYPES)

    def __init__(self, dev):
        self.dev = dev

    def chunks(self, w) -> int:
        return len(self.dev.chunk_plan(w.dtype.name, w.shape))

    def product_fits(self, g: fusion.ProductGroup) -> bool:
        """One weight type (the build's) and x's staging within a block's shared memory."""
        types = {m.src[0].dtype.name for m in g.muls}
        k = g.muls[0].src[0].shape[1]
        return len(types) == 1 and k // weight_words.GROUP * 144 + 4 * 256 <= SHARED_BYTES   # x, sums of <= 256

    def attn_fits(self, g) -> bool:
        return False

    def head_ok(self, d: int) -> bool:
        return False


def plan(lw, fragment) -> fusion.FusionPlan:
    return fusion.plan(Target(lw.dev), fragment, settings.read(UNFUSE_ENV) | NOT_TAKEN)


def lower_group(lw, g: fusion.ProductGroup) -> None:
    """A product group: one rowvec launch a chunk of its weight."""
    src, p = g.src, g.src.prologue
    ws = [m.src[0] for m in g.muls]
    qt, k = ws[0].dtype.name, ws[0].shape[1]
    args = {"a": lw.ref(src.a), "b": None, "gp": None, "gn": None, "y": None, "write_y": 0, "eps": src.eps,
            "eps1": src.eps1, "ys": src.scale}
    for name, t in (("b", src.b), ("gp", src.g1), ("gn", src.g)):
        if t is not None:
            args[name] = lw.ref(t)
    if p.write_y:
        args.update(y=lw.new_val(src.y), write_y=1)
    out, wargs = lw.new_val(g.out), [lw.arg_of(w) for w in ws]
    op = UNARY_CODE[GLU_ACTIVATION[g.out.params["op"]]] if g.epilogue == "glu" else 0
    label = "+".join(filter(None, ["NORM" if p.src == "norm" else "", "MUL_MAT" + "x2" * (len(ws) > 1),
                                   {"add": "ADD", "glu": "GLU"}.get(g.epilogue)]))
    for ci, (row0, rows) in enumerate(lw.chunks(ws[0])):
        sh = kernels.matvec_shape(k // weight_words.GROUP, 1, rows,
                                  kernels.ROWVEC2_MAX_R if len(ws) > 1 else 4)
        build = {**kernels.quant_options(qt), **sh, "F_K": k, "F_NW": len(ws), "F_PRO": PRO[p.src],
                 "F_PRE": PRE[p.pre], "F_EPI": {"": 0, "add": 1, "glu": 2}[g.epilogue]}
        blocks = -(-rows // (sh["MV_WG"] // sh["MV_TPR"] * sh["MV_R"]))
        launch(lw, f"{label} {g.out.name}", "rowvec", build, blocks * sh["MV_WG"], sh["MV_WG"],
                        w0=ChunkArg(wargs[0], ci), w1=ChunkArg(wargs[1], 0) if len(ws) > 1 else None,
                        r=lw.ref(g.residual) if g.residual is not None else None, o=out, N=rows, col0=row0,
                        op=op, **dict(args, write_y=args["write_y"] * int(ci == 0)))
