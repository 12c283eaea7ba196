
fn gelu(x: f32) -> f32 {
  let t = tanh(clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -20.0, 20.0));
  return 0.5 * x * (1.0 + t);
}
fn silu(x: f32) -> f32 { return x / (1.0 + exp(-x)); }
fn act(op: u32, x: f32) -> f32 {
  if (op == 1u) { return gelu(x); }
  if (op == 2u) { return silu(x); }
  return tanh(clamp(x, -20.0, 20.0));
}
