"""A loaded model: its file, hyper-parameters, architecture and tokenizer."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from ..core.graph import Graph, GraphBuilder
from .arch import ARCHITECTURES, Architecture, StepInputs
from .arch.base import KVCache, MissingWeightError
from .gguf_file import ModelFile, ModelFileError, open_model_file
from .hparams import MetadataError


class Model:
    def __init__(self, path: str | Path):
        self.file: ModelFile = open_model_file(path)
        name = self.file.architecture
        cls = ARCHITECTURES.get(name)
        if cls is None:
            raise ModelFileError(f"{self.file.path}: architecture '{name}' is not supported; supported: "
                                 f"{', '.join(sorted(ARCHITECTURES))}")
        try:
            hp = cls.read_hparams(self.file.metadata)
            self.arch: Architecture = cls(self.file, hp)
            self.arch.check_weights()
        except (MetadataError, MissingWeightError) as e:
            raise ModelFileError(f"{self.file.path}: {e}") from None
        self.hp = hp

    @property
    def name(self) -> str:
        return str(self.file.metadata.get("general.name", self.file.path.name))

    @cached_property
    def tokenizer(self):
        from .tokenizer import tokenizer_from_metadata
        return tokenizer_from_metadata(self.file.metadata)

    def build_step(self, n_tokens: int, n_kv: int, n_out: int | None, cache: KVCache,
                   n_layers: int | None = None, hidden: bool = False) -> tuple[Graph, StepInputs]:
        """The graph of one step: n_tokens new tokens attending over n_kv cache rows; logits for
        n_out rows chosen by the out_ids input (None: every row). hidden: a second output, the hidden
        state of those rows that the head reads (llama.cpp's h_nextn, which an MTP draft continues from)."""
        b = GraphBuilder()
        inp = self.arch.make_inputs(b, n_tokens, n_kv, n_out)
        if n_layers is not None and not 1 <= n_layers <= self.hp.n_layer:
            raise ValueError(f"n_layers must be between 1 and {self.hp.n_layer} for {self.name}, got {n_layers}")
        logits = self.arch.build(b, inp, cache, n_layers)
        graph = b.build([logits, inp.hidden] if hidden else [logits])
        graph.meta.update(arch=self.arch.name, n_tokens=n_tokens, n_kv=n_kv, n_out=n_out or n_tokens,
                          n_layers=n_layers or self.hp.n_layer)
        return graph, inp

    def weight_bytes(self, tensor) -> "object":
        return self.arch.tensor_bytes(tensor)
