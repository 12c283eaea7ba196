"""WGSL of the fused decode kernels (one row of x), generated from what fusion.py found in a fragment.

* ROWVEC: a matrix-vector product whose x is made in workgroup memory by a prologue, over one weight
  or a pair of weights (gate and up), with an epilogue:
  - prologue ``plain``: x = A; ``norm``: x = rms_norm(y) * Gn, where y = A, A + B, rms_norm(A) * Gp + B
    (a post-norm and the residual add before it) or A * scale, and y is written to Y by the first
    workgroup where other nodes read it; ``combine``: x = the split attention's chunks combined (the
    combine pass's arithmetic, in the same order);
  - x quantized to 8 bits in workgroup memory where the weight takes 8-bit x (x8);
  - epilogue: out = acc, acc + R (the residual add), or act(acc_gate) * acc_up (GLU).
* ATTN_BLOCK: one workgroup per (head, chunk of keys) and one per head for the new key: each makes x
  by the prologue, projects its head's q (a per-head RMS norm, rope from the host's table, the scale),
  and attends over its chunk of cached keys; the new key's workgroups also project k and v, write them
  to the caches (the first head of a group of heads sharing them) and attend over the new key alone.
  The partials are (acc, m, l) per (head, chunk), as the split attention kernel's.

Every kernel's bindings come from a list of roles (``*_roles``), the one order both the kernel and the
lowering use; its parameter block is a wgsl.Params built here too.
"""

from __future__ import annotations

from ...backend import fusion
from . import wgsl
from .wgsl import NEG_BIG, Params, source

Prologue = fusion.Prologue

# role -> (access, element type) of a tensor binding
ROLE_TYPES = {
    "A": ("read", "vec4<f32>"), "B": ("read", "vec4<f32>"), "Gn": ("read", "vec4<f32>"), "Gp": ("read", "vec4<f32>"),
    "Y": ("read_write", "vec4<f32>"), "P": ("read", "vec4<f32>"), "R": ("read", "f32"), "O": ("read_write", "f32"),
    "Gq": ("read", "f32"), "Gk": ("read", "f32"), "CS": ("read", "vec2<f32>"), "KR": ("read", "i32"),
    "Kc": ("read_write", "vec4<f32>"), "Vc": ("read_write", "vec4<f32>"), "Mk": ("read", "f32"),
    "PO": ("read_write", "vec4<f32>"), "O0": ("read_write", "f32"), "O1": ("read_write", "f32"),
    "O2": ("read_write", "f32"), "Qp": ("read", "f32"), "Kp": ("read", "f32"), "Vp": ("read", "f32"),
}
WEIGHT_ROLES = ("W0", "W1", "W2", "Wq", "Wk", "Wv")


def prologue_fields(p: Prologue) -> str:
    """A prologue's parameter fields."""
    if p.src == "combine":
        return "d4 nc"
    if p.src == "plain":
        return ""
    return "eps:f32" + {"prenorm": " eps1:f32", "scale": " y_scale:f32"}.get(p.pre, "") + \
        (" write_y" if p.write_y else "")


def _decl(roles: list[str]) -> str:
    """Binding declarations of the non-weight roles (the weights' come with their accessors)."""
    out = []
    for i, r in enumerate(roles):
        if r in WEIGHT_ROLES:
            continue
        access, elem = ROLE_TYPES[r]
        out.append(f"@group(0) @binding({i + 1}) var<storage, {access}> {r}: array<{elem}>;")
    return "\n".join(out) + "\n"


def _off(roles: list[str], role: str) -> str:
    return f"off({roles.index(role)}u)"


ROW_SUM = source("row_sum")

# a group of 32 x values (eight vec4) from the workgroup's copy of x, xs
X_GROUP = source("x_group")


