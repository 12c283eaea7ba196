"""What every architecture shares: weights as leaves, step inputs, the KV cache, attention."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...core.graph import F32, I32, GraphBuilder, LeafKind, Tensor, leaf
from ..gguf_file import ModelFile
from ..hparams import HParams, read_hparams


class WeightError(ValueError):
    """A tensor the architecture needs is missing from the file, or has another shape than the
    hyper-parameters give it."""


class MissingWeightError(WeightError):
    pass


class SpeculationError(ValueError):
    """Speculative decoding cannot be set up as asked (draft spec, vocabulary, architecture, state).
    Defined here, below the runtime, because a draft architecture raises it when bound to its target."""


@dataclass
class StepInputs:
    """The input leaves of one step's graph; the runtime fills their values before every step."""

    tokens: Tensor      # (T,) int32 token ids
    pos: Tensor         # (T,) int32 positions
    kv_rows: Tensor     # (T,) int32 cache rows the step's K and V are written to
    mask: Tensor        # (T, n_kv) float32, 0 or -inf: causal
    mask_swa: Tensor | None   # (T, n_kv) causal and within the sliding window
    out_ids: Tensor | None    # (n_out,) int32 rows whose logits are wanted; None: all
    extra: dict[str, Tensor] = field(default_factory=dict)   # an architecture's own inputs (recurrent state)
    hidden: Tensor | None = None   # set by build: the hidden rows the output head reads (an output on request)

    def all(self) -> list[Tensor]:
        fixed = [t for t in (self.tokens, self.pos, self.kv_rows, self.mask, self.mask_swa, self.out_ids) if t]
        return fixed + list(self.extra.values())


class KVCache:
    """Pre-allocated K and V tensors, one pair per attention layer (every layer unless `layers` says
    which), of n_ctx rows each, plus `scratch_rows` beyond them that padding tokens of fixed-shape steps
    write to and no query ever reads."""

    def __init__(self, hp: HParams, n_ctx: int, scratch_rows: int = 0, layers: list[int] | None = None):
        self.n_ctx, self.scratch_rows = n_ctx, scratch_rows
        rows = n_ctx + scratch_rows
        layers = list(range(hp.n_layer)) if layers is None else layers
        self.k = {il: leaf(f"cache_k_l{il}", F32, (rows, hp.kv_width), LeafKind.CACHE, il) for il in layers}
        self.v = {il: leaf(f"cache_v_l{il}", F32, (rows, hp.kv_width), LeafKind.CACHE, il) for il in layers}

    def tensors(self) -> list[Tensor]:
        return list(self.k.values()) + list(self.v.values())

    def states(self) -> list[tuple[Tensor, str]]:
        """Recurrent-state tensors and the op that reads each: none for a plain KV cache."""
        return []


