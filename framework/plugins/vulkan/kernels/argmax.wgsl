// a workgroup a row: its parts combined; the index written as an int into O's words, -1 where the row holds a
// value that is not finite
@group(0) @binding(1) var<storage, read> P: array<u32>;
@group(0) @binding(2) var<storage, read_write> O: array<i32>;
@@reduce@@
@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let row = lin(w, nw);
  if (row >= U.nrows) { return; }
  var best = 0.0;
  var at = -1;
  var nf = 0u;
  for (var k = li; k < U.nb; k += 128u) {
    let q = off(0u) + 3u * (row * U.nb + k);
    let v = bitcast<f32>(P[q]);
    let j = bitcast<i32>(P[q + 1u]);
    nf = nf | P[q + 2u];
    if (better(v, j, best, at)) { best = v; at = j; }
  }
  bv[li] = best; bi[li] = at; bad[li] = nf;
  reduce(li);
  if (li == 0u) { O[off(1u) + row] = select(bi[0], -1, bad[0] != 0u); }
}
