"""The Vulkan plugin's kernel table, which the skeleton's lowering (framework/backend/lowering.py) asks
for every node: the ops' functions (lower_ops.py; MUL_MAT, lower_products.py) and the fused groups
(lower_fused.py). For decode on a GPU, the groups of nodes fusion.py finds are one dispatch each;
everywhere, RMS_NORM followed by its only reader, a MUL by a gain vector, is one dispatch.
FRAMEWORK_VULKAN_UNFUSE turns them off by name."""

from __future__ import annotations

from ...backend import KernelTable
from . import fusion, lower_fused, lower_ops, lower_products

TABLE = KernelTable({**lower_ops.LOWER, **lower_products.LOWER}, lower_fused.lower_group, fusion.plan)
