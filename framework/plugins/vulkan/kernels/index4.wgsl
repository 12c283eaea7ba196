  let a1 = U.d1; let a2 = U.d2; let a3 = U.d3;
  let i3 = i % a3; let r3 = i / a3; let i2 = r3 % a2; let r2 = r3 / a2; let i1 = r2 % a1; let i0 = r2 / a1;
