"""The op cases: one tiny graph per case, built with GraphBuilder, with random values.

A case is an id, the op it tests and a build function. Building a case gives a :class:`Built`:
the graph, the values of its input leaves ``{id(tensor): array}``, the raw GGUF bytes of its
weight leaves ``{name: uint8 array}`` and its NMSE threshold. Every case draws its values from its
own ``numpy`` Generator, seeded from :data:`SEED` and the case id, so a case is the same graph with
the same values in every run, on every machine, whatever else runs. The random-shapes sweep draws
its shapes from a Generator seeded the same way. ``FRAMEWORK_CONFORMANCE_SEED=<int>`` picks another
seed (other values and other sweep shapes).

Shapes are numpy order (ggml's ``ne`` reversed). Values are uniform in [-1, 1] as in ggml's
test-backend-ops unless a case says otherwise.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from .. import settings
from ..core.graph import F32, GLU_OPS, I32, OPS, ROPE_MODES, UNARY_OPS, Graph, GraphBuilder, LeafKind, Tensor, leaf
from ..core.graph import ops as op_table
from ..core.graph.dtypes import nbytes

Q = GGMLQuantizationType
SEED = settings.read(settings.CONFORMANCE_SEED.name)

# -- error metric and thresholds (ggml's test-backend-ops; the op table holds them and says why) ---------
NMSE_DEFAULT = op_table.NMSE_DEFAULT
NMSE_MAX = {op: s.nmse for op, s in OPS.items() if s.nmse != NMSE_DEFAULT}


nmse = op_table.nmse      # ggml's normalised mean squared error (the op table's, which --verify uses too)


def threshold(graph: Graph) -> float:
    """The case's NMSE threshold: the loosest of its computing nodes' ops."""
    return max((op_table.nmse_threshold(n.op) for n in graph.nodes), default=NMSE_DEFAULT)


# -- weights ------------------------------------------------------------------------------------------
# Every weight type the suite stores in WEIGHT leaves. The first eight are the ones the brief and
# the bundled models need (gemma3: Q8_0, Q5_0, Q4_K, Q6_K, F32; SmolLM2: Q4_1, Q8_0, F32); the sweep
# also draws the other GGUF types llama.cpp's common quantisations use.
WEIGHT_TYPES = (Q.F32, Q.F16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K)
EXTRA_WEIGHT_TYPES = (Q.Q5_1, Q.Q2_K, Q.Q3_K, Q.Q5_K)

# gguf.quants.quantize has no quantizer for the K-quants (it raises NotImplementedError). Every bit
# pattern of their packed quants and sub-block scales is a valid block, so they are made of random
# bytes, with the f16 super-block scales (at these byte offsets of a block) set to finite values.
K_QUANT_F16_FIELDS = {
    Q.Q2_K: (80, 82),     # scales[16] qs[64] d dmin
    Q.Q3_K: (108,),       # hmask[32] qs[64] scales[12] d
    Q.Q4_K: (0, 2),       # d dmin scales[12] qs[128]
    Q.Q5_K: (0, 2),       # d dmin scales[12] qh[32] qs[128]
    Q.Q6_K: (208,),       # ql[128] qh[64] scales[16] d
}


def block_elements(qtype: Q) -> int:
    return GGML_QUANT_SIZES[qtype][0]


def random_weight_bytes(rng: np.random.Generator, qtype: Q, shape: tuple[int, ...]) -> np.ndarray:
    """The raw GGUF bytes (flat, read-only uint8, as a memory map hands them over) of a random
    weight of this type and shape."""
    rows, width = math.prod(shape[:-1]), shape[-1]
    if qtype in K_QUANT_F16_FIELDS:
        per_block, block_bytes = GGML_QUANT_SIZES[qtype]
        n_blocks = rows * width // per_block
        raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
        for offset in K_QUANT_F16_FIELDS[qtype]:
            scale = rng.uniform(0.0005, 0.004, size=n_blocks).astype(np.float16)
            raw[:, offset:offset + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    else:
        values = rng.uniform(-1.0, 1.0, size=(rows, width)).astype(np.float32)
        raw = values if qtype == Q.F32 else gguf_quants.quantize(values, qtype)
        raw = np.ascontiguousarray(raw).view(np.uint8)
    raw = np.ascontiguousarray(raw).reshape(-1)
    if raw.size != nbytes(qtype, tuple(shape)):
        raise AssertionError(f"{qtype.name} {shape}: made {raw.size} bytes, expected {nbytes(qtype, tuple(shape))}")
    raw.setflags(write=False)
    return raw


# -- cases --------------------------------------------------------------------------------------------
class CaseGraph:
    """What a build function works with: the GraphBuilder ``b``, the Generator ``rng``, and helpers
    that create leaves and remember their values."""

    def __init__(self, rng: np.random.Generator):
        self.b = GraphBuilder()
        self.rng = rng
        self.inputs: dict[int, np.ndarray] = {}
        self.weights: dict[str, np.ndarray] = {}

    def value(self, name: str, array: np.ndarray) -> Tensor:
        """An INPUT leaf holding `array` (float32 or int32)."""
        dtype = {np.dtype(np.float32): F32, np.dtype(np.int32): I32}[array.dtype]
        t = self.b.input(name, dtype, array.shape)
        self.inputs[id(t)] = array
        return t

    def f32(self, name: str, shape, scale: float = 1.0) -> Tensor:
        return self.value(name, (self.rng.uniform(-1.0, 1.0, size=tuple(shape)) * scale).astype(np.float32))

    def ints(self, name: str, values) -> Tensor:
        return self.value(name, np.asarray(values, dtype=np.int32).reshape(-1))

    def mask(self, name: str, t: int, s: int, n_past: int, window: int | None = None) -> Tensor:
        """A (T, S) additive mask, 0 or -inf: query i sits at position n_past + i and sees rows up
        to it (causal), and with a window only the last `window` of those (sliding-window attention).
        Rows past n_past + T (cache rows not written yet) are hidden."""
        return self.value(name, causal_mask(t, s, n_past, window))

    def weight(self, name: str, qtype: Q, shape) -> Tensor:
        t = leaf(name, qtype, tuple(shape), LeafKind.WEIGHT)
        self.weights[name] = random_weight_bytes(self.rng, qtype, t.shape)
        return self.b.use(t)

    def cache(self, name: str, shape) -> Tensor:
        return self.b.use(leaf(name, F32, tuple(shape), LeafKind.CACHE))


def causal_mask(t: int, s: int, n_past: int, window: int | None = None) -> np.ndarray:
    mask = np.full((t, s), -np.inf, dtype=np.float32)
    for i in range(t):
        p = n_past + i
        lo = 0 if window is None else max(0, p - window + 1)
        mask[i, lo:p + 1] = 0.0
    return mask


@dataclass(eq=False)
class Built:
    case: Case
    graph: Graph
    inputs: dict[int, np.ndarray]
    weights: dict[str, np.ndarray]
    tolerance: float

    def weight_bytes(self, t: Tensor) -> np.ndarray:
        """The executor's weight_bytes callback."""
        return self.weights[t.name]

    def fresh_inputs(self) -> dict[int, np.ndarray]:
        """Copies of the input values: a device that writes into its inputs cannot affect a later run."""
        return {k: v.copy() for k, v in self.inputs.items()}

    def describe(self) -> str:
        nodes = ", ".join(f"{n.op}{list(n.shape)}" for n in self.graph.nodes)
        leaves = ", ".join(f"{t.name}:{t.kind.value}:{t.dtype.name}{list(t.shape)}" for t in self.graph.leaves)
        return f"case {self.case.id}: nodes {nodes}; leaves {leaves}"


