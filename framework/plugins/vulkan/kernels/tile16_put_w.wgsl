{{ let e = li + {l}u * NT; if (e < BN * KG) {{ let o = (e % BN) * RS + 4u * (e / BN); let q = rq{l};
  ws[o] = h8(q.lo[0], q.lo[1]); ws[o + 1u] = h8(q.lo[2], q.lo[3]);
  ws[o + 2u] = h8(q.hi[0], q.hi[1]); ws[o + 3u] = h8(q.hi[2], q.hi[3]);
  wd[(e % BN) * KG + e / BN] = vec4<f32>(q.a, q.b, q.m + HZ * q.a, 0.0); }} }}