"""Running nodes on the reference kernels: the CPU plugin's programs, and the conformance suite's
reference results."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import ops
from .graph import Graph
from .tensor import LeafKind, Tensor


class ReferenceProgram:
    """Nodes as a list of (kernel with its parameters bound, output slot, input slots); slots 0..n-1
    are the arguments, in ``inputs`` order. ``run`` returns the values of ``outputs``."""

    def __init__(self, nodes: list[Tensor], inputs: list[Tensor], outputs: list[Tensor]):
        slots = {id(t): i for i, t in enumerate(inputs)}
        self.n_args = len(inputs)
        self.steps = []
        for n in nodes:
            slots[id(n)] = len(slots)
            self.steps.append((ops.bind(n), slots[id(n)], tuple(slots[id(s)] for s in n.src)))
        self.n_slots = len(slots)
        self.out_slots = [slots[id(t)] for t in outputs]

    def run(self, args: list[Any]) -> list[Any]:
        vals = list(args) + [None] * (self.n_slots - self.n_args)
        for fn, out, ins in self.steps:
            vals[out] = fn(*[vals[i] for i in ins])
        return [vals[i] for i in self.out_slots]


def evaluate(graph: Graph, values: dict[int, np.ndarray]) -> list[np.ndarray]:
    """The graph's outputs on the reference kernels. ``values``: id(leaf) -> array for every weight
    (float32 values) and input; a cache leaf missing from it starts as zeros, as ``Device.alloc`` makes it."""
    args = []
    for t in graph.leaves:
        if id(t) in values:
            args.append(values[id(t)])
        elif t.kind == LeafKind.CACHE:
            args.append(np.zeros(t.shape, dtype=np.float32 if t.dtype.name == "F32" else np.int32))
        else:
            raise KeyError(f"evaluate: no value for leaf {t.describe()}")
    return [np.array(o, copy=True) for o in ReferenceProgram(graph.nodes, graph.leaves, graph.outputs).run(args)]
