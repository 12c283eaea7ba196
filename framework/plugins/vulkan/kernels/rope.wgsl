
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> CS: array<vec2<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let T = U.t; let H = U.h; let D = U.d; let nd = U.n_dims;
  let half = D / 2u;
  let i = lin(w, nw) * 256u + li;
  if (i >= T * H * half) { return; }
  let j = i % half;
  let th = i / half;
  let t = th / H;
  let base = th * D;
  let ia = off(0u) + base;
  let io = off(2u) + base;
  let nh = nd / 2u;
  if (j < nh) {
    let cs = CS[off(1u) + t * nh + j];
    var i0 = 2u * j; var i1 = 2u * j + 1u;
    if (U.neox == 1u) { i0 = j; i1 = j + nh; }
    let x0 = A[ia + i0]; let x1 = A[ia + i1];
    O[io + i0] = x0 * cs.x - x1 * cs.y;
    O[io + i1] = x0 * cs.y + x1 * cs.x;
  } else {
    let e = nd + 2u * (j - nh);
    O[io + e] = A[ia + e];
    O[io + e + 1u] = A[ia + e + 1u];
  }
}
