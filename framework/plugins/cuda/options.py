"""The CUDA plugin's settings (environment variables), declared once and read through framework.settings."""

from __future__ import annotations

from ...backend import fusion
from ...contract import settings

DISABLE_OPS_ENV = "FRAMEWORK_CUDA_DISABLE_OPS"   # comma-separated ops to refuse (tests of mixed plans)
MAX_ALLOC_ENV = "FRAMEWORK_CUDA_MAX_ALLOC"       # bytes: a smaller largest buffer (tests of split weights)
GRAPHS_ENV = "FRAMEWORK_CUDA_GRAPHS"             # off: every run launches its kernels one by one
UNFUSE_ENV = "FRAMEWORK_CUDA_UNFUSE"             # decode fusions to turn off (framework/core/graph/fusion.py), or all
TF32_ENV = "FRAMEWORK_CUDA_TF32"                 # off: prefill's tiled products in f32 multiply-adds
X8_ENV = "FRAMEWORK_CUDA_X8"                     # which matrix-vector products take x in 8 bits
NAMES = (DISABLE_OPS_ENV, MAX_ALLOC_ENV, GRAPHS_ENV, UNFUSE_ENV, TF32_ENV, X8_ENV)
X8_CHOICES = ("rows", "all", "off")
MAX_BUFFER = 2 << 30     # the largest buffer by default: weights past it are split in chunks of whole rows


def declare(ops: frozenset[str]) -> None:
    settings.declare(DISABLE_OPS_ENV, "cuda", f"comma-separated ops among {', '.join(sorted(ops))}", frozenset(),
                     "ops every CUDA device refuses (to test mixed plans)", settings.op_names(ops, "the CUDA plugin"))
    settings.declare(MAX_ALLOC_ENV, "cuda", "a whole number of bytes, at least 1", None,
                     f"the largest buffer, below the plugin's own ({MAX_BUFFER} bytes; to test split weights)",
                     settings.whole(1))
    settings.declare(GRAPHS_ENV, "cuda", settings.FLAG_ACCEPTS, True,
                     "a program run again with the same buffers (a decode step) is captured once as a CUDA graph "
                     "and replayed; off: its kernels are launched one by one every run", settings.flag)
    settings.declare(TF32_ENV, "cuda", settings.FLAG_ACCEPTS, True,
                     "prefill's tiled products (more than 8 rows) multiply on tensor cores, x and the weight "
                     "rounded to TF32 (10-bit mantissa; compute capability 8.0 on); off: f32 multiply-adds, about "
                     "2x slower",
                     settings.flag)
    settings.declare(X8_ENV, "cuda", ", ".join(X8_CHOICES), "rows",
                     "rows: products of 2-8 rows of x by quantized weights (a speculative round's verification) take "
                     "x in 8 bits (ggml's q8_1 groups) and dp4a, reading the weight once for all rows; all: one-row "
                     "products outside the fused groups too; off: f32 x", settings.choice(X8_CHOICES))
    settings.declare(UNFUSE_ENV, "cuda", f"comma-separated fusions among {', '.join(fusion.FUSIONS)}, or all",
                     frozenset(), "fusions of the decode products to turn off (to compare them; attn and combine "
                     "are never taken)", lambda text: fusion.parse_off(text, UNFUSE_ENV))


def problem() -> str | None:
    """Why the plugin's settings cannot be used (None when they all parse)."""
    try:
        for name in NAMES:
            settings.read(name)
    except settings.SettingError as e:
        return f"bad cuda settings: {e}"
    return None
