"""Every kernel's parameters, named once: the C prototypes are generated from this table (as macros
``ARGS_<kernel>`` that kernels.cu's definitions use) and the Python side passes arguments by these
names, so the two cannot drift apart.

| kind | C | passed from Python as |
| --- | --- | --- |
| ``in``, ``ini``, ``el`` | ``const float*`` (``int``, ``ELEM``) ``__restrict__ NAME, const uint NAME_off`` | a tensor |
| ``out`` | ``float* __restrict__ NAME, const uint NAME_off`` | a tensor written |
| ``w``   | ``const uint* __restrict__ NAME, const uint NAME_moff`` | a weight chunk (words, scale plane offset) |
| ``tab`` | ``const TABLE_T* __restrict__ NAME`` | a table made at compile time |
| ``u``, ``f`` | ``const uint``, ``const float`` | a number |
| ``u4``  | ``const uint NAME_x, NAME_y, NAME_z, NAME_w`` (kernels.cu's U4 joins them) | four numbers |
"""

from __future__ import annotations

from ...backend import Signatures, c_kernels

SIGNATURES = {
    **c_kernels.SIGNATURES,
    "matvec_q": "w a, in x, in r, out o, u N, u K, u M, u gpr, u ld, u col0, u has_r, u r_ld",
    "matvec_q8": "w a, in xq, in r, out o, u N, u K, u M, u gpr, u ld, u col0, u has_r, u r_ld",
    "quant_x": "in x, out xq, u groups",
    "matmul_q": "w a, in x, in r, out o, u N, u K, u M, u gpr, u ld, u col0, u has_r, u r_ld",
    "rowvec3": "w w0, w w1, w w2, in a, in b, in gp, in gn, out y, out o0, out o1, out o2, in bq, in bk, in bv, "
               "u N0, u N1, u N2, u nb0, u nb1, u write_y, u has_b, f eps, f eps1, f ys",
    "rope_kv": "in qp, in kp, in vp, ini pos, tab inv, in gq, in gk, ini krow, out q, out kc, out vc, u H, u Hkv, "
               "u D, u n_dims, u neox, u has_qn, u has_kn, f q_eps, f k_eps, f q_scale, u cache_rows",
}

TENSOR_KINDS = ("in", "ini", "el", "out", "w")
_C = {"in": "const float* __restrict__ {n}, const uint {n}_off",
      "ini": "const int* __restrict__ {n}, const uint {n}_off",
      "el": "const ELEM* __restrict__ {n}, const uint {n}_off",
      "out": "float* __restrict__ {n}, const uint {n}_off",
      "w": "const uint* __restrict__ {n}, const uint {n}_moff",
      "tab": "const TABLE_T* __restrict__ {n}",
      "u": "const uint {n}", "f": "const float {n}",
      "u4": "const uint {n}_x, const uint {n}_y, const uint {n}_z, const uint {n}_w"}


KERNELS = Signatures("cuda", SIGNATURES, _C, TENSOR_KINDS)
params, c_header = KERNELS.params, KERNELS.c_header
