
@group(0) @binding(1) var<storage, read> P: array<f32>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let i = lin(w, nw) * 256u + li;
  let N = U.n;
  if (i >= N * U.m) { return; }
  var s = 0.0;
  for (var p = 0u; p < U.splits; p++) { s += P[off(0u) + p * U.plane + i]; }
  O[off(1u) + U.col0 + (i / N) * U.ld + i % N] = s;
}
