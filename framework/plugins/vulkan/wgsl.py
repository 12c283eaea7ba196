"""WGSL sources of every kernel: the kernels' text in kernels/*.wgsl (``source``: a file, its shared
pieces filled in by name), assembled here where a kernel is generated from data (a weight type's
accessors, a team's reduction, a tile's loads).

Conventions shared by all kernels:

* binding 0 is the kernel's parameter block, a struct of one definition (``Params``) that the lowering
  fills by name: first the element offsets of the tensor bindings (``off(i)``: binding i + 1's; a
  tensor is a whole buffer bound at offset 0 plus an element offset, so views need no aligned binding
  offsets), then the kernel's own named fields (``U.ncols``, ``U.eps``, ...);
* workgroups are numbered in two dimensions (at most 65535 per dimension), ``lin()`` flattens them;
* every reduction runs in a fixed order, so a program run twice gives bit-identical results.

Quantized weights are read through ``grp(row, group)``: a 32-element group's byte codes and scales
(each weight type, laid out in device memory as quant.py says, brings its own ``grp``); the kernels
decode codes to floats without int-to-float conversions and sum in f32 (Gemma's activations exceed
f16's range); only the tiled product's f16 variant (MATMUL_TILE16_NOTE, off by default) sums 32-element
groups in f16.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

KERNELS = Path(__file__).with_name("kernels")
BLOCK_WORDS = 64          # u32 words a parameter block may hold (uniforms.UNIFORM_STRIDE bytes)


@lru_cache(maxsize=None)
def _read(name: str) -> str:
    return (KERNELS / f"{name}.wgsl").read_text()


def source(name: str, **parts: str) -> str:
    """The text of kernels/NAME.wgsl, each ``@@part@@`` in it replaced by the piece given by that name (the
    entry point, the activation functions, ...); a piece given and not used, or used and not given, is an
    error naming the file."""
    text = _read(name)
    for key, piece in parts.items():
        if f"@@{key}@@" not in text:
            raise ValueError(f"kernels/{name}.wgsl has no @@{key}@@")
        text = text.replace(f"@@{key}@@", piece)
    missing = re.findall(r"@@(\w+)@@", text)
    if missing:
        raise ValueError(f"kernels/{name}.wgsl needs {', '.join(sorted(set(missing)))}, not given")
    return text


class Params:
    """A kernel's parameter block, from one definition used by both sides: the WGSL struct the kernel
    reads (``U.name``) and the words the lowering fills by name. ``fields``: names separated by spaces,
    u32 unless written ``name:f32``. The element offsets of the tensor bindings come first, four to a
    vec4 (at least two vec4s: every kernel of up to 8 tensor bindings has its fields from word 8)."""

    def __init__(self, fields: str, bindings: int = 8):
        self.offsets = 4 * max(2, -(-bindings // 4))
        self.types: dict[str, str] = {}
        for f in fields.split():
            name, _, typ = f.partition(":")
            if typ not in ("", "f32") or name in self.types or name == "offs":
                raise ValueError(f"parameter block field {f!r} in {fields!r}: a new name, u32 or name:f32")
            self.types[name] = typ or "u32"
        self.word = {name: self.offsets + i for i, name in enumerate(self.types)}
        if self.offsets + len(self.types) > BLOCK_WORDS:
            raise ValueError(f"parameter block {fields!r}: more than {BLOCK_WORDS} words")

    def header(self) -> str:
        members = ", ".join([f"offs: array<vec4<u32>, {self.offsets // 4}>"] +
                            [f"{name}: {typ}" for name, typ in self.types.items()])
        return f"""
struct Params {{ {members} }}
@group(0) @binding(0) var<uniform> U: Params;
fn off(i: u32) -> u32 {{ return U.offs[i >> 2u][i & 3u]; }}
fn lin(w: vec3<u32>, n: vec3<u32>) -> u32 {{ return w.x + w.y * n.x; }}
"""

    def source(self, body: str, before: str = "") -> str:
        """The kernel's whole source: `before` (an enable directive), the header, the body. Every field the
        body reads must be declared."""
        unknown = set(re.findall(r"\bU\.(\w+)", body)) - set(self.types) - {"offs"}
        if unknown:
            raise ValueError(f"a kernel reads parameter fields {sorted(unknown)} its block does not declare "
                             f"({' '.join(self.types)})")
        return before + self.header() + body

    def pack(self, kernel: str, values: dict) -> list[tuple[int, str, object]]:
        """(word, type, value) of every field; a tuple value is filled at run time (a weight's scale-plane
        offset). Every field must be given, and no other."""
        missing, extra = set(self.types) - set(values), set(values) - set(self.types)
        if missing or extra:
            raise ValueError(f"kernel {kernel}: parameters missing {sorted(missing)}, unknown {sorted(extra)}; "
                             f"its block has {' '.join(self.types)}")
        return [(self.word[name], self.types[name], values[name]) for name in self.types]


# the entry point of the one-thread-per-element kernels: thread i of the U.n elements
_EACH_ELEMENT = source("each_element")
# element i's 4-D index (i0, i1, i2, i3) in the shape (U.d0, U.d1, U.d2, U.d3)
_INDEX4 = source("index4")

NEG_BIG = "-3.0e38"   # a masked score: finite, so no inf - inf arithmetic ever happens


# ------------------------------------------------------------------------------------------------------
# element-wise
# ------------------------------------------------------------------------------------------------------

BINARY = source("binary", each_element=_EACH_ELEMENT, index4=_INDEX4)
BINARY_PARAMS = Params("n d0 d1 d2 d3 b0 b1 b2 b3 op")   # d: a's shape, b: b's (4-D); op 0 add, 1 mul

ACT = source("act")

UNARY_CODE = {"gelu": 1, "silu": 2, "tanh": 3}   # act()'s op codes (UNARY's 0 is SCALE)
GLU_CODE = {"geglu": 1, "swiglu": 2}

UNARY = source("unary", act=ACT, each_element=_EACH_ELEMENT)
UNARY_PARAMS = Params("n op scale:f32")   # op 0 scale, 1 gelu, 2 silu, 3 tanh

GLU = source("glu", act=ACT, each_element=_EACH_ELEMENT)
GLU_PARAMS = Params("n op")   # op 1 geglu, 2 swiglu

# the entry point of the one-workgroup-per-row kernels (128 threads): row `row` of U.nrows, U.ncols long
_EACH_ROW = source("each_row")

# RMS norm of each row, optionally times a gain vector (the models' norm: RMS_NORM then MUL)
RMS_NORM = source("rms_norm", each_row=_EACH_ROW)
RMS_NORM_PARAMS = Params("ncols nrows eps:f32 has_gain gain_len")   # the gain (gain_len values) repeats along the row

SOFT_MAX = source("soft_max", each_row=_EACH_ROW, neg_big=NEG_BIG)
SOFT_MAX_PARAMS = Params("ncols nrows mask_rows has_mask scale:f32")

# ARGMAX: each row's columns in parts, a workgroup a part, then a workgroup a row combining them
_ARGMAX_REDUCE = source("argmax_reduce")        # the workgroup's (value, index, not-finite) reduction both use
ARGMAX_PART = source("argmax_part", reduce=_ARGMAX_REDUCE)
ARGMAX_PART_PARAMS = Params("ncols nrows nb per")
ARGMAX = source("argmax", reduce=_ARGMAX_REDUCE)
ARGMAX_PARAMS = Params("nrows nb")

# Attention of one query row of one head per workgroup, online softmax over tiles of 64 keys.
def _online_softmax(end: str = "S") -> str:
    """One key block's step of the online softmax, shared by the attention kernels: the block's largest
    score, its weights, their sum, and the running sum and output rescaled to the new maximum. `end`:
    the first key past the ones this workgroup attends to."""
    return f"""    red[li] = sc;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {{
      if (li < k) {{ red[li] = max(red[li], red[li + k]); }}
      workgroupBarrier();
    }}
    let mn = max(m, red[0]);
    workgroupBarrier();
    var p = 0.0;
    if (s < {end}) {{ p = exp(sc - mn); }}
    ps[li] = p;
    red[li] = p;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {{
      if (li < k) {{ red[li] += red[li + k]; }}
      workgroupBarrier();
    }}
    let alpha = exp(m - mn);
    l = l * alpha + red[0];
    acc = acc * alpha;
    let nv = min(64u, {end} - s0);
