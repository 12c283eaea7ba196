"""ggml-style tensors: leaves (weights, inputs, caches) and nodes (results of ops).

Shapes are in numpy order (outermost first): ggml's ne[] reversed. A GGUF tensor
stored with ne = [640, 262144] is a Tensor of shape (262144, 640).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .dtypes import DType, nbytes


class LeafKind(str, Enum):
    """Where a leaf's bytes come from."""

    WEIGHT = "weight"    # read from the model file, never written
    INPUT = "input"      # set by the runtime before every step (tokens, positions, masks)
    CACHE = "cache"      # pre-allocated and written by the graph itself (KV cache)


@dataclass(eq=False)
class Tensor:
    """A leaf (op == "NONE") or a node computed by `op` from `src`.

    Identity is object identity: two tensors with the same name are different tensors.
    """

    name: str
    dtype: DType
    shape: tuple[int, ...]
    op: str = "NONE"
    src: tuple["Tensor", ...] = ()
    params: dict = field(default_factory=dict)
    kind: LeafKind | None = None          # set for leaves only
    contiguous: bool = True
    view_src: "Tensor | None" = None      # the tensor whose memory this one aliases
    layer: int | None = None              # the repeated block (transformer layer) it belongs to; None: outside

    @property
    def is_leaf(self) -> bool:
        return self.op == "NONE"

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, self.shape)

    @property
    def nelements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def storage(self) -> "Tensor":
        """The tensor that owns this one's memory (itself unless it is a view)."""
        t = self
        while t.view_src is not None:
            t = t.view_src
        return t

    def describe(self) -> str:
        """`name` (OP, DTYPE, shape) for error messages."""
        what = self.kind.value if self.is_leaf and self.kind else self.op
        return f"'{self.name}' ({what}, {self.dtype.name}, shape {list(self.shape)})"

    def __repr__(self) -> str:
        return f"Tensor{self.describe()}"


def leaf(name: str, dtype: DType, shape, kind: LeafKind, layer: int | None = None) -> Tensor:
    """A weight, input or cache tensor (a cache of one layer says which)."""
    return Tensor(name=name, dtype=dtype, shape=tuple(int(d) for d in shape), kind=kind, layer=layer)