def prologue_source(p: Prologue, roles: list[str]) -> str:
    """WGSL lines of main() filling xs (K4 vec4) with x; `wid` is the workgroup's index, `li` the thread's."""
    o = {r: f"{_off(roles, r)} / 4u" for r in ("A", "B", "Gn", "Gp", "Y", "P") if r in roles}
    if p.src == "plain":
        return f"  for (var c = li; c < K4; c += WG) {{ xs[c] = A[{o['A']} + c]; }}\n  workgroupBarrier();\n"
    if p.src == "combine":        # FLASH_COMBINE's arithmetic, per vec4 of the heads' outputs
        return f"""  let D4 = U.d4; let NC = U.nc;
  for (var c4 = li; c4 < K4; c4 += WG) {{
    let base = {o['P']} + (c4 / D4) * NC * (D4 + 1u);
    var m = {NEG_BIG};
    for (var c = 0u; c < NC; c++) {{ m = max(m, P[base + c * (D4 + 1u) + D4].x); }}
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c = 0u; c < NC; c++) {{
      let pc = base + c * (D4 + 1u);
      let ml = P[pc + D4];
      let f = exp(ml.x - m);
      l += ml.y * f;
      acc += P[pc + c4 % D4] * f;
    }}
    xs[c4] = acc / l;
  }}
  workgroupBarrier();
"""
    lines = []
    if p.pre == "prenorm":        # y = rms_norm(A) * Gp + B
        lines.append(f"""  var s1 = 0.0;
  for (var c = li; c < K4; c += WG) {{ let a = A[{o['A']} + c]; s1 += dot(a, a); }}
  let r1 = 1.0 / sqrt(row_sum(s1, li) * (1.0 / f32(K4 * 4u)) + U.eps1);""")
        y = f"A[{o['A']} + c] * r1 * Gp[{o['Gp']} + c] + B[{o['B']} + c]"
    elif p.pre == "add":
        y = f"A[{o['A']} + c] + B[{o['B']} + c]"
    elif p.pre == "scale":
        y = f"A[{o['A']} + c] * U.y_scale"
    else:
        y = f"A[{o['A']} + c]"
    write = f" if (U.write_y == 1u && wid == 0u) {{ Y[{o['Y']} + c] = y; }}" if p.write_y else ""
    lines.append(f"""  var ss = 0.0;
  for (var c = li; c < K4; c += WG) {{ let y = {y}; xs[c] = y; ss += dot(y, y);{write} }}
  let rn = 1.0 / sqrt(row_sum(ss, li) * (1.0 / f32(K4 * 4u)) + U.eps);
  for (var c = li; c < K4; c += WG) {{ xs[c] = xs[c] * rn * Gn[{o['Gn']} + c]; }}
  workgroupBarrier();
""")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------
# ROWVEC
# ------------------------------------------------------------------------------------------------------

def rowvec_roles(p: Prologue, pair: bool, epilogue: str) -> list[str]:
    return ["W0"] + (["W1"] if pair else []) + p.roles() + (["R"] if epilogue == "add" else []) + ["O"]


def rowvec_params(p: Prologue, pair: bool, epilogue: str) -> Params:
    fields = ("n col0 moff0" + (" moff1" if pair else "") + (" op" if epilogue == "glu" else "") + " "
              + prologue_fields(p))
    return Params(fields, bindings=len(rowvec_roles(p, pair, epilogue)))


