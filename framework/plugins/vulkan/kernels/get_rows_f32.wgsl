
@group(0) @binding(1) var<storage, read> A: array<{elem}>;
@group(0) @binding(2) var<storage, read> R: array<i32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
fn load(i: u32) -> f32 {{ {load} }}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  let W = U.w;
  let i = lin(w, nw) * 256u + li;
  if (i >= W * U.t) {{ return; }}
  let t = i / W; let c = i % W;
  let r = u32(R[off(1u) + t]) - U.row0;
  if (r >= U.rows) {{ return; }}
  O[off(2u) + i] = load(off(0u) + r * W + c);
}}
