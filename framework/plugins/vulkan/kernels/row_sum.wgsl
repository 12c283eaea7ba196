var<workgroup> rsum: array<f32, WG>;
var<workgroup> rsum8: array<f32, 8>;
// a workgroup's sum of v, in a fixed order (the same every run): eight threads each add WG / 8 of the
// values in turn, then every thread adds the eight (two barriers, not a tree's log2(WG) + 1)
fn row_sum(v: f32, li: u32) -> f32 {
  rsum[li] = v;
  workgroupBarrier();
  if (li < 8u) {
    var s = 0.0;
    for (var j = 0u; j < WG / 8u; j++) { s += rsum[li * (WG / 8u) + j]; }
    rsum8[li] = s;
  }
  workgroupBarrier();
  return ((rsum8[0] + rsum8[1]) + (rsum8[2] + rsum8[3])) + ((rsum8[4] + rsum8[5]) + (rsum8[6] + rsum8[7]));
}