def rowvec(qtypes: tuple[str, ...], k: int, p: Prologue, epilogue: str, tpr: int, r: int, wg: int, subgroup: bool,
           x8: bool) -> str:
    """qtypes: the weight's type, or gate's and up's (epilogue "glu"); k: the row length."""
    pair = len(qtypes) == 2
    roles = rowvec_roles(p, pair, epilogue)
    weights = "".join(wgsl.weight_source(q, f"_{i}", roles.index(f"W{i}") + 1) for i, q in enumerate(qtypes))
    gpr = k // 32
    nw = len(qtypes)
    accs = [f"a{i}_{j}" for i in range(nw) for j in range(r)]
    rows = "\n".join(f"    let row{j} = min(r0 + {j}u, N - 1u);" for j in range(r))
    if x8:
        load = "let xa = xq[3u * g]; let xb = xq[3u * g + 1u]; let xc = xq[3u * g + 2u];"
        dots = " ".join(f"a{i}_{j} += dot32q_{i}(row{j}, g, xa, xb, xc);" for i in range(nw) for j in range(r))
    else:
        load = "let x = xsg(g);"
        dots = " ".join(f"a{i}_{j} += dot32_{i}(row{j}, g, x);" for i in range(nw) for j in range(r))
    red_decl, reduce = wgsl.team_reduction(accs, wg, subgroup)
    res = _off(roles, "R") if epilogue == "add" else ""
    value = {"": "a0_{j}", "add": "a0_{j} + R[" + res + " + U.col0 + r0 + {j}u]",
             "glu": "act(U.op, a0_{j}) * a1_{j}"}[epilogue]
    store = "\n".join(f"    if (r0 + {j}u < N) {{ O[ob + {j}u] = {value.format(j=j)}; }}" for j in range(r))
    quant = ""
    if x8:
        quant = """  for (var g = li; g < GPR; g += WG) {
    let b = g * 8u;
    let x0 = xs[b]; let x1 = xs[b + 1u]; let x2 = xs[b + 2u]; let x3 = xs[b + 3u];
    let x4 = xs[b + 4u]; let x5 = xs[b + 5u]; let x6 = xs[b + 6u]; let x7 = xs[b + 7u];
    let m4 = max(max(max(abs(x0), abs(x1)), max(abs(x2), abs(x3))), max(max(abs(x4), abs(x5)), max(abs(x6), abs(x7))));
""" + "\n".join("  " + line for line in wgsl.Q8_GROUP.rstrip("\n").split("\n")) + """
    xq[3u * g] = lo; xq[3u * g + 1u] = hi;
    xq[3u * g + 2u] = vec4<u32>(bitcast<u32>(d), bitcast<u32>(s4(lo)), bitcast<u32>(s4(hi)), bitcast<u32>(sx));
  }
  workgroupBarrier();
"""
    moffs = " ".join(f"gpr_{i} = GPR; moff_{i} = U.moff{i};" for i in range(nw))
    body = f"""
{_decl(roles)}{wgsl.Q_GROUP}{wgsl.Q_CONSTS}{weights}{wgsl.ACT if epilogue == "glu" else ""}{wgsl.Q8_FNS if x8 else ""}
const WG: u32 = {wg}u;
const TPR: u32 = {tpr}u;
const RPW: u32 = {wg // tpr}u;
const K4: u32 = {k // 4}u;
const GPR: u32 = {gpr}u;
var<workgroup> xs: array<vec4<f32>, {k // 4}>;
{f"var<workgroup> xq: array<vec4<u32>, {3 * gpr}>;" if x8 else ""}
{red_decl}
{ROW_SUM}
{X_GROUP}
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  {moffs}
  let wid = lin(w, nw);
{prologue_source(p, roles)}{quant}  let N = U.n;
  let rl = li / TPR; let lane = li % TPR;
  let r0 = (wid * RPW + rl) * {r}u;
{chr(10).join(f"  var {a} = 0.0;" for a in accs)}
  if (r0 < N) {{
{rows}
    for (var g = lane; g < GPR; g += TPR) {{
      {load} {dots}
    }}
  }}
{reduce}
  if (lane == 0u && r0 < N) {{
    let ob = {_off(roles, "O")} + U.col0 + r0;
{store}
  }}
}}
"""
    return rowvec_params(p, pair, epilogue).source(body)


def stack_roles(p: Prologue, n: int) -> list[str]:
    return [f"W{i}" for i in range(n)] + p.roles() + [f"O{i}" for i in range(n)]


