"""The fused decode products of a CUDA device: which runs of nodes become one kernel is the core's
decision (framework.backend.fusion, asked here with this device's limits; FRAMEWORK_CUDA_UNFUSE turns
fusions off by name), and each product group becomes one launch of kernels.cu's rowvec a weight chunk:
x made by its prologue in shared memory (the norm, with the residual add, post-norm or scale before it),
one weight or gate and up, the residual add or GLU in the epilogue.

An attention group (``attn``: Q, K and V of one x, their head norms, rope, q's scale, the two cache writes
and the attention) becomes three launches where its nodes were ten: rowvec3 (the prologue, then the three
products, each weight of its own type), rope_kv (norms, rope and scale; k and v into the caches) and the
attention (split in parts for decode, then combined). ``combine`` (the partials combined in the output
projection's prologue) is not taken: rowvec has no such prologue."""

from __future__ import annotations

from ...backend import ChunkArg, c_kernels, fusion, weight_words
from ...contract import reference, settings
from . import kernels
from .attention import attention
from .coverage import MAX_HEAD
from .launches import launch
from .options import UNFUSE_ENV

NOT_TAKEN = frozenset({"combine"})
SHARED_BYTES = 48 << 10       # a block's static shared memory
PRO = {"plain": 0, "norm": 1}
PRE = {"": 0, "add": 1, "prenorm": 2, "scale": 3}


class Target:
    """The core matcher's questions, answered for one CUDA device."""
    weight_types = frozenset(weight_words.QUANT_TYPES)
    attn_biases = True          # rowvec3 adds Q's, K's and V's biases as it stores

    def __init__(self, dev):
        self.dev = dev

    def chunks(self, w) -> int:
        return len(self.dev.chunk_plan(w.dtype.name, w.shape))

    def product_fits(self, g: fusion.ProductGroup) -> bool:
        """One weight type (the build's) and x's staging within a block's shared memory."""
        types = {m.src[0].dtype.name for m in g.muls}
        k = g.muls[0].src[0].shape[1]
        return len(types) == 1 and k // weight_words.GROUP * 144 + 4 * 256 <= SHARED_BYTES   # x, sums of <= 256

    def attn_fits(self, g: fusion.AttnGroup) -> bool:
        """x staged as a product's, rows short enough for teams within a warp (rowvec3), no frequency
        factors (the rope table is the kernel's only frequencies)."""
        k = g.wq.shape[1]
        return (k // weight_words.GROUP <= kernels.MATVEC_WIDE_FROM and len(g.rope.src) == 2
                and k // weight_words.GROUP * 144 + 4 * 256 <= SHARED_BYTES)

    def head_ok(self, d: int) -> bool:
        return d % 2 == 0 and d <= MAX_HEAD


def plan(lw, fragment) -> fusion.FusionPlan:
    return fusion.plan(Target(lw.dev), fragment, settings.read(UNFUSE_ENV) | NOT_TAKEN)


def prologue_args(lw, src: fusion.Sources) -> dict:
    """The arguments of rowvec's prologue (x made from a, b, gp, gn; y written where write_y)."""
    args = {"a": lw.ref(src.a), "b": None, "gp": None, "gn": None, "y": None, "write_y": 0, "eps": src.eps,
            "eps1": src.eps1, "ys": src.scale}
    for name, t in (("b", src.b), ("gp", src.g1), ("gn", src.g)):
        if t is not None:
            args[name] = lw.ref(t)
    if src.prologue.write_y:
        args.update(y=lw.new_val(src.y), write_y=1)
    return args


def lower_group(lw, g) -> None:
    """A product group: one rowvec launch a chunk of its weight (an attention group: lower_attention)."""
    if isinstance(g, fusion.AttnGroup):
        return lower_attention(lw, g)
    src, p = g.src, g.src.prologue
    ws = [m.src[0] for m in g.muls]
    qt, k = ws[0].dtype.name, ws[0].shape[1]
    args = prologue_args(lw, src)
    out, wargs = lw.new_val(g.out), [lw.arg_of(w) for w in ws]
    op = c_kernels.UNARY_CODE[c_kernels.GLU_ACTIVATION[g.out.params["op"]]] if g.epilogue == "glu" else 0
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


def lower_attention(lw, g: fusion.AttnGroup) -> None:
    """An attention group: rowvec3 (x, then Q, K and V), rope_kv, the attention."""
    fa, p = g.fa, g.src.prologue
    _, h, d = fa.src[0].shape
    s, hkv, _ = fa.src[1].shape
    ws = (g.wq, g.wk, g.wv)
    k = g.wq.shape[1]
    args = prologue_args(lw, g.src)
    made = [lw.scratch((w.shape[0],)) for w in ws]
    sh = kernels.matvec_shape(k // weight_words.GROUP, 1, sum(w.shape[0] for w in ws))
    per = sh["MV_WG"] // sh["MV_TPR"] * sh["MV_R"]
    nb = [-(-w.shape[0] // per) for w in ws]
    build = {**kernels.quant_options(g.wq.dtype.name), **sh, "F_K": k, "F_NW": 1, "F_PRO": PRO[p.src],
             "F_PRE": PRE[p.pre], "F_EPI": 0, "F_STACK": 1, **{f"S{i}": w.dtype.name for i, w in enumerate(ws)}}
    wargs = [ChunkArg(lw.arg_of(w), 0) for w in ws]
    biases = {name: lw.ref(b) if b is not None else None for name, b in zip(("bq", "bk", "bv"), g.biases)}
    has_b = sum(1 << i for i, b in enumerate(g.biases) if b is not None)
    label = "+".join(filter(None, ["NORM" if p.src == "norm" else "", "MUL_MATx3", "ADD" if has_b else ""]))
    launch(lw, f"{label} {fa.name}", "rowvec3", build, sum(nb) * sh["MV_WG"], sh["MV_WG"],
           w0=wargs[0], w1=wargs[1], w2=wargs[2], o0=made[0], o1=made[1], o2=made[2], N0=ws[0].shape[0],
           N1=ws[1].shape[0], N2=ws[2].shape[0], nb0=nb[0], nb1=nb[1], has_b=has_b, **biases, **args)
    kc, vc = lw.in_place(g.k_set), lw.in_place(g.v_set)
    q = lw.scratch((h * d,))
    rp = g.rope.params
    n_dims = int(rp["n_dims"])
    qn, kn = g.q_norm, g.k_norm
    launch(lw, f"ROPE+SET_ROWS {fa.name}", "rope_kv", kernels.base_options(), (h + hkv) * kernels.RWG, kernels.RWG,
           qp=made[0], kp=made[1], vp=made[2], pos=lw.ref(g.rope.src[1]),
           inv=reference.rope_inv_freq(n_dims, float(rp["freq_base"]), float(rp["freq_scale"])),
           gq=lw.ref(qn[0]) if qn else None, gk=lw.ref(kn[0]) if kn else None, krow=lw.ref(g.k_set.src[2]),
           q=q, kc=kc, vc=vc, H=h, Hkv=hkv, D=d, n_dims=n_dims, neox=c_kernels.ROPE_NEOX[rp["mode"]],
           has_qn=int(qn is not None),
           has_kn=int(kn is not None), q_eps=qn[1] if qn else 0.0, k_eps=kn[1] if kn else 0.0, q_scale=g.q_scale,
           cache_rows=g.k_set.src[0].shape[0])
    mask = lw.ref(fa.src[3]) if len(fa.src) > 3 else None
    attention(lw, fa.name, q, kc, vc, mask, lw.new_val(fa), 1, h, hkv, d, s, float(fa.params["scale"]))
