"""What the OpenCL kernels cover, and the verdicts that follow from it: every node the kernels cannot
compute is refused with a reason code, so the scheduler places it elsewhere. The rules every
device-memory backend shares (views of weights, at most 4 axes, plain operands within one allocation)
are the skeleton's (BackendDevice.supports_op), asked before these; the limits of the shared C kernels
(their op codes for each value of a choice parameter, 32-bit element indices, 2-D weights, the head
sizes the attention kernel holds, even rope heads, caches written in place) are the skeleton's too
(c_kernels.verdict). The ops covered (COVERED, the device's supported_ops), the ops disabled by
FRAMEWORK_OPENCL_DISABLE_OPS (its refused_ops) and the weight types read (its Limits.dtypes) are declared
as data, which the framework applies before it asks."""

from __future__ import annotations

from ...backend import c_kernels
from ...contract import Tensor, Verdict, ops, settings
from . import options
from .options import DISABLE_OPS_ENV

# the ops the kernels implement (names checked against the op table)
COVERED = ops.names("GET_ROWS", "MUL_MAT", "ADD", "MUL", "SCALE", "UNARY", "GLU", "RMS_NORM", "SOFT_MAX",
                    "FLASH_ATTN_EXT", "ROPE", "SET_ROWS", "CONT", *ops.VIEW_OPS)
MAX_HEAD = 256                      # head sizes the attention kernel holds (its local memory and registers)

options.declare(COVERED)


def disabled_ops() -> frozenset[str]:
    return settings.read(DISABLE_OPS_ENV)


def verdict(dev, n: Tensor) -> Verdict:
    return c_kernels.verdict(dev, n, "the OpenCL kernels", MAX_HEAD)
