"""WGSL sources of every kernel, built from templates.

Conventions shared by all kernels:

* binding 0 is a uniform block of 32 u32 words: words 0..7 are the element offsets of the tensor
  bindings 1..8 (a tensor is a whole buffer bound at offset 0 plus an element offset, so views need no
  aligned binding offsets); words 8..31 are the kernel's own parameters (``pu(i)`` reads a u32,
  ``pf(i)`` an f32);
* workgroups are numbered in two dimensions (at most 65535 per dimension), ``lin()`` flattens them;
* every reduction runs in a fixed order, so a program run twice gives bit-identical results.

Quantized weights are read through ``deq8(row, group, piece)``: eight consecutive values (as two
vec4<f32>) of a 32-element group of a row; each weight type (quant.py says how its blocks are laid
out in device memory) brings its own ``deq8``. Where the adapter has shader-f16, dequantization
multiplies in f16 (``wt``) and the tiled matrix product keeps its weight tile in f16; sums
accumulate in f32 everywhere (Gemma's activations exceed f16's range).
"""

from __future__ import annotations

HEADER = """
@group(0) @binding(0) var<uniform> U: array<vec4<u32>, 8>;
fn pu(i: u32) -> u32 { return U[i >> 2u][i & 3u]; }
fn pf(i: u32) -> f32 { return bitcast<f32>(U[i >> 2u][i & 3u]); }
fn lin(w: vec3<u32>, n: vec3<u32>) -> u32 { return w.x + w.y * n.x; }
"""

NEG_BIG = "-3.0e38"   # a masked score: finite, so no inf - inf arithmetic ever happens


def header(f16: bool) -> str:
    if f16:
        return "enable f16;\nalias wt = f16;\n" + HEADER
    return "alias wt = f32;\n" + HEADER


# ------------------------------------------------------------------------------------------------------
# element-wise
# ------------------------------------------------------------------------------------------------------

BINARY = """
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
// 8: n, 9..12: a's shape (4-D), 13..16: b's shape, 17: op (0 add, 1 mul)
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = lin(w, nw) * 256u + li;
  if (i >= pu(8u)) { return; }
  let a1 = pu(10u); let a2 = pu(11u); let a3 = pu(12u);
  let i3 = i % a3; let r3 = i / a3; let i2 = r3 % a2; let r2 = r3 / a2; let i1 = r2 % a1; let i0 = r2 / a1;
  let b0 = pu(13u); let b1 = pu(14u); let b2 = pu(15u); let b3 = pu(16u);
  let bi = (((i0 % b0) * b1 + (i1 % b1)) * b2 + (i2 % b2)) * b3 + (i3 % b3);
  let x = A[pu(0u) + i];
  let y = B[pu(1u) + bi];
  var r: f32;
  if (pu(17u) == 0u) { r = x + y; } else { r = x * y; }
  O[pu(2u) + i] = r;
}
"""

ACT = """
fn gelu(x: f32) -> f32 {
  let t = tanh(clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -20.0, 20.0));
  return 0.5 * x * (1.0 + t);
}
fn silu(x: f32) -> f32 { return x / (1.0 + exp(-x)); }
fn act(op: u32, x: f32) -> f32 {
  if (op == 1u) { return gelu(x); }
  if (op == 2u) { return silu(x); }
  return tanh(clamp(x, -20.0, 20.0));
}
"""

UNARY = ACT + """
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;
// 8: n, 9: op (0 scale, 1 gelu, 2 silu, 3 tanh), 10: scale (f32)
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = lin(w, nw) * 256u + li;
  if (i >= pu(8u)) { return; }
  let x = A[pu(0u) + i];
  let op = pu(9u);
  var r: f32;
  if (op == 0u) { r = x * pf(10u); } else { r = act(op, x); }
  O[pu(1u) + i] = r;
}
"""

GLU = ACT + """
@group(0) @binding(1) var<storage, read> G: array<f32>;
@group(0) @binding(2) var<storage, read> V: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
// 8: n, 9: op (1 geglu, 2 swiglu)
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = lin(w, nw) * 256u + li;
  if (i >= pu(8u)) { return; }
  O[pu(2u) + i] = act(pu(9u), G[pu(0u) + i]) * V[pu(1u) + i];
}
"""

# RMS norm of each row, optionally times a gain vector (the models' norm: RMS_NORM then MUL)
RMS_NORM = """
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> Wg: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
var<workgroup> red: array<f32, 128>;
// 8: ncols, 9: nrows, 10: eps (f32), 11: has gain, 12: gain length (the gain repeats along the row)
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let row = lin(w, nw);
  if (row >= pu(9u)) { return; }
  let n = pu(8u);
  let base = pu(0u) + row * n;
  var s = 0.0;
  for (var c = li; c < n; c += 128u) { let x = A[base + c]; s += x * x; }
  red[li] = s;
  workgroupBarrier();
  for (var k = 64u; k > 0u; k >>= 1u) {
    if (li < k) { red[li] += red[li + k]; }
    workgroupBarrier();
  }
  let ms = red[0] * (1.0 / f32(n));
  let sc = 1.0 / sqrt(ms + pf(10u));
  let ob = pu(2u) + row * n;
  let has_gain = pu(11u);
  let gl = pu(12u);
  for (var c = li; c < n; c += 128u) {
    var y = A[base + c] * sc;
    if (has_gain == 1u) { y = y * Wg[pu(1u) + (c % gl)]; }
    O[ob + c] = y;
  }
}
"""

