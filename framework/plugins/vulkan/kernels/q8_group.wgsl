  let d = max(max(m4.x, m4.y), max(m4.z, m4.w)) / 127.0;
  let id = select(0.0, 1.0 / d, d > 0.0);
  let lo = vec4<u32>(q4(x0, id), q4(x1, id), q4(x2, id), q4(x3, id));
  let hi = vec4<u32>(q4(x4, id), q4(x5, id), q4(x6, id), q4(x7, id));
  let sx = dot(x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7, vec4<f32>(1.0));
