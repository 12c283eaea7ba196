// CUDA C kernels of the CUDA plugin, compiled by NVRTC (cupy.RawModule). kernels.py prepends a generated
// header: the ARGS_<kernel> parameter lists (signatures.py), the op codes (OP_*, coverage.py) and the
// build's settings (block sizes, the weight type QT_* and its layout). A build holds only the kernels its
// settings select (the base build: those that read no quantized weight; a weight type's build: its
// GET_ROWS, or one shape of one product). Tensors are a pointer plus an element offset (NAME_off), so
// views need no pointers of their own. Every reduction runs in a fixed order: a program run twice gives
// bit-identical results. The kernels keep OpenCL's vocabulary where it reads plainly (work-items of a
// work-group: a block's threads; get_global_id and friends below), with the vector helpers OpenCL C has
// built in written out here. The kernels the OpenCL plugin holds too (element-wise, rows, split
// attention's combine, rope, memory, the quantized weights' groups and dot products, GET_ROWS of a
// weight, the matrix-vector products) are written once in the skeleton's
// framework/backend/kernels/c_kernels.h: each `// @shared NAME` line below is replaced by that section
// (c_kernels.source), in the dialect defined below for CUDA.

typedef unsigned int uint;
typedef unsigned short half;        // f16 bits: loaded through cvt (no cuda_fp16.h, which NVRTC may lack)

#define get_global_id(d) (blockIdx.x * blockDim.x + threadIdx.x)
#define get_local_id(d) (threadIdx.x)
#define get_group_id(d) (blockIdx.x)

// the dialect of the kernels shared with the OpenCL plugin (framework/backend/kernels/c_kernels.h)
#define KERNEL extern "C" __global__
#define KERNEL_WG(n) extern "C" __global__ __launch_bounds__(n)
#define DEVICE_FN __device__ inline
#define GLOBAL
#define LOCAL __shared__
#define RESTRICT __restrict__
#define LOCAL_BARRIER() __syncthreads()
#define UINT4(a, b, c, d) make_uint4(a, b, c, d)
#define SPLAT4(a) make_uint4(a)   // the one-value overload below: a is read once
#define LOCAL_AS      // a pointer into LOCAL memory (CUDA's pointers are generic)

// @shared defaults

#ifdef HAS_FP64
#define TABLE_T double
#else
#define TABLE_T float
#endif

// a uint4 parameter arrives as four (NAME_x .. NAME_w: CuPy passes scalars, not vector structs)
#define U4(n) const uint4 n = make_uint4(n##_x, n##_y, n##_z, n##_w)

// -- OpenCL C's vector arithmetic, for the types the kernels use ------------------------------------
__device__ inline float4 make_float4(float a) { return make_float4(a, a, a, a); }
__device__ inline uint4 make_uint4(uint a) { return make_uint4(a, a, a, a); }
#define V4_OP(T, OP)                                                                                       \
  __device__ inline T operator OP(T a, T b) { T r = {a.x OP b.x, a.y OP b.y, a.z OP b.z, a.w OP b.w}; return r; } \
  __device__ inline T& operator OP##=(T& a, T b) { a = a OP b; return a; }
