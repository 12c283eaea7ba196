// OpenCL C kernels of the OpenCL plugin (OpenCL C 1.2). kernels.py prepends a generated header: the
// ARGS_<kernel> parameter lists (signatures.py), the op codes (OP_*, framework/backend/c_kernels.py) and
// the build's settings (work-group sizes, the weight type QT_* and its layout: the skeleton's
// c_kernels.Dialect.quant_options). A build holds only the
// kernels its settings select (the base build: those that read no quantized weight; a weight type's
// build: its GET_ROWS, or one shape of one product), so each compiles quickly. Tensors are a buffer
// plus an element offset (NAME_off), so views need no sub-buffers. Every reduction runs in a fixed
// order: a program run twice gives bit-identical results. The kernels the CUDA plugin holds too
// (element-wise, rows, split attention's combine, rope, memory, the quantized weights' groups and dot
// products, GET_ROWS of a weight, the matrix-vector products) are written once in the skeleton's
// framework/backend/kernels/c_kernels.h: each `// @shared NAME` line below is replaced by that section
// (c_kernels.source), in the dialect defined below for OpenCL C.

// the dialect of the kernels shared with the CUDA plugin (framework/backend/kernels/c_kernels.h)
#define KERNEL __kernel
#define KERNEL_WG(n) __kernel __attribute__((reqd_work_group_size(n, 1, 1)))
#define DEVICE_FN inline
#define GLOBAL __global
#define LOCAL __local
#define RESTRICT restrict
#define LOCAL_BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
#define UINT4(a, b, c, d) ((uint4)(a, b, c, d))
#define SPLAT4(a) ((uint4)(a))
#define LOCAL_AS __local   // a pointer into LOCAL memory
#define U4(n)       // a uint4 parameter is whole already (CUDA's arrive as four words)

// @shared defaults

#ifdef HAS_FP64
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
#define TABLE_T double
#else
#define TABLE_T float
#endif

// ------------------------------------------------------------------------------------------------
// inline PTX, on NVIDIA's OpenCL only (its compiler takes CUDA's asm statements; the device lists no
// subgroup or integer dot product extension, but its GPUs have both): PTX_DP4A, a 4-way byte dot
// product (dp4a: unsigned bytes of u times signed bytes of s, plus c); PTX_SHFL, a butterfly exchange
// between the lanes of a warp (32 threads of consecutive local ids; every lane must take part);
// PTX_FENCE, membar.gl (OpenCL 1.2's mem_fence orders a work-item's accesses for its own work-group
// only). kernels.py builds ptx_probe first and compares its results with the values they must give, so
// a device that refuses or miscomputes any of them gets kernels without it.
// ------------------------------------------------------------------------------------------------

