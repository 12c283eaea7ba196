
{xdecl}
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
{deq}
const TPR: u32 = {tpr}u;
const RPW: u32 = {rpw}u;
const WG: u32 = {wg}u;
{red_decl}
// X is read as vec4: its offset and K are multiples of 4.
@compute @workgroup_size({wg})
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  gpr = U.gpr; moff = U.moff;
  let N = U.n; let K4 = U.k / 4u; let M = U.m;
  let x4 = off(1u) / 4u;
  let rl = li / TPR; let lane = li % TPR;
  let r0 = (lin(w, nw) * RPW + rl) * {r}u;
{decl}
  if (r0 < N) {{
{rows}
    for (var g = lane; g < gpr; g += TPR) {{
      let kb = x4 + g * 8u;
{body}
    }}
  }}
{reduce}
  if (lane == 0u && r0 < N) {{
    let ob = off(2u) + U.col0 + r0;
    let ld = U.ld;
{store}
  }}
}}
