
@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
{deq}
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  gpr = U.gpr; moff = U.moff;
  let N = U.n; let K4 = U.k / 4u; let M = U.m;
  let nbn = U.nbn;
  let id = lin(w, nw) * 64u + li;
  let nb = id % nbn; let mb = id / nbn;
  let m0 = mb * {bm}u; let n0 = nb * {bn}u;
  if (m0 >= M) {{ return; }}
  let x4 = off(1u) / 4u;
{decl}
  for (var g = 0u; g < gpr; g++) {{
    for (var j = 0u; j < 4u; j++) {{
{body}
    }}
  }}
  let ob = off(2u) + U.col0;
  let ld = U.ld;
{store}
}}
