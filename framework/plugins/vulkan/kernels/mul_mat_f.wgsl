
@group(0) @binding(1) var<storage, read> A: array<{elem}>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
fn load(i: u32) -> f32 {{ {load} }}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  let NC = U.rows; let M = U.m; let K = U.k;
  let B0 = U.b0; let B1 = U.b1;
  let i = lin(w, nw) * 256u + li;
  if (i >= B0 * B1 * M * NC) {{ return; }}
  let nl = i % NC; let r = i / NC; let m = r % M; let bb = r / M; let i1 = bb % B1; let i0 = bb / B1;
  let j0 = i0 / (B0 / U.a0); let j1 = i1 / (B1 / U.a1);
  let ab = off(0u) + ((j0 * U.a1 + j1) * NC + nl) * K;
  let bbase = off(1u) + ((i0 * B1 + i1) * M + m) * K;
  var s = 0.0;
  for (var k = 0u; k < K; k++) {{ s += load(ab + k) * B[bbase + k]; }}
  O[off(2u) + ((i0 * B1 + i1) * M + m) * U.ld + U.row0 + nl] = s;
}}
