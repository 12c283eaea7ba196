
@group(0) @binding(1) var<storage, read> Q: array<f32>;
@group(0) @binding(2) var<storage, read> K: array<f32>;
@group(0) @binding(3) var<storage, read> V: array<f32>;
@group(0) @binding(4) var<storage, read> Mk: array<f32>;
@group(0) @binding(5) var<storage, read_write> O: array<f32>;
var<workgroup> qs: array<f32, 256>;
var<workgroup> ps: array<f32, 64>;
var<workgroup> red: array<f32, 64>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let T = U.t; let H = U.h; let Hkv = U.hkv; let D = U.d; let S = U.s;
  let id = lin(w, nw);
  if (id >= T * H) { return; }
  let t = id / H; let h = id % H;
  let hk = h / (H / Hkv);
  let hm = U.has_mask;
  let scale = U.scale;
  let qb = off(0u) + (t * H + h) * D;
  for (var d = li; d < D; d += 64u) { qs[d] = Q[qb + d]; }
  workgroupBarrier();
  var m = @@neg_big@@;
  var l = 0.0;
  var acc = vec4<f32>(0.0);
  let kstride = Hkv * D;
  let kb = off(1u) + hk * D;
  let vb = off(2u) + hk * D;
  let mb = off(3u) + t * S;
  for (var s0 = 0u; s0 < S; s0 += 64u) {
    let s = s0 + li;
    var sc = @@neg_big@@;
    if (s < S) {
      var dot = 0.0;
      let kr = kb + s * kstride;
      for (var d = 0u; d < D; d++) { dot += qs[d] * K[kr + d]; }
      sc = dot * scale;
      if (hm == 1u) { sc = sc + max(Mk[mb + s], @@neg_big@@); }
    }
@@online_softmax@@    for (var j = 0u; j < nv; j++) {
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
  let ob = off(4u) + (t * H + h) * D;
  for (var i = 0u; i < 4u; i++) {
    let d = li + 64u * i;
    if (d < D) { O[ob + d] = acc[i] / l; }
  }
}
