"""framework: a plugin-based, ggml-style backend framework for GGUF language models."""

__version__ = "0.1.0"