SOFT_MAX = """
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> Mk: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
var<workgroup> red: array<f32, 128>;
// 8: ncols S, 9: nrows, 10: T (mask rows), 11: has mask, 12: scale (f32)
fn val(base: u32, mb: u32, c: u32, hm: u32, sc: f32) -> f32 {
  var x = A[base + c] * sc;
  if (hm == 1u) { x = x + max(Mk[mb + c], """ + NEG_BIG + """); }
  return x;
}
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let row = lin(w, nw);
  if (row >= pu(9u)) { return; }
  let n = pu(8u);
  let base = pu(0u) + row * n;
  let mb = pu(1u) + (row % pu(10u)) * n;
  let hm = pu(11u);
  let sc = pf(12u);
  var m = """ + NEG_BIG + """;
  for (var c = li; c < n; c += 128u) { m = max(m, val(base, mb, c, hm, sc)); }
  red[li] = m;
  workgroupBarrier();
  for (var k = 64u; k > 0u; k >>= 1u) {
    if (li < k) { red[li] = max(red[li], red[li + k]); }
    workgroupBarrier();
  }
  let mx = red[0];
  workgroupBarrier();
  var s = 0.0;
  for (var c = li; c < n; c += 128u) { s += exp(val(base, mb, c, hm, sc) - mx); }
  red[li] = s;
  workgroupBarrier();
  for (var k = 64u; k > 0u; k >>= 1u) {
    if (li < k) { red[li] += red[li + k]; }
    workgroupBarrier();
  }
  let inv = 1.0 / red[0];
  let ob = pu(2u) + row * n;
  for (var c = li; c < n; c += 128u) { O[ob + c] = exp(val(base, mb, c, hm, sc) - mx) * inv; }
}
"""

# Attention of one query row of one head per workgroup, online softmax over tiles of 64 keys.
FLASH_ATTN = """
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> K: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<f32>;
@group(0) @binding(4) var<storage, read> Mk: array<f32>;
@group(0) @binding(5) var<storage, read_write> O: array<f32>;
var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
// 8: T, 9: H, 10: Hkv, 11: D, 12: S, 13: has mask, 14: scale (f32)
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let T = pu(8u); let H = pu(9u); let Hkv = pu(10u); let D = pu(11u); let S = pu(12u);
  let id = lin(w, nw);
  if (id >= T * H) { return; }
  let t = id / H; let h = id % H;
  let hk = h / (H / Hkv);
  let hm = pu(13u);
  let scale = pf(14u);
  let qb = pu(0u) + (t * H + h) * D;
  for (var d = li; d < D; d += 64u) { qs[d] = Q[qb + d]; }
  workgroupBarrier();
  var m = """ + NEG_BIG + """;
  var l = 0.0;
  var acc = vec4<f32>(0.0);
  let kstride = Hkv * D;
  let kb = pu(1u) + hk * D;
  let vb = pu(2u) + hk * D;
  let mb = pu(3u) + t * S;
  for (var s0 = 0u; s0 < S; s0 += 64u) {
    let s = s0 + li;
    var sc = """ + NEG_BIG + """;
    if (s < S) {
      var dot = 0.0;
      let kr = kb + s * kstride;
      for (var d = 0u; d < D; d++) { dot += qs[d] * K[kr + d]; }
      sc = dot * scale;
      if (hm == 1u) { sc = sc + max(Mk[mb + s], """ + NEG_BIG + """); }
    }
    red[li] = sc;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
      if (li < k) { red[li] = max(red[li], red[li + k]); }
      workgroupBarrier();
    }
    let mn = max(m, red[0]);
    workgroupBarrier();
    var p = 0.0;
    if (s < S) { p = exp(sc - mn); }
    ps[li] = p;
    red[li] = p;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
      if (li < k) { red[li] += red[li + k]; }
      workgroupBarrier();
    }
    let alpha = exp(m - mn);
    l = l * alpha + red[0];
    acc = acc * alpha;
    let nv = min(64u, S - s0);
    for (var j = 0u; j < nv; j++) {
      let pj = ps[j];
      let vr = vb + (s0 + j) * kstride;
      for (var i = 0u; i < 4u; i++) {
        let d = li + 64u * i;
        if (d < D) { acc[i] += pj * V[vr + d]; }
      }
    }
    m = mn;
    workgroupBarrier();
  }
  let ob = pu(4u) + (t * H + h) * D;
  for (var i = 0u; i < 4u; i++) {
    let d = li + 64u * i;
    if (d < D) { O[ob + d] = acc[i] / l; }
  }
}
"""

# The same with vec4 loads (D a multiple of 4, offsets too): a thread's key row is D/4 loads, its
# output one vec4.
FLASH_ATTN4 = """
@group(0) @binding(1) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> V: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> Mk: array<f32>;
@group(0) @binding(5) var<storage, read_write> O: array<vec4<f32>>;
var<workgroup> qs: array<vec4<f32>, 64>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
// 8: T, 9: H, 10: Hkv, 11: D, 12: S, 13: has mask, 14: scale (f32)
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let T = pu(8u); let H = pu(9u); let Hkv = pu(10u); let D4 = pu(11u) / 4u; let S = pu(12u);
  let id = lin(w, nw);
  if (id >= T * H) { return; }
  let t = id / H; let h = id % H;
  let hk = h / (H / Hkv);
  let hm = pu(13u);
  let scale = pf(14u);
  if (li < D4) { qs[li] = Q[pu(0u) / 4u + (t * H + h) * D4 + li]; }
  workgroupBarrier();
  var m = """ + NEG_BIG + """;
  var l = 0.0;
  var acc = vec4<f32>(0.0);
  let kstride = Hkv * D4;
  let kb = pu(1u) / 4u + hk * D4;
  let vb = pu(2u) / 4u + hk * D4;
  let mb = pu(3u) + t * S;
  for (var s0 = 0u; s0 < S; s0 += 64u) {
    let s = s0 + li;
    var sc = """ + NEG_BIG + """;
    if (s < S) {
      var d0 = vec4<f32>(0.0);
      var d1 = vec4<f32>(0.0);
      let kr = kb + s * kstride;
      var d = 0u;
      for (; d + 1u < D4; d += 2u) { d0 += qs[d] * K[kr + d]; d1 += qs[d + 1u] * K[kr + d + 1u]; }
      if (d < D4) { d0 += qs[d] * K[kr + d]; }
      sc = dot(d0 + d1, vec4<f32>(1.0)) * scale;
      if (hm == 1u) { sc = sc + max(Mk[mb + s], """ + NEG_BIG + """); }
    }
    red[li] = sc;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
      if (li < k) { red[li] = max(red[li], red[li + k]); }
      workgroupBarrier();
    }
    let mn = max(m, red[0]);
    workgroupBarrier();
    var p = 0.0;
    if (s < S) { p = exp(sc - mn); }
    ps[li] = p;
    red[li] = p;
    workgroupBarrier();
    for (var k = 32u; k > 0u; k >>= 1u) {
      if (li < k) { red[li] += red[li + k]; }
      workgroupBarrier();
    }
    let alpha = exp(m - mn);
    l = l * alpha + red[0];
    acc = acc * alpha;
    let nv = min(64u, S - s0);
    if (li < D4) {
      var j = 0u;
      for (; j + 1u < nv; j += 2u) {
        acc += ps[j] * V[vb + (s0 + j) * kstride + li] + ps[j + 1u] * V[vb + (s0 + j + 1u) * kstride + li];
      }
      if (j < nv) { acc += ps[j] * V[vb + (s0 + j) * kstride + li]; }
    }
    m = mn;
    workgroupBarrier();
  }
  if (li < D4) { O[pu(4u) / 4u + (t * H + h) * D4 + li] = acc / l; }
}
"""