@dataclass(frozen=True, eq=False)
class Case:
    id: str
    op: str                                           # the op under test
    build_fn: Callable[[CaseGraph], list[Tensor]]     # appends the nodes, returns the outputs

    def build(self) -> Built:
        g = CaseGraph(np.random.default_rng([SEED, zlib.crc32(self.id.encode())]))
        outputs = self.build_fn(g)
        graph = g.b.build(outputs)
        return Built(self, graph, g.inputs, g.weights, threshold(graph))

    def __repr__(self) -> str:
        return f"Case({self.id})"


def _dims(shape) -> str:
    return "x".join(str(d) for d in shape) or "scalar"


# -- build functions, one per op (keyword parameters; partial() makes them cases) ----------------------
def get_rows_weight(g: CaseGraph, *, qtype: Q, n_rows: int, width: int, n_out: int) -> list[Tensor]:
    """The token embedding lookup: rows of a (possibly quantized) weight."""
    w = g.weight("token_embd.weight", qtype, (n_rows, width))
    rows = g.rng.integers(0, n_rows, size=n_out)
    rows[-1] = n_rows - 1                           # the last row, to catch an off-by-one in row strides
    return [g.b.get_rows(w, g.ints("inp_tokens", rows))]


def get_rows_activations(g: CaseGraph, *, t: int, width: int, n_out: int) -> list[Tensor]:
    """The output-rows selection: rows of a float32 activation tensor."""
    x = g.f32("x", (t, width))
    rows = g.rng.integers(0, t, size=n_out)
    return [g.b.get_rows(x, g.ints("inp_out_ids", rows))]


def mul_mat_weight(g: CaseGraph, *, qtype: Q, n: int, k: int, m: int) -> list[Tensor]:
    """A projection: weight (N, K) of `qtype` times activations (M, K) -> (M, N)."""
    w = g.weight("blk.0.ffn_up.weight", qtype, (n, k))
    return [g.b.mul_mat(w, g.f32("x", (m, k)))]


def mul_mat_activations(g: CaseGraph, *, a_shape, b_shape) -> list[Tensor]:
    """A product of two float32 activations with ggml's batch broadcasting."""
    return [g.b.mul_mat(g.f32("a", a_shape), g.f32("b", b_shape))]


def binary(g: CaseGraph, *, op: str, a_shape, b_shape, b_weight: bool = False) -> list[Tensor]:
    """ADD or MUL, b repeated to a's shape (ggml_can_repeat); b may be an F32 weight (a norm's gain)."""
    a = g.f32("a", a_shape)
    bt = g.weight("blk.0.attn_norm.weight", Q.F32, b_shape) if b_weight else g.f32("b", b_shape)
    return [(g.b.add if op == "ADD" else g.b.mul)(a, bt)]


def scale(g: CaseGraph, *, shape, s: float) -> list[Tensor]:
    return [g.b.scale(g.f32("a", shape), s)]


def gelu_tail(g: CaseGraph, name: str, shape) -> Tensor:
    """Values in [-3.5, -1.5], where GELU's tanh approximation (ggml_gelu, the models') and the erf
    form differ most: NMSE 7e-5 between them, where with values in [-1, 1] it is 3e-8, under any
    threshold. The values are exact in f16, so a device that looks GELU up in an f16 table (as ggml's
    CPU backend does) loses only the table's rounding (NMSE 4e-8)."""
    grid = np.arange(-3.5, -1.5, 1.0 / 128, dtype=np.float32)    # every value exact in f16
    return g.value(name, g.rng.choice(grid, size=tuple(shape)).astype(np.float32))


def unary(g: CaseGraph, *, op: str, shape, spread: float = 4.0, tail: bool = False) -> list[Tensor]:
    return [g.b.unary(gelu_tail(g, "a", shape) if tail else g.f32("a", shape, spread), op)]


def glu(g: CaseGraph, *, op: str, shape, tail: bool = False) -> list[Tensor]:
    gate = gelu_tail(g, "gate", shape) if tail else g.f32("gate", shape, 4.0)
    return [g.b.glu(gate, g.f32("up", shape), op)]


def rms_norm(g: CaseGraph, *, shape, eps: float, spread: float = 1.0) -> list[Tensor]:
    return [g.b.rms_norm(g.f32("a", shape, spread), eps)]


