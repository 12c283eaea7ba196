"""The random-weight files that benchmarks/llama_vulkan_h200.sh gives llama.cpp's llama-bench: the model's
shapes and types, and a placeholder vocabulary of the model's size (llama.cpp refuses a file without one,
and llama-bench draws token ids below its size). The benchmark itself runs on the H200 machine only."""

import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from vulkan_bench import write_model  # noqa: E402

N_VOCAB = 300


def tiny_spec(n_vocab: int) -> dict:
    return {"file": "tiny.gguf",
            "metadata": {"general.architecture": "llama", "llama.block_count": 1, "llama.embedding_length": 64,
                         "llama.vocab_size": n_vocab, "llama.rope.freq_base": 10000.0},
            "tensors": [["token_embd.weight", "Q8_0", [n_vocab, 64]], ["output_norm.weight", "F32", [64]]]}


def field(reader: GGUFReader, key: str):
    f = reader.fields[key]
    return [f.contents(i) for i in range(len(f.data))] if len(f.data) > 1 else f.contents()


def test_a_placeholder_vocabulary_has_the_models_size_and_distinct_pieces(tmp_path):
    path = write_model("tiny", tiny_spec(N_VOCAB), tmp_path / "tiny.gguf", np.random.default_rng(0), vocab=True)
    r = GGUFReader(path)
    tokens = field(r, "tokenizer.ggml.tokens")
    assert field(r, "tokenizer.ggml.model") == "llama"
    assert len(tokens) == N_VOCAB == len(set(tokens))               # llama.cpp maps pieces to ids
    assert len(field(r, "tokenizer.ggml.scores")) == len(field(r, "tokenizer.ggml.token_type")) == N_VOCAB
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and field(r, "tokenizer.ggml.bos_token_id") == 1
    assert "<0x0A>" in tokens                                       # the newline byte llama.cpp looks up
    assert r.get_tensor(0).shape.tolist()[::-1] == [N_VOCAB, 64]    # the output rows match the vocabulary


def test_without_vocab_the_file_has_none_and_a_too_small_vocabulary_is_refused(tmp_path):
    path = write_model("tiny", tiny_spec(N_VOCAB), tmp_path / "plain.gguf", np.random.default_rng(0))
    assert "tokenizer.ggml.tokens" not in GGUFReader(path).fields
    with pytest.raises(ValueError, match="at least 259 pieces.*vocab_size is 100"):
        write_model("tiny", tiny_spec(100), tmp_path / "small.gguf", np.random.default_rng(0), vocab=True)