# Flash decoding: few query rows (T * H small) leave most of the GPU idle, so the keys are cut into
# NC chunks, one workgroup per (query row, head, chunk) writing its partial (max, sum, acc[D]); a
# second kernel combines the chunks.
FLASH_ATTN_SPLIT = FLASH_ATTN4.replace(
    "@group(0) @binding(5) var<storage, read_write> O: array<vec4<f32>>;",
    "@group(0) @binding(5) var<storage, read_write> P: array<vec4<f32>>;   // per part: acc[D/4], then (m, l)"
).replace(
    "// 8: T, 9: H, 10: Hkv, 11: D, 12: S, 13: has mask, 14: scale (f32)",
    "// 8: T, 9: H, 10: Hkv, 11: D, 12: S, 13: has mask, 14: scale (f32), 15: NC, 16: keys per chunk"
).replace(
    "  let id = lin(w, nw);\n  if (id >= T * H) { return; }",
    "  let NC = pu(15u);\n  let idc = lin(w, nw);\n  if (idc >= T * H * NC) { return; }\n"
    "  let id = idc / NC; let c = idc % NC;\n  let c0 = c * pu(16u); let c1 = min(S, c0 + pu(16u));"
).replace(
    "for (var s0 = 0u; s0 < S; s0 += 64u) {", "for (var s0 = c0; s0 < c1; s0 += 64u) {"
).replace("if (s < S) {", "if (s < c1) {").replace("if (s < S) { p = exp(sc - mn); }", "if (s < c1) { p = exp(sc - mn); }"
).replace("let nv = min(64u, S - s0);", "let nv = min(64u, c1 - s0);"
).replace(
    "  if (li < D4) { O[pu(4u) / 4u + (t * H + h) * D4 + li] = acc / l; }",
    "  let pb = pu(4u) / 4u + idc * (D4 + 1u);\n  if (li < D4) { P[pb + li] = acc; }\n"
    "  if (li == 0u) { P[pb + D4] = vec4<f32>(m, l, 0.0, 0.0); }")

FLASH_COMBINE = """
@group(0) @binding(1) var<storage, read> P: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> O: array<vec4<f32>>;
// 8: T * H, 9: D, 10: NC
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let id = lin(w, nw);
  if (id >= pu(8u)) { return; }
  let D4 = pu(9u) / 4u; let NC = pu(10u);
  let base = pu(0u) / 4u + id * NC * (D4 + 1u);
  var m = """ + NEG_BIG + """;
  for (var c = 0u; c < NC; c++) { m = max(m, P[base + c * (D4 + 1u) + D4].x); }
  var l = 0.0;
  var acc = vec4<f32>(0.0);
  for (var c = 0u; c < NC; c++) {
    let pc = base + c * (D4 + 1u);
    let ml = P[pc + D4];
    let f = exp(ml.x - m);
    l += ml.y * f;
    if (li < D4) { acc += P[pc + li] * f; }
  }
  if (li < D4) { O[pu(1u) / 4u + id * D4 + li] = acc / l; }
}
"""

# Rotary embedding; cos and sin of every (position, frequency) come from a table made on the host
# in float64 (as the CPU plugin does), so no GPU trigonometry of large angles is involved.
ROPE = """
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> CS: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
// 8: T, 9: H, 10: D, 11: n_dims, 12: mode (0 normal, 1 neox)
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let T = pu(8u); let H = pu(9u); let D = pu(10u); let nd = pu(11u);
  let half = D / 2u;
  let i = lin(w, nw) * 256u + li;
  if (i >= T * H * half) { return; }
  let j = i % half;
  let th = i / half;
  let t = th / H;
  let base = th * D;
  let ia = pu(0u) + base;
  let io = pu(2u) + base;
  let nh = nd / 2u;
  if (j < nh) {
    let cs = CS[pu(1u) + t * nh + j];
    var i0 = 2u * j; var i1 = 2u * j + 1u;
    if (pu(12u) == 1u) { i0 = j; i1 = j + nh; }
    let x0 = A[ia + i0]; let x1 = A[ia + i1];
    O[io + i0] = x0 * cs.x - x1 * cs.y;
    O[io + i1] = x0 * cs.y + x1 * cs.x;
  } else {
    let e = nd + 2u * (j - nh);
    O[io + e] = A[ia + e];
    O[io + e + 1u] = A[ia + e + 1u];
  }
}
"""

SET_ROWS = """
@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(2) var<storage, read> R: array<i32>;
@group(0) @binding(3) var<storage, read_write> Dst: array<f32>;
// 8: W (row width), 9: T (rows written), 10: rows of dst
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let W = pu(8u);
  let i = lin(w, nw) * 256u + li;
  if (i >= W * pu(9u)) { return; }
  let t = i / W; let c = i % W;
  let r = R[pu(1u) + t];
  if (r < 0 || u32(r) >= pu(10u)) { return; }
  Dst[pu(2u) + u32(r) * W + c] = S[pu(0u) + i];
}
"""

