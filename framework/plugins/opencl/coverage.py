"""What the OpenCL kernels cover, in one table, and the verdicts that follow from it: every node the
kernels cannot compute is refused here with a reason code, so the scheduler places it elsewhere.

The ops and their parameter values come from the core's vocabulary (framework.core.graph: the ops'
names, UNARY_OPS, GLU_OPS, ROPE_MODES); this table says which of them the kernels take.
"""

from __future__ import annotations

import os

from ...contract import Verdict
from ...core.graph import GLU_OPS, ROPE_MODES, UNARY_OPS, VIEW_OPS, LeafKind, Tensor
from . import layout

# op -> {parameter: the values the kernels take}
COVERED: dict[str, dict[str, tuple]] = {
    "GET_ROWS": {}, "MUL_MAT": {}, "ADD": {}, "MUL": {}, "SCALE": {},
    "UNARY": {"op": tuple(UNARY_OPS)}, "GLU": {"op": tuple(GLU_OPS)},
    "RMS_NORM": {}, "SOFT_MAX": {}, "FLASH_ATTN_EXT": {}, "ROPE": {"mode": tuple(ROPE_MODES)},
    "SET_ROWS": {}, "CONT": {}, **{op: {} for op in VIEW_OPS},
}
# the kernels' op codes (kernels.cl reads them as OP_<NAME>): binary's, unary's, and the activations
OP_CODES = {"add": 0, "mul": 1, "scale": 0, "gelu": 1, "silu": 2, "tanh": 3}
GLU_ACTIVATION = {"geglu": "gelu", "swiglu": "silu"}
MAX_AXES = 4
MAX_ELEMENTS = 1 << 32              # kernels index elements with 32-bit integers
DISABLE_OPS_ENV = "FRAMEWORK_OPENCL_DISABLE_OPS"   # comma-separated ops to refuse (tests of mixed plans)

assert set(UNARY_OPS) <= set(OP_CODES) and set(GLU_ACTIVATION) == set(GLU_OPS), "coverage.py lags the core's ops"


def disabled_ops() -> frozenset[str]:
    return frozenset(o.strip().upper() for o in os.environ.get(DISABLE_OPS_ENV, "").split(",") if o.strip())


def is_weight(t: Tensor) -> bool:
    return t.is_leaf and t.kind == LeafKind.WEIGHT


def verdict(dev, n: Tensor) -> Verdict:
    """Whether the kernels compute node n on device dev (its op, parameters, dtypes and shapes)."""
    op = n.op
    if op not in COVERED:
        return Verdict.no("unsupported_op", f"the OpenCL plugin has no kernel for {op}")
    if op in dev.disabled:
        return Verdict.no("refused_by_profile", f"{op} is disabled on {dev.name} by {DISABLE_OPS_ENV}")
    for name, values in COVERED[op].items():
        if n.params.get(name) not in values:
            return Verdict.no("unsupported_op", f"{op} with {name}={n.params.get(name)!r}: the OpenCL kernels take "
                              f"{', '.join(map(str, values))}")
    if op in VIEW_OPS:
        if any(is_weight(s) for s in n.src):
            return Verdict.no("unsupported_buffer", f"{dev.name} does not take views of weights "
                              f"({n.src[0].describe()})")
        return Verdict.yes()
    for check in (_operands, _op_specific):      # (a refusal is falsy: no `or` chain)
        refusal = check(dev, n)
        if refusal is not None:
            return refusal
    return Verdict.yes()


def _operands(dev, n: Tensor) -> Verdict | None:
    for t in (n, *n.src):
        if len(t.shape) > MAX_AXES:
            return Verdict.no("unsupported_shape", f"{dev.name} kernels take at most {MAX_AXES} axes ({t.describe()})")
        if t.nelements >= MAX_ELEMENTS:
            return Verdict.no("unsupported_shape", f"{t.describe()} has {t.nelements} elements; {dev.name} kernels "
                              f"index at most {MAX_ELEMENTS - 1}")
    for i, s in enumerate(n.src):
        if is_weight(s):
            if s.dtype.name not in layout.SUPPORTED:
                return Verdict.no("unsupported_dtype", f"{dev.name} has no kernels for {s.dtype.name} weights "
                                  f"({s.describe()}); it reads {', '.join(sorted(layout.SUPPORTED))}")
            in_kernel = n.op in ("GET_ROWS", "MUL_MAT") and i == 0
            if not in_kernel and (s.dtype.name != "F32" or len(dev.chunk_plan("F32", s.shape)) > 1):
                return Verdict.no("unsupported_dtype", f"{n.op} reads weight {s.describe()} as plain float32 values; "
                                  f"{dev.name} does that only for F32 weights within one allocation")
            continue
        if s.dtype.name not in ("F32", "I32"):
            return Verdict.no("unsupported_dtype", f"{dev.name} computes on F32 (and I32 indices) only, not "
                              f"{s.describe()}")
        if s.nbytes > dev.max_alloc:
            return Verdict.no("unsupported_shape", f"{s.describe()} is {s.nbytes} bytes, more than one allocation "
                              f"of {dev.name} ({dev.max_alloc} bytes)")
        if n.op != "CONT" and not s.contiguous:
            return Verdict.no("unsupported_shape", f"{n.op} on {dev.name} needs contiguous operands; {s.describe()} "
                              f"is a permuted view (CONT it first)")
    if n.dtype.name != "F32":
        return Verdict.no("unsupported_dtype", f"{dev.name} writes F32 results only, not {n.describe()}")
    if n.nbytes > dev.max_alloc:
        return Verdict.no("unsupported_shape", f"the result {n.describe()} is {n.nbytes} bytes, more than one "
                          f"allocation of {dev.name} ({dev.max_alloc} bytes); use smaller batches")
    return None


def _op_specific(dev, n: Tensor) -> Verdict | None:
    from .kernels import MAX_HEAD
    if n.op == "MUL_MAT":
        a, b = n.src
        if is_weight(a) and len(a.shape) != 2:
            return Verdict.no("unsupported_shape", f"{dev.name} multiplies by 2-D weights only ({a.describe()})")
    if n.op == "FLASH_ATTN_EXT" and n.src[0].shape[2] > MAX_HEAD:
        return Verdict.no("unsupported_shape", f"head size {n.src[0].shape[2]} is over the {MAX_HEAD} the attention "
                          f"kernel of {dev.name} holds")
    if n.op == "ROPE" and n.shape[2] % 2:
        return Verdict.no("unsupported_shape", f"ROPE of an odd head size ({n.describe()})")
    if n.op == "SET_ROWS" and not n.src[0].is_leaf:
        return Verdict.no("unsupported_shape", f"{dev.name} writes rows into a pre-allocated tensor in place, not "
                          f"into {n.src[0].describe()}")
    if n.op == "SET_ROWS" and n.src[0].dtype.name != "F32":
        return Verdict.no("unsupported_dtype", f"{dev.name} writes F32 caches only ({n.src[0].describe()})")
    return None
