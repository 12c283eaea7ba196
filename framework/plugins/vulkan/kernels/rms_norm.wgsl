
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> Wg: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
var<workgroup> red: array<f32, 128>;
@@each_row@@  var s = 0.0;
  for (var c = li; c < n; c += 128u) { let x = A[base + c]; s += x * x; }
  red[li] = s;
  workgroupBarrier();
  for (var k = 64u; k > 0u; k >>= 1u) {
    if (li < k) { red[li] += red[li + k]; }
    workgroupBarrier();
  }
  let ms = red[0] * (1.0 / f32(n));
  let sc = 1.0 / sqrt(ms + U.eps);
  let ob = off(2u) + row * n;
  let has_gain = U.has_gain;
  let gl = U.gain_len;
  for (var c = li; c < n; c += 128u) {
    var y = A[base + c] * sc;
    if (has_gain == 1u) { y = y * Wg[off(1u) + (c % gl)]; }
    O[ob + c] = y;
  }
}
