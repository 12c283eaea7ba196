"""The llama architecture (SmolLM2), after llama.cpp's src/models/llama.cpp."""

from __future__ import annotations

import math

from ...core.graph import GraphBuilder, Tensor
from .base import Architecture, KVCache, StepInputs

LAYER_WEIGHTS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
                 "ffn_down")


class Llama(Architecture):
    name = "llama"
    layer_weights = LAYER_WEIGHTS
    rope_mode = "normal"

    def build(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, n_layers: int | None = None) -> Tensor:
        hp = self.hp
        n_tokens = inp.tokens.shape[0]
        x = b.get_rows(self.weight("token_embd.weight"), inp.tokens, name="inp_embd")
        for il in range(n_layers or hp.n_layer):
            w = f"blk.{il}."
            cur = self.norm(b, x, w + "attn_norm.weight", f"attn_norm-{il}")
            q = b.mul_mat(self.weight(w + "attn_q.weight"), cur, name=f"Qcur-{il}")
            k = b.mul_mat(self.weight(w + "attn_k.weight"), cur, name=f"Kcur-{il}")
            v = b.mul_mat(self.weight(w + "attn_v.weight"), cur, name=f"Vcur-{il}")
            q = b.reshape(q, (n_tokens, hp.n_head, hp.head_dim), name=f"Qcur_3d-{il}")
            k = b.reshape(k, (n_tokens, hp.n_head_kv, hp.head_dim), name=f"Kcur_3d-{il}")
            v = b.reshape(v, (n_tokens, hp.n_head_kv, hp.head_dim), name=f"Vcur_3d-{il}")
            q = b.rope_ext(q, inp.pos, hp.n_rot, self.rope_mode, hp.rope_base, name=f"Qcur_rope-{il}")
            k = b.rope_ext(k, inp.pos, hp.n_rot, self.rope_mode, hp.rope_base, name=f"Kcur_rope-{il}")
            att = self.attention(b, inp, cache, il, q, k, v, 1.0 / math.sqrt(hp.head_dim))
            att = b.mul_mat(self.weight(w + "attn_output.weight"), att, name=f"attn_out-{il}")
            x = b.add(att, x, name=f"ffn_inp-{il}")
            cur = self.norm(b, x, w + "ffn_norm.weight", f"ffn_norm-{il}")
            gate = b.mul_mat(self.weight(w + "ffn_gate.weight"), cur, name=f"ffn_gate-{il}")
            up = b.mul_mat(self.weight(w + "ffn_up.weight"), cur, name=f"ffn_up-{il}")
            cur = b.glu(gate, up, "swiglu", name=f"ffn_swiglu-{il}")
            cur = b.mul_mat(self.weight(w + "ffn_down.weight"), cur, name=f"ffn_out-{il}")
            x = b.add(cur, x, name=f"l_out-{il}")
        return self.logits(b, x, inp)
