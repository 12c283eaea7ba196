"""Shared fixtures: the two real models, llama.cpp's reference outputs, CPU sessions."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from framework.model.default import model_path  # noqa: F401 (the tests import it from here)

# llama.cpp's outputs for both models, kept in the repository (tests/reference/README.md says how they were made)
REF_DIR = Path(__file__).resolve().parent / "reference"
MODELS = ("smollm2", "gemma3")


@lru_cache(maxsize=None)
def load_model(name: str):
    """One Model per name for the whole run (weights stay memory-mapped)."""
    from framework.model.model import Model
    return Model(model_path(name))


@lru_cache(maxsize=None)
def reference(name: str) -> tuple[dict, dict]:
    if not REF_DIR.is_dir():
        pytest.fail(f"llama.cpp's reference outputs are missing: expected {REF_DIR}")
    ref = json.loads((REF_DIR / f"{name}.json").read_text(encoding="utf-8"))
    arrays = dict(np.load(REF_DIR / f"{name}.npz"))
    return ref, arrays


def reference_text(ref: dict) -> str:
    # read_bytes keeps the file's exact newlines (text mode would translate \r\n)
    return (REF_DIR / ref["text"]["text_file"]).read_bytes().decode("utf-8")


@pytest.fixture(scope="session")
def registry():
    from framework.core.registry import default_registry
    return default_registry()
