
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> Mk: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
var<workgroup> red: array<f32, 128>;
fn val(base: u32, mb: u32, c: u32, hm: u32, sc: f32) -> f32 {
  var x = A[base + c] * sc;
  if (hm == 1u) { x = x + max(Mk[mb + c], @@neg_big@@); }
  return x;
}
@@each_row@@  let mb = off(1u) + (row % U.mask_rows) * n;
  let hm = U.has_mask;
  let sc = U.scale;
  var m = @@neg_big@@;
  for (var c = li; c < n; c += 128u) { m = max(m, val(base, mb, c, hm, sc)); }
  red[li] = m;
  workgroupBarrier();
  for (var k = 64u; k > 0u; k >>= 1u) {
    if (li < k) { red[li] = max(red[li], red[li + k]); }
    workgroupBarrier();
  }
  let mx = red[0];
  workgroupBarrier();
  var s = 0.0;
  for (var c = li; c < n; c += 128u) { s += exp(val(base, mb, c, hm, sc) - mx); }
  red[li] = s;
  workgroupBarrier();
  for (var k = 64u; k > 0u; k >>= 1u) {
    if (li < k) { red[li] += red[li + k]; }
    workgroupBarrier();
  }
  let inv = 1.0 / red[0];
  let ob = off(2u) + row * n;
  for (var c = li; c < n; c += 128u) { O[ob + c] = exp(val(base, mb, c, hm, sc) - mx) * inv; }
}
