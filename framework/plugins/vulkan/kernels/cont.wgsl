
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;
@@each_element@@@@index4@@  let src = i0 * U.st0 + i1 * U.st1 + i2 * U.st2 + i3 * U.st3;
  O[off(1u) + i] = A[off(0u) + src];
}
