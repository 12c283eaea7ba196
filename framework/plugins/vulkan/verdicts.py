"""What the Vulkan kernels cover: each node gets a verdict, yes or no with a code and a sentence, so the
scheduler places what they do not cover elsewhere. The rules every device-memory backend shares (views
of weights, at most 4 axes, plain operands within one storage binding) are the skeleton's
(BackendDevice.supports_op); these are the kernels' own."""

from __future__ import annotations

from ...backend import is_weight, weight_words
from ...contract import Tensor, Verdict, ops
from .wgsl import UNARY_CODE

# the ops this plugin has kernels for (names checked against the op table)
OPS = ops.names("GET_ROWS", "MUL_MAT", "ADD", "MUL", "SCALE", "UNARY", "GLU", "RMS_NORM", "SOFT_MAX", "ARGMAX",
                "FLASH_ATTN_EXT", "ROPE", "SET_ROWS", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT")
MAX_ATTN_HEAD = 256


def verdict(dev, n: Tensor) -> Verdict:
    op = n.op
    if op == "MUL_MAT":
        a, b = n.src
        if b.dtype.name != "F32" or (not is_weight(a) and a.dtype.name != "F32"):
            return Verdict.no("unsupported_dtype", f"MUL_MAT of {a.describe()} by {b.describe()}")
        if is_weight(a) and len(a.shape) != 2:
            return Verdict.no("unsupported_shape", f"{dev.name} multiplies by 2-D weights only ({a.describe()})")
    if op == "FLASH_ATTN_EXT" and n.src[0].shape[2] > MAX_ATTN_HEAD:
        return Verdict.no("unsupported_shape", f"head size {n.src[0].shape[2]} is over the {MAX_ATTN_HEAD} the "
                          f"attention kernel of {dev.name} holds")
    if op == "UNARY" and n.params["op"] not in UNARY_CODE:
        return Verdict.no("unsupported_op", f"{dev.name} has no {n.params['op']} kernel "
                          f"(it has {', '.join(UNARY_CODE)})")
    if op == "ROPE":
        if len(n.src) > 2:
            return Verdict.no("unsupported_op", f"{dev.name} computes rope tables from positions alone; ROPE with "
                              f"frequency factors ({n.src[2].name}) is not implemented")
        if n.shape[2] % 2:
            return Verdict.no("unsupported_shape", f"ROPE of an odd head size ({n.describe()})")
        if not n.src[1].is_leaf:
            return Verdict.no("unsupported_shape", f"{dev.name} takes ROPE positions from an input leaf only, not "
                              f"{n.src[1].describe()}")
    if op == "GET_ROWS" and is_weight(n.src[0]) and n.src[0].dtype.name in weight_words.QUANT_TYPES and n.shape[1] % 8:
        return Verdict.no("unsupported_shape", f"GET_ROWS of {n.src[0].describe()}")
    if op == "SET_ROWS" and n.src[0].dtype.name != "F32":
        return Verdict.no("unsupported_dtype", f"{dev.name} writes F32 caches only ({n.src[0].describe()})")
    return Verdict.yes()
