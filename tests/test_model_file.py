"""Bad model files: every ModelFileError names what is wrong (the path, the tensor, the bytes)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from framework.model.default import smollm2_path
from framework.model.gguf_file import ModelFileError, open_model_file
from framework.model.model import Model

Q = GGMLQuantizationType


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """A fresh index cache for every test, so a stale entry can never answer for a file."""
    cache = tmp_path / "framework-cache"
    monkeypatch.setenv("FRAMEWORK_CACHE", str(cache))
    return cache


def model_file_error(fn, *args) -> str:
    with pytest.raises(ModelFileError) as err:
        fn(*args)
    return str(err.value)


def write_gguf(path: Path, arch: str, tensors, kv: dict | None = None) -> Path:
    """tensors: (name, array, raw_shape, raw_dtype); kv: key -> value (ints, floats, strings)."""
    w = GGUFWriter(str(path), arch)
    for key, value in (kv or {}).items():
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, value)
    for name, arr, raw_shape, raw_dtype in tensors:
        w.add_tensor(name, arr, raw_shape=raw_shape, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def f32_tensor(name, *shape, seed=0):
    return (name, np.random.default_rng(seed).standard_normal(shape).astype(np.float32), None, None)


def q8_0_bytes(n_blocks: int) -> np.ndarray:
    return np.zeros(n_blocks * 34, dtype=np.uint8)   # 34 bytes hold 32 elements


# ---------------------------------------------------------------------------------------------
# not there, not GGUF, truncated
# ---------------------------------------------------------------------------------------------

def test_missing_file(tmp_path):
    path = tmp_path / "nowhere" / "model.gguf"
    msg = model_file_error(open_model_file, path)
    assert str(path) in msg and "not found" in msg
    assert str(path) in model_file_error(Model, path)


def test_directory_is_not_a_model_file(tmp_path):
    assert str(tmp_path) in model_file_error(open_model_file, tmp_path)


def test_not_gguf(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    msg = model_file_error(open_model_file, path)
    assert str(path) in msg and "not a GGUF file" in msg
    assert repr(b"\x89PNG") in msg and "GGUF" in msg
    path.write_bytes(b"GG")                               # shorter than the magic
    assert repr(b"GG") in model_file_error(open_model_file, path)


def _truncated_copy(tmp_path: Path, n: int) -> Path:
    out = tmp_path / f"cut-{n}.gguf"
    with open(smollm2_path(), "rb") as src, open(out, "wb") as dst:
        remaining = n
        while remaining:
            chunk = src.read(min(remaining, 1 << 22))
            assert chunk
            dst.write(chunk)
            remaining -= len(chunk)
    assert out.stat().st_size == n
    return out


@pytest.fixture(scope="module")
def smollm2_layout(tmp_path_factory):
    """(file size, tensors ordered by offset) of the intact SmolLM2 file, indexed in a private cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRAMEWORK_CACHE", str(tmp_path_factory.mktemp("smollm2-cache")))
        mf = open_model_file(smollm2_path())
    return mf.path.stat().st_size, sorted(mf.tensors.values(), key=lambda e: e.offset)


def test_intact_smollm2_opens(smollm2_layout):
    size, ordered = smollm2_layout
    last = ordered[-1]
    assert last.offset + last.nbytes <= size
    assert len(ordered) == 272


@pytest.fixture(scope="module")
def cut_in_tensor_data(tmp_path_factory, smollm2_layout):
    """(path, size, last tensor, message) for SmolLM2 cut half-way through its last tensor's data.
    Parsing fails before anything is cached, so the message is computed once for both tests."""
    _, ordered = smollm2_layout
    last = ordered[-1]
    n = last.offset + last.nbytes // 2
    path = _truncated_copy(tmp_path_factory.mktemp("cut"), n)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FRAMEWORK_CACHE", str(tmp_path_factory.mktemp("cut-cache")))
        msg = model_file_error(open_model_file, path)
    path.unlink()                                         # ~98 MB: do not leave it in the tmp dirs pytest keeps
    return path, n, last, msg


def test_truncated_inside_tensor_data_says_truncated(cut_in_tensor_data):
    """What holds today: a cut inside tensor data is reported as truncated, naming the path and size."""
    path, n, _, msg = cut_in_tensor_data
    assert str(path) in msg and "truncated" in msg and f"{n} bytes" in msg


