"""Running a model: sessions (KV cache, prefill, decode), sampling, generation."""