def stack_params(p: Prologue, n: int) -> Params:
    fields = " ".join(f"n{i} moff{i}" for i in range(n)) + " " + prologue_fields(p)
    return Params(fields, bindings=len(stack_roles(p, n)))


def _seg_branch(i: int, n: int) -> str:
    """The i-th of n branches on the workgroup's weight (seg): if, else if ..., else."""
    if i == n - 1:
        return "} else"
    return f"if (seg == {i}u)" if i == 0 else f"}} else if (seg == {i}u)"


def rowvec_stack(qtypes: tuple[str, ...], k: int, p: Prologue, tpr: int, r: int, wg: int, subgroup: bool) -> str:
    """Products of one x by several weights (Q, K and V: x the norm of the attention's input) in one
    dispatch, each weight its own output: the first weight's rows take the first workgroups, and so on,
    each workgroup one weight's (a uniform branch), so all of them spread over the whole GPU at once."""
    n = len(qtypes)
    roles = stack_roles(p, n)
    weights = "".join(wgsl.weight_source(q, f"_{i}", roles.index(f"W{i}") + 1) for i, q in enumerate(qtypes))
    accs = [f"a_{j}" for j in range(r)]
    rows = "\n".join(f"    let row{j} = min(r0 + {j}u, N - 1u);" for j in range(r))
    loops = []
    for i in range(n):
        dots = " ".join(f"a_{j} += dot32_{i}(row{j}, g, x);" for j in range(r))
        loops.append(f"    {_seg_branch(i, n)} {{\n"
                     f"      for (var g = lane; g < GPR; g += TPR) {{ let x = xsg(g); {dots} }}")
    loop = "\n".join(loops) + "\n    }"
    red_decl, reduce = wgsl.team_reduction(accs, wg, subgroup)
    stores = []
    for i in range(n):
        st = " ".join(f"if (r0 + {j}u < N) {{ O{i}[{_off(roles, f'O{i}')} + r0 + {j}u] = a_{j}; }}" for j in range(r))
        stores.append(f"    {_seg_branch(i, n)} {{ {st}")
    store = "\n".join(stores) + " }"
    moffs = " ".join(f"gpr_{i} = GPR; moff_{i} = U.moff{i};" for i in range(n))
    ns = [f"U.n{i}" for i in range(n)]
    bounds = []          # seg from the workgroup's index: each weight's workgroups in turn
    for i in range(1, n):
        first = " + ".join(f"((U.n{m} + PER - 1u) / PER)" for m in range(i))
        bounds.append(f"  if (wid >= {first}) {{ seg = {i}u; base = {first}; N = {ns[i]}; }}")
    body = f"""
{_decl(roles)}{wgsl.Q_GROUP}{wgsl.Q_CONSTS}{weights}
const WG: u32 = {wg}u;
const TPR: u32 = {tpr}u;
const RPW: u32 = {wg // tpr}u;
const PER: u32 = {wg // tpr * r}u;
const K4: u32 = {k // 4}u;
const GPR: u32 = {k // 32}u;
var<workgroup> xs: array<vec4<f32>, {k // 4}>;
{red_decl}
{ROW_SUM}
{X_GROUP}
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  {moffs}
  let wid = lin(w, nw);
{prologue_source(p, roles)}  var seg = 0u; var base = 0u; var N = {ns[0]};
{chr(10).join(bounds)}
  let rl = li / TPR; let lane = li % TPR;
  let r0 = ((wid - base) * RPW + rl) * {r}u;
{chr(10).join(f"  var {a} = 0.0;" for a in accs)}
  if (r0 < N) {{
{rows}
{loop}
  }}
{reduce}
  if (lane == 0u && r0 < N) {{
{store}
  }}
}}
"""
    return stack_params(p, n).source(body)


# ------------------------------------------------------------------------------------------------------
# ATTN_BLOCK
# ------------------------------------------------------------------------------------------------------

