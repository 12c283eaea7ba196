"""Which nodes of a fragment become one fused kernel (wgsl_fused.py): the core's decision
(framework.backend.fusion, whose docstring lists the fusions), asked with this plugin's limits, for
decode on a GPU adapter. Each fusion is turned off by name in FRAMEWORK_VULKAN_UNFUSE (a
comma-separated list, or "all").
"""

from __future__ import annotations

from ...backend import fusion, weight_words
from ...contract import settings
from . import wgsl_fused
from .kernel_shapes import matvec_shape
from .options import UNFUSE_ENV
from .wgsl_fused import ATTN_WG


def fusions_off() -> frozenset[str]:
    """The fusions FRAMEWORK_VULKAN_UNFUSE turns off; an unknown name is an error that lists them."""
    return settings.read(UNFUSE_ENV)


def shape_of(dev, g: fusion.ProductGroup) -> dict:
    """The matrix-vector shape of a product group (the first chunk's), as the unfused kernel would take."""
    w = g.muls[0].src[0]
    rows = dev.chunk_plan(w.dtype.name, w.shape)[0][1]
    nbytes = max(rows * weight_words.row_bytes(m.src[0].dtype.name, w.shape[1]) for m in g.muls)
    return matvec_shape(dev, w.shape[1] // 32, 1, rows, nbytes)


def rowvec_fits(dev, g: fusion.ProductGroup) -> bool:
    """Workgroup memory and storage bindings within the adapter's limits."""
    sh = shape_of(dev, g)
    k = g.muls[0].src[0].shape[1]
    accs = len(g.muls) * sh["r"]
    nbytes = 4 * k + (k // 32 * 48 if sh["x8"] else 0) + 4 * sh["wg"] + (0 if sh["sg"] else 4 * sh["wg"] * accs)
    roles = wgsl_fused.rowvec_roles(g.src.prologue, len(g.muls) == 2, g.epilogue)
    return nbytes <= shared_limit(dev) and len(roles) <= buffers_limit(dev) and sh["wg"] % sh["tpr"] == 0


def shared_limit(dev) -> int:
    return int(dev.data.get("max_compute_workgroup_storage_size") or 16384)


def buffers_limit(dev) -> int:
    return int(dev.data.get("max_storage_buffers_per_shader_stage") or 8)


class _Target:
    """The core matcher's questions, answered for this adapter."""
    weight_types = frozenset(weight_words.QUANT_TYPES)

    def __init__(self, lw):
        self.lw = lw

    def chunks(self, w) -> int:
        return len(self.lw.chunks(w))

    def product_fits(self, g: fusion.ProductGroup) -> bool:
        return rowvec_fits(self.lw.dev, g)

    def attn_fits(self, g: fusion.AttnGroup) -> bool:
        """Workgroup memory (x, the scores, a head's q, k and v) and storage bindings within the limits."""
        roles = wgsl_fused.attn_roles(g.src.prologue, g.q_norm is not None, g.k_norm is not None, len(g.fa.src) > 3)
        nbytes = 4 * g.wq.shape[1] + 4 * ATTN_WG * 2 + 16 * ATTN_WG + 16 * g.fa.src[0].shape[2] + 512
        return nbytes <= shared_limit(self.lw.dev) and len(roles) <= buffers_limit(self.lw.dev)

    def head_ok(self, d: int) -> bool:
        return ATTN_WG % d == 0


def plan(lw, fragment) -> fusion.FusionPlan:
    """The fused groups of a fragment: none on a CPU adapter (lavapipe runs barrier-free kernels best).
    The fusions turned off are read once a lowering (rms_mul is the lowering's own: lower_ops.py)."""
    lw.fusions_off = fusions_off()
    if lw.dev.cpu_adapter:
        return fusion.FusionPlan([])
    return fusion.plan(_Target(lw), fragment, lw.fusions_off)