#define V4_SCALAR(T, S, OP)                                                                                \
  __device__ inline T operator OP(T a, S b) { return a OP make_##T(b); }                                \
  __device__ inline T operator OP(S a, T b) { return make_##T(a) OP b; }
V4_OP(float4, +) V4_OP(float4, -) V4_OP(float4, *) V4_OP(float4, /)
V4_SCALAR(float4, float, +) V4_SCALAR(float4, float, -) V4_SCALAR(float4, float, *) V4_SCALAR(float4, float, /)
V4_OP(uint4, &) V4_OP(uint4, |) V4_OP(uint4, ^) V4_OP(uint4, >>) V4_OP(uint4, <<) V4_OP(uint4, *)
V4_SCALAR(uint4, uint, &) V4_SCALAR(uint4, uint, >>) V4_SCALAR(uint4, uint, <<) V4_SCALAR(uint4, uint, *)

__device__ inline float as_float(uint u) { return __uint_as_float(u); }
__device__ inline uint as_uint(float f) { return __float_as_uint(f); }
__device__ inline float4 as_float4(uint4 u) {
  return make_float4(__uint_as_float(u.x), __uint_as_float(u.y), __uint_as_float(u.z), __uint_as_float(u.w));
}
__device__ inline float4 vload4(uint i, const float* p) { p += 4 * i; return make_float4(p[0], p[1], p[2], p[3]); }
__device__ inline uint4 vload4(uint i, const uint* p) { p += 4 * i; return make_uint4(p[0], p[1], p[2], p[3]); }
__device__ inline void vstore4(float4 v, uint i, float* p) { p += 4 * i; p[0] = v.x; p[1] = v.y; p[2] = v.z; p[3] = v.w; }
__device__ inline float half_to_float(half h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ inline float vload_half(uint i, const half* p) { return half_to_float(p[i]); }
__device__ inline float2 vload_half2(uint i, const half* p) {
  return make_float2(half_to_float(p[2 * i]), half_to_float(p[2 * i + 1]));
}
#if PTX_SHFL   // a butterfly exchange between the lanes of a warp (every lane takes part)
__device__ inline float shfl_xor(float v, uint m) { return __shfl_xor_sync(0xffffffffu, v, m); }
#endif


// @shared act

#ifndef QT_WPB   // the base build: every kernel that reads no quantized weight

// @shared elementwise

// @shared rows

// ------------------------------------------------------------------------------------------------
// attention: q (T, H, D), k and v (S, Hkv, D), mask (T, S). A block of AWG threads (AWG / 32 warps) per
// query row and head (and part of the keys, for decode); warp w takes keys w, w + AWG / 32, ...; lane l
// holds dims l + 32 j of q, of a key's and a value's rows (a warp reads a row as whole 128-byte lines)
// and of its output. Why warps: a key's score is one row read by a warp and summed by shuffles, with
// no block-wide barrier a key, so a warp's next keys' loads are in flight while it sums (the block-
// wide tree a block of 64 keys this replaced cost about 30 us a layer for 256 keys on an H100).
// ------------------------------------------------------------------------------------------------

#define ANW (AWG / 32)
#define ADIMS (MAX_HEAD / 32)

// The keys [s_begin, s_end) narrowed to those from the first the mask lets the row see to the last: a key
// outside adds exp(NEG_BIG - max) = 0 (the padded window's empty cells, a causal row's future), so its rows
// of k and v are not read. The mask is read once by the whole block (a float a key, against a row of k
// and of v a key), and the loop over the keys keeps no branch a key (one would stop the next keys' loads
// being issued ahead). Prefill's attention only: decode's parts are a few keys a warp, bound by latency,
// and the extra pass made them slower.
__device__ inline void visible(const float* __restrict__ mk, uint mb, uint* s_begin, uint* s_end) {
  __shared__ uint lim[2 * ANW];
  uint li = get_local_id(0), lane = li & 31u, w = li >> 5;
  uint lo = *s_end, hi = *s_begin;
  for (uint s = *s_begin + li; s < *s_end; s += AWG)
    if (mk[mb + s] > NEG_BIG) { lo = min(lo, s); hi = s + 1u; }
#pragma unroll
  for (uint o = 16; o > 0; o >>= 1) {
    lo = min(lo, __shfl_xor_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  }
  if (lane == 0) { lim[w] = lo; lim[ANW + w] = hi; }
  __syncthreads();
  for (uint u = 0; u < ANW; u++) { lo = min(lo, lim[u]); hi = max(hi, lim[ANW + u]); }
  *s_begin = lo;
  *s_end = hi;       // none visible: lo = the end, hi = the beginning (no key: m stays NEG_BIG, l 0)
}

// keys [s_begin, s_end) of query row t, head h (narrowed by the mask where `narrow`): the running max m,
// sum l and output acc (unnormalised), each warp's own, then merged in a fixed order (every warp gets the
// merge; acc: this lane's dims)
__device__ inline void attend(const float* __restrict__ q, uint qb, const float* __restrict__ k, uint kb,
                   const float* __restrict__ v, uint vb, const float* __restrict__ mk, uint mb,
                   uint kstride, uint D, uint s_begin, uint s_end, uint has_mask, float scale,
                   float* sm, float* m_out, float* l_out, float acc[ADIMS], bool narrow) {
  uint li = get_local_id(0), lane = li & 31u, w = li >> 5;
  float qr[ADIMS], a[ADIMS];
#pragma unroll
  for (uint j = 0; j < ADIMS; j++) {
    uint d = lane + 32u * j;
    qr[j] = d < D ? q[qb + d] : 0.0f;
    a[j] = 0.0f;
  }
  float m = NEG_BIG, l = 0.0f;
  if (narrow && has_mask) visible(mk, mb, &s_begin, &s_end);
#pragma unroll 4
  for (uint s = s_begin + w; s < s_end; s += ANW) {
    uint kr = kb + s * kstride + lane, vr = vb + s * kstride + lane;
    float dot = 0.0f;
#pragma unroll
    for (uint j = 0; j < ADIMS; j++)
      if (lane + 32u * j < D) dot += qr[j] * k[kr + 32u * j];
#pragma unroll
    for (uint o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    dot = __shfl_sync(0xffffffffu, dot, 0);       // lane 0's sum: every lane the same bits
    float sc = dot * scale + (has_mask ? max(mk[mb + s], NEG_BIG) : 0.0f);
    float mn = max(m, sc), alpha = exp(m - mn), p = exp(sc - mn);
    l = l * alpha + p;
#pragma unroll
    for (uint j = 0; j < ADIMS; j++)
      if (lane + 32u * j < D) a[j] = a[j] * alpha + p * v[vr + 32u * j];
    m = mn;
  }
  float* mine = sm + w * (MAX_HEAD + 2u);
#pragma unroll
  for (uint j = 0; j < ADIMS; j++) mine[lane + 32u * j] = a[j];
  if (lane == 0) { mine[MAX_HEAD] = m; mine[MAX_HEAD + 1u] = l; }
  __syncthreads();
  float mm = NEG_BIG, ll = 0.0f;
  for (uint u = 0; u < ANW; u++) mm = max(mm, sm[u * (MAX_HEAD + 2u) + MAX_HEAD]);
#pragma unroll
  for (uint j = 0; j < ADIMS; j++) acc[j] = 0.0f;
  for (uint u = 0; u < ANW; u++) {
    const float* other = sm + u * (MAX_HEAD + 2u);
    float f = exp(other[MAX_HEAD] - mm);
    ll += other[MAX_HEAD + 1u] * f;
#pragma unroll
    for (uint j = 0; j < ADIMS; j++) acc[j] += other[lane + 32u * j] * f;
  }
  *m_out = mm;
  *l_out = ll;
}

extern "C" __global__ void __launch_bounds__(AWG) flash_attn(ARGS_flash_attn) {
  __shared__ float sm[ANW * (MAX_HEAD + 2)];
  uint id = get_group_id(0), lane = get_local_id(0) & 31u;
  uint t = id / H, h = id % H, hk = h / (H / Hkv);
  float acc[ADIMS], m, l;
  attend(q, q_off + (t * H + h) * D, k, k_off + hk * D, v, v_off + hk * D, mk, mk_off + t * S, Hkv * D, D, 0, S,
         has_mask, scale, sm, &m, &l, acc, true);
  uint ob = o_off + (t * H + h) * D;
  if (get_local_id(0) < 32u) {
#pragma unroll
    for (uint j = 0; j < ADIMS; j++) {
      uint d = lane + 32u * j;
      if (d < D) o[ob + d] = l > 0.0f ? acc[j] / l : 0.0f;   // a row that sees no key: 0, as ggml's
    }
  }
}

// Few query rows (decode) would leave most of a GPU idle: the keys are cut into nc parts of `per`,
// one work-group per (row, head, part) writes its (acc[D], m, l) to p; flash_combine merges them.
extern "C" __global__ void __launch_bounds__(AWG) flash_attn_part(ARGS_flash_attn_part) {
  __shared__ float sm[ANW * (MAX_HEAD + 2)];
  uint idc = get_group_id(0), lane = get_local_id(0) & 31u;
  uint id = idc / nc, c = idc % nc;
  uint t = id / H, h = id % H, hk = h / (H / Hkv);
  uint s0 = c * per, s1 = min(S, s0 + per);
  float acc[ADIMS], m, l;
  attend(q, q_off + (t * H + h) * D, k, k_off + hk * D, v, v_off + hk * D, mk, mk_off + t * S, Hkv * D, D, s0, s1,
         has_mask, scale, sm, &m, &l, acc, false);
  uint pb = p_off + idc * (D + 2);
  if (get_local_id(0) < 32u) {
#pragma unroll
    for (uint j = 0; j < ADIMS; j++) {
      uint d = lane + 32u * j;
      if (d < D) p[pb + d] = acc[j];
    }
    if (lane == 0) { p[pb + D] = m; p[pb + D + 1] = l; }
  }
}

// @shared flash_combine

// @shared rope

// The attention block's q, k and v of one new token (fused.py's attention groups): each head's norm
// (Gemma's q and k norms), the rope, q's scale; k and v written into the caches at row kr, q into q. One
// block of RWG threads a head: the H query heads, then the Hkv key/value heads.
extern "C" __global__ void __launch_bounds__(RWG) rope_kv(ARGS_rope_kv) {
  __shared__ float row[MAX_HEAD], red[RWG];
  uint b = get_group_id(0), li = get_local_id(0);
  bool isq = b < H;
  uint hh = isq ? b : b - H;
  const float* src = isq ? qp : kp;
  uint sb = (isq ? qp_off : kp_off) + hh * D;
  float ss = 0.0f;
  for (uint d = li; d < D; d += RWG) { float x = src[sb + d]; row[d] = x; ss += x * x; }
  red[li] = ss;
  __syncthreads();
  TREE(red, li, PLUS)
  uint has_n = isq ? has_qn : has_kn;
  const float* gn = isq ? gq : gk;
  uint gb = isq ? gq_off : gk_off;
  float rn = has_n ? 1.0f / sqrt(red[0] * (1.0f / (float)D) + (isq ? q_eps : k_eps)) : 1.0f;
  float s = isq ? q_scale : 1.0f;
  uint kr = (uint)krow[krow_off];
  if (!isq && kr >= cache_rows) return;       // no row to write (a negative index)
  float* dst = isq ? q : kc;
  uint db = isq ? q_off + hh * D : kc_off + (kr * Hkv + hh) * D;
  uint nh = n_dims / 2;
  TABLE_T p = (TABLE_T)pos[pos_off];
  for (uint j = li; j < D / 2; j += RWG) {
    if (j < nh) {
      TABLE_T theta = p * inv[j];
      float c = (float)cos(theta), sn = (float)sin(theta);
      uint i0 = neox ? j : 2 * j, i1 = neox ? j + nh : 2 * j + 1;
      float x0 = row[i0] * rn, x1 = row[i1] * rn;
      if (has_n) { x0 *= gn[gb + i0]; x1 *= gn[gb + i1]; }
      dst[db + i0] = (x0 * c - x1 * sn) * s;
      dst[db + i1] = (x0 * sn + x1 * c) * s;
    } else {
      uint e = n_dims + 2 * (j - nh);
      float x0 = row[e] * rn, x1 = row[e + 1] * rn;
      if (has_n) { x0 *= gn[gb + e]; x1 *= gn[gb + e + 1]; }
      dst[db + e] = x0 * s;
      dst[db + e + 1] = x1 * s;
    }
  }
  if (!isq) {
    for (uint d = li; d < D; d += RWG) vc[vc_off + (kr * Hkv + hh) * D + d] = vp[vp_off + hh * D + d];
  }
}

// @shared memory

// rows of x in 8 bits (as ggml's q8_1), for products of several rows of x: per 32-element group the codes
// round(x / d), d = max|x| / 127, as bytes, then (d, sum of codes 0..15, of 16..31, sum of x): 12 words a
// group. A warp a group, a lane a value: its max and sums by shuffles in a fixed order (one thread a group,
// its 32 loads in a row, took 5.5 us a launch, a tenth of a verification step). The weight is then read once
// for all rows (matvec_q8), each row's group 48 bytes where f32 staging took 144.
extern "C" __global__ void quant_x(ARGS_quant_x) {
  uint i = get_global_id(0), g = i >> 5, l = i & 31u;
  if (g >= groups) return;                  // whole warps: groups * 32 threads exactly fill them
  float v = x[x_off + i];
  float mx = fabsf(v), sx = v;
#pragma unroll
  for (uint s = 16; s > 0; s >>= 1) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, s));
    sx += __shfl_xor_sync(0xffffffffu, sx, s);
  }
  float d = mx / 127.0f, id = d > 0.0f ? 1.0f / d : 0.0f;
  int q = __float2int_rn(v * id), h = q;
#pragma unroll
  for (uint s = 8; s > 0; s >>= 1) h += __shfl_xor_sync(0xffffffffu, h, s);   // within each half of the warp
  uint* o = (uint*)(xq + xq_off) + g * 12u;
  ((unsigned char*)o)[l] = (unsigned char)(q & 0xFF);
  if (l == 0) { o[8] = as_uint(d); o[9] = (uint)h; o[11] = as_uint(sx); }
  if (l == 16) o[10] = (uint)h;
}

// ------------------------------------------------------------------------------------------------
#endif  // the base build

#ifdef QT_WPB
// @shared groups

// @shared weight_type
// the four bytes of w as floats less the zero point: byte k moved into the mantissa of 2^23 by one byte
// permute (PRMT: byte k of w, two zero bytes, 0x4B), where shifting, masking and OR-ing took three
__device__ inline float4 f4z(uint w, float qzf) {
  return make_float4(__uint_as_float(__byte_perm(w, 0x4B000000u, 0x7440u)),
                     __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7441u)),
                     __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7442u)),
                     __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7443u))) - make_float4(qzf);
}
__device__ inline float4 f4(uint w) { return f4z(w, QZF); }

