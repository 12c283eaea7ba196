"""The graph builder: ggml's op constructors, checking shapes as the graph is built.

Every method appends one node and returns it, so the node list is always in a valid
execution order. Shapes are numpy order (see tensor.py). What each op means, its parameters and
their names are the op table's (ops.py); this module checks that the operands fit.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from . import ops
from .dtypes import F32, I32, DType
from .errors import GraphBuildError
from .graph import Graph
from .ops import GLU_OPS, ROPE_MODES, UNARY_OPS
from .tensor import LeafKind, Tensor, leaf


def _shape_str(t: Tensor) -> str:
    return f"{t.name} {list(t.shape)}"


def _can_repeat(small: tuple, big: tuple) -> bool:
    """ggml_can_repeat: `small` tiles `big` along every axis (numpy broadcasting of whole copies)."""
    if len(small) > len(big):
        return False
    small = (1,) * (len(big) - len(small)) + tuple(small)
    return all(b % s == 0 for s, b in zip(small, big))


class GraphBuilder:
    """Builds one graph. `name_prefix` is not used for identity, only for readable names."""

    def __init__(self):
        self.nodes: list[Tensor] = []
        self.leaves: dict[int, Tensor] = {}
        self.layer: int | None = None      # stamped on every node made: the planner keeps layers whole

    def layers(self, n: int) -> Iterator[int]:
        """0 .. n-1, with every node made during an iteration marked as that layer's (Tensor.layer); the
        nodes after the loop (the output head) belong to no layer."""
        for il in range(n):
            self.layer = il
            yield il
        self.layer = None

    # -- leaves ---------------------------------------------------------------------------
    def input(self, name: str, dtype: DType, shape) -> Tensor:
        return self._use_leaf(leaf(name, dtype, shape, LeafKind.INPUT))

    def use(self, t: Tensor) -> Tensor:
        """Bring an existing leaf (a model weight or a cache) into this graph."""
        if not t.is_leaf:
            raise GraphBuildError(f"use(): {t.describe()} is not a leaf")
        return self._use_leaf(t)

    def _use_leaf(self, t: Tensor) -> Tensor:
        self.leaves.setdefault(id(t), t)
        return t

    def _node(self, op, name, dtype, shape, src, params=None, contiguous=True, view_src=None) -> Tensor:
        params = dict(params or {})
        if set(params) != set(ops.spec(op).param_names):     # the builder disagrees with the table: a bug here
            raise GraphBuildError(f"{op}: parameters {sorted(params)}, the op table has {ops.spec(op).param_names}")
        for s in src:
            if s.is_leaf:
                self._use_leaf(s)
        t = Tensor(name=name, dtype=dtype, shape=tuple(int(d) for d in shape), op=op, src=tuple(src),
                   params=params, contiguous=contiguous, view_src=view_src, layer=self.layer)
        self.nodes.append(t)
        return t

    def build(self, outputs: list[Tensor]) -> Graph:
        return Graph(nodes=list(self.nodes), leaves=list(self.leaves.values()), outputs=list(outputs))

    # -- element-wise ---------------------------------------------------------------------
    def _binary(self, op: str, a: Tensor, b: Tensor, name: str | None) -> Tensor:
        if not _can_repeat(b.shape, a.shape):
            raise GraphBuildError(f"{op}: {_shape_str(b)} cannot be broadcast to {_shape_str(a)}")
        return self._node(op, name or f"{op.lower()}({a.name},{b.name})", F32, a.shape, (a, b))

    def add(self, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
        return self._binary("ADD", a, b, name)

    def mul(self, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
        return self._binary("MUL", a, b, name)

    def scale(self, a: Tensor, s: float, name: str | None = None) -> Tensor:
        return self._node("SCALE", name or f"scale({a.name})", F32, a.shape, (a,), {"scale": float(s)})

    def unary(self, a: Tensor, op: str, name: str | None = None) -> Tensor:
        if op not in UNARY_OPS:
            raise GraphBuildError(f"unary: unknown op '{op}' for {a.name}; known: {', '.join(UNARY_OPS)}")
        return self._node("UNARY", name or f"{op}({a.name})", F32, a.shape, (a,), {"op": op})

    def glu(self, gate: Tensor, up: Tensor, op: str, name: str | None = None) -> Tensor:
        """ggml_glu_split: act(gate) * up, with act gelu (geglu) or silu (swiglu)."""
        if op not in GLU_OPS:
            raise GraphBuildError(f"glu: unknown op '{op}'; known: {', '.join(GLU_OPS)}")
        if gate.shape != up.shape:
            raise GraphBuildError(f"glu({op}): gate {_shape_str(gate)} and up {_shape_str(up)} differ")
        return self._node("GLU", name or f"{op}({gate.name})", F32, gate.shape, (gate, up), {"op": op})

    def rms_norm(self, a: Tensor, eps: float, name: str | None = None) -> Tensor:
        return self._node("RMS_NORM", name or f"rms_norm({a.name})", F32, a.shape, (a,), {"eps": float(eps)})

    # -- matrix products and lookups ------------------------------------------------------
    def mul_mat(self, a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
        """ggml_mul_mat(a, b): with a of shape (..., N, K) and b of shape (..., M, K), the
        result is (..., M, N) = b @ a^T; a's leading axes must tile b's (ggml broadcasting)."""
        if len(a.shape) < 2 or len(b.shape) < 2 or a.shape[-1] != b.shape[-1]:
            raise GraphBuildError(f"mul_mat: inner dimensions differ: {_shape_str(a)} and {_shape_str(b)} "
                                  f"(both need the same last axis)")
        if not _can_repeat(a.shape[:-2], b.shape[:-2]):
            raise GraphBuildError(f"mul_mat: batch axes of {_shape_str(a)} cannot be broadcast to {_shape_str(b)}")
        shape = tuple(b.shape[:-2]) + (b.shape[-2], a.shape[-2])
        return self._node("MUL_MAT", name or f"{a.name}*{b.name}", F32, shape, (a, b))

    def get_rows(self, a: Tensor, rows: Tensor, name: str | None = None) -> Tensor:
        """Rows `rows` (int32, shape (T,)) of a 2-D tensor `a`: result (T, a.shape[-1]), float32."""
        if rows.dtype != I32 or len(rows.shape) != 1 or len(a.shape) != 2:
            raise GraphBuildError(f"get_rows: needs a 2-D source and 1-D int32 rows, got {_shape_str(a)} "
                                  f"and {_shape_str(rows)} ({rows.dtype.name})")
        return self._node("GET_ROWS", name or f"get_rows({a.name})", F32, (rows.shape[0], a.shape[1]), (a, rows))

    def set_rows(self, dst: Tensor, src: Tensor, rows: Tensor, name: str | None = None) -> Tensor:
        """Write src's rows into dst at `rows` (in place); the result aliases dst (ggml_set_rows)."""
        if (len(dst.shape) != 2 or rows.dtype != I32 or len(rows.shape) != 1
                or src.nelements != rows.shape[0] * dst.shape[1]):
            raise GraphBuildError(f"set_rows: {_shape_str(src)} is not {_shape_str(rows)} rows of "
                                  f"{dst.shape[1]} elements for {_shape_str(dst)}")
        return self._node("SET_ROWS", name or f"set_rows({dst.name})", dst.dtype, dst.shape, (dst, src, rows),
                          view_src=dst)

    def argmax(self, a: Tensor, name: str | None = None) -> Tensor:
        """The index of each row's largest value (a's last axis), int32; -1 for a row with a non-finite value."""
        if a.dtype != F32 or not a.shape:
            raise GraphBuildError(f"argmax: needs a float32 tensor of at least one axis, got {_shape_str(a)} "
                                  f"({a.dtype.name})")
        return self._node("ARGMAX", name or f"argmax({a.name})", I32, tuple(a.shape[:-1]), (a,))

    # -- attention --------------------------------------------------------------------------
    def soft_max_ext(self, a: Tensor, mask: Tensor | None, scale: float, name: str | None = None) -> Tensor:
        """softmax(a * scale + mask) over the last axis; mask (T, S) broadcasts over leading axes."""
        src = (a,) if mask is None else (a, mask)
        if mask is not None and tuple(mask.shape) != tuple(a.shape[-2:]):
            raise GraphBuildError(f"soft_max_ext: mask {_shape_str(mask)} does not match the last two axes "
                                  f"of {_shape_str(a)}")
        return self._node("SOFT_MAX", name or f"soft_max({a.name})", F32, a.shape, src, {"scale": float(scale)})

    def flash_attn_ext(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                       name: str | None = None) -> Tensor:
        """Fused attention. q (T, H, D), k and v (S, Hkv, D) with H a multiple of Hkv, mask (T, S)
        additive. Result (T, H, D). (ggml takes permuted operands; this layout saves the copies.)"""
        if len(q.shape) != 3 or len(k.shape) != 3 or k.shape != v.shape or q.shape[2] != k.shape[2]:
            raise GraphBuildError(f"flash_attn_ext: q {_shape_str(q)}, k {_shape_str(k)}, v {_shape_str(v)} "
                                  f"need q (T, H, D) and k, v (S, Hkv, D)")
        if q.shape[1] % k.shape[1]:
            raise GraphBuildError(f"flash_attn_ext: {q.shape[1]} query heads are not a multiple of "
                                  f"{k.shape[1]} kv heads ({_shape_str(q)}, {_shape_str(k)})")
        if mask is not None and tuple(mask.shape) != (q.shape[0], k.shape[0]):
            raise GraphBuildError(f"flash_attn_ext: mask {_shape_str(mask)} is not (T, S) = "
                                  f"{[q.shape[0], k.shape[0]]}")
        src = (q, k, v) if mask is None else (q, k, v, mask)
        return self._node("FLASH_ATTN_EXT", name or f"attn({q.name})", F32, q.shape, src, {"scale": float(scale)})

    def rope_ext(self, a: Tensor, pos: Tensor, n_dims: int, mode: str, freq_base: float,
                 freq_scale: float = 1.0, freq_factors: Tensor | None = None, name: str | None = None) -> Tensor:
        """Rotary position embedding of a (T, H, D) by positions pos (T,), on the first n_dims of D.
        freq_factors (n_dims/2,) float32, optional: pair i turns at its frequency divided by factor i
        (ggml_rope_ext's third operand; Llama 3's rope_freqs.weight)."""
        if mode not in ROPE_MODES:
            raise GraphBuildError(f"rope_ext: unknown mode '{mode}'; known: {', '.join(ROPE_MODES)}")
        if len(a.shape) != 3 or pos.shape != (a.shape[0],) or pos.dtype != I32:
            raise GraphBuildError(f"rope_ext: needs a (T, H, D) tensor and int32 positions (T,), got "
                                  f"{_shape_str(a)} and {_shape_str(pos)}")
        if n_dims > a.shape[2] or n_dims % 2:
            raise GraphBuildError(f"rope_ext: n_dims {n_dims} must be even and at most D of {_shape_str(a)}")
        if freq_factors is not None and (freq_factors.shape != (n_dims // 2,) or freq_factors.dtype != F32):
            raise GraphBuildError(f"rope_ext: frequency factors {_shape_str(freq_factors)} "
                                  f"({freq_factors.dtype.name}) are not F32 of shape [{n_dims // 2}] (n_dims / 2)")
        params = {"n_dims": int(n_dims), "mode": mode, "freq_base": float(freq_base), "freq_scale": float(freq_scale)}
        src = (a, pos) if freq_factors is None else (a, pos, freq_factors)
        return self._node("ROPE", name or f"rope({a.name})", F32, a.shape, src, params)

    # -- recurrent layers (linear attention) ------------------------------------------------
    def concat(self, a: Tensor, b: Tensor, axis: int, name: str | None = None) -> Tensor:
        """a and b joined along `axis` (numpy order; ggml_concat's dim is ndim - 1 - axis)."""
        axis = axis % len(a.shape) if a.shape else 0
        same = len(a.shape) == len(b.shape) and all(x == y for i, (x, y) in enumerate(zip(a.shape, b.shape))
                                                    if i != axis)
        if not same:
            raise GraphBuildError(f"concat: {_shape_str(a)} and {_shape_str(b)} differ outside axis {axis}")
        shape = tuple(a.shape[:axis]) + (a.shape[axis] + b.shape[axis],) + tuple(a.shape[axis + 1:])
        return self._node("CONCAT", name or f"concat({a.name},{b.name})", F32, shape, (a, b), {"axis": axis})

    def ssm_conv(self, sx: Tensor, c: Tensor, name: str | None = None) -> Tensor:
        """ggml_ssm_conv: a causal depthwise convolution. sx (S, C, K - 1 + T) holds each channel's last
        K - 1 inputs then its T new ones, c (C, K) each channel's kernel; result (S, T, C) with
        result[s, t, ch] = sum_k sx[s, ch, t + k] * c[ch, k]."""
        if len(sx.shape) != 3 or len(c.shape) != 2 or sx.shape[1] != c.shape[0] or sx.shape[2] < c.shape[1] - 1:
            raise GraphBuildError(f"ssm_conv: needs sx (S, C, K - 1 + T) and c (C, K), got {_shape_str(sx)} "
                                  f"and {_shape_str(c)}")
        n_t = sx.shape[2] - c.shape[1] + 1
        return self._node("SSM_CONV", name or f"ssm_conv({sx.name})", F32, (sx.shape[0], n_t, sx.shape[1]), (sx, c))

    def gated_delta_net(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                        name: str | None = None) -> Tensor:
        """ggml_gated_delta_net (one sequence, one state snapshot). q, k (T, Hk, S), v (T, H, S) with H a
        multiple of Hk (value head h reads key head h % Hk), g (T, H, 1) or (T, H, S) log-decay, beta
        (T, H, 1), state (H, S, S) with state[h, j, i] the weight of key element i in value element j.
        Per token: state *= exp(g); d = (v - state k) * beta; state += d k^T; out = state q / sqrt(S).
        Result (T + S, H * S): rows 0..T-1 the outputs (T, H, S), then the final state (H, S, S)."""
        t, hk, sk = q.shape if len(q.shape) == 3 else (0, 0, 0)
        ok = (len(q.shape) == 3 and k.shape == q.shape and len(v.shape) == 3 and v.shape[0] == t
              and v.shape[2] == sk and v.shape[1] % max(hk, 1) == 0)
        h, s = (v.shape[1], v.shape[2]) if ok else (0, 0)
        ok = ok and g.shape in ((t, h, 1), (t, h, s)) and beta.shape == (t, h, 1) and state.shape == (h, s, s)
        if not ok:
            raise GraphBuildError(f"gated_delta_net: needs q, k (T, Hk, S), v (T, H, S), g (T, H, 1 or S), "
                                  f"beta (T, H, 1), state (H, S, S); got {_shape_str(q)}, {_shape_str(k)}, "
                                  f"{_shape_str(v)}, {_shape_str(g)}, {_shape_str(beta)}, {_shape_str(state)}")
        return self._node("GATED_DELTA_NET", name or f"gated_delta_net({v.name})", F32, (t + s, h * s),
                          (q, k, v, g, beta, state))

    # -- views and layout -----------------------------------------------------------------
    def reshape(self, a: Tensor, shape, name: str | None = None) -> Tensor:
        shape = tuple(int(d) for d in shape)
        if math.prod(shape) != a.nelements:
            raise GraphBuildError(f"reshape: {_shape_str(a)} has {a.nelements} elements, {list(shape)} has "
                                  f"{math.prod(shape)}")
        if not a.contiguous:
            raise GraphBuildError(f"reshape: {_shape_str(a)} is not contiguous, so it cannot be reshaped to "
                                  f"{list(shape)}; cont() it first")
        return self._node("RESHAPE", name or f"{a.name}(reshaped)", a.dtype, shape, (a,), {"shape": shape},
                          view_src=a)

    def view(self, a: Tensor, shape, offset: int = 0, name: str | None = None) -> Tensor:
        """A contiguous window of `a`: `shape` elements starting `offset` elements in."""
        shape = tuple(int(d) for d in shape)
        if not a.contiguous or offset < 0 or offset + math.prod(shape) > a.nelements:
            raise GraphBuildError(f"view: {list(shape)} at element {offset} does not fit in contiguous "
                                  f"{_shape_str(a)}")
        return self._node("VIEW", name or f"{a.name}(view)", a.dtype, shape, (a,),
                          {"shape": shape, "offset": int(offset)}, view_src=a)

    def permute(self, a: Tensor, axes, name: str | None = None) -> Tensor:
        axes = tuple(int(x) for x in axes)
        if sorted(axes) != list(range(len(a.shape))):
            raise GraphBuildError(f"permute: {list(axes)} is not a permutation of the axes of {_shape_str(a)}")
        shape = tuple(a.shape[i] for i in axes)
        contiguous = a.contiguous and axes == tuple(range(len(axes)))
        return self._node("PERMUTE", name or f"{a.name}(permuted)", a.dtype, shape, (a,), {"axes": axes},
                          contiguous=contiguous, view_src=a)

    def transpose(self, a: Tensor, name: str | None = None) -> Tensor:
        """Swap the last two axes (ggml_transpose)."""
        if len(a.shape) < 2:
            raise GraphBuildError(f"transpose: {_shape_str(a)} has fewer than two axes")
        axes = tuple(range(len(a.shape) - 2)) + (len(a.shape) - 1, len(a.shape) - 2)
        return self.permute(a, axes, name or f"{a.name}(transposed)")

    def cont(self, a: Tensor, name: str | None = None) -> Tensor:
        return self._node("CONT", name or f"{a.name}(cont)", a.dtype, a.shape, (a,))

