"""Architectures: each builds the graph of one step the way llama.cpp's src/models/*.cpp do."""

from __future__ import annotations

from .base import Architecture, StepInputs
from .gemma3 import Gemma3
from .gemma4 import Gemma4, Gemma4Assistant
from .llama import Llama
from .qwen2 import Qwen2
from .qwen3 import Qwen3
from .qwen35 import Qwen35

ARCHITECTURES: dict[str, type[Architecture]] = {"llama": Llama, "gemma3": Gemma3, "qwen2": Qwen2, "qwen3": Qwen3,
                                                 "qwen35": Qwen35, "gemma4": Gemma4,
                                                 "gemma4-assistant": Gemma4Assistant}

__all__ = ["ARCHITECTURES", "Architecture", "StepInputs"]
