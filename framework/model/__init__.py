"""Model files: GGUF reading and checking, hyper-parameters, tokenizers, architectures."""
