"""Lowering a fragment into a list of dispatches (Steps) over Refs.

Every tensor of the fragment is a Ref: an argument (weight, input, cache, or a value from another
fragment) or a value computed here, plus an element offset, a shape and strides. View ops (VIEW,
RESHAPE, PERMUTE, TRANSPOSE) only make new Refs; every other node becomes one or more Steps
(lower_ops.py, lower_products.py). Where the values live is memory.py's business, running the steps
submission.py's.

Fusions: for decode on a GPU, the groups of nodes fusion.py finds are one dispatch each
(lower_fused.py); elsewhere RMS_NORM followed by its only reader, a MUL by a gain vector, is one
dispatch. FRAMEWORK_VULKAN_UNFUSE turns them off by name.
"""

from __future__ import annotations

import math

from ...contract import Tensor
from . import fusion, lower_fused, lower_ops, lower_products, wgsl
from .steps import Ref, Step, grid
from .tensors import contig
from .verdicts import VIEWS, is_weight

LOWER = {**lower_ops.LOWER, **lower_products.LOWER}   # op -> function(lowering, node)


class Lowering:
    def __init__(self, dev, fragment):
        self.dev = dev
        self.refs: dict[int, Ref] = {}
        for i, t in enumerate(fragment.inputs):
            self.refs[id(t)] = Ref("arg", i, 0, tuple(t.shape))
        self.val_sizes: list[int] = []     # elements of each computed value
        self.steps: list[Step] = []
        self.ropes: list[tuple] = []       # (pos arg, pos offset, n_dims, base, scale, T): a table each
        self.written_args: set[int] = set()
        self.align4: set[int] = set()      # arguments read as vec4
        self.xq: dict[tuple, Ref] = {}     # computed x -> its 8-bit (QUANT_X) or f16 (HALF_X) form, made once
        self.partials: dict[int, tuple] = {}   # id(attention) -> (partials, chunks, head size): combined later
        off = fusion.fusions_off()
        self.fusion = fusion.plan(self, fragment, off)
        nodes = fragment.nodes
        readers: dict[int, list[Tensor]] = {}
        for n in nodes:
            for s in n.src:
                readers.setdefault(id(s), []).append(n)
        outs = {id(t) for t in fragment.outputs}
        fused: set[int] = set()
        for n in nodes:
            group = self.fusion.anchor.get(id(n))
            if group is not None:
                lower_fused.emit(self, group)
                continue
            if id(n) in fused or id(n) in self.fusion.absorbed:
                continue
            if n.op in VIEWS:
                self.refs[id(n)] = self.view(n)
                continue
            if n.op == "RMS_NORM" and id(n) not in outs and "rms_mul" not in off:
                r = readers.get(id(n), [])
                if len(r) == 1 and r[0].op == "MUL" and r[0].src[0] is n and self.gain_ok(n, r[0].src[1]):
                    lower_ops.rms_norm(self, r[0], n, r[0].src[1])
                    fused.add(id(r[0]))
                    continue
            LOWER[n.op](self, n)

    # -- values ------------------------------------------------------------------------------
    def ref(self, t: Tensor) -> Ref:
        return self.refs[id(t)]

    def new_val(self, n: Tensor) -> Ref:
        r = self.scratch(tuple(n.shape))
        self.refs[id(n)] = r
        return r

    def scratch(self, shape: tuple) -> Ref:
        """A value of this shape that no node names (partial sums, x in another form)."""
        self.val_sizes.append(math.prod(shape))
        return Ref("val", len(self.val_sizes) - 1, 0, shape)

    def chunks(self, t: Tensor) -> list[tuple[int, int]]:
        return self.dev.chunk_plan(t.dtype.name, t.shape)

    def arg_of(self, t: Tensor) -> int:
        r = self.ref(t)
        assert r.kind == "arg", t.describe()
        return r.idx

    def gain_ok(self, norm: Tensor, g: Tensor) -> bool:
        """Whether g can be a norm's gain inside its kernel: F32, contiguous, one binding, one row-long."""
        if g.dtype.name != "F32" or not g.contiguous or id(g) not in self.refs:
            return False
        if is_weight(g) and len(self.chunks(g)) > 1:
            return False
        return g.nelements == norm.shape[-1] and all(d == 1 for d in g.shape[:-1]) and g.shape[-1] == norm.shape[-1]

    # -- steps -------------------------------------------------------------------------------
    def emit(self, name, key, source, rw, binds, params, n_groups, block=None):
        """One dispatch of the kernel `key`: `rw` says per binding whether it is written, `params` fills its
        parameter block by name (`block`, or the family's, key[0], in wgsl.PARAMS)."""
        words = (block or wgsl.PARAMS[key[0]]).pack(name, params)
        pipe, bgl = self.dev.pipeline(key, source, rw)
        reads = tuple(b[1].idx for b, w in zip(binds, rw) if b[0] == "ref" and b[1].kind == "val" and not w)
        writes = tuple(b[1].idx for b, w in zip(binds, rw) if b[0] == "ref" and b[1].kind == "val" and w)
        self.steps.append(Step(name, pipe, bgl, binds, params, words, grid(n_groups), reads, writes))

    def simple(self, n, kernel, binds, rw, params, n_groups):
        self.emit(f"{n.op} {n.name}", (kernel,), lambda: wgsl.simple(kernel), rw, binds, params, n_groups)

    # -- views -------------------------------------------------------------------------------
    def view(self, n: Tensor) -> Ref:
        s = self.ref(n.src[0])
        if n.op == "RESHAPE":
            return Ref(s.kind, s.idx, s.off, tuple(n.shape))
        if n.op == "VIEW":
            return Ref(s.kind, s.idx, s.off + int(n.params["offset"]), tuple(n.shape))
        axes = n.params["axes"]
        st = s.strides or contig(s.shape)
        return Ref(s.kind, s.idx, s.off, tuple(n.shape), tuple(st[a] for a in axes))

