"""What plugins whose kernels are the shared C kernels (the CUDA plugin's kernels.cu, the OpenCL plugin's
kernels.cl: one kernel per element-wise op, the same names, parameters and op codes) lower alike: the
codes the kernels read as OP_<NAME>, and the element-wise ops' functions of their kernel tables, made
over the plugin's own one-thread-an-element launcher."""

from __future__ import annotations

from .steps import pad4

BINARY_CODE = {"ADD": 0, "MUL": 1}
UNARY_CODE = {"scale": 0, "gelu": 1, "silu": 2, "tanh": 3, "sigmoid": 4, "softplus": 5}
GLU_ACTIVATION = {"geglu": "gelu", "swiglu": "silu"}      # GLU's activation, one of unary's functions
ROPE_NEOX = {"normal": 0, "neox": 1}
CHOICES = {("UNARY", "op"): {k: v for k, v in UNARY_CODE.items() if k != "scale"}, ("GLU", "op"): GLU_ACTIVATION,
           ("ROPE", "mode"): ROPE_NEOX}
OP_CODES = {**{k.lower(): v for k, v in BINARY_CODE.items()}, **UNARY_CODE}


def elementwise(each) -> dict:
    """ADD, MUL, SCALE, UNARY and GLU, each one launch of the kernels binary, unary or glu through
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
    return {"ADD": op_binary, "MUL": op_binary, "SCALE": op_scale, "UNARY": op_unary, "GLU": op_glu}


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
