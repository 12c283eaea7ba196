"""The qwen2 architecture (Qwen2, Qwen2.5), after llama.cpp's src/models/qwen2.cpp.

llama's layer with biases on the Q, K and V projections, NEOX rope, and an output matrix that is
either its own tensor or the token embedding (tied, as in Qwen2.5 0.5B).
"""

from __future__ import annotations

import math

from ...core.graph import GraphBuilder, Tensor
from .base import Architecture, KVCache, StepInputs

LAYER_WEIGHTS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down")


class Qwen2(Architecture):
    name = "qwen2"
    layer_weights = LAYER_WEIGHTS
    layer_biases = ("attn_q", "attn_k", "attn_v")
    rope_mode = "neox"
    qk_norm = False

    def build(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, n_layers: int | None = None) -> Tensor:
        hp = self.hp
        x = b.get_rows(self.weight("token_embd.weight"), inp.tokens, name="inp_embd")
        for il in b.layers(n_layers or hp.n_layer):
            cur = self.norm(b, x, f"blk.{il}.attn_norm.weight", f"attn_norm-{il}")
            att = self.self_attention(b, inp, cache, il, cur)
            x = b.add(att, x, name=f"ffn_inp-{il}")
            x = b.add(self.ffn(b, il, x), x, name=f"l_out-{il}")
        return self.logits(b, x, inp)

    def self_attention(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, il: int, cur: Tensor) -> Tensor:
        hp = self.hp
        w = f"blk.{il}."
        q, k, v = self.qkv(b, il, cur)
        if self.qk_norm:
            q = self.norm(b, q, w + "attn_q_norm.weight", f"Qcur_normed-{il}")
            k = self.norm(b, k, w + "attn_k_norm.weight", f"Kcur_normed-{il}")
        q = b.rope_ext(q, inp.pos, hp.n_rot, self.rope_mode, hp.rope_base, name=f"Qcur_rope-{il}")
        k = b.rope_ext(k, inp.pos, hp.n_rot, self.rope_mode, hp.rope_base, name=f"Kcur_rope-{il}")
        att = self.attention(b, inp, cache, il, q, k, v, 1.0 / math.sqrt(hp.head_dim))
        return self.linear(b, att, w + "attn_output", f"attn_out-{il}")
