
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
fn dpf(b: u32) -> f32 { let i = moff + (b >> 1u); return unpack2x16float(W[i >> 2u][i & 3u])[b & 1u]; }