"""


FLASH_ATTN = source("flash_attn", neg_big=NEG_BIG, online_softmax=_online_softmax())
FLASH_ATTN_PARAMS = Params("t h hkv d s has_mask scale:f32")   # T query rows, H heads over Hkv, head size D, S keys

# The one-workgroup-per-row kernel's lines and the split kernel's (flash decoding: few query rows,
# T * H small, leave most of the GPU idle, so the keys are cut into NC chunks, one workgroup per
# (query row, head, chunk) writing its partial (max, sum, acc[D]); FLASH_COMBINE combines the chunks)
_FLASH4_WHOLE = {
    "out": "@group(0) @binding(5) var<storage, read_write> O: array<vec4<f32>>;",
    "rows": "  let id = lin(w, nw);\n  if (id >= T * H) { return; }",
    "first": "0u", "end": "S",
    "store": "  if (li < D4) { O[off(4u) / 4u + (t * H + h) * D4 + li] = acc / l; }",
}
_FLASH4_SPLIT = {
    "out": "@group(0) @binding(5) var<storage, read_write> P: array<vec4<f32>>;   // per part: acc[D/4], then (m, l)",
    "rows": ("  let NC = U.nc;\n  let idc = lin(w, nw);\n  if (idc >= T * H * NC) { return; }\n"
             "  let id = idc / NC; let c = idc % NC;\n  let c0 = c * U.chunk; let c1 = min(S, c0 + U.chunk);"),
    "first": "c0", "end": "c1",
    "store": ("  let pb = off(4u) / 4u + idc * (D4 + 1u);\n  if (li < D4) { P[pb + li] = acc; }\n"
              "  if (li == 0u) { P[pb + D4] = vec4<f32>(m, l, 0.0, 0.0); }"),
}


FLASH_SPLIT_PARAMS = Params("t h hkv d s has_mask scale:f32 nc chunk")   # FLASH_ATTN's, nc chunks of `chunk` keys


def flash_attn4(split: bool = False) -> str:
    """Attention with vec4 loads (D a multiple of 4, offsets too): a thread's key row is D/4 loads, its
    output one vec4. split: the keys of one chunk per workgroup, a partial result out (flash decoding)."""
    v = _FLASH4_SPLIT if split else _FLASH4_WHOLE
    return source("flash_attn4", out=v["out"], rows=v["rows"], neg_big=NEG_BIG, first=v["first"], end=v["end"],
                  online_softmax=_online_softmax(v["end"]), store=v["store"])


FLASH_COMBINE = source("flash_combine", neg_big=NEG_BIG)
FLASH_COMBINE_PARAMS = Params("rows d nc")   # rows: T * H; nc chunks

# Rotary embedding; cos and sin of every (position, frequency) come from a table made on the host
# in float64 (as the CPU plugin does), so no GPU trigonometry of large angles is involved.
ROPE = source("rope")
ROPE_PARAMS = Params("t h d n_dims neox")

SET_ROWS = source("set_rows")
SET_ROWS_PARAMS = Params("w t dst_rows")   # w: row width, t: rows written

# A strided (4-D) gather into a contiguous tensor: CONT of a permuted view
CONT = source("cont", each_element=_EACH_ELEMENT, index4=_INDEX4)
CONT_PARAMS = Params("n d0 d1 d2 d3 st0 st1 st2 st3")   # d: the output's shape, st: the source's strides (4-D)

GET_ROWS_F32 = source("get_rows_f32")
GET_ROWS_F32_PARAMS = Params("w t row0 rows")   # row0, rows: this chunk's

LOAD_F32 = "return A[i];"
LOAD_F16 = "return unpack2x16float(A[i >> 1u])[i & 1u];"

# Generic batched product of two float tensors (activations, or an F32/F16 weight):
# a (A0, A1, N, K), b (B0, B1, M, K) -> (B0, B1, M, N); a's batch axes repeat to b's (ggml).
MUL_MAT_F = source("mul_mat_f")
# a0, a1 / b0, b1: batch axes; row0, rows: this chunk's; ld: the output's row stride
MUL_MAT_F_PARAMS = Params("n m k a0 a1 b0 b1 row0 rows ld")

# ------------------------------------------------------------------------------------------------------
# quantized weights: one group accessor per type (see quant.py for the layouts)
# ------------------------------------------------------------------------------------------------------

# Every kernel that reads a quantized weight sees it through ``grp(row, group)``: a 32-element group as
# 8 words of unsigned byte codes (``lo``: elements 0..15, ``hi``: 16..31, four elements a word, one a
# byte) plus the scales: element e is (code_e - zero point) * (a for lo, b for hi) + m. Codes become
# floats through ``f4``, which needs no int-to-float conversion: conversions run at a quarter of the
# FMA rate on NVIDIA GPUs and made the matrix-vector kernels compute-bound.
Q_GROUP = "struct G { lo: vec4<u32>, hi: vec4<u32>, a: f32, b: f32, m: f32 }\n"
Q_ROW = """var<private> gpr: u32;    // 32-element groups per row
var<private> moff: u32;   // word offset of the f16 scale plane
"""
Q_CONSTS = """const M4 = vec4<u32>(0x0F0F0F0Fu);     // the low nibble of every byte
const BSH = vec4<u32>(0u, 8u, 16u, 24u);
"""
Q_F4 = source("q_f4")
Q_COMMON = "\n" + Q_GROUP + Q_ROW + Q_CONSTS + Q_F4
# the weight binding, and dpf(b): block b's f16 scale d from the scale plane (two a word)
W_SCALAR = source("w_scalar")
W_VEC4 = source("w_vec4")

# type -> (zero point, has a min term m, grp); blocks of 16-byte multiples are read as vec4<u32>
QTYPES = {
    # 4 words of nibbles per block (bytes i: elements i and i + 16); d in the scale plane
    "Q4_0": (8, False, """
