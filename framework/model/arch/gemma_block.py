"""The half of a Gemma layer after attention, as gemma3 and gemma4 share it (llama.cpp's gemma3.cpp and
gemma4.cpp): output projection, post-attention norm, residual; norm, GeGLU feed-forward, post-feed-forward
norm, residual. Both put a norm after each sub-block as well as before it, which the llama family does not."""

from __future__ import annotations

from ...core.graph import GraphBuilder, Tensor


def post_norm_tail(arch, b: GraphBuilder, il: int, att: Tensor, x: Tensor,
                   residuals: tuple[str, str] = ("attn_residual", "ffn_residual")) -> Tensor:
    """Layer il's output from its attention result `att` (T, heads * head size) and its input `x`;
    `residuals`: the names of the two residual sums (llama.cpp's for the architecture)."""
    w = f"blk.{il}."
    att = b.mul_mat(arch.weight(w + "attn_output.weight"), att, name=f"attn_out-{il}")
    att = arch.norm(b, att, w + "post_attention_norm.weight", f"attn_post_norm-{il}")
    attn_out = b.add(att, x, name=f"{residuals[0]}-{il}")
    cur = arch.norm(b, attn_out, w + "ffn_norm.weight", f"ffn_norm-{il}")
    gate = b.mul_mat(arch.weight(w + "ffn_gate.weight"), cur, name=f"ffn_gate-{il}")
    up = b.mul_mat(arch.weight(w + "ffn_up.weight"), cur, name=f"ffn_up-{il}")
    cur = b.glu(gate, up, "geglu", name=f"ffn_geglu-{il}")
    cur = b.mul_mat(arch.weight(w + "ffn_down.weight"), cur, name=f"ffn_out-{il}")
    cur = arch.norm(b, cur, w + "post_ffw_norm.weight", f"ffn_post_norm-{il}")
    return b.add(cur, attn_out, name=f"{residuals[1]}-{il}")
