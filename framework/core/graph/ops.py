"""The op table: every op a graph may hold, in one place that the builder, the scheduler, every plugin
and the conformance suite read.

For each op: its sources and parameters (name, type, meaning), its kind (it computes a new tensor,
it is a view of its source's memory, or it writes into its source in place), its reference kernel
(reference.py, numpy in float32), the conformance threshold a device's result must meet (ggml's
normalised mean squared error, as test-backend-ops sets it) and its semantics in numpy order (shapes
outermost axis first: ggml's ``ne`` reversed). ``docs/ops.md`` is generated from this table::

    python -m framework.core.graph --markdown > docs/ops.md
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

import numpy as np

from . import reference as R


class Kind(str, Enum):
    """What an op does with memory."""

    COMPUTE = "compute"               # makes a new tensor from its sources
    VIEW = "view"                     # reinterprets its source's memory: costs nothing, runs where that memory is
    WRITES_SOURCE = "writes source"   # writes into its first source in place; the result aliases that source


@dataclass(frozen=True)
class Operand:
    name: str
    meaning: str
    optional: bool = False


@dataclass(frozen=True)
class Param:
    name: str
    type: str                                    # "float", "int", "str", "tuple[int, ...]"
    meaning: str
    choices: tuple[tuple[str, str], ...] = ()    # (value, meaning) where only these values exist

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(v for v, _ in self.choices)


@dataclass(frozen=True)
class OpSpec:
    name: str
    kind: Kind
    sources: tuple[Operand, ...]
    params: tuple[Param, ...]
    kernel: Callable
    semantics: str
    nmse: float = 1e-7                # ggml's default threshold (test-backend-ops' max_nmse_err)
    nmse_why: str = ""

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)


class UnknownOpError(KeyError):
    """An op name the table does not hold."""

    def __str__(self) -> str:
        return self.args[0]


NMSE_DEFAULT = 1e-7
NMSE_MATMUL = 5e-4      # test_mul_mat::max_nmse_err: a backend may quantize activations (q8) or accumulate in f16

_SHAPE = Param("shape", "tuple[int, ...]", "the result's shape")
_AXES = Param("axes", "tuple[int, ...]", "result axis i is source axis axes[i] (numpy's transpose)")
_A = Operand("a", "the source")

_TABLE = (
    OpSpec("GET_ROWS", Kind.COMPUTE,
           (Operand("a", "(R, C), any dtype (a weight is read in its stored type)"),
            Operand("rows", "int32 (T,), row indices into a")),
           (), R.get_rows,
           "out[i] = a[rows[i]]: result (T, C), float32 (ggml_get_rows)."),
    OpSpec("MUL_MAT", Kind.COMPUTE,
           (Operand("a", "(..., N, K): the weight, in a projection"), Operand("b", "(..., M, K): the activations")),
           (), R.mul_mat,
           "out = b @ a^T: result (..., M, N), float32 (ggml_mul_mat(a, b); note the operand order). Both share "
           "the last axis K. a's batch axes tile b's: b's batch index i uses a's index i // (nb / na) on each "
           "axis, and a may have fewer axes than b.",
           NMSE_MATMUL, "ggml's test_mul_mat: a backend may quantize the activations (q8) or accumulate in f16"),
    OpSpec("ADD", Kind.COMPUTE, (Operand("a", "any shape"), Operand("b", "repeats to a's shape")), (), R.add,
           "out = a + b, result a's shape. b is repeated to a (ggml_can_repeat): b is padded with leading axes "
           "of 1, each axis of b divides a's, and a's index i on an axis reads b's index i % n (numpy "
           "broadcasting where b's axis is 1, whole tiles otherwise)."),
    OpSpec("MUL", Kind.COMPUTE, (Operand("a", "any shape"), Operand("b", "repeats to a's shape")), (), R.mul,
           "out = a * b, with b repeated to a's shape as in ADD (a norm's gain is a MUL by a (C,) weight)."),
    OpSpec("SCALE", Kind.COMPUTE, (_A,), (Param("scale", "float", "the factor"),), R.scale,
           "out = a * scale."),
    OpSpec("UNARY", Kind.COMPUTE, (_A,),
           (Param("op", "str", "the function, element by element",
                  (("gelu", "0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): the tanh approximation, as ggml_gelu"),
                   ("silu", "x / (1 + exp(-x))"),
                   ("tanh", "tanh(x)"),
                   ("sigmoid", "1 / (1 + exp(-x))"),
                   ("softplus", "log(1 + exp(x)), and x above 20 (ggml_vec_softplus_f32)"))),),
           R.unary, "out = op(a), element by element, float32."),
    OpSpec("GLU", Kind.COMPUTE,
           (Operand("gate", "any shape"), Operand("up", "the shape of gate")),
           (Param("op", "str", "the gated linear unit",
                  (("swiglu", "silu(gate) * up"), ("geglu", "gelu(gate) * up, gelu as UNARY's"))),),
           R.glu, "out = act(gate) * up, element by element (ggml_glu_split): the two halves come as two tensors."),
    OpSpec("RMS_NORM", Kind.COMPUTE, (_A,), (Param("eps", "float", "added to the mean square, inside the root"),),
           R.rms_norm,
           "out = a / sqrt(mean(a^2 over the last axis) + eps). eps is inside the square root; there is no "
           "gain (the model multiplies by its norm weight in a separate MUL)."),
    OpSpec("SOFT_MAX", Kind.COMPUTE,
           (Operand("a", "(..., T, S)"), Operand("mask", "(T, S) additive, 0 or -inf; broadcast over a's leading "
                                                 "axes", optional=True)),
           (Param("scale", "float", "multiplies a before the mask is added"),), R.soft_max,
           "out = softmax(a * scale + mask) over the last axis (ggml_soft_max_ext without ALiBi). A row that is "
           "-inf but for one entry gives 1 there.",
           1e-6, "ggml's test_soft_max (1e-6): exp() of another implementation over long rows drifts past 1e-7"),
    OpSpec("ARGMAX", Kind.COMPUTE, (Operand("a", "(..., N) float32"),), (), R.argmax,
           "out = the index of each row's largest value (the first of equal ones): result a's shape without its "
           "last axis, int32 (ggml_argmax). A row that holds a value that is not finite (NaN, an infinity) gives "
           "-1, so that logits gone wrong on a device are an error where the index is read, never a token. "
           "Greedy sampling on the device that made the logits: a step reads back an index, not the logits."),
    OpSpec("FLASH_ATTN_EXT", Kind.COMPUTE,
           (Operand("q", "(T, H, D)"), Operand("k", "(S, Hkv, D), H a multiple of Hkv"),
            Operand("v", "(S, Hkv, D)"), Operand("mask", "(T, S) additive, 0 or -inf", optional=True)),
           (Param("scale", "float", "multiplies q k^T before the mask is added (1 / sqrt(D) in the models)"),),
           R.flash_attn_ext,
           "For every query head h, out[:, h] = softmax(q[:, h] @ k[:, g]^T * scale + mask) @ v[:, g], with "
           "g = h // (H / Hkv) (grouped-query attention). Result (T, H, D). k and v come straight from the "
           "cache (a VIEW of its first S rows); ggml takes permuted operands, this layout saves the copies. "
           "Keys the mask hides for every query (-inf in every row) weigh exactly 0.",
           NMSE_MATMUL, "ggml's test_flash_attn_ext: two matrix products and a softmax, K and V often in f16"),
    OpSpec("ROPE", Kind.COMPUTE,
           (Operand("a", "(T, H, D)"), Operand("pos", "int32 (T,): the position of each row"),
            Operand("freq_factors", "float32 (n_dims/2,): divides pair i's frequency (ggml_rope_ext's third "
                                    "operand; Llama 3's rope_freqs.weight)", optional=True)),
           (Param("n_dims", "int", "leading dimensions of D that are rotated (even); the rest pass through"),
            Param("mode", "str", "which dimensions form the rotated pairs",
                  (("normal", "pairs (2i, 2i+1), interleaved (GGML_ROPE_TYPE_NORMAL, llama)"),
                   ("neox", "pairs (i, i + n_dims/2), the two halves (GGML_ROPE_TYPE_NEOX, gemma3)"))),
            Param("freq_base", "float", "the base of the frequencies (rope_freq_base, 10000 in llama)"),
            Param("freq_scale", "float", "multiplies every angle (1 / rope scaling factor)")),
           R.rope,
           "Pair i (of n_dims/2; see mode) of row t turns by theta = pos[t] * freq_scale * freq_base^(-2i / "
           "n_dims) / freq_factors[i] (1 without them): x0' = x0 cos - x1 sin, x1' = x0 sin + x1 cos. "
           "The angles are computed in float64 and "
           "rounded to float32 once (reference.rope_cos_sin, the one rope table). Dimensions past n_dims are "
           "copied."),
    OpSpec("SET_ROWS", Kind.WRITES_SOURCE,
           (Operand("dst", "(R, C): a pre-allocated tensor (a KV cache leaf)"),
            Operand("src", "T rows of C elements, any shape with T*C elements"),
            Operand("rows", "int32 (T,), destination rows")),
           (), R.set_rows,
           "dst[rows[i]] = row i of src, in place; the result is dst itself (ggml_set_rows). The plan always "
           "hands its result back, as a write to a persistent tensor."),
    OpSpec("VIEW", Kind.VIEW, (Operand("a", "a contiguous tensor"),),
           (_SHAPE, Param("offset", "int", "elements from the start of a")), R.view,
           "A contiguous window of a: its elements [offset, offset + prod(shape)) in a's row-major order, "
           "shaped shape."),
    OpSpec("RESHAPE", Kind.VIEW, (Operand("a", "a contiguous tensor"),), (_SHAPE,), R.reshape,
           "a's elements in row-major order, shaped shape (the same number of elements)."),
    OpSpec("PERMUTE", Kind.VIEW, (_A,), (_AXES,), R.permute,
           "a with its axes reordered: result axis i is a's axis axes[i] (numpy's transpose(axes)); the "
           "result is not contiguous unless axes is the identity."),
    OpSpec("TRANSPOSE", Kind.VIEW, (_A,), (_AXES,), R.permute,
           "PERMUTE by axes. The builder's transpose() emits a PERMUTE that swaps the last two axes; this name "
           "exists for graphs made elsewhere."),
    OpSpec("CONT", Kind.COMPUTE, (_A,), (), R.cont,
           "A contiguous copy of a (a permuted view made dense), same shape and dtype."),
    OpSpec("CONCAT", Kind.COMPUTE, (Operand("a", "any shape"), Operand("b", "a's shape but on axis")),
           (Param("axis", "int", "the numpy axis a and b are joined on (ggml_concat's dim is ndim - 1 - axis)"),),
           R.concat, "out = a then b along axis (numpy's concatenate)."),
    OpSpec("SSM_CONV", Kind.COMPUTE,
           (Operand("sx", "(S, C, K - 1 + T): each channel's last K - 1 inputs, then its T new ones"),
            Operand("c", "(C, K): each channel's kernel, float32")),
           (), R.ssm_conv,
           "A causal depthwise convolution (ggml_ssm_conv): out[s, t, ch] = sum_k sx[s, ch, t + k] * c[ch, k], "
           "result (S, T, C). The short convolution of Mamba and GatedDeltaNet layers."),
    OpSpec("GATED_DELTA_NET", Kind.COMPUTE,
           (Operand("q", "(T, Hk, S)"), Operand("k", "(T, Hk, S)"),
            Operand("v", "(T, H, S), H a multiple of Hk: value head h reads key head h % Hk"),
            Operand("g", "(T, H, 1) log-decay per head, or (T, H, S) per key element"),
            Operand("beta", "(T, H, 1): the write strength"),
            Operand("state", "(H, S, S): state[h, j, i] weighs key element i in value element j")),
           (), R.gated_delta_net,
           "Linear attention with the gated delta rule (ggml_gated_delta_net, one sequence, one state "
           "snapshot). Per token t and head h: state *= exp(g); d = (v - state k) * beta; state += d k^T; "
           "out = state q / sqrt(S). Result (T + S, H * S), float32: rows 0..T-1 are the outputs (T, H, S), "
           "the rest the final state (H, S, S), as ggml lays them out. The recurrence runs in float32; a "
           "backend may run it in chunks (ggml's chunked form), which reorders the sums.",
           1e-6, "a recurrence over T tokens accumulates rounding (ggml's test_gated_delta_net uses 1e-7 over "
                 "few tokens; the conformance cases run longer ones)"),
)

OPS: dict[str, OpSpec] = {s.name: s for s in _TABLE}

VIEW_OPS = frozenset(s.name for s in _TABLE if s.kind == Kind.VIEW)
UNARY_OPS = OPS["UNARY"].param("op").values
GLU_OPS = OPS["GLU"].param("op").values
ROPE_MODES = OPS["ROPE"].param("mode").values


def spec(op: str) -> OpSpec:
    """The table's entry for an op, or an error that lists every op (never a guess)."""
    try:
        return OPS[op]
    except KeyError:
        raise UnknownOpError(f"unknown op '{op}'; the op table (framework/core/graph/ops.py) holds "
                             f"{', '.join(OPS)}") from None


