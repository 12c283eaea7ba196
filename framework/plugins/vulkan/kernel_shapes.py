"""Which shape of a kernel a product or an attention takes: the matrix-vector kernel's team and rows per
thread, the tiled product's tile and K split, the register-tiled product's block. Environment
variables override them for tuning and for the tests, which run every shape on lavapipe."""

from __future__ import annotations

from ...contract import settings
from .options import MATMUL_ENV, MATVEC_ENV  # noqa: F401 (MATMUL_ENV: re-exported for the benchmark)

MATVEC_MAX_ROWS = 8
GPU_THREADS = 32768       # threads a GPU's tiled product should have at least (else smaller tiles)
SPLIT_ATTN_BELOW = 64     # query rows x heads under which attention splits its keys across workgroups
MATVEC_ROWS = {1: 4, 2: 2, 4: 1, 8: 1}   # weight rows per thread, by rows of x: each x group used that often
MATVEC_MIN_WORKGROUPS = 256               # ... fewer where a matrix would make fewer workgroups (2 an SM on an H200)
# weights from this size take x in 8 bits: below it the extra dispatch costs more than it saves
MATVEC_X8_BYTES = 4 << 20
# (BM, BN, KG) of the workgroup-memory tiled product, largest first. On the H200 (2026-11-30 sweep) 64 x 32
# with split K beat 32 x 64, 32 x 32 (KG 1 or 2) and 64 x 64 without splits on both models' prefill
MATMUL_TILES = ((64, 64, 1), (64, 32, 1))
MATMUL_MIN_WORKGROUPS = 264   # a product with fewer tiles takes smaller ones, then splits K (2 an SM on an H200)
MATMUL_MIN_SPLIT_GROUPS = 4   # ... into parts of at least this many 32-element groups
# 1: the tiled product in f16 (wgsl.MATMUL_TILE16_NOTE) where the adapter has shader-f16; off: docs/vulkan.md
MATMUL_F16 = 0


def matvec_shape(dev, gpr: int, mm: int, rows: int = 1 << 30, nbytes: int = 1 << 40) -> dict:
    """The cooperative matrix-vector kernel's shape: threads per row (a power of two, at most 32 and at
    most the row's groups), weight rows per thread (each x group is used that often), workgroup size,
    and whether a team's sums meet by subgroup shuffles: where the adapter has subgroups and a team
    fits in its smallest subgroup (NVIDIA: 32), else in workgroup memory; x8: x in 8 bits (QUANT_X),
    integer dot products (the kernel is otherwise bound by decoding and multiplying in f32)."""
    tpr = min(32, 1 << max(0, gpr.bit_length() - 1))
    r = MATVEC_ROWS[mm]
    while r > 1 and rows < r * (256 // tpr) * MATVEC_MIN_WORKGROUPS:   # a small matrix: more workgroups
        r //= 2
    shape = {"tpr": tpr, "r": r, "wg": 256, "sg": int(dev.subgroups and tpr <= dev.subgroup_min),
             "x8": int(nbytes >= MATVEC_X8_BYTES)}
    shape.update(settings.read(MATVEC_ENV))
    return shape


def matmul_shape(dev, m: int, n: int, gpr: int) -> dict:
    """The prefill product's kernel on a GPU: the workgroup-memory tiled one with the largest tile that
    still makes MATMUL_MIN_WORKGROUPS workgroups (the models' projections are narrow: 192 to 2048 rows
    by a few hundred tokens), and where even the smallest tile makes too few, K split into parts (each
    writes a partial tile; a second pass adds them). A CPU adapter (lavapipe) takes the register-tiled
    kernel (reg=1): it runs barrier-free kernels several times faster."""
    env = settings.read(MATMUL_ENV)
    target = env.get("wgs", MATMUL_MIN_WORKGROUPS)
    bm, bn, kg = next(((bm, bn, kg) for bm, bn, kg in MATMUL_TILES if -(-m // bm) * -(-n // bn) >= target),
                      MATMUL_TILES[-1])
    bm, bn, kg = env.get("bm", bm), env.get("bn", bn), env.get("kg", kg)
    shared = dev.data.get("max_compute_workgroup_storage_size") or 16384
    while kg > 1 and 16 * (8 * kg + 1) * (bm + bn) > shared:    # the two padded tiles must fit
        kg //= 2
    tiles = -(-m // bm) * -(-n // bn)
    split = max(1, min(-(-target // tiles), gpr // max(MATMUL_MIN_SPLIT_GROUPS, kg)))
    split = env.get("split", split)
    gps = -(-gpr // split)                     # groups per part (the last may be shorter), then no empty part
    split = -(-gpr // gps)
    return {"reg": env.get("reg", int(dev.cpu_adapter)), "bm": bm, "bn": bn, "kg": kg, "split": split, "gps": gps,
            "f16": int(dev.f16 and env.get("f16", MATMUL_F16))}


def split_of(s: int, rows: int) -> tuple[int, int]:
    """(chunks, keys per chunk) of flash decoding over s keys for `rows` query rows x heads: chunks of a
    multiple of 64 keys, enough of them to fill the GPU (SPLIT_ATTN_BELOW), and no empty one."""
    nc = min(-(-s // 64), max(2, SPLIT_ATTN_BELOW * 2 // rows))
    per = -(-s // nc)
    ch = -(-per // 64) * 64
    return -(-s // ch), ch


def tile_for(m: int, n: int = 1 << 30, gpu: bool = False) -> tuple[int, int]:
    """Outputs per thread (along M, along N) of the register-tiled product: 8 x 8 for prefill; for a
    few rows (a CPU adapter, which runs it instead of the cooperative matrix-vector kernel), fewer
    along M and more along N. On a GPU, smaller tiles where 8 x 8 would leave too few threads to
    fill it (the models' small projections)."""
    if m == 1:
        return 1, 16
    if m < 8:
        return (2, 8) if m == 2 else (4, 8) if m <= 4 else (8, 8)
    if gpu:
        for bm, bn in ((8, 8), (8, 4), (4, 4), (4, 2), (2, 2)):
            if -(-m // bm) * -(-n // bn) >= GPU_THREADS:
                return bm, bn
        return 2, 2
    return 8, 8
