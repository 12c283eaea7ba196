@@act@@
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> O: array<f32>;
@@each_element@@  let x = A[off(0u) + i];
  let op = U.op;
  var r: f32;
  if (op == 0u) { r = x * U.scale; } else { r = act(op, x); }
  O[off(1u) + i] = r;
}
