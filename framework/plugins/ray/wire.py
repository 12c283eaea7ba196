"""What is sent to a node: copies of graph tensors cut loose from the graph around them.

A node of a graph points at its sources, and they at theirs: pickled as it is, one node would carry the whole
graph before it. A question about a node or a fragment to compile carries the nodes asked about, and in
place of each tensor made elsewhere a leaf of the same name, type, shape and kind.
"""

from __future__ import annotations

from dataclasses import replace

from ...contract import Device, Fragment, LeafKind, Tensor


def stand_in(t: Tensor) -> Tensor:
    """A leaf in place of ``t``: a made tensor (an activation) arrives as an input."""
    return Tensor(name=t.name, dtype=t.dtype, shape=t.shape, kind=t.kind if t.is_leaf else LeafKind.INPUT,
                  contiguous=t.contiguous, layer=t.layer)


def detach_node(node: Tensor) -> Tensor:
    """``node`` with its sources as stand-ins (what a verdict may look at: their types, shapes and kinds)."""
    return replace(node, src=tuple(stand_in(s) for s in node.src), view_src=None)


def signature(node: Tensor) -> tuple:
    """What a verdict can depend on; nodes alike in it get one answer, so a node is asked once per kind of node."""
    return (node.op, node.dtype.name, node.shape, node.contiguous, repr(sorted(node.params.items())),
            tuple((s.op, s.kind, s.dtype.name, s.shape, s.contiguous) for s in node.src))


def detach_fragment(fragment: Fragment, device: str) -> Fragment:
    """A copy of the fragment whose inputs are stand-ins, for ``device`` (the node's own name of it)."""
    memo: dict[int, Tensor] = {id(t): stand_in(t) for t in fragment.inputs}
    inside = {id(n) for n in fragment.nodes}

    def copy(t: Tensor) -> Tensor:
        if id(t) not in memo:
            if id(t) not in inside:        # reached through a view only: no value needed, its identity is
                memo[id(t)] = stand_in(t)
            else:
                memo[id(t)] = replace(t, src=tuple(copy(s) for s in t.src),
                                      view_src=copy(t.view_src) if t.view_src is not None else None)
        return memo[id(t)]

    nodes = [copy(n) for n in fragment.nodes]
    return Fragment(index=fragment.index, device=device, nodes=nodes, inputs=[memo[id(t)] for t in fragment.inputs],
                    outputs=[memo[id(t)] for t in fragment.outputs], structure=fragment.structure,
                    program=fragment.program, submissions=list(fragment.submissions))


def describe_device(d: Device) -> dict:
    """A node's device as data: what a RayDevice needs to stand for it here."""
    try:
        free = d.free_memory() if d.available else None
    except Exception:       # noqa: BLE001 -- a driver that cannot say: as if not reported
        free = None
    return {"name": d.name, "type": d.type.value, "physical_id": d.physical_id, "description": d.description,
            "available": d.available, "unavailable_reason": d.unavailable_reason, "limits": d.limits,
            "buffer_type": d.buffer_type, "weight_buffer_type": d.weight_buffer_type, "emulation": d.emulation,
            "weights_in_programs": d.weights_in_programs, "free_memory": free}
