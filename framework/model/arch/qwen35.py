"""The qwen35 architecture (Qwen3.5's hybrid), after llama.cpp's src/models/qwen35.cpp and
delta-net-base.cpp.

Layers alternate, in llama.cpp's order (three linear-attention layers, then one full-attention layer,
unless the file lists them): every layer is RMS norm, its attention, a residual add, a post-attention
RMS norm, a SwiGLU feed-forward and a second residual add.

- Linear attention (GatedDeltaNet): one projection gives Q, K and V (attn_qkv), another the output gate
  z (attn_gate); a short causal convolution (SSM_CONV over the last ssm.conv_kernel inputs of every
  channel, then SiLU) mixes each channel over time; Q and K are L2-normalised per head; beta =
  sigmoid(ssm_beta x), and the log-decay g = softplus(ssm_alpha x + ssm_dt.bias) * ssm_a (ssm_a holds
  -exp(A_log)); GATED_DELTA_NET runs the recurrence from the layer's state; the output is RMS-normed per
  head (ssm_norm), multiplied by silu(z) and projected back (ssm_out).
- Full attention: Q and its gate come from one projection (each head's Q then its gate), Q and K are
  RMS-normed per head, rope is Qwen3.5's interleaved multi-section rope, and the attention's output is
  multiplied by sigmoid(gate) before attn_output.

State between steps, per linear layer, pre-allocated like the KV cache: the convolution's last
conv_kernel - 1 inputs (kept time-major, (conv_kernel - 1) x channels, so the rows to keep are read with
GET_ROWS) and the recurrence's state (heads x head size x head size). Each has two rows: row 0 stays
zero and is read by the first step of a sequence, row 1 holds the sequence's state (llama.cpp clears a
fresh sequence's cell the same way). Padding tokens of a fixed-shape chunk leave both as they were:
the rows kept are those after the chunk's real tokens, and the padding tokens' beta and g are
multiplied by 0, so the recurrence does not move.

Rope: for text, Qwen3.5's interleaved multi-section rope (IMROPE, rope.dimension_sections) gives every
rotary pair the token's position, which is NEOX rope of rope.dimension_count dimensions; the model is
refused when the sections leave a pair to the fourth (vision) position.
"""

from __future__ import annotations

import math

import numpy as np

from ...core.graph import F32, I32, GraphBuilder, LeafKind, Tensor, leaf
from ..hparams import MetadataError, SSMParams, read_ssm_hparams
from ..metadata import get_list
from .base import Architecture, KVCache, StepInputs

STATE_ROWS = 2          # row 0: zeros (a fresh sequence), row 1: the sequence's state
ATTN_WEIGHTS = ("attn_norm", "post_attention_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm",
                "attn_output", "ffn_gate", "ffn_up", "ffn_down")
LINEAR_WEIGHTS = ("attn_norm", "post_attention_norm", "attn_qkv", "attn_gate", "ssm_conv1d", "ssm_beta",
                  "ssm_alpha", "ssm_norm", "ssm_out", "ffn_gate", "ffn_up", "ffn_down")


class HybridCache(KVCache):
    """K and V of the full-attention layers; convolution and recurrence state of the linear ones."""

    def __init__(self, hp, ssm: SSMParams, n_ctx: int, scratch_rows: int = 0):
        attn = [il for il, r in enumerate(ssm.recurrent) if not r]
        super().__init__(hp, n_ctx, scratch_rows, layers=attn)
        conv = (ssm.d_conv - 1) * ssm.conv_channels
        rec = ssm.n_v_heads * ssm.d_state * ssm.d_state
        lin = [il for il, r in enumerate(ssm.recurrent) if r]
        self.conv = {il: leaf(f"cache_conv_l{il}", F32, (STATE_ROWS, conv), LeafKind.CACHE, il) for il in lin}
        self.ssm = {il: leaf(f"cache_ssm_l{il}", F32, (STATE_ROWS, rec), LeafKind.CACHE, il) for il in lin}

    def tensors(self) -> list[Tensor]:
        return super().tensors() + list(self.conv.values()) + list(self.ssm.values())

    def states(self) -> list[tuple[Tensor, str]]:
        return [(t, "SSM_CONV") for t in self.conv.values()] + [(t, "GATED_DELTA_NET") for t in self.ssm.values()]


