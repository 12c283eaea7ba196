
@group(0) @binding(1) var<storage, read> W: array<u32>;
fn dpf(b: u32) -> f32 { return unpack2x16float(W[moff + (b >> 1u)])[b & 1u]; }
