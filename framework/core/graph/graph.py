"""A built graph: nodes in execution order, the leaves they read, the outputs wanted."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property

from .tensor import Tensor


@dataclass(eq=False)
class Graph:
    nodes: list[Tensor]
    leaves: list[Tensor]
    outputs: list[Tensor]
    meta: dict = field(default_factory=dict)   # what the graph is for: phase, n_tokens, n_kv

    @cached_property
    def consumers(self) -> dict[int, list[Tensor]]:
        """id(tensor) -> the nodes that read it."""
        out: dict[int, list[Tensor]] = {}
        for n in self.nodes:
            for s in n.src:
                out.setdefault(id(s), []).append(n)
        return out

    def structure_hash(self) -> str:
        return structure_hash(self.nodes, self.outputs)


def structure_hash(nodes: list[Tensor], outputs: list[Tensor] = ()) -> str:
    """A hash of ops, shapes, dtypes, parameters and wiring that ignores names and weight values.

    Two runs of nodes with the same hash can share one compiled program, with their own
    weights bound as arguments: repeated transformer layers hash alike.
    """
    index = {id(n): i for i, n in enumerate(nodes)}
    external: dict[int, int] = {}   # tensors from outside the run, numbered by first use
    h = hashlib.sha256()
    for n in nodes:
        refs = []
        for s in n.src:
            if id(s) in index:
                refs.append(f"n{index[id(s)]}")
            else:
                num = external.setdefault(id(s), len(external))
                kind = s.kind.value if s.is_leaf and s.kind else "ext"
                refs.append(f"x{num}:{kind}:{s.dtype.name}:{s.shape}")
        params = sorted((k, repr(v)) for k, v in n.params.items())
        h.update(repr((n.op, n.dtype.name, n.shape, tuple(refs), params)).encode())
    h.update(repr([index.get(id(o), -1) for o in outputs]).encode())
    return h.hexdigest()[:16]
