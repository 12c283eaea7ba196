"""Cutting a planned graph into fragments (framework.core.graph.Fragment), their submissions and
program keys."""

from __future__ import annotations

import hashlib

from ..graph import Fragment, Graph, LeafKind, ops, structure_hash


def cut_submissions(fragment: Fragment, max_chain: int | None) -> None:
    """Cut the fragment's commands (its non-view nodes) into submissions of at most max_chain."""
    if not max_chain:
        fragment.submissions = [(0, len(fragment.nodes))]
        return
    fragment.submissions, start, count = [], 0, 0
    for i, n in enumerate(fragment.nodes):
        if ops.is_view(n.op):
            continue
        if count == max_chain:
            fragment.submissions.append((start, i))
            start, count = i, 0
        count += 1
    fragment.submissions.append((start, len(fragment.nodes)))


def set_program_key(fragment: Fragment, weights_in_programs: bool) -> None:
    """Fragments with one key share one compiled program."""
    if not weights_in_programs:
        fragment.program = fragment.structure
        return
    weights = ",".join(t.name for t in fragment.inputs if t.is_leaf and t.kind == LeafKind.WEIGHT)
    fragment.program = fragment.structure + ":" + hashlib.sha256(weights.encode()).hexdigest()[:8]


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


__all__ = ["Fragment", "cut_submissions", "set_program_key", "split_fragments"]
