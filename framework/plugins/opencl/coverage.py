"""What the OpenCL kernels cover, and the verdicts that follow from it: every node the kernels cannot
compute is refused with a reason code, so the scheduler places it elsewhere. The rules every
device-memory backend shares (views of weights, at most 4 axes, plain operands within one allocation)
are the skeleton's (BackendDevice.supports_op), asked before these. The ops covered (COVERED,
the device's supported_ops), the ops disabled by FRAMEWORK_OPENCL_DISABLE_OPS (its refused_ops) and
the weight types read (its Limits.dtypes) are declared as data, which the framework applies before it
asks; ``verdict`` answers the rest.

The ops, their parameters and the values a choice parameter may take come from the core's op table
(framework/core/graph/ops.py). This module says which ops the kernels implement, and holds the
kernels' code for each value of a choice parameter: a value of the table with no code here (a
function added to the table later) is refused, never computed as another.
"""

from __future__ import annotations

from ...backend import c_kernels, is_weight
from ...contract import Tensor, Verdict, ops, settings
from . import options
from .options import DISABLE_OPS_ENV

VIEW_OPS = ops.VIEW_OPS

# the ops the kernels implement (names checked against the op table)
COVERED = ops.names("GET_ROWS", "MUL_MAT", "ADD", "MUL", "SCALE", "UNARY", "GLU", "RMS_NORM", "SOFT_MAX",
                    "FLASH_ATTN_EXT", "ROPE", "SET_ROWS", "CONT", *VIEW_OPS)
# (the kernels' op codes, which kernels.cl reads as OP_<NAME>, are the skeleton's: backend/c_kernels.py)
MAX_ELEMENTS = 1 << 32              # kernels index elements with 32-bit integers
MAX_HEAD = 256                      # head sizes the attention kernel holds (its local memory and registers)

options.declare(COVERED)


def disabled_ops() -> frozenset[str]:
    return settings.read(DISABLE_OPS_ENV)


def verdict(dev, n: Tensor) -> Verdict:
    """Whether the kernels compute node n on device dev (its parameters, dtypes and shapes), once the
    framework has applied supported_ops, refused_ops and Limits.dtypes."""
    op = n.op
    for p in ops.spec(op).params:
        if p.choices and n.params.get(p.name) not in c_kernels.CHOICES.get((op, p.name), ()):
            return Verdict.no("unsupported_op", f"{op} with {p.name}={n.params.get(p.name)!r}: the OpenCL kernels "
                              f"take {', '.join(c_kernels.CHOICES.get((op, p.name), ())) or 'no value of it'}")
    for check in (_elements, _op_specific):      # (a refusal is falsy: no `or` chain)
        refusal = check(dev, n)
        if refusal is not None:
            return refusal
    return Verdict.yes()


def _elements(dev, n: Tensor) -> Verdict | None:
    for t in (n, *n.src):
        if t.nelements >= MAX_ELEMENTS:
            return Verdict.no("unsupported_shape", f"{t.describe()} has {t.nelements} elements; {dev.name} kernels "
                              f"index at most {MAX_ELEMENTS - 1}")
    return None


def _op_specific(dev, n: Tensor) -> Verdict | None:
    if n.op == "MUL_MAT":
        a = n.src[0]
        if is_weight(a) and len(a.shape) != 2:
            return Verdict.no("unsupported_shape", f"{dev.name} multiplies by 2-D weights only ({a.describe()})")
    if n.op == "FLASH_ATTN_EXT" and n.src[0].shape[2] > MAX_HEAD:
        return Verdict.no("unsupported_shape", f"head size {n.src[0].shape[2]} is over the {MAX_HEAD} the attention "
                          f"kernel of {dev.name} holds")
    if n.op == "ROPE" and n.shape[2] % 2:
        return Verdict.no("unsupported_shape", f"ROPE of an odd head size ({n.describe()})")
    if n.op == "SET_ROWS" and not n.src[0].storage.is_leaf:
        # into a cache leaf, or into an earlier SET_ROWS into one (the same buffer, written in place)
        return Verdict.no("unsupported_shape", f"{dev.name} writes rows into a pre-allocated tensor in place, not "
                          f"into {n.src[0].describe()}")
    if n.op == "SET_ROWS" and n.src[0].dtype.name != "F32":
        return Verdict.no("unsupported_dtype", f"{dev.name} writes F32 caches only ({n.src[0].describe()})")
    return None