// DOT4A (the shared dot32w's): PTX's dp4a, four products of an unsigned weight byte and a signed x byte an
// instruction, in integers
__device__ inline int dp4a_us(uint u, uint s, int c) {
  int r;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(r) : "r"(u), "r"(s), "r"(c));
  return r;
}
#define DOT4A(u, s, c) dp4a_us((u), (s), (c))

// @shared dots

// dot32r for a weight of another type than the build's (its zero point and whether it has a min)
__device__ inline float4 dot32z(grp_t q, float qzf, int has_min, float4 x0, float4 x1, float4 x2, float4 x3, float4 x4,
                                float4 x5, float4 x6, float4 x7) {
  float4 lo = f4z(q.lo.x, qzf) * x0 + f4z(q.lo.y, qzf) * x1 + f4z(q.lo.z, qzf) * x2 + f4z(q.lo.w, qzf) * x3;
  float4 hi = f4z(q.hi.x, qzf) * x4 + f4z(q.hi.y, qzf) * x5 + f4z(q.hi.z, qzf) * x6 + f4z(q.hi.w, qzf) * x7;
  float4 r = q.a * lo + q.b * hi;
  if (has_min) r += q.m * (x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7);
  return r;
}
#if !defined(MV_WG) && !defined(MM_BM)   // the build of one weight type's GET_ROWS
// @shared get_rows_q
#endif

