"""Tiny GGUF models of the architectures this project runs, written with gguf's writer.

A few layers, small widths, random weights in every weight type the project decodes (spread over the
tensors, as Q4_K_M and Q5_K_M files mix types), and a real tokenizer: the first ``N_BASE`` ranks of
Qwen's or Llama 3's byte-level BPE (tests/real_vocab.py) and their special tokens. llama.cpp's outputs on
these files are kept in tests/reference/tiny/ (made by tests/make_tiny_reference.py), so tests rebuild the
files (about a second each) instead of keeping them in the repository.

The bytes are the same on every machine: weights come from PCG64's raw 64-bit output (an algorithm, not
a sampling routine a numpy release may change), turned into values with integer and exact float
arithmetic only. Each reference records the sha256 of the file it was computed on; a test fails if the
file rebuilt here differs.

Run ``python tests/tiny_models.py DIR`` to write them all to DIR.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf import quants as gguf_quants

from real_vocab import vocab_metadata

T = GGMLQuantizationType
N_BASE = 1024           # ranks of the real vocabulary kept
TEMPLATES = Path(__file__).resolve().parent / "reference" / "tiny" / "templates"

# Offsets of the float16 scale fields in one block, and the value each is set to before scaling
# (a minimum of about the block's mean code, so values centre near 0); UNIT_STD: the standard deviation
# of the values of random blocks with those fields (measured once with gguf.quants.dequantize).
SCALE_FIELDS = {
    "Q4_0": ((0, 1.0),), "Q4_1": ((0, 1.0), (2, -7.5)), "Q5_0": ((0, 1.0),), "Q5_1": ((0, 1.0), (2, -15.5)),
    "Q8_0": ((0, 1.0),), "Q2_K": ((80, 1.0), (82, 1.5)), "Q3_K": ((108, 1.0),), "Q4_K": ((0, 1.0), (2, 7.5)),
    "Q5_K": ((0, 1.0), (2, 15.5)), "Q6_K": ((208, 1.0),), "IQ4_NL": ((0, 1.0),), "IQ4_XS": ((0, 1.0),),
}
UNIT_STD = {"Q4_0": 4.61, "Q4_1": 4.60, "Q5_0": 9.24, "Q5_1": 9.23, "Q8_0": 74.0, "Q2_K": 13.9, "Q3_K": 43.3,
            "Q4_K": 259.2, "Q5_K": 526.9, "Q6_K": 1363.9, "IQ4_NL": 67.3, "IQ4_XS": 1249.0}


class Random:
    """Deterministic numbers from PCG64's raw output."""

    def __init__(self, seed: int):
        self.bits = np.random.PCG64(seed)

    def bytes(self, n: int) -> np.ndarray:
        words = self.bits.random_raw((n + 7) // 8).astype(np.uint64)
        return words.view(np.uint8)[:n].copy()

    def uniform(self, n: int) -> np.ndarray:
        """n float64 values in [0, 1): the top 53 bits of each word (exact)."""
        return (self.bits.random_raw(n).astype(np.uint64) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53

    def normal(self, shape, std: float) -> np.ndarray:
        """Irwin-Hall: the sum of 4 uniforms, centred and scaled to unit variance (exact arithmetic)."""
        n = int(np.prod(shape))
        u = self.uniform(4 * n).reshape(4, n)
        z = (u[0] + u[1] + u[2] + u[3] - 2.0) * np.sqrt(3.0)
        return (z * std).reshape(shape).astype(np.float32)


def _to_bf16_bytes(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 by round-to-nearest-even on the bits (as ggml_fp32_to_bf16)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded.view(np.uint8).reshape(*x.shape[:-1], x.shape[-1] * 2)


def rnd_weight(rnd: Random, dtype: str, shape: tuple[int, int], std: float):
    """(data, raw dtype) of a weight of numpy shape (rows, cols): values of about std."""
    if dtype == "F32":
        return rnd.normal(shape, std), None
    if dtype == "F16":
        return rnd.normal(shape, std).astype(np.float16), None
    if dtype == "BF16":
        return _to_bf16_bytes(rnd.normal(shape, std)), T.BF16
    qt = T[dtype]
    per_block, block_bytes = GGML_QUANT_SIZES[qt]
    rows, cols = shape
    blocks = rows * cols // per_block
    raw = rnd.bytes(blocks * block_bytes).reshape(blocks, block_bytes)
    unit = std / UNIT_STD[dtype]
    for offset, value in SCALE_FIELDS[dtype]:
        raw[:, offset:offset + 2] = np.frombuffer(np.float16(value * unit).tobytes(), np.uint8)
    return raw.reshape(rows, cols // per_block * block_bytes), qt


random_weight = rnd_weight


@dataclass
class Spec:
    """One tiny model: its architecture, widths and the weight type of every matrix."""

    arch: str
    vocab: str                      # family in real_vocab.FAMILIES
    n_layer: int = 2
    n_embd: int = 256
    n_ff: int = 512
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    rope_base: float = 1_000_000.0
    rms_eps: float = 1e-6
    n_special: int = 16
    tied: bool = True
    embd_type: str = "Q8_0"
    embd_std: float = 1.0           # a tied embedding is also the output matrix: smaller, so no token dominates
    output_type: str = "Q6_K"
    types: tuple[tuple[str, ...], ...] = ()     # per layer, in the order of layer_matrices
    template: str = ""
    extra: dict = field(default_factory=dict)   # architecture keys beyond the common ones
    seed: int = 0
    decoded: bool = False           # every weight written as F32, decoded from the types above


MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")

SPECS = {
    "qwen2": Spec("qwen2", "qwen2", n_special=22, tied=True, embd_type="Q8_0", embd_std=0.15, seed=2,
                  types=(("Q5_K", "Q3_K", "Q2_K", "Q5_1", "IQ4_NL", "IQ4_XS", "F16"),
                         ("BF16", "Q4_K", "Q6_K", "Q8_0", "Q4_0", "Q5_0", "Q4_1")),
                  template="Qwen-Qwen2.5-7B-Instruct.jinja"),
    "qwen3": Spec("qwen3", "qwen2", n_special=26, tied=False, embd_type="Q4_K", output_type="Q6_K", seed=3,
                  types=(("IQ4_XS", "F16", "BF16", "Q5_K", "Q3_K", "Q2_K", "Q5_1"),
                         ("IQ4_NL", "Q8_0", "Q4_K", "Q6_K", "Q5_K", "Q4_K", "Q6_K")),
                  template="Qwen-Qwen3-0.6B.jinja"),
    # three GatedDeltaNet layers then one full-attention layer; d_inner 128 = 4 value heads of 32, 2 key heads
    "qwen35": Spec("qwen35", "qwen35", n_layer=4, n_special=26, tied=True, embd_type="Q8_0", embd_std=0.15, seed=5,
                   rope_base=10_000_000.0,
                   # the recurrence amplifies the noise of llama.cpp's 8-bit activations in Q, K, beta and g:
                   # as Q4_K_M files do, the projections feeding it keep more bits, the low-bit types go elsewhere
                   types=(("Q8_0", "Q5_K", "F16", "BF16", "Q5_1", "Q2_K", "Q3_K", "IQ4_XS"),
                          ("F16", "Q6_K", "Q8_0", "F16", "IQ4_NL", "Q4_K", "Q5_K", "Q6_K"),
                          ("BF16", "Q4_K", "F16", "Q8_0", "Q8_0", "IQ4_XS", "Q2_K", "Q3_K"),
                          ("Q5_K", "Q4_K", "Q6_K", "Q8_0", "IQ4_NL", "Q5_1", "Q6_K")),
                   template="Qwen3.5-4B.jinja",
                   extra={"ssm.conv_kernel": (4, "u32"), "ssm.inner_size": (128, "u32"), "ssm.state_size": (32, "u32"),
                          "ssm.time_step_rank": (4, "u32"), "ssm.group_count": (2, "u32"),
                          "full_attention_interval": (4, "u32"), "rope.dimension_count": (16, "u32"),
                          "rope.dimension_sections": ([3, 3, 2, 0], "i32[]")}),
    "llama": Spec("llama", "llama3", n_special=16, tied=False, embd_type="Q6_K", output_type="Q8_0",
                  rope_base=500_000.0, rms_eps=1e-5, seed=4,
                  types=(("Q2_K", "Q5_1", "IQ4_NL", "IQ4_XS", "F16", "BF16", "Q5_K"),
                         ("Q3_K", "Q4_K", "Q6_K", "Q4_1", "Q8_0", "Q5_K", "Q6_K")),
                  template="meta-llama-Llama-3.2-3B-Instruct.jinja"),
}


# Gemma 4 (tests/tiny_models.py's gemma4 section below): six layers, sliding and full alternating, the
# last two reading the K and V of layers 2 and 3; per-layer embeddings, output scales, soft-capped logits
SPECS["gemma4"] = Spec("gemma4", "qwen2", n_layer=6, n_embd=128, n_head=4, n_special=22, embd_type="Q8_0",
                       embd_std=0.09, seed=6, template="Qwen-Qwen2.5-7B-Instruct.jinja")

# the qwen35 model with every weight of the mixed file decoded (gguf.quants) to F32: the same values, which
# llama.cpp multiplies without rounding the activations, so this one checks the graph, the ops and the
# decoding of every type of the mixed file exactly (llama.cpp on the mixed file differs from llama.cpp
# on this one by its own rounding of the activations, 2e-3 to 4e-3 NMSE: docs/models.md)
SPECS["qwen35-f32"] = replace(SPECS["qwen35"], decoded=True)


def llama3_rope_freqs(n_rot: int, base: float, factor=8.0, low=1.0, high=4.0, orig_ctx=8192) -> np.ndarray:
    """Llama 3.1's rope frequency factors, as llama.cpp's converter computes rope_freqs.weight."""
    freqs = 1.0 / base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    low_wl, high_wl = orig_ctx / low, orig_ctx / high
    out = []
    for f in freqs:
        wl = 2 * np.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (orig_ctx / wl - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


QWEN35_LINEAR = ("attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out", "ffn_gate", "ffn_up", "ffn_down")


def _tensors(spec: Spec, n_vocab: int) -> list[tuple[str, object, object]]:
    rnd = Random(spec.seed)
    e, h, hk, d, ff = spec.n_embd, spec.n_head, spec.n_head_kv, spec.head_dim, spec.n_ff
    out = [("token_embd.weight", *random_weight(rnd, spec.embd_type, (n_vocab, e), spec.embd_std))]
    norm = lambda n: (1.0 + rnd.normal((n,), 0.1), None)     # noqa: E731
    shapes = {"attn_q": (h * d, e), "attn_k": (hk * d, e), "attn_v": (hk * d, e), "attn_output": (e, h * d),
              "ffn_gate": (ff, e), "ffn_up": (ff, e), "ffn_down": (e, ff)}
    if spec.arch == "qwen35":
        shapes["attn_q"] = (2 * h * d, e)       # each head's Q, then its output gate
        x = {k: v for k, (v, _) in spec.extra.items()}
        n_v, n_k, s_ = x["ssm.time_step_rank"], x["ssm.group_count"], x["ssm.state_size"]
        d_inner, channels = x["ssm.inner_size"], 2 * n_k * s_ + x["ssm.inner_size"]
        shapes.update({"attn_qkv": (channels, e), "attn_gate": (d_inner, e), "ssm_beta": (n_v, e),
                       "ssm_alpha": (n_v, e), "ssm_out": (e, d_inner)})
    if spec.arch == "llama":
        out.append(("rope_freqs.weight", llama3_rope_freqs(d, spec.rope_base), None))
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        out.append((p + "attn_norm.weight", *norm(e)))
        interval = spec.extra.get("full_attention_interval", (4, ""))[0]
        linear = spec.arch == "qwen35" and (il + 1) % interval != 0
        matrices = QWEN35_LINEAR if linear else MATRICES
        for name, dtype in zip(matrices, spec.types[il]):
            rows, cols = shapes[name]
            out.append((p + name + ".weight", *random_weight(rnd, dtype, (rows, cols), 1.0 / np.sqrt(cols))))
            if spec.arch == "qwen2" and name in ("attn_q", "attn_k", "attn_v"):
                out.append((p + name + ".bias", rnd.normal((rows,), 0.5), None))
        if linear:
            # keys as queries (their rows of attn_qkv and their kernels copied): q.k then stays far from 0, where
            # the normalised output of the recurrence would amplify llama.cpp's rounding of activations
            key_dim = n_k * s_
            qkv = next(i for i, t in enumerate(out) if t[0] == p + "attn_qkv.weight")
            data = out[qkv][1]
            data[key_dim:2 * key_dim] = data[:key_dim]
            conv = rnd.normal((channels, x["ssm.conv_kernel"]), 0.5)
            conv[key_dim:2 * key_dim] = conv[:key_dim]
            out.append((p + "ssm_conv1d.weight", conv, None))
            out.append((p + "ssm_dt.bias", rnd.normal((n_v,), 1.0), None))
            out.append((p + "ssm_a", -np.exp(rnd.normal((n_v,), 1.0)), None))      # -exp(A_log)
            out.append((p + "ssm_norm.weight", *norm(s_)))
        if spec.arch in ("qwen3", "qwen35") and not linear:
            out.append((p + "attn_q_norm.weight", *norm(d)))
            out.append((p + "attn_k_norm.weight", *norm(d)))
        out.append((p + ("post_attention_norm" if spec.arch == "qwen35" else "ffn_norm") + ".weight", *norm(e)))
    out.append(("output_norm.weight", *norm(e)))
    if not spec.tied:
        out.append(("output.weight", *random_weight(rnd, spec.output_type, (n_vocab, e), 3.0 / np.sqrt(e))))
    if spec.decoded:
        out = [(name, decoded(data, raw), None) for name, data, raw in out]
    return out


def decoded(data: np.ndarray, raw) -> np.ndarray:
    """A weight's values in float32, decoded by gguf.quants where it holds a type's blocks."""
    return (gguf_quants.dequantize(data, raw) if raw is not None else data).astype(np.float32)


def write(arch: str, path: Path, decoded: bool = False) -> Path:
    """Write the tiny model of `arch` to path (decoded: every weight in F32, decoded from its type); return
    path."""
    if arch in GEMMA4:
        return write_gemma4(arch, path)
    spec = replace(SPECS[arch], decoded=True) if decoded else SPECS[arch]
    vocab = vocab_metadata(spec.vocab, N_BASE, spec.n_special)
    n_vocab = len(vocab["tokenizer.ggml.tokens"])
    w = GGUFWriter(str(path), spec.arch)
    a = spec.arch
    w.add_name(f"tiny-{arch}")
    w.add_uint32(f"{a}.context_length", 4096)
    w.add_uint32(f"{a}.embedding_length", spec.n_embd)
    w.add_uint32(f"{a}.block_count", spec.n_layer)
    w.add_uint32(f"{a}.feed_forward_length", spec.n_ff)
    w.add_uint32(f"{a}.attention.head_count", spec.n_head)
    w.add_uint32(f"{a}.attention.head_count_kv", spec.n_head_kv)
    w.add_uint32(f"{a}.attention.key_length", spec.head_dim)
    w.add_uint32(f"{a}.attention.value_length", spec.head_dim)
    w.add_float32(f"{a}.rope.freq_base", spec.rope_base)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", spec.rms_eps)
    if a == "llama":
        w.add_uint32(f"{a}.rope.dimension_count", spec.head_dim)
        w.add_uint32(f"{a}.vocab_size", n_vocab)
    for key, (value, kind) in spec.extra.items():
        if kind == "u32":
            w.add_uint32(f"{a}.{key}", value)
        else:
            w.add_array(f"{a}.{key}", value)
    w.add_string("tokenizer.ggml.model", vocab["tokenizer.ggml.model"])
    w.add_string("tokenizer.ggml.pre", vocab["tokenizer.ggml.pre"])
    w.add_token_list(vocab["tokenizer.ggml.tokens"])
    w.add_token_types(vocab["tokenizer.ggml.token_type"])
    w.add_token_merges(vocab["tokenizer.ggml.merges"])
    w.add_bos_token_id(vocab["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(vocab["tokenizer.ggml.eos_token_id"])
    if "tokenizer.ggml.padding_token_id" in vocab:
        w.add_pad_token_id(vocab["tokenizer.ggml.padding_token_id"])
    if spec.template:
        w.add_chat_template((TEMPLATES / spec.template).read_text(encoding="utf-8"))
    for name, data, raw_dtype in _tensors(spec, n_vocab):
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# -- Gemma 4 and its MTP assistant ------------------------------------------------------------------------
# Shapes as llama.cpp's gemma4.cpp and gemma4-assistant.cpp read them. Sliding layers: 4 heads of 32, 2 kv
# heads, 16 of 32 dimensions turned (partial rope); full layers: 4 heads of 64, 1 kv head, rope_freqs
# turning 8 of 32 pairs (Gemma 4's "proportional" rope); a window of 8 tokens, so the prompts outrun it.
# Layer 1 has no attn_v (V is K's projection), layers 4 and 5 have no K or V of their own; the last two
# feed-forward blocks are twice as wide (use_double_wide_mlp). The assistant: 64 wide, one sliding and
# one full Q-only layer over the target's cache, in F16 and F32 (its draft tokens are compared exactly).
# The attention matrices take the low-bit types, the feed-forward F16 and BF16: llama.cpp rounds a product's
# activations to 8 bits for a quantized weight, and rounding GeGLU's heavy-tailed output so moves these random
# logits some 20 times more (to 4e-4 NMSE at some positions) than rounding the attention's inputs does.
GEMMA4 = {
    "gemma4": dict(n_embd=128, n_layer=6, swa=(True, False, True, False, True, False), n_ff=(256,) * 4 + (512,) * 2,
                   shared_kv=2, per_layer=16, softcap=30.0, seed=6,
                   types=("Q4_1", "Q5_0", "F16", "BF16", "F16", "Q8_0", "Q5_1")),
    "gemma4-assistant": dict(n_embd=64, n_layer=2, swa=(True, False), n_ff=(128, 128), shared_kv=2, per_layer=0,
                             softcap=0.0, seed=7, backbone=128, types=("F16", "F32", "F16", "F32", "F16", "F16",
                                                                       "F32")),
}
POST_GAIN = 0.2
G4_HEADS, G4_SWA_DIM, G4_FULL_DIM, G4_SWA_KV, G4_FULL_KV, G4_SWA_ROT, G4_WINDOW = 4, 32, 64, 2, 1, 16, 8


def gemma4_rope_freqs(head_dim: int = G4_FULL_DIM, partial: float = 0.25) -> np.ndarray:
    """The converter's rope_freqs for Gemma 4's full layers: 1 for the pairs that turn, 1e30 for the rest."""
    n_rot = int(head_dim * partial / 2)
    return np.array([1.0] * n_rot + [1e30] * (head_dim // 2 - n_rot), dtype=np.float32)


def _gemma4_tensors(arch: str, n_vocab: int, f32: bool = False) -> list[tuple[str, object, object]]:
    g = GEMMA4[arch]
    rnd = Random(g["seed"])
    if f32:         # every matrix in F32: llama.cpp then rounds no activation
        def random_weight(rnd, dtype, shape, std):     # noqa: F811
            return rnd_weight(rnd, "F32", shape, std)
    else:
        random_weight = rnd_weight
    e, h = g["n_embd"], G4_HEADS
    norm = lambda n: (1.0 + rnd.normal((n,), 0.1), None)     # noqa: E731
    assistant = arch == "gemma4-assistant"
    embd_type = "F16" if assistant else SPECS["gemma4"].embd_type
    # the embedded input (scaled by sqrt(n_embd)) of about unit size, like the twelve blocks' contributions
    # together, so the layers matter; the target's own output head, so its choices are not its input token
    out = [("token_embd.weight", *random_weight(rnd, embd_type, (n_vocab, e), SPECS["gemma4"].embd_std)),
           ("output_norm.weight", *norm(e)), ("rope_freqs.weight", gemma4_rope_freqs(), None)]
    if not assistant:
        out.append(("output.weight", *random_weight(rnd, "F16", (n_vocab, e), 3.0 / np.sqrt(e))))
    n_pl, n_layer = g["per_layer"], g["n_layer"]
    if n_pl:
        out += [("per_layer_token_embd.weight", *random_weight(rnd, "Q8_0", (n_vocab, n_layer * n_pl), 1.0)),
                ("per_layer_model_proj.weight", *random_weight(rnd, "F16", (n_layer * n_pl, e), 1.0 / np.sqrt(e))),
                ("per_layer_proj_norm.weight", *norm(n_pl))]
    if assistant:
        b = g["backbone"]
        out += [("nextn.pre_projection.weight", *random_weight(rnd, "F32", (e, 2 * b), 1.0 / np.sqrt(2 * b))),
                ("nextn.post_projection.weight", *random_weight(rnd, "F32", (b, e), 1.0 / np.sqrt(e)))]
    kv_start = n_layer - (0 if assistant else g["shared_kv"])
    for il in range(n_layer):
        p, swa, ff = f"blk.{il}.", g["swa"][il], g["n_ff"][il]
        d, hk = (G4_SWA_DIM, G4_SWA_KV) if swa else (G4_FULL_DIM, G4_FULL_KV)
        t = g["types"]
        shapes = [("attn_q", t[0], (h * d, e)), ("attn_output", t[1], (e, h * d)), ("ffn_gate", t[2], (ff, e)),
                  ("ffn_up", t[3], (ff, e)), ("ffn_down", t[4] if ff % 32 == 0 else "F16", (e, ff))]
        if not assistant and il < kv_start:
            shapes += [("attn_k", t[5], (hk * d, e))] + ([] if il == 1 else [("attn_v", t[6], (hk * d, e))])
        for name, dtype, (rows, cols) in shapes:
            out.append((p + name + ".weight", *random_weight(rnd, dtype, (rows, cols), 1.0 / np.sqrt(cols))))
        # Q and K norm gains of d^-1/4 each: unscaled attention (Gemma 4's scale is 1) then sees logits of
        # about unit spread, as trained gains give, not a near one-hot softmax that amplifies every rounding
        qk_norm = lambda n: (norm(n)[0] * n ** -0.25, None)     # noqa: E731
        # small gains after attention and feed-forward: each block moves the residual stream a little, so
        # six random layers stay smooth enough that llama.cpp's 8-bit activations shift the logits a little
        post_norm = lambda n: (norm(n)[0] * POST_GAIN, None)     # noqa: E731
        out += [(p + "attn_norm.weight", *norm(e)), (p + "attn_q_norm.weight", *qk_norm(d)),
                (p + "post_attention_norm.weight", *post_norm(e)), (p + "ffn_norm.weight", *norm(e)),
                (p + "post_ffw_norm.weight", *post_norm(e)),
                (p + "layer_output_scale.weight", np.array([0.5 + 0.5 * rnd.uniform(1)[0]], dtype=np.float32), None)]
        if not assistant and il < kv_start:
            out.append((p + "attn_k_norm.weight", *qk_norm(d)))
        if n_pl:
            out += [(p + "inp_gate.weight", *random_weight(rnd, "F16", (n_pl, e), 1.0 / np.sqrt(e))),
                    (p + "proj.weight", *random_weight(rnd, "F16", (e, n_pl), 1.0 / np.sqrt(n_pl))),
                    (p + "post_norm.weight", *norm(e))]
    return out


def write_gemma4(arch: str, path: Path, f32: bool = False) -> Path:
    """The tiny Gemma 4 target (arch "gemma4") or its MTP assistant ("gemma4-assistant"), one vocabulary."""
    g = GEMMA4[arch]
    vocab = vocab_metadata("qwen2", N_BASE, SPECS["gemma4"].n_special)
    n_vocab = len(vocab["tokenizer.ggml.tokens"])
    w = GGUFWriter(str(path), arch)
    a, n_layer = arch, g["n_layer"]
    w.add_name(f"tiny-{arch}")
    for key, value in (("context_length", 4096), ("embedding_length", g["n_embd"]), ("block_count", n_layer),
                       ("attention.head_count", G4_HEADS), ("attention.key_length", G4_FULL_DIM),
                       ("attention.value_length", G4_FULL_DIM), ("attention.key_length_swa", G4_SWA_DIM),
                       ("attention.value_length_swa", G4_SWA_DIM), ("rope.dimension_count", G4_FULL_DIM),
                       ("rope.dimension_count_swa", G4_SWA_ROT), ("attention.sliding_window", G4_WINDOW),
                       ("attention.shared_kv_layers", g["shared_kv"]),
                       ("embedding_length_per_layer_input", g["per_layer"])):
        w.add_uint32(f"{a}.{key}", value)
    w.add_array(f"{a}.feed_forward_length", list(g["n_ff"]))
    w.add_array(f"{a}.attention.head_count_kv", [G4_SWA_KV if s else G4_FULL_KV for s in g["swa"]])
    w.add_array(f"{a}.attention.sliding_window_pattern", list(g["swa"]))
    w.add_float32(f"{a}.rope.freq_base", 1_000_000.0)
    w.add_float32(f"{a}.rope.freq_base_swa", 10_000.0)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    if g["softcap"]:
        w.add_float32(f"{a}.final_logit_softcapping", g["softcap"])
    if arch == "gemma4-assistant":
        w.add_uint32(f"{a}.embedding_length_out", g["backbone"])
        w.add_uint32(f"{a}.nextn_predict_layers", n_layer)
    w.add_string("tokenizer.ggml.model", vocab["tokenizer.ggml.model"])
    w.add_string("tokenizer.ggml.pre", vocab["tokenizer.ggml.pre"])
    w.add_token_list(vocab["tokenizer.ggml.tokens"])
    w.add_token_types(vocab["tokenizer.ggml.token_type"])
    w.add_token_merges(vocab["tokenizer.ggml.merges"])
    w.add_bos_token_id(vocab["tokenizer.ggml.bos_token_id"])
    w.add_eos_token_id(vocab["tokenizer.ggml.eos_token_id"])
    w.add_pad_token_id(vocab["tokenizer.ggml.padding_token_id"])
    w.add_chat_template((TEMPLATES / SPECS["gemma4"].template).read_text(encoding="utf-8"))
    for name, data, raw_dtype in _gemma4_tensors(arch, n_vocab, f32):
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


if __name__ == "__main__":
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    out.mkdir(parents=True, exist_ok=True)
    for name in [*SPECS, "gemma4-assistant"]:
        p = write(name, out / f"tiny-{name}.gguf")
        print(p, p.stat().st_size, digest(p)[:16])
