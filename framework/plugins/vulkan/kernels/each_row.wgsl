@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let row = lin(w, nw);
  if (row >= U.nrows) { return; }
  let n = U.ncols;
  let base = off(0u) + row * n;