// Matrix-vector products (decode; M <= MV_MM rows of x). The output is (M, ld); this chunk's rows are
// columns col0 .. col0 + N. Teams of MV_TPR threads (a power of two; a team narrower than a warp never
// straddles two) share the groups of MV_R weight rows, each thread taking every MV_TPR-th group.
#ifdef MV_WG
#define MV_TEAMS (MV_WG / MV_TPR)
#define MV_ACC (MV_R * MV_MM)

// Each thread loads a group of x once for its MV_R rows and keeps its sums in registers until the end,
// where the team's sums meet once: by warp shuffles (PTX_SHFL), else in local memory by a fixed tree.
// f32 x: staged once per work-group in local memory (MV_XL: MV_XG groups a row, each padded to 36
// floats, so the lanes of a team, reading consecutive groups as float4s 144 bytes apart, hit distinct
// banks; from global memory, a warp's float4 load of x touches 32 cache lines); the first groups'
// weights are requested before the staging, so their latency overlaps it. x in 8 bits (MV_X8): its
// groups of 12 words, 48 bytes apart, read from global memory as uint4s (the few lines they span are
// shared by the warp).

// A team wider than a warp (MV_TPR 64 or more: rows of many groups, whose lanes would each read a long
// run of groups one after another, a memory latency each): its warps' sums (lane 0 of each holds its
// warp's, after the shuffles) meet in shared memory, added in order into the team's first thread's.
#define MV_LANES (MV_TPR < 32 ? MV_TPR : 32)
__device__ inline void team_sums(float* acc, uint n, float* sh, uint li) {
#if MV_TPR > 32
  uint w = li >> 5;
  if ((li & 31u) == 0) {
    for (uint a = 0; a < n; a++) sh[w * n + a] = acc[a];
  }
  __syncthreads();
  if (li % MV_TPR == 0) {
    for (uint a = 0; a < n; a++) {
      float t = 0.0f;
      for (uint j = 0; j < MV_TPR / 32; j++) t += sh[(w + j) * n + a];
      acc[a] = t;
    }
  }
#endif
}

