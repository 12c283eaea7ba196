"""The fused decode kernels of a GPU device (docs/opencl.md, "Fused decode kernels"): which runs of nodes
become one kernel is the core's decision (framework.backend.fusion, asked here with this device's limits;
FRAMEWORK_OPENCL_UNFUSE turns fusions off by name). A product group becomes one rowvec launch a weight
chunk (the skeleton's c_kernels.rowvec, with this device's team shape); an attention block one attn_block
launch, its keys split over work-groups enough to fill the device (`split_of`), after one rowvec3 launch of
Q, K and V where the heads are large (`own_products`). None on a CPU device (PoCL runs barrier-free
kernels best, as lavapipe does for the Vulkan plugin).
"""

from __future__ import annotations

import numpy as np

from ...backend import ChunkArg, c_kernels, fusion, weight_words
from ...contract import reference, settings
from . import kernels
from .lowering import DIALECT, launch
from .options import UNFUSE_ENV

ATTN_WG = 256          # attn_block's work-group: a head of up to 256 values, a thread a value
ATTN_MAX_PARTS = 256   # partials a head at most (kernels.cl's AT_MAXP: the combine's local memory)
ATTN_GROUPS_PER_UNIT = 1   # attention work-groups to make at least per compute unit, where the keys allow


def _team(dev, k: int, rows: int, nbytes: int) -> dict:
    """The matrix-vector kernel's team shape (tpr, r, wg, shfl) for `rows` weight rows of k values, nbytes
    of weights in all (x stays f32 in local memory)."""
    return kernels.matvec_shape(dev, k // weight_words.GROUP, 1, rows, nbytes)


def _fits(dev, k: int, sh: dict, weights: int) -> bool:
    """Whether x (k values, a group padded to 144 bytes) and the sums of `weights` weights' rows fit the
    device's local memory, and the work-group holds whole teams."""
    nbytes = k // weight_words.GROUP * 144 + 4 * sh["wg"] * weights * sh["r"]
    return nbytes <= kernels.local_bytes(dev) and sh["wg"] % sh["tpr"] == 0


def product_shape(dev, g: fusion.ProductGroup, rows: int) -> dict:
    """The team shape of a product group's chunk of `rows` rows."""
    k = g.muls[0].src[0].shape[1]
    return _team(dev, k, rows, max(rows * weight_words.row_bytes(m.src[0].dtype.name, k) for m in g.muls))


class Target(c_kernels.FusionTarget):
    """The core matcher's questions, answered for one OpenCL device."""
    def product_fits(self, g: fusion.ProductGroup) -> bool:
        w = g.muls[0].src[0]
        rows = self.dev.chunk_plan(w.dtype.name, w.shape)[0][1]
        return _fits(self.dev, w.shape[1], product_shape(self.dev, g, rows), len(g.muls))

    def attn_fits(self, g: fusion.AttnGroup) -> bool:
        d = g.fa.src[0].shape[2]
        kb = keys_a_block(d)
        nbytes = (g.wq.shape[1] // weight_words.GROUP * 144 + 4 * ATTN_WG + 12 * d + 8 * kb + 16 * ATTN_WG
                  + 8 * ATTN_MAX_PARTS + 16)
        return self.dev.max_wg >= ATTN_WG and nbytes <= kernels.local_bytes(self.dev)

    def head_ok(self, d: int) -> bool:
        return d % 4 == 0 and ATTN_WG % d == 0


def plan(lw, fragment) -> fusion.FusionPlan:
    """The fused groups of a fragment (none on a CPU device); the fusions turned off read once a lowering
    (rms_mul is the lowering's own: the skeleton's c_kernels.Dialect.rms_norm)."""
    lw.fusions_off = settings.read(UNFUSE_ENV)
    if lw.dev.is_cpu:
        return fusion.FusionPlan([])
    return fusion.plan(Target(lw.dev), fragment, lw.fusions_off)


def lower_group(lw, g) -> None:
    """A fusion group of the core's plan, as its launches."""
    if isinstance(g, fusion.AttnGroup):
        attn_block(lw, g)
    else:
        rowvec(lw, g)


def _shfl_options(dev, shfl: int) -> dict:
    return {"PTX_SHFL": 1, **kernels.ptx_options(dev)} if shfl else {}


def rowvec(lw, g: fusion.ProductGroup) -> None:
    """A product group: the skeleton's rowvec launches, each chunk's team shape and weight types this device's."""
    def build(rows: int) -> tuple[dict, int, int]:
        sh = product_shape(lw.dev, g, rows)
        opts = dict(kernels.base_options(lw.dev), FUSED=1, F_WG=sh["wg"], F_TPR=sh["tpr"], F_R=sh["r"],
                    **_shfl_options(lw.dev, sh["shfl"]))
        opts.update({f"F_T{i}": m.src[0].dtype.name for i, m in enumerate(g.muls)})
        return opts, -(-rows // (sh["wg"] // sh["tpr"] * sh["r"])) * sh["wg"], sh["wg"]
    c_kernels.rowvec(launch, lw, g, build)


def _qkv(g: fusion.AttnGroup) -> list:
    """The group's Q, K and V products (the MUL_MAT nodes it absorbed), in that order."""
    return [next(n for n in g.nodes if n.op == "MUL_MAT" and n.src[0] is w) for w in (g.wq, g.wk, g.wv)]


def _stack_shape(dev, g: fusion.AttnGroup) -> dict:
    """The team shape of Q, K and V stacked (rowvec3)."""
    ws, k = (g.wq, g.wk, g.wv), g.wq.shape[1]
    nbytes = sum(w.shape[0] * weight_words.row_bytes(w.dtype.name, k) for w in ws)
    return _team(dev, k, sum(w.shape[0] for w in ws), nbytes)


def own_products(dev, g: fusion.AttnGroup) -> bool:
    """Whether the attention's Q, K and V are made before it by one rowvec3 launch: for heads from
    fusion.ATTN_OWN_PRODUCTS (q rows times x's length), where each weight is one chunk and x fits."""
    if not fusion.wants_own_products(g):
        return False
    if any(len(dev.chunk_plan(w.dtype.name, w.shape)) > 1 for w in (g.wq, g.wk, g.wv)):
        return False
    return _fits(dev, g.wq.shape[1], _stack_shape(dev, g), 1)


def _products(lw, g: fusion.AttnGroup) -> tuple:
    """Q, K and V, one rowvec3 launch (the attention's prologue in it): their values."""
    p = g.src.prologue
    muls = _qkv(g)
    args, opts = c_kernels.prologue(lw, g.src)
    sh = _stack_shape(lw.dev, g)
    build = dict(kernels.base_options(lw.dev), FUSED=1, F_K=g.wq.shape[1], F_WG=sh["wg"], F_TPR=sh["tpr"],
                 F_R=sh["r"], F_NW=3, F_EPI=0, **opts, **_shfl_options(lw.dev, sh["shfl"]))
    per = sh["wg"] // sh["tpr"] * sh["r"]
    binds, groups = {}, 0
    for i, m in enumerate(muls):
        w = m.src[0]
        build[f"F_T{i}"] = w.dtype.name
        binds |= {f"w{i}": ChunkArg(lw.arg_of(w), 0), f"o{i}": lw.new_val(m), f"n{i}": w.shape[0]}
        groups += -(-w.shape[0] // per)
    launch(lw, f"{'NORM+' if p.src == 'norm' else ''}MUL_MATx3 {muls[0].name}", "rowvec3", build, groups * sh["wg"],
           sh["wg"], **binds, **args)
    return binds["o0"], binds["o1"], binds["o2"]


def keys_a_block(d: int) -> int:
    """Keys attn_block scores at once for heads of d values (kernels.cl's AT_KB: 8 threads a key, fewer
    for heads under 32 values)."""
    return ATTN_WG // min(8, d // 4)


def split_of(dev, s: int, h: int, d: int) -> tuple[int, int]:
    """(parts, keys a part) of the attention's s cached keys for h heads of d values: whole blocks of keys,
    enough parts for ATTN_GROUPS_PER_UNIT work-groups a compute unit (at least 2 a head where the keys
    allow: decode's few heads would otherwise leave most of a GPU idle), at most ATTN_MAX_PARTS - 1."""
    kb = keys_a_block(d)
    want = max(2, -(-ATTN_GROUPS_PER_UNIT * int(dev.data.get("compute_units") or 1) // h))
    nc = max(1, min(-(-s // kb), want, ATTN_MAX_PARTS - 1))
    per = -(-(-(-s // nc)) // kb) * kb
    return -(-s // per), per


def attn_block(lw, g: fusion.AttnGroup) -> None:
    fa = g.fa
    _, h, d = fa.src[0].shape
    s, hkv, _ = fa.src[1].shape
    own = own_products(lw.dev, g)
    if own:
        qkv, args, opts = _products(lw, g), dict(c_kernels.NO_PROLOGUE), {"F_PRO": 0, "F_PRE": 0}
    else:
        qkv = (None, None, None)
        args, opts = c_kernels.prologue(lw, g.src)
    caches = []
    for st in (g.k_set, g.v_set):
        c = lw.in_place(st)
        if c.off:
            raise ValueError(f"{fa.name}: the attention block writes a whole cache argument in place, not "
                             f"{st.src[0].describe()}")
        caches.append(c)
    rp = g.rope.params
    n_dims = int(rp["n_dims"])
    inv = reference.rope_inv_freq(n_dims, float(rp["freq_base"]), float(rp["freq_scale"]))
    nc, chunk = split_of(lw.dev, s, h, d)
    part = lw.scratch((h * (nc + 1) * (d + 2),))
    out = lw.new_val(fa)
    mask = len(fa.src) > 3
    itself = "combine" not in lw.fusions_off     # its last work-group a head combines the partials
    build = dict(kernels.base_options(lw.dev), FUSED=1, F_K=g.wq.shape[1], F_WG=ATTN_WG, F_D=d, F_ND=n_dims,
                 F_NEOX=c_kernels.ROPE_NEOX[rp["mode"]], F_QN=int(g.q_norm is not None), F_KN=int(g.k_norm is not None),
                 F_OWN=int(own), F_SELF=int(itself), **opts)
    if itself and kernels.ptx(lw.dev).get("fence"):
        build |= {"PTX_FENCE": 1, **kernels.ptx_options(lw.dev)}
    if not own:
        build |= {"F_T0": g.wq.dtype.name, "F_T1": g.wk.dtype.name, "F_T2": g.wv.dtype.name}
    norm = g.src.prologue.src == "norm" and not own
    label = "+".join(filter(None, ["NORM" if norm else "", "" if own else "QKV", "ROPE", "SET_ROWS", "FLASH_ATTN_EXT"]))
    weights = {n: None if own else ChunkArg(lw.arg_of(w), 0) for n, w in (("wq", g.wq), ("wk", g.wk), ("wv", g.wv))}
    launch(lw, f"{label} {fa.name}", "attn_block", build, h * (nc + 1) * ATTN_WG, ATTN_WG, **weights,
           qp=qkv[0], kp=qkv[1], vp=qkv[2],
           gq=lw.ref(g.q_norm[0]) if g.q_norm else None, gk=lw.ref(g.k_norm[0]) if g.k_norm else None,
           pos=lw.ref(g.rope.src[1]), inv=DIALECT.angles(lw.dev, inv),
           krow=lw.ref(g.k_set.src[2]), kc=caches[0], vc=caches[1], mk=lw.ref(fa.src[3]) if mask else None,
           po=part, cnt=np.zeros(h, np.int32), o=out if itself else None, H=h, Hkv=hkv, S=s, nc1=nc + 1,
           chunk=chunk, cache_rows=g.k_set.src[0].shape[0], has_mask=int(mask), scale=float(fa.params["scale"]),
           q_scale=g.q_scale, q_eps=g.q_norm[1] if g.q_norm else 0.0, k_eps=g.k_norm[1] if g.k_norm else 0.0,
           vec4=("kc", "vc"), **args)
    if not itself:
        launch(lw, f"FLASH_ATTN_EXT[combine] {fa.name}", "flash_combine", kernels.base_options(lw.dev),
               h * kernels.AWG, kernels.AWG, p=part, o=out, TH=h, D=d, nc=nc + 1)
