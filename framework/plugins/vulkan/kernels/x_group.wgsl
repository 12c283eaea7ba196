fn xsg(g: u32) -> array<vec4<f32>, 8> {
  let b = g * 8u;
  return array<vec4<f32>, 8>(xs[b], xs[b + 1u], xs[b + 2u], xs[b + 3u], xs[b + 4u], xs[b + 5u], xs[b + 6u], xs[b + 7u]);
}