def check_text_rope(sections: tuple[int, ...], n_rot: int) -> None:
    """Under IMROPE (ggml_mrope_cache_init), rotary pair i takes the position of section t, h or w
    (all the token's position, for text) unless it falls to the fourth one; refuse that case."""
    total = sum(sections)
    for i in range(n_rot // 2):
        sector = i % total if total else i
        to_thw = ((sector % 3 == 1 and sector < 3 * sections[1]) or (sector % 3 == 2 and sector < 3 * sections[2])
                  or (sector % 3 == 0 and sector < 3 * sections[0]))
        if not to_thw:
            raise MetadataError(f"rope.dimension_sections {list(sections)} give rotary pair {i} of {n_rot // 2} the "
                                f"fourth (vision) position, which text does not have; only sections that give "
                                f"every pair the token's position are supported")


class Qwen35(Architecture):
    name = "qwen35"
    rope_mode = "neox"
    recurrent = True

    def __init__(self, file, hparams):
        super().__init__(file, hparams)
        meta = file.metadata
        self.ssm = read_ssm_hparams(meta, hparams.n_layer)
        sections = tuple(get_list(meta, "qwen35.rope.dimension_sections", "integers", []))[:4]
        if sections:
            check_text_rope(sections + (0,) * (4 - len(sections)), hparams.n_rot)

    def weight_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Every tensor the graph reads, with its shape: full-attention layers as llama-style ones but with
        Q and its gate in one projection, linear-attention layers with the ssm keys' widths."""
        shapes = super().weight_shapes()
        hp, s = self.hp, self.ssm
        common = self.layer_shapes()
        e = hp.n_embd
        attn = {**common, "attn_q": ((2 * hp.n_head * hp.head_dim, e),
                                     f"2*n_head*head_dim = 2*{hp.n_head}*{hp.head_dim} (Q and its gate), n_embd")}
        c = (f"conv channels = 2*group_count*state_size + inner_size = 2*{s.n_k_heads}*{s.d_state} + "
             f"{s.d_inner}")
        linear = {**common,
                  "attn_qkv": ((s.conv_channels, e), f"{c}, n_embd"),
                  "attn_gate": ((s.d_inner, e), f"inner_size = {s.d_inner}, n_embd"),
                  "ssm_conv1d": ((s.conv_channels, s.d_conv), f"{c}, conv_kernel = {s.d_conv}"),
                  "ssm_beta": ((s.n_v_heads, e), f"time_step_rank = {s.n_v_heads}, n_embd"),
                  "ssm_alpha": ((s.n_v_heads, e), f"time_step_rank = {s.n_v_heads}, n_embd"),
                  "ssm_norm": ((s.d_state,), f"state_size = {s.d_state}"),
                  "ssm_out": ((e, s.d_inner), f"n_embd, inner_size = {s.d_inner}")}
        heads = ((s.n_v_heads,), f"time_step_rank = {s.n_v_heads}")
        for il, rec in enumerate(s.recurrent):
            layer = linear if rec else attn
            shapes.update({f"blk.{il}.{w}.weight": layer[w] for w in (LINEAR_WEIGHTS if rec else ATTN_WEIGHTS)})
            if rec:
                shapes[f"blk.{il}.ssm_a"] = heads
                shapes[f"blk.{il}.ssm_dt.bias"] = heads
        return shapes

    def make_cache(self, n_ctx: int, scratch_rows: int = 0) -> KVCache:
        return HybridCache(self.hp, self.ssm, n_ctx, scratch_rows)

    def make_inputs(self, b: GraphBuilder, n_tokens: int, n_kv: int, n_out: int | None) -> StepInputs:
        inp = super().make_inputs(b, n_tokens, n_kv, n_out)
        inp.extra["rs_read"] = b.input("rs_read", I32, (1,))           # 0 for a fresh sequence, else 1
        inp.extra["rs_write"] = b.input("rs_write", I32, (1,))
        inp.extra["conv_keep"] = b.input("conv_keep", I32, (self.ssm.d_conv - 1,))
        if n_tokens > 1:
            inp.extra["token_valid"] = b.input("token_valid", F32, (n_tokens, 1, 1))
        return inp

    def step_values(self, inp: StepInputs, n_real: int, n_past: int) -> dict[int, np.ndarray]:
        e = inp.extra
        n_tokens = inp.tokens.shape[0]
        out = {id(e["rs_read"]): np.array([0 if n_past == 0 else 1], dtype=np.int32),
               id(e["rs_write"]): np.array([1], dtype=np.int32),
               id(e["conv_keep"]): np.arange(n_real, n_real + self.ssm.d_conv - 1, dtype=np.int32)}
        if "token_valid" in e:
            out[id(e["token_valid"])] = (np.arange(n_tokens) < n_real).astype(np.float32).reshape(n_tokens, 1, 1)
        return out

    def build(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, n_layers: int | None = None) -> Tensor:
        hp = self.hp
        x = b.get_rows(self.weight("token_embd.weight"), inp.tokens, name="inp_embd")
        for il in b.layers(n_layers or hp.n_layer):
            w = f"blk.{il}."
            cur = self.norm(b, x, w + "attn_norm.weight", f"attn_norm-{il}")
            if self.ssm.recurrent[il]:
                cur = self.linear_attention(b, inp, cache, il, cur)
            else:
                cur = self.gated_attention(b, inp, cache, il, cur)
            x = b.add(cur, x, name=f"attn_residual-{il}")
            cur = self.norm(b, x, w + "post_attention_norm.weight", f"attn_post_norm-{il}")
            gate = self.linear(b, cur, w + "ffn_gate", f"ffn_gate-{il}")
            up = self.linear(b, cur, w + "ffn_up", f"ffn_up-{il}")
            cur = self.linear(b, b.glu(gate, up, "swiglu", name=f"ffn_swiglu-{il}"), w + "ffn_down", f"ffn_out-{il}")
            x = b.add(cur, x, name=f"post_ffn-{il}")
        return self.logits(b, x, inp)

    def gated_attention(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, il: int, cur: Tensor) -> Tensor:
        hp = self.hp
        w = f"blk.{il}."
        n_tokens, d, h = cur.shape[0], hp.head_dim, hp.n_head
        qg = b.mul_mat(self.weight(w + "attn_q.weight"), cur, name=f"Qcur_full-{il}")     # (T, H * 2 * D)
        # each head's Q then its gate: split them with one copy, (T, H, 2, D) -> (2, T, H, D)
        qg = b.reshape(qg, (n_tokens, h, 2, d), name=f"Qcur_full_4d-{il}")
        qg = b.cont(b.permute(qg, (2, 0, 1, 3), name=f"Qcur_gate_split-{il}"), name=f"Qcur_gate_cont-{il}")
        q = b.view(qg, (n_tokens, h, d), 0, name=f"Qcur_reshaped-{il}")
        gate = b.view(qg, (n_tokens, h * d), n_tokens * h * d, name=f"gate_reshaped-{il}")
        k = b.mul_mat(self.weight(w + "attn_k.weight"), cur, name=f"Kcur-{il}")
        v = b.mul_mat(self.weight(w + "attn_v.weight"), cur, name=f"Vcur-{il}")
        q = self.norm(b, q, w + "attn_q_norm.weight", f"Qcur_normed-{il}")
        k = self.norm(b, b.reshape(k, (n_tokens, hp.n_head_kv, d), name=f"Kcur_3d-{il}"), w + "attn_k_norm.weight",
                      f"Kcur_normed-{il}")
        v = b.reshape(v, (n_tokens, hp.n_head_kv, d), name=f"Vcur_3d-{il}")
        q = b.rope_ext(q, inp.pos, hp.n_rot, self.rope_mode, hp.rope_base, name=f"Qcur_rope-{il}")
        k = b.rope_ext(k, inp.pos, hp.n_rot, self.rope_mode, hp.rope_base, name=f"Kcur_rope-{il}")
        att = self.attention(b, inp, cache, il, q, k, v, 1.0 / math.sqrt(d))
        att = b.mul(att, b.unary(gate, "sigmoid", name=f"gate_sigmoid-{il}"), name=f"attn_gated-{il}")
        return b.mul_mat(self.weight(w + "attn_output.weight"), att, name=f"attn_output-{il}")

    def l2_norm(self, b: GraphBuilder, x: Tensor, name: str) -> Tensor:
        """llama.cpp's build_gdn_l2_norm: rms_norm(x, eps / n) / sqrt(n) over the last axis of n."""
        n = x.shape[-1]
        return b.scale(b.rms_norm(x, self.hp.rms_eps / n, name=f"{name}_rms"), 1.0 / math.sqrt(n), name=name)

    def linear_attention(self, b: GraphBuilder, inp: StepInputs, cache: KVCache, il: int, cur: Tensor) -> Tensor:
        s, w = self.ssm, f"blk.{il}."
        n_tokens, hs, channels = cur.shape[0], s.d_state, s.conv_channels
        key_dim = s.n_k_heads * hs
        qkv = b.mul_mat(self.weight(w + "attn_qkv.weight"), cur, name=f"linear_attn_qkv_mixed-{il}")   # (T, C)
        z = b.mul_mat(self.weight(w + "attn_gate.weight"), cur, name=f"z-{il}")
        beta = b.unary(b.mul_mat(self.weight(w + "ssm_beta.weight"), cur, name=f"beta-{il}"), "sigmoid",
                       name=f"beta_sigmoid-{il}")
        alpha = b.mul_mat(self.weight(w + "ssm_alpha.weight"), cur, name=f"alpha-{il}")
        alpha = b.unary(b.add(alpha, self.weight(w + "ssm_dt.bias"), name=f"alpha_biased-{il}"), "softplus",
                        name=f"a_softplus-{il}")
        g = b.mul(alpha, self.weight(w + "ssm_a"), name=f"gate-{il}")          # -exp(A_log) * softplus
        beta = b.reshape(beta, (n_tokens, s.n_v_heads, 1), name=f"beta_3d-{il}")
        g = b.reshape(g, (n_tokens, s.n_v_heads, 1), name=f"gate_3d-{il}")
        if "token_valid" in inp.extra:         # padding tokens leave the state as it was
            beta = b.mul(beta, inp.extra["token_valid"], name=f"beta_valid-{il}")
            g = b.mul(g, inp.extra["token_valid"], name=f"gate_valid-{il}")

        # the convolution over the last d_conv - 1 inputs and the new ones, time-major
        conv_state = b.get_rows(cache.conv[il], inp.extra["rs_read"], name=f"conv_states-{il}")
        conv_state = b.reshape(conv_state, (s.d_conv - 1, channels), name=f"conv_states_reshaped-{il}")
        conv_in = b.concat(conv_state, qkv, 0, name=f"conv_input-{il}")                 # (d_conv - 1 + T, C)
        keep = b.get_rows(conv_in, inp.extra["conv_keep"], name=f"conv_state_last-{il}")
        b.set_rows(cache.conv[il], b.reshape(keep, (1, (s.d_conv - 1) * channels), name=f"conv_state_flat-{il}"),
                   inp.extra["rs_write"], name=f"conv_state_update-{il}")
        sx = b.permute(b.reshape(conv_in, (1, n_tokens + s.d_conv - 1, channels), name=f"conv_input_3d-{il}"),
                       (0, 2, 1), name=f"conv_input_channels-{il}")                   # (1, C, d_conv - 1 + T)
        conv = b.ssm_conv(sx, self.weight(w + "ssm_conv1d.weight"), name=f"conv_output_raw-{il}")
        conv = b.unary(conv, "silu", name=f"conv_output_silu-{il}")                     # (1, T, C)

        # Q, K, V are column ranges of every row: transpose once, take row ranges, view them back per head
        cols = b.cont(b.permute(b.reshape(conv, (n_tokens, channels), name=f"conv_2d-{il}"), (1, 0),
                                name=f"conv_t-{il}"), name=f"conv_channels-{il}")       # (C, T)
        parts = []
        for j, (width, heads, tag) in enumerate(((key_dim, s.n_k_heads, "q"), (key_dim, s.n_k_heads, "k"),
                                                 (s.d_inner, s.n_v_heads, "v"))):
            part = b.view(cols, (heads, hs, n_tokens), j * key_dim * n_tokens, name=f"{tag}_conv_cols-{il}")
            parts.append(b.permute(part, (2, 0, 1), name=f"{tag}_conv-{il}"))            # (T, heads, hs)
        q = self.l2_norm(b, parts[0], f"q_conv_predelta-{il}")
        k = self.l2_norm(b, parts[1], f"k_conv_predelta-{il}")
        v = parts[2]

        state = b.get_rows(cache.ssm[il], inp.extra["rs_read"], name=f"state-{il}")
        state = b.reshape(state, (s.n_v_heads, hs, hs), name=f"state_predelta-{il}")
        res = b.gated_delta_net(q, k, v, g, beta, state, name=f"gated_delta_net-{il}")    # (T + hs, H * hs)
        out = b.view(res, (n_tokens, s.n_v_heads, hs), 0, name=f"attn_output-{il}")
        new_state = b.view(res, (1, s.n_v_heads * hs * hs), n_tokens * s.d_inner, name=f"new_state-{il}")
        b.set_rows(cache.ssm[il], new_state, inp.extra["rs_write"], name=f"state_update-{il}")

        z = b.reshape(z, (n_tokens, s.n_v_heads, hs), name=f"z_3d-{il}")
        out = self.norm(b, out, w + "ssm_norm.weight", f"attn_out_norm-{il}")
        out = b.mul(out, b.unary(z, "silu", name=f"z_silu-{il}"), name=f"attn_out_gated-{il}")
        out = b.reshape(out, (n_tokens, s.d_inner), name=f"final_output-{il}")
        return b.mul_mat(self.weight(w + "ssm_out.weight"), out, name=f"linear_attn_out-{il}")
