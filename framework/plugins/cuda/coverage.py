"""What the CUDA kernels cover, and the verdicts that follow from it: every node they cannot compute is
refused with a reason code, so the scheduler places it elsewhere. The rules every device-memory backend
shares are the skeleton's (BackendDevice.supports_op), asked before these; the limits of the shared C
kernels (their op codes for each value of a choice parameter, 32-bit element indices, 2-D weights, the
head sizes the attention kernel holds, even rope heads, caches written in place) are the skeleton's too
(c_kernels.verdict). The ops covered (COVERED), those disabled by FRAMEWORK_CUDA_DISABLE_OPS and the
weight types read are declared as data."""

from __future__ import annotations

from ...backend import c_kernels, weight_words
from ...contract import Tensor, Verdict, ops, settings
from . import options

COVERED = ops.names("GET_ROWS", "MUL_MAT", "ADD", "MUL", "SCALE", "UNARY", "GLU", "RMS_NORM", "SOFT_MAX", "ARGMAX",
                    "FLASH_ATTN_EXT", "ROPE", "SET_ROWS", "CONT", *ops.VIEW_OPS)
# (the kernels' op codes, which kernels.cu reads as OP_<NAME>, are the skeleton's: backend/c_kernels.py)
WEIGHT_TYPES = weight_words.SUPPORTED   # kept quantized in device memory (kernels.cu's grp_<type>)
MAX_HEAD = 256                          # head sizes the attention kernel holds (its shared memory and registers)

options.declare(COVERED)


def disabled_ops() -> frozenset[str]:
    return settings.read(options.DISABLE_OPS_ENV)


def verdict(dev, n: Tensor) -> Verdict:
    return c_kernels.verdict(dev, n, "the CUDA kernels", MAX_HEAD)
