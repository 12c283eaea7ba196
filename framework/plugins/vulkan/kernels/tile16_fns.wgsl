
const HZ: f32 = {hz}.0;   // Q4_1 / Q4_K: codes 0..15 centred on 8 (the min term takes 8 a), against cancellation
fn h8(u: u32, v: u32) -> H8 {{ return H8(vec4<f16>(f4(u) - HZ), vec4<f16>(f4(v) - HZ)); }}
fn hs(p: vec4<f16>) -> f32 {{ let r = p.xy + p.zw; return f32(r.x + r.y); }}