def test_truncated_inside_tensor_data_names_last_tensor(cut_in_tensor_data):
    path, _, last, msg = cut_in_tensor_data
    assert f"'{last.name}'" in msg and f"offset {last.offset}" in msg


@pytest.mark.parametrize("cut", [10, 4096, 500_000])
def test_truncated_inside_metadata(tmp_path, smollm2_layout, cut):
    _, ordered = smollm2_layout
    assert cut < ordered[0].offset                       # before the first tensor's data
    path = _truncated_copy(tmp_path, cut)
    msg = model_file_error(open_model_file, path)
    assert str(path) in msg
    assert "truncated" in msg or "corrupt" in msg


# ---------------------------------------------------------------------------------------------
# tensors whose bytes do not add up, or that no decoder here reads
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("declared_blocks", [4, 9], ids=["fewer", "more"])
def test_tensor_size_mismatch(tmp_path, declared_blocks):
    """8 Q8_0 blocks (272 bytes, 288 with padding) stored, a shape of 4 or 9 blocks declared."""
    path = write_gguf(tmp_path / "bad.gguf", "llama", [
        ("blk.0.attn_q.weight", q8_0_bytes(8), (1, 34 * declared_blocks), Q.Q8_0),
        f32_tensor("output_norm.weight", 8),
    ])
    msg = model_file_error(open_model_file, path)
    implied = 34 * declared_blocks
    held = 288                                          # up to the next tensor, padding included
    offset = _offset_of(path, "blk.0.attn_q.weight")
    assert str(path) in msg
    assert "'blk.0.attn_q.weight'" in msg
    assert f"offset {offset}" in msg
    assert f"holds {held} bytes" in msg
    assert f"implies {implied} bytes" in msg
    assert f"remainder is {held - implied} bytes" in msg
    assert "Q8_0" in msg and f"[1, {32 * declared_blocks}]" in msg


def test_tensor_size_mismatch_last_tensor(tmp_path):
    path = write_gguf(tmp_path / "bad.gguf", "llama", [
        f32_tensor("output_norm.weight", 8),
        ("blk.0.attn_q.weight", q8_0_bytes(8), (1, 34 * 4), Q.Q8_0),
    ])
    msg = model_file_error(open_model_file, path)
    assert "'blk.0.attn_q.weight'" in msg and "implies 136 bytes" in msg


def test_consistent_small_file_opens(tmp_path):
    """The control for the cases above: the same layout with matching shapes is accepted."""
    path = write_gguf(tmp_path / "good.gguf", "llama", [
        ("blk.0.attn_q.weight", q8_0_bytes(8), (1, 34 * 8), Q.Q8_0),
        f32_tensor("output_norm.weight", 8),
    ])
    mf = open_model_file(path)
    q = mf.tensors["blk.0.attn_q.weight"]
    assert q.shape == (1, 256) and q.dtype == Q.Q8_0 and q.nbytes == 272
    assert mf.tensor_bytes("blk.0.attn_q.weight").size == 272
    np.testing.assert_array_equal(mf.tensor_bytes("output_norm.weight").view(np.float32),
                                  f32_tensor("output_norm.weight", 8)[1])


def _offset_of(path: Path, name: str) -> int:
    """The tensor's absolute data offset, read independently of the framework."""
    from gguf import GGUFReader
    reader = GGUFReader(path)
    for t in reader.tensors:
        if t.name == name:
            return int(t.data_offset)
    raise AssertionError(f"{name} not in {path}")


@pytest.mark.parametrize("qtype,block_bytes", [(Q.IQ2_XXS, 66), (Q.Q8_K, 292)], ids=["IQ2_XXS", "Q8_K"])
def test_unsupported_tensor_type(tmp_path, qtype, block_bytes):
    path = write_gguf(tmp_path / "iq.gguf", "llama", [
        f32_tensor("output_norm.weight", 8),
        ("blk.0.ffn_down.weight", np.zeros(2 * block_bytes, dtype=np.uint8), (2, block_bytes), qtype),
    ])
    msg = model_file_error(open_model_file, path)
    assert str(path) in msg and "'blk.0.ffn_down.weight'" in msg and qtype.name in msg
    assert "Q4_K" in msg                                  # and what is supported
    assert "'blk.0.ffn_down.weight'" in model_file_error(Model, path)


