"""What the OpenCL kernels cover, as data the framework applies before it asks: the ops (the device's
supported_ops; FRAMEWORK_OPENCL_DISABLE_OPS names those to refuse) and the largest head the attention
kernel holds. The limits the shared C kernels give every plugin on them are the skeleton's
(BackendDevice.supports_op, c_kernels.verdict)."""

from __future__ import annotations

from ...contract import ops
from . import options

# the ops the kernels implement (names checked against the op table)
COVERED = ops.names("GET_ROWS", "MUL_MAT", "ADD", "MUL", "SCALE", "UNARY", "GLU", "RMS_NORM", "SOFT_MAX", "ARGMAX",
                    "FLASH_ATTN_EXT", "ROPE", "SET_ROWS", "CONT", *ops.VIEW_OPS)
MAX_HEAD = 256                      # head sizes the attention kernel holds (its local memory and registers)

options.declare(COVERED)
