
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> XH: array<vec4<u32>>;
fn h8(u: vec4<f32>, v: vec4<f32>, id: f32) -> vec4<u32> {
  let a = u * id; let b = v * id;
  return vec4<u32>(pack2x16float(a.xy), pack2x16float(a.zw), pack2x16float(b.xy), pack2x16float(b.zw));
}
@@group_of_x@@  let d = max(max(m4.x, m4.y), max(m4.z, m4.w));
  let id = select(0.0, 1.0 / d, d > 0.0);
  let o = off(1u) / 4u + i * 5u;
  XH[o] = h8(x0, x1, id);
  XH[o + 1u] = h8(x2, x3, id);
  XH[o + 2u] = h8(x4, x5, id);
  XH[o + 3u] = h8(x6, x7, id);
  let sx = dot(x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7, vec4<f32>(1.0));
  XH[o + 4u] = vec4<u32>(bitcast<u32>(d), bitcast<u32>(sx), 0u, 0u);
}