#if PTX_ASM_PLAIN   // the statement's spelling: GNU's reserved one, else plain asm (as kernels.ptx found)
#define PTX_ASM asm
#else
#define PTX_ASM __asm__
#endif
#if PTX_DP4A
inline int dp4a_us(uint u, uint s, int c) {
  int r;
  PTX_ASM("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(u), "r"(s), "r"(c));
  return r;
}
#endif
#if PTX_SHFL
inline float shfl_xor(float v, uint m) {
  uint r;
  PTX_ASM volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;" : "=r"(r) : "r"(as_uint(v)), "r"(m));
  return as_float(r);
}
#endif

#if PTX_FENCE   // every store before it seen device-wide before any after it (attn_block's combine)
#define GLOBAL_FENCE() PTX_ASM volatile("membar.gl;" : : : "memory")
#else
#define GLOBAL_FENCE() mem_fence(CLK_GLOBAL_MEM_FENCE)
#endif

#ifdef PTX_PROBE
// one warp: o[i] = dp4a_us(p[i], p[32 + i], i) (PTX_DP4A), o[32 + i] = i ^ 5, lane i ^ 5's value (PTX_SHFL),
// or i ^ 5 stored after a fence (PTX_FENCE)
__kernel __attribute__((reqd_work_group_size(32, 1, 1))) void ptx_probe(ARGS_ptx_probe) {
  uint i = get_local_id(0);
#if PTX_DP4A
  o[o_off + i] = (float)dp4a_us((uint)p[p_off + i], (uint)p[p_off + 32u + i], (int)i);
#endif
#if PTX_SHFL
  o[o_off + 32u + i] = shfl_xor((float)i, 5u);
#endif
#if PTX_FENCE
  GLOBAL_FENCE();
  o[o_off + 32u + i] = (float)(i ^ 5u);
#endif
}
#endif

// @shared act

#if !defined(QT_WPB) && !defined(PTX_PROBE) && !defined(FUSED)   // the base build: every kernel that reads no quantized weight

// @shared elementwise

// @shared rows

// ------------------------------------------------------------------------------------------------
// attention: q (T, H, D), k and v (S, Hkv, D), mask (T, S). One work-group of AWG threads per query
// row and head; keys in blocks of AWG, online softmax; thread li holds output dims li + AWG * j.
// ------------------------------------------------------------------------------------------------

#define ATREE(red, li, OPR)                                           \
  for (uint s_ = AWG / 2; s_ > 0; s_ >>= 1) {                         \
    if ((li) < s_) red[li] = OPR(red[li], red[(li) + s_]);            \
    barrier(CLK_LOCAL_MEM_FENCE);                                     \
  }
#define ADIMS (MAX_HEAD / AWG)

// keys [s_begin, s_end) of query row t, head h: the running max m, sum l and output acc (unnormalised)
inline void attend(__global const float* restrict q, uint qb, __global const float* restrict k, uint kb,
                   __global const float* restrict v, uint vb, __global const float* restrict mk, uint mb,
                   uint kstride, uint D, uint s_begin, uint s_end, uint has_mask, float scale,
                   __local float* qs, __local float* ps, __local float* red,
                   float* m_out, float* l_out, float acc[ADIMS]) {
  uint li = get_local_id(0);
  for (uint d = li; d < D; d += AWG) qs[d] = q[qb + d];
  barrier(CLK_LOCAL_MEM_FENCE);
  float m = NEG_BIG, l = 0.0f;
  for (uint s0 = s_begin; s0 < s_end; s0 += AWG) {
    uint s = s0 + li;
    float sc = NEG_BIG;
    if (s < s_end) {
      float dot = 0.0f;
      uint kr = kb + s * kstride;
      for (uint d = 0; d < D; d++) dot += qs[d] * k[kr + d];
      sc = dot * scale;
      if (has_mask) sc += max(mk[mb + s], NEG_BIG);
    }
    red[li] = sc;
    barrier(CLK_LOCAL_MEM_FENCE);
    ATREE(red, li, max)
    float mn = max(m, red[0]);
    barrier(CLK_LOCAL_MEM_FENCE);
    float p = s < s_end ? exp(sc - mn) : 0.0f;
    ps[li] = p;
    red[li] = p;
    barrier(CLK_LOCAL_MEM_FENCE);
    ATREE(red, li, PLUS)
    float alpha = exp(m - mn);
    l = l * alpha + red[0];
    uint nv = min((uint)AWG, s_end - s0);
    for (uint j = 0; j < ADIMS; j++) acc[j] *= alpha;
    for (uint i = 0; i < nv; i++) {
      float pi = ps[i];
      uint vr = vb + (s0 + i) * kstride;
      for (uint j = 0; j < ADIMS; j++) {
        uint d = li + AWG * j;
        if (d < D) acc[j] += pi * v[vr + d];
      }
    }
    m = mn;
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  *m_out = m;
  *l_out = l;
}

__kernel __attribute__((reqd_work_group_size(AWG, 1, 1))) void flash_attn(ARGS_flash_attn) {
  __local float qs[MAX_HEAD], ps[AWG], red[AWG];
  uint id = get_group_id(0), li = get_local_id(0);
  uint t = id / H, h = id % H, hk = h / (H / Hkv);
  float acc[ADIMS];
  for (uint j = 0; j < ADIMS; j++) acc[j] = 0.0f;
  float m, l;
  attend(q, q_off + (t * H + h) * D, k, k_off + hk * D, v, v_off + hk * D, mk, mk_off + t * S, Hkv * D, D, 0, S,
         has_mask, scale, qs, ps, red, &m, &l, acc);
  uint ob = o_off + (t * H + h) * D;
  for (uint j = 0; j < ADIMS; j++) {
    uint d = li + AWG * j;
    if (d < D) o[ob + d] = acc[j] / l;
  }
}

// Few query rows (decode) would leave most of a GPU idle: the keys are cut into nc parts of `per`,
// one work-group per (row, head, part) writes its (acc[D], m, l) to p; flash_combine merges them.
__kernel __attribute__((reqd_work_group_size(AWG, 1, 1))) void flash_attn_part(ARGS_flash_attn_part) {
  __local float qs[MAX_HEAD], ps[AWG], red[AWG];
  uint idc = get_group_id(0), li = get_local_id(0);
  uint id = idc / nc, c = idc % nc;
  uint t = id / H, h = id % H, hk = h / (H / Hkv);
  uint s0 = c * per, s1 = min(S, s0 + per);
  float acc[ADIMS];
  for (uint j = 0; j < ADIMS; j++) acc[j] = 0.0f;
  float m, l;
  attend(q, q_off + (t * H + h) * D, k, k_off + hk * D, v, v_off + hk * D, mk, mk_off + t * S, Hkv * D, D, s0, s1,
         has_mask, scale, qs, ps, red, &m, &l, acc);
  uint pb = p_off + idc * (D + 2);
  for (uint j = 0; j < ADIMS; j++) {
    uint d = li + AWG * j;
    if (d < D) p[pb + d] = acc[j];
  }
  if (li == 0) { p[pb + D] = m; p[pb + D + 1] = l; }
}

// @shared flash_combine

// The same on a CPU device: one work-item per query row and head, the keys in order, no local memory
// and no barriers (PoCL runs barrier-free kernels far faster); D a multiple of 4.
__kernel void flash_attn_seq(ARGS_flash_attn) {
  uint id = get_global_id(0);
  if (id >= T * H) return;
  uint t = id / H, h = id % H, hk = h / (H / Hkv);
  uint D4 = D / 4u, kstride = Hkv * D;
  __global const float* qr = q + q_off + (t * H + h) * D;
  float4 qv[MAX_HEAD / 4], acc[MAX_HEAD / 4];
  for (uint j = 0; j < D4; j++) { qv[j] = vload4(j, qr) * scale; acc[j] = (float4)(0.0f); }
  float m = NEG_BIG, l = 0.0f;
  for (uint s = 0; s < S; s++) {
    float mkv = has_mask ? mk[mk_off + t * S + s] : 0.0f;
    if (mkv == -INFINITY) continue;             // a masked key weighs exactly 0
    __global const float* kr = k + k_off + s * kstride + hk * D;
    float4 d4 = (float4)(0.0f);
    for (uint j = 0; j < D4; j++) d4 += qv[j] * vload4(j, kr);
    float sc = d4.x + d4.y + d4.z + d4.w + mkv;
    float mn = max(m, sc), alpha = exp(m - mn), p = exp(sc - mn);
    l = l * alpha + p;
    __global const float* vr = v + v_off + s * kstride + hk * D;
    for (uint j = 0; j < D4; j++) acc[j] = acc[j] * alpha + p * vload4(j, vr);
    m = mn;
  }
  __global float* orow = o + o_off + (t * H + h) * D;
  for (uint j = 0; j < D4; j++) vstore4(acc[j] / l, j, orow);
}

// @shared rope

// @shared memory

// ------------------------------------------------------------------------------------------------
// activations to 8 bits (as ggml's q8_1), for the integer matrix-vector kernel: per 32-element group
// the codes round(x / d), d = max|x| / 127, four a word, then (d, sum of codes 0..15, of 16..31,
// sum of x): 12 words a group. One thread a group.
// ------------------------------------------------------------------------------------------------

inline uint q4(float4 v, float id) {
  int4 q = convert_int4_rte(v * id);
  return (uint)(q.x & 0xFF) | ((uint)(q.y & 0xFF) << 8) | ((uint)(q.z & 0xFF) << 16) | ((uint)(q.w & 0xFF) << 24);
}

inline int sum4(uint w) {
  return (int)(char)(w & 0xFF) + (int)(char)((w >> 8) & 0xFF) + (int)(char)((w >> 16) & 0xFF) + (int)(char)(w >> 24);
}

__kernel void quant_x(ARGS_quant_x) {
  uint i = get_global_id(0);
  if (i >= groups) return;
  float4 v[8];
  float mx = 0.0f, sx = 0.0f;
  for (uint j = 0; j < 8; j++) {
    v[j] = vload4(0, x + x_off + i * 32 + 4 * j);
    float4 av = fabs(v[j]);
    mx = max(mx, max(max(av.x, av.y), max(av.z, av.w)));
    sx += v[j].x + v[j].y + v[j].z + v[j].w;
  }
  float d = mx / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
  __global uint* o = (__global uint*)(xq + xq_off) + i * 12;
  int s0 = 0, s1 = 0;
  for (uint j = 0; j < 8; j++) {
    uint w = q4(v[j], id);
    o[j] = w;
    if (j < 4) s0 += sum4(w); else s1 += sum4(w);
  }
  o[8] = as_uint(d); o[9] = (uint)s0; o[10] = (uint)s1; o[11] = as_uint(sx);
}

#endif  // the base build

#if defined(QT_WPB) || defined(FUSED)
// @shared groups
#endif  // the weight types' groups

#ifdef QT_WPB   // one weight type's build: QT_<type> names it
// @shared weight_type
inline float4 f4(uint w) {
  uint4 bytes = ((uint4)(w) >> (uint4)(0u, 8u, 16u, 24u)) & (uint4)(0xFFu);
  return as_float4(bytes | (uint4)(0x4B000000u)) - (float4)(QZF);
}

// DOT4A(u, s, c) (the shared dot32w's) is c plus the dot product of u's unsigned and s's signed bytes:
// PTX's dp4a where the build has it (PTX_DP4A: NVIDIA), else cl_khr_integer_dot_product's where the
// device lists it and its compiler declares it (the extension's macro), else the same sum in plain
// integer arithmetic.
#if defined(HAS_DOT4) && defined(cl_khr_integer_dot_product)
#define DOT4(u, s) dot_4x8packed_us_int((u), (s))
#else
inline int DOT4(uint u, uint s) {
  return (int)(u & 0xFFu) * (int)(char)(s & 0xFFu) + (int)((u >> 8) & 0xFFu) * (int)(char)((s >> 8) & 0xFFu)
       + (int)((u >> 16) & 0xFFu) * (int)(char)((s >> 16) & 0xFFu) + (int)(u >> 24) * (int)(char)(s >> 24);
}
#endif
#if PTX_DP4A
#define DOT4A(u, s, c) dp4a_us((u), (s), (c))
#else
#define DOT4A(u, s, c) ((c) + DOT4((u), (s)))
#endif

// @shared dots

inline float dot32q(grp_t q, __global const uint* restrict xq) {
  return dot32w(q, vload4(0, xq), vload4(1, xq), vload4(2, xq));
}

#if !defined(MV_WG) && !defined(MM_BM) && !defined(MR_TM)   // the build of one weight type's GET_ROWS
// @shared get_rows_q
#endif

// Matrix-vector products (decode; M <= MV_MM rows of x). The output is (M, ld); this chunk's rows are
// columns col0 .. col0 + N. Teams of MV_TPR threads (a power of two, at most a warp: a team never
// straddles two warps) share the groups of MV_R weight rows, each thread taking every MV_TPR-th group.
#ifdef MV_WG
#define MV_TEAMS (MV_WG / MV_TPR)
#define MV_ACC (MV_R * MV_MM)

#if MV_V == 0
// The first version, kept for comparison (FRAMEWORK_OPENCL_MATVEC=v=0): x read from global memory for
// each weight row, the team's sums meeting in local memory by a fixed tree.


// the team's sums to its lane 0, which stores them (plus the residual where the product is fused with
// the ADD that reads it: rb is the residual's element at the output's first, the same layout)
inline void mv_finish(float acc[MV_ACC], __local float* red, uint li, uint lane, uint r0, uint N, uint M,
                      __global float* restrict o, uint ob, uint ld, __global const float* restrict r, uint rb,
                      uint has_r) {
  for (uint a = 0; a < MV_ACC; a++) red[a * MV_WG + li] = acc[a];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = MV_TPR / 2; s > 0; s >>= 1) {
    if (lane < s)
      for (uint a = 0; a < MV_ACC; a++) red[a * MV_WG + li] += red[a * MV_WG + li + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lane == 0)
    for (uint k = 0; k < MV_R; k++)
      for (uint m = 0; m < MV_MM; m++)
        if (m < M && r0 + k < N)
          o[ob + m * ld + r0 + k] = red[(k * MV_MM + m) * MV_WG + li] + (has_r ? r[rb + m * ld + r0 + k] : 0.0f);
}

#if !MV_X8
__kernel __attribute__((reqd_work_group_size(MV_WG, 1, 1))) void matvec_q(ARGS_matvec_q) {
  __local float red[MV_ACC * MV_WG];
  uint li = get_local_id(0), team = li / MV_TPR, lane = li % MV_TPR;
  uint r0 = (get_group_id(0) * MV_TEAMS + team) * MV_R;
  float4 acc4[MV_ACC];
  for (uint a = 0; a < MV_ACC; a++) acc4[a] = (float4)(0.0f);
  if (r0 < N) {
    for (uint g = lane; g < gpr; g += MV_TPR) {
      for (uint k = 0; k < MV_R; k++) {
        grp_t q = grp(a, a_moff, gpr, min(r0 + k, N - 1u), g);
        for (uint m = 0; m < MV_MM; m++)
          if (m < M) acc4[k * MV_MM + m] += dot32v(q, x + x_off + m * K + g * 32u);
      }
    }
  }
  float acc[MV_ACC];
  for (uint a = 0; a < MV_ACC; a++) acc[a] = hsum(acc4[a]);
  mv_finish(acc, red, li, lane, r0, N, M, o, o_off + col0, ld, r, r_off + col0, has_r);
}

#else
__kernel __attribute__((reqd_work_group_size(MV_WG, 1, 1))) void matvec_q8(ARGS_matvec_q8) {
  __local float red[MV_ACC * MV_WG];
  uint li = get_local_id(0), team = li / MV_TPR, lane = li % MV_TPR;
  uint r0 = (get_group_id(0) * MV_TEAMS + team) * MV_R;
  __global const uint* restrict xw = (__global const uint*)(xq + xq_off);
  float acc[MV_ACC];
  for (uint a = 0; a < MV_ACC; a++) acc[a] = 0.0f;
  if (r0 < N) {
    for (uint g = lane; g < gpr; g += MV_TPR) {
      for (uint k = 0; k < MV_R; k++) {
        grp_t q = grp(a, a_moff, gpr, min(r0 + k, N - 1u), g);
        for (uint m = 0; m < MV_MM; m++)
          if (m < M) acc[k * MV_MM + m] += dot32q(q, xw + (m * gpr + g) * 12u);
      }
    }
  }
  mv_finish(acc, red, li, lane, r0, N, M, o, o_off + col0, ld, r, r_off + col0, has_r);
}
#endif

#else
// Each thread loads a group of x once for its MV_R rows and keeps its sums in registers until the end,
// where the team's sums meet once: by warp shuffles (PTX_SHFL), else in local memory by a fixed tree.
// f32 x: staged once per work-group in local memory (MV_XL: MV_XG groups a row, each padded to 36
// floats, so the lanes of a team, reading consecutive groups as float4s 144 bytes apart, hit distinct
// banks; from global memory, a warp's float4 load of x touches 32 cache lines); the first groups'
// weights are requested before the staging, so their latency overlaps it. x in 8 bits (MV_X8): its
// groups of 12 words, 48 bytes apart, read from global memory as uint4s (the few lines they span are
// shared by the warp).

// the team's sums (acc[k * MV_MM + m]: row r0 + k, row m of x) to lane 0, which stores them, plus the
// residual where the product is fused with the ADD that reads it (rb: the residual's element at the
// output's first, the same layout)
inline void mv_store(float acc[MV_ACC], __local float* red, uint li, uint lane, uint r0, uint N, uint M,
                     __global float* restrict o, uint ob, uint ld, __global const float* restrict r, uint rb,
                     uint has_r) {
#if PTX_SHFL
#pragma unroll
  for (uint s = MV_TPR / 2; s > 0; s >>= 1) {
#pragma unroll
    for (uint a = 0; a < MV_ACC; a++) acc[a] += shfl_xor(acc[a], s);
  }
#else
#pragma unroll
  for (uint a = 0; a < MV_ACC; a++) red[a * MV_WG + li] = acc[a];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = MV_TPR / 2; s > 0; s >>= 1) {
    if (lane < s) {
#pragma unroll
      for (uint a = 0; a < MV_ACC; a++) red[a * MV_WG + li] += red[a * MV_WG + li + s];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
#pragma unroll
  for (uint a = 0; a < MV_ACC; a++) acc[a] = red[a * MV_WG + li];
#endif
  if (lane == 0) {
#pragma unroll
    for (uint k = 0; k < MV_R; k++) {
#pragma unroll
      for (uint m = 0; m < MV_MM; m++)
        if (m < M && r0 + k < N)
          o[ob + m * ld + r0 + k] = acc[k * MV_MM + m] + (has_r ? r[rb + m * ld + r0 + k] : 0.0f);
    }
  }
}

#if PTX_SHFL
#define MV_RED_DECL
#define MV_RED ((__local float*)0)
#else
#define MV_RED_DECL __local float red[MV_ACC * MV_WG];
#define MV_RED red
#endif

// the store of a team's sums in the shared matrix-vector kernels (matvec_q, matvec_q8)
#define MV_STORE() mv_store(acc, MV_RED, li, lane, r0, N, M, o, o_off + col0, ld, r, r_off + col0, has_r)

#if !MV_X8
// @shared matvec_q
#else
// @shared matvec_q8
#endif
#endif  // MV_V
#endif  // MV_WG

// Tiled matrix product (prefill): a work-group computes an MM_BM x MM_BN tile of outputs (rows of x by
// weight rows), each of its threads MM_TM x MM_TN of them (rows tm + i MM_BM / MM_TM, columns
// tn + j MM_BN / MM_TN). Per 32-element group of K, the work-group copies x's tile and the weight's,
// dequantized once, into local memory (rows padded by one value against bank conflicts).
#ifdef MM_BM
#define MM_NT ((MM_BM / MM_TM) * (MM_BN / MM_TN))
#define MM_RS 33

__kernel __attribute__((reqd_work_group_size(MM_NT, 1, 1))) void matmul_q(ARGS_matmul_q) {
  __local float xs[MM_BM * MM_RS], ws[MM_BN * MM_RS];
  uint li = get_local_id(0);
  uint nbn = (N + MM_BN - 1u) / MM_BN;
  uint tile = get_group_id(0);
  uint n0 = (tile % nbn) * MM_BN, m0 = (tile / nbn) * MM_BM;
  uint tn = li % (MM_BN / MM_TN), tm = li / (MM_BN / MM_TN);
  float acc[MM_TM * MM_TN];
  for (uint e = 0; e < MM_TM * MM_TN; e++) acc[e] = 0.0f;
  for (uint g = 0; g < gpr; g++) {
    for (uint e = li; e < MM_BM * 8u; e += MM_NT) {          // x: 8 float4 a row
      uint row = e / 8u, qq = e % 8u;
      float4 v = vload4(0, x + x_off + min(m0 + row, M - 1u) * K + g * 32u + 4u * qq);
      uint xo = row * MM_RS + 4u * qq;
      xs[xo] = v.x; xs[xo + 1] = v.y; xs[xo + 2] = v.z; xs[xo + 3] = v.w;
    }
    for (uint e = li; e < MM_BN * 4u; e += MM_NT) {          // the weight: 4 x (4 lo + 4 hi) values a row
      uint row = e / 4u, j = e % 4u;
      grp_t q = grp(a, a_moff, gpr, min(n0 + row, N - 1u), g);
      float4 l = deq_lo(q, j), h = deq_hi(q, j);
      uint wo = row * MM_RS + 4u * j;
      ws[wo] = l.x; ws[wo + 1] = l.y; ws[wo + 2] = l.z; ws[wo + 3] = l.w;
      ws[wo + 16] = h.x; ws[wo + 17] = h.y; ws[wo + 18] = h.z; ws[wo + 19] = h.w;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint kk = 0; kk < 32u; kk++) {
      float xv[MM_TM], wv[MM_TN];
      for (uint i = 0; i < MM_TM; i++) xv[i] = xs[(tm + i * (MM_BM / MM_TM)) * MM_RS + kk];
      for (uint j = 0; j < MM_TN; j++) wv[j] = ws[(tn + j * (MM_BN / MM_TN)) * MM_RS + kk];
      for (uint i = 0; i < MM_TM; i++)
        for (uint j = 0; j < MM_TN; j++) acc[i * MM_TN + j] += xv[i] * wv[j];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (uint i = 0; i < MM_TM; i++)
    for (uint j = 0; j < MM_TN; j++) {
      uint m = m0 + tm + i * (MM_BM / MM_TM), n = n0 + tn + j * (MM_BN / MM_TN);
      if (m < M && n < N)
        o[o_off + m * ld + col0 + n] = acc[i * MM_TN + j] + (has_r ? r[r_off + m * ld + col0 + n] : 0.0f);
    }
}
#endif


// Register-tiled matrix product (CPU devices, for decode and prefill): each work-item computes MR_TM
// rows of x by MR_TN weight rows straight from global memory, with no local memory and no barriers
// (what PoCL runs best: it vectorises neighbouring work-items); each weight group is decoded once
// and used MR_TM times, each x group used MR_TN times.
#ifdef MR_TM
__kernel void matmul_reg(ARGS_matmul_q) {
  uint nbn = (N + MR_TN - 1u) / MR_TN;
  uint id = get_global_id(0);
  uint n0 = (id % nbn) * MR_TN, m0 = (id / nbn) * MR_TM;
  if (m0 >= M) return;
  float4 acc[MR_TM * MR_TN];
  for (uint e = 0; e < MR_TM * MR_TN; e++) acc[e] = (float4)(0.0f);
  for (uint g = 0; g < gpr; g++) {
    for (uint j = 0; j < MR_TN; j++) {
      grp_t q = grp(a, a_moff, gpr, min(n0 + j, N - 1u), g);
      for (uint i = 0; i < MR_TM; i++)
        acc[i * MR_TN + j] += dot32v(q, x + x_off + min(m0 + i, M - 1u) * K + g * 32u);
    }
  }
  for (uint i = 0; i < MR_TM; i++)
    for (uint j = 0; j < MR_TN; j++)
      if (m0 + i < M && n0 + j < N) {
        uint e = (m0 + i) * ld + col0 + n0 + j;
        o[o_off + e] = hsum(acc[i * MR_TN + j]) + (has_r ? r[r_off + e] : 0.0f);
      }
}
#endif

#endif  // QT_WPB

// ------------------------------------------------------------------------------------------------
// Fused decode kernels (one row of x; framework/core/graph/fusion.py decides which nodes each takes,
// fused.py lowers them). A prologue makes x in local memory (F_K values, each 32-element group padded
// to 36 floats, as the matrix-vector kernel's staging): F_PRO 0, x = a; 1, x = rms_norm(y) * gn, y =
// a (F_PRE 0), a + b (1), rms_norm(a) * gp + b (2: a post-norm and the residual add after it) or
// a * ys (3), y also written to y where write_y (by work-group 0). Weights may differ in type (F_T0,
// F_T1, F_T2): each is read through its own type's group function.
//
// * rowvec: products of x by one weight (or gate and up, F_NW 2), teams of F_TPR threads sharing F_R
//   rows, the sums met by warp shuffles (PTX_SHFL) or a tree in local memory; the epilogue adds the
//   residual r (F_EPI 1) or takes act(op, gate) * up (2).
// * attn_block: one work-group per (head, part of the keys) and one per head for the new key: each
//   makes x, projects its head's q (rows of wq), its per-head norm (F_QN), rope (its angle as the rope
//   kernel makes it) and the scale of q; a part attends over its keys, the new key's row left out; the
//   new key's work-group projects k and v (F_KN: k's norm; rope), writes them into the caches (the
//   first head of those sharing them) and attends over the new key alone. Partials as flash_attn_part;
//   F_SELF: the last work-group of a head to finish (a counter a head, in cnt) combines the head's
//   partials into o, in part order, so no other kernel combines them (else flash_combine does).
//   F_OWN: q, k and v are read from qp, kp and vp instead, which rowvec3 made before (heads as large as
//   Gemma 3's, where every work-group of a head projecting its rows again costs more than a launch).
// * rowvec3 (F_NW 3): x times three weights (Q, K and V) in one launch over the whole device.
// ------------------------------------------------------------------------------------------------

#ifdef FUSED
#define F_GPR (F_K / 32)
#define XI(c) ((((c) >> 5) * 36u) + ((c) & 31u))

inline float4 f4z(uint w, float qzf) {
  uint4 bytes = ((uint4)(w) >> (uint4)(0u, 8u, 16u, 24u)) & (uint4)(0xFFu);
  return as_float4(bytes | (uint4)(0x4B000000u)) - (float4)(qzf);
}

// a group's dot product with x's group at xg (9 float4: 8 of values, one of padding); q.m is 0 for the
// types without a minimum
inline float dot32z(grp_t q, __local const float4* xg, float qzf) {
  float4 x0 = xg[0], x1 = xg[1], x2 = xg[2], x3 = xg[3], x4 = xg[4], x5 = xg[5], x6 = xg[6], x7 = xg[7];
  float4 lo = f4z(q.lo.s0, qzf) * x0 + f4z(q.lo.s1, qzf) * x1 + f4z(q.lo.s2, qzf) * x2 + f4z(q.lo.s3, qzf) * x3;
  float4 hi = f4z(q.hi.s0, qzf) * x4 + f4z(q.hi.s1, qzf) * x5 + f4z(q.hi.s2, qzf) * x6 + f4z(q.hi.s3, qzf) * x7;
  return hsum(q.a * lo + q.b * hi + q.m * (((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7))));
}

#define GRP0 XCAT(grp_, F_T0)
#define QZF0 QZF_OF(F_T0)
#ifdef F_T1
#define GRP1 XCAT(grp_, F_T1)
#define QZF1 QZF_OF(F_T1)
#endif
#ifdef F_T2
#define GRP2 XCAT(grp_, F_T2)
#define QZF2 QZF_OF(F_T2)
#endif

// the sum of v over the work-group, in a fixed order (every thread gets it); wg_sum2 sums two at once
#define WG_SUM_OF(NAME, T) \
inline T NAME(T v, __local T* red, uint li) { \
  red[li] = v; \
  barrier(CLK_LOCAL_MEM_FENCE); \
  for (uint s = F_WG / 2; s > 0; s >>= 1) { \
    if (li < s) red[li] += red[li + s]; \
    barrier(CLK_LOCAL_MEM_FENCE); \
  } \
  T r = red[0]; \
  barrier(CLK_LOCAL_MEM_FENCE); \
  return r; \
}
WG_SUM_OF(wg_sum, float)
WG_SUM_OF(wg_sum2, float2)

#define PRO_ARGS __global const float* restrict a, uint a_off, __global const float* restrict b, uint b_off, \
  __global const float* restrict gp, uint gp_off, __global const float* restrict gn, uint gn_off,            \
  __global float* restrict y, uint y_off, uint write_y, float eps, float eps1, float ys
#define PRO_PASS a, a_off, b, b_off, gp, gp_off, gn, gn_off, y, y_off, write_y, eps, eps1, ys

inline void prologue(__local float* xsf, __local float* red, uint li, uint wid, PRO_ARGS) {
#if F_PRE == 2
  float s1 = 0.0f;
  for (uint c = li; c < F_K; c += F_WG) { float v = a[a_off + c]; s1 += v * v; }
  float r1 = 1.0f / sqrt(wg_sum(s1, red, li) * (1.0f / (float)F_K) + eps1);
#endif
  float ss = 0.0f;
  for (uint c = li; c < F_K; c += F_WG) {
#if F_PRE == 1
    float v = a[a_off + c] + b[b_off + c];
#elif F_PRE == 2
    float v = a[a_off + c] * r1 * gp[gp_off + c] + b[b_off + c];
#elif F_PRE == 3
    float v = a[a_off + c] * ys;
#else
    float v = a[a_off + c];
#endif
    xsf[XI(c)] = v;
    ss += v * v;
    if (write_y && wid == 0) y[y_off + c] = v;
  }
#if F_PRO == 1
  float rn = 1.0f / sqrt(wg_sum(ss, red, li) * (1.0f / (float)F_K) + eps);
  for (uint c = li; c < F_K; c += F_WG) xsf[XI(c)] *= rn * gn[gn_off + c];
#endif
  barrier(CLK_LOCAL_MEM_FENCE);
}

#ifdef F_TPR
#if F_NW < 3
__kernel __attribute__((reqd_work_group_size(F_WG, 1, 1))) void rowvec(ARGS_rowvec) {
  __local float4 xs[F_GPR * 9];
  __local float red[F_WG * F_NW * F_R];
  uint li = get_local_id(0), wid = get_group_id(0);
  prologue((__local float*)xs, red, li, wid, PRO_PASS);
  uint team = li / F_TPR, lane = li % F_TPR;
  uint r0 = (wid * (F_WG / F_TPR) + team) * F_R;
  float acc[F_NW * F_R];
#pragma unroll
  for (uint i = 0; i < F_NW * F_R; i++) acc[i] = 0.0f;
  if (r0 < N) {
    for (uint g = lane; g < F_GPR; g += F_TPR) {
#pragma unroll
      for (uint k = 0; k < F_R; k++) {
        uint row = min(r0 + k, N - 1u);
        acc[k] += dot32z(GRP0(w0, w0_moff, F_GPR, row, g), xs + g * 9u, QZF0);
#if F_NW == 2
        acc[F_R + k] += dot32z(GRP1(w1, w1_moff, F_GPR, row, g), xs + g * 9u, QZF1);
#endif
      }
    }
  }
#if PTX_SHFL
#pragma unroll
  for (uint s = F_TPR / 2; s > 0; s >>= 1) {
#pragma unroll
    for (uint i = 0; i < F_NW * F_R; i++) acc[i] += shfl_xor(acc[i], s);
  }
#else
  for (uint i = 0; i < F_NW * F_R; i++) red[i * F_WG + li] = acc[i];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = F_TPR / 2; s > 0; s >>= 1) {
    if (lane < s)
      for (uint i = 0; i < F_NW * F_R; i++) red[i * F_WG + li] += red[i * F_WG + li + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (uint i = 0; i < F_NW * F_R; i++) acc[i] = red[i * F_WG + li];
#endif
  if (lane == 0) {
#pragma unroll
    for (uint k = 0; k < F_R; k++) {
      if (r0 + k < N) {
#if F_EPI == 1
        float v = acc[k] + r[r_off + col0 + r0 + k];
#elif F_EPI == 2
        float v = act(op, acc[k]) * acc[F_R + k];
#else
        float v = acc[k];
#endif
        o[o_off + col0 + r0 + k] = v;
      }
    }
  }
}
#else
// a team's F_R sums met (shuffles, or a tree in local memory: the whole work-group reaches its barriers)
inline void team_sums(float* acc, __local float* red, uint li, uint lane) {
#if PTX_SHFL
#pragma unroll
  for (uint s = F_TPR / 2; s > 0; s >>= 1) {
#pragma unroll
    for (uint i = 0; i < F_R; i++) acc[i] += shfl_xor(acc[i], s);
  }
#else
  for (uint i = 0; i < F_R; i++) red[i * F_WG + li] = acc[i];
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = F_TPR / 2; s > 0; s >>= 1) {
    if (lane < s)
      for (uint i = 0; i < F_R; i++) red[i * F_WG + li] += red[i * F_WG + li + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (uint i = 0; i < F_R; i++) acc[i] = red[i * F_WG + li];
#endif
}

// a team's sums of its F_R rows of one of rowvec3's weights times x
#define ROWS3(GRPF, QZFV, wt, moff)                                                         \
  if (r0 < nr)                                                                              \
    for (uint g = lane; g < F_GPR; g += F_TPR)                                              \
      for (uint k = 0; k < F_R; k++)                                                        \
        acc[k] += dot32z(GRPF(wt, moff, F_GPR, min(r0 + k, nr - 1u), g), xs + g * 9u, QZFV);

// Q, K and V of an attention whose heads are large (fused.py's own_products): x made once a work-group
// by the prologue, the three weights' rows spread over the whole device (work-groups for q's rows, then
// k's, then v's; a work-group takes one weight's rows only)
__kernel __attribute__((reqd_work_group_size(F_WG, 1, 1))) void rowvec3(ARGS_rowvec3) {
  __local float4 xs[F_GPR * 9];
  __local float red[F_WG * F_R];
  uint li = get_local_id(0), wid = get_group_id(0);
  prologue((__local float*)xs, red, li, wid, PRO_PASS);
  uint team = li / F_TPR, lane = li % F_TPR, per = (F_WG / F_TPR) * F_R;
  uint g0 = (n0 + per - 1u) / per, g1 = (n1 + per - 1u) / per;
  uint which = wid < g0 ? 0u : wid < g0 + g1 ? 1u : 2u;
  uint gi = wid - (which > 0u ? g0 : 0u) - (which > 1u ? g1 : 0u);
  uint nr = which == 0u ? n0 : which == 1u ? n1 : n2;
  uint r0 = (gi * (F_WG / F_TPR) + team) * F_R;
  float acc[F_R];
  for (uint i = 0; i < F_R; i++) acc[i] = 0.0f;
  if (which == 0u) {
    ROWS3(GRP0, QZF0, w0, w0_moff)
  } else if (which == 1u) {
    ROWS3(GRP1, QZF1, w1, w1_moff)
  } else {
    ROWS3(GRP2, QZF2, w2, w2_moff)
  }
  team_sums(acc, red, li, lane);
  __global float* out = which == 0u ? o0 + o0_off : which == 1u ? o1 + o1_off : o2 + o2_off;
  if (lane == 0)
    for (uint k = 0; k < F_R; k++)
      if (r0 + k < nr) out[r0 + k] = acc[k];
}
#endif
#endif

#ifdef F_D
#define F_TPRA (F_WG / F_D)    // threads a projected row

#if !F_OWN
// this head's F_D rows of wq times x into qf and, where `kv` (the new key's work-group), its kv head's of
// wk and wv into kf and vf: one pass over the groups for the three (their loads in flight together) and
// one reduction, F_TPRA threads a row
inline void project_qkv(__global const uint* restrict wq, uint wq_moff, __global const uint* restrict wk,
                        uint wk_moff, __global const uint* restrict wv, uint wv_moff, uint h, uint hk, bool kv,
                        __local const float4* xs, __local float4* red4, __local float* qf, __local float* kf,
                        __local float* vf, uint li) {
  uint row = li / F_TPRA, lane = li % F_TPRA;
  float aq = 0.0f, ak = 0.0f, av = 0.0f;
  for (uint g = lane; g < F_GPR; g += F_TPRA) {
    aq += dot32z(GRP0(wq, wq_moff, F_GPR, h * F_D + row, g), xs + g * 9u, QZF0);
    if (kv) {
      ak += dot32z(GRP1(wk, wk_moff, F_GPR, hk * F_D + row, g), xs + g * 9u, QZF1);
      av += dot32z(GRP2(wv, wv_moff, F_GPR, hk * F_D + row, g), xs + g * 9u, QZF2);
    }
  }
  red4[li] = (float4)(aq, ak, av, 0.0f);
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint s = F_TPRA / 2; s > 0; s >>= 1) {
    if (lane < s) red4[li] += red4[li + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lane == 0) {
    float4 t = red4[li];
    qf[row] = t.x;
    if (kv) { kf[row] = t.y; vf[row] = t.z; }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
}
#endif

// ROPE's rotation of q's and k's first F_ND values (pair li's angle, the rope kernel's, made once for both:
// cos rc, sin rs), q then times s
inline void rope_qk(__local float* q, __local float* k, float rc, float rs, float s, uint li) {
  if (li < F_ND / 2) {
    uint i0 = F_NEOX ? li : 2 * li, i1 = F_NEOX ? li + F_ND / 2 : 2 * li + 1;
    float x0 = q[i0], x1 = q[i1];
    q[i0] = (x0 * rc - x1 * rs) * s;
    q[i1] = (x0 * rs + x1 * rc) * s;
    x0 = k[i0];
    x1 = k[i1];
    k[i0] = x0 * rc - x1 * rs;
    k[i1] = x0 * rs + x1 * rc;
  }
  for (uint j = F_ND + li; j < F_D; j += F_WG) q[j] *= s;
  barrier(CLK_LOCAL_MEM_FENCE);
}

// The key loop's shape: blocks of AT_KB keys, AT_TPK threads scoring a key (AT_KPT float4 of its dims
// each, interleaved so that a key's threads read adjacent float4), and AT_VG groups of threads summing
// the values (a float4 column each; group g takes keys g, g + AT_VG, ...: AT_KPT of a block). Every
// thread loads its block's keys and values at once (the first block's before q is made), so a block
// costs one memory latency.
#define AT_D4 (F_D / 4)
#define AT_TPK (AT_D4 < 8 ? AT_D4 : 8)
#define AT_KB (F_WG / AT_TPK)
#define AT_KPT (AT_D4 / AT_TPK)
#define AT_VG (F_WG / AT_D4)
#define AT_MAXP 256          // parts a head at most (fused.split_of keeps to it)

// a block's keys (kq: this thread's share of key s0 + li / AT_TPK) and values (vv: keys s0 + vg + AT_VG i,
// column vd), zeros for keys past the part; the mask of key s0 + li for the threads that sum a key's score.
// The new key's row is loaded too (it may be being written: its score is dropped and its value zeroed)
#define AT_LOAD(s0_, kr_)                                                                                 \
  {                                                                                                      \
    uint sk_ = (s0_) + key;                                                                              \
    for (uint i = 0; i < AT_KPT; i++) {                                                                  \
      uint sv_ = (s0_) + vg + AT_VG * i;                                                                 \
      kq[i] = sk_ < c1 ? k4[sk_ * kstride4 + sub + AT_TPK * i] : (float4)(0.0f);                         \
      vv[i] = sv_ < c1 && sv_ != kr_ ? v4[sv_ * kstride4 + vd] : (float4)(0.0f);                         \
    }                                                                                                    \
    mkv = has_mask && li < AT_KB && (s0_) + li < c1 ? mk[mk_off + (s0_) + li] : 0.0f;                    \
  }

__kernel __attribute__((reqd_work_group_size(F_WG, 1, 1))) void attn_block(ARGS_attn_block) {
#if !F_OWN
  __local float4 xs[F_GPR * 9];
#endif
  __local float red[F_WG], qf[F_D], kf[F_D], vf[F_D], sc[AT_KB], pl[AT_KB];
  __local float4 red4[F_WG];
#if F_QN || F_KN
  __local float2 red2[F_WG];
#endif
#if F_SELF
  __local float fm[AT_MAXP], fw[AT_MAXP];
  __local int last;
#endif
  uint li = get_local_id(0), wid = get_group_id(0);
  uint h = wid / nc1, c = wid % nc1, NC = nc1 - 1u;
  uint hk = h / (H / Hkv);
  bool newk = c == NC;
  uint c0 = newk ? 0u : c * chunk, c1 = newk ? 0u : min(S, c0 + chunk);
  uint kstride4 = Hkv * AT_D4;
  __global const float4* k4 = (__global const float4*)(kc + kc_off) + hk * AT_D4;
  __global const float4* v4 = (__global const float4*)(vc + vc_off) + hk * AT_D4;
  uint key = li / AT_TPK, sub = li % AT_TPK, vg = li / AT_D4, vd = li % AT_D4;
  float4 kq[AT_KPT], vv[AT_KPT];
  float mkv;
  AT_LOAD(c0, S)     // before anything else (the new key's row among them is zeroed once it is known)
  uint kr = (uint)krow[krow_off];           // the new key's row (a negative index: none)
  int at = pos[pos_off];
#if F_QN
  float gqv = li < F_D ? gq[gq_off + li] : 0.0f;
#endif
#if F_KN
  float gkv = li < F_D ? gk[gk_off + li] : 0.0f;
#endif
  float rc = 1.0f, rs = 0.0f;       // this thread's pair's rotation (cos, sin), for q and k alike
  if (li < F_ND / 2) {
    TABLE_T theta = (TABLE_T)at * inv[li];
    rc = (float)cos(theta);
    rs = (float)sin(theta);
  }
#if F_OWN   // q, k and v made before by rowvec3: this head's rows of them
  if (li < F_D) {
    qf[li] = qp[qp_off + h * F_D + li];
    if (newk) { kf[li] = kp[kp_off + hk * F_D + li]; vf[li] = vp[vp_off + hk * F_D + li]; }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
#else
  // every barrier below is reached by the whole work-group (no branch around one): only the new key's
  // work-group projects k and v, in the same loop as q
  prologue((__local float*)xs, red, li, wid, PRO_PASS);
  project_qkv(wq, wq_moff, wk, wk_moff, wv, wv_moff, h, hk, newk, xs, red4, qf, kf, vf, li);
#endif
#if F_QN || F_KN     // the per-head norms, one reduction for both (k's is only used by the new key's group)
  {
    float qv = li < F_D ? qf[li] : 0.0f, kv = li < F_D ? kf[li] : 0.0f;
    float2 ss = wg_sum2((float2)(qv * qv, kv * kv), red2, li);
    if (li < F_D) {
#if F_QN
      qf[li] = qv * (1.0f / sqrt(ss.x * (1.0f / (float)F_D) + q_eps)) * gqv;
#endif
#if F_KN
      kf[li] = kv * (1.0f / sqrt(ss.y * (1.0f / (float)F_D) + k_eps)) * gkv;
#endif
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
#endif
  rope_qk(qf, kf, rc, rs, q_scale, li);
  for (uint i = 0; i < AT_KPT; i++)
    if (vg + AT_VG * i == kr - c0) vv[i] = (float4)(0.0f);     // the new key's value: not this part's
  float4 q4[AT_KPT];
#pragma unroll
  for (uint i = 0; i < AT_KPT; i++) q4[i] = vload4(sub + AT_TPK * i, qf);
  float m = NEG_BIG, l = 0.0f;
  float4 acc = (float4)(0.0f);
  for (uint s0 = c0; s0 < c1; s0 += AT_KB) {
    if (s0 != c0) AT_LOAD(s0, kr)
    float dd = 0.0f;
#pragma unroll
    for (uint i = 0; i < AT_KPT; i++) dd += dot(q4[i], kq[i]);
    red[li] = dd;
    barrier(CLK_LOCAL_MEM_FENCE);
    if (li < AT_KB) {
      uint s = s0 + li;
      float t = 0.0f;
      for (uint j = 0; j < AT_TPK; j++) t += red[li * AT_TPK + j];
      sc[li] = s < c1 && s != kr ? t * scale + (has_mask ? max(mkv, NEG_BIG) : 0.0f) : NEG_BIG;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    float mn = m;
    for (uint j = 0; j < AT_KB; j++) mn = max(mn, sc[j]);
    if (li < AT_KB) pl[li] = s0 + li < c1 && s0 + li != kr ? exp(sc[li] - mn) : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    float bl = 0.0f;
    for (uint j = 0; j < AT_KB; j++) bl += pl[j];
    float alpha = exp(m - mn);
    l = l * alpha + bl;
    acc *= alpha;
#pragma unroll
    for (uint i = 0; i < AT_KPT; i++) acc += pl[vg + AT_VG * i] * vv[i];
    m = mn;
  }
  red4[li] = acc;
  float dqk = wg_sum(li < F_D ? qf[li] * kf[li] : 0.0f, red, li);     // the new key's score (its work-group's)
  if (li < AT_D4)
    for (uint g = 1; g < AT_VG; g++) acc += red4[g * AT_D4 + li];
  if (newk) {          // the new key alone, and into the caches (by the first head of those sharing them)
    if (h % (H / Hkv) == 0 && kr < cache_rows) {
      uint cb = kr * Hkv * F_D + hk * F_D;
      for (uint i = li; i < F_D; i += F_WG) { kc[kc_off + cb + i] = kf[i]; vc[vc_off + cb + i] = vf[i]; }
    }
    m = NEG_BIG;
    l = kr < S ? 1.0f : 0.0f;
    if (kr < S) m = dqk * scale + (has_mask ? max(mk[mk_off + kr], NEG_BIG) : 0.0f);
    acc = li < AT_D4 ? vload4(li, vf) * l : (float4)(0.0f);
  }
  uint pb = po_off + wid * (F_D + 2);
  if (li < AT_D4) {
    po[pb + 4 * li] = acc.x; po[pb + 4 * li + 1] = acc.y; po[pb + 4 * li + 2] = acc.z; po[pb + 4 * li + 3] = acc.w;
  }
  if (li == 0) { po[pb + F_D] = m; po[pb + F_D + 1] = l; }
#if F_SELF
  // the last of the head's work-groups to get here combines its nc1 partials (the others loop over none)
  GLOBAL_FENCE();
  barrier(CLK_LOCAL_MEM_FENCE | CLK_GLOBAL_MEM_FENCE);
  if (li == 0) last = atomic_inc((volatile __global int*)(cnt + h)) == (int)NC;
  barrier(CLK_LOCAL_MEM_FENCE);
  uint np = last ? nc1 : 0u;
  GLOBAL_FENCE();
  // volatile: read from memory, not from a copy another work-group's writes may have left stale
  volatile __global const float* pv = po + po_off + h * nc1 * (F_D + 2);
  for (uint j = li; j < np; j += F_WG) { fm[j] = pv[j * (F_D + 2) + F_D]; fw[j] = pv[j * (F_D + 2) + F_D + 1]; }
  barrier(CLK_LOCAL_MEM_FENCE);
  float M = NEG_BIG;
  for (uint j = 0; j < np; j++) M = max(M, fm[j]);
  float L = 0.0f;
  for (uint j = 0; j < np; j++) L += fw[j] * exp(fm[j] - M);
  barrier(CLK_LOCAL_MEM_FENCE);
  for (uint j = li; j < np; j += F_WG) fw[j] = exp(fm[j] - M);
  barrier(CLK_LOCAL_MEM_FENCE);
  uint G = F_WG / F_D, gi = li / F_D, d = li % F_D;
  float a_ = 0.0f;
  for (uint j = gi; j < np; j += G) a_ += pv[j * (F_D + 2) + d] * fw[j];
  red[li] = a_;
  barrier(CLK_LOCAL_MEM_FENCE);
  if (last && li < F_D) {
    for (uint g = 1; g < G; g++) a_ += red[g * F_D + li];
    o[o_off + h * F_D + li] = a_ / L;
  }
  if (last && li == 0) atomic_xchg((volatile __global int*)(cnt + h), 0);    // ready for the next run
#endif
}
#endif
#endif  // FUSED
