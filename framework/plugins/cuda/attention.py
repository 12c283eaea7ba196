"""The attention launches of a CUDA device: the FLASH_ATTN_EXT op's (lowering.py) and an attention group's
after its q is made and its k and v written (fused.py)."""

from __future__ import annotations

from ...backend import c_kernels
from . import kernels
from .launches import launch


def _ceil(n: int, m: int) -> int:
    return -(-n // m)


def attention(lw, name: str, q, k, v, mk, o, t: int, h: int, hkv: int, d: int, s: int, scale: float) -> None:
    """softmax(q k^T * scale + mask) v into o: q (t, h, d), k and v (s, hkv, d) rows of kstride hkv * d."""
    common = dict(q=q, k=k, v=v, mk=mk, T=t, H=h, Hkv=hkv, D=d, S=s, has_mask=int(mk is not None), scale=scale)
    opts, awg = kernels.base_options(), kernels.AWG
    if t * h < kernels.MATVEC_MIN_BLOCKS and s > 2 * kernels.SPLIT_ATTN_KEYS:
        # flash decoding: the keys in parts (of at least SPLIT_ATTN_KEYS, so that each warp has several
        # keys to overlap), one block per (row, head, part), about MATVEC_MIN_BLOCKS blocks; then a combine
        nc = min(_ceil(s, kernels.SPLIT_ATTN_KEYS), _ceil(kernels.MATVEC_MIN_BLOCKS, t * h))
        return c_kernels.split_attention(launch, lw, name, opts, awg, nc, 32, common, o)
    if t >= kernels.ROWS_ATTN_FROM:     # prefill: a warp a row, a block's warps rows of one head
        rows = awg // 32
        return launch(lw, f"FLASH_ATTN_EXT[rows] {name}", "flash_attn_rows", opts, _ceil(t, rows) * h * awg, awg,
                      o=o, **common)
    launch(lw, f"FLASH_ATTN_EXT {name}", "flash_attn", opts, t * h * awg, awg, o=o, **common)