ATTN_WG = 256


def attn_roles(p: Prologue | None, q_norm: bool, k_norm: bool, mask: bool) -> list[str]:
    """p None: q, k and v come projected (Qp, Kp, Vp: matrix-vector kernels' outputs) instead of made here."""
    made = ["Qp", "Kp", "Vp"] if p is None else p.roles() + ["Wq", "Wk", "Wv"]
    return made + (["Gq"] if q_norm else []) + (["Gk"] if k_norm else []) + \
        ["CS", "KR", "Kc", "Vc"] + (["Mk"] if mask else []) + ["PO"]


def attn_params(p: Prologue | None, q_norm: bool, k_norm: bool, mask: bool) -> Params:
    """h, hkv heads; s keys; nc chunks of `chunk` keys (and one more workgroup a head: the new key);
    cache_rows: rows of the caches; q_scale: the SCALE of q; scale: the attention's."""
    own = "" if p is None else " moffq moffk moffv"
    fields = ("h hkv s nc chunk cache_rows" + own + " scale:f32 q_scale:f32" + (" q_eps:f32" if q_norm else "")
              + (" k_eps:f32" if k_norm else "") + ("" if p is None else " " + prologue_fields(p)))
    return Params(fields, bindings=len(attn_roles(p, q_norm, k_norm, mask)))


def _load_head(src: str, dst: str, head: str, roles: list[str]) -> str:
    """A head's D values of a projection made by another kernel, into dst."""
    return f"""  for (var j = li; j < D; j += WG) {{ {dst}[j] = {src}[{_off(roles, src)} + {head} * D + j]; }}
  workgroupBarrier();
"""


PROJECT_UNROLL = 4     # a thread's groups of a row, this many a loop iteration (their loads in flight together)