fn grp(r: u32, g: u32) -> G {
  let b = r * gpr + g;
  let q = W[b];
  let d = dpf(b);
  return G(q & M4, (q >> vec4<u32>(4u)) & M4, d, d, 0.0);
}
"""),
    # the GGUF block as it is: (d, m), then 4 words of nibbles
    "Q4_1": (0, True, """
fn grp(r: u32, g: u32) -> G {
  let b = (r * gpr + g) * 5u;
  let dm = unpack2x16float(W[b]);
  let q = vec4<u32>(W[b + 1u], W[b + 2u], W[b + 3u], W[b + 4u]);
  return G(q & M4, (q >> vec4<u32>(4u)) & M4, dm.x, dm.x, dm.y);
}
"""),
    # qh (bit i: element i's fifth bit), then 4 words of nibbles; d in the scale plane
    "Q5_0": (16, False, """
// 4 bits -> bit 4 of each of 4 bytes (the multiply puts copies of bit k at 8k, with no carries)
fn spread4(h: vec4<u32>) -> vec4<u32> { return ((h * 0x00204081u) & vec4<u32>(0x01010101u)) << vec4<u32>(4u); }
fn grp(r: u32, g: u32) -> G {
  let b = r * gpr + g;
  let qh = vec4<u32>(W[b * 5u]);
  let q = vec4<u32>(W[b * 5u + 1u], W[b * 5u + 2u], W[b * 5u + 3u], W[b * 5u + 4u]);
  let hl = spread4((qh >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(0xFu));
  let hh = spread4((qh >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(0xFu));
  let d = dpf(b);
  return G((q & M4) | hl, ((q >> vec4<u32>(4u)) & M4) | hh, d, d, 0.0);
}
"""),
    # 8 words of signed bytes per block; d in the scale plane. XOR 0x80 makes a signed byte s the
    # unsigned s + 128.
    "Q8_0": (128, False, """
fn grp(r: u32, g: u32) -> G {
  let b = r * gpr + g;
  let d = dpf(b);
  let f = vec4<u32>(0x80808080u);
  return G(W[2u * b] ^ f, W[2u * b + 1u] ^ f, d, d, 0.0);
}
"""),
    # the GGUF super-block as it is (9 vec4): (d, dmin) and 12 bytes of 6-bit scales and mins, then
    # 128 bytes of nibbles: groups 2i and 2i + 1 are the low and high nibbles of 32 bytes
    "Q4_K": (0, True, """
fn grp(r: u32, g: u32) -> G {
  let sb = r * (gpr >> 3u) + (g >> 3u);
  let s = g & 7u;
  let h = W[sb * 9u];
  let dm = unpack2x16float(h.x);
  // bytes s (word h.y or h.z), s + 4 (h.z or h.w) and s - 4 (h.y) of the 12 scale bytes; no branch:
  // the lanes of a warp hold different s
  let sh8 = 8u * (s & 3u);
  let lo4 = s < 4u;
  let b0 = (select(h.z, h.y, lo4) >> sh8) & 0xFFu;
  let b1 = (select(h.w, h.z, lo4) >> sh8) & 0xFFu;
  let bm = (h.y >> sh8) & 0xFFu;
  let sc = select((b1 & 0xFu) | ((bm >> 6u) << 4u), b0 & 63u, lo4);
  let mn = select((b1 >> 4u) | ((b0 >> 6u) << 4u), b1 & 63u, lo4);
  let qi = sb * 9u + 1u + 2u * (s >> 1u);
  let sh = vec4<u32>((s & 1u) * 4u);
  let d = dm.x * f32(sc);
  return G((W[qi] >> sh) & M4, (W[qi + 1u] >> sh) & M4, d, d, -dm.y * f32(mn));
}
"""),
    # ql (8 vec4), qh (4 vec4), 16 signed scales (1 vec4) per super-block; d in the scale plane.
    # Group gg: half n = gg / 4 of the super-block, quarter qd = gg % 4: low bits from ql's nibble
    # qd / 2, high bits from qh's bit pair qd.
    "Q6_K": (32, False, """
fn grp(r: u32, g: u32) -> G {
  let sb = r * (gpr >> 3u) + (g >> 3u);
  let gg = g & 7u;
  let n = gg >> 2u; let qd = gg & 3u;
  let base = sb * 13u;
  let li = base + 4u * n + 2u * (qd & 1u);
  let lsh = vec4<u32>((qd >> 1u) * 4u);
  let hsh = vec4<u32>(2u * qd);
  let h2 = vec4<u32>(0x03030303u);
  let lo = ((W[li] >> lsh) & M4) | (((W[base + 8u + 2u * n] >> hsh) & h2) << vec4<u32>(4u));
  let hi = ((W[li + 1u] >> lsh) & M4) | (((W[base + 9u + 2u * n] >> hsh) & h2) << vec4<u32>(4u));
  let si = 8u * n + 2u * qd;
  let scw = W[base + 12u][si >> 2u];
  let d = dpf(sb);
  return G(lo, hi, d * f32(bitcast<i32>(scw << (24u - 8u * (si & 3u))) >> 24u),
           d * f32(bitcast<i32>(scw << (16u - 8u * (si & 3u))) >> 24u), 0.0);
}
"""),
}
VEC4_TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")   # blocks (and scale planes) aligned to 16 bytes


def q_source(qtype: str) -> str:
    """The weight binding, grp, dot32 and deq_lo / deq_hi of a weight type."""
    zero, _, grp = QTYPES[qtype]
    w = W_VEC4 if qtype in VEC4_TYPES else W_SCALAR
    return f"const QZ: f32 = {8388608 + zero}.0;   // 2^23 + zero point\n" + w + Q_COMMON + grp + deq_fns(qtype)


# the names a weight's accessors define; weight_source() gives each weight of a kernel its own
WEIGHT_NAMES = ("QZ", "W", "dpf", "gpr", "moff", "f4", "grp", "spread4", "dot32q", "dot32", "deq_lo", "deq_hi")


def weight_source(qtype: str, suffix: str, binding: int) -> str:
    """q_source's accessors for one of several weights of a kernel: the weight bound at `binding`, every
    name of WEIGHT_NAMES with `suffix` (grp0, dot320, ...), struct G and the byte constants left to
    the kernel (Q_GROUP, Q_CONSTS, once)."""
    zero, _, grp = QTYPES[qtype]
    w = W_VEC4 if qtype in VEC4_TYPES else W_SCALAR
    assert w.count("@binding(1)") == 1
    own = (f"const QZ: f32 = {8388608 + zero}.0;   // 2^23 + zero point\n"
           + w.replace("@binding(1)", f"@binding({binding})")
           + Q_ROW + Q_F4 + grp + deq_fns(qtype))
    return re.sub(r"\b(" + "|".join(WEIGHT_NAMES) + r")\b", lambda m: m.group(1) + suffix, own)


def deq_fns(qtype: str) -> str:
    """From the type's grp: dot32 (a group's dot product with 32 values of x, the scales factored out
    of the sums), dot32q (the same with x in 8 bits) and deq_lo / deq_hi (4 values of a group)."""
    has_min = QTYPES[qtype][1]
    m_dot = " + q.m * dot(x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6] + x[7], vec4<f32>(1.0))" if has_min else ""
    m_deq = " + q.m" if has_min else ""
    lo = " + ".join(f"dot(f4(q.lo[{k}]), x[{k}])" for k in range(4))
    hi = " + ".join(f"dot(f4(q.hi[{k}]), x[{k + 4}])" for k in range(4))
    zero = QTYPES[qtype][0]
    fx = " ^ 0x80808080u" if zero == 128 else ""     # Q8_0: back to its signed bytes, zero point 0
    zi = 0 if zero == 128 else zero
    lo_i = " + ".join(f"dot4I8Packed(q.lo[{k}]{fx}, xa[{k}])" for k in range(4))
    hi_i = " + ".join(f"dot4I8Packed(q.hi[{k}]{fx}, xb[{k}])" for k in range(4))
    z0 = f" - {zi} * bitcast<i32>(xc.y)" if zi else ""
    z1 = f" - {zi} * bitcast<i32>(xc.z)" if zi else ""
    m_q = " + q.m * bitcast<f32>(xc.w)" if has_min else ""
    return f"""
// the same with x in 8 bits (QUANT_X's groups xa, xb, xc): integer dot products of 4 byte pairs,
// the zero point taken out through the sums of x's codes
fn dot32q(r: u32, g: u32, xa: vec4<u32>, xb: vec4<u32>, xc: vec4<u32>) -> f32 {{
  let q = grp(r, g);
  let s0 = {lo_i};
  let s1 = {hi_i};
  return bitcast<f32>(xc.x) * (q.a * f32(s0{z0}) + q.b * f32(s1{z1})){m_q};
}}
fn dot32(r: u32, g: u32, x: array<vec4<f32>, 8>) -> f32 {{
  let q = grp(r, g);
  return q.a * ({lo}) + q.b * ({hi}){m_dot};
}}
// values 4j..4j+3 (lo) and 16+4j..16+4j+3 (hi) of a group
fn deq_lo(q: G, j: u32) -> vec4<f32> {{ return f4(q.lo[j]) * q.a{m_deq}; }}
fn deq_hi(q: G, j: u32) -> vec4<f32> {{ return f4(q.hi[j]) * q.b{m_deq}; }}
"""


# Matrix-vector product (decode): TPR threads of a team split the groups of R weight rows; WG / TPR
# teams per workgroup; MM rows of x (M <= MM). Each thread loads a group of x once and uses it for its
# R rows. The team's partial sums meet through subgroup shuffles where the team lies in one subgroup
# (no workgroup memory, no barriers), else in workgroup memory. Unrolled: no private arrays but the
# 8 vec4 of x.
MATVEC = source("matvec")
# n: rows of this chunk, gpr: groups per row, moff: scale-plane offset, ld: output row stride, col0: the
# chunk's first output column
MATVEC_PARAMS = Params("n k m gpr moff ld col0")

X_F32 = source("x_f32")
X_Q8 = "@group(0) @binding(2) var<storage, read> X: array<vec4<u32>>;   // QUANT_X's groups\n"

# a thread per 32-element group of x: the group's eight vec4s and their largest magnitude, m4 (the
# prologue of QUANT_X and HALF_X, which scale x per group to 8 bits and to f16)
_GROUP_OF_X = _EACH_ELEMENT + """
  let b = off(0u) / 4u + i * 8u;
  let x0 = X[b]; let x1 = X[b + 1u]; let x2 = X[b + 2u]; let x3 = X[b + 3u];
  let x4 = X[b + 4u]; let x5 = X[b + 5u]; let x6 = X[b + 6u]; let x7 = X[b + 7u];
  let m4 = max(max(max(abs(x0), abs(x1)), max(abs(x2), abs(x3))), max(max(abs(x4), abs(x5)), max(abs(x6), abs(x7))));
""".removeprefix("\n")

# Activations to 8 bits for the matrix-vector kernel (as ggml's q8_1 does): per 32-element group,
# codes q = round(x / d) with d = max|x| / 127, as 3 vec4: the 32 codes (int8, 4 a word), then
# (d, sum of codes 0..15, sum of codes 16..31, sum of x). One thread a group.
Q8_FNS = source("q8_fns")
# from a group's eight vec4s x0..x7 and their largest magnitudes m4: its codes lo, hi, scale d and sum sx
Q8_GROUP = source("q8_group")
QUANT_X = source("quant_x", q8_fns=Q8_FNS, group_of_x=_GROUP_OF_X, q8_group=Q8_GROUP)
QUANT_X_PARAMS = Params("n")   # n: groups of x (M * K / 32)


# the team's sums to its lane 0: in workgroup memory (a fixed tree, barriers)
RED_SHARED = source("red_shared")

# ... or by butterfly shuffles inside the subgroup holding the team (TPR <= the subgroup size)
RED_SUBGROUP = """  for (var s = TPR / 2u; s > 0u; s >>= 1u) {{
{step}
  }}"""


def team_reduction(accs: list[str], wg: int, subgroup: bool) -> tuple[str, str]:
    """(the workgroup array it needs, the code) summing each of accs over a team of TPR threads to its lane 0."""
    if subgroup:
        return "", RED_SUBGROUP.format(step="\n".join(f"    {a} += subgroupShuffleXor({a}, s);" for a in accs))
    return f"var<workgroup> red: array<f32, {wg * len(accs)}>;", RED_SHARED.format(
        store="\n".join(f"  red[{i}u * WG + li] = {a};" for i, a in enumerate(accs)),
        step="\n".join(f"      red[{i}u * WG + li] += red[{i}u * WG + li + s];" for i in range(len(accs))),
        load="\n".join(f"  {a} = red[{i}u * WG + li];" for i, a in enumerate(accs)))


def matvec(qtype: str, tpr: int, mm: int, r: int = 1, subgroup: bool = False, wg: int = 256,
           x8: bool = False) -> str:
    """x8: x comes as QUANT_X's 8-bit groups (integer dot products), else as f32."""
    accs = [f"a{m}_{k}" for m in range(mm) for k in range(r)]
    decl = "\n".join(f"  var {a} = 0.0;" for a in accs)
    rows = "\n".join(f"    let row{k} = min(r0 + {k}u, N - 1u);" for k in range(r))
    body = []
    for m in range(mm):
        guard = f"if (M > {m}u) " if m else ""
        if x8:
            load = (f"let xi{m} = x4 + ({m}u * gpr + g) * 3u; "
                    f"let xa{m} = X[xi{m}]; let xb{m} = X[xi{m} + 1u]; let xc{m} = X[xi{m} + 2u];")
            inner = " ".join(f"a{m}_{k} += dot32q(row{k}, g, xa{m}, xb{m}, xc{m});" for k in range(r))
        else:
            load = f"let x{m} = xg(kb + {m}u * K4);"
            inner = " ".join(f"a{m}_{k} += dot32(row{k}, g, x{m});" for k in range(r))
        body.append(f"      {guard}{{ {load} {inner} }}")
    red_decl, reduce = team_reduction(accs, wg, subgroup)
    store = "\n".join(f"    if (M > {m}u && r0 + {k}u < N) {{ O[ob + {m}u * ld + {k}u] = a{m}_{k}; }}"
                      for m in range(mm) for k in range(r))
    return MATVEC_PARAMS.source(MATVEC.format(
        xdecl=X_Q8 if x8 else X_F32, deq=q_source(qtype), tpr=tpr, rpw=wg // tpr, wg=wg, red_decl=red_decl, r=r,
        decl=decl, rows=rows, body="\n".join(body), reduce=reduce, store=store))


# Register-tiled matrix product (prefill): each thread computes a BM x BN block of outputs straight
# from global memory (no workgroup memory, no barriers: what Mesa's lavapipe runs well, and on a GPU
# the x rows are shared by the warp through the cache); weight values are decoded once per block and
# used BM times, x values used BN times.
MATMUL_REG = source("matmul_reg")
MATMUL_REG_PARAMS = Params("n k m gpr moff ld col0 nbn")   # MATVEC's, and nbn: blocks along N

# Workgroup-memory tiled matrix product (prefill on a GPU): a workgroup computes a BM x BN tile of
# outputs (BM rows of x, BN weight rows), each thread 4 x 4 of them (rows tm + i BM/4, columns
# tn + j BN/4: neighbours write neighbouring outputs). Per step of KG 32-element groups, the workgroup
# copies x's tile and the weight's tile, dequantized once, into workgroup memory (row-major, a row
# padded by one vec4 so that the rows a warp reads fall in different banks), and fetches the next
# step's tiles into registers while this one is multiplied, hiding the global latency. Generated
# unrolled: wgpu bounds every loop with a counter, which keeps the driver from unrolling, and a
# dynamically indexed private vector would live in local memory. Split-K: workgroup s of S sums
# groups [s GS, (s + 1) GS) and writes its partial tile to its own plane of O (stride U.plane);
# MATMUL_SPLIT_SUM adds the planes in a fixed order.
MATMUL_TILE = source("matmul_tile")
# MATVEC's, nbn tiles along N, gps groups per split, plane: a split's stride in O (0 without a split)
MATMUL_TILE_PARAMS = Params("n k m gpr moff ld col0 nbn gps splits plane")

# x's item e of a step (e < BM * 8 KG vec4): row e % BM, vec4 q = e / BM of the step's 8 KG; out of
# the split's groups it reads a valid address and is zeroed. Weight item e (< BN * 4 KG): row e % BN,
# group r / 4 of the step, quarter j = r % 4: 4 values of each half of the group.
TILE_FETCH_X = """{{ let e = li + {l}u * NT; let q = e / BM; let gg = G + q / 8u;
  let v = X[x4 + min(m0 + e % BM, M - 1u) * K4 + min(gg, gpr - 1u) * 8u + q % 8u];
  rx{l} = select(vec4<f32>(0.0), v, gg < g1); }}"""
TILE_FETCH_W = source("tile_fetch_w")
TILE_PUT_X = "{{ let e = li + {l}u * NT; xs[(e % BM) * RS + e / BM] = rx{l}; }}"
TILE_PUT_W = """{{ let e = li + {l}u * NT; let r = e / BN; let o = (e % BN) * RS + 8u * (r / 4u) + r % 4u;
  ws[o] = rl{l}; ws[o + 4u] = rh{l}; }}"""

# MATMUL_TILE16_NOTE -- the f16 variant of the tiled product (adapters with shader-f16). Gemma's
# activations reach ~1e5, beyond f16's range, and dot products over K = 2048 would lose too much in f16,
# so f16 holds only what fits it exactly or nearly: the weight's codes less the zero point (small
# integers, exact in f16) with the scales kept apart in f32, and x divided by its 32-element group's
# largest magnitude (HALF_X: |x| <= 1 in f16, the scale and the group's sum in f32). A group's 32
# products are summed in f16 (packed vec4<f16> FMAs: two elements an instruction), each sum at most
# 32 * 128 in magnitude; that partial goes to f32, times x's and the weight's scales, into the f32
# accumulators (Q6_K: one partial per 16-element half, each half has its own scale; Q4_1 / Q4_K add
# m times x's group sum; their codes 0..15 are stored less 8 and m takes 8 a: uncentred codes made the
# f16 sum large and the min term cancel most of it, NMSE 1.8e-2 on Gemma 3's prefill logits on the
# H200). Codes become f16 by conversion of f4's exact f32 values. The tiles hold 8
# halves an element (H8, 16 bytes: one shared-memory load for two packed FMAs per output); naga cannot
# bitcast u32 words to f16 vectors (it keeps the width), so nothing passes through u32 but HALF_X's output,
# which the tiled kernel reads as H8 (binding 2) and, for the scales, as vec4<f32> (binding 4).
TILE16_FNS = source("tile16_fns")
XS_BIND = """
struct H8 { a: vec4<f16>, b: vec4<f16> }   // 8 consecutive halves
@group(0) @binding(4) var<storage, read> XS: array<vec4<f32>>;   // the same buffer: (scale, sum) of x's groups"""
# x item e (< BM * 4 KG H8): row e % BM, H8 q = e / BM of the step (group q / 4, eighth q % 4);
# scale item e (< BM KG): row e % BM, group e / BM; weight item e (< BN KG): a whole group, row e % BN.
TILE16_FETCH_X = """{{ let e = li + {l}u * NT; let q = e / BM; let gg = G + q / 4u;
  let v = X[x4 + (min(m0 + e % BM, M - 1u) * gpr + min(gg, gpr - 1u)) * 5u + q % 4u];
  rx{l} = v; if (gg >= g1) {{ rx{l} = H8(vec4<f16>(0.0h), vec4<f16>(0.0h)); }} }}"""
TILE16_FETCH_S = """{{ let e = li + {l}u * NT; let gg = G + e / BM;
  let v = XS[off(3u) / 4u + (min(m0 + e % BM, M - 1u) * gpr + min(gg, gpr - 1u)) * 5u + 4u];
  rs{l} = select(vec4<f32>(0.0), v, gg < g1); }}"""
TILE16_FETCH_W = """if (li + {l}u * NT < BN * KG) {{ let e = li + {l}u * NT; let gg = G + e / BN;
  rq{l} = grp(min(n0 + e % BN, N - 1u), min(gg, gpr - 1u));
  if (gg >= g1) {{ rq{l}.a = 0.0; rq{l}.b = 0.0; rq{l}.m = 0.0; }} }}"""
TILE16_PUT_S = "{{ let e = li + {l}u * NT; if (e < BM * KG) {{ xd[(e % BM) * KG + e / BM] = rs{l}.xy; }} }}"
TILE16_PUT_W = source("tile16_put_w")
TWO_SCALES = ("Q6_K",)    # types whose halves of a group have scales of their own

# x for the f16 tiled product, per 32-element group (one thread each): 4 vec4<u32> of the 32 values
# divided by the group's largest magnitude d, as f16 (two a word), then (d, sum of x, 0, 0). Made once
# per value, as QUANT_X.
HALF_X = source("half_x", group_of_x=_GROUP_OF_X)
HALF_X_PARAMS = Params("n")   # n: groups of x (M * K / 32)

MATMUL_SPLIT_SUM = source("matmul_split_sum")
MATMUL_SPLIT_SUM_PARAMS = Params("n m splits plane ld col0")   # plane: stride of a split (M * N)

# Rows of a quantized weight (the token embedding): one thread per 8 values (4 of each half of a group)
GET_ROWS_Q = source("get_rows_q")
GET_ROWS_Q_PARAMS = Params("w t row0 rows gpr moff")   # GET_ROWS_F32's, gpr groups per row, moff the scale-plane offset


def matmul_reg(qtype: str, bm: int = 4, bn: int = 4) -> str:
    decl = [f"  var a{m}_{n} = 0.0;" for m in range(bm) for n in range(bn)]
    decl += [f"  let xr{m} = x4 + min(m0 + {m}u, M - 1u) * K4;" for m in range(bm)]
    decl += [f"  let wr{n} = min(n0 + {n}u, N - 1u);" for n in range(bn)]
    body = []
    for n in range(bn):
        body.append(f"      let q{n} = grp(wr{n}, g); let wl{n} = deq_lo(q{n}, j); let wh{n} = deq_hi(q{n}, j);")
    body.append("      let xo = g * 8u + j;")
    for m in range(bm):
        body.append(f"      let xa{m} = X[xr{m} + xo]; let xb{m} = X[xr{m} + xo + 4u];")
        for n in range(bn):
            body.append(f"      a{m}_{n} += dot(wl{n}, xa{m}) + dot(wh{n}, xb{m});")
    store = []
    for m in range(bm):
        for n in range(bn):
            store.append(f"  if (m0 + {m}u < M && n0 + {n}u < N) "
                         f"{{ O[ob + (m0 + {m}u) * ld + n0 + {n}u] = a{m}_{n}; }}")
    return MATMUL_REG_PARAMS.source(MATMUL_REG.format(deq=q_source(qtype), bm=bm, bn=bn, decl="\n".join(decl),
                                                     body="\n".join(body), store="\n".join(store)))


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def matmul_tile(qtype: str, bm: int, bn: int, kg: int, f16: bool = False) -> str:
    """The workgroup-memory tiled product: a BM x BN tile per workgroup of BM * BN / 16 threads, KG
    groups of K per step; f16: the half-precision variant (MATMUL_TILE16_NOTE)."""
    nt = bm * bn // 16
    parts = (_tile16_parts if f16 else _tile32_parts)(qtype, bm, bn, kg, nt)
    regs, fetch, put, mul = parts.pop("regs"), parts.pop("fetch"), parts.pop("put"), parts.pop("mul")
    regs += [f"  var a{i}{j} = 0.0;" for i in range(4) for j in range(4)]
    regs += [f"  let xr{i} = (tm + {i}u * (BM / 4u)) * RS; let wr{i} = (tn + {i}u * TN) * RS;" for i in range(4)]
    store = "\n".join(
        f"  {{ let m = m0 + tm + {i}u * (BM / 4u); let n = n0 + tn + {j}u * TN;"
        f" if (m < M && n < N) {{ O[ob + m * ld + n] = a{i}{j}; }} }}" for i in range(4) for j in range(4))
    enable = "enable f16;\n" if f16 else ""
    return MATMUL_TILE_PARAMS.source(MATMUL_TILE.format(
        deq=q_source(qtype), bm=bm, bn=bn, kg=kg, nt=nt, regs="\n".join(regs),
        fetch0=_indent(fetch.replace("G +", "g0 +"), 2), put=_indent(put, 4),
        fetch=_indent(fetch.replace("G +", "gn +"), 6), mul=mul, store=store, **parts), before=enable)


def _tile32_parts(qtype: str, bm: int, bn: int, kg: int, nt: int) -> dict:
    """f32 tiles: x as it is, the weight dequantized; 16 dot products per vec4 step."""
    lx, lw = bm * 8 * kg, bn * 4 * kg          # items of x and of the weight per step
    assert lx % nt == 0 and lw % nt == 0, (bm, bn, kg)
    lx, lw = lx // nt, lw // nt
    regs = [f"  var rx{l}: vec4<f32>;" for l in range(lx)]
    regs += [f"  var rl{l}: vec4<f32>; var rh{l}: vec4<f32>;" for l in range(lw)]
    fetch = [TILE_FETCH_X.format(l=l) for l in range(lx)] + [TILE_FETCH_W.format(l=l) for l in range(lw)]
    put = [TILE_PUT_X.format(l=l) for l in range(lx)] + [TILE_PUT_W.format(l=l) for l in range(lw)]
    mul = []
    for k in range(8 * kg):                   # 4 vec4 of x, 4 of the weight, 16 dot products
        mul.append(" ".join(f"let x{i} = xs[xr{i} + {k}u];" for i in range(4)))
        mul.append(" ".join(f"let w{j} = ws[wr{j} + {k}u];" for j in range(4)))
        mul.append(" ".join(f"a{i}{j} += dot(x{i}, w{j});" for i in range(4) for j in range(4)))
    mul = "\n".join("    { " + " ".join(mul[3 * k:3 * k + 3]) + " }" for k in range(8 * kg))
    shared = (f"var<workgroup> xs: array<vec4<f32>, {(8 * kg + 1) * bm}>;\n"
              f"var<workgroup> ws: array<vec4<f32>, {(8 * kg + 1) * bn}>;")
    return {"regs": regs, "fetch": "\n".join(fetch), "put": "\n".join(put), "mul": mul,
            "xt": "vec4<f32>", "xs_bind": "", "rs": 8 * kg + 1, "shared": shared}


def _tile16_parts(qtype: str, bm: int, bn: int, kg: int, nt: int) -> dict:
    """f16 tiles (MATMUL_TILE16_NOTE): x from HALF_X, weight codes as f16 and scales apart."""
    lx = bm * 4 * kg                          # vec4<u32> of x (8 halves each) per step
    assert lx % nt == 0, (bm, bn, kg)
    lx, ls, lw = lx // nt, -(-bm * kg // nt), -(-bn * kg // nt)
    regs = [f"  var rx{l}: H8;" for l in range(lx)]
    regs += [f"  var rs{l}: vec4<f32>;" for l in range(ls)]
    regs += [f"  var rq{l}: G;" for l in range(lw)]
    regs += [f"  let xq{i} = (tm + {i}u * (BM / 4u)) * KG; let wq{i} = (tn + {i}u * TN) * KG;" for i in range(4)]
    fetch = ([TILE16_FETCH_X.format(l=l) for l in range(lx)] + [TILE16_FETCH_S.format(l=l) for l in range(ls)]
             + [TILE16_FETCH_W.format(l=l) for l in range(lw)])
    put = ([TILE_PUT_X.format(l=l) for l in range(lx)] + [TILE16_PUT_S.format(l=l) for l in range(ls)]
           + [TILE16_PUT_W.format(l=l) for l in range(lw)])
    two = qtype in TWO_SCALES
    has_min = QTYPES[qtype][1]
    ij = [(i, j) for i in range(4) for j in range(4)]
    mul = []
    for gi in range(kg):
        lines = [" ".join(f"let xd{i} = xd[xq{i} + {gi}u];" for i in range(4)),
                 " ".join(f"let wd{j} = wd[wq{j} + {gi}u];" for j in range(4)),
                 " ".join(f"var p{i}{j}: vec4<f16>;" for i, j in ij)]
        for k in range(4):                    # 8 halves of x and of the weight a step, 2 vec4<f16> FMAs
            o = 4 * gi + k
            first = k == 0 or (two and k == 2)
            lines.append("{ " + " ".join(f"let x{i} = xs[xr{i} + {o}u]; let xa{i} = x{i}.a; let xb{i} = x{i}.b;"
                                         for i in range(4)))
            lines.append("  " + " ".join(f"let w{j} = ws[wr{j} + {o}u]; let wa{j} = w{j}.a; let wb{j} = w{j}.b;"
                                         for j in range(4)))
            lines.append("  " + " ".join(
                (f"p{i}{j} = fma(xb{i}, wb{j}, xa{i} * wa{j});" if first else
                 f"p{i}{j} = fma(xb{i}, wb{j}, fma(xa{i}, wa{j}, p{i}{j}));") for i, j in ij) + " }")
            if (two and k == 1) or k == 3:    # a half's (or the group's) partial sums into f32
                sc = "y" if two and k == 3 else "x"
                lines.append(" ".join(f"a{i}{j} = fma(hs(p{i}{j}), xd{i}.x * wd{j}.{sc}, a{i}{j});" for i, j in ij))
        if has_min:                           # m times the group's sum of x (f32)
            lines.append(" ".join(f"a{i}{j} = fma(wd{j}.z, xd{i}.y, a{i}{j});" for i, j in ij))
        mul.append("    {\n" + "\n".join("      " + line for line in lines) + "\n    }")
    shared = (f"var<workgroup> xs: array<H8, {(4 * kg + 1) * bm}>;\n"
              f"var<workgroup> ws: array<H8, {(4 * kg + 1) * bn}>;\n"
              f"var<workgroup> xd: array<vec2<f32>, {bm * kg}>;   // x's (scale, sum) per row and group\n"
              f"var<workgroup> wd: array<vec4<f32>, {bn * kg}>;   // the weight's (a, b, m) per row and group\n"
              + TILE16_FNS.format(hz=8 if has_min else 0))
    return {"regs": regs, "fetch": "\n".join(fetch), "put": "\n".join(put), "mul": "\n".join(mul),
            "xt": "H8", "xs_bind": XS_BIND, "rs": 4 * kg + 1, "shared": shared}


def get_rows_q(qtype: str) -> str:
    return GET_ROWS_Q_PARAMS.source(GET_ROWS_Q.format(deq=q_source(qtype)))


def get_rows_f(elem: str) -> str:
    load = LOAD_F16 if elem == "F16" else LOAD_F32
    return GET_ROWS_F32_PARAMS.source(GET_ROWS_F32.format(elem="u32" if elem == "F16" else "f32", load=load))


def mul_mat_f(elem: str) -> str:
    load = LOAD_F16 if elem == "F16" else LOAD_F32
    return MUL_MAT_F_PARAMS.source(MUL_MAT_F.format(elem="u32" if elem == "F16" else "f32", load=load))


# the kernels without variants: name -> (body, parameter block)
SIMPLE = {"binary": (BINARY, BINARY_PARAMS), "unary": (UNARY, UNARY_PARAMS), "glu": (GLU, GLU_PARAMS),
          "rms_norm": (RMS_NORM, RMS_NORM_PARAMS), "soft_max": (SOFT_MAX, SOFT_MAX_PARAMS),
          "argmax_part": (ARGMAX_PART, ARGMAX_PART_PARAMS), "argmax": (ARGMAX, ARGMAX_PARAMS),
          "flash_attn": (FLASH_ATTN, FLASH_ATTN_PARAMS), "flash_attn4": (flash_attn4(), FLASH_ATTN_PARAMS),
          "flash_attn_split": (flash_attn4(split=True), FLASH_SPLIT_PARAMS),
          "flash_combine": (FLASH_COMBINE, FLASH_COMBINE_PARAMS), "rope": (ROPE, ROPE_PARAMS),
          "set_rows": (SET_ROWS, SET_ROWS_PARAMS), "cont": (CONT, CONT_PARAMS), "quant_x": (QUANT_X, QUANT_X_PARAMS),
          "half_x": (HALF_X, HALF_X_PARAMS), "matmul_split_sum": (MATMUL_SPLIT_SUM, MATMUL_SPLIT_SUM_PARAMS)}

# every kernel family's parameter block, by the first word of its pipeline key (the lowering's emit)
PARAMS = {name: params for name, (_, params) in SIMPLE.items()} | {
    "get_rows_f": GET_ROWS_F32_PARAMS, "get_rows_q": GET_ROWS_Q_PARAMS, "mul_mat_f": MUL_MAT_F_PARAMS,
    "matvec": MATVEC_PARAMS, "matmul_reg": MATMUL_REG_PARAMS, "matmul_tile": MATMUL_TILE_PARAMS}


def simple(name: str) -> str:
    body, params = SIMPLE[name]
    return params.source(body)
