"""What the CUDA kernels cover, and the verdicts that follow from it: every node they cannot compute is
refused with a reason code, so the scheduler places it elsewhere. The rules every device-memory backend
shares are the skeleton's (BackendDevice.supports_op), asked before these. The ops covered (COVERED),
those disabled by FRAMEWORK_CUDA_DISABLE_OPS and the weight types read are declared as data.

The ops, their parameters and the values a choice parameter may take come from the core's op table;
a value of the table with no code here (a function added to the table later) is refused, never
computed as another."""

from __future__ import annotations

from ...backend import c_kernels, is_weight, weight_words
from ...contract import Tensor, Verdict, ops, settings
from . import options

COVERED = ops.names("GET_ROWS", "MUL_MAT", "ADD", "MUL", "SCALE", "UNARY", "GLU", "RMS_NORM", "SOFT_MAX",
                    "FLASH_ATTN_EXT", "ROPE", "SET_ROWS", "CONT", *ops.VIEW_OPS)
# (the kernels' op codes, which kernels.cu reads as OP_<NAME>, are the skeleton's: backend/c_kernels.py)
WEIGHT_TYPES = weight_words.SUPPORTED   # kept quantized in device memory (kernels.cu's grp_<type>)
MAX_ELEMENTS = 1 << 32                  # kernels index elements with 32-bit integers
MAX_HEAD = 256                          # head sizes the attention kernel holds (its shared memory and registers)

options.declare(COVERED)


def disabled_ops() -> frozenset[str]:
    return settings.read(options.DISABLE_OPS_ENV)


def verdict(dev, n: Tensor) -> Verdict:
    """Whether the kernels compute node n on dev (its parameters, dtypes and shapes), once the framework
    has applied supported_ops, refused_ops and Limits.dtypes."""
    op = n.op
    for p in ops.spec(op).params:
        if p.choices and n.params.get(p.name) not in c_kernels.CHOICES.get((op, p.name), ()):
            return Verdict.no("unsupported_op", f"{op} with {p.name}={n.params.get(p.name)!r}: the CUDA kernels "
                              f"take {', '.join(c_kernels.CHOICES.get((op, p.name), ())) or 'no value of it'}")
    for t in (n, *n.src):
        if t.nelements >= MAX_ELEMENTS:
            return Verdict.no("unsupported_shape", f"{t.describe()} has {t.nelements} elements; {dev.name} kernels "
                              f"index at most {MAX_ELEMENTS - 1}")
    if op == "MUL_MAT" and is_weight(n.src[0]) and len(n.src[0].shape) != 2:
        return Verdict.no("unsupported_shape", f"{dev.name} multiplies by 2-D weights only ({n.src[0].describe()})")
    if op == "FLASH_ATTN_EXT" and n.src[0].shape[2] > MAX_HEAD:
        return Verdict.no("unsupported_shape", f"head size {n.src[0].shape[2]} is over the {MAX_HEAD} the attention "
                          f"kernel of {dev.name} holds")
    if op == "ROPE" and n.shape[2] % 2:
        return Verdict.no("unsupported_shape", f"ROPE of an odd head size ({n.describe()})")
    if op == "SET_ROWS" and (not n.src[0].storage.is_leaf or n.src[0].dtype.name != "F32"):
        return Verdict.no("unsupported_shape", f"{dev.name} writes rows in place into a pre-allocated F32 tensor, "
                          f"not into {n.src[0].describe()}")
    return Verdict.yes()
