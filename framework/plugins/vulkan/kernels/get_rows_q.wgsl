
@group(0) @binding(2) var<storage, read> R: array<i32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
{deq}
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  gpr = U.gpr; moff = U.moff;
  let Wd = U.w;
  let pieces = Wd / 8u;
  let i = lin(w, nw) * 256u + li;
  if (i >= pieces * U.t) {{ return; }}
  let t = i / pieces; let p = i % pieces;
  let r = u32(R[off(1u) + t]) - U.row0;
  if (r >= U.rows) {{ return; }}
  let j = p % 4u;
  let q = grp(r, p / 4u);
  let lo = deq_lo(q, j); let hi = deq_hi(q, j);
  let o = off(2u) + t * Wd + (p / 4u) * 32u + 4u * j;
  for (var k = 0u; k < 4u; k++) {{ O[o + k] = lo[k]; O[o + 16u + k] = hi[k]; }}
}}