// the team's sums (acc[k * MV_MM + m]: row r0 + k, row m of x) to lane 0, which stores them, plus r where
// the product is fused with the ADD that reads it (rb: r's element at the output's first; r_ld: r's row
// stride, the output's for a residual, 0 for a bias repeated over the rows)
__device__ inline void mv_store(float acc[MV_ACC], float* red, uint li, uint lane, uint r0, uint N, uint M,
                     float* __restrict__ o, uint ob, uint ld, const float* __restrict__ r, uint rb,
                     uint has_r, uint r_ld) {
#if PTX_SHFL
#pragma unroll
  for (uint s = MV_LANES / 2; s > 0; s >>= 1) {
#pragma unroll
    for (uint a = 0; a < MV_ACC; a++) acc[a] += shfl_xor(acc[a], s);
  }
  team_sums(acc, MV_ACC, red, li);
#else
#pragma unroll
  for (uint a = 0; a < MV_ACC; a++) red[a * MV_WG + li] = acc[a];
  __syncthreads();
  for (uint s = MV_TPR / 2; s > 0; s >>= 1) {
    if (lane < s) {
#pragma unroll
      for (uint a = 0; a < MV_ACC; a++) red[a * MV_WG + li] += red[a * MV_WG + li + s];
    }
    __syncthreads();
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
          o[ob + m * ld + r0 + k] = acc[k * MV_MM + m] + (has_r ? r[rb + m * r_ld + r0 + k] : 0.0f);
    }
  }
}

#if PTX_SHFL && MV_TPR > 32
#define MV_RED_DECL __shared__ float red[MV_ACC * (MV_WG / 32)];
#define MV_RED red
#elif PTX_SHFL
#define MV_RED_DECL
#define MV_RED ((float*)0)
#else
#define MV_RED_DECL __shared__ float red[MV_ACC * MV_WG];
#define MV_RED red
#endif

// the store of a team's sums in the shared matrix-vector kernels (matvec_q, matvec_q8)
#define MV_STORE() mv_store(acc, MV_RED, li, lane, r0, N, M, o, o_off + col0, ld, r, r_off + col0, has_r, r_ld)

#if !defined(F_K) && !MV_X8   // (a fused product's build holds rowvec alone)
// @shared matvec_q
#endif  // !F_K && !MV_X8

#if !defined(F_K) && MV_X8
// @shared matvec_q8
#endif

// Fused decode products (fused.py lowers the core's product groups: framework/core/graph/fusion.py).
// A prologue makes the row of x in shared memory (F_K values, each 32-element group padded to 36 floats,
// as matvec_q's staging): F_PRO 0, x = a; 1, x = rms_norm(y) * gn, where y = a (F_PRE 0), a + b (1),
// rms_norm(a) * gp + b (2: a post-norm and the residual add after it) or a * ys (3); y also written to
// y where write_y (by block 0). Then x times one weight, or gate and up (F_NW 2, both of the build's
// type), teams of MV_TPR threads sharing MV_R rows as in matvec_q; the epilogue adds the residual r
// (F_EPI 1) or takes act(op, gate) * up (2).
#ifdef F_K
#define XI(c) ((((c) >> 5) * 36u) + ((c) & 31u))

// the sum of v over the block, in a fixed order (every thread gets it): each warp's by shuffles, then
// the warps' sums in order (two barriers, where a tree over the block took one a halving)
__device__ inline float block_sum(float v, float* red, uint li) {
#pragma unroll
  for (uint s = 16; s > 0; s >>= 1) v += shfl_xor(v, s);
  if ((li & 31u) == 0) red[li >> 5] = v;
  __syncthreads();
  float r = 0.0f;
  for (uint w = 0; w < MV_WG / 32; w++) r += red[w];
  __syncthreads();
  return r;
}

