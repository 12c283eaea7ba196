"""Building kernels.cl into programs, once per device and set of build options, and the settings of
the kernels whose shape is chosen per device (work-group sizes, matrix-vector and tiled-product
shapes).

A program is the whole kernels.cl built with ``-D`` options: the weight type (``QT_Q4_K``, with its
layout's numbers from layout.py), the tile or team shape, the element type of float kernels. Options
are the only way code is specialised: no source text is edited. The header prepended to the source
is generated from signatures.py (the kernels' parameters) and coverage.py (the op codes).
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

from . import layout
from .coverage import OP_CODES
from .signatures import c_header

SOURCE = Path(__file__).with_name("kernels.cl")
MAX_HEAD = 256           # head sizes the attention kernel holds (its local memory and registers)
RWG = 128                # work-group of the row kernels (RMS norm, softmax)
AWG = 64                 # work-group of attention
EWG = 256                # work-group of the one-thread-an-element kernels (fewer where the device allows fewer)
MATVEC_MAX_ROWS = 8      # rows of x up to which a quantized product is a matrix-vector one
MATVEC_MIN_GROUPS = 264  # work-groups a matrix-vector product should make at least (2 an SM on an H200)
MATVEC_X8_BYTES = 4 << 20   # weights from this size take x in 8 bits where the device has integer dot products
MATVEC_ENV = "FRAMEWORK_OPENCL_MATVEC"   # tuning / tests: "tpr=8,r=2,wg=64,x8=1"
MATMUL_ENV = "FRAMEWORK_OPENCL_MATMUL"   # tuning / tests: "bm=32,bn=64,tm=4,tn=4"
SPLIT_ATTN_BELOW = 64    # query rows x heads under which attention splits its keys over work-groups (GPUs)


@lru_cache(maxsize=1)
def source() -> str:
    codes = "".join(f"#define OP_{name.upper()} {code}\n" for name, code in OP_CODES.items())
    return c_header() + codes + SOURCE.read_text()


def _env(name: str) -> dict[str, int]:
    out = {}
    for item in filter(None, os.environ.get(name, "").replace(" ", "").split(",")):
        key, _, value = item.partition("=")
        out[key] = int(value)
    return out


def base_options(dev) -> dict[str, int]:
    opts = {"RWG": RWG, "AWG": AWG, "MAX_HEAD": MAX_HEAD}
    if dev.fp64:
        opts["HAS_FP64"] = 1
    return opts


def quant_options(dev, dtype: str) -> dict[str, int]:
    opts = base_options(dev)
    opts.update(layout.kernel_defines(dtype))
    if dev.int_dot:
        opts["HAS_DOT4"] = 1
    return opts


def matvec_shape(dev, gpr: int, m: int, rows: int, nbytes: int) -> dict[str, int]:
    """The matrix-vector kernel's shape: threads a team (a power of two, at most 32 and at most the
    row's groups), weight rows a team (4 for one row of x, fewer where the matrix would make fewer
    than MATVEC_MIN_GROUPS work-groups), the work-group size, rows of x (MM, a power of two), and x8:
    x in 8 bits with integer dot products (weights of MATVEC_X8_BYTES and more, on devices with
    cl_khr_integer_dot_product)."""
    mm = next(x for x in (1, 2, 4, 8) if x >= m)
    tpr = min(32, 1 << max(0, gpr.bit_length() - 1))
    wg = min(256, dev.max_wg)
    r = max(1, 4 // mm)
    while r > 1 and rows < r * (wg // tpr) * MATVEC_MIN_GROUPS:
        r //= 2
    while wg > max(64, tpr) and rows < (wg // tpr) * r * MATVEC_MIN_GROUPS:
        wg //= 2
    shape = {"tpr": tpr, "r": r, "wg": wg, "mm": mm, "x8": int(dev.int_dot and nbytes >= MATVEC_X8_BYTES)}
    shape.update(_env(MATVEC_ENV))
    return shape


def matmul_shape(dev, m: int, n: int) -> dict[str, int]:
    """The tiled product's tile: 64 x 64 outputs a work-group, 4 x 4 a thread, where the device allows
    256 threads a work-group; 32 x 32 (64 threads) where it does not, or where a 64 x 64 tile would
    leave a GPU with fewer than MATVEC_MIN_GROUPS work-groups."""
    big = dev.max_wg >= 256 and (dev.is_cpu or -(-m // 64) * -(-n // 64) >= MATVEC_MIN_GROUPS)
    shape = {"bm": 64, "bn": 64, "tm": 4, "tn": 4} if big else {"bm": 32, "bn": 32, "tm": 4, "tn": 4}
    shape.update(_env(MATMUL_ENV))
    return shape


def reg_shape(dev, m: int) -> dict[str, int] | None:
    """The register-tiled product's shape where it serves (CPU devices; ``reg=1`` in MATMUL_ENV forces
    it, ``reg=0`` keeps it off): rows of x by weight rows a work-item, and the work-group size."""
    env = _env(MATMUL_ENV)
    if not env.get("reg", int(dev.is_cpu)):
        return None
    tm = 1 if m == 1 else 2 if m <= 2 else 4
    shape = {"tm": tm, "tn": 4, "wg": 16}
    shape.update({k[1:]: v for k, v in env.items() if k in ("rtm", "rtn", "rwg")})
    return shape


def build(dev, options: dict[str, int]):
    """The program of kernels.cl for these build options, built once per device."""
    key = tuple(sorted(options.items()))
    prog = dev.programs.get(key)
    if prog is None:
        import pyopencl as cl
        from .discovery import cache_dir
        flags = [f"-D{k}={v}" for k, v in key] + ["-cl-std=CL1.2"]
        try:
            prog = cl.Program(dev.context, source()).build(options=flags, cache_dir=str(cache_dir() / "pyopencl"))
        except cl.RuntimeError as e:
            raise RuntimeError(f"{dev.name}: building kernels.cl with {' '.join(flags)} failed: {e}") from None
        dev.programs[key] = prog
    return prog