# A strided (4-D) gather into a contiguous tensor: CONT of a permuted view
CONT = """
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;
// 8: n, 9..12: output shape (4-D), 13..16: source strides in elements
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = lin(w, nw) * 256u + li;
  if (i >= pu(8u)) { return; }
  let a1 = pu(10u); let a2 = pu(11u); let a3 = pu(12u);
  let i3 = i % a3; let r3 = i / a3; let i2 = r3 % a2; let r2 = r3 / a2; let i1 = r2 % a1; let i0 = r2 / a1;
  let src = i0 * pu(13u) + i1 * pu(14u) + i2 * pu(15u) + i3 * pu(16u);
  O[pu(1u) + i] = A[pu(0u) + src];
}
"""

GET_ROWS_F32 = """
@group(0) @binding(1) var<storage, read> A: array<{elem}>;
@group(0) @binding(2) var<storage, read> R: array<i32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
// 8: W, 9: T, 10: first row of this chunk, 11: rows in this chunk
fn load(i: u32) -> f32 {{ {load} }}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  let W = pu(8u);
  let i = lin(w, nw) * 256u + li;
  if (i >= W * pu(9u)) {{ return; }}
  let t = i / W; let c = i % W;
  let r = u32(R[pu(1u) + t]) - pu(10u);
  if (r >= pu(11u)) {{ return; }}
  O[pu(2u) + i] = load(pu(0u) + r * W + c);
}}
"""

LOAD_F32 = "return A[i];"
LOAD_F16 = "return unpack2x16float(A[i >> 1u])[i & 1u];"

# Generic batched product of two float tensors (activations, or an F32/F16 weight):
# a (A0, A1, N, K), b (B0, B1, M, K) -> (B0, B1, M, N); a's batch axes repeat to b's (ggml).
MUL_MAT_F = """
@group(0) @binding(1) var<storage, read> A: array<{elem}>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
// 8: N, 9: M, 10: K, 11: A0, 12: A1, 13: B0, 14: B1, 15: first row (n) of this chunk, 16: rows in chunk,
// 17: output row stride
fn load(i: u32) -> f32 {{ {load} }}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  let NC = pu(16u); let M = pu(9u); let K = pu(10u);
  let B0 = pu(13u); let B1 = pu(14u);
  let i = lin(w, nw) * 256u + li;
  if (i >= B0 * B1 * M * NC) {{ return; }}
  let nl = i % NC; let r = i / NC; let m = r % M; let bb = r / M; let i1 = bb % B1; let i0 = bb / B1;
  let j0 = i0 / (B0 / pu(11u)); let j1 = i1 / (B1 / pu(12u));
  let ab = pu(0u) + ((j0 * pu(12u) + j1) * NC + nl) * K;
  let bbase = pu(1u) + ((i0 * B1 + i1) * M + m) * K;
  var s = 0.0;
  for (var k = 0u; k < K; k++) {{ s += load(ab + k) * B[bbase + k]; }}
  O[pu(2u) + ((i0 * B1 + i1) * M + m) * pu(17u) + pu(15u) + nl] = s;
}}
"""

# ------------------------------------------------------------------------------------------------------
# quantized weights: deq8 per type (see quant.py for the layouts)
# ------------------------------------------------------------------------------------------------------

DEQ_COMMON = """
struct V8 { a: vec4<f32>, b: vec4<f32> }
var<private> gpr: u32;    // 32-element groups per row
var<private> moff: u32;   // word offset of the f16 scale plane
fn nib4(w: u32) -> vec4<wt> {
  return vec4<wt>(vec4<u32>(w & 0xFu, (w >> 8u) & 0xFu, (w >> 16u) & 0xFu, (w >> 24u) & 0xFu));
}
fn byte4(w: u32) -> vec4<u32> { return vec4<u32>(w & 0xFFu, (w >> 8u) & 0xFFu, (w >> 16u) & 0xFFu, w >> 24u); }
fn sbyte4(w: u32) -> vec4<wt> {
  return vec4<wt>(vec4<i32>(bitcast<i32>(w << 24u) >> 24u, bitcast<i32>(w << 16u) >> 24u,
                            bitcast<i32>(w << 8u) >> 24u, bitcast<i32>(w) >> 24u));
}
fn dplane(b: u32) -> wt { return wt(unpack2x16float(w1(moff + (b >> 1u)))[b & 1u]); }
fn v8(x: vec4<wt>, y: vec4<wt>) -> V8 { return V8(vec4<f32>(x), vec4<f32>(y)); }
"""

