"""The qwen3 architecture, after llama.cpp's src/models/qwen3.cpp: qwen2's layer without biases, with
an RMS norm of every Q and K head (attn_q_norm, attn_k_norm) before rope."""

from __future__ import annotations

from .qwen2 import Qwen2

LAYER_WEIGHTS = ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_output",
                 "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")


class Qwen3(Qwen2):
    name = "qwen3"
    layer_weights = LAYER_WEIGHTS
    layer_biases = ()
    qk_norm = True