class Architecture:
    """Subclasses set `name`, `rope_mode` and implement `build`."""

    name = ""
    rope_mode = "normal"
    recurrent = False           # keeps per-sequence state besides the KV cache (linear-attention layers)
    swa_pattern = 0
    rope_base_swa: float | None = None

    def __init__(self, file: ModelFile, hparams: HParams):
        self.file = file
        self.hp = hparams
        self._weights: dict[str, Tensor] = {}

    @classmethod
    def read_hparams(cls, meta: dict, n_blocks: int | None = None) -> HParams:
        """The hyper-parameters from the file's metadata (an architecture with per-layer shapes reads more);
        n_blocks: the layers whose tensors the file holds, which block_count must match."""
        return read_hparams(meta, cls.swa_pattern, cls.rope_base_swa, n_blocks)

    def tensor_bytes(self, t: Tensor) -> np.ndarray:
        """The file bytes of a weight leaf this architecture made (one it borrows from another model, its own)."""
        return self.file.tensor_bytes(t.name)

    def weight(self, name: str) -> Tensor:
        """The leaf for a tensor of the file (one Tensor object per name, shared by every graph)."""
        t = self._weights.get(name)
        if t is None:
            entry = self.file.tensors.get(name)
            if entry is None:
                raise MissingWeightError(f"tensor '{name}' is missing; the {self.name} architecture needs it")
            t = self._weights[name] = leaf(name, entry.dtype, entry.shape, LeafKind.WEIGHT)
        return t

    def has_weight(self, name: str) -> bool:
        return name in self.file.tensors

    def check_weights(self) -> list[str]:
        """Every tensor the graph will read is in the file with the shape the hyper-parameters give it
        (as llama.cpp checks when it loads), before any graph is built; returns the names of the file's
        tensors this architecture does not use (the caller reports them)."""
        shapes = self.weight_shapes()
        names = self.weight_names()
        for name in names:
            entry = self.file.tensors.get(name)
            want = shapes.get(name)
            if entry is None:
                need = f" with shape {list(want[0])} ({want[1]})" if want else ""
                raise MissingWeightError(f"tensor '{name}' is missing; the {self.name} architecture needs it{need}")
            if want is not None and tuple(entry.shape) != want[0]:
                raise WeightError(f"tensor '{name}' has shape {list(entry.shape)} ({entry.dtype.name}), but the "
                                  f"{self.name} architecture needs {list(want[0])} ({want[1]}; numpy order, ggml's "
                                  f"ne reversed) from the file's hyper-parameters")
            self.weight(name)
        return sorted(set(self.file.tensors) - set(names) - set(shapes))

    layer_weights: tuple[str, ...] = ()     # each layer's weights: blk.{il}.{name}.weight
    layer_biases: tuple[str, ...] = ()      # each layer's biases: blk.{il}.{name}.bias

    def weight_names(self) -> list[str]:
        return list(self.weight_shapes())

    def weight_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Every tensor the graph reads whose shape the hyper-parameters give: its shape (numpy order) and
        how. An architecture whose layers are not llama-style overrides it (qwen35)."""
        hp = self.hp
        shapes = {"token_embd.weight": ((hp.n_vocab, hp.n_embd), "n_vocab, n_embd"),
                  "output_norm.weight": ((hp.n_embd,), "n_embd")}
        if self.has_weight("output.weight"):        # else the output head is the token embedding
            shapes["output.weight"] = ((hp.n_vocab, hp.n_embd), "n_vocab, n_embd")
        layer = self.layer_shapes()
        for il in range(hp.n_layer):
            shapes.update({f"blk.{il}.{w}.weight": layer[w] for w in self.layer_weights})
            shapes.update({f"blk.{il}.{w}.bias": ((layer[w][0][0],), f"the rows of {w}.weight: {layer[w][1]}")
                           for w in self.layer_biases})
        return shapes

    def layer_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """One layer's weights by short name (attn_q, ffn_up, ...): shape and formula. The common ones
        of a llama-style block; an architecture adds its own."""
        hp = self.hp
        q, kv = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        e, ff = hp.n_embd, hp.n_ff
        return {
            "attn_norm": ((e,), "n_embd"), "ffn_norm": ((e,), "n_embd"),
            "attn_q": ((q, e), f"n_head*head_dim = {hp.n_head}*{hp.head_dim}, n_embd"),
            "attn_k": ((kv, e), f"n_head_kv*head_dim = {hp.n_head_kv}*{hp.head_dim}, n_embd"),
            "attn_v": ((kv, e), f"n_head_kv*head_dim = {hp.n_head_kv}*{hp.head_dim}, n_embd"),
            "attn_output": ((e, q), f"n_embd, n_head*head_dim = {hp.n_head}*{hp.head_dim}"),
            "ffn_gate": ((ff, e), "n_ff, n_embd"), "ffn_up": ((ff, e), "n_ff, n_embd"),
            "ffn_down": ((e, ff), "n_embd, n_ff"),
            "attn_q_norm": ((hp.head_dim,), "head_dim"), "attn_k_norm": ((hp.head_dim,), "head_dim"),
            "post_attention_norm": ((e,), "n_embd"), "post_ffw_norm": ((e,), "n_embd"),
        }

    def make_inputs(self, b: GraphBuilder, n_tokens: int, n_kv: int, n_out: int | None) -> StepInputs:
        swa = b.input("kq_mask_swa", F32, (n_tokens, n_kv)) if any(self.hp.swa_layers) else None
        return StepInputs(
            tokens=b.input("inp_tokens", I32, (n_tokens,)), pos=b.input("inp_pos", I32, (n_tokens,)),
            kv_rows=b.input("kv_rows", I32, (n_tokens,)), mask=b.input("kq_mask", F32, (n_tokens, n_kv)),
            mask_swa=swa, out_ids=None if n_out is None else b.input("inp_out_ids", I32, (n_out,)))

    def make_cache(self, n_ctx: int, scratch_rows: int = 0) -> KVCache:
        """The pre-allocated tensors a session keeps between steps."""
        return KVCache(self.hp, n_ctx, scratch_rows)

    def step_values(self, inp: StepInputs, n_real: int, n_past: int) -> dict[int, np.ndarray]:
        """Values of the architecture's own inputs (inp.extra) for a step of n_real tokens (the rest of
        the step's tokens are padding) after n_past tokens of the sequence."""
        return {}

    def build(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, n_layers: int | None = None) -> Tensor:
        """Append one step's nodes; return the logits tensor (n_out, n_vocab). n_layers: only the first
        n_layers layers, then the output head (a draft model made of the target's first layers)."""
        raise NotImplementedError

    # -- pieces shared by the architectures --------------------------------------------------
    def norm(self, b: GraphBuilder, x: Tensor, weight: str, name: str) -> Tensor:
        return b.mul(b.rms_norm(x, self.hp.rms_eps, name=f"{name}_rms"), self.weight(weight), name=name)

    def linear(self, b: GraphBuilder, x: Tensor, weight: str, name: str) -> Tensor:
        """x @ weight^T, plus weight's bias when the file has one (llama.cpp's build_qkv and build_ffn add
        every bias that is present)."""
        out = b.mul_mat(self.weight(weight + ".weight"), x, name=name)
        if self.has_weight(weight + ".bias"):
            out = b.add(out, self.weight(weight + ".bias"), name=f"{name}_biased")
        return out

    def qkv(self, b: GraphBuilder, il: int, cur: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """This layer's Q (T, H, D), K and V (T, Hkv, D)."""
        hp = self.hp
        n_tokens = cur.shape[0]
        w = f"blk.{il}."
        q = self.linear(b, cur, w + "attn_q", f"Qcur-{il}")
        k = self.linear(b, cur, w + "attn_k", f"Kcur-{il}")
        v = self.linear(b, cur, w + "attn_v", f"Vcur-{il}")
        q = b.reshape(q, (n_tokens, hp.n_head, hp.head_dim), name=f"Qcur_3d-{il}")
        k = b.reshape(k, (n_tokens, hp.n_head_kv, hp.head_dim), name=f"Kcur_3d-{il}")
        v = b.reshape(v, (n_tokens, hp.n_head_kv, hp.head_dim), name=f"Vcur_3d-{il}")
        return q, k, v

    def ffn(self, b: GraphBuilder, il: int, x: Tensor) -> Tensor:
        """RMS norm, then SwiGLU feed-forward (llama.cpp's LLM_FFN_SILU, LLM_FFN_PAR)."""
        w = f"blk.{il}."
        cur = self.norm(b, x, w + "ffn_norm.weight", f"ffn_norm-{il}")
        gate = self.linear(b, cur, w + "ffn_gate", f"ffn_gate-{il}")
        up = self.linear(b, cur, w + "ffn_up", f"ffn_up-{il}")
        cur = b.glu(gate, up, "swiglu", name=f"ffn_swiglu-{il}")
        return self.linear(b, cur, w + "ffn_down", f"ffn_out-{il}")

    def attention(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, il: int, q: Tensor, k: Tensor,
                  v: Tensor, scale: float) -> Tensor:
        """Write this step's K and V into the cache, attend over the cache, return (T, H*D)."""
        hp = self.hp
        n_tokens, n_kv = inp.mask.shape
        k_rows = b.reshape(k, (n_tokens, hp.kv_width), name=f"k_rows-{il}")
        v_rows = b.reshape(v, (n_tokens, hp.kv_width), name=f"v_rows-{il}")
        k_written = b.set_rows(cache.k[il], k_rows, inp.kv_rows, name=f"k_cache_write-{il}")
        v_written = b.set_rows(cache.v[il], v_rows, inp.kv_rows, name=f"v_cache_write-{il}")
        k_all = b.view(k_written, (n_kv, hp.n_head_kv, hp.head_dim), name=f"k_cache_view-{il}")
        v_all = b.view(v_written, (n_kv, hp.n_head_kv, hp.head_dim), name=f"v_cache_view-{il}")
        mask = inp.mask_swa if hp.swa_layers[il] else inp.mask
        out = b.flash_attn_ext(q, k_all, v_all, mask, scale, name=f"kqv-{il}")
        return b.reshape(out, (n_tokens, hp.n_head * hp.head_dim), name=f"kqv_merged-{il}")

    def logits(self, b: GraphBuilder, x: Tensor, inp: StepInputs) -> Tensor:
        if inp.out_ids is not None:
            x = b.get_rows(x, inp.out_ids, name="out_rows")
        x = inp.hidden = self.norm(b, x, "output_norm.weight", "result_norm")
        if not self.has_weight("output.weight"):        # tied to the token embedding
            return b.mul_mat(self.weight("token_embd.weight"), x, name="result_output")
        return self.linear(b, x, "output", "result_output")
