"""Every kernel's parameters, named once: the C prototypes are generated from this table (as macros
``ARGS_<kernel>`` that kernels.cl's definitions use) and the Python side binds arguments by these names,
so the two cannot drift apart. A parameter's kind (``_C`` says what each becomes in C): ``in``, ``ini``
(int32), ``el`` (ELEM: float or half, by build option) and ``out`` a tensor, bound as its buffer and
element offset; ``w`` a weight chunk (words, scale plane offset); ``tab`` a table made at compile time;
``ctr`` counters the kernel keeps (zeros, the launch's own); ``u``, ``f``, ``u4`` numbers.
"""

from __future__ import annotations

from ...backend import Signatures, c_kernels

SIGNATURES = {
    **c_kernels.SIGNATURES,
    "flash_attn_seq": "in q, in k, in v, in mk, out o, u T, u H, u Hkv, u D, u S, u has_mask, f scale",
    "quant_x": "in x, out xq, u groups",
    "matvec_q": "w a, in x, in r, out o, u N, u K, u M, u gpr, u ld, u col0, u has_r",
    "matvec_q8": "w a, in xq, in r, out o, u N, u K, u M, u gpr, u ld, u col0, u has_r",
    "matmul_q": "w a, in x, in r, out o, u N, u K, u M, u gpr, u ld, u col0, u has_r",
    "matmul_reg": "w a, in x, in r, out o, u N, u K, u M, u gpr, u ld, u col0, u has_r",
    "ptx_probe": "ini p, out o",
    "rowvec3": "w w0, w w1, w w2, in a, in b, in gp, in gn, out y, out o0, out o1, out o2, u n0, u n1, u n2, "
               "u write_y, f eps, f eps1, f ys",
    "attn_block": "w wq, w wk, w wv, in qp, in kp, in vp, in a, in b, in gp, in gn, out y, in gq, in gk, "
                  "ini pos, tab inv, ini krow, "
                  "out kc, out vc, in mk, out po, ctr cnt, out o, u H, u Hkv, u S, u nc1, u chunk, u cache_rows, "
                  "u write_y, u has_mask, f scale, f q_scale, f q_eps, f k_eps, f eps, f eps1, f ys",
}

_C = {"in": "__global const float* restrict {n}, const uint {n}_off",
      "ini": "__global const int* restrict {n}, const uint {n}_off",
      "el": "__global const ELEM* restrict {n}, const uint {n}_off",
      "out": "__global float* restrict {n}, const uint {n}_off",
      "w": "__global const uint* restrict {n}, const uint {n}_moff",
      "tab": "__global const TABLE_T* restrict {n}",
      "ctr": "__global int* restrict {n}",
      "u": "const uint {n}", "f": "const float {n}", "u4": "const uint4 {n}"}


KERNELS = Signatures("opencl", SIGNATURES, _C, ("in", "ini", "el", "out", "w"))     # kinds bound as buffers
params = KERNELS.params