DEQ = {
    # 4 words of nibbles per block; d in the scale plane
    "Q4_0": """
fn deq8(r: u32, g: u32, j: u32) -> V8 {
  let b = r * gpr + g;
  let base = b * 4u + (j & 1u) * 2u;
  let sh = (j >> 1u) * 4u;
  let d = dplane(b);
  return v8((nib4(w1(base) >> sh) - wt(8.0)) * d, (nib4(w1(base + 1u) >> sh) - wt(8.0)) * d);
}
""",
    # the GGUF block as it is: (d, m) then 4 words of nibbles
    "Q4_1": """
fn deq8(r: u32, g: u32, j: u32) -> V8 {
  let b = r * gpr + g;
  let dm = unpack2x16float(w1(b * 5u));
  let d = wt(dm.x); let m = wt(dm.y);
  let base = b * 5u + 1u + (j & 1u) * 2u;
  let sh = (j >> 1u) * 4u;
  return v8(nib4(w1(base) >> sh) * d + m, nib4(w1(base + 1u) >> sh) * d + m);
}
""",
    # qh then 4 words of nibbles per block; d in the scale plane
    "Q5_0": """
fn deq8(r: u32, g: u32, j: u32) -> V8 {
  let b = r * gpr + g;
  let qh = (w1(b * 5u) >> (8u * j)) & 0xFFu;
  let base = b * 5u + 1u + (j & 1u) * 2u;
  let sh = (j >> 1u) * 4u;
  let h0 = vec4<u32>(qh & 1u, (qh >> 1u) & 1u, (qh >> 2u) & 1u, (qh >> 3u) & 1u) << vec4<u32>(4u);
  let h1 = vec4<u32>((qh >> 4u) & 1u, (qh >> 5u) & 1u, (qh >> 6u) & 1u, (qh >> 7u) & 1u) << vec4<u32>(4u);
  let w0 = w1(base) >> sh; let w1 = w1(base + 1u) >> sh;
  let q0 = vec4<wt>(vec4<u32>(w0 & 0xFu, (w0 >> 8u) & 0xFu, (w0 >> 16u) & 0xFu, (w0 >> 24u) & 0xFu) | h0);
  let q1 = vec4<wt>(vec4<u32>(w1 & 0xFu, (w1 >> 8u) & 0xFu, (w1 >> 16u) & 0xFu, (w1 >> 24u) & 0xFu) | h1);
  let d = dplane(b);
  return v8((q0 - wt(16.0)) * d, (q1 - wt(16.0)) * d);
}
""",
    # 8 words of signed bytes per block; d in the scale plane
    "Q8_0": """
fn deq8(r: u32, g: u32, j: u32) -> V8 {
  let b = r * gpr + g;
  let base = b * 8u + 2u * j;
  let d = dplane(b);
  return v8(sbyte4(w1(base)) * d, sbyte4(w1(base + 1u)) * d);
}
""",
    # the GGUF super-block as it is: (d, dmin), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
    "Q4_K": """
fn scb(sb: u32, k: u32) -> u32 { return (w1(sb * 36u + 1u + (k >> 2u)) >> (8u * (k & 3u))) & 0xFFu; }
fn deq8(r: u32, g: u32, j: u32) -> V8 {
  let sb = r * (gpr >> 3u) + (g >> 3u);
  let s = g & 7u;
  let dm = unpack2x16float(w1(sb * 36u));
  var sc: u32; var mn: u32;
  if (s < 4u) {
    sc = scb(sb, s) & 63u; mn = scb(sb, s + 4u) & 63u;
  } else {
    sc = (scb(sb, s + 4u) & 0xFu) | ((scb(sb, s - 4u) >> 6u) << 4u);
    mn = (scb(sb, s + 4u) >> 4u) | ((scb(sb, s) >> 6u) << 4u);
  }
  let d = wt(dm.x) * wt(f32(sc));
  let m = wt(dm.y) * wt(f32(mn));
  let base = sb * 36u + 4u + 8u * (s >> 1u) + 2u * j;
  let sh = (s & 1u) * 4u;
  return v8(nib4(w1(base) >> sh) * d - m, nib4(w1(base + 1u) >> sh) * d - m);
}
""",
    # ql (32 words), qh (16 words), scales (4 words) per super-block; d in the scale plane
    "Q6_K": """
fn deq8(r: u32, g: u32, j: u32) -> V8 {
  let sb = r * (gpr >> 3u) + (g >> 3u);
  let gg = g & 7u;
  let n = gg >> 2u; let qd = gg & 3u;
  let base = sb * 52u;
  let lw = base + 16u * n + 8u * (qd & 1u) + 2u * j;
  let lsh = (qd >> 1u) * 4u;
  let hw = base + 32u + 8u * n + 2u * j;
  let hsh = 2u * qd;
  let si = 8u * n + (j >> 1u) + 2u * qd;
  let scw = w1(base + 48u + (si >> 2u));
  let sc = f32(bitcast<i32>(scw << (24u - 8u * (si & 3u))) >> 24u);
  let d = dplane(sb) * wt(sc);
  let l0 = (w1(lw) >> lsh) & 0x0F0F0F0Fu; let l1 = (w1(lw + 1u) >> lsh) & 0x0F0F0F0Fu;
  let h0 = ((w1(hw) >> hsh) & 0x03030303u) << 4u; let h1 = ((w1(hw + 1u) >> hsh) & 0x03030303u) << 4u;
  let q0 = vec4<wt>(byte4(l0 | h0)) - wt(32.0);
  let q1 = vec4<wt>(byte4(l1 | h1)) - wt(32.0);
  return v8(q0 * d, q1 * d);
}
""",
}

VEC4_TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")   # blocks (and scale planes) aligned to 16 bytes

W_SCALAR = """
@group(0) @binding(1) var<storage, read> W: array<u32>;
fn w1(i: u32) -> u32 { return W[i]; }
"""
W_VEC4 = """
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
fn w1(i: u32) -> u32 { return W[i >> 2u][i & 3u]; }
"""

# dot32(r, g, xb): the dot product of group g of row r with 32 values of x (vec4 index xb), the
# scales factored out of the sums, in f32. The matrix-vector kernel's core.
DOT_COMMON = """
fn nibf(w: u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>(w & 0xFu, (w >> 8u) & 0xFu, (w >> 16u) & 0xFu, (w >> 24u) & 0xFu));
}
fn sbf(w: u32) -> vec4<f32> {
  return vec4<f32>(vec4<i32>(bitcast<i32>(w << 24u) >> 24u, bitcast<i32>(w << 16u) >> 24u,
                             bitcast<i32>(w << 8u) >> 24u, bitcast<i32>(w) >> 24u));
}
fn hb4(x: u32) -> vec4<u32> { return vec4<u32>(x & 1u, (x >> 1u) & 1u, (x >> 2u) & 1u, (x >> 3u) & 1u) << vec4<u32>(4u); }
fn dpf(b: u32) -> f32 { return unpack2x16float(w1(moff + (b >> 1u)))[b & 1u]; }
fn xsum(x: array<vec4<f32>, 8>) -> f32 {
  return dot(x[0] + x[1] + x[2] + x[3] + x[4] + x[5] + x[6] + x[7], vec4<f32>(1.0));
}
"""

