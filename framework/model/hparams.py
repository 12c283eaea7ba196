"""Hyper-parameters read from GGUF metadata, with llama.cpp's defaults where a key is absent.

Each key is checked for its type and range where it is read (model/metadata.py), then the whole set
is checked for consistency (check_hparams): head counts that divide, a rotary width that fits the head,
a layer count that matches the blocks of tensors the file holds. The weights' shapes are checked
against these values when the architecture loads (arch/base.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .metadata import MetadataError, describe, get_float, get_int, get_list, get_str

__all__ = ["HParams", "MetadataError", "SSMParams", "check_hparams", "read_hparams", "read_ssm_hparams"]

MAX_LAYERS = 4096           # far above any model; bounds the per-layer tables before the tensors are counted
MAX_DIM = 1 << 20           # widths (embedding, feed-forward, heads) above this are corrupt metadata


@dataclass(frozen=True)
class HParams:
    arch: str
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    rope_base_swa: float
    n_rot: int
    sliding_window: int          # 0: no sliding-window layers
    swa_layers: tuple[bool, ...]

    @property
    def kv_width(self) -> int:
        """Elements one token adds to one layer's K (or V) cache."""
        return self.n_head_kv * self.head_dim


def read_hparams(meta: dict, swa_pattern: int = 0, rope_base_swa: float | None = None,
                 n_blocks: int | None = None) -> HParams:
    """Common keys under the `{arch}.` prefix. swa_pattern N: every Nth layer is global, the rest
    use the sliding window (llama.cpp's set_swa_pattern). n_blocks: the number of layers whose
    tensors (blk.N.*) the file holds; the block count must match it."""
    arch = get_str(meta, "general.architecture")
    p = f"{arch}."
    n_embd = get_int(meta, p + "embedding_length", lo=1, hi=MAX_DIM)
    n_head = get_int(meta, p + "attention.head_count", lo=1, hi=MAX_DIM)
    if p + "attention.key_length" not in meta and n_embd % n_head:
        raise MetadataError(f"metadata key '{p}embedding_length' ({n_embd}) is not a multiple of "
                            f"'{p}attention.head_count' ({n_head}), and there is no '{p}attention.key_length' "
                            f"to give the head size")
    head_dim = get_int(meta, p + "attention.key_length", n_embd // n_head, lo=1, hi=MAX_DIM)
    value_dim = get_int(meta, p + "attention.value_length", head_dim, lo=1, hi=MAX_DIM)
    if value_dim != head_dim:
        raise MetadataError(f"metadata key '{p}attention.value_length' ({value_dim}) differs from the key size "
                            f"({head_dim}); the {arch} graph here needs them equal")
    n_layer = get_int(meta, p + "block_count", lo=1, hi=MAX_LAYERS)
    if n_blocks is not None and n_layer != n_blocks:
        raise MetadataError(f"metadata key '{p}block_count' says {n_layer} layers, but the file holds tensors "
                            f"for {n_blocks} (blk.0 to blk.{n_blocks - 1})" if n_blocks else
                            f"metadata key '{p}block_count' says {n_layer} layers, but the file holds no "
                            f"layer tensors (blk.N.*)")
    window = get_int(meta, p + "attention.sliding_window", 0, lo=0) if swa_pattern else 0
    swa = tuple(bool(window) and (il + 1) % swa_pattern != 0 for il in range(n_layer))
    rope_base = get_float(meta, p + "rope.freq_base", 10000.0, above=0.0)
    if "tokenizer.ggml.tokens" in meta:
        n_vocab = len(get_list(meta, "tokenizer.ggml.tokens", "strings"))
        if not n_vocab:
            raise MetadataError("metadata key 'tokenizer.ggml.tokens' is an empty array; expected the vocabulary")
    else:
        n_vocab = get_int(meta, p + "vocab_size", lo=1)
    n_head_kv = get_int(meta, p + "attention.head_count_kv", n_head, lo=1, hi=MAX_DIM)
    hp = HParams(
        arch=arch, n_vocab=n_vocab, n_ctx_train=get_int(meta, p + "context_length", lo=1), n_embd=n_embd,
        n_layer=n_layer, n_ff=get_int(meta, p + "feed_forward_length", lo=1, hi=MAX_DIM), n_head=n_head,
        n_head_kv=n_head_kv, head_dim=head_dim,
        rms_eps=get_float(meta, p + "attention.layer_norm_rms_epsilon", above=0.0, below=1.0),
        rope_base=rope_base, rope_base_swa=rope_base if rope_base_swa is None else rope_base_swa,
        n_rot=get_int(meta, p + "rope.dimension_count", head_dim, lo=1), sliding_window=window, swa_layers=swa)
    check_hparams(hp)
    return hp


def check_hparams(hp: HParams) -> None:
    """The values taken together: what each key allows alone is checked where it is read."""
    p = f"{hp.arch}."
    if hp.n_head % hp.n_head_kv:
        raise MetadataError(f"metadata key '{p}attention.head_count' ({hp.n_head}) is not a multiple of "
                            f"'{p}attention.head_count_kv' ({hp.n_head_kv}): query heads must share key/value "
                            f"heads evenly")
    if hp.n_rot > hp.head_dim or hp.n_rot % 2:
        raise MetadataError(f"metadata key '{p}rope.dimension_count' ({hp.n_rot}) must be even and at most the "
                            f"head size ({hp.head_dim})")


@dataclass(frozen=True)
class SSMParams:
    """Linear-attention (GatedDeltaNet) hyper-parameters: llama.cpp's ssm_* keys, as qwen35 reads them."""

    d_conv: int                   # {arch}.ssm.conv_kernel: taps of the short causal convolution
    d_inner: int                  # {arch}.ssm.inner_size: value width, n_v_heads * head size
    d_state: int                  # {arch}.ssm.state_size: head size of keys (and of values)
    n_v_heads: int                # {arch}.ssm.time_step_rank
    n_k_heads: int                # {arch}.ssm.group_count
    recurrent: tuple[bool, ...]   # per layer: linear attention (True) or full attention

    @property
    def conv_channels(self) -> int:
        """Channels of the convolution: Q and K (n_k_heads * d_state each), then V (d_inner)."""
        return 2 * self.n_k_heads * self.d_state + self.d_inner


def read_ssm_hparams(meta: dict, n_layer: int) -> SSMParams:
    """The ssm keys; recurrent layers from {arch}.attention.recurrent_layers, else every layer but each
    {arch}.full_attention_interval-th (default 4), as llama.cpp's qwen35 loader."""
    p = f"{get_str(meta, 'general.architecture')}."
    if p + "attention.recurrent_layers" in meta:
        layers = meta[p + "attention.recurrent_layers"]
        if not isinstance(layers, list) or not set(map(type, layers)) <= {bool, int}:
            raise MetadataError(f"metadata key '{p}attention.recurrent_layers' holds {describe(layers)}; expected an "
                                f"array of booleans, one per layer")
        recurrent = tuple(bool(x) for x in layers)[:n_layer]
        if len(recurrent) != n_layer:
            raise MetadataError(f"metadata key '{p}attention.recurrent_layers' has {len(recurrent)} entries, "
                                f"the model has {n_layer} layers")
    else:
        interval = get_int(meta, p + "full_attention_interval", 4, lo=1)
        recurrent = tuple((il + 1) % interval != 0 for il in range(n_layer))
    ssm = SSMParams(d_conv=get_int(meta, p + "ssm.conv_kernel", lo=1, hi=MAX_DIM),
                    d_inner=get_int(meta, p + "ssm.inner_size", lo=1, hi=MAX_DIM),
                    d_state=get_int(meta, p + "ssm.state_size", lo=1, hi=MAX_DIM),
                    n_v_heads=get_int(meta, p + "ssm.time_step_rank", lo=1, hi=MAX_DIM),
                    n_k_heads=get_int(meta, p + "ssm.group_count", lo=1, hi=MAX_DIM), recurrent=recurrent)
    if ssm.d_inner != ssm.n_v_heads * ssm.d_state or ssm.n_v_heads % ssm.n_k_heads or ssm.d_conv < 1:
        raise MetadataError(f"ssm keys do not fit together: inner_size {ssm.d_inner} must be time_step_rank "
                            f"{ssm.n_v_heads} x state_size {ssm.d_state}, time_step_rank a multiple of group_count "
                            f"{ssm.n_k_heads}, conv_kernel {ssm.d_conv} positive")
    return ssm
