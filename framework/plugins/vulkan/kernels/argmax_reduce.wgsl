// ARGMAX's (value, index, not-finite) triples of a workgroup: the larger value wins, the lower index among
// equal ones; an index of -1 is none yet
var<workgroup> bv: array<f32, 128>;
var<workgroup> bi: array<i32, 128>;
var<workgroup> bad: array<u32, 128>;
fn better(v: f32, j: i32, best: f32, at: i32) -> bool {
  return j >= 0 && (at < 0 || v > best || (v == best && j < at));
}
fn not_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) == 0x7f800000u; }
fn reduce(li: u32) {
  workgroupBarrier();
  for (var k = 64u; k > 0u; k >>= 1u) {
    if (li < k) {
      if (better(bv[li + k], bi[li + k], bv[li], bi[li])) { bv[li] = bv[li + k]; bi[li] = bi[li + k]; }
      bad[li] = bad[li] | bad[li + k];
    }
    workgroupBarrier();
  }
}
