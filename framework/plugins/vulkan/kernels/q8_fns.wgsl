fn q4(v: vec4<f32>, id: f32) -> u32 { return pack4xI8(vec4<i32>(round(v * id))); }
fn s4(w: vec4<u32>) -> i32 {
  let one = 0x01010101u;
  return dot4I8Packed(w.x, one) + dot4I8Packed(w.y, one) + dot4I8Packed(w.z, one) + dot4I8Packed(w.w, one);
}
