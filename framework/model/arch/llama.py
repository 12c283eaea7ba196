"""The llama architecture (SmolLM2, Llama 3), after llama.cpp's src/models/llama.cpp.

Llama 3.1 and later carry rope frequency factors (rope_freqs.weight, one per rotary pair, the
"llama3" rope scaling computed by the converter); every layer's rope divides its frequencies by them.
"""

from __future__ import annotations

import math

from ...core.graph import GraphBuilder, Tensor
from .base import Architecture, KVCache, StepInputs

LAYER_WEIGHTS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down")
ROPE_FREQS = "rope_freqs.weight"


class Llama(Architecture):
    name = "llama"
    layer_weights = LAYER_WEIGHTS
    rope_mode = "normal"

    def weight_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        shapes = super().weight_shapes()
        if self.has_weight(ROPE_FREQS):
            shapes[ROPE_FREQS] = ((self.hp.n_rot // 2,), "n_rot / 2: one factor per rotary pair")
        return shapes

    def build(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, n_layers: int | None = None) -> Tensor:
        hp = self.hp
        x = b.get_rows(self.weight("token_embd.weight"), inp.tokens, name="inp_embd")
        factors = self.weight(ROPE_FREQS) if self.has_weight(ROPE_FREQS) else None
        for il in b.layers(n_layers or hp.n_layer):
            w = f"blk.{il}."
            cur = self.norm(b, x, w + "attn_norm.weight", f"attn_norm-{il}")
            q, k, v = self.qkv(b, il, cur)
            q = b.rope_ext(q, inp.pos, hp.n_rot, self.rope_mode, hp.rope_base, freq_factors=factors,
                           name=f"Qcur_rope-{il}")
            k = b.rope_ext(k, inp.pos, hp.n_rot, self.rope_mode, hp.rope_base, freq_factors=factors,
                           name=f"Kcur_rope-{il}")
            att = self.attention(b, inp, cache, il, q, k, v, 1.0 / math.sqrt(hp.head_dim))
            att = self.linear(b, att, w + "attn_output", f"attn_out-{il}")
            x = b.add(att, x, name=f"ffn_inp-{il}")
            x = b.add(self.ffn(b, il, x), x, name=f"l_out-{il}")
        return self.logits(b, x, inp)
