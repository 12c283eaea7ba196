"""What a lowered program is made of: every tensor of a fragment as a Ref (an argument or a value
computed here, plus an element offset, a shape and strides), and every dispatch as a Step."""

from __future__ import annotations

from dataclasses import dataclass

from ...contract import Ref  # noqa: F401 (the operands of a Step)


@dataclass
class Step:
    name: str
    pipe: object
    bgl: object
    binds: list          # ("ref", Ref) | ("chunk", arg, chunk) | ("rope", table) | ("dummy",)
    params: dict         # the kernel's parameter fields by name (wgsl.Params); ("moff", arg, chunk): at run time
    words: list          # ... as (word, type, value), from the kernel's block
    groups: tuple
    reads: tuple = ()
    writes: tuple = ()      # the values it writes


def grid(n: int) -> tuple[int, int, int]:
    """Workgroups for n, in two dimensions of at most 65535 (the kernels flatten them with lin())."""
    n = max(1, int(n))
    x = min(n, 65535)
    return x, -(-n // x), 1


def pad4(shape) -> tuple:
    return (1,) * (4 - len(shape)) + tuple(shape)
