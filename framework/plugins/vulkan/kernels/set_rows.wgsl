
@group(0) @binding(1) var<storage, read> S: array<f32>;
@group(0) @binding(2) var<storage, read> R: array<i32>;
@group(0) @binding(3) var<storage, read_write> Dst: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
  let W = U.w;
  let i = lin(w, nw) * 256u + li;
  if (i >= W * U.t) { return; }
  let t = i / W; let c = i % W;
  let r = R[off(1u) + t];
  if (r < 0 || u32(r) >= U.dst_rows) { return; }
  Dst[off(2u) + u32(r) * W + c] = S[off(0u) + i];
}
