"""Hyper-parameters read from GGUF metadata, with llama.cpp's defaults where a key is absent."""

from __future__ import annotations

from dataclasses import dataclass


class MetadataError(ValueError):
    """A metadata key the architecture needs is missing or malformed."""


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


def _get(meta: dict, key: str, default=None, cast=float):
    if key in meta:
        try:
            return cast(meta[key])
        except (TypeError, ValueError):
            raise MetadataError(f"metadata key '{key}' = {meta[key]!r} is not a {cast.__name__}") from None
    if default is None:
        raise MetadataError(f"metadata key '{key}' is missing; the architecture needs it")
    return default


def read_hparams(meta: dict, swa_pattern: int = 0, rope_base_swa: float | None = None) -> HParams:
    """Common keys under the `{arch}.` prefix. swa_pattern N: every Nth layer is global, the rest
    use the sliding window (llama.cpp's set_swa_pattern)."""
    arch = str(meta["general.architecture"])
    p = f"{arch}."
    n_embd = _get(meta, p + "embedding_length", cast=int)
    n_head = _get(meta, p + "attention.head_count", cast=int)
    head_dim = _get(meta, p + "attention.key_length", n_embd // n_head, cast=int)
    n_layer = _get(meta, p + "block_count", cast=int)
    window = _get(meta, p + "attention.sliding_window", 0, cast=int) if swa_pattern else 0
    swa = tuple(bool(window) and (il + 1) % swa_pattern != 0 for il in range(n_layer))
    rope_base = _get(meta, p + "rope.freq_base", 10000.0)
    n_vocab = len(meta.get("tokenizer.ggml.tokens", ())) or _get(meta, p + "vocab_size", cast=int)
    return HParams(
        arch=arch, n_vocab=n_vocab, n_ctx_train=_get(meta, p + "context_length", cast=int), n_embd=n_embd,
        n_layer=n_layer, n_ff=_get(meta, p + "feed_forward_length", cast=int), n_head=n_head,
        n_head_kv=_get(meta, p + "attention.head_count_kv", n_head, cast=int), head_dim=head_dim,
        rms_eps=_get(meta, p + "attention.layer_norm_rms_epsilon"), rope_base=rope_base,
        rope_base_swa=rope_base if rope_base_swa is None else rope_base_swa,
        n_rot=_get(meta, p + "rope.dimension_count", head_dim, cast=int), sliding_window=window, swa_layers=swa)


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
    p = f"{meta['general.architecture']}."
    layers = meta.get(p + "attention.recurrent_layers")
    if layers is not None:
        recurrent = tuple(bool(x) for x in layers)[:n_layer]
        if len(recurrent) != n_layer:
            raise MetadataError(f"metadata key '{p}attention.recurrent_layers' has {len(recurrent)} entries, "
                                f"the model has {n_layer} layers")
    else:
        interval = _get(meta, p + "full_attention_interval", 4, cast=int)
        if interval < 1:
            raise MetadataError(f"metadata key '{p}full_attention_interval' = {interval} is not positive")
        recurrent = tuple((il + 1) % interval != 0 for il in range(n_layer))
    ssm = SSMParams(d_conv=_get(meta, p + "ssm.conv_kernel", cast=int),
                    d_inner=_get(meta, p + "ssm.inner_size", cast=int),
                    d_state=_get(meta, p + "ssm.state_size", cast=int),
                    n_v_heads=_get(meta, p + "ssm.time_step_rank", cast=int),
                    n_k_heads=_get(meta, p + "ssm.group_count", cast=int), recurrent=recurrent)
    if ssm.d_inner != ssm.n_v_heads * ssm.d_state or ssm.n_v_heads % ssm.n_k_heads or ssm.d_conv < 1:
        raise MetadataError(f"ssm keys do not fit together: inner_size {ssm.d_inner} must be time_step_rank "
                            f"{ssm.n_v_heads} x state_size {ssm.d_state}, time_step_rank a multiple of group_count "
                            f"{ssm.n_k_heads}, conv_kernel {ssm.d_conv} positive")
    return ssm
