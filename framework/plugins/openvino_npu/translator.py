"""A fragment as an ``ov.Model`` built from OpenVINO opset operations.

Every op's semantics are the op table's (framework/core/graph/ops.py, docs/ops.md; reference.py's kernels);
shapes are numpy order on both sides, so a tensor's shape is its OpenVINO shape. The Translator holds the
values, the model's inputs and its outputs; each op's operations are translate_ops.py's (the attention
translate_attention.py's), chosen by op name; the weights' nodes and products are translate.py's.

Inputs of the model, in order (the program feeds them from ``run`` arguments):
  * every fragment input that is not a weight, as a Parameter of its shape and type, except
  * a KV cache (a CACHE leaf written by SET_ROWS here): a Parameter of only the rows the fragment
    reads (the ``n_kv`` window the attention views), bound to the first rows of the cache array
    without a copy;
  * cos/sin tables for every ROPE whose positions are a fragment input, computed on the host in
    float64 by the reference's rope table (position x frequency in float32 would lose digits at long contexts).
Weights become constants (weights.py: compressed constants with their decompression pattern).

A SET_ROWS does not copy the cache inside the model. The model outputs the step's new rows (the
program writes them into the cache array in place after the run), and an attention that reads the
window just written (VIEW of the SET_ROWS) is computed over the window as it was before the write,
with the columns being rewritten masked out, plus the new rows as extra columns: the same set of
(score, value) pairs as attention over the updated window, without a copy of the window. Any other
reader of a SET_ROWS result gets a real ScatterUpdate.
"""

from __future__ import annotations

import openvino as ov
from openvino import opset13 as ops

from ...contract import Fragment, LeafKind, Tensor
from .translate import (OV_TYPES, CacheView, CacheWrite, Feed, FullWindow, Translation, TranslationError,
                        fusion_groups, i64, safe_name, shared_constants, view, weight_node)
from .translate_ops import TRANSLATE
from .weights import OvWeight


class Translator:
    """One fragment's translation: the value of every tensor, the model's Parameters and what feeds them,
    and what the ops' translations share across one model (rope tables, attention masks, fused products)."""

    def __init__(self, fragment: Fragment, weights: dict[int, OvWeight], full: frozenset = frozenset(),
                 kv: int | None = None):
        self.f = fragment
        self.full = full               # id of every cache bound with all its rows (translate: FullWindow)
        self.kv = kv                   # the KV length left dynamic (kv_programs.py), or None: every shape fixed
        self.kv_masks = {id(n.src[3]) for n in fragment.nodes if n.op == "FLASH_ATTN_EXT"} if kv else set()
        self.weights = weights
        self.values: dict[int, object] = {}
        self.params: list[ov.Node] = []
        self.feeds: list[Feed] = []
        self.arg_index = {id(t): i for i, t in enumerate(fragment.inputs)}
        self.rope_tables: dict[tuple, tuple[ov.Output, ov.Output]] = {}
        self.windows: dict[int, int] = {}
        self.mask_parts: dict[tuple, tuple] = {}
        self.consumers: dict[int, list[Tensor]] = {}
        for n in fragment.nodes:
            for s in n.src:
                self.consumers.setdefault(id(s), []).append(n)
        self.fusion = fusion_groups(fragment.nodes, weights)
        self.fused: dict[int, list[ov.Output]] = {}     # id(first member) -> the parts of its fused product

    # -- inputs -------------------------------------------------------------------------------
    def param(self, shape, dtype, name, feed: Feed) -> ov.Output:
        p = ops.parameter(list(shape), dtype, name=f"in{len(self.params)}_{safe_name(name)}")
        self.params.append(p)
        self.feeds.append(feed)
        return p.output(0)

    def value(self, t: Tensor):
        key = id(t)
        if key in self.values:
            return self.values[key]
        if key in self.arg_index:
            idx = self.arg_index[key]
            if t.is_leaf and t.kind == LeafKind.WEIGHT:
                w = self.weights.get(key)
                if w is None:
                    raise TranslationError(f"weight {t.describe()} was not loaded by this device")
                v = weight_node(w, t.shape)
            else:
                if t.dtype.name not in OV_TYPES:
                    raise TranslationError(f"input {t.describe()}: type {t.dtype.name} is not supported")
                shape = (t.shape[0], -1) if key in self.kv_masks else t.shape     # (T, KV): any KV length
                v = self.param(shape, OV_TYPES[t.dtype.name], t.name, Feed("arg", idx))
            self.values[key] = v
            return v
        raise TranslationError(f"{t.describe()} is neither computed in the fragment nor one of its inputs")

    def out(self, t: Tensor) -> ov.Output:
        """A concrete OpenVINO value for t (materialising a lazy cache write or view)."""
        v = self.value(t)
        if isinstance(v, CacheWrite):
            return self.scattered(v)
        if isinstance(v, CacheView):
            full = self.scattered(v.write)
            return view(full, v.write.rows_in_window * v.write.width, v.shape, 0)
        return v

    def scattered(self, w: CacheWrite) -> ov.Output:
        """The cache window with the write applied: a real ScatterUpdate, for a reader other than the attention."""
        if w.scattered is None:
            dst = w.node.src[0]
            if w.rows_in_window < dst.shape[0]:       # rows may fall past a partial window: bind all rows
                raise FullWindow(id(dst))
            w.scattered = ops.scatter_update(w.window, w.rows, w.new_rows, i64(0)).output(0)
        return w.scattered

    # -- the model ----------------------------------------------------------------------------
    def build(self) -> Translation:
        for n in self.f.nodes:
            self.values[id(n)] = self.node(n)
        results, outputs = [], []
        for t in self.f.outputs:
            v = self.values[id(t)]
            if t.op == "SET_ROWS" and isinstance(v, CacheWrite):
                cache_arg = self.arg_index[id(t.src[0])]
                results.append(ops.result(v.new_rows))
                new_idx = len(results) - 1
                rows_arg = self.arg_index.get(id(t.src[2]))
                rows_idx = None
                if rows_arg is None:
                    results.append(ops.result(v.rows))
                    rows_idx = len(results) - 1
                outputs.append(("cache", cache_arg, new_idx, rows_arg, rows_idx))
            else:
                results.append(ops.result(self.out(t)))
                outputs.append(("value", len(results) - 1))
        model = ov.Model(results, self.params, f"fragment_{self.f.structure}")
        # deterministic names: OpenVINO's on-disk cache hashes the serialised model, names included
        for i, node in enumerate(model.get_ordered_ops()):
            if node.get_type_name() != "Parameter":
                node.set_friendly_name(f"{node.get_type_name()}_{i}")
        for i, o in enumerate(model.outputs):
            o.get_tensor().set_names({f"out{i}"})
        return Translation(model, self.feeds, outputs, dict(self.windows))

    def node(self, n: Tensor):
        fn = TRANSLATE.get(n.op)
        if fn is None:
            raise TranslationError(f"no translation for {n.describe()}")
        return fn(self, n)


def translate(fragment: Fragment, weights: dict[int, OvWeight], kv: int | None = None) -> Translation:
    """The fragment's model; translated again binding every row of a cache whose write must be materialised.
    kv: the fragment's KV length, left dynamic (kv_programs.kv_length checked that the fragment allows it)."""
    full: frozenset = frozenset()
    while True:
        with shared_constants():
            try:
                return Translator(fragment, weights, full, kv).build()
            except FullWindow as e:
                full = full | {e.args[0]}
