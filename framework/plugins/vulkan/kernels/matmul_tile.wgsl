
@group(0) @binding(2) var<storage, read> X: array<{xt}>;{xs_bind}
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
{deq}
const BM: u32 = {bm}u;
const BN: u32 = {bn}u;
const KG: u32 = {kg}u;
const RS: u32 = {rs}u;    // vec4 per padded row of a tile (one more than a row holds)
const TN: u32 = BN / 4u;
const NT: u32 = BM * BN / 16u;
{shared}
@compute @workgroup_size({nt})
fn main(@builtin(workgroup_id) w: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {{
  gpr = U.gpr; moff = U.moff;
  let N = U.n; let K4 = U.k / 4u; let M = U.m;
  let nbn = U.nbn;
  let tiles = nbn * ((M + BM - 1u) / BM);
  let id = lin(w, nw);
  let s = id / tiles;
  if (s >= U.splits) {{ return; }}
  let n0 = (id % tiles % nbn) * BN; let m0 = (id % tiles / nbn) * BM;
  let g0 = s * U.gps; let g1 = min(gpr, g0 + U.gps);
  let x4 = off(1u) / 4u;
  let tn = li % TN; let tm = li / TN;
{regs}
{fetch0}
  for (var g = g0; g < g1; g += KG) {{
    workgroupBarrier();
{put}
    workgroupBarrier();
    if (g + KG < g1) {{
      let gn = g + KG;
{fetch}
    }}
{mul}
  }}
  let ob = off(2u) + U.col0 + s * U.plane;
  let ld = U.ld;
{store}
}}
