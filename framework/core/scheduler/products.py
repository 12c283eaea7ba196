"""Pass 0 of planning: a graph output made by a matrix product larger than one buffer of a device is
computed in blocks of token rows, each within that limit, and joined on the host.

Perplexity asks for the logits of every token of a window: 512 rows of Gemma 3's 262144-token vocabulary
are 512 MiB of float32, more than one storage binding of most Vulkan devices (128 MiB on lavapipe), so the
product that makes them had no device. Each row of a product is its own dot products, so the rows
[a, b) of ``x @ W^T`` are ``x[a:b] @ W^T``: the same values, on any device. The blocks are graph outputs
(read back as the logits always are) and ``join_outputs`` puts them back together in row order; no device
ever holds the whole result. The limit is what a device declares as the most one tensor may hold
(``max_chunk_bytes``, the device-buffer plugins' binding or allocation size); devices that declare none
are not split for.
"""

from __future__ import annotations

import numpy as np

from ...contract import Device
from ..graph import Graph, GraphBuilder, Tensor

PARTS = "output_parts"       # graph.meta key: per output the caller asked for, how many graph outputs make it


def tensor_limit(devices: list[Device]) -> int | None:
    """The smallest number of bytes one tensor may hold on any of the devices, or None where none declares one."""
    limits = [getattr(d, "max_chunk_bytes", None) for d in devices]
    return min((int(x) for x in limits if x), default=None)


def split_large_products(graph: Graph, devices: list[Device]) -> Graph:
    """``graph``, or a copy of it whose large product outputs are computed in blocks of rows (module doc)."""
    limit = tensor_limit(devices)
    if limit is None or not any(_rows_per_block(graph, t, limit) for t in graph.outputs):
        return graph
    nodes, outputs, parts = list(graph.nodes), [], []
    for t in graph.outputs:
        rows = _rows_per_block(graph, t, limit)
        if not rows:
            outputs.append(t)
            parts.append(1)
            continue
        blocks = _blocks(t, rows)
        at = next(i for i, n in enumerate(nodes) if n is t)
        nodes[at:at + 1] = [n for block in blocks for n in block]
        outputs += [block[-1] for block in blocks]
        parts.append(len(blocks))
    return Graph(nodes=nodes, leaves=list(graph.leaves), outputs=outputs, meta={**graph.meta, PARTS: parts})


def _rows_per_block(graph: Graph, t: Tensor, limit: int) -> int:
    """Rows of t per block where t is a 2-D product output over ``limit`` bytes that rows can split (and no
    node of the graph reads: only the caller does); else 0."""
    if t.op != "MUL_MAT" or len(t.shape) != 2 or t.nbytes <= limit or len(t.src[1].shape) != 2:
        return 0
    if graph.consumers.get(id(t)):
        return 0
    x = t.src[1]
    if not x.contiguous or t.shape[0] < 2:
        return 0
    rows = limit // (t.nbytes // t.shape[0])
    return rows if 1 <= rows < t.shape[0] else 0


def _blocks(t: Tensor, rows: int) -> list[list[Tensor]]:
    """Per block of ``rows`` token rows of product t: [the view of x's rows, the product of that view]."""
    w, x = t.src
    b = GraphBuilder()
    b.layer = t.layer
    blocks = []
    for start in range(0, t.shape[0], rows):
        n = min(rows, t.shape[0] - start)
        part = b.view(x, (n, x.shape[1]), offset=start * x.shape[1], name=f"{x.name}[{start}:{start + n}]")
        product = b.mul_mat(w, part, name=f"{t.name}[{start}:{start + n}]")
        blocks.append([part, product])
    return blocks


def join_outputs(graph: Graph, values: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs the caller asked for, from the graph's: blocks of rows concatenated in order."""
    parts = graph.meta.get(PARTS)
    if parts is None:
        return values
    joined, at = [], 0
    for n in parts:
        joined.append(values[at] if n == 1 else np.concatenate(values[at:at + n], axis=0))
        at += n
    return joined
