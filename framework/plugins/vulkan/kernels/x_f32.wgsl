
@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
fn xg(b: u32) -> array<vec4<f32>, 8> {
  return array<vec4<f32>, 8>(X[b], X[b + 1u], X[b + 2u], X[b + 3u], X[b + 4u], X[b + 5u], X[b + 6u], X[b + 7u]);
}
