"""The gemma3 architecture (Gemma 3 270M), after llama.cpp's src/models/gemma3.cpp.

Sliding-window attention on five of every six layers (their own rope base, 10000),
per-head RMS norm of Q and K, GeGLU, embeddings scaled by sqrt(n_embd), and norms
after attention and after the feed-forward block. Output weights are tied to the
token embedding.
"""

from __future__ import annotations

import math

from ...core.graph import GraphBuilder, Tensor
from .base import Architecture, KVCache, StepInputs
from .gemma_block import post_norm_tail

LAYER_WEIGHTS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
                 "post_attention_norm", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm")


class Gemma3(Architecture):
    name = "gemma3"
    layer_weights = LAYER_WEIGHTS
    rope_mode = "neox"
    swa_pattern = 6             # layers 5, 11, 17, ... are global
    rope_base_swa = 10000.0     # llama.cpp's rope_freq_base_train_swa for gemma3

    def build(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, n_layers: int | None = None) -> Tensor:
        hp = self.hp
        n_tokens = inp.tokens.shape[0]
        x = b.get_rows(self.weight("token_embd.weight"), inp.tokens, name="inp_embd")
        x = b.scale(x, math.sqrt(hp.n_embd), name="inp_scaled")
        for il in b.layers(n_layers or hp.n_layer):
            w = f"blk.{il}."
            base = hp.rope_base_swa if hp.swa_layers[il] else hp.rope_base
            cur = self.norm(b, x, w + "attn_norm.weight", f"attn_norm-{il}")
            q = b.mul_mat(self.weight(w + "attn_q.weight"), cur, name=f"Qcur-{il}")
            k = b.mul_mat(self.weight(w + "attn_k.weight"), cur, name=f"Kcur-{il}")
            v = b.mul_mat(self.weight(w + "attn_v.weight"), cur, name=f"Vcur-{il}")
            q = b.reshape(q, (n_tokens, hp.n_head, hp.head_dim), name=f"Qcur_3d-{il}")
            k = b.reshape(k, (n_tokens, hp.n_head_kv, hp.head_dim), name=f"Kcur_3d-{il}")
            v = b.reshape(v, (n_tokens, hp.n_head_kv, hp.head_dim), name=f"Vcur_3d-{il}")
            q = self.norm(b, q, w + "attn_q_norm.weight", f"Qcur_normed-{il}")
            k = self.norm(b, k, w + "attn_k_norm.weight", f"Kcur_normed-{il}")
            q = b.rope_ext(q, inp.pos, hp.n_rot, self.rope_mode, base, name=f"Qcur_rope-{il}")
            k = b.rope_ext(k, inp.pos, hp.n_rot, self.rope_mode, base, name=f"Kcur_rope-{il}")
            q = b.scale(q, 1.0 / math.sqrt(hp.head_dim), name=f"Qcur_scaled-{il}")
            att = self.attention(b, inp, cache, il, q, k, v, 1.0)
            x = post_norm_tail(self, b, il, att, x, ("sa_out", "l_out"))
        return self.logits(b, x, inp)