# ---------------------------------------------------------------------------------------------
# Model: architecture and weights
# ---------------------------------------------------------------------------------------------

N_EMBD, N_HEAD, N_FF, N_VOCAB, N_LAYER = 32, 4, 64, 16, 2
LLAMA_KV = {
    "llama.context_length": 128, "llama.embedding_length": N_EMBD, "llama.block_count": N_LAYER,
    "llama.feed_forward_length": N_FF, "llama.attention.head_count": N_HEAD,
    "llama.attention.head_count_kv": 2, "llama.attention.layer_norm_rms_epsilon": 1e-5,
    "llama.vocab_size": N_VOCAB,
}


def llama_tensors(skip: str | None = None):
    kv_dim = 2 * (N_EMBD // N_HEAD)
    shapes = {"token_embd.weight": (N_VOCAB, N_EMBD), "output_norm.weight": (N_EMBD,)}
    for il in range(N_LAYER):
        p = f"blk.{il}."
        shapes.update({p + "attn_norm.weight": (N_EMBD,), p + "attn_q.weight": (N_EMBD, N_EMBD),
                       p + "attn_k.weight": (kv_dim, N_EMBD), p + "attn_v.weight": (kv_dim, N_EMBD),
                       p + "attn_output.weight": (N_EMBD, N_EMBD), p + "ffn_norm.weight": (N_EMBD,),
                       p + "ffn_gate.weight": (N_FF, N_EMBD), p + "ffn_up.weight": (N_FF, N_EMBD),
                       p + "ffn_down.weight": (N_EMBD, N_FF)})
    return [f32_tensor(name, *shape, seed=i) for i, (name, shape) in enumerate(shapes.items()) if name != skip]


def test_tiny_llama_loads_and_builds(tmp_path):
    """The control for the Model cases below: a complete tiny llama file loads and builds a step."""
    from framework.model.arch.base import KVCache
    model = Model(write_gguf(tmp_path / "tiny.gguf", "llama", llama_tensors(), LLAMA_KV))
    assert model.hp.n_layer == N_LAYER and model.hp.n_vocab == N_VOCAB and model.hp.n_head_kv == 2
    graph, _ = model.build_step(2, 8, None, KVCache(model.hp, 8))
    assert graph.outputs[0].shape == (2, N_VOCAB)


def test_unknown_architecture(tmp_path):
    path = write_gguf(tmp_path / "mamba.gguf", "mamba9", [f32_tensor("token_embd.weight", 4, 8)])
    assert open_model_file(path).architecture == "mamba9"      # the file itself is fine
    msg = model_file_error(Model, path)
    assert str(path) in msg and "'mamba9'" in msg
    assert "gemma3" in msg and "llama" in msg


@pytest.mark.parametrize("missing", ["blk.1.ffn_up.weight", "output_norm.weight", "blk.0.attn_q.weight"])
def test_missing_weight(tmp_path, missing):
    path = write_gguf(tmp_path / "tiny.gguf", "llama", llama_tensors(skip=missing), LLAMA_KV)
    msg = model_file_error(Model, path)
    assert str(path) in msg and f"'{missing}'" in msg and "missing" in msg and "llama" in msg


def test_missing_metadata_key(tmp_path):
    kv = {k: v for k, v in LLAMA_KV.items() if k != "llama.block_count"}
    path = write_gguf(tmp_path / "tiny.gguf", "llama", llama_tensors(), kv)
    msg = model_file_error(Model, path)
    assert str(path) in msg and "llama.block_count" in msg


def test_index_cache_is_used_and_keyed_by_file(tmp_path, private_cache):
    """Opening writes an index under FRAMEWORK_CACHE; rewriting the file with other contents is
    never answered from the old index."""
    path = write_gguf(tmp_path / "m.gguf", "llama", [f32_tensor("a", 8)])
    assert open_model_file(path).tensors["a"].shape == (8,)
    assert list((private_cache / "gguf-index").glob("*.json"))
    write_gguf(path, "llama", [f32_tensor("a", 4, 8), f32_tensor("b", 32)])
    mf = open_model_file(path)
    assert mf.tensors["a"].shape == (4, 8) and "b" in mf.tensors
