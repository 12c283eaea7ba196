"""How the Vulkan plugin's lowering appends a dispatch: the kernel's pipeline (made once per device, its
WGSL from the kernel's key), its parameter block packed by name (wgsl.Params), and its workgroups."""

from __future__ import annotations

from dataclasses import dataclass

from ...backend import Step
from . import wgsl, wgsl_fused


@dataclass(frozen=True)
class Kernel:
    pipe: object
    bgl: object
    words: list       # the parameter block as (word, type, value); a ChunkArg value: filled at run time


# a kernel's key is its family, then the arguments of the family's source function; the families not
# named here are wgsl.SIMPLE's kernels, which have no variants
SOURCES = {"get_rows_f": wgsl.get_rows_f, "get_rows_q": wgsl.get_rows_q, "mul_mat_f": wgsl.mul_mat_f,
           "matvec": wgsl.matvec, "matmul_reg": wgsl.matmul_reg, "matmul_tile": wgsl.matmul_tile,
           "rowvec": wgsl_fused.rowvec, "rowvec_stack": wgsl_fused.rowvec_stack, "attn_block": wgsl_fused.attn_block}


def source(key: tuple) -> str:
    """The WGSL of the kernel `key` names."""
    make = SOURCES.get(key[0])
    return make(*key[1:]) if make is not None else wgsl.simple(key[0])


def grid(n: int) -> tuple[int, int, int]:
    """Workgroups for n, in two dimensions of at most 65535 (the kernels flatten them with lin())."""
    n = max(1, int(n))
    x = min(n, 65535)
    return x, -(-n // x), 1


def emit(lw, name, key, rw, binds, params, n_groups, block=None) -> None:
    """One dispatch of the kernel `key`: `rw` says per binding whether it is written (None: only the
    last is), `params` fills its parameter block by name (`block`, or the family's, key[0], in
    wgsl.PARAMS)."""
    rw = rw or (False,) * (len(binds) - 1) + (True,)
    words = (block or wgsl.PARAMS[key[0]]).pack(name, params)
    pipe, bgl = lw.dev.pipeline(key, rw)
    lw.emit(Step(name, Kernel(pipe, bgl, words), list(binds), tuple(rw), params, grid(n_groups)))


def each(n: int) -> int:
    """Workgroups of the one-thread-per-element kernels (256 threads)."""
    return -(-n // 256)


def simple(lw, n, kernel, binds, params, n_groups) -> None:
    """A dispatch of one of wgsl.SIMPLE's kernels for node n, writing its last binding."""
    emit(lw, f"{n.op} {n.name}", (kernel,), None, binds, params, n_groups)
