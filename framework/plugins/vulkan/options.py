"""The Vulkan plugin's settings (environment variables), declared once and read through framework.settings."""

from __future__ import annotations

from ...backend import fusion
from ...contract import settings

DISABLE_OPS_ENV = "FRAMEWORK_VULKAN_DISABLE_OPS"   # comma-separated ops to refuse (tests of mixed plans)
PROFILE_ENV = "FRAMEWORK_VULKAN_PROFILE"
F16_ENV = "FRAMEWORK_VULKAN_F16"                   # off: no shader-f16 (only the tiled product's f16 variant needs it)
SUBGROUPS_ENV = "FRAMEWORK_VULKAN_SUBGROUPS"       # off: no subgroup operations even where the adapter has them
MATVEC_ENV = "FRAMEWORK_VULKAN_MATVEC"             # tuning: e.g. "r=2,tpr=16,wg=128,sg=0" overrides matvec_shape
MATMUL_ENV = "FRAMEWORK_VULKAN_MATMUL"             # tuning / tests: "bm=32,bn=32,kg=2,split=3", "reg=1", "f16=0"
UNFUSE_ENV = "FRAMEWORK_VULKAN_UNFUSE"             # fusions to turn off (fusion.py), or all
MATVEC_KEYS = ("tpr", "r", "wg", "sg", "x8")
MATMUL_KEYS = ("bm", "bn", "kg", "split", "reg", "wgs", "f16")


def declare(ops: frozenset[str]) -> None:
    settings.declare(DISABLE_OPS_ENV, "vulkan", f"comma-separated ops among {', '.join(sorted(ops))}", frozenset(),
                     "ops every Vulkan device refuses (to test mixed plans)",
                     settings.op_names(ops, "the Vulkan plugin"))
    settings.declare(PROFILE_ENV, "vulkan", settings.FLAG_ACCEPTS, False,
                     "GPU time per kernel from timestamp queries (one pass per dispatch)", settings.flag)
    settings.declare(F16_ENV, "vulkan", settings.FLAG_ACCEPTS, True,
                     "request shader-f16 where the adapter has it", settings.flag)
    settings.declare(SUBGROUPS_ENV, "vulkan", settings.FLAG_ACCEPTS, True,
                     "use subgroup operations where the adapter has them", settings.flag)
    settings.declare(UNFUSE_ENV, "vulkan", f"comma-separated fusions among {', '.join(fusion.FUSIONS)}, or all",
                     frozenset(), "fusions of the decode kernels to turn off (to compare them)",
                     lambda text: fusion.parse_off(text, UNFUSE_ENV))
    settings.declare(MATVEC_ENV, "vulkan", f"KEY=N,... with KEY one of {', '.join(MATVEC_KEYS)}", {},
                     "tuning: overrides the matrix-vector kernel's shape", settings.tuning(MATVEC_KEYS))
    settings.declare(MATMUL_ENV, "vulkan", f"KEY=N,... with KEY one of {', '.join(MATMUL_KEYS)}", {},
                     "tuning: overrides the tiled matrix product's shape", settings.tuning(MATMUL_KEYS))


def problem() -> str | None:
    """Why the plugin's settings cannot be used (None when they all parse)."""
    try:
        for name in (DISABLE_OPS_ENV, PROFILE_ENV, F16_ENV, SUBGROUPS_ENV, UNFUSE_ENV, MATVEC_ENV, MATMUL_ENV):
            settings.read(name)
    except settings.SettingError as e:
        return f"bad vulkan settings: {e}"
    return None