DOT = {
    "Q4_0": """
fn dot32(r: u32, g: u32, x: array<vec4<f32>, 8>) -> f32 {
  let b = r * gpr + g;
  let q = W[b];
  let e = vec4<f32>(8.0);
  var s = dot(nibf(q.x) - e, x[0]) + dot(nibf(q.y) - e, x[1]) + dot(nibf(q.z) - e, x[2])
        + dot(nibf(q.w) - e, x[3]);
  s += dot(nibf(q.x >> 4u) - e, x[4]) + dot(nibf(q.y >> 4u) - e, x[5])
     + dot(nibf(q.z >> 4u) - e, x[6]) + dot(nibf(q.w >> 4u) - e, x[7]);
  return s * dpf(b);
}
""",
    "Q4_1": """
fn dot32(r: u32, g: u32, x: array<vec4<f32>, 8>) -> f32 {
  let b = r * gpr + g;
  let dm = unpack2x16float(W[b * 5u]);
  let q0 = W[b * 5u + 1u]; let q1 = W[b * 5u + 2u]; let q2 = W[b * 5u + 3u]; let q3 = W[b * 5u + 4u];
  var s = dot(nibf(q0), x[0]) + dot(nibf(q1), x[1]) + dot(nibf(q2), x[2]) + dot(nibf(q3), x[3]);
  s += dot(nibf(q0 >> 4u), x[4]) + dot(nibf(q1 >> 4u), x[5]) + dot(nibf(q2 >> 4u), x[6])
     + dot(nibf(q3 >> 4u), x[7]);
  return s * dm.x + dm.y * xsum(x);
}
""",
    "Q5_0": """
fn q5(w: u32, h: u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>(w & 0xFu, (w >> 8u) & 0xFu, (w >> 16u) & 0xFu, (w >> 24u) & 0xFu) | hb4(h))
         - vec4<f32>(16.0);
}
fn dot32(r: u32, g: u32, x: array<vec4<f32>, 8>) -> f32 {
  let b = r * gpr + g;
  let qh = W[b * 5u];
  let q0 = W[b * 5u + 1u]; let q1 = W[b * 5u + 2u]; let q2 = W[b * 5u + 3u]; let q3 = W[b * 5u + 4u];
  var s = dot(q5(q0, qh), x[0]) + dot(q5(q1, qh >> 4u), x[1]) + dot(q5(q2, qh >> 8u), x[2])
        + dot(q5(q3, qh >> 12u), x[3]);
  s += dot(q5(q0 >> 4u, qh >> 16u), x[4]) + dot(q5(q1 >> 4u, qh >> 20u), x[5])
     + dot(q5(q2 >> 4u, qh >> 24u), x[6]) + dot(q5(q3 >> 4u, qh >> 28u), x[7]);
  return s * dpf(b);
}
""",
    "Q8_0": """
fn dot32(r: u32, g: u32, x: array<vec4<f32>, 8>) -> f32 {
  let b = r * gpr + g;
  let q0 = W[b * 2u]; let q1 = W[b * 2u + 1u];
  let s = dot(sbf(q0.x), x[0]) + dot(sbf(q0.y), x[1]) + dot(sbf(q0.z), x[2]) + dot(sbf(q0.w), x[3])
        + dot(sbf(q1.x), x[4]) + dot(sbf(q1.y), x[5]) + dot(sbf(q1.z), x[6])
        + dot(sbf(q1.w), x[7]);
  return s * dpf(b);
}
""",
    "Q4_K": """
fn dot32(r: u32, g: u32, x: array<vec4<f32>, 8>) -> f32 {
  let sb = r * (gpr >> 3u) + (g >> 3u);
  let s = g & 7u;
  let h = W[sb * 9u];
  let dm = unpack2x16float(h.x);
  var sc: u32; var mn: u32;
  // bytes s (word h.y or h.z), s + 4 (h.z or h.w) and s - 4 (h.y) of the 12 scale bytes
  let sh8 = 8u * (s & 3u);
  let b0 = (select(h.z, h.y, s < 4u) >> sh8) & 0xFFu;
  let b1 = (select(h.w, h.z, s < 4u) >> sh8) & 0xFFu;
  if (s < 4u) {
    sc = b0 & 63u; mn = b1 & 63u;
  } else {
    let bm = (h.y >> sh8) & 0xFFu;
    sc = (b1 & 0xFu) | ((bm >> 6u) << 4u);
    mn = (b1 >> 4u) | ((b0 >> 6u) << 4u);
  }
  let qi = sb * 9u + 1u + 2u * (s >> 1u);
  let sh = (s & 1u) * 4u;
  let q0 = W[qi] >> vec4<u32>(sh); let q1 = W[qi + 1u] >> vec4<u32>(sh);
  let t = dot(nibf(q0.x), x[0]) + dot(nibf(q0.y), x[1]) + dot(nibf(q0.z), x[2]) + dot(nibf(q0.w), x[3])
        + dot(nibf(q1.x), x[4]) + dot(nibf(q1.y), x[5]) + dot(nibf(q1.z), x[6])
        + dot(nibf(q1.w), x[7]);
  return dm.x * f32(sc) * t - dm.y * f32(mn) * xsum(x);
}
""",
    "Q6_K": """
fn q6(l: u32, h: u32) -> vec4<f32> {
  return vec4<f32>(vec4<u32>(l & 0xFu, (l >> 8u) & 0xFu, (l >> 16u) & 0xFu, (l >> 24u) & 0xFu)
                   | (vec4<u32>(h & 3u, (h >> 8u) & 3u, (h >> 16u) & 3u, (h >> 24u) & 3u) << vec4<u32>(4u)))
         - vec4<f32>(32.0);
}
fn dot32(r: u32, g: u32, x: array<vec4<f32>, 8>) -> f32 {
  let sb = r * (gpr >> 3u) + (g >> 3u);
  let gg = g & 7u;
  let n = gg >> 2u; let qd = gg & 3u;
  let base = sb * 13u;
  let lsh = vec4<u32>((qd >> 1u) * 4u);
  let hsh = vec4<u32>(2u * qd);
  let l0 = W[base + 4u * n + 2u * (qd & 1u)] >> lsh; let l1 = W[base + 4u * n + 2u * (qd & 1u) + 1u] >> lsh;
  let h0 = W[base + 8u + 2u * n] >> hsh; let h1 = W[base + 8u + 2u * n + 1u] >> hsh;
  let si = 8u * n + 2u * qd;
  let scw = W[base + 12u][si >> 2u];
  let sc0 = f32(bitcast<i32>(scw << (24u - 8u * (si & 3u))) >> 24u);
  let sc1 = f32(bitcast<i32>(scw << (16u - 8u * (si & 3u))) >> 24u);
  let s0 = dot(q6(l0.x, h0.x), x[0]) + dot(q6(l0.y, h0.y), x[1]) + dot(q6(l0.z, h0.z), x[2])
         + dot(q6(l0.w, h0.w), x[3]);
  let s1 = dot(q6(l1.x, h1.x), x[4]) + dot(q6(l1.y, h1.y), x[5]) + dot(q6(l1.z, h1.z), x[6])
         + dot(q6(l1.w, h1.w), x[7]);
  return dpf(sb) * (sc0 * s0 + sc1 * s1);
}
""",
}

