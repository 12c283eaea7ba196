
@group(0) @binding(1) var<storage, read> P: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> O: array<vec4<f32>>;
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let id = lin(w, nw);
  if (id >= U.rows) { return; }
  let D4 = U.d / 4u; let NC = U.nc;
  let base = off(0u) / 4u + id * NC * (D4 + 1u);
  var m = @@neg_big@@;
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
  if (li < D4) { O[off(1u) / 4u + id * D4 + li] = acc / l; }
}