def kind(op: str) -> Kind | None:
    """The op's kind, or None for an op the table does not hold."""
    s = OPS.get(op)
    return s.kind if s else None


def is_view(op: str) -> bool:
    return kind(op) == Kind.VIEW


def writes_source(op: str) -> bool:
    return kind(op) == Kind.WRITES_SOURCE


def makes_memory(op: str) -> bool:
    """Whether the op's result is new memory (not a view, not its source written in place)."""
    return kind(op) not in (Kind.VIEW, Kind.WRITES_SOURCE)


def names(*ops: str) -> frozenset[str]:
    """A set of op names, each checked against the table (a plugin's list of the ops it implements)."""
    for op in ops:
        spec(op)
    return frozenset(ops)


def nmse_threshold(op: str) -> float:
    s = OPS.get(op)
    return s.nmse if s else NMSE_DEFAULT


def nmse(out, ref) -> float:
    """ggml's normalised mean squared error, sum((out - ref)^2) / sum(ref^2), in float64: the measure the
    thresholds above are for (the conformance suite and --verify compare with it)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = float(np.sum(ref * ref))
    num = float(np.sum((out - ref) ** 2))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def bind(node) -> Callable:
    """The reference kernel of a node with its parameters bound: call it with the sources' arrays."""
    s = spec(node.op)
    kwargs = {name: node.params[name] for name in s.param_names}
    return functools.partial(s.kernel, **kwargs) if kwargs else s.kernel


