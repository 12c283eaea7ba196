"""Fragments: connected runs of nodes on one device, the unit a device compiles."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from ..graph import VIEW_OPS, Graph, Tensor, ops, structure_hash


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

    def cut_submissions(self, max_chain: int | None) -> None:
        """Cut the fragment's commands (its non-view nodes) into submissions of at most max_chain."""
        if not max_chain:
            self.submissions = [(0, len(self.nodes))]
            return
        self.submissions, start, count = [], 0, 0
        for i, n in enumerate(self.nodes):
            if n.op in VIEW_OPS:
                continue
            if count == max_chain:
                self.submissions.append((start, i))
                start, count = i, 0
            count += 1
        self.submissions.append((start, len(self.nodes)))

    @property
    def commands(self) -> int:
        return sum(1 for n in self.nodes if n.op not in VIEW_OPS)

    def to_dict(self) -> dict:
        return {"index": self.index, "device": self.device, "first": self.nodes[0].name, "last": self.nodes[-1].name,
                "nodes": len(self.nodes), "commands": self.commands, "submissions": [list(s) for s in self.submissions],
                "structure": self.structure, "program": self.program, "inputs": [t.name for t in self.inputs],
                "outputs": [t.name for t in self.outputs]}

    def set_program_key(self, weights_in_programs: bool) -> None:
        """Fragments with one key share one compiled program."""
        if not weights_in_programs:
            self.program = self.structure
            return
        weights = ",".join(t.name for t in self.inputs if t.is_leaf and t.kind is not None and t.kind.value == "weight")
        self.program = self.structure + ":" + hashlib.sha256(weights.encode()).hexdigest()[:8]

    def describe(self) -> str:
        return f"fragment {self.index} on {self.device}: nodes {self.nodes[0].name} .. {self.nodes[-1].name}"


def split_fragments(graph: Graph, device_of: dict[int, str]) -> list[Fragment]:
    """Cut the node list wherever the device changes; find each fragment's inputs and outputs."""
    fragments: list[Fragment] = []
    for n in graph.nodes:
        dev = device_of[id(n)]
        if not fragments or fragments[-1].device != dev:
            fragments.append(Fragment(index=len(fragments), device=dev, nodes=[]))
        fragments[-1].nodes.append(n)
    frag_of = {id(n): f.index for f in fragments for n in f.nodes}
    wanted = {id(t) for t in graph.outputs}
    for f in fragments:
        seen: set[int] = set()
        for n in f.nodes:
            for s in n.src:
                if frag_of.get(id(s)) != f.index and id(s) not in seen:
                    seen.add(id(s))
                    f.inputs.append(s)
        for n in f.nodes:
            used_elsewhere = any(frag_of[id(c)] != f.index for c in graph.consumers.get(id(n), ()))
            # a write into a source (a cache) is a side effect on a persistent tensor: always hand it back
            if used_elsewhere or id(n) in wanted or ops.writes_source(n.op):
                f.outputs.append(n)
        f.structure = structure_hash(f.nodes, f.outputs)
    return fragments
