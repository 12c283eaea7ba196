
@group(0) @binding(1) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> XQ: array<vec4<u32>>;
@@q8_fns@@@@group_of_x@@@@q8_group@@  let o = off(1u) / 4u + i * 3u;
  XQ[o] = lo;
  XQ[o + 1u] = hi;
  XQ[o + 2u] = vec4<u32>(bitcast<u32>(d), bitcast<u32>(s4(lo)), bitcast<u32>(s4(hi)), bitcast<u32>(sx));
}
