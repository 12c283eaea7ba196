"""Compiling kernels.cu into modules (NVRTC through cupy.RawModule), once per device and set of build
options, and the shapes of the kernels chosen per device and matrix.

A module is the whole kernels.cu built with ``-D`` options: the weight type (``QT_Q4_K`` with its
layout's numbers: the skeleton's c_kernels.Dialect.quant_options), the matrix-vector or tile shape, the
element type of float kernels. Options are the only way code is specialised: no source text is edited. The
header prepended to the source is generated from signatures.py (the kernels' parameters) and the
skeleton's op codes (c_kernels.source). CuPy keeps compiled modules in its cache, which discovery.py
points under the project's (the "cuda" cache)."""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

from ...backend import c_kernels
from .coverage import MAX_HEAD
from .signatures import KERNELS

SOURCE = Path(__file__).with_name("kernels.cu")
RWG = 128                # block of the row kernels (RMS norm, softmax)
AWG = 128                # block of attention: 4 warps
EWG = 256                # block of the one-thread-an-element kernels
MATVEC_MAX_ROWS = 8      # rows of x up to which a quantized product is a matrix-vector one
MATVEC_MIN_BLOCKS = 264  # blocks a matrix-vector product should make at least (2 an SM on an H100 or H200)
MATVEC_WIDE_FROM = 128   # groups a row beyond which a team spans several warps (the 1.5B's K = 8960: 280)
ROWVEC2_MAX_R = 2        # rows a team of a fused product of two weights (gate and up) at most
MATVEC_X8_MAX_R = 8      # weight rows x rows of x a team of an 8-bit product at most (each x load serves r rows)
MATVEC_XL_BYTES = 44 << 10  # shared memory the matrix-vector kernel may take to stage f32 x
SPLIT_ATTN_KEYS = 32     # the fewest keys a part of decode attention's keys (8 a warp)
MATMUL_KG = 2            # 32-element groups of K a tiled product stages between two barriers
MATMUL_BIG_BLOCKS = 264  # blocks a tiled product's 64 x 64 tiles must make, else it takes 32 x 32 ones
DEFINED = re.compile(r'(?:__global__|KERNEL|KERNEL_WG\(\w+\)) void (?:__launch_bounds__\(\w+\) )?(\w+)\(ARGS_(\w+)\)')


@lru_cache(maxsize=1)
def source() -> str:
    return c_kernels.source(KERNELS, SOURCE)


def defined_kernels(text: str | None = None) -> dict[str, str]:
    """The kernels kernels.cu defines, its shared ones (KERNEL, KERNEL_WG) too: name -> its ARGS_ macro."""
    return dict(DEFINED.findall(text if text is not None else source()))


def base_options() -> dict[str, int]:
    return {"RWG": RWG, "AWG": AWG, "MAX_HEAD": MAX_HEAD, "HAS_FP64": 1}


