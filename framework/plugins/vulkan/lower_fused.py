"""Lowering the fused groups fusion.py found: each becomes a ROWVEC or ATTN_BLOCK dispatch (wgsl_fused.py),
its bindings in the kernel's order of roles, its parameters by name. An attention block whose heads are
large (a head's q rows times x's length at least the core's fusion.ATTN_OWN_PRODUCTS, which the OpenCL plugin
shares) has its Q, K and V made first by one ROWVEC over the three weights, across the whole GPU, and the
ATTN_BLOCK reads them."""

from __future__ import annotations

from dataclasses import replace

from ...backend import ChunkArg, fusion
from . import wgsl_fused
from .fusion import buffers_limit, rowvec_fits, shape_of
from .kernel_shapes import split_of
from .steps import emit
from .wgsl import GLU_CODE


def lower_group(lw, g) -> None:
    """A fusion group of the core's plan, as its dispatches."""
    if isinstance(g, fusion.AttnGroup):
        attn_block(lw, g)
    else:
        rowvec(lw, g)


def _sources(lw, src: fusion.Sources) -> tuple[dict, dict]:
    """The prologue's bindings by role and its parameters (write_y set per dispatch by the caller)."""
    p = src.prologue
    if p.src == "combine":
        part, nc, d = lw.memo[("partials", id(src.fa))]
        return {"P": part}, {"d4": d // 4, "nc": nc}
    binds = {"A": src.a}
    if p.src == "norm":
        binds |= {"B": src.b, "Gn": src.g, "Gp": src.g1}
    binds = {r: lw.ref(t) for r, t in binds.items() if t is not None}
    for r in binds.values():
        if r.kind == "arg":
            lw.align4.add(r.idx)
    params = {}
    if p.src == "norm":
        params["eps"] = src.eps
        if p.pre == "prenorm":
            params["eps1"] = src.eps1
        if p.pre == "scale":
            params["y_scale"] = src.scale
        if p.write_y:
            binds["Y"] = lw.new_val(src.y)
    return binds, params


def _rw(roles: list[str]) -> tuple[bool, ...]:
    return tuple(r not in wgsl_fused.WEIGHT_ROLES and wgsl_fused.ROLE_TYPES[r][0] == "read_write" for r in roles)


def rowvec(lw, g: fusion.ProductGroup) -> None:
    p = g.src.prologue
    pair = len(g.muls) == 2
    ws = [m.src[0] for m in g.muls]
    qtypes = tuple(w.dtype.name for w in ws)
    k = ws[0].shape[1]
    sh = shape_of(lw.dev, g)
    roles = wgsl_fused.rowvec_roles(p, pair, g.epilogue)
    binds, params = _sources(lw, g.src)
    out = lw.new_val(g.out)
    binds["O"] = out
    if g.residual is not None:
        binds["R"] = lw.ref(g.residual)
    args = [lw.arg_of(w) for w in ws]
    if pair:
        binds["W1"] = params["moff1"] = ChunkArg(args[1], 0)
    if g.epilogue == "glu":
        params["op"] = GLU_CODE[g.out.params["op"]]
    key = ("rowvec", qtypes, k, p, g.epilogue, sh["tpr"], sh["r"], sh["wg"], sh["sg"], sh["x8"])
    label = "+".join(filter(None, [{"norm": "NORM", "combine": "COMBINE"}.get(p.src), "MUL_MAT" + "x2" * pair,
                                   {"add": "ADD", "glu": "GLU"}.get(g.epilogue)]))
    for ci, (row0, rows) in enumerate(lw.chunks(ws[0])):
        binds["W0"] = ChunkArg(args[0], ci)
        step_params = params | {"n": rows, "col0": row0, "moff0": ChunkArg(args[0], ci)}
        if p.write_y:
            step_params["write_y"] = int(ci == 0)
        emit(lw, f"{label} {g.out.name}", key, _rw(roles), [binds[r] for r in roles], step_params,
             -(-rows // (sh["wg"] // sh["tpr"] * sh["r"])), wgsl_fused.rowvec_params(p, pair, g.epilogue))


def _qkv(g: fusion.AttnGroup) -> list:
    """The group's Q, K and V products (MUL_MAT nodes it absorbed), in that order."""
    return [next(n for n in g.nodes if n.op == "MUL_MAT" and n.src[0] is w) for w in (g.wq, g.wk, g.wv)]


def _product_groups(g: fusion.AttnGroup) -> list[fusion.ProductGroup]:
    """Q, K and V as ROWVECs with the attention's prologue (the first writes its y, where it has one)."""
    out = []
    for i, m in enumerate(_qkv(g)):
        src = g.src
        if i and src.prologue.write_y:
            src = replace(src, prologue=replace(src.prologue, write_y=False), y=None)
        out.append(fusion.ProductGroup([m], src, "", m))
    return out


def own_products(lw, g: fusion.AttnGroup) -> bool:
    """Whether the attention's Q, K and V products are matrix-vector kernels of their own (see fusion.py)."""
    return fusion.wants_own_products(g) and all(rowvec_fits(lw.dev, pg) for pg in _product_groups(g))


def _products(lw, g: fusion.AttnGroup) -> dict:
    """Q, K and V across the whole GPU, one ROWVEC kernel over the three weights where they fit one (else
    one each); their outputs by the attention kernel's roles."""
    pgs = _product_groups(g)
    muls = _qkv(g)
    stacked = fusion.ProductGroup(muls, g.src, "", muls[0])
    sh = shape_of(lw.dev, stacked)
    roles = wgsl_fused.stack_roles(g.src.prologue, 3)
    if sh["x8"] or not rowvec_fits(lw.dev, pgs[0]) or len(roles) > buffers_limit(lw.dev):
        for pg in pgs:
            rowvec(lw, pg)
        return {role: lw.ref(pg.out) for role, pg in zip(("Qp", "Kp", "Vp"), pgs)}
    p = g.src.prologue
    binds, params = _sources(lw, g.src)
    if p.write_y:
        params["write_y"] = 1
    qtypes = tuple(m.src[0].dtype.name for m in muls)
    k = muls[0].src[0].shape[1]
    per = sh["wg"] // sh["tpr"] * sh["r"]
    groups = 0
    for i, m in enumerate(muls):
        binds[f"W{i}"] = params[f"moff{i}"] = ChunkArg(lw.arg_of(m.src[0]), 0)
        binds[f"O{i}"] = lw.new_val(m)
        params[f"n{i}"] = m.src[0].shape[0]
        groups += -(-params[f"n{i}"] // per)
    key = ("rowvec_stack", qtypes, k, p, sh["tpr"], sh["r"], sh["wg"], sh["sg"])
    emit(lw, f"{'NORM+' if p.src == 'norm' else ''}MUL_MATx3 {muls[0].name}", key, _rw(roles),
         [binds[r] for r in roles], params, groups, wgsl_fused.stack_params(p, 3))
    return {role: binds[f"O{i}"] for i, role in enumerate(("Qp", "Kp", "Vp"))}


def attn_block(lw, g: fusion.AttnGroup) -> None:
    fa = g.fa
    _, h, d = fa.src[0].shape
    s, hkv, _ = fa.src[1].shape
    own = own_products(lw, g)
    p = None if own else g.src.prologue
    mask = len(fa.src) > 3
    roles = wgsl_fused.attn_roles(p, g.q_norm is not None, g.k_norm is not None, mask)
    binds, params = (_products(lw, g), {}) if own else _sources(lw, g.src)
    caches = []
    for st in (g.k_set, g.v_set):
        c = lw.in_place(st)
        if c.off:
            raise ValueError(f"{fa.name}: the attention block writes a whole cache, not {st.src[0].describe()}")
        lw.align4.add(c.idx)
        caches.append(c)
    rp = g.rope.params
    n_dims = int(rp["n_dims"])
    nc, ch = split_of(s, h)
    part = lw.scratch((h * (nc + 1) * (d + 4),))
    if not own:
        for x, w in zip("qkv", (g.wq, g.wk, g.wv)):     # a weight's binding and its scale plane's offset
            binds[f"W{x}"] = params[f"moff{x}"] = ChunkArg(lw.arg_of(w), 0)
        if p.write_y:
            params["write_y"] = 1
    binds |= {"CS": lw.rope(g.rope, 1), "KR": lw.ref(g.k_set.src[2]),
              "Kc": caches[0], "Vc": caches[1], "PO": part}
    if mask:
        binds["Mk"] = lw.ref(fa.src[3])
    for x, norm in (("q", g.q_norm), ("k", g.k_norm)):     # (gain, eps) of a head norm, if any
        if norm is not None:
            binds[f"G{x}"], params[f"{x}_eps"] = lw.ref(norm[0]), norm[1]
    params |= {"h": h, "hkv": hkv, "s": s, "nc": nc, "chunk": ch, "cache_rows": g.k_set.src[0].shape[0],
               "scale": float(fa.params["scale"]), "q_scale": g.q_scale}
    qtypes = None if own else tuple(w.dtype.name for w in (g.wq, g.wk, g.wv))
    k = g.wq.shape[1]
    neox = rp["mode"] == "neox"
    key = ("attn_block", qtypes, k, d, n_dims, neox, p, g.q_norm is not None, g.k_norm is not None, mask)
    made = [] if own else ["NORM" if p.src == "norm" else "", "QKV"]
    label = "+".join(filter(None, made + ["ROPE", "SET_ROWS", "FLASH_ATTN_EXT"]))
    emit(lw, f"{label} {fa.name}", key, _rw(roles), [binds[r] for r in roles], params, h * (nc + 1),
         wgsl_fused.attn_params(p, g.q_norm is not None, g.k_norm is not None, mask))
    if g.combined:
        o = lw.new_val(fa)
        emit(lw, f"FLASH_ATTN_EXT[combine] {fa.name}", ("flash_combine",), None, [part, o],
             {"rows": h, "d": d, "nc": nc + 1}, h)
    else:                # the product reading the attention combines the partials in its prologue
        lw.memo[("partials", id(fa))] = (part, nc + 1, d)