__device__ inline void prologue(float* xsf, float* red, uint li, uint wid, const float* __restrict__ a, uint a_off,
                                const float* __restrict__ b, uint b_off, const float* __restrict__ gp, uint gp_off,
                                const float* __restrict__ gn, uint gn_off, float* __restrict__ y, uint y_off,
                                uint write_y, float eps, float eps1, float ys) {
#if F_PRE == 2
  float s1 = 0.0f;
  for (uint c = li; c < F_K; c += MV_WG) { float v = a[a_off + c]; s1 += v * v; }
  float r1 = 1.0f / sqrtf(block_sum(s1, red, li) * (1.0f / (float)F_K) + eps1);
#endif
  float ss = 0.0f;
  for (uint c = li; c < F_K; c += MV_WG) {
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
  float rn = 1.0f / sqrtf(block_sum(ss, red, li) * (1.0f / (float)F_K) + eps);
  for (uint c = li; c < F_K; c += MV_WG) xsf[XI(c)] *= rn * gn[gn_off + c];
#endif
  __syncthreads();
}

#define F_ACC (F_NW * MV_R)
// a weight row's group g, past N the last row (never stored)
#define FGRP(w, k, g) grp(w, w##_moff, gpr, min(r0 + (k), N - 1u), (g))

extern "C" __global__ void __launch_bounds__(MV_WG) rowvec(ARGS_rowvec) {
  __shared__ float4 xs[F_K / 32 * 9];
  __shared__ float red[MV_WG];
  const uint gpr = F_K / 32u;
  uint li = get_local_id(0), wid = get_group_id(0), team = li / MV_TPR, lane = li % MV_TPR;
  uint r0 = (wid * MV_TEAMS + team) * MV_R;
  // the first groups' weights are requested before the prologue, so their latency overlaps it
  grp_t q0[MV_R];
#if F_NW == 2
  grp_t q1[MV_R];
#endif
  uint g = lane;
#pragma unroll
  for (uint k = 0; k < MV_R; k++) {
    q0[k] = FGRP(w0, k, min(g, gpr - 1u));
#if F_NW == 2
    q1[k] = FGRP(w1, k, min(g, gpr - 1u));
#endif
  }
  prologue((float*)xs, red, li, wid, a, a_off, b, b_off, gp, gp_off, gn, gn_off, y, y_off, write_y, eps, eps1, ys);
  float acc[F_ACC];
#pragma unroll
  for (uint i = 0; i < F_ACC; i++) acc[i] = 0.0f;
  while (g < gpr) {
    const float4* xg = xs + g * 9u;
    float4 x0 = xg[0], x1 = xg[1], x2 = xg[2], x3 = xg[3], x4 = xg[4], x5 = xg[5], x6 = xg[6], x7 = xg[7];
#pragma unroll
    for (uint k = 0; k < MV_R; k++) {
      acc[k] += hsum(dot32r(q0[k], x0, x1, x2, x3, x4, x5, x6, x7));
#if F_NW == 2
      acc[MV_R + k] += hsum(dot32r(q1[k], x0, x1, x2, x3, x4, x5, x6, x7));
#endif
    }
    g += MV_TPR;
    if (g < gpr) {
#pragma unroll
      for (uint k = 0; k < MV_R; k++) {
        q0[k] = FGRP(w0, k, g);
#if F_NW == 2
        q1[k] = FGRP(w1, k, g);
#endif
      }
    }
  }
#pragma unroll
  for (uint s = MV_LANES / 2; s > 0; s >>= 1) {
#pragma unroll
    for (uint i = 0; i < F_ACC; i++) acc[i] += shfl_xor(acc[i], s);
  }
#if MV_TPR > 32
  __shared__ float tsum[F_ACC * (MV_WG / 32)];
  team_sums(acc, F_ACC, tsum, li);
#endif
  if (lane == 0) {
#pragma unroll
    for (uint k = 0; k < MV_R; k++) {
      if (r0 + k < N) {
#if F_EPI == 1
        float v = acc[k] + r[r_off + col0 + r0 + k];
#elif F_EPI == 2
        float v = act(op, acc[k]) * acc[MV_R + k];
#else
        float v = acc[k];
#endif
        o[o_off + col0 + r0 + k] = v;
      }
    }
  }
}

// An attention block's Q, K and V products of one x (fused.py): the prologue as rowvec's, then blocks
// [0, nb0) take rows of w0 (N0 rows, into o0), [nb0, nb0 + nb1) rows of w1, the rest rows of w2; each
// weight of its own type (S0, S1, S2: the build's options), plus its bias (bq, bk, bv) where bit 0, 1, 2 of
// has_b is set (Qwen2's). Teams within a warp (MV_TPR <= 32).
#ifdef F_STACK
#define STACK_SEG(S, w, N, o, bias, has, bw)                                                               \
  {                                                                                                        \
    uint r0 = ((bw) * MV_TEAMS + team) * MV_R;                                                             \
    float acc[MV_R];                                                                                       \
    for (uint k = 0; k < MV_R; k++) acc[k] = 0.0f;                                                         \
    for (uint g = lane; g < gpr; g += MV_TPR) {                                                            \
      const float4* xg = xs + g * 9u;                                                                      \
      float4 x0 = xg[0], x1 = xg[1], x2 = xg[2], x3 = xg[3], x4 = xg[4], x5 = xg[5], x6 = xg[6], x7 = xg[7]; \
      for (uint k = 0; k < MV_R; k++)                                                                      \
        acc[k] += hsum(dot32z(XCAT(grp_, S)(w, w##_moff, gpr, min(r0 + k, N - 1u), g), QZF_OF(S),          \
                              XCAT(HAS_MIN_, S), x0, x1, x2, x3, x4, x5, x6, x7));                           \
    }                                                                                                      \
    for (uint s = MV_LANES / 2; s > 0; s >>= 1)                                                            \
      for (uint k = 0; k < MV_R; k++) acc[k] += shfl_xor(acc[k], s);                                       \
    if (lane == 0)                                                                                         \
      for (uint k = 0; k < MV_R; k++)                                                                      \
        if (r0 + k < N) o[o##_off + r0 + k] = acc[k] + ((has) ? bias[bias##_off + r0 + k] : 0.0f);        \
  }

extern "C" __global__ void __launch_bounds__(MV_WG) rowvec3(ARGS_rowvec3) {
  __shared__ float4 xs[F_K / 32 * 9];
  __shared__ float red[MV_WG];
  const uint gpr = F_K / 32u;
  uint li = get_local_id(0), wid = get_group_id(0), team = li / MV_TPR, lane = li % MV_TPR;
  prologue((float*)xs, red, li, wid, a, a_off, b, b_off, gp, gp_off, gn, gn_off, y, y_off, write_y, eps, eps1, ys);
  if (wid < nb0) STACK_SEG(S0, w0, N0, o0, bq, has_b & 1u, wid)
  else if (wid < nb0 + nb1) STACK_SEG(S1, w1, N1, o1, bk, has_b & 2u, wid - nb0)
  else STACK_SEG(S2, w2, N2, o2, bv, has_b & 4u, wid - nb0 - nb1)
}
#endif  // F_STACK
#endif  // F_K
#endif  // MV_WG

// Tiled matrix product (prefill): a work-group computes an MM_BM x MM_BN tile of outputs (rows of x by
// weight rows). Per stage of MM_KG 32-element groups of K, the work-group copies x's tile and the
// weight's, dequantized once, into local memory; then either
// * MM_MMA (compute capability 8.0 on): tensor cores, mma.sync m16n8k8 on TF32 operands with f32 sums.
//   The block's MM_WM x MM_WN warps each hold MM_FM x MM_FN fragments of 16 x 8 outputs. Staged values
//   are rounded to TF32 once (cvt.rna), and rows are padded to a multiple of 4 plus 4 floats, so the 32
//   lanes' loads of a fragment (row lane / 4, column lane % 4) hit 32 distinct banks. TF32 keeps f32's
//   range, so no activation overflows as it could in f16 (the CPU plugin's own products round x to 8 bits);
// * else each thread computes MM_TM x MM_TN outputs (rows tm + i MM_BM / MM_TM, columns tn + j MM_BN / MM_TN)
//   with f32 multiply-adds.
#ifdef MM_BM
#if MM_MMA
#define MM_NT (32 * MM_WM * MM_WN)
#else
#define MM_NT ((MM_BM / MM_TM) * (MM_BN / MM_TN))
#endif
#define MM_KW (MM_KG * 32)
#define MM_RS (MM_KW + 4)

#if MM_MMA
__device__ inline float tf32(float f) {
  uint u;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(u) : "f"(f));
  return __uint_as_float(u);
}

__device__ inline void mma_tf32(float* c, const uint* a, uint b0, uint b1) {
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#define MM_ROUND(v) tf32(v)
#else
#define MM_ROUND(v) (v)
#endif


// A stage (groups g0 .. g0 + MM_KG of x's rows m0.. and of the weight's rows n0..) is loaded into registers
// (mm_load) while the previous one is multiplied, then stored dequantized into xs and ws (mm_store): the
// loads' latency overlaps the products (a grid of about one block an SM, as prefill's smaller matrices
// make, would otherwise wait for memory at every stage). Groups past the row's end are zeros.
#define MM_XN (MM_BM * 8 * MM_KG / MM_NT)   // float4s of x a thread a stage
#define MM_WE (MM_BN * 4 * MM_KG / MM_NT)   // weight quarters of groups a thread a stage
#if MM_XN * MM_NT != MM_BM * 8 * MM_KG || MM_WE * MM_NT != MM_BN * 4 * MM_KG
#error "a tiled product's stage must divide evenly among its threads"
#endif
typedef struct { float4 x[MM_XN]; grp_t w[MM_WE]; } mm_regs;

__device__ inline void mm_load(const float* __restrict__ x, uint x_off, const uint* __restrict__ a, uint a_moff,
                    uint N, uint K, uint M, uint gpr, uint m0, uint n0, uint g0, mm_regs& r) {
  uint li = get_local_id(0);
#pragma unroll
  for (uint i = 0; i < MM_XN; i++) {          // x: 8 float4 a group of a row
    uint e = li + i * MM_NT, row = e / (8u * MM_KG), qq = e % (8u * MM_KG), g = g0 + qq / 8u;
    r.x[i] = g < gpr ? vload4(0, x + x_off + min(m0 + row, M - 1u) * K + g * 32u + 4u * (qq % 8u)) : make_float4(0.0f);
  }
#pragma unroll
  for (uint i = 0; i < MM_WE; i++) {          // the weight: a quarter (4 lo + 4 hi values) of a group
    uint e = li + i * MM_NT, row = e / (4u * MM_KG), g = g0 + (e % (4u * MM_KG)) / 4u;
    r.w[i] = grp(a, a_moff, gpr, min(n0 + row, N - 1u), min(g, gpr - 1u));
  }
}

__device__ inline void mm_store(const mm_regs& r, uint gpr, uint g0, float* xs, float* ws) {
  uint li = get_local_id(0);
#pragma unroll
  for (uint i = 0; i < MM_XN; i++) {
    uint e = li + i * MM_NT, row = e / (8u * MM_KG), qq = e % (8u * MM_KG);
    float* d = xs + row * MM_RS + 4u * qq;
    d[0] = MM_ROUND(r.x[i].x); d[1] = MM_ROUND(r.x[i].y); d[2] = MM_ROUND(r.x[i].z); d[3] = MM_ROUND(r.x[i].w);
  }
#pragma unroll
  for (uint i = 0; i < MM_WE; i++) {
    uint e = li + i * MM_NT, row = e / (4u * MM_KG), jj = e % (4u * MM_KG), j = jj % 4u;
    bool in = g0 + jj / 4u < gpr;
    float4 l = in ? deq_lo(r.w[i], j) : make_float4(0.0f), h = in ? deq_hi(r.w[i], j) : make_float4(0.0f);
    float* d = ws + row * MM_RS + (jj / 4u) * 32u + 4u * j;
    d[0] = MM_ROUND(l.x); d[1] = MM_ROUND(l.y); d[2] = MM_ROUND(l.z); d[3] = MM_ROUND(l.w);
    d[16] = MM_ROUND(h.x); d[17] = MM_ROUND(h.y); d[18] = MM_ROUND(h.z); d[19] = MM_ROUND(h.w);
  }
}

extern "C" __global__ void __launch_bounds__(MM_NT) matmul_q(ARGS_matmul_q) {
  __shared__ float xs[MM_BM * MM_RS], ws[MM_BN * MM_RS];
  uint li = get_local_id(0);
  uint nbn = (N + MM_BN - 1u) / MM_BN;
  uint tile = get_group_id(0);
  uint n0 = (tile % nbn) * MM_BN, m0 = (tile / nbn) * MM_BM;
#if MM_MMA
  uint lane = li & 31u, warp = li >> 5, gi = lane >> 2, ti = lane & 3u;
  uint wm = (warp / MM_WN) * (16u * MM_FM), wn = (warp % MM_WN) * (8u * MM_FN);
  float acc[MM_FM * MM_FN * 4];
#else
  uint tn = li % (MM_BN / MM_TN), tm = li / (MM_BN / MM_TN);
  float acc[MM_TM * MM_TN];
#endif
#pragma unroll
  for (uint e = 0; e < sizeof(acc) / sizeof(float); e++) acc[e] = 0.0f;
  mm_regs next;
  mm_load(x, x_off, a, a_moff, N, K, M, gpr, m0, n0, 0, next);
  for (uint g0 = 0; g0 < gpr; g0 += MM_KG) {
    mm_store(next, gpr, g0, xs, ws);
    __syncthreads();
    if (g0 + MM_KG < gpr) mm_load(x, x_off, a, a_moff, N, K, M, gpr, m0, n0, g0 + MM_KG, next);
#if MM_MMA
#pragma unroll
    for (uint kk = 0; kk < MM_KW; kk += 8u) {
      uint fa[MM_FM][4];
#pragma unroll
      for (uint i = 0; i < MM_FM; i++) {
        const float* xr = xs + (wm + 16u * i + gi) * MM_RS + kk + ti;
        fa[i][0] = as_uint(xr[0]);
        fa[i][1] = as_uint(xr[8 * MM_RS]);
        fa[i][2] = as_uint(xr[4]);
        fa[i][3] = as_uint(xr[8 * MM_RS + 4]);
      }
#pragma unroll
      for (uint j = 0; j < MM_FN; j++) {
        const float* wr = ws + (wn + 8u * j + gi) * MM_RS + kk + ti;
        uint b0 = as_uint(wr[0]), b1 = as_uint(wr[4]);
#pragma unroll
        for (uint i = 0; i < MM_FM; i++) mma_tf32(acc + (i * MM_FN + j) * 4, fa[i], b0, b1);
      }
    }
#else
    for (uint kk = 0; kk < MM_KW; kk++) {
      float xv[MM_TM], wv[MM_TN];
      for (uint i = 0; i < MM_TM; i++) xv[i] = xs[(tm + i * (MM_BM / MM_TM)) * MM_RS + kk];
      for (uint j = 0; j < MM_TN; j++) wv[j] = ws[(tn + j * (MM_BN / MM_TN)) * MM_RS + kk];
      for (uint i = 0; i < MM_TM; i++)
        for (uint j = 0; j < MM_TN; j++) acc[i * MM_TN + j] += xv[i] * wv[j];
    }
#endif
    __syncthreads();
  }
#if MM_MMA
  // fragment (i, j)'s sums: rows gi and gi + 8 of its 16, columns 2 ti and 2 ti + 1 of its 8
#pragma unroll
  for (uint i = 0; i < MM_FM; i++)
#pragma unroll
    for (uint j = 0; j < MM_FN; j++)
#pragma unroll
      for (uint e = 0; e < 4u; e++) {
        uint m = m0 + wm + 16u * i + gi + 8u * (e >> 1), n = n0 + wn + 8u * j + 2u * ti + (e & 1u);
        if (m < M && n < N)
          o[o_off + m * ld + col0 + n] = acc[(i * MM_FN + j) * 4 + e] + (has_r ? r[r_off + m * r_ld + col0 + n] : 0.0f);
      }
#else
  for (uint i = 0; i < MM_TM; i++)
    for (uint j = 0; j < MM_TN; j++) {
      uint m = m0 + tm + i * (MM_BM / MM_TM), n = n0 + tn + j * (MM_BN / MM_TN);
      if (m < M && n < N)
        o[o_off + m * ld + col0 + n] = acc[i * MM_TN + j] + (has_r ? r[r_off + m * r_ld + col0 + n] : 0.0f);
    }
#endif
}
#endif
#endif  // QT_WPB
