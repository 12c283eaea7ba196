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
