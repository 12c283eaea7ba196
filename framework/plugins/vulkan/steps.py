"""How the Vulkan plugin's lowering appends a dispatch: the kernel's pipeline (made once per device),
its parameter block packed by name (wgsl.Params), and its workgroups."""

from __future__ import annotations

from dataclasses import dataclass

from ...backend import Step
from . import wgsl


@dataclass(frozen=True)
class Kernel:
    pipe: object
    bgl: object
    words: list       # the parameter block as (word, type, value); a ChunkArg value: filled at run time


def grid(n: int) -> tuple[int, int, int]:
    """Workgroups for n, in two dimensions of at most 65535 (the kernels flatten them with lin())."""
    n = max(1, int(n))
    x = min(n, 65535)
    return x, -(-n // x), 1


def emit(lw, name, key, source, rw, binds, params, n_groups, block=None) -> None:
    """One dispatch of the kernel `key`: `rw` says per binding whether it is written, `params` fills its
    parameter block by name (`block`, or the family's, key[0], in wgsl.PARAMS)."""
    words = (block or wgsl.PARAMS[key[0]]).pack(name, params)
    pipe, bgl = lw.dev.pipeline(key, source, rw)
    lw.emit(Step(name, Kernel(pipe, bgl, words), list(binds), tuple(rw), params, grid(n_groups)))


def simple(lw, n, kernel, binds, rw, params, n_groups) -> None:
    """A dispatch of one of wgsl.SIMPLE's kernels for node n."""
    emit(lw, f"{n.op} {n.name}", (kernel,), lambda: wgsl.simple(kernel), rw, binds, params, n_groups)