def norm(g: CaseGraph, *, shape, eps: float) -> list[Tensor]:
    """The models' norm: RMS_NORM then MUL by an F32 gain weight over the last axis."""
    x = g.b.rms_norm(g.f32("x", shape), eps)
    return [g.b.mul(x, g.weight("blk.0.attn_norm.weight", Q.F32, (shape[-1],)))]


def soft_max(g: CaseGraph, *, shape, masked: bool, s: float, spread: float = 1.0) -> list[Tensor]:
    """softmax(a * scale + mask) over rows; a (..., T, S), mask (T, S) causal with -inf."""
    t, n_kv = shape[-2], shape[-1]
    mask = g.mask("kq_mask", t, n_kv, n_kv - t) if masked else None
    return [g.b.soft_max_ext(g.f32("kq", shape, spread), mask, s)]


def flash_attn(g: CaseGraph, *, t: int, n_kv: int, h: int, hkv: int, d: int, n_past: int | None = None,
               masked: bool = True, window: int | None = None) -> list[Tensor]:
    """Attention of T queries over n_kv cache rows, GQA (H query heads over Hkv kv heads), causal
    mask with -inf (rows past n_past + T, not written yet, hidden too)."""
    n_past = n_kv - t if n_past is None else n_past
    q, k, v = g.f32("q", (t, h, d)), g.f32("k", (n_kv, hkv, d)), g.f32("v", (n_kv, hkv, d))
    mask = g.mask("kq_mask", t, n_kv, n_past, window) if masked else None
    return [g.b.flash_attn_ext(q, k, v, mask, 1.0 / math.sqrt(d))]


def rope(g: CaseGraph, *, t: int, h: int, d: int, n_dims: int, mode: str, base: float, freq_scale: float = 1.0,
         max_pos: int = 2048) -> list[Tensor]:
    x = g.f32("q", (t, h, d))
    pos = np.sort(g.rng.integers(0, max_pos, size=t))
    pos[0] = 0 if t > 1 else pos[0]                  # position 0 (the identity) when there is room
    return [g.b.rope_ext(x, g.ints("inp_pos", pos), n_dims, mode, base, freq_scale)]


def set_rows_view(g: CaseGraph, *, n_ctx: int, hkv: int, d: int, t: int, n_kv: int,
                  contiguous_rows: bool = True) -> list[Tensor]:
    """The KV-cache write: SET_ROWS of T new rows into a CACHE leaf, then a VIEW of its first n_kv
    rows as (n_kv, Hkv, D), as attention reads it."""
    cache = g.cache("cache_k_l0", (n_ctx, hkv * d))
    if contiguous_rows:
        start = int(g.rng.integers(0, n_kv - t + 1))
        rows = np.arange(start, start + t)
    else:
        rows = g.rng.choice(n_kv, size=t, replace=False)
    k = g.b.reshape(g.f32("k", (t, hkv, d)), (t, hkv * d))
    written = g.b.set_rows(cache, k, g.ints("kv_rows", rows))
    return [g.b.view(written, (n_kv, hkv, d))]


def kv_attention(g: CaseGraph, *, n_ctx: int, t: int, n_past: int, h: int, hkv: int, d: int) -> list[Tensor]:
    """One attention step as the models build it: write K and V into the caches, view them, attend,
    merge the heads."""
    b, n_kv = g.b, n_past + t
    rows = g.ints("kv_rows", np.arange(n_past, n_past + t))
    k_cache, v_cache = g.cache("cache_k_l0", (n_ctx, hkv * d)), g.cache("cache_v_l0", (n_ctx, hkv * d))
    k_all = b.view(b.set_rows(k_cache, b.reshape(g.f32("k", (t, hkv, d)), (t, hkv * d)), rows), (n_kv, hkv, d))
    v_all = b.view(b.set_rows(v_cache, b.reshape(g.f32("v", (t, hkv, d)), (t, hkv * d)), rows), (n_kv, hkv, d))
    out = b.flash_attn_ext(g.f32("q", (t, h, d)), k_all, v_all, g.mask("kq_mask", t, n_kv, n_past),
                           1.0 / math.sqrt(d))
    return [b.reshape(out, (t, h * d))]