# -- docs/ops.md -------------------------------------------------------------------------------------------
def markdown() -> str:
    """docs/ops.md, generated from the table (tests/test_ops.py keeps the page in step)."""
    lines = ["# Ops", "",
             "<!-- generated by `python -m framework.core.graph --markdown > docs/ops.md`; do not edit -->", "",
             "Every op a graph may hold, from the table in `framework/core/graph/ops.py` that the builder, the",
             "scheduler, every plugin and the conformance suite read. Shapes are numpy order (outermost axis",
             "first: ggml's `ne` reversed); results are float32 unless said otherwise. A node's sources are",
             "`node.src` in the order listed, its parameters `node.params`. The reference kernel of each op is",
             "`framework.core.graph.reference.<name>` (numpy, float32); `ops.bind(node)` returns it with the",
             "node's parameters bound. The conformance suite compares a device's result with the reference by",
             "ggml's normalised mean squared error, sum((out - ref)^2) / sum(ref^2), against the threshold given.",
             "", "Kinds: **compute** makes a new tensor; **view** reinterprets its source's memory (it costs",
             "nothing and runs where that memory is); **writes source** writes into its first source in place",
             "and its result aliases it.", "",
             "| op | kind | sources | parameters | NMSE |", "| --- | --- | --- | --- | --- |"]
    for s in _TABLE:
        srcs = ", ".join(o.name + ("?" if o.optional else "") for o in s.sources)
        lines.append(f"| [{s.name}](#{s.name.lower()}) | {s.kind.value} | {srcs} | "
                     f"{', '.join(s.param_names) or '-'} | {_sci(s.nmse)} |")
    for s in _TABLE:
        lines += ["", f"## {s.name}", "", f"Kind: {s.kind.value}. Reference: `reference.{s.kernel.__name__}`. "
                  f"NMSE threshold: {_sci(s.nmse)}" + (f" ({s.nmse_why})." if s.nmse_why else "."), "", s.semantics, "",
                  "| source | meaning |", "| --- | --- |"]
        lines += [f"| `{o.name}`{' (optional)' if o.optional else ''} | {o.meaning} |" for o in s.sources]
        if s.params:
            lines += ["", "| parameter | type | meaning |", "| --- | --- | --- |"]
            for p in s.params:
                lines.append(f"| `{p.name}` | {p.type} | {p.meaning} |")
                lines += [f"| `{p.name}` = `\"{v}\"` | | {m} |" for v, m in p.choices]
    return "\n".join(lines) + "\n"



def _sci(x: float) -> str:
    mantissa, exponent = f"{x:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"