# Matrix-vector product (decode): TPR threads of a team split the groups of R weight rows; RPW teams
# per workgroup; MM rows of x (M <= MM). Each thread loads a group of x once and uses it for its R rows
# (x is read from the cache R times less); partial sums meet in workgroup memory. Unrolled: no
# private arrays but the 8 vec4 of x.
MATVEC = """
@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
{deq}
const TPR: u32 = {tpr}u;
const RPW: u32 = {rpw}u;
const WG: u32 = {wg}u;
var<workgroup> red: array<f32, {red}>;
// 8: N (rows of this chunk), 9: K, 10: M, 11: groups per row, 12: scale-plane offset, 13: output row
// stride, 14: first output column of this chunk. X is read as vec4: its offset and K are multiples of 4.
fn xg(b: u32) -> array<vec4<f32>, 8> {{
  return array<vec4<f32>, 8>(X[b], X[b + 1u], X[b + 2u], X[b + 3u], X[b + 4u], X[b + 5u], X[b + 6u], X[b + 7u]);
}}
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  gpr = pu(11u); moff = pu(12u);
  let N = pu(8u); let K4 = pu(9u) / 4u; let M = pu(10u);
  let x4 = pu(1u) / 4u;
  let rl = li / TPR; let lane = li % TPR;
  let r0 = (lin(w, nw) * RPW + rl) * {r}u;
{decl}
  if (r0 < N) {{
{rows}
    for (var g = lane; g < gpr; g += TPR) {{
      let kb = x4 + g * 8u;
{body}
    }}
  }}
{red_store}
  workgroupBarrier();
  for (var s = TPR / 2u; s > 0u; s >>= 1u) {{
    if (lane < s) {{
{red_step}
    }}
    workgroupBarrier();
  }}
  if (lane == 0u && r0 < N) {{
    let ob = pu(2u) + pu(14u) + r0;
    let ld = pu(13u);
{store}
  }}
}}
"""

# Tiled matrix product (prefill): 64 x 64 output tiles, K in steps of one 32-element group;
# 256 threads, 4 x 4 outputs each; the weight tile is dequantized into workgroup memory.
MATMUL = """
@group(0) @binding(2) var<storage, read> X: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
{deq}
var<workgroup> xs: array<f32, 2048>;   // [k][m]
var<workgroup> ws: array<wt, 2048>;    // [k][n]
// 8: N, 9: K, 10: M, 11: groups per row, 12: scale-plane offset, 13: output row stride,
// 14: first output column of this chunk, 15: tiles along N
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  gpr = pu(11u); moff = pu(12u);
  let N = pu(8u); let K = pu(9u); let M = pu(10u);
  let ntn = pu(15u);
  let tid = lin(w, nw);
  let tn = tid % ntn; let tm = tid / ntn;
  if (tm * 64u >= M) {{ return; }}
  let tx = li % 16u; let ty = li / 16u;
  let lrow = li / 4u; let lp = li % 4u;
  var acc: array<vec4<f32>, 4>;
  for (var i = 0u; i < 4u; i++) {{ acc[i] = vec4<f32>(0.0); }}
  let xm = tm * 64u + lrow;
  let wn = tn * 64u + lrow;
  for (var g = 0u; g < gpr; g++) {{
    let kb = g * 32u + lp * 8u;
    if (xm < M) {{
      let xo = pu(1u) + xm * K + kb;
      for (var i = 0u; i < 8u; i++) {{ xs[(lp * 8u + i) * 64u + lrow] = X[xo + i]; }}
    }} else {{
      for (var i = 0u; i < 8u; i++) {{ xs[(lp * 8u + i) * 64u + lrow] = 0.0; }}
    }}
    var v = V8(vec4<f32>(0.0), vec4<f32>(0.0));
    if (wn < N) {{ v = deq8(wn, g, lp); }}
    for (var i = 0u; i < 4u; i++) {{
      ws[(lp * 8u + i) * 64u + lrow] = wt(v.a[i]);
      ws[(lp * 8u + 4u + i) * 64u + lrow] = wt(v.b[i]);
    }}
    workgroupBarrier();
    for (var k = 0u; k < 32u; k++) {{
      let xb = k * 64u + ty * 4u;
      let wb = k * 64u + tx * 4u;
      let bv = vec4<f32>(f32(ws[wb]), f32(ws[wb + 1u]), f32(ws[wb + 2u]), f32(ws[wb + 3u]));
      acc[0] += xs[xb] * bv;
      acc[1] += xs[xb + 1u] * bv;
      acc[2] += xs[xb + 2u] * bv;
      acc[3] += xs[xb + 3u] * bv;
    }}
    workgroupBarrier();
  }}
  for (var i = 0u; i < 4u; i++) {{
    let m = tm * 64u + ty * 4u + i;
    if (m < M) {{
      for (var jj = 0u; jj < 4u; jj++) {{
        let n = tn * 64u + tx * 4u + jj;
        if (n < N) {{ O[pu(2u) + m * pu(13u) + pu(14u) + n] = acc[i][jj]; }}
      }}
    }}
  }}
}}
"""

