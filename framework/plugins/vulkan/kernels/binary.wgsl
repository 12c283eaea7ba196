
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read_write> O: array<f32>;
@@each_element@@@@index4@@  let b0 = U.b0; let b1 = U.b1; let b2 = U.b2; let b3 = U.b3;
  let bi = (((i0 % b0) * b1 + (i1 % b1)) * b2 + (i2 % b2)) * b3 + (i3 % b3);
  let x = A[off(0u) + i];
  let y = B[off(1u) + bi];
  var r: f32;
  if (U.op == 0u) { r = x + y; } else { r = x * y; }
  O[off(2u) + i] = r;
}
