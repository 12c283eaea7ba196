"""The fused decode products of a CUDA device: which runs of nodes become one kernel is the core's
decision (framework.backend.fusion, asked here with this device's limits; FRAMEWORK_CUDA_UNFUSE turns
fusions off by name), and each product group becomes one launch of kernels.cu's rowvec a weight chunk
(the skeleton's c_kernels.rowvec, with this device's team shape): x made by its prologue in shared memory
(the norm, with the residual add, post-norm or scale before it), one weight or gate and up, the residual
add or GLU in the epilogue.

An attention group (``attn``: Q, K and V of one x, their head norms, rope, q's scale, the two cache writes
and the attention) becomes three launches where its nodes were ten: rowvec3 (the prologue, then the three
products, each weight of its own type), rope_kv (norms, rope and scale; k and v into the caches) and the
attention (lowering.py's: split in parts for decode, then combined). ``combine`` (the partials combined
in the output projection's prologue) is not taken: rowvec has no such prologue."""

from __future__ import annotations

from ...backend import ChunkArg, c_kernels, fusion, weight_words
from ...contract import reference, settings
from . import kernels
from .coverage import MAX_HEAD
from .lowering import DIALECT, launch
from .options import UNFUSE_ENV

NOT_TAKEN = frozenset({"combine"})
SHARED_BYTES = 48 << 10       # a block's static shared memory


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
    """The fused groups of a fragment; the fusions turned off read once a lowering (rms_mul is the
    lowering's own: the skeleton's c_kernels.Dialect.rms_norm)."""
    lw.fusions_off = settings.read(UNFUSE_ENV)
    return fusion.plan(Target(lw.dev), fragment, lw.fusions_off | NOT_TAKEN)


def lower_group(lw, g) -> None:
    """A fusion group of the core's plan, as its launches."""
    if isinstance(g, fusion.AttnGroup):
        lower_attention(lw, g)
    else:
        rowvec(lw, g)


def rowvec(lw, g: fusion.ProductGroup) -> None:
    """A product group: the skeleton's rowvec launches, each chunk's team shape this device's (a fused gate
    and up hold twice the registers a row: at most ROWVEC2_MAX_R rows a team)."""
    w = g.muls[0].src[0]
    max_r = kernels.ROWVEC2_MAX_R if len(g.muls) > 1 else 4

    def build(rows: int) -> tuple[dict, int, int]:
        sh = kernels.matvec_shape(w.shape[1] // weight_words.GROUP, 1, rows, max_r)
        blocks = -(-rows // (sh["MV_WG"] // sh["MV_TPR"] * sh["MV_R"]))
        return {**DIALECT.quant_options(lw.dev, w.dtype.name), **sh}, blocks * sh["MV_WG"], sh["MV_WG"]
    c_kernels.rowvec(launch, lw, g, build)


def lower_attention(lw, g: fusion.AttnGroup) -> None:
    """An attention group: rowvec3 (x, then Q, K and V), rope_kv, the attention."""
    fa, p = g.fa, g.src.prologue
    _, h, d = fa.src[0].shape
    s, hkv, _ = fa.src[1].shape
    ws = (g.wq, g.wk, g.wv)
    k = g.wq.shape[1]
    args, pro = c_kernels.prologue(lw, g.src)
    made = [lw.scratch((w.shape[0],)) for w in ws]
    sh = kernels.matvec_shape(k // weight_words.GROUP, 1, sum(w.shape[0] for w in ws))
    per = sh["MV_WG"] // sh["MV_TPR"] * sh["MV_R"]
    nb = [-(-w.shape[0] // per) for w in ws]
    build = {**DIALECT.quant_options(lw.dev, g.wq.dtype.name), **sh, "F_K": k, "F_NW": 1, **pro, "F_EPI": 0,
             "F_STACK": 1, **{f"S{i}": w.dtype.name for i, w in enumerate(ws)}}
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
           has_qn=int(qn is not None), has_kn=int(kn is not None), q_eps=qn[1] if qn else 0.0,
           k_eps=kn[1] if kn else 0.0, q_scale=g.q_scale, cache_rows=g.k_set.src[0].shape[0])
    mask = lw.ref(fa.src[3]) if len(fa.src) > 3 else None
    DIALECT.attention(lw, fa.name, dict(q=q, k=kc, v=vc, mk=mask, T=1, H=h, Hkv=hkv, D=d, S=s,
                                        has_mask=int(mask is not None), scale=float(fa.params["scale"])),
                      lw.new_val(fa))
