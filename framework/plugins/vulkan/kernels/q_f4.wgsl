// The 4 byte codes of w, less the zero point, as floats: a byte OR-ed into the mantissa of 2^23 is
// the float 2^23 + byte exactly, and QZ = 2^23 + zero point, so the subtraction is exact too.
fn f4(w: u32) -> vec4<f32> {
  return bitcast<vec4<f32>>(((vec4<u32>(w) >> BSH) & vec4<u32>(0xFFu)) | vec4<u32>(0x4B000000u)) - vec4<f32>(QZ);
}
