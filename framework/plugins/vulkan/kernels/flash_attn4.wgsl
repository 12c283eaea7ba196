
@group(0) @binding(1) var<storage, read> Q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> K: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> V: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> Mk: array<f32>;
@@out@@
var<workgroup> qs: array<vec4<f32>, 64>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let T = U.t; let H = U.h; let Hkv = U.hkv; let D4 = U.d / 4u; let S = U.s;
@@rows@@
  let t = id / H; let h = id % H;
  let hk = h / (H / Hkv);
  let hm = U.has_mask;
  let scale = U.scale;
  if (li < D4) { qs[li] = Q[off(0u) / 4u + (t * H + h) * D4 + li]; }
  workgroupBarrier();
  var m = @@neg_big@@;
  var l = 0.0;
  var acc = vec4<f32>(0.0);
  let kstride = Hkv * D4;
  let kb = off(1u) / 4u + hk * D4;
  let vb = off(2u) / 4u + hk * D4;
  let mb = off(3u) + t * S;
  for (var s0 = @@first@@; s0 < @@end@@; s0 += 64u) {
    let s = s0 + li;
    var sc = @@neg_big@@;
    if (s < @@end@@) {
      var d0 = vec4<f32>(0.0);
      var d1 = vec4<f32>(0.0);
      let kr = kb + s * kstride;
      var d = 0u;
      for (; d + 1u < D4; d += 2u) { d0 += qs[d] * K[kr + d]; d1 += qs[d + 1u] * K[kr + d + 1u]; }
      if (d < D4) { d0 += qs[d] * K[kr + d]; }
      sc = dot(d0 + d1, vec4<f32>(1.0)) * scale;
      if (hm == 1u) { sc = sc + max(Mk[mb + s], @@neg_big@@); }
    }
@@online_softmax@@    if (li < D4) {
      var j = 0u;
      for (; j + 1u < nv; j += 2u) {
        acc += ps[j] * V[vb + (s0 + j) * kstride + li] + ps[j + 1u] * V[vb + (s0 + j + 1u) * kstride + li];
      }
      if (j < nv) { acc += ps[j] * V[vb + (s0 + j) * kstride + li]; }
    }
    m = mn;
    workgroupBarrier();
  }
@@store@@
}
