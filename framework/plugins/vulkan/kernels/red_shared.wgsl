{store}
  workgroupBarrier();
  for (var s = TPR / 2u; s > 0u; s >>= 1u) {{
    if (lane < s) {{
{step}
    }}
    workgroupBarrier();
  }}
{load}