def _project(w: str, dst: str, gpr: int, tpr: int) -> str:
    """Rows (rowbase + j, j < D) of weight w times xs into dst[j]: TPR threads a row, their sums in a
    fixed tree. A thread's groups go PROJECT_UNROLL to an iteration: with D = 256 a thread has a whole
    row, and one group at a time would wait for each load in turn (wgpu's loop counters keep a driver
    from unrolling); a whole row unrolled made lavapipe twice as slow."""
    n, u = -(-gpr // tpr), PROJECT_UNROLL
    blocks = gpr // tpr // u           # in these every lane has its groups: no bounds to check
    dots = lambda g: f"acc += dot32_{w}(row, {g}, xsg({g}));"          # noqa: E731
    lines = []
    if blocks:
        block = " ".join(dots(f"g + {j}u * TPR") for j in range(u))
        lines.append(f"    for (var b = 0u; b < {blocks}u; b++) {{ let g = lane + b * {u}u * TPR; {block} }}")
    for j in range(blocks * u, n):
        g = f"lane + {j}u * TPR"
        lines.append(f"    {dots(g)}" if (j + 1) * tpr <= gpr else f"    if ({g} < GPR) {{ {dots(g)} }}")
    body = "\n".join(lines)
    return f"""  {{
    var acc = 0.0;
    let row = rowbase{w} + li / TPR;
    let lane = li % TPR;
{body}
    tsum[li] = acc;
    workgroupBarrier();
    for (var s = TPR / 2u; s > 0u; s >>= 1u) {{
      if (lane < s) {{ tsum[li] += tsum[li + s]; }}
      workgroupBarrier();
    }}
    if (lane == 0u) {{ {dst}[li / TPR] = tsum[li]; }}
    workgroupBarrier();
  }}
"""


def _head_norm(v: str, gain: str, eps: str, roles: list[str]) -> str:
    """v (D values) times rms_norm's scale and the gain, in place."""
    return f"""  {{
    var ss = 0.0;
    for (var j = li; j < D; j += WG) {{ ss += {v}[j] * {v}[j]; }}
    let rn = 1.0 / sqrt(row_sum(ss, li) * (1.0 / f32(D)) + {eps});
    for (var j = li; j < D; j += WG) {{ {v}[j] = {v}[j] * rn * {gain}[{_off(roles, gain)} + j]; }}
    workgroupBarrier();
  }}
"""


def _rope(v: str, roles: list[str]) -> str:
    """ROPE's rotation of v's first ND values in place (the one query row's table entries)."""
    return f"""  for (var j = li; j < ND / 2u; j += WG) {{
    let cs = CS[{_off(roles, "CS")} + j];
    var i0 = 2u * j; var i1 = 2u * j + 1u;
    if (NEOX) {{ i0 = j; i1 = j + ND / 2u; }}
    let x0 = {v}[i0]; let x1 = {v}[i1];
    {v}[i0] = x0 * cs.x - x1 * cs.y;
    {v}[i1] = x0 * cs.y + x1 * cs.x;
  }}
  workgroupBarrier();
"""


ATTN_KEYS = 64         # keys a block of the chunk loop scores at once (ATTN_WG / ATTN_KEYS threads a key)


def _chunk_attention(d: int, o: dict, score_mask) -> str:
    """The chunk's keys against q4, ATTN_KEYS at a time, with every thread busy: ATTN_WG / ATTN_KEYS threads
    score a key (a share of its dims each), and ATTN_WG / (d / 4) groups of threads sum the values (each
    vec4 of the output over a share of the block's keys), their partials added in a fixed order. Every
    thread's loads are written out (a compile-time count, no loop): they are all in flight at once, where
    a loop over the keys waited for each load in turn (a chain of up to 96 loads a workgroup)."""
    d4 = d // 4
    tpk = ATTN_WG // ATTN_KEYS
    vg = max(1, ATTN_WG // d4)
    kpt = -(-ATTN_KEYS // vg)
    dots = []
    for t in range(-(-d4 // tpk)):
        line = f"d0 += q4[sp + {t * tpk}u] * Kc[kr0 + sp + {t * tpk}u];"
        dots.append(f"      {line}" if (t + 1) * tpk <= d4 else f"      if (sp + {t * tpk}u < D4) {{ {line} }}")
    vals = []
    for t in range(kpt):
        j = f"vg + {t * vg}u"
        line = (f"{{ let s3 = s0 + {j}; if (s3 < c1 && s3 != kr) {{ va += ps[{j}] * Vc[vb + s3 * kstride + vi]; }} }}")
        vals.append(f"    {line}" if (t + 1) * vg <= ATTN_KEYS else f"    if ({j} < {ATTN_KEYS}u) {line}")
    total = (" ".join(f"tot += vacc[{g * d4}u + li];" for g in range(vg)) if vg <= 16 else
             f"for (var g = 0u; g < {vg}u; g++) {{ tot += vacc[g * D4 + li]; }}")
    dot_lines = "\n".join(dots)
    val_lines = "\n".join(vals)
    return f"""  // a chunk of cached keys, the new key's row left out (another workgroup attends to it)
  let c0 = c * U.chunk; let c1 = min(S, c0 + U.chunk);
  let kstride = U.hkv * D4;
  let kb = {o['Kc']} / 4u + hk * D4;
  let vb = {o['Vc']} / 4u + hk * D4;
  let sk = li / {tpk}u; let sp = li % {tpk}u;      // scoring: key sk of the block, dims sp, sp + {tpk}, ...
  let vi = li % D4; let vg = li / D4;             // values: vec4 vi of the output, keys vg, vg + {vg}, ...
  var m = {NEG_BIG};
  var l = 0.0;
  var acc = vec4<f32>(0.0);
  for (var s0 = c0; s0 < c1; s0 += {ATTN_KEYS}u) {{
    {{
      let s = s0 + sk;
      var d0 = vec4<f32>(0.0);
      if (s < c1 && s != kr) {{
        let kr0 = kb + s * kstride;
{dot_lines}
      }}
      tsum[li] = dot(d0, vec4<f32>(1.0));
    }}
    workgroupBarrier();
    let s = s0 + li;
    let live = li < {ATTN_KEYS}u && s < c1 && s != kr;
    var sc = {NEG_BIG};
    if (live) {{
      let b = li * {tpk}u;
      var part = 0.0;
      for (var j = 0u; j < {tpk}u; j++) {{ part += tsum[b + j]; }}
      sc = part * scale{score_mask("s")};
    }}
    if (li < {ATTN_KEYS}u) {{ red[li] = sc; }}
    workgroupBarrier();
    for (var k = {ATTN_KEYS // 2}u; k > 0u; k >>= 1u) {{
      if (li < k) {{ red[li] = max(red[li], red[li + k]); }}
      workgroupBarrier();
    }}
    let mn = max(m, red[0]);
    workgroupBarrier();
    var p = 0.0;
    if (live) {{ p = exp(sc - mn); }}
    if (li < {ATTN_KEYS}u) {{ ps[li] = p; red[li] = p; }}
    workgroupBarrier();
    for (var k = {ATTN_KEYS // 2}u; k > 0u; k >>= 1u) {{
      if (li < k) {{ red[li] += red[li + k]; }}
      workgroupBarrier();
    }}
    let alpha = exp(m - mn);
    l = l * alpha + red[0];
    var va = vec4<f32>(0.0);
    if (vg < {vg}u) {{
{val_lines}
    }}
    vacc[li] = va;
    workgroupBarrier();
    if (li < D4) {{
      var tot = vec4<f32>(0.0);
      {total}
      acc = acc * alpha + tot;
    }}
    m = mn;
    workgroupBarrier();
  }}
  if (li < D4) {{ PO[pb + li] = acc; }}
  if (li == 0u) {{ PO[pb + D4] = vec4<f32>(m, l, 0.0, 0.0); }}
"""


def attn_block(qtypes: tuple[str, str, str] | None, k: int, d: int, n_dims: int, neox: bool, p: Prologue | None,
               q_norm: bool, k_norm: bool, mask: bool) -> str:
    """qtypes: Wq's, Wk's, Wv's; k: x's length; d: the head size (dividing ATTN_WG); n_dims: roped dims.
    p None (and qtypes): q, k and v come projected by other kernels (Qp, Kp, Vp); the rest is the same."""
    roles = attn_roles(p, q_norm, k_norm, mask)
    projected = p is None
    weights = "" if projected else "".join(wgsl.weight_source(q, f"_{s}", roles.index(f"W{s}") + 1)
                                           for q, s in zip(qtypes, "qkv"))
    o = {r: _off(roles, r) for r in roles}
    mk = f"max(Mk[{o['Mk']} + {{s}}], {NEG_BIG})" if mask else ""
    score_mask = (lambda s: f" + {mk.format(s=s)}") if mask else (lambda s: "")
    gpr, tpr = k // 32, ATTN_WG // d
    if projected:
        q_made = _load_head("Qp", "qf", "h", roles)
        kv_made = _load_head("Kp", "kf", "hk", roles) + _load_head("Vp", "vf", "hk", roles)
        make_x, weight_words, x_decl = "", "", ""
    else:
        q_made = _project("q", "qf", gpr, tpr)
        kv_made = _project("k", "kf", gpr, tpr) + _project("v", "vf", gpr, tpr)
        make_x = prologue_source(p, roles)
        weight_words = "gpr_q = GPR; moff_q = U.moffq; gpr_k = GPR; moff_k = U.moffk; gpr_v = GPR; moff_v = U.moffv;"
        x_decl = f"""var<workgroup> xs: array<vec4<f32>, {k // 4}>;
{X_GROUP}"""
    q_head = q_made + (_head_norm("qf", "Gq", "U.q_eps", roles) if q_norm else "") + _rope("qf", roles)
    kv_heads = kv_made + (_head_norm("kf", "Gk", "U.k_eps", roles) if k_norm else "") + _rope("kf", roles)
    body = f"""
{_decl(roles)}{"" if projected else wgsl.Q_GROUP + wgsl.Q_CONSTS}{weights}
const WG: u32 = {ATTN_WG}u;
const TPR: u32 = {ATTN_WG // d}u;
const K4: u32 = {k // 4}u;
const GPR: u32 = {k // 32}u;
const D: u32 = {d}u;
const D4: u32 = {d // 4}u;
const ND: u32 = {n_dims}u;
const NEOX: bool = {"true" if neox else "false"};
{x_decl}
var<workgroup> tsum: array<f32, WG>;
var<workgroup> qf: array<f32, {d}>;
var<workgroup> kf: array<f32, {d}>;
var<workgroup> vf: array<f32, {d}>;
var<workgroup> q4: array<vec4<f32>, {d // 4}>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
var<workgroup> vacc: array<vec4<f32>, WG>;
{ROW_SUM}
@compute @workgroup_size({ATTN_WG})
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  {weight_words}
  let wid = lin(w, nw);
  let NC = U.nc; let H = U.h; let S = U.s;
  if (wid >= H * (NC + 1u)) {{ return; }}
  let h = wid / (NC + 1u); let c = wid % (NC + 1u);
  let hk = h / (H / U.hkv);
  let kr = u32(KR[{o['KR']}]);          // the new key's row (a negative index: none)
  let scale = U.scale;
{make_x}  let rowbaseq = h * D;
{q_head}\
  for (var i = li; i < D4; i += WG) {{
    q4[i] = vec4<f32>(qf[4u * i], qf[4u * i + 1u], qf[4u * i + 2u], qf[4u * i + 3u]) * U.q_scale;
  }}
  workgroupBarrier();
  let pb = {o['PO']} / 4u + wid * (D4 + 1u);
  if (c == NC) {{
    // the new key: k and v of this step, into the caches (the first head of those sharing them)
    let rowbasek = hk * D; let rowbasev = hk * D;
{kv_heads}\
    if (h % (H / U.hkv) == 0u && kr < U.cache_rows) {{
      let cb = kr * U.hkv * D4 + hk * D4;
      for (var i = li; i < D4; i += WG) {{
        Kc[{o['Kc']} / 4u + cb + i] = vec4<f32>(kf[4u * i], kf[4u * i + 1u], kf[4u * i + 2u], kf[4u * i + 3u]);
        Vc[{o['Vc']} / 4u + cb + i] = vec4<f32>(vf[4u * i], vf[4u * i + 1u], vf[4u * i + 2u], vf[4u * i + 3u]);
      }}
    }}
    if (li == 0u) {{
      var m = {NEG_BIG};
      var l = 0.0;
      if (kr < S) {{
        var dd = vec4<f32>(0.0);
        for (var i = 0u; i < D4; i++) {{
          dd += q4[i] * vec4<f32>(kf[4u * i], kf[4u * i + 1u], kf[4u * i + 2u], kf[4u * i + 3u]);
        }}
        m = dot(dd, vec4<f32>(1.0)) * scale{score_mask("kr")};
        l = 1.0;
      }}
      PO[pb + D4] = vec4<f32>(m, l, 0.0, 0.0);
    }}
    for (var i = li; i < D4; i += WG) {{
      var v = vec4<f32>(vf[4u * i], vf[4u * i + 1u], vf[4u * i + 2u], vf[4u * i + 3u]);
      if (kr >= S) {{ v = vec4<f32>(0.0); }}
      PO[pb + i] = v;
    }}
    return;
  }}
{_chunk_attention(d, o, score_mask)}}}
"""
    return attn_params(p, q_norm, k_norm, mask).source(body)
