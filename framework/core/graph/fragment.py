"""Fragments: connected runs of nodes on one device, the unit a device compiles.

A fragment is part of a graph; the scheduler cuts them (core/scheduler/fragment.py) and a device
compiles each one into a program (framework.contract.Device.compile).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import ops
from .tensor import Tensor


@dataclass(eq=False)
class Fragment:
    index: int
    device: str
    nodes: list[Tensor]
    inputs: list[Tensor] = field(default_factory=list)    # read here, made elsewhere (first-use order)
    outputs: list[Tensor] = field(default_factory=list)   # made here, read elsewhere or wanted by the caller
    structure: str = ""
    program: str = ""       # what identifies its program: the structure, plus the weights if the device bakes them
    submissions: list[tuple[int, int]] = field(default_factory=list)   # node ranges [start, end)

    @property
    def commands(self) -> int:
        """Nodes that are work for the device (views are not)."""
        return sum(1 for n in self.nodes if not ops.is_view(n.op))

    def to_dict(self) -> dict:
        return {"index": self.index, "device": self.device, "first": self.nodes[0].name, "last": self.nodes[-1].name,
                "nodes": len(self.nodes), "commands": self.commands, "submissions": [list(s) for s in self.submissions],
                "structure": self.structure, "program": self.program, "inputs": [t.name for t in self.inputs],
                "outputs": [t.name for t in self.outputs]}

    def describe(self) -> str:
        return f"fragment {self.index} on {self.device}: nodes {self.nodes[0].name} .. {self.nodes[-1].name}"
