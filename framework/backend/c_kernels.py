"""What plugins whose kernels are the shared C kernels (the CUDA plugin's kernels.cu, the OpenCL plugin's
kernels.cl: the same kernel names, parameters and op codes) lower alike: the codes the kernels read as
OP_<NAME>, the parameters of the kernels both define (each plugin's signatures.py adds its own), the
element-wise ops' functions of their kernel tables over the plugin's own one-thread-an-element launcher,
and the split attention's launches."""

from __future__ import annotations

from ..core.device_buffers import contiguous_strides
from .steps import pad4

BINARY_CODE = {"ADD": 0, "MUL": 1}
UNARY_CODE = {"scale": 0, "gelu": 1, "silu": 2, "tanh": 3, "sigmoid": 4, "softplus": 5}
GLU_ACTIVATION = {"geglu": "gelu", "swiglu": "silu"}      # GLU's activation, one of unary's functions
ROPE_NEOX = {"normal": 0, "neox": 1}
CHOICES = {("UNARY", "op"): {k: v for k, v in UNARY_CODE.items() if k != "scale"}, ("GLU", "op"): GLU_ACTIVATION,
           ("ROPE", "mode"): ROPE_NEOX}
OP_CODES = {**{k.lower(): v for k, v in BINARY_CODE.items()}, **UNARY_CODE}

# the kernels both dialects define with the same parameters (each plugin's signatures.py adds its own)
SIGNATURES = {
    "binary": "in a, in b, out o, u n, u4 ashape, u4 bshape, u op",
    "unary": "in a, out o, u n, u op, f s",
    "glu": "in g, in v, out o, u n, u op",
    "rms_norm": "in a, in gain, in r, out o, u ncols, f eps, u has_gain, u glen, u has_r",
    "soft_max": "in a, in mk, out o, u ncols, u t, u has_mask, f scale",
    "flash_attn": "in q, in k, in v, in mk, out o, u T, u H, u Hkv, u D, u S, u has_mask, f scale",
    "flash_attn_part": "in q, in k, in v, in mk, out p, u T, u H, u Hkv, u D, u S, u has_mask, f scale, u nc, u per",
    "flash_combine": "in p, out o, u TH, u D, u nc",
    "rope": "in a, ini pos, tab inv, in ff, out o, u T, u H, u D, u n_dims, u neox, u has_ff, f s",
    "set_rows": "in s, ini rows, out dst, u W, u T, u nrows",
    "cont": "in a, out o, u n, u4 shape, u4 strides",
    "get_rows_f": "el a, ini rows, out o, u W, u T, u row0, u nrows",
    "get_rows_q": "w a, ini rows, out o, u W, u T, u row0, u nrows, u gpr",
    "mul_mat_f": "el a, in b, out o, u N, u M, u K, u A0, u A1, u B0, u B1, u row0, u rows, u ld",
    "rowvec": "w w0, w w1, in a, in b, in gp, in gn, out y, in r, out o, u N, u col0, u write_y, u op, "
              "f eps, f eps1, f ys",
}


def elementwise(each) -> dict:
    """ADD, MUL, SCALE, UNARY, GLU and CONT, each one launch of the kernels binary, unary, glu or cont through
    ``each(lw, node, kernel, n_items, **args)``."""
    def op_binary(lw, n):
        each(lw, n, "binary", n.nelements, a=lw.ref(n.src[0]), b=lw.ref(n.src[1]), o=lw.new_val(n),
             n=n.nelements, ashape=pad4(n.src[0].shape), bshape=pad4(n.src[1].shape), op=BINARY_CODE[n.op])

    def op_scale(lw, n):
        each(lw, n, "unary", n.nelements, a=lw.ref(n.src[0]), o=lw.new_val(n), n=n.nelements,
             op=UNARY_CODE["scale"], s=float(n.params["scale"]))

    def op_unary(lw, n):
        each(lw, n, "unary", n.nelements, a=lw.ref(n.src[0]), o=lw.new_val(n), n=n.nelements,
             op=UNARY_CODE[n.params["op"]], s=1.0)

    def op_glu(lw, n):
        each(lw, n, "glu", n.nelements, g=lw.ref(n.src[0]), v=lw.ref(n.src[1]), o=lw.new_val(n),
             n=n.nelements, op=UNARY_CODE[GLU_ACTIVATION[n.params["op"]]])
    def op_cont(lw, n):
        a = lw.ref(n.src[0])
        st = a.strides or contiguous_strides(a.shape)
        each(lw, n, "cont", n.nelements, a=a, o=lw.new_val(n), n=n.nelements, shape=pad4(n.shape),
             strides=(0,) * (4 - len(st)) + tuple(st))
    return {"ADD": op_binary, "MUL": op_binary, "SCALE": op_scale, "UNARY": op_unary, "GLU": op_glu, "CONT": op_cont}


def split_attention(launch, lw, name: str, opts: dict, wg: int, nc: int, align: int, common: dict, o) -> None:
    """Flash decoding through the kernels flash_attn_part and flash_combine (``launch(lw, name, kernel,
    options, n_items, work_group, **args)``, the plugin's): the S keys in parts of a multiple of `align`,
    about nc of them, one work-group a (row, head, part) writing its partial sums, then one a (row, head)
    combining them into o. common: the attention's arguments (T, H, D, S among them)."""
    t, h, d, s = common["T"], common["H"], common["D"], common["S"]
    per = -(-(-(-s // nc)) // align) * align
    nc = -(-s // per)
    part = lw.scratch((t * h * nc * (d + 2),))
    launch(lw, f"FLASH_ATTN_EXT[split] {name}", "flash_attn_part", opts, t * h * nc * wg, wg, p=part, nc=nc,
           per=per, **common)
    launch(lw, f"FLASH_ATTN_EXT[combine] {name}", "flash_combine", opts, t * h * wg, wg, p=part, o=o, TH=t * h,
           D=d, nc=nc)
