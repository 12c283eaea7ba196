"""What a lowered program is made of: every tensor of a fragment as a Ref (an argument or a value
computed here, plus an element offset, a shape and strides), and every dispatch as a Step."""

from __future__ import annotations

import math
from dataclasses import dataclass

from .tensors import contig


@dataclass(frozen=True)
class Ref:
    kind: str                    # "arg" or "val"
    idx: int
    off: int
    shape: tuple
    strides: tuple | None = None     # None: contiguous

    @property
    def contiguous(self) -> bool:
        return self.strides is None or self.strides == contig(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass
class Step:
    name: str
    pipe: object
    bgl: object
    binds: list          # ("ref", Ref) | ("chunk", arg, chunk) | ("rope", table) | ("dummy",)
    params: dict         # word index -> int or float
    groups: tuple
    reads: tuple = ()
    writes: int = -1


def grid(n: int) -> tuple[int, int, int]:
    """Workgroups for n, in two dimensions of at most 65535 (the kernels flatten them with lin())."""
    n = max(1, int(n))
    x = min(n, 65535)
    return x, -(-n // x), 1


def pad4(shape) -> tuple:
    return (1,) * (4 - len(shape)) + tuple(shape)
