// The C kernels that the CUDA plugin (kernels.cu, CUDA C by NVRTC) and the OpenCL plugin (kernels.cl,
// OpenCL C 1.2) share: element-wise and row kernels, split attention's combine, rope, the memory
// kernels, the quantized weights' groups and their dot products, GET_ROWS of a quantized weight, the
// matrix-vector products' kernels. Written once here, in a small dialect that each plugin's source
// defines for its language before the first section:
//
//   KERNEL           a kernel                     (extern "C" __global__ / __kernel)
//   KERNEL_WG(n)     a kernel of n work-items a work-group (__launch_bounds__ / reqd_work_group_size)
//   DEVICE_FN        a helper function            (__device__ inline / inline)
//   GLOBAL           a pointer into device memory (nothing / __global)
//   LOCAL            work-group memory            (__shared__ / __local)
//   LOCAL_AS         a pointer into it            (nothing: CUDA's pointers are generic / __local)
//   RESTRICT         an unaliased pointer         (__restrict__ / restrict)
//   LOCAL_BARRIER()  the work-group's barrier     (__syncthreads() / barrier(CLK_LOCAL_MEM_FENCE))
//   UINT4(a, b, c, d) a uint4 of four values      (make_uint4 / a vector literal)
//   SPLAT4(a)        a uint4 of one value, four times (OpenCL C has no variadic macros)
//   U4(n)            a uint4 parameter made whole (CUDA passes its four words; OpenCL: nothing to do)
//   DOT4A(u, s, c)   c plus the dot product of u's unsigned and s's signed bytes
//   MV_STORE()       the matrix-vector kernels' store of a team's sums (the plugin's mv_store)
//
// with OpenCL C's vocabulary (get_global_id, get_local_id, get_group_id, vload4, vstore4, vload_half,
// as_float, float4 arithmetic), which kernels.cu writes out for CUDA. c_kernels.source splices a
// section where a plugin's source has the line `// @shared NAME`, so each plugin keeps its own build
// conditions (#if) around the sections it takes, and its own kernels between them. A section runs from
// its `// @section NAME` line to the next.

// @section defaults
// the element type of a float weight (ELEM_HALF: half, read through LOADE), and a masked score
#ifndef ELEM
#define ELEM float
#endif
#ifdef ELEM_HALF
#define LOADE(p, i) vload_half((i), (p))
#else
#define LOADE(p, i) ((p)[i])
#endif
#define NEG_BIG (-3.0e38f)   // a masked score: finite, so no inf - inf ever happens

