"""A loaded model: its file, hyper-parameters, architecture and tokenizer."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

from ..core.graph import Graph, GraphBuilder
from .arch import ARCHITECTURES, Architecture, StepInputs
from .arch.base import KVCache, WeightError
from .gguf_file import ModelFile, ModelFileError, open_model_file
from .metadata import MetadataError, get_str
from .tokenizer import TokenizerError


class Model:
    def __init__(self, path: str | Path):
        self.file: ModelFile = open_model_file(path)
        self.notes: list[str] = []          # what loaded but deserves a line (tensors no graph reads)
        try:
            name = get_str(self.file.metadata, "general.architecture")
        except MetadataError as e:
            raise ModelFileError(f"{self.file.path}: {e}") from None
        cls = ARCHITECTURES.get(name)
        if cls is None:
            raise ModelFileError(f"{self.file.path}: architecture '{name}' is not supported; supported: "
                                 f"{', '.join(sorted(ARCHITECTURES))}")
        try:
            hp = cls.read_hparams(self.file.metadata, _blocks(self.file))
            self.arch: Architecture = cls(self.file, hp)
            extra = self.arch.check_weights()
        except (MetadataError, WeightError) as e:
            raise ModelFileError(f"{self.file.path}: {e}") from None
        if extra:
            shown = ", ".join(extra[:8]) + (f" and {len(extra) - 8} more" if len(extra) > 8 else "")
            self.notes.append(f"{self.file.path.name}: {len(extra)} tensors the {name} architecture does not use "
                              f"(ignored): {shown}")
        self.hp = hp

    @property
    def name(self) -> str:
        value = self.file.metadata.get("general.name")
        return value if isinstance(value, str) and value else self.file.path.name

    @cached_property
    def tokenizer(self):
        from .tokenizer import tokenizer_from_metadata
        try:
            return tokenizer_from_metadata(self.file.metadata)
        except (MetadataError, TokenizerError) as e:
            raise ModelFileError(f"{self.file.path}: {e}") from None

    def build_step(self, n_tokens: int, n_kv: int, n_out: int | None, cache: KVCache,
                   n_layers: int | None = None, hidden: bool = False,
                   greedy: bool = False) -> tuple[Graph, StepInputs]:
        """The graph of one step: n_tokens new tokens attending over n_kv cache rows; logits for
        n_out rows chosen by the out_ids input (None: every row), or with greedy each row's argmax (ARGMAX:
        greedy sampling where the logits are made). hidden: a second output, the hidden state of those rows
        that the head reads (llama.cpp's h_nextn, which an MTP draft continues from)."""
        b = GraphBuilder()
        inp = self.arch.make_inputs(b, n_tokens, n_kv, n_out)
        if n_layers is not None and not 1 <= n_layers <= self.hp.n_layer:
            raise ValueError(f"n_layers must be between 1 and {self.hp.n_layer} for {self.name}, got {n_layers}")
        logits = self.arch.build(b, inp, cache, n_layers)
        out = b.argmax(logits) if greedy else logits
        graph = b.build([out, inp.hidden] if hidden else [out])
        graph.meta.update(arch=self.arch.name, n_tokens=n_tokens, n_kv=n_kv, n_out=n_out or n_tokens,
                          n_layers=n_layers or self.hp.n_layer)
        return graph, inp

    def weight_bytes(self, tensor) -> "object":
        return self.arch.tensor_bytes(tensor)


def _blocks(file: ModelFile) -> int:
    """Layers whose tensors the file holds: one more than the highest N of its blk.N.* tensors."""
    top = -1
    for name in file.tensors:
        part = name.split(".", 2)
        if len(part) == 3 and part[0] == "blk" and part[1].isascii() and part[1].isdigit():
            top = max(top, int(part[1]))
    return top + 1