# Register-tiled matrix product (prefill): each thread computes a BM x BN block of outputs straight
# from global memory (no workgroup memory, no barriers: what Mesa's lavapipe runs well, and on a GPU
# the x rows are shared by the warp through the cache); weight groups are dequantized once per block
# and used BM times, x values used BN times.
MATMUL_REG = """
@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
{deq}
// 8: N, 9: K, 10: M, 11: groups per row, 12: scale-plane offset, 13: output row stride,
// 14: first output column of this chunk, 15: blocks along N
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  gpr = pu(11u); moff = pu(12u);
  let N = pu(8u); let K4 = pu(9u) / 4u; let M = pu(10u);
  let nbn = pu(15u);
  let id = lin(w, nw) * 64u + li;
  let nb = id % nbn; let mb = id / nbn;
  let m0 = mb * {bm}u; let n0 = nb * {bn}u;
  if (m0 >= M) {{ return; }}
  let x4 = pu(1u) / 4u;
{decl}
  for (var g = 0u; g < gpr; g++) {{
    for (var j = 0u; j < 4u; j++) {{
{body}
    }}
  }}
  let ob = pu(2u) + pu(14u);
  let ld = pu(13u);
{store}
}}
"""

# Rows of a quantized weight (the token embedding): one thread per 8 values
GET_ROWS_Q = """
@group(0) @binding(2) var<storage, read> R: array<i32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
{deq}
// 8: W (row width), 9: T, 10: first row of this chunk, 11: rows in this chunk, 12: groups per row,
// 13: scale-plane offset
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  gpr = pu(12u); moff = pu(13u);
  let Wd = pu(8u);
  let pieces = Wd / 8u;
  let i = lin(w, nw) * 256u + li;
  if (i >= pieces * pu(9u)) {{ return; }}
  let t = i / pieces; let p = i % pieces;
  let r = u32(R[pu(1u) + t]) - pu(10u);
  if (r >= pu(11u)) {{ return; }}
  let v = deq8(r, p / 4u, p % 4u);
  let o = pu(2u) + t * Wd + p * 8u;
  for (var k = 0u; k < 4u; k++) {{ O[o + k] = v.a[k]; O[o + 4u + k] = v.b[k]; }}
}}
"""


def deq_source(qtype: str, with_dot: bool = False) -> str:
    src = (W_VEC4 if qtype in VEC4_TYPES else W_SCALAR) + DEQ_COMMON + DEQ[qtype]
    if with_dot:
        src += DOT_COMMON + DOT[qtype]
    return src


def matvec(qtype: str, tpr: int, mm: int, f16: bool, r: int = 1) -> str:
    wg = 256
    pairs = [(m, k) for m in range(mm) for k in range(r)]
    decl = "\n".join(f"  var a{m}_{k} = 0.0;" for m, k in pairs)
    rows = "\n".join(f"    let row{k} = min(r0 + {k}u, N - 1u);" for k in range(r))
    body = []
    for m in range(mm):
        guard = f"if (M > {m}u) " if m else ""
        inner = " ".join(f"a{m}_{k} += dot32(row{k}, g, x{m});" for k in range(r))
        body.append(f"      {guard}{{ let x{m} = xg(kb + {m}u * K4); {inner} }}")
    red_store = "\n".join(f"  red[{i}u * WG + li] = a{m}_{k};" for i, (m, k) in enumerate(pairs))
    red_step = "\n".join(f"      red[{i}u * WG + li] += red[{i}u * WG + li + s];" for i in range(len(pairs)))
    store = "\n".join(f"    if (M > {m}u && r0 + {k}u < N) {{ O[ob + {m}u * ld + {k}u] = red[{i}u * WG + li]; }}"
                      for i, (m, k) in enumerate(pairs))
    return header(f16) + MATVEC.format(deq=deq_source(qtype, True), tpr=tpr, rpw=wg // tpr, wg=wg,
                                       red=wg * len(pairs), r=r, decl=decl, rows=rows, body="\n".join(body),
                                       red_store=red_store, red_step=red_step, store=store)


def matmul(qtype: str, f16: bool) -> str:
    return header(f16) + MATMUL.format(deq=deq_source(qtype))


def matmul_reg(qtype: str, f16: bool, bm: int = 4, bn: int = 4) -> str:
    decl = [f"  var a{m}_{n} = 0.0;" for m in range(bm) for n in range(bn)]
    decl += [f"  let xr{m} = x4 + min(m0 + {m}u, M - 1u) * K4;" for m in range(bm)]
    decl += [f"  let wr{n} = min(n0 + {n}u, N - 1u);" for n in range(bn)]
    body = [f"      let w{n} = deq8(wr{n}, g, j);" for n in range(bn)]
    body.append("      let xo = g * 8u + j * 2u;")
    for m in range(bm):
        body.append(f"      let xa{m} = X[xr{m} + xo]; let xb{m} = X[xr{m} + xo + 1u];")
        for n in range(bn):
            body.append(f"      a{m}_{n} += dot(w{n}.a, xa{m}) + dot(w{n}.b, xb{m});")
    store = []
    for m in range(bm):
        for n in range(bn):
            store.append(f"  if (m0 + {m}u < M && n0 + {n}u < N) {{ O[ob + (m0 + {m}u) * ld + n0 + {n}u] = a{m}_{n}; }}")
    return header(f16) + MATMUL_REG.format(deq=deq_source(qtype), bm=bm, bn=bn, decl="\n".join(decl),
                                           body="\n".join(body), store="\n".join(store))


def get_rows_q(qtype: str, f16: bool) -> str:
    return header(f16) + GET_ROWS_Q.format(deq=deq_source(qtype))


def get_rows_f(elem: str) -> str:
    load = LOAD_F16 if elem == "F16" else LOAD_F32
    return header(False) + GET_ROWS_F32.format(elem="u32" if elem == "F16" else "f32", load=load)


def mul_mat_f(elem: str) -> str:
    load = LOAD_F16 if elem == "F16" else LOAD_F32
    return header(False) + MUL_MAT_F.format(elem="u32" if elem == "F16" else "f32", load=load)


SIMPLE = {"binary": BINARY, "unary": UNARY, "glu": GLU, "rms_norm": RMS_NORM, "soft_max": SOFT_MAX,
          "flash_attn": FLASH_ATTN, "flash_attn4": FLASH_ATTN4,
          "flash_attn_split": FLASH_ATTN_SPLIT, "flash_combine": FLASH_COMBINE, "rope": ROPE, "set_rows": SET_ROWS, "cont": CONT}


def simple(name: str) -> str:
    return header(False) + SIMPLE[name]
