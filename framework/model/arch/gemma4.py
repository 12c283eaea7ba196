"""The gemma4 architecture and its MTP assistant (gemma4-assistant), after llama.cpp's src/models/gemma4.cpp,
src/models/gemma4-assistant.cpp and the KV cache sharing of src/llama-model.cpp and src/llama-kv-cache.cpp.

gemma4: every layer is sliding-window or full attention as the file's attention.sliding_window_pattern
says, with its own head size (attention.key_length for full layers, key_length_swa for sliding ones), KV
head count (head_count_kv may be per layer) and rotary width (rope.dimension_count, _swa). Q and K are
RMS-normed per head with a gain, V without one; when a layer has no attn_v, V is K's projection. Full
layers turn with rope_freqs.weight as frequency factors (Gemma 4's "proportional" rope: a huge factor
stops the pairs that do not rotate), sliding ones at rope.freq_base_swa. Attention is not scaled (1.0).
The last attention.shared_kv_layers layers have no K and V of their own: they read the cache of the last
layer of their kind that has one (llama.cpp's reuse callback: n_layer_kv_from_start - 2 for a sliding
layer, - 1 for a full one). Each block: norm, attention, post-attention norm, residual; norm, GeGLU,
post-feed-forward norm, residual; then, when the file has them, the per-layer embeddings (E2B, E4B:
per_layer_token_embd rows plus a projection of the embedded input, gated into every layer) and the
layer's output scale. The head may be soft-capped (final_logit_softcapping). Mixture-of-experts layers
(ffn_gate_inp) are refused.

gemma4-assistant: the MTP draft. Its input is the target's token embedding (scaled by the target's
sqrt(n_embd)) of the last token, concatenated with the target's hidden state after its output norm
(llama.cpp's h_nextn), projected to the assistant's width (nextn.pre_projection). Its layers have Q only:
each reads the target's K and V of target layer n_layer - 2 (sliding) or n_layer - 1 (full), through the
target's own reuse map, and writes nothing. Its own token embedding is its output head, and
nextn.post_projection maps its normed hidden state back to the target's width for the next draft step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ...core.graph import F32, GraphBuilder, LeafKind, Tensor, leaf
from ..hparams import MAX_DIM, MAX_LAYERS, HParams, MetadataError
from ..metadata import get_float, get_int, get_list, get_str
from .base import Architecture, KVCache, SpeculationError, StepInputs
from .gemma_block import post_norm_tail


@dataclass(frozen=True)
class LayerShape:
    swa: bool
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_ff: int
    rope_base: float
    kv_from: int            # the layer whose K and V it attends over (itself when it has its own)

    @property
    def kv_width(self) -> int:
        return self.n_head_kv * self.head_dim


def _per_layer(meta: dict, key: str, n_layer: int, default: int | None = None, lo: int = 1) -> tuple[int, ...]:
    """A key that is one number for every layer or an array of one per layer (llama.cpp's get_key_or_arr),
    each a whole number from lo to MAX_DIM."""
    value = meta.get(key)
    if value is None:
        if default is None:
            raise MetadataError(f"metadata key '{key}' is missing; the architecture needs it")
        return (default,) * n_layer
    if isinstance(value, list):
        values = get_list(meta, key, "integers")
        if len(values) != n_layer:
            raise MetadataError(f"metadata key '{key}' has {len(values)} entries, the model has {n_layer} layers")
        bad = next((v for v in values if not lo <= v <= MAX_DIM), None)
        if bad is not None:
            raise MetadataError(f"metadata key '{key}' holds {bad}; expected integers from {lo} to {MAX_DIM}, one "
                                f"per layer")
        return tuple(values)
    return (get_int(meta, key, lo=lo, hi=MAX_DIM),) * n_layer


def read_layer_shapes(meta: dict, shared_kv: bool,
                      n_blocks: int | None = None) -> tuple[HParams, tuple[LayerShape, ...]]:
    """The hyper-parameters and every layer's shape, each key checked for its type and range where it is
    read (model/metadata.py); n_blocks: the layers whose tensors the file holds (block_count must match)."""
    arch = get_str(meta, "general.architecture")
    p = f"{arch}."
    n_layer = get_int(meta, p + "block_count", lo=1, hi=MAX_LAYERS)
    if n_blocks is not None and n_layer != n_blocks:
        raise MetadataError(f"metadata key '{p}block_count' says {n_layer} layers, but the file holds tensors for "
                            f"{n_blocks}")
    n_embd = get_int(meta, p + "embedding_length", lo=1, hi=MAX_DIM)
    pattern = meta.get(p + "attention.sliding_window_pattern")
    if not isinstance(pattern, list) or len(pattern) != n_layer or not set(map(type, pattern)) <= {bool, int}:
        raise MetadataError(f"metadata key '{p}attention.sliding_window_pattern' must list, for each of the "
                            f"{n_layer} layers, whether it uses the sliding window")
    swa = tuple(bool(x) for x in pattern)
    n_head = _per_layer(meta, p + "attention.head_count", n_layer)
    n_head_kv = _per_layer(meta, p + "attention.head_count_kv", n_layer, n_head[0])
    n_ff = _per_layer(meta, p + "feed_forward_length", n_layer)
    for il, (h, hkv) in enumerate(zip(n_head, n_head_kv)):
        if h % hkv:
            raise MetadataError(f"{arch}: layer {il} has {h} query heads, not a multiple of its {hkv} key/value heads")
    d_full = get_int(meta, p + "attention.key_length", n_embd // n_head[0] or 1, lo=1, hi=MAX_DIM)
    d_swa = get_int(meta, p + "attention.key_length_swa", d_full, lo=1, hi=MAX_DIM)
    for key, d in (("value_length", d_full), ("value_length_swa", d_swa)):
        if get_int(meta, p + f"attention.{key}", d, lo=1, hi=MAX_DIM) != d:
            raise MetadataError(f"{arch} needs attention.{key} equal to the key length ({d})")
    rot_full = get_int(meta, p + "rope.dimension_count", d_full, lo=2, hi=d_full)
    rot_swa = get_int(meta, p + "rope.dimension_count_swa", rot_full, lo=2, hi=d_swa)
    if rot_full % 2 or rot_swa % 2:
        raise MetadataError(f"{arch}: the rotary widths ({rot_full}, sliding {rot_swa}) must be even")
    base = get_float(meta, p + "rope.freq_base", 10000.0, above=0.0)
    base_swa = get_float(meta, p + "rope.freq_base_swa", 10000.0, above=0.0)
    n_shared = get_int(meta, p + "attention.shared_kv_layers", 0, lo=0, hi=n_layer) if shared_kv else 0
    kv_start = n_layer - n_shared
    if n_shared and kv_start < 2:
        raise MetadataError(f"{arch}: {n_shared} of {n_layer} layers share K and V, which leaves fewer than the two "
                            f"layers (one sliding, one full) they read from")
    layers = []
    for il in range(n_layer):
        src = il if il < kv_start else kv_start - (2 if swa[il] else 1)
        layers.append(LayerShape(swa[il], n_head[il], n_head_kv[il], d_swa if swa[il] else d_full,
                                 rot_swa if swa[il] else rot_full, n_ff[il], base_swa if swa[il] else base, src))
    for il, lay in enumerate(layers):
        src = layers[lay.kv_from]
        if (src.swa, src.head_dim, src.n_head_kv) != (lay.swa, lay.head_dim, lay.n_head_kv):
            raise MetadataError(f"{arch}: layer {il} reads the K and V of layer {lay.kv_from}, whose kind or shape "
                                f"differs (sliding {src.swa}/{lay.swa}, head size {src.head_dim}/{lay.head_dim}, "
                                f"kv heads {src.n_head_kv}/{lay.n_head_kv})")
    full = next((lay for lay in layers if not lay.swa), layers[0])
    if "tokenizer.ggml.tokens" in meta:
        n_vocab = len(get_list(meta, "tokenizer.ggml.tokens", "strings"))
    else:
        n_vocab = get_int(meta, p + "vocab_size", lo=1)
    hp = HParams(arch=arch, n_vocab=n_vocab, n_ctx_train=get_int(meta, p + "context_length", lo=1),
                 n_embd=n_embd, n_layer=n_layer,
                 n_ff=n_ff[0], n_head=n_head[0], n_head_kv=full.n_head_kv, head_dim=d_full,
                 rms_eps=get_float(meta, p + "attention.layer_norm_rms_epsilon", above=0.0, below=1.0),
                 rope_base=base, rope_base_swa=base_swa, n_rot=rot_full,
                 sliding_window=get_int(meta, p + "attention.sliding_window", lo=1) if any(swa) else 0,
                 swa_layers=swa)
    return hp, tuple(layers)


class Gemma4Cache(KVCache):
    """K and V of the layers that have their own (each of its own width); shared layers have none."""

    def __init__(self, layers: tuple[LayerShape, ...], n_ctx: int, scratch_rows: int = 0):
        self.n_ctx, self.scratch_rows = n_ctx, scratch_rows
        rows = n_ctx + scratch_rows
        own = [il for il, lay in enumerate(layers) if lay.kv_from == il]
        self.k = {il: leaf(f"cache_k_l{il}", F32, (rows, layers[il].kv_width), LeafKind.CACHE) for il in own}
        self.v = {il: leaf(f"cache_v_l{il}", F32, (rows, layers[il].kv_width), LeafKind.CACHE) for il in own}


class _Gemma4Base(Architecture):
    rope_mode = "neox"
    shared_kv = True

    @classmethod
    def read_hparams(cls, meta: dict, n_blocks: int | None = None) -> HParams:
        return read_layer_shapes(meta, cls.shared_kv, n_blocks)[0]

    def __init__(self, file, hparams):
        super().__init__(file, hparams)
        self.layers = read_layer_shapes(file.metadata, self.shared_kv)[1]
        if any(not lay.swa for lay in self.layers) and self.has_weight("rope_freqs.weight"):
            n = self.file.tensors["rope_freqs.weight"].shape[-1]
            full = next(lay for lay in self.layers if not lay.swa)
            if 2 * n != full.n_rot:
                raise MetadataError(f"rope_freqs.weight holds {n} factors, the full layers turn {full.n_rot} "
                                    f"dimensions ({full.n_rot // 2} pairs)")

    def weight_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """The shapes each layer's own sizes give its attention and feed-forward weights and norms."""
        shapes = super().weight_shapes()
        e = self.hp.n_embd
        for il, lay in enumerate(self.layers):
            w, d = f"blk.{il}.", lay.head_dim
            q, kv = lay.n_head * d, lay.n_head_kv * d
            heads = f"layer {il}: {lay.n_head} heads of {d}"
            shapes.update({w + "attn_q.weight": ((q, e), f"{heads}, n_embd"),
                           w + "attn_output.weight": ((e, q), f"n_embd, {heads}"),
                           w + "attn_q_norm.weight": ((d,), f"layer {il}'s head size"),
                           w + "attn_k.weight": ((kv, e), f"layer {il}: {lay.n_head_kv} kv heads of {d}, n_embd"),
                           w + "attn_v.weight": ((kv, e), f"layer {il}: {lay.n_head_kv} kv heads of {d}, n_embd"),
                           w + "attn_k_norm.weight": ((d,), f"layer {il}'s head size"),
                           w + "ffn_gate.weight": ((lay.n_ff, e), f"layer {il}'s n_ff {lay.n_ff}, n_embd"),
                           w + "ffn_up.weight": ((lay.n_ff, e), f"layer {il}'s n_ff {lay.n_ff}, n_embd"),
                           w + "ffn_down.weight": ((e, lay.n_ff), f"n_embd, layer {il}'s n_ff {lay.n_ff}")})
            shapes.update({w + n + ".weight": ((e,), "n_embd") for n in ("attn_norm", "post_attention_norm",
                                                                          "ffn_norm", "post_ffw_norm")})
        names = set(self.weight_names())
        return {k: v for k, v in shapes.items() if k in names}

    def query(self, b: GraphBuilder, inp: StepInputs, il: int, cur: Tensor) -> Tensor:
        """Q (T, H, D): projected, RMS-normed per head, turned."""
        lay, w = self.layers[il], f"blk.{il}."
        q = b.mul_mat(self.weight(w + "attn_q.weight"), cur, name=f"Qcur-{il}")
        q = b.reshape(q, (cur.shape[0], lay.n_head, lay.head_dim), name=f"Qcur_3d-{il}")
        q = self.norm(b, q, w + "attn_q_norm.weight", f"Qcur_normed-{il}")
        return self.rope(b, inp, il, q, f"Qcur_pos-{il}")

    def rope(self, b: GraphBuilder, inp: StepInputs, il: int, x: Tensor, name: str) -> Tensor:
        lay = self.layers[il]
        factors = None if lay.swa or not self.has_weight("rope_freqs.weight") else self.weight("rope_freqs.weight")
        return b.rope_ext(x, inp.pos, lay.n_rot, self.rope_mode, lay.rope_base, freq_factors=factors, name=name)

    def block_tail(self, b: GraphBuilder, il: int, att: Tensor, x: Tensor) -> Tensor:
        return post_norm_tail(self, b, il, att, x)

    def attend(self, b: GraphBuilder, inp: StepInputs, il: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        lay = self.layers[il]
        n_tokens = q.shape[0]
        out = b.flash_attn_ext(q, k, v, inp.mask_swa if lay.swa else inp.mask, 1.0, name=f"kqv-{il}")
        return b.reshape(out, (n_tokens, lay.n_head * lay.head_dim), name=f"kqv_merged-{il}")


class Gemma4(_Gemma4Base):
    name = "gemma4"

    def __init__(self, file, hparams):
        super().__init__(file, hparams)
        meta = file.metadata
        if self.has_weight("blk.0.ffn_gate_inp.weight") or get_int(meta, "gemma4.expert_count", 0, lo=0):
            raise MetadataError("gemma4 with mixture-of-experts layers (ffn_gate_inp; Gemma 4 26B A4B) is not "
                                "supported: this project has no expert-routing op")
        self.n_embd_per_layer = get_int(meta, "gemma4.embedding_length_per_layer_input", 0, lo=0, hi=MAX_DIM)
        self.softcap = get_float(meta, "gemma4.final_logit_softcapping", 0.0)      # 0: no soft cap
        if self.softcap < 0:
            raise MetadataError(f"metadata key 'gemma4.final_logit_softcapping' holds {self.softcap}; expected 0 (no "
                                f"cap) or a positive number")

    def weight_names(self) -> list[str]:
        names = ["token_embd.weight", "output_norm.weight"]
        names += ["output.weight"] if self.has_weight("output.weight") else []      # else tied to the embedding
        for il, lay in enumerate(self.layers):
            w = f"blk.{il}."
            names += [w + n + ".weight" for n in ("attn_norm", "attn_q", "attn_q_norm", "attn_output",
                                                  "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up",
                                                  "ffn_down", "post_ffw_norm")]
            if lay.kv_from == il:
                names += [w + "attn_k.weight", w + "attn_k_norm.weight"]
                # read where the file has them: V's own projection (else V is K's) and the output scale
                names += [w + "attn_v.weight"] if self.has_weight(w + "attn_v.weight") else []
            if self.has_weight(w + "layer_output_scale.weight"):
                names.append(w + "layer_output_scale.weight")
            if self.n_embd_per_layer:
                names += [w + "inp_gate.weight", w + "proj.weight", w + "post_norm.weight"]
        if any(not lay.swa for lay in self.layers):
            names.append("rope_freqs.weight")
        if self.n_embd_per_layer:
            names += ["per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight"]
        return names

    def make_cache(self, n_ctx: int, scratch_rows: int = 0) -> KVCache:
        return Gemma4Cache(self.layers, n_ctx, scratch_rows)

    def build(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, n_layers: int | None = None) -> Tensor:
        hp = self.hp
        x = b.get_rows(self.weight("token_embd.weight"), inp.tokens, name="inp_embd")
        x = b.scale(x, math.sqrt(hp.n_embd), name="inp_scaled")
        per_layer = self.per_layer_inputs(b, inp, x) if self.n_embd_per_layer else None
        written: dict[int, tuple[Tensor, Tensor]] = {}
        for il in range(n_layers or hp.n_layer):
            cur = self.norm(b, x, f"blk.{il}.attn_norm.weight", f"attn_norm-{il}")
            q = self.query(b, inp, il, cur)
            if self.layers[il].kv_from == il:
                written[il] = self.write_kv(b, inp, cache, il, cur)
            k, v = self.kv_views(b, inp, il, *written[self.layers[il].kv_from])
            cur = self.block_tail(b, il, self.attend(b, inp, il, q, k, v), x)
            if per_layer is not None:
                cur = self.per_layer_embedding(b, il, cur, per_layer)
            if self.has_weight(f"blk.{il}.layer_output_scale.weight"):
                cur = b.mul(cur, self.weight(f"blk.{il}.layer_output_scale.weight"), name=f"out_scaled-{il}")
            x = cur
        return self.logits(b, x, inp)

    def write_kv(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, il: int, cur: Tensor):
        """K and V of this layer (V is K's projection where the layer has no attn_v), normed, K turned,
        written into the cache; returns the written tensors."""
        lay, w, n_tokens = self.layers[il], f"blk.{il}.", cur.shape[0]
        k = b.mul_mat(self.weight(w + "attn_k.weight"), cur, name=f"Kcur-{il}")
        v = b.mul_mat(self.weight(w + "attn_v.weight"), cur, name=f"Vcur-{il}") if self.has_weight(
            w + "attn_v.weight") else k
        k = b.reshape(k, (n_tokens, lay.n_head_kv, lay.head_dim), name=f"Kcur_3d-{il}")
        v = b.reshape(v, (n_tokens, lay.n_head_kv, lay.head_dim), name=f"Vcur_3d-{il}")
        k = self.norm(b, k, w + "attn_k_norm.weight", f"Kcur_normed-{il}")
        v = b.rms_norm(v, self.hp.rms_eps, name=f"Vcur_normed-{il}")
        k = self.rope(b, inp, il, k, f"Kcur_pos-{il}")
        k_rows = b.reshape(k, (n_tokens, lay.kv_width), name=f"k_rows-{il}")
        v_rows = b.reshape(v, (n_tokens, lay.kv_width), name=f"v_rows-{il}")
        return (b.set_rows(cache.k[il], k_rows, inp.kv_rows, name=f"k_cache_write-{il}"),
                b.set_rows(cache.v[il], v_rows, inp.kv_rows, name=f"v_cache_write-{il}"))

    def kv_views(self, b: GraphBuilder, inp: StepInputs, il: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        lay, n_kv = self.layers[il], inp.mask.shape[1]
        return (b.view(k, (n_kv, lay.n_head_kv, lay.head_dim), name=f"k_cache_view-{il}"),
                b.view(v, (n_kv, lay.n_head_kv, lay.head_dim), name=f"v_cache_view-{il}"))

    def per_layer_inputs(self, b: GraphBuilder, inp: StepInputs, x: Tensor) -> Tensor:
        """(n_layer, T, P): each layer's per-layer embedding input (llama.cpp's build_inp_per_layer and
        project_per_layer_inputs)."""
        hp, n_pl, n_tokens = self.hp, self.n_embd_per_layer, x.shape[0]
        sel = b.get_rows(self.weight("per_layer_token_embd.weight"), inp.tokens, name="inp_per_layer_rows")
        sel = b.reshape(sel, (n_tokens, hp.n_layer, n_pl), name="inp_per_layer_3d")
        sel = b.scale(sel, math.sqrt(n_pl), name="inp_per_layer_selected")
        proj = b.mul_mat(self.weight("per_layer_model_proj.weight"), x, name="per_layer_proj_mm")
        proj = b.scale(proj, 1.0 / math.sqrt(hp.n_embd), name="per_layer_proj_scaled")
        proj = b.reshape(proj, (n_tokens, hp.n_layer, n_pl), name="per_layer_proj_3d")
        proj = self.norm(b, proj, "per_layer_proj_norm.weight", "per_layer_proj")
        out = b.scale(b.add(proj, sel, name="inp_per_layer_sum"), 1.0 / math.sqrt(2.0), name="inp_per_layer")
        return b.cont(b.permute(out, (1, 0, 2), name="inp_per_layer_by_layer"), name="inp_per_layer_cont")

    def per_layer_embedding(self, b: GraphBuilder, il: int, cur: Tensor, per_layer: Tensor) -> Tensor:
        n_tokens, n_pl, w = cur.shape[0], self.n_embd_per_layer, f"blk.{il}."
        here = b.view(per_layer, (n_tokens, n_pl), offset=il * n_tokens * n_pl, name=f"inp_per_layer-{il}")
        g = b.mul_mat(self.weight(w + "inp_gate.weight"), cur, name=f"per_layer_gate-{il}")
        g = b.mul(b.unary(g, "gelu", name=f"per_layer_gelu-{il}"), here, name=f"per_layer_gated-{il}")
        g = b.mul_mat(self.weight(w + "proj.weight"), g, name=f"per_layer_out-{il}")
        g = self.norm(b, g, w + "post_norm.weight", f"per_layer_embd_out-{il}")
        return b.add(cur, g, name=f"per_layer_residual-{il}")

    def logits(self, b: GraphBuilder, x: Tensor, inp: StepInputs) -> Tensor:
        out = super().logits(b, x, inp)
        if self.softcap:
            out = b.scale(out, 1.0 / self.softcap, name="result_capped_in")
            out = b.unary(out, "tanh", name="result_capped_tanh")
            out = b.scale(out, self.softcap, name="result_output_capped")
        return out


class Gemma4Assistant(_Gemma4Base):
    name = "gemma4-assistant"
    shared_kv = False           # its layers read the target's cache; it has none of its own

    def __init__(self, file, hparams):
        super().__init__(file, hparams)
        self.n_embd_backbone = get_int(file.metadata, f"{self.name}.embedding_length_out", lo=1, hi=MAX_DIM)
        if self.n_embd_backbone == hparams.n_embd:
            raise MetadataError(f"{self.name} needs embedding_length_out to hold the target's width, which differs "
                                f"from its own ({hparams.n_embd})")
        self.target = None

    def weight_names(self) -> list[str]:
        names = ["token_embd.weight", "output_norm.weight", "nextn.pre_projection.weight",
                 "nextn.post_projection.weight"]
        for il in range(self.hp.n_layer):
            names += [f"blk.{il}.{n}.weight" for n in ("attn_norm", "attn_q", "attn_q_norm", "attn_output",
                                                        "post_attention_norm", "layer_output_scale", "ffn_norm",
                                                        "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")]
        if any(not lay.swa for lay in self.layers):
            names.append("rope_freqs.weight")
        return names

    # -- the target it drafts for --------------------------------------------------------------
    def bind_target(self, target) -> None:
        """Check the target (a Model) fits, and keep it: its embedding, its cache's layout."""
        arch = target.arch
        if arch.name != "gemma4":
            raise SpeculationError(f"{self.file.path.name} ({self.name}) drafts for a gemma4 target, not "
                                   f"{target.name} ({arch.name})")
        if target.hp.n_embd != self.n_embd_backbone:
            raise SpeculationError(f"{self.file.path.name} expects a target {self.n_embd_backbone} wide "
                                   f"(embedding_length_out), {target.name} is {target.hp.n_embd}")
        self.target = target
        for il, src in enumerate(self.target_layers()):
            mine, theirs = self.layers[il], arch.layers[src]
            if (mine.swa, mine.head_dim) != (theirs.swa, theirs.head_dim) or mine.n_head % theirs.n_head_kv:
                raise SpeculationError(
                    f"{self.file.path.name} layer {il} (sliding {mine.swa}, {mine.n_head} heads of {mine.head_dim}) "
                    f"cannot read the cache of target layer {src} (sliding {theirs.swa}, {theirs.n_head_kv} kv heads "
                    f"of {theirs.head_dim})")

    def target_layers(self) -> list[int]:
        """The target layer whose cache each layer reads (llama.cpp's share callback, then the target's reuse)."""
        layers = self.target.arch.layers
        n = len(layers)
        return [layers[n - 2 if lay.swa else n - 1].kv_from for lay in self.layers]

    def borrowed_weights(self) -> list[Tensor]:
        return [self.target.arch.weight("token_embd.weight")]

    def tensor_bytes(self, t: Tensor):
        if any(t is w for w in self.borrowed_weights()):
            return self.target.weight_bytes(t)
        return super().tensor_bytes(t)

    # -- the graph ------------------------------------------------------------------------------
    def make_inputs(self, b: GraphBuilder, n_tokens: int, n_kv: int, n_out: int | None) -> StepInputs:
        inp = super().make_inputs(b, n_tokens, n_kv, n_out)
        inp.extra["inp_h"] = b.input("inp_h", F32, (n_tokens, self.n_embd_backbone))
        return inp

    def build(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, n_layers: int | None = None) -> Tensor:
        if self.target is None:
            raise ValueError(f"{self.file.path.name} ({self.name}) runs only as the draft of a gemma4 target "
                             f"(--draft), whose cache and embedding it reads")
        x = b.get_rows(self.borrowed_weights()[0], inp.tokens, name="inp_embd_target")
        x = b.scale(x, math.sqrt(self.n_embd_backbone), name="inp_embd_target_scaled")
        xh = b.concat(x, inp.extra["inp_h"], axis=-1, name="inp_xh")
        x = b.mul_mat(self.weight("nextn.pre_projection.weight"), xh, name="pre_proj")
        n_kv = inp.mask.shape[1]
        target = self.target.arch.layers
        for il, src in enumerate(self.target_layers()):
            cur = self.norm(b, x, f"blk.{il}.attn_norm.weight", f"attn_norm-{il}")
            q = self.query(b, inp, il, cur)
            shape = (n_kv, target[src].n_head_kv, target[src].head_dim)
            k = b.view(cache.k[src], shape, name=f"k_target_view-{il}")
            v = b.view(cache.v[src], shape, name=f"v_target_view-{il}")
            cur = self.block_tail(b, il, self.attend(b, inp, il, q, k, v), x)
            x = b.mul(cur, self.weight(f"blk.{il}.layer_output_scale.weight"), name=f"out_scaled-{il}")
        if inp.out_ids is not None:
            x = b.get_rows(x, inp.out_ids, name="out_rows")
        x = self.norm(b, x, "output_norm.weight", "result_norm")
        inp.hidden = b.mul_mat(self.weight("nextn.post_projection.weight"), x, name="h_nextn")
        return b.mul_mat(self.weight("token_embd.weight"), x, name="result_output")