def views_chain(g: CaseGraph, *, shape=(2, 3, 4)) -> list[Tensor]:
    """RESHAPE, PERMUTE (a transpose), CONT and VIEW (with an offset) of a computed tensor."""
    b = g.b
    x = b.scale(g.f32("a", shape), 1.0)
    rows = math.prod(shape[:-1])
    c = b.cont(b.transpose(b.reshape(x, (rows, shape[-1]))))
    n = c.nelements // 2
    return [b.scale(b.view(c, (2, n // 2), offset=c.nelements - n // 2 * 2), 1.0)]


def permute_cont(g: CaseGraph, *, shape, axes, computed: bool = True) -> list[Tensor]:
    """PERMUTE then CONT, of a computed tensor (SCALE first) or of an input leaf."""
    x = g.f32("a", shape)
    if computed:
        x = g.b.scale(x, 1.0)
    return [g.b.cont(g.b.permute(x, axes))]


def view_cont(g: CaseGraph, *, shape, view_shape, offset: int) -> list[Tensor]:
    """A VIEW (a window at an element offset) of an input leaf, then CONT."""
    return [g.b.cont(g.b.view(g.f32("a", shape), view_shape, offset))]


def reshape_cont(g: CaseGraph, *, shape, new_shape) -> list[Tensor]:
    """RESHAPE of a computed tensor, then CONT."""
    return [g.b.cont(g.b.reshape(g.b.scale(g.f32("a", shape), -1.0), new_shape))]


def _norm(g: CaseGraph, x: Tensor, name: str, eps: float = 1e-6) -> Tensor:
    """The models' norm: RMS_NORM over the last axis, then MUL by an F32 gain weight."""
    return g.b.mul(g.b.rms_norm(x, eps), g.weight(name, Q.F32, (x.shape[-1],)))


def decode_layers(g: CaseGraph, *, arch: str, layers: int, n_embd: int, h: int, hkv: int, d: int, n_ff: int,
                  n_ctx: int, n_past: int, n_kv: int, qtypes, n_vocab: int = 96) -> list[Tensor]:
    """One decode step (one token) of `layers` transformer layers and the output head, as the models build
    them (model/arch: "llama" as SmolLM2, "gemma3" with per-head q/k norms, neox rope, q scaled, post-norms
    and GEGLU), over caches that already hold n_past rows (written by an earlier SET_ROWS of random rows):
    the runs of nodes a backend may fuse for decode (the Vulkan plugin's fusion.py). Outputs: the logits
    and every layer's two cache writes. qtypes: the types of (q, k, v, o, gate, up, down, output)."""
    b, gemma = g.b, arch == "gemma3"
    tq, tk, tv, to, tg, tu, td, tout = qtypes
    x = b.get_rows(g.weight("token_embd.weight", Q.Q8_0, (n_vocab, n_embd)), g.ints("inp_tokens", [n_vocab - 3]))
    if gemma:
        x = b.scale(x, math.sqrt(n_embd))
    pos, rows = g.ints("inp_pos", [n_past]), g.ints("kv_rows", [n_past])
    mask = g.mask("kq_mask", 1, n_kv, n_past, window=n_past - 5 if gemma else None)
    mode, base = ("neox", 10000.0) if gemma else ("normal", 100000.0)
    writes = []
    for il in range(layers):
        w = f"blk.{il}."
        cur = _norm(g, x, w + "attn_norm.weight")
        q = b.reshape(b.mul_mat(g.weight(w + "attn_q.weight", tq, (h * d, n_embd)), cur), (1, h, d))
        k = b.reshape(b.mul_mat(g.weight(w + "attn_k.weight", tk, (hkv * d, n_embd)), cur), (1, hkv, d))
        v = b.reshape(b.mul_mat(g.weight(w + "attn_v.weight", tv, (hkv * d, n_embd)), cur), (1, hkv, d))
        if gemma:
            q, k = _norm(g, q, w + "attn_q_norm.weight"), _norm(g, k, w + "attn_k_norm.weight")
        q, k = b.rope_ext(q, pos, d, mode, base), b.rope_ext(k, pos, d, mode, base)
        if gemma:
            q = b.scale(q, 1.0 / math.sqrt(d))
        caches = []
        for name, new in (("k", k), ("v", v)):
            cache = g.cache(f"cache_{name}_l{il}", (n_ctx, hkv * d))
            cache = b.set_rows(cache, g.f32(f"{name}_past_l{il}", (n_past, hkv * d)), g.ints(f"past_rows_{name}{il}",
                                                                                             np.arange(n_past)))
            written = b.set_rows(cache, b.reshape(new, (1, hkv * d)), rows)
            writes.append(written)
            caches.append(b.view(written, (n_kv, hkv, d)))
        att = b.flash_attn_ext(q, caches[0], caches[1], mask, 1.0 if gemma else 1.0 / math.sqrt(d))
        att = b.mul_mat(g.weight(w + "attn_output.weight", to, (n_embd, h * d)), b.reshape(att, (1, h * d)))
        if gemma:
            att = _norm(g, att, w + "post_attention_norm.weight")
        x = b.add(att, x)
        cur = _norm(g, x, w + "ffn_norm.weight")
        gate = b.mul_mat(g.weight(w + "ffn_gate.weight", tg, (n_ff, n_embd)), cur)
        up = b.mul_mat(g.weight(w + "ffn_up.weight", tu, (n_ff, n_embd)), cur)
        cur = b.mul_mat(g.weight(w + "ffn_down.weight", td, (n_embd, n_ff)),
                        b.glu(gate, up, "geglu" if gemma else "swiglu"))
        if gemma:
            cur = _norm(g, cur, w + "post_ffw_norm.weight")
        x = b.add(cur, x)
    x = _norm(g, b.get_rows(x, g.ints("inp_out_ids", [0])), "output_norm.weight")
    return [b.mul_mat(g.weight("output.weight", tout, (n_vocab, n_embd)), x)] + writes


def decode_norm_product(g: CaseGraph, *, qtype: Q, n: int, k: int) -> list[Tensor]:
    """One token's residual add, norm and product (a layer's FFN input): y = x + r, then
    rms_norm(y) * gain times a weight; y is an output too."""
    y = g.b.add(g.f32("x", (1, k)), g.f32("r", (1, k)))
    return [g.b.mul_mat(g.weight("blk.0.ffn_up.weight", qtype, (n, k)), _norm(g, y, "blk.0.ffn_norm.weight")), y]


# -- the fixed cases ----------------------------------------------------------------------------------
def _case(case_id: str, case_op: str, fn, /, **params) -> Case:
    return Case(case_id, case_op, partial(fn, **params))


def argmax(g: CaseGraph, *, shape, tie: bool = False, not_finite: float | None = None) -> list[Tensor]:
    """Each row's argmax; tie: the first row's largest value twice (the first index wins); not_finite: that
    value in the last row (its index is -1)."""
    x = (g.rng.uniform(-1.0, 1.0, size=tuple(shape)) * 8).astype(np.float32)
    if tie:
        x[0, 3] = x[0, -2] = x[0].max() + 1
    if not_finite is not None:
        x[-1, x.shape[-1] // 2] = not_finite
    return [g.b.argmax(g.value("logits", x))]


def concat(g: CaseGraph, *, a_shape, b_shape, axis: int) -> list[Tensor]:
    """Two tensors joined on an axis (qwen35 joins the convolution's state and the new inputs, time-major)."""
    return [g.b.concat(g.f32("a", a_shape), g.f32("b", b_shape), axis)]


def ssm_conv(g: CaseGraph, *, c: int, k: int, t: int) -> list[Tensor]:
    """The short causal convolution of a GatedDeltaNet layer: K - 1 past inputs and T new ones per channel,
    the kernel an F32 weight, as the models keep it."""
    return [g.b.ssm_conv(g.f32("sx", (1, c, k - 1 + t)), g.weight("conv1d", Q.F32, (c, k)))]


def gated_delta_net(g: CaseGraph, *, t: int, hk: int, h: int, s: int, per_element: bool = False) -> list[Tensor]:
    """The gated delta rule over T tokens from a given state: q and k about unit length (the models
    L2-normalise them), log-decays in (-1, 0], beta in (0, 1)."""
    rng = g.rng
    q = g.f32("q", (t, hk, s), 1.0 / math.sqrt(s))
    k = g.f32("k", (t, hk, s), 1.0 / math.sqrt(s))
    v = g.f32("v", (t, h, s))
    decay = g.value("g", -rng.uniform(0.0, 1.0, size=(t, h, s if per_element else 1)).astype(np.float32))
    beta = g.value("beta", rng.uniform(0.0, 1.0, size=(t, h, 1)).astype(np.float32))
    state = g.f32("state", (h, s, s), 0.5)
    return [g.b.gated_delta_net(q, k, v, decay, beta, state)]


def rope_factors(g: CaseGraph, *, t: int, h: int, d: int, base: float) -> list[Tensor]:
    """ROPE with frequency factors (Llama 3's rope_freqs.weight, an F32 weight of n_dims/2 values in [1, 8])."""
    factors = leaf("rope_freqs", F32, (d // 2,), LeafKind.WEIGHT)
    g.weights["rope_freqs"] = np.frombuffer(g.rng.uniform(1.0, 8.0, size=d // 2).astype(np.float32).tobytes(),
                                            dtype=np.uint8)
    pos = g.ints("pos", np.arange(3, 3 + t))
    return [g.b.rope_ext(g.f32("x", (t, h, d)), pos, d, "normal", base, freq_factors=g.b.use(factors))]


def linear_attention_cases() -> list[Case]:
    c = [_case("CONCAT-time-3x96-5x96", "CONCAT", concat, a_shape=(3, 96), b_shape=(5, 96), axis=0),
         _case("CONCAT-last-2x3x4-2x3x6", "CONCAT", concat, a_shape=(2, 3, 4), b_shape=(2, 3, 6), axis=2)]
    for t in (1, 9):
        c.append(_case(f"SSM_CONV-c96-k4-t{t}", "SSM_CONV", ssm_conv, c=96, k=4, t=t))
        c.append(_case(f"GATED_DELTA_NET-t{t}-hk2-h4-s16", "GATED_DELTA_NET", gated_delta_net, t=t, hk=2, h=4, s=16))
    c.append(_case("GATED_DELTA_NET-t5-h2-s8-per-element-decay", "GATED_DELTA_NET", gated_delta_net, t=5, hk=2, h=2,
                   s=8, per_element=True))
    c.append(_case("ROPE-normal-freq-factors-5x4x64", "ROPE", rope_factors, t=5, h=4, d=64, base=500000.0))
    return c


def fixed_cases() -> list[Case]:
    c = []
    # GET_ROWS: the embedding lookup from every weight type, decode (1 token) and prefill
    for q in WEIGHT_TYPES:
        width = 256 if block_elements(q) == 256 else 64
        for n_out, phase in ((1, "decode"), (7, "prefill")):
            c.append(_case(f"GET_ROWS-{q.name}-{phase}-{n_out}of40x{width}", "GET_ROWS", get_rows_weight,
                           qtype=q, n_rows=40, width=width, n_out=n_out))
    c.append(_case("GET_ROWS-F32-activations-3of9x48", "GET_ROWS", get_rows_activations, t=9, width=48, n_out=3))
    c.append(_case("GET_ROWS-F32-activations-1of1x48", "GET_ROWS", get_rows_activations, t=1, width=48, n_out=1))

    # MUL_MAT: every weight type, decode (1 row) and prefill (many rows); K of two super-blocks
    for q in WEIGHT_TYPES:
        for m, phase in ((1, "decode"), (9, "prefill")):
            c.append(_case(f"MUL_MAT-{q.name}-{phase}-w48x512-x{m}x512", "MUL_MAT", mul_mat_weight,
                           qtype=q, n=48, k=512, m=m))
    c.append(_case("MUL_MAT-Q8_0-prefill-w96x640-x33x640", "MUL_MAT", mul_mat_weight,   # gemma3's width
                   qtype=Q.Q8_0, n=96, k=640, m=33))
    for a_shape, b_shape in (((6, 32), (3, 5, 32)), ((2, 6, 32), (4, 5, 32)), ((1, 7, 16), (3, 1, 16)),
                             ((2, 2, 6, 16), (4, 6, 5, 16)), ((4, 8, 24), (4, 8, 24))):
        c.append(_case(f"MUL_MAT-F32-activations-{_dims(a_shape)}-{_dims(b_shape)}", "MUL_MAT", mul_mat_activations,
                       a_shape=a_shape, b_shape=b_shape))

    # ADD and MUL, same shape and with broadcast (ggml_repeat), MUL also by an F32 weight
    for op in ("ADD", "MUL"):
        for a_shape, b_shape in (((7, 96), (7, 96)), ((7, 96), (96,)), ((3, 4, 40), (1, 40)),
                                 ((8, 40), (2, 40)), ((3, 4, 40), (4, 1)), ((2, 3, 4, 8), (3, 1, 8))):
            c.append(_case(f"{op}-{_dims(a_shape)}-{_dims(b_shape)}", op, binary, op=op, a_shape=a_shape,
                           b_shape=b_shape))
    c.append(_case("MUL-5x4x64-weight64", "MUL", binary, op="MUL", a_shape=(5, 4, 64), b_shape=(64,), b_weight=True))

    for shape, s in (((7, 96), 2.5), ((3, 4, 16), -0.125), ((1, 640), 25.298221)):
        c.append(_case(f"SCALE-{_dims(shape)}-{s:g}", "SCALE", scale, shape=shape, s=s))

    for op in UNARY_OPS:
        for shape in ((7, 96), (2, 3, 33)):
            c.append(_case(f"UNARY-{op}-{_dims(shape)}", "UNARY", unary, op=op, shape=shape))
    for op in GLU_OPS:
        for shape in ((1, 256), (7, 96)):
            c.append(_case(f"GLU-{op}-{_dims(shape)}", "GLU", glu, op=op, shape=shape))
    c.append(_case("UNARY-gelu-7x96-tanh-approximation", "UNARY", unary, op="gelu", shape=(7, 96), tail=True))
    c.append(_case("GLU-geglu-7x96-tanh-approximation", "GLU", glu, op="geglu", shape=(7, 96), tail=True))

    for shape, eps in (((1, 640), 1e-6), ((7, 576), 1e-5), ((5, 4, 64), 1e-6), ((3, 32), 1e-2)):
        c.append(_case(f"RMS_NORM-{_dims(shape)}-eps{eps:g}", "RMS_NORM", rms_norm, shape=shape, eps=eps))
    c.append(_case("RMS_NORM-2x64-small-values", "RMS_NORM", rms_norm, shape=(2, 64), eps=1e-6, spread=1e-3))
    c.append(_case("RMS_NORM+MUL-5x4x64-norm", "RMS_NORM", norm, shape=(5, 4, 64), eps=1e-6))

    for shape, masked, s in (((4, 5, 9), True, 0.7), ((4, 11), False, 1.3), ((2, 1, 12), True, 0.125),
                             ((3, 7, 7), True, 1.0)):
        kind = "mask" if masked else "nomask"
        c.append(_case(f"SOFT_MAX-{_dims(shape)}-{kind}-scale{s:g}", "SOFT_MAX", soft_max, shape=shape,
                       masked=masked, s=s))
    for shape in ((3, 1000), (1, 49152), (2, 5, 64)):
        c.append(_case(f"ARGMAX-{_dims(shape)}", "ARGMAX", argmax, shape=shape))
    c.append(_case("ARGMAX-2x20000-tie", "ARGMAX", argmax, shape=(2, 20000), tie=True))
    c.append(_case("ARGMAX-3x20000-nan", "ARGMAX", argmax, shape=(3, 20000), not_finite=float("nan")))
    c.append(_case("ARGMAX-3x300-inf", "ARGMAX", argmax, shape=(3, 300), not_finite=float("inf")))
    c.append(_case("SOFT_MAX-4x1024-large-inputs", "SOFT_MAX", soft_max, shape=(4, 1024), masked=False, s=1.0,
                   spread=10.0))
    # scores far beyond exp()'s float32 range (e^89 overflows): only a softmax that subtracts the row
    # maximum first (as ggml's every backend) stays finite
    c.append(_case("SOFT_MAX-3x5x16-mask-huge-scores", "SOFT_MAX", soft_max, shape=(3, 5, 16), masked=True, s=1.0,
                   spread=300.0))

    # FLASH_ATTN_EXT: GQA ratios, decode and prefill, head sizes of both models, sliding window
    for t, n_kv, h, hkv, d in ((1, 17, 4, 1, 64), (7, 7, 4, 1, 64), (5, 12, 8, 2, 32), (3, 10, 4, 4, 16),
                               (1, 40, 4, 1, 256), (6, 20, 9, 3, 64)):
        c.append(_case(f"FLASH_ATTN_EXT-T{t}-KV{n_kv}-H{h}-Hkv{hkv}-D{d}", "FLASH_ATTN_EXT", flash_attn,
                       t=t, n_kv=n_kv, h=h, hkv=hkv, d=d))
    c.append(_case("FLASH_ATTN_EXT-T4-KV16-H4-Hkv2-D32-unwritten-rows", "FLASH_ATTN_EXT", flash_attn,
                   t=4, n_kv=16, h=4, hkv=2, d=32, n_past=6))
    c.append(_case("FLASH_ATTN_EXT-T6-KV14-H4-Hkv1-D32-window4", "FLASH_ATTN_EXT", flash_attn,
                   t=6, n_kv=14, h=4, hkv=1, d=32, window=4))
    c.append(_case("FLASH_ATTN_EXT-T3-KV8-H4-Hkv2-D16-nomask", "FLASH_ATTN_EXT", flash_attn,
                   t=3, n_kv=8, h=4, hkv=2, d=16, masked=False))

    # ROPE: both modes, on all of D and on part of it, the bases of both models, frequency scaling
    for mode in ROPE_MODES:
        for t, h, d, n_dims, base, fs in ((5, 3, 64, 64, 10000.0, 1.0), (5, 3, 64, 32, 10000.0, 1.0),
                                          (1, 4, 256, 256, 1000000.0, 1.0), (7, 2, 16, 8, 500.0, 0.25)):
            c.append(_case(f"ROPE-{mode}-T{t}-H{h}-D{d}-ndims{n_dims}-base{base:g}-fs{fs:g}", "ROPE", rope,
                           t=t, h=h, d=d, n_dims=n_dims, mode=mode, base=base, freq_scale=fs))

    # SET_ROWS into a CACHE leaf, then a VIEW of it; and the whole attention step of the models
    c.append(_case("SET_ROWS+VIEW-ctx16-Hkv2-D8-T3-KV8", "SET_ROWS", set_rows_view, n_ctx=16, hkv=2, d=8, t=3, n_kv=8))
    c.append(_case("SET_ROWS+VIEW-ctx32-Hkv1-D64-T1-KV20", "SET_ROWS", set_rows_view, n_ctx=32, hkv=1, d=64, t=1,
                   n_kv=20))
    c.append(_case("SET_ROWS+VIEW-ctx12-Hkv2-D4-T5-KV12-scattered", "SET_ROWS", set_rows_view, n_ctx=12, hkv=2,
                   d=4, t=5, n_kv=12, contiguous_rows=False))
    c.append(_case("SET_ROWS+FLASH_ATTN_EXT-ctx32-T4-past5-H4-Hkv2-D16", "SET_ROWS", kv_attention, n_ctx=32, t=4,
                   n_past=5, h=4, hkv=2, d=16))
    c.append(_case("SET_ROWS+FLASH_ATTN_EXT-ctx64-T1-past20-H3-Hkv1-D64", "SET_ROWS", kv_attention, n_ctx=64, t=1,
                   n_past=20, h=3, hkv=1, d=64))

    # VIEW, RESHAPE, PERMUTE (TRANSPOSE), CONT
    c.append(_case("VIEW+RESHAPE+PERMUTE+CONT-chain-2x3x4", "VIEW", views_chain, shape=(2, 3, 4)))
    c.append(_case("PERMUTE+CONT-5x4x8-102", "PERMUTE", permute_cont, shape=(5, 4, 8), axes=(1, 0, 2)))
    c.append(_case("PERMUTE+CONT-2x3x4x5-3120-of-input", "PERMUTE", permute_cont, shape=(2, 3, 4, 5),
                   axes=(3, 1, 2, 0), computed=False))
    c.append(_case("PERMUTE+CONT-6x10-transpose", "PERMUTE", permute_cont, shape=(6, 10), axes=(1, 0)))
    c.append(_case("VIEW+CONT-4x6-view2x5-at7", "VIEW", view_cont, shape=(4, 6), view_shape=(2, 5), offset=7))
    c.append(_case("RESHAPE+CONT-6x4-to-3x8", "RESHAPE", reshape_cont, shape=(6, 4), new_shape=(3, 8)))
    c.append(_case("CONT-of-a-contiguous-3x7", "CONT", permute_cont, shape=(3, 7), axes=(0, 1)))
    c += decode_cases()
    return c + linear_attention_cases()


def decode_cases() -> list[Case]:
    """Whole decode steps of small llama and gemma3 models (decode_layers): a backend that fuses the
    nodes of a layer into fewer kernels is checked on every output, the caches included."""
    llama = (Q.Q4_1, Q.Q4_1, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q4_1, Q.Q8_0)
    gemma = (Q.Q5_0, Q.Q4_K, Q.Q6_K, Q.Q4_K, Q.Q5_0, Q.Q8_0, Q.Q6_K, Q.Q8_0)
    return [
        _case("DECODE-llama-2-layers-E256-H4-Hkv2-D64-past70", "FLASH_ATTN_EXT", decode_layers, arch="llama", layers=2,
              n_embd=256, h=4, hkv=2, d=64, n_ff=512, n_ctx=160, n_past=70, n_kv=128, qtypes=llama),
        _case("DECODE-gemma3-2-layers-E256-H2-Hkv1-D128-past100", "FLASH_ATTN_EXT", decode_layers, arch="gemma3",
              layers=2, n_embd=256, h=2, hkv=1, d=128, n_ff=512, n_ctx=256, n_past=100, n_kv=256, qtypes=gemma),
        _case("DECODE-llama-1-layer-E128-H8-Hkv8-D16-past3", "FLASH_ATTN_EXT", decode_layers, arch="llama", layers=1,
              n_embd=128, h=8, hkv=8, d=16, n_ff=96, n_ctx=16, n_past=3, n_kv=8, qtypes=(Q.Q8_0,) * 8),
    ] + [_case(f"DECODE-add+norm+MUL_MAT-{q.name}-w72x512", "MUL_MAT", decode_norm_product, qtype=q, n=72, k=512)
         for q in (Q.Q4_1, Q.Q6_K)]


# -- the random-shapes sweep --------------------------------------------------------------------------
SWEEP_PER_OP = 4


def _divisor(rng, n: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return int(rng.choice(divisors))


def _width(rng, qtype: Q, max_blocks: int) -> int:
    per_block = block_elements(qtype)
    if per_block == 1:
        return int(rng.integers(1, 200))
    return per_block * int(rng.integers(1, max_blocks + 1))


def _sweep_one(rng: np.random.Generator, op: str, i: int) -> Case:
    def ri(lo: int, hi: int) -> int:                          # inclusive of hi
        return int(rng.integers(lo, hi + 1))

    all_types = WEIGHT_TYPES + EXTRA_WEIGHT_TYPES
    tag = f"sweep{i}"
    if op == "GET_ROWS":
        q = all_types[ri(0, len(all_types) - 1)]
        n_rows, width, n_out = ri(1, 40), _width(rng, q, 3), ri(1, 12)
        return _case(f"GET_ROWS-{tag}-{q.name}-{n_out}of{n_rows}x{width}", op, get_rows_weight, qtype=q,
                     n_rows=n_rows, width=width, n_out=n_out)
    if op == "MUL_MAT":
        q = all_types[ri(0, len(all_types) - 1)]
        n, k, m = ri(1, 70), _width(rng, q, 3 if block_elements(q) == 256 else 12), (1 if ri(0, 2) == 0 else ri(2, 20))
        return _case(f"MUL_MAT-{tag}-{q.name}-w{n}x{k}-x{m}x{k}", op, mul_mat_weight, qtype=q, n=n, k=k, m=m)
    if op == "MUL_MAT-activations":
        nb = ri(0, 2)
        b_batch = tuple(ri(1, 4) for _ in range(nb))
        a_batch = tuple(_divisor(rng, d) for d in b_batch[len(b_batch) - ri(0, nb):]) if nb else ()
        k, m, n = ri(1, 40), ri(1, 9), ri(1, 9)
        a_shape, b_shape = a_batch + (n, k), b_batch + (m, k)
        return _case(f"MUL_MAT-{tag}-F32-activations-{_dims(a_shape)}-{_dims(b_shape)}", "MUL_MAT",
                     mul_mat_activations, a_shape=a_shape, b_shape=b_shape)
    if op in ("ADD", "MUL"):
        a_shape = tuple(ri(1, 12) for _ in range(ri(1, 4)))
        b_shape = tuple(_divisor(rng, d) for d in a_shape)[ri(0, len(a_shape) - 1):]
        return _case(f"{op}-{tag}-{_dims(a_shape)}-{_dims(b_shape)}", op, binary, op=op, a_shape=a_shape,
                     b_shape=b_shape)
    shape = tuple(ri(1, 6) for _ in range(ri(0, 2))) + (ri(1, 300),)
    if op == "SCALE":
        s = float(np.float32(rng.uniform(-4, 4)))
        return _case(f"SCALE-{tag}-{_dims(shape)}-{s:.4g}", op, scale, shape=shape, s=s)
    if op == "UNARY":
        kind = UNARY_OPS[ri(0, len(UNARY_OPS) - 1)]
        return _case(f"UNARY-{tag}-{kind}-{_dims(shape)}", op, unary, op=kind, shape=shape)
    if op == "GLU":
        kind = GLU_OPS[ri(0, len(GLU_OPS) - 1)]
        return _case(f"GLU-{tag}-{kind}-{_dims(shape)}", op, glu, op=kind, shape=shape)
    if op == "RMS_NORM":
        eps = (1e-6, 1e-5, 1e-2)[ri(0, 2)]
        return _case(f"RMS_NORM-{tag}-{_dims(shape)}-eps{eps:g}", op, rms_norm, shape=shape, eps=eps)
    if op == "SOFT_MAX":
        t = ri(1, 9)
        sm_shape = tuple(ri(1, 5) for _ in range(ri(0, 2))) + (t, t + ri(0, 40))
        masked, s = bool(ri(0, 3)), float(np.float32(rng.uniform(0.05, 2.0)))
        kind = "mask" if masked else "nomask"
        return _case(f"SOFT_MAX-{tag}-{_dims(sm_shape)}-{kind}-scale{s:.3g}", op, soft_max, shape=sm_shape,
                     masked=masked, s=s)
    if op == "FLASH_ATTN_EXT":
        t, hkv, group, d = ri(1, 8), ri(1, 3), ri(1, 4), (16, 32, 64, 80, 128, 256)[ri(0, 5)]
        n_kv = t + ri(0, 30)
        return _case(f"FLASH_ATTN_EXT-{tag}-T{t}-KV{n_kv}-H{hkv * group}-Hkv{hkv}-D{d}", op, flash_attn,
                     t=t, n_kv=n_kv, h=hkv * group, hkv=hkv, d=d)
    if op == "ROPE":
        t, h, d = ri(1, 8), ri(1, 4), 2 * ri(1, 64)
        n_dims, mode = 2 * ri(1, d // 2), ROPE_MODES[ri(0, len(ROPE_MODES) - 1)]
        base, fs = (10000.0, 1000000.0, 500.0)[ri(0, 2)], (1.0, 0.5, 0.25)[ri(0, 2)]
        return _case(f"ROPE-{tag}-{mode}-T{t}-H{h}-D{d}-ndims{n_dims}-base{base:g}-fs{fs:g}", op, rope,
                     t=t, h=h, d=d, n_dims=n_dims, mode=mode, base=base, freq_scale=fs)
    if op == "SET_ROWS":
        n_ctx, hkv, d = ri(2, 40), ri(1, 3), ri(1, 64)
        n_kv = ri(1, n_ctx)
        t = ri(1, n_kv)
        scattered = bool(ri(0, 1))
        return _case(f"SET_ROWS+VIEW-{tag}-ctx{n_ctx}-Hkv{hkv}-D{d}-T{t}-KV{n_kv}{'-scattered' * scattered}", op,
                     set_rows_view, n_ctx=n_ctx, hkv=hkv, d=d, t=t, n_kv=n_kv, contiguous_rows=not scattered)
    if op == "PERMUTE":
        p_shape = tuple(ri(1, 9) for _ in range(ri(2, 4)))
        axes = tuple(int(a) for a in rng.permutation(len(p_shape)))
        computed = bool(ri(0, 1))
        return _case(f"PERMUTE+CONT-{tag}-{_dims(p_shape)}-{''.join(map(str, axes))}{'' if computed else '-of-input'}",
                     op, permute_cont, shape=p_shape, axes=axes, computed=computed)
    if op == "VIEW":
        v_shape = tuple(ri(1, 9) for _ in range(ri(1, 3)))
        total = math.prod(v_shape) + ri(0, 50)
        a_shape = (total,) if ri(0, 1) else (1, total)
        offset = ri(0, total - math.prod(v_shape))
        return _case(f"VIEW+CONT-{tag}-{_dims(a_shape)}-view{_dims(v_shape)}-at{offset}", op, view_cont,
                     shape=a_shape, view_shape=v_shape, offset=offset)
    if op == "RESHAPE":
        r_shape = tuple(ri(1, 9) for _ in range(ri(1, 3)))
        n = math.prod(r_shape)
        first = _divisor(rng, n)
        new_shape = (first, n // first)
        return _case(f"RESHAPE+CONT-{tag}-{_dims(r_shape)}-to-{_dims(new_shape)}", op, reshape_cont,
                     shape=r_shape, new_shape=new_shape)
    raise AssertionError(op)


SWEEP_OPS = ("GET_ROWS", "MUL_MAT", "MUL_MAT-activations", "ADD", "MUL", "SCALE", "UNARY", "GLU", "RMS_NORM",
             "SOFT_MAX", "FLASH_ATTN_EXT", "ROPE", "SET_ROWS", "PERMUTE", "VIEW", "RESHAPE")


def sweep_cases(per_op: int = SWEEP_PER_OP) -> list[Case]:
    """Random shapes (and weight types, modes, parameters) for every op, from a seeded Generator."""
    rng = np.random.default_rng([SEED, zlib.crc32(b"sweep")])
    return [_sweep_one(rng, op, i) for op in SWEEP_OPS for i in range(per_op)]


def all_cases() -> list[Case]:
    cases = fixed_cases() + sweep_cases()
    ids = [c.id for c in cases]
    duplicates = {i for i in ids if ids.count(i) > 1}
    if duplicates:
        raise AssertionError(f"duplicate case ids: {sorted(duplicates)}")
    return cases


def ops_of(cases: list[Case]) -> set[str]:
    """Every op that appears in some case's graph (views included)."""
    return {n.op for c in cases for n in c.build().graph.nodes}