def matvec_shape(gpr: int, m: int, rows: int, max_r: int = 4, x8: bool = False) -> dict[str, int]:
    """The matrix-vector kernel's shape: teams of tpr threads (a power of two up to a warp and the row's
    32-element groups; rows of more than MATVEC_WIDE_FROM groups: up to 256, two groups a lane) share r
    weight rows, their sums meeting by warp shuffles (and in shared memory across a team's warps); wg
    threads a block, halved (and r with it) while the matrix would make fewer than MATVEC_MIN_BLOCKS blocks; x staged in
    shared memory where it fits (xl, xg groups a row), or in 8 bits (x8: matvec_q8, x read from the caches, up to
    MATVEC_X8_MAX_R // mm weight rows a team). max_r: the most rows a team of f32 x (the fused products of two weights
    hold twice the registers a row, so they take ROWVEC2_MAX_R)."""
    wide = min(256, 1 << ((gpr // 2).bit_length() - 1)) if gpr > MATVEC_WIDE_FROM else None   # several warps
    cap = MATVEC_X8_MAX_R if x8 else max_r
    mm, tpr, r, wg = c_kernels.matvec_teams(gpr, m, rows, 256, cap, MATVEC_MIN_BLOCKS, wide)
    xl = int(not x8 and staged(gpr, mm))
    return {"MV_V": 1, "MV_WG": wg, "MV_TPR": tpr, "MV_R": r, "MV_MM": mm, "MV_X8": int(x8), "MV_XL": xl,
            "MV_XG": gpr if xl else 0, "PTX_SHFL": 1}


def takes_x8(dev, m: int) -> bool:
    """Whether a matrix-vector product of m rows of x takes them in 8 bits (FRAMEWORK_CUDA_X8: rows, the
    default, from 2 rows; all, from 1; off, never). Several rows: the weight is read once for all of them, where
    f32 x staged in shared memory made a team's loads of x, 4 bytes a value a row, outrun the weight's (the
    1.5B's 4-row verification step's graph 4.69 -> 3.27 ms on an H100; docs/cuda.md)."""
    return dev.x8 == "all" or (dev.x8 == "rows" and m > 1)


def staged(gpr: int, m: int) -> bool:
    """Whether m rows of x (gpr groups each, padded to 36 floats a group) fit the matrix-vector kernel's
    shared memory."""
    return m * gpr * 144 <= MATVEC_XL_BYTES


def matvec_rows(gpr: int, m: int, x8: bool = False) -> int:
    """Rows of x a matrix-vector launch takes: all m in 8 bits, or where f32 rows do not fit in shared memory
    together the most that do (x read from global memory by every team costs far more than reading the weight
    again: the 1.5B's 8-row verification step took 24.6x a decode step that way, 4.7x with its rows staged)."""
    step = next((s for s in (8, 4, 2, 1) if s <= m and staged(gpr, s)), m)
    return m if x8 or staged(gpr, m) else step


def tensor_cores(dev) -> bool:
    """Whether the tiled product multiplies on tensor cores (mma.sync on TF32: compute capability 8.0 on, and
    FRAMEWORK_CUDA_TF32 not off). A device known only to lower (no properties: no GPU here) lowers as the
    GPUs this plugin is measured on do."""
    cc = dev.data.get("compute_capability")
    return dev.tf32 and (cc is None or tuple(int(p) for p in cc.split(".")) >= (8, 0))


def matmul_shape(m: int, n: int, mma: bool = True) -> dict[str, int]:
    """The tiled product's tile: 64 x 64 outputs a block (with tensor cores: 4 warps of 2 x 4 fragments of
    16 x 8; without, 4 x 4 a thread); 32 x 32 where 64 x 64 tiles would leave the GPU with fewer than
    MATMUL_BIG_BLOCKS blocks. MATMUL_KG groups of K staged at a time."""
    big = -(-m // 64) * -(-n // 64) >= MATMUL_BIG_BLOCKS
    side, kg = (64, 64) if big else (32, 32), {"MM_KG": MATMUL_KG}
    if mma:
        f = {"MM_FM": 2, "MM_FN": 4} if big else {"MM_FM": 1, "MM_FN": 2}
        return {"MM_BM": side[0], "MM_BN": side[1], "MM_MMA": 1, "MM_WM": 2, "MM_WN": 2, **f, **kg}
    return {"MM_BM": side[0], "MM_BN": side[1], "MM_TM": 4, "MM_TN": 4, "MM_MMA": 0, **kg}


def matmul_threads(shape: dict[str, int]) -> int:
    """A tiled product's threads a block: with tensor cores, a warp for each of the WM x WN parts of the tile;
    without, a thread for each TM x TN outputs."""
    if shape["MM_MMA"]:
        return 32 * shape["MM_WM"] * shape["MM_WN"]
    return (shape["MM_BM"] // shape["MM_TM"]) * (shape["MM_BN"] // shape["MM_TN"])


def build(dev, options: dict):
    """The module of kernels.cu for these build options, compiled once per device (on its own context)."""
    key = tuple(sorted(options.items()))
    module = dev.modules.get(key)
    if module is None:
        import cupy
        flags = tuple(f"-D{k}={v}" for k, v in key) + ("--std=c++14",)
        try:
            with dev.cupy_device:
                module = cupy.RawModule(code=source(), options=flags)
                module.compile()
        except cupy.cuda.compiler.CompileException as e:
            raise RuntimeError(f"{dev.name}: compiling kernels.cu with {' '.join(flags)} failed: {e}") from None
        dev.modules[key] = module
    return module
