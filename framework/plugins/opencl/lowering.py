"""The OpenCL plugin's kernel table, which the skeleton's lowering (framework/backend/lowering.py) asks
for every node: the ops' functions (lower_ops.py; MUL_MAT, lower_products.py) and, for decode on a GPU,
the fused groups of the core's plan (fused.py). FRAMEWORK_OPENCL_UNFUSE turns fusions off by name."""

from __future__ import annotations

from ...backend import KernelTable
from . import fused, lower_ops, lower_products

TABLE = KernelTable({**lower_ops.LOWER, **lower_products.LOWER}, fused.lower_group, fused.plan)
