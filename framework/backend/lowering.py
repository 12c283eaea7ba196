"""Lowering a fragment to steps, one way for every device-memory backend.

Every tensor of the fragment becomes a Ref: an argument (weight, input, cache, a value from another
fragment) or a value computed here, plus an element offset, a shape and strides. The walk, in node
order:

1. a node that anchors a fusion group of the core's plan (``KernelTable.plan``) becomes the group's
   steps (``KernelTable.group``); the other nodes of the group make none;
2. a view op (VIEW, RESHAPE, PERMUTE, TRANSPOSE) only makes a new Ref;
3. every other node is lowered by the table's function for its op, which appends steps and returns
   the readers it took into its own kernel (``sole_reader``: a norm's gain MUL, a residual ADD), which
   then make none.

Nothing here touches a device API: the plugin's program turns steps into dispatches.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ..core.device_buffers import contiguous_strides
from ..core.graph import LeafKind, Tensor, fusion, ops
from .steps import Ref, RopeArg, Step


@dataclass(frozen=True)
class KernelTable:
    """What a plugin's kernels cover, as the lowering asks it: ``ops`` maps an op to a function
    (lowering, node) that appends the node's steps and returns the readers it fused (or None);
    ``group`` lowers a fusion group of the core's plan; ``plan`` (lowering, fragment) -> FusionPlan
    says which groups this device fuses (the default: none)."""
    ops: Mapping[str, Callable]
    group: Callable | None = None
    plan: Callable | None = None


def is_weight(t: Tensor) -> bool:
    return t.is_leaf and t.kind == LeafKind.WEIGHT


class Lowering:
    def __init__(self, dev, fragment, table: KernelTable):
        self.dev, self.table = dev, table
        self.inputs = list(fragment.inputs)
        self.refs: dict[int, Ref] = {id(t): Ref("arg", i, 0, tuple(t.shape)) for i, t in enumerate(fragment.inputs)}
        self.val_sizes: list[int] = []     # elements (4 bytes each) of every computed value
        self.steps: list[Step] = []
        self.ropes: list[tuple] = []       # (pos arg, pos offset, n_dims, base, scale, rows): a table each
        self.written_args: set[int] = set()
        self.align4: set[int] = set()      # arguments a kernel reads as vectors of 4
        self.memo: dict[tuple, Ref] = {}   # values made once per program (x in another form), by the plugin's key
        self.outs = {id(t) for t in fragment.outputs}
        self.readers: dict[int, list[Tensor]] = {}
        for n in fragment.nodes:
            for s in n.src:
                self.readers.setdefault(id(s), []).append(n)
        self.fusions_off: frozenset = frozenset()     # fusions turned off by name (the plan may set them)
        self.fusion = table.plan(self, fragment) if table.plan else fusion.FusionPlan([])
        self._walk(fragment.nodes)

    def _walk(self, nodes) -> None:
        taken: set[int] = set(self.fusion.absorbed)
        for n in nodes:
            group = self.fusion.anchor.get(id(n))
            if group is not None:
                self.table.group(self, group)
            elif id(n) in taken:
                continue
            elif n.op in ops.VIEW_OPS:
                self.refs[id(n)] = self.view(n)
            else:
                fused = self.table.ops[n.op](self, n)
                taken.update(id(r) for r in fused or ())

    # -- values ------------------------------------------------------------------------------
    def ref(self, t: Tensor) -> Ref:
        return self.refs[id(t)]

    def new_val(self, n: Tensor) -> Ref:
        """The value node n computes, here."""
        r = self.scratch(tuple(n.shape))
        self.refs[id(n)] = r
        return r

    def scratch(self, shape: tuple) -> Ref:
        """A value of this shape that no node names (partial sums, x in another form)."""
        self.val_sizes.append(math.prod(shape))
        return Ref("val", len(self.val_sizes) - 1, 0, tuple(shape))

    def arg_of(self, t: Tensor) -> int:
        r = self.ref(t)
        if r.kind != "arg":
            raise ValueError(f"{self.dev.name}: {t.describe()} is read as a weight but is computed in the fragment")
        return r.idx

    def chunks(self, t: Tensor) -> list[tuple[int, int]]:
        """(first row, rows) of each chunk of weight t on this device."""
        return self.dev.chunk_plan(t.dtype.name, t.shape)

    def view(self, n: Tensor) -> Ref:
        s = self.ref(n.src[0])
        if n.op == "RESHAPE":
            return Ref(s.kind, s.idx, s.off, tuple(n.shape), s.strides if tuple(n.shape) == s.shape else None)
        if n.op == "VIEW":
            return Ref(s.kind, s.idx, s.off + int(n.params["offset"]), tuple(n.shape))
        st = s.strides or contiguous_strides(s.shape)
        return Ref(s.kind, s.idx, s.off, tuple(n.shape), tuple(st[a] for a in n.params["axes"]))

    # -- what the table's functions ask ----------------------------------------------------------
    def sole_reader(self, n: Tensor, op: str) -> Tensor | None:
        """The node of op `op` that is n's only reader and reads it first, where n is not an output of the
        fragment (a kernel may then compute both and write only the reader's result)."""
        r = self.readers.get(id(n), [])
        if id(n) in self.outs or len(r) != 1 or r[0].op != op or r[0].src[0] is not n:
            return None
        return r[0]

    def residual_add(self, n: Tensor) -> Tensor | None:
        """The ADD that is n's only reader and adds to n a plain residual of its own shape, which n's kernel may
        write as it stores; None where there is none, or where a fused kernel's prologue takes that ADD."""
        add = self.sole_reader(n, "ADD")
        if add is None or id(add) in self.fusion.absorbed:
            return None
        res = add.src[1]
        ref = self.refs.get(id(res))
        if res is n or tuple(res.shape) != tuple(add.shape) or ref is None or ref.strides is not None:
            return None
        return add

    def gain_ok(self, norm: Tensor, g: Tensor) -> bool:
        """Whether g can be a norm's gain inside its kernel: F32, contiguous, one chunk, one row long."""
        if g.dtype.name != "F32" or not g.contiguous or id(g) not in self.refs:
            return False
        if is_weight(g) and len(self.chunks(g)) > 1:
            return False
        return g.nelements == norm.shape[-1] and all(d == 1 for d in g.shape[:-1])

    def rope(self, rope: Tensor, rows: int) -> RopeArg:
        """The rope table of a ROPE node for `rows` positions, made on the host each run (Program.rope_tables)."""
        pos = self.ref(rope.src[1])
        if pos.kind != "arg":
            raise ValueError(f"ROPE positions must be an argument of the fragment ({rope.src[1].describe()})")
        p = rope.params
        key = (pos.idx, pos.off, int(p["n_dims"]), float(p["freq_base"]), float(p["freq_scale"]), rows)
        if key not in self.ropes:
            self.ropes.append(key)
        return RopeArg(self.ropes.index(key))

    def in_place(self, set_rows: Tensor) -> Ref:
        """The cache a SET_ROWS writes, in place: a whole, contiguous argument of the fragment."""
        c = self.ref(set_rows.src[0])
        if c.kind != "arg" or not c.contiguous:
            raise ValueError(f"{set_rows.name}: SET_ROWS writes a cache argument in place, not "
                             f"{set_rows.src[0].describe()}")
        self.written_args.add(c.idx)
        self.refs[id(set_rows)] = c
        return c

    def emit(self, step: Step) -> None:
        self.steps.append(step)
