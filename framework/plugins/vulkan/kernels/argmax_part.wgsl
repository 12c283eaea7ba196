// each row's columns in nb parts of per, a workgroup a part: its (value, index, not-finite) into P's words
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> P: array<u32>;
@@reduce@@
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let id = lin(w, nw);
  if (id >= U.nrows * U.nb) { return; }
  let base = off(0u) + (id / U.nb) * U.ncols;
  let c0 = (id % U.nb) * U.per;
  let c1 = min(c0 + U.per, U.ncols);
  var best = 0.0;
  var at = -1;
  var nf = 0u;
  for (var c = c0 + li; c < c1; c += 128u) {      // c rises: a thread keeps the first of its equal values
    let x = A[base + c];
    if (not_finite(x)) { nf = 1u; } else if (better(x, i32(c), best, at)) { best = x; at = i32(c); }
  }
  bv[li] = best; bi[li] = at; bad[li] = nf;
  reduce(li);
  if (li == 0u) {
    let q = off(1u) + 3u * id;
    P[q] = bitcast<u32>(bv[0]); P[q + 1u] = bitcast<u32>(bi[0]); P[q + 2u] = bad[0];
  }
}
