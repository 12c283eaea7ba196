{{ let e = li + {l}u * NT; let r = e / BN; let gg = G + r / 4u;
  let qg = grp(min(n0 + e % BN, N - 1u), min(gg, gpr - 1u));
  rl{l} = select(vec4<f32>(0.0), deq_lo(qg, r % 4u), gg < g1);
  rh{l} = select(vec4<f32>(0.0), deq_hi(qg, r % 4u), gg < g1); }}