// @section act
DEVICE_FN float gelu_tanh(float x) {   // ggml_gelu: the tanh approximation
  return 0.5f * x * (1.0f + tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

DEVICE_FN float act(uint op, float x) {
  if (op == OP_GELU) return gelu_tanh(x);
  if (op == OP_SILU) return x / (1.0f + exp(-x));
  if (op == OP_SIGMOID) return 1.0f / (1.0f + exp(-x));
  if (op == OP_SOFTPLUS) return x > 20.0f ? x : log1p(exp(x));   // ggml_vec_softplus_f32
  return tanh(x);
}

// @section elementwise
// ------------------------------------------------------------------------------------------------
// element-wise
// ------------------------------------------------------------------------------------------------

// the 4-D index (x outermost .. w innermost) of element i of a row-major shape (the memory section's cont too)
DEVICE_FN uint4 unravel4(uint i, uint4 shape) {
  uint i3 = i % shape.w, r = i / shape.w;
  uint i2 = r % shape.z; r /= shape.z;
  return UINT4(r / shape.y, r % shape.y, i2, i3);
}

// a (4-D shape ashape) op b repeated to it (ggml_repeat: b's shape divides a's along every axis)
KERNEL void binary(ARGS_binary) {
  U4(ashape); U4(bshape);
  uint i = get_global_id(0);
  if (i >= n) return;
  uint4 ix = unravel4(i, ashape);
  uint bi = (((ix.x % bshape.x) * bshape.y + ix.y % bshape.y) * bshape.z + ix.z % bshape.z) * bshape.w + ix.w % bshape.w;
  float x = a[a_off + i], y = b[b_off + bi];
  o[o_off + i] = op == OP_ADD ? x + y : x * y;
}

KERNEL void unary(ARGS_unary) {
  uint i = get_global_id(0);
  if (i >= n) return;
  float x = a[a_off + i];
  o[o_off + i] = op == OP_SCALE ? x * s : act(op, x);
}

KERNEL void glu(ARGS_glu) {
  uint i = get_global_id(0);
  if (i >= n) return;
  o[o_off + i] = act(op, g[g_off + i]) * v[v_off + i];
}

// @section rows
// ------------------------------------------------------------------------------------------------
// rows: RMS norm (optionally times a gain, the models' norm), softmax. One work-group of RWG a row.
// ------------------------------------------------------------------------------------------------

// the sum (or max) of red[0..RWG) into red[0], in a fixed order
#define TREE(red, li, OPR)                                            \
  for (uint s_ = RWG / 2; s_ > 0; s_ >>= 1) {                         \
    if ((li) < s_) red[li] = OPR(red[li], red[(li) + s_]);            \
    LOCAL_BARRIER();                                     \
  }
#define PLUS(x, y) ((x) + (y))

KERNEL_WG(RWG) void rms_norm(ARGS_rms_norm) {
  LOCAL float red[RWG];
  uint row = get_group_id(0), li = get_local_id(0);
  uint base = a_off + row * ncols;
  float s = 0.0f;
  for (uint c = li; c < ncols; c += RWG) { float x = a[base + c]; s += x * x; }
  red[li] = s;
  LOCAL_BARRIER();
  TREE(red, li, PLUS)
  float sc = 1.0f / sqrt(red[0] * (1.0f / (float)ncols) + eps);
  uint ob = o_off + row * ncols;
  for (uint c = li; c < ncols; c += RWG) {
    float y = a[base + c] * sc;
    if (has_gain) y *= gain[gain_off + c % glen];
    if (has_r) y += r[r_off + row * ncols + c];
    o[ob + c] = y;
  }
}

DEVICE_FN float sm_val(GLOBAL const float* RESTRICT a, uint base, GLOBAL const float* RESTRICT mk, uint mb,
                    uint c, uint has_mask, float scale) {
  float x = a[base + c] * scale;
  if (has_mask) x += max(mk[mb + c], NEG_BIG);
  return x;
}

// softmax(a * scale + mask) over rows of ncols; the mask (t rows) repeats over the leading axes
KERNEL_WG(RWG) void soft_max(ARGS_soft_max) {
  LOCAL float red[RWG];
  uint row = get_group_id(0), li = get_local_id(0);
  uint base = a_off + row * ncols, mb = mk_off + (row % t) * ncols;
  float m = NEG_BIG;
  for (uint c = li; c < ncols; c += RWG) m = max(m, sm_val(a, base, mk, mb, c, has_mask, scale));
  red[li] = m;
  LOCAL_BARRIER();
  TREE(red, li, max)
  float mx = red[0];
  LOCAL_BARRIER();
  float s = 0.0f;
  for (uint c = li; c < ncols; c += RWG) s += exp(sm_val(a, base, mk, mb, c, has_mask, scale) - mx);
  red[li] = s;
  LOCAL_BARRIER();
  TREE(red, li, PLUS)
  float inv = 1.0f / red[0];
  uint ob = o_off + row * ncols;
  for (uint c = li; c < ncols; c += RWG) o[ob + c] = exp(sm_val(a, base, mk, mb, c, has_mask, scale) - mx) * inv;
}

// ARGMAX over (value, index, not-finite) triples: the larger value wins, the lower index among equal ones; an
// index of -1 is none yet. Each row's columns in nb parts (argmax_part: a work-group a part, enough of them to
// fill the device), then a work-group a row combines its parts (argmax); the index is written as an int into
// o's words, -1 where the row holds a value that is not finite (greedy sampling on the device keeps the check
// of the logits)
#define AM_TAKE(bv, bi, v, j) if ((j) >= 0 && ((bi) < 0 || (v) > (bv) || ((v) == (bv) && (j) < (bi)))) { bv = v; bi = j; }
#define AM_REDUCE(best, at, nf)                                                       \
  LOCAL float bv[RWG];                                                             \
  LOCAL int bi[RWG];                                                               \
  LOCAL int bad[RWG];                                                              \
  bv[li] = best; bi[li] = at; bad[li] = nf;                                         \
  LOCAL_BARRIER();                                                                             \
  for (uint s_ = RWG / 2; s_ > 0; s_ >>= 1) {                                       \
    if (li < s_) { AM_TAKE(bv[li], bi[li], bv[li + s_], bi[li + s_]) bad[li] |= bad[li + s_]; } \
    LOCAL_BARRIER();                                                                           \
  }

KERNEL_WG(RWG) void argmax_part(ARGS_argmax_part) {
  uint row = get_group_id(0) / nb, part = get_group_id(0) % nb, li = get_local_id(0);
  uint base = a_off + row * ncols, c1 = min(part * per + per, ncols);
  float best = 0.0f;
  int at = -1, nf = 0;
  for (uint c = part * per + li; c < c1; c += RWG) {
    float x = a[base + c];
    if (!isfinite(x)) nf = 1;
    else AM_TAKE(best, at, x, (int)c)
  }
  AM_REDUCE(best, at, nf)
  if (li == 0) {
    uint q = p_off + 3 * get_group_id(0);
    p[q] = bv[0];
    ((GLOBAL int*)p)[q + 1] = bi[0];
    ((GLOBAL int*)p)[q + 2] = bad[0];
  }
}

KERNEL_WG(RWG) void argmax(ARGS_argmax) {
  uint row = get_group_id(0), li = get_local_id(0);
  float best = 0.0f;
  int at = -1, nf = 0;
  for (uint k = li; k < nb; k += RWG) {
    uint q = p_off + 3 * (row * nb + k);
    int j = ((GLOBAL const int*)p)[q + 1];
    nf |= ((GLOBAL const int*)p)[q + 2];
    AM_TAKE(best, at, p[q], j)
  }
  AM_REDUCE(best, at, nf)
  if (li == 0) ((GLOBAL int*)o)[o_off + row] = bad[0] ? -1 : bi[0];
}

// @section flash_combine
// the partial sums of split attention (flash_attn_part: a part's acc[D], m and l) merged into o, a
// work-group of AWG a (row, head)
#define CDIMS (MAX_HEAD / AWG)   // dims a thread of the combine holds: li + AWG * j
KERNEL_WG(AWG) void flash_combine(ARGS_flash_combine) {
  uint id = get_group_id(0), li = get_local_id(0);
  uint base = p_off + id * nc * (D + 2);
  float m = NEG_BIG;
  for (uint c = 0; c < nc; c++) m = max(m, p[base + c * (D + 2) + D]);
  float l = 0.0f, acc[CDIMS];
  for (uint j = 0; j < CDIMS; j++) acc[j] = 0.0f;
  for (uint c = 0; c < nc; c++) {
    uint pc = base + c * (D + 2);
    float f = exp(p[pc + D] - m);
    l += p[pc + D + 1] * f;
    for (uint j = 0; j < CDIMS; j++) {
      uint d = li + AWG * j;
      if (d < D) acc[j] += p[pc + d] * f;
    }
  }
  for (uint j = 0; j < CDIMS; j++) {
    uint d = li + AWG * j;
    if (d < D) o[o_off + id * D + d] = acc[j] / l;
  }
}

// @section rope
// ------------------------------------------------------------------------------------------------
// rotary embedding of a (T, H, D) on its first n_dims; inv holds the n_dims / 2 frequencies (made
// on the host in float64, as the reference makes them), each divided by its frequency factor where
// the node has them (ff); angles and their cos and sin in TABLE_T (double where the build has
// HAS_FP64: the reference's values exactly); times s, the SCALE that follows it where there is one
// (Gemma's query scaling). One thread a pair.
// ------------------------------------------------------------------------------------------------

KERNEL void rope(ARGS_rope) {
  uint half_d = D / 2;
  uint i = get_global_id(0);
  if (i >= T * H * half_d) return;
  uint j = i % half_d, th = i / half_d, t = th / H;
  uint ia = a_off + th * D, io = o_off + th * D;
  uint nh = n_dims / 2;
  if (j < nh) {
    TABLE_T freq = has_ff ? inv[j] / (TABLE_T)ff[ff_off + j] : inv[j];
    TABLE_T theta = (TABLE_T)pos[pos_off + t] * freq;
    float c = (float)cos(theta), sn = (float)sin(theta);
    uint i0 = neox ? j : 2 * j, i1 = neox ? j + nh : 2 * j + 1;
    float x0 = a[ia + i0], x1 = a[ia + i1];
    o[io + i0] = (x0 * c - x1 * sn) * s;
    o[io + i1] = (x0 * sn + x1 * c) * s;
  } else {
    uint e = n_dims + 2 * (j - nh);
    o[io + e] = a[ia + e] * s;
    o[io + e + 1] = a[ia + e + 1] * s;
  }
}

// @section memory
// ------------------------------------------------------------------------------------------------
// memory: SET_ROWS into a cache, CONT of a strided view, GET_ROWS of float rows, float products
// ------------------------------------------------------------------------------------------------

KERNEL void set_rows(ARGS_set_rows) {
  uint i = get_global_id(0);
  if (i >= W * T) return;
  uint t = i / W, c = i % W;
  int r = rows[rows_off + t];
  if (r < 0 || (uint)r >= nrows) return;
  dst[dst_off + (uint)r * W + c] = s[s_off + i];
}

KERNEL void cont(ARGS_cont) {
  U4(shape); U4(strides);
  uint i = get_global_id(0);
  if (i >= n) return;
  uint4 ix = unravel4(i, shape);
  o[o_off + i] = a[a_off + ix.x * strides.x + ix.y * strides.y + ix.z * strides.z + ix.w * strides.w];
}

// rows of a float weight chunk (rows row0 .. row0 + nrows) or of an activation tensor
KERNEL void get_rows_f(ARGS_get_rows_f) {
  uint i = get_global_id(0);
  if (i >= W * T) return;
  uint t = i / W, c = i % W;
  uint r = (uint)rows[rows_off + t] - row0;
  if (r >= nrows) return;
  o[o_off + i] = LOADE(a, a_off + r * W + c);
}

// b (B0, B1, M, K) times a^T, a (A0, A1, N, K) repeated to b's batch axes; one chunk's rows of a
KERNEL void mul_mat_f(ARGS_mul_mat_f) {
  uint i = get_global_id(0);
  if (i >= B0 * B1 * M * rows) return;
  uint nl = i % rows, r = i / rows;
  uint m = r % M, bb = r / M, i1 = bb % B1, i0 = bb / B1;
  uint j0 = i0 / (B0 / A0), j1 = i1 / (B1 / A1);
  uint ab = a_off + ((j0 * A1 + j1) * rows + nl) * K;
  uint bbase = b_off + ((i0 * B1 + i1) * M + m) * K;
  float s = 0.0f;
  for (uint kk = 0; kk < K; kk++) s += LOADE(a, ab + kk) * b[bbase + kk];
  o[o_off + ((i0 * B1 + i1) * M + m) * ld + row0 + nl] = s;
}

// @section groups
// ------------------------------------------------------------------------------------------------
// quantized weights (framework/core/weight_words.py): every kernel reads a weight through grp(a, moff, gpr, row, g), a
// 32-element group as 8 words of unsigned byte codes (lo: elements 0..15, hi: 16..31, four a word)
// and its scales: element e is (code_e - QZ) * (lo ? q.a : q.b) + q.m. Codes become floats without
// int-to-float conversions (a byte OR-ed into the mantissa of 2^23 is exactly 2^23 + byte; QZF is
// 2^23 + the zero point): conversions run at a quarter of the FMA rate on NVIDIA GPUs.
// ------------------------------------------------------------------------------------------------

typedef struct { uint4 lo, hi; float a, b, m; } grp_t;
#define M4 (SPLAT4(0x0F0F0F0Fu))
#define W4(p) ((GLOBAL const uint4*)(p))

DEVICE_FN uint pick(uint4 v, uint j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// block b's f16 scale from the scale plane (after the chunk's blocks, at word moff)
DEVICE_FN float dplane(GLOBAL const uint* RESTRICT w, uint moff, uint b) {
  return vload_half(b, (GLOBAL const half*)(w + moff));
}

// Q4_0
#define QZ_Q4_0 8
DEVICE_FN grp_t grp_Q4_0(GLOBAL const uint* RESTRICT w, uint moff, uint gpr, uint r, uint g) {
  uint b = r * gpr + g;
  uint4 q = W4(w)[b];
  float d = dplane(w, moff, b);
  grp_t o = {q & M4, (q >> 4u) & M4, d, d, 0.0f};
  return o;
}
// Q4_1
#define QZ_Q4_1 0
DEVICE_FN grp_t grp_Q4_1(GLOBAL const uint* RESTRICT w, uint moff, uint gpr, uint r, uint g) {
  uint b = (r * gpr + g) * 5u;
  float2 dm = vload_half2(0, (GLOBAL const half*)(w + b));
  uint4 q = vload4(0, w + b + 1u);
  grp_t o = {q & M4, (q >> 4u) & M4, dm.x, dm.x, dm.y};
  return o;
}
// Q5_0
#define QZ_Q5_0 16
// 4 bits -> bit 4 of each of 4 bytes (the multiply puts copies of bit k at bit 8k, with no carries)
DEVICE_FN uint4 spread4(uint4 h) { return ((h * 0x00204081u) & SPLAT4(0x01010101u)) << 4u; }
DEVICE_FN grp_t grp_Q5_0(GLOBAL const uint* RESTRICT w, uint moff, uint gpr, uint r, uint g) {
  uint b = r * gpr + g;
  uint qh = w[b * 5u];
  uint4 q = vload4(0, w + b * 5u + 1u);
  uint4 hl = spread4((SPLAT4(qh) >> UINT4(0u, 4u, 8u, 12u)) & SPLAT4(0xFu));
  uint4 hh = spread4((SPLAT4(qh) >> UINT4(16u, 20u, 24u, 28u)) & SPLAT4(0xFu));
  float d = dplane(w, moff, b);
  grp_t o = {(q & M4) | hl, ((q >> 4u) & M4) | hh, d, d, 0.0f};
  return o;
}
// Q8_0
#define QZ_Q8_0 128
// signed bytes; XOR 0x80 makes a signed byte s the unsigned s + 128
DEVICE_FN grp_t grp_Q8_0(GLOBAL const uint* RESTRICT w, uint moff, uint gpr, uint r, uint g) {
  uint b = r * gpr + g;
  float d = dplane(w, moff, b);
  grp_t o = {W4(w)[2u * b] ^ SPLAT4(0x80808080u), W4(w)[2u * b + 1u] ^ SPLAT4(0x80808080u), d, d, 0.0f};
  return o;
}
// Q4_K
#define QZ_Q4_K 0
// the super-block as it is (9 uint4): (d, dmin), 12 bytes of 6-bit scales and mins, then 128 bytes of
// nibbles: groups 2i and 2i + 1 are the low and high nibbles of bytes 32i .. 32i + 31
DEVICE_FN grp_t grp_Q4_K(GLOBAL const uint* RESTRICT w, uint moff, uint gpr, uint r, uint g) {
  uint sb = r * (gpr >> 3u) + (g >> 3u), s = g & 7u;
  uint4 h = W4(w)[sb * 9u];
  float2 dm = vload_half2(0, (GLOBAL const half*)(w + sb * 36u));
  uint sh8 = 8u * (s & 3u);
  bool lo4 = s < 4u;
  uint b0 = ((lo4 ? h.y : h.z) >> sh8) & 0xFFu;   // scale byte s
  uint b1 = ((lo4 ? h.z : h.w) >> sh8) & 0xFFu;   // scale byte s + 4
  uint bm = (h.y >> sh8) & 0xFFu;                 // scale byte s - 4 (s >= 4)
  uint sc = lo4 ? (b0 & 63u) : ((b1 & 0xFu) | ((bm >> 6) << 4));
  uint mn = lo4 ? (b1 & 63u) : ((b1 >> 4) | ((b0 >> 6) << 4));
  uint qi = sb * 9u + 1u + 2u * (s >> 1u);
  uint sh = (s & 1u) * 4u;
  float d = dm.x * (float)sc;
  grp_t o = {(W4(w)[qi] >> sh) & M4, (W4(w)[qi + 1u] >> sh) & M4, d, d, -dm.y * (float)mn};
  return o;
}
// Q6_K
#define QZ_Q6_K 32
// ql (8 uint4), qh (4 uint4), 16 signed scales (1 uint4) a super-block; d in the scale plane. Group
// gg: half n = gg / 4, quarter qd = gg % 4: low bits from ql's nibble qd / 2, high bits from qh's
// bit pair qd; its halves have scales 8n + 2qd and 8n + 2qd + 1
DEVICE_FN grp_t grp_Q6_K(GLOBAL const uint* RESTRICT w, uint moff, uint gpr, uint r, uint g) {
  uint sb = r * (gpr >> 3u) + (g >> 3u), gg = g & 7u;
  uint n = gg >> 2u, qd = gg & 3u;
  uint base = sb * 13u;
  uint li = base + 4u * n + 2u * (qd & 1u);
  uint lsh = (qd >> 1u) * 4u, hsh = 2u * qd;
  uint4 h2 = SPLAT4(0x03030303u);
  uint4 lo = ((W4(w)[li] >> lsh) & M4) | (((W4(w)[base + 8u + 2u * n] >> hsh) & h2) << 4u);
  uint4 hi = ((W4(w)[li + 1u] >> lsh) & M4) | (((W4(w)[base + 9u + 2u * n] >> hsh) & h2) << 4u);
  uint si = 8u * n + 2u * qd;
  uint scw = w[(base + 12u) * 4u + (si >> 2u)];
  float d = dplane(w, moff, sb);
  char s0 = (signed char)((scw >> (8u * (si & 3u))) & 0xFFu), s1 = (signed char)((scw >> (8u * ((si + 1u) & 3u))) & 0xFFu);
  grp_t o = {lo, hi, d * (float)s0, d * (float)s1, 0.0f};
  return o;
}
#define HAS_MIN_Q4_0 0
#define HAS_MIN_Q4_1 1
#define HAS_MIN_Q5_0 0
#define HAS_MIN_Q8_0 0
#define HAS_MIN_Q4_K 1
#define HAS_MIN_Q6_K 0
#define XCAT_(a, b) a##b
#define XCAT(a, b) XCAT_(a, b)
#define QZF_OF(t) (8388608.0f + (float)XCAT(QZ_, t))   // 2^23 + a type's zero point
DEVICE_FN float hsum(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// @section weight_type
// one weight type's build: QT_<type> names it; grp, QZ, HAS_MIN and QZF are its group function,
// zero point, whether it has a min, and 2^23 + its zero point
#if defined(QT_Q4_0)
#define QTN Q4_0
#elif defined(QT_Q4_1)
#define QTN Q4_1
#elif defined(QT_Q5_0)
#define QTN Q5_0
#elif defined(QT_Q8_0)
#define QTN Q8_0
#elif defined(QT_Q4_K)
#define QTN Q4_K
#elif defined(QT_Q6_K)
#define QTN Q6_K
#endif
#define grp XCAT(grp_, QTN)
#define QZ XCAT(QZ_, QTN)
#define HAS_MIN XCAT(HAS_MIN_, QTN)
#define QZF QZF_OF(QTN)

// @section dots
// values 4j .. 4j + 3 (lo) and 16 + 4j .. 16 + 4j + 3 (hi) of a group
DEVICE_FN float4 deq_lo(grp_t q, uint j) { return f4(pick(q.lo, j)) * q.a + q.m; }
DEVICE_FN float4 deq_hi(grp_t q, uint j) { return f4(pick(q.hi, j)) * q.b + q.m; }

// a group's dot product with 32 values of x (8 float4), the scales factored out of the sums, as four
// partial sums (lanes of a float4: no horizontal sums until the caller's last)
DEVICE_FN float4 dot32r(grp_t q, float4 x0, float4 x1, float4 x2, float4 x3, float4 x4, float4 x5, float4 x6,
                     float4 x7) {
  float4 lo = f4(q.lo.x) * x0 + f4(q.lo.y) * x1 + f4(q.lo.z) * x2 + f4(q.lo.w) * x3;
  float4 hi = f4(q.hi.x) * x4 + f4(q.hi.y) * x5 + f4(q.hi.z) * x6 + f4(q.hi.w) * x7;
  float4 r = q.a * lo + q.b * hi;
#if HAS_MIN
  r += q.m * (x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7);
#endif
  return r;
}

DEVICE_FN float4 dot32v(grp_t q, GLOBAL const float* RESTRICT x) {
  return dot32r(q, vload4(0, x), vload4(1, x), vload4(2, x), vload4(3, x), vload4(4, x), vload4(5, x),
                vload4(6, x), vload4(7, x));
}

DEVICE_FN float dot32(grp_t q, GLOBAL const float* RESTRICT x) { return hsum(dot32v(q, x)); }

// the same with x in 8 bits (quant_x's 12 words: xa, xb the 32 codes; xc (d, sum of codes 0..15, of
// 16..31, sum of x)): DOT4A(u, s, c), the plugin's, is c plus the dot product of u's unsigned and s's
// signed bytes (four products of a weight byte and an x byte); the zero point taken out through the
// sums of x's codes
DEVICE_FN float dot32w(grp_t q, uint4 xa, uint4 xb, uint4 xc) {
  int s0 = DOT4A(q.lo.w, xa.w, DOT4A(q.lo.z, xa.z, DOT4A(q.lo.y, xa.y, DOT4A(q.lo.x, xa.x, 0))));
  int s1 = DOT4A(q.hi.w, xb.w, DOT4A(q.hi.z, xb.z, DOT4A(q.hi.y, xb.y, DOT4A(q.hi.x, xb.x, 0))));
  float r = as_float(xc.x) * (q.a * (float)(s0 - QZ * (int)xc.y) + q.b * (float)(s1 - QZ * (int)xc.z));
#if HAS_MIN
  r += q.m * as_float(xc.w);
#endif
  return r;
}

// @section get_rows_q
// rows of a quantized weight chunk (the token embedding): one thread per 8 values
KERNEL void get_rows_q(ARGS_get_rows_q) {
  uint pieces = W / 8u;
  uint i = get_global_id(0);
  if (i >= pieces * T) return;
  uint t = i / pieces, pc = i % pieces;
  uint r = (uint)rows[rows_off + t] - row0;
  if (r >= nrows) return;
  uint j = pc % 4u;
  grp_t q = grp(a, a_moff, gpr, r, pc / 4u);
  uint ob = o_off + t * W + (pc / 4u) * 32u + 4u * j;
  vstore4(deq_lo(q, j), 0, o + ob);
  vstore4(deq_hi(q, j), 0, o + ob + 16u);
}

// @section matvec_q
// the build's weight by M <= MV_MM rows of f32 x (staged in LOCAL memory where MV_XL), teams of MV_TPR
// threads sharing MV_R rows: the shape and the staging as each plugin's source tells before MV_STORE
KERNEL_WG(MV_WG) void matvec_q(ARGS_matvec_q) {
  MV_RED_DECL
#if MV_XL
  LOCAL float4 xs[MV_MM * MV_XG * 9];
#endif
  uint li = get_local_id(0), team = li / MV_TPR, lane = li % MV_TPR;
  uint r0 = (get_group_id(0) * MV_TEAMS + team) * MV_R;
  float acc[MV_ACC];
#pragma unroll
  for (uint i = 0; i < MV_ACC; i++) acc[i] = 0.0f;
  uint g = lane;
  grp_t q[MV_R];
#pragma unroll
  for (uint k = 0; k < MV_R; k++) q[k] = grp(a, a_moff, gpr, min(r0 + k, N - 1u), min(g, gpr - 1u));
#if MV_XL
  LOCAL_AS float* xsf = (LOCAL_AS float*)xs;
  for (uint m = 0; m < M; m++)
    for (uint c = li; c < K; c += MV_WG) xsf[(m * MV_XG + (c >> 5)) * 36u + (c & 31u)] = x[x_off + m * K + c];
  LOCAL_BARRIER();
#endif
  while (g < gpr) {
#pragma unroll
    for (uint m = 0; m < MV_MM; m++) {
      if (m < M) {
#if MV_XL
        LOCAL_AS const float4* xg = xs + (m * MV_XG + g) * 9u;
        float4 x0 = xg[0], x1 = xg[1], x2 = xg[2], x3 = xg[3], x4 = xg[4], x5 = xg[5], x6 = xg[6], x7 = xg[7];
#else
        GLOBAL const float* xg = x + x_off + m * K + g * 32u;
        float4 x0 = vload4(0, xg), x1 = vload4(1, xg), x2 = vload4(2, xg), x3 = vload4(3, xg);
        float4 x4 = vload4(4, xg), x5 = vload4(5, xg), x6 = vload4(6, xg), x7 = vload4(7, xg);
#endif
#pragma unroll
        for (uint k = 0; k < MV_R; k++) acc[k * MV_MM + m] += hsum(dot32r(q[k], x0, x1, x2, x3, x4, x5, x6, x7));
      }
    }
    g += MV_TPR;
    if (g < gpr) {
#pragma unroll
      for (uint k = 0; k < MV_R; k++) q[k] = grp(a, a_moff, gpr, min(r0 + k, N - 1u), g);   // past N: the last row
    }
  }
  MV_STORE();
}

// @section matvec_q8
// x in 8 bits (MV_X8; xq: quant_x's groups, M rows of gpr groups, xq_off a multiple of 4): each thread's
// weight groups loaded once, then dot products with every row's group, 3 uint4 loads a row (the few KB of
// x stay in the L1 and L2 caches that every block reads them from)
KERNEL_WG(MV_WG) void matvec_q8(ARGS_matvec_q8) {
  MV_RED_DECL
  uint li = get_local_id(0), team = li / MV_TPR, lane = li % MV_TPR;
  uint r0 = (get_group_id(0) * MV_TEAMS + team) * MV_R;
  GLOBAL const uint4* RESTRICT xw = (GLOBAL const uint4*)(xq + xq_off);
  float acc[MV_ACC];
#pragma unroll
  for (uint i = 0; i < MV_ACC; i++) acc[i] = 0.0f;
  grp_t q[MV_R];
  for (uint g = lane; g < gpr; g += MV_TPR) {
#pragma unroll
    for (uint k = 0; k < MV_R; k++) q[k] = grp(a, a_moff, gpr, min(r0 + k, N - 1u), g);   // past N: the last row
#pragma unroll
    for (uint m = 0; m < MV_MM; m++) {
      if (m < M) {
        uint xi = (m * gpr + g) * 3u;
        uint4 xa = xw[xi], xb = xw[xi + 1u], xc = xw[xi + 2u];
#pragma unroll
        for (uint k = 0; k < MV_R; k++) acc[k * MV_MM + m] += dot32w(q[k], xa, xb, xc);
      }
    }
  }
  MV_STORE();
}
