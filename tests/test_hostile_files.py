"""Hostile model files: every mutant of SmolLM2's GGUF is accepted or answered by a ModelFileError that
names the file, never by a raw exception, a hang or a memory blow-up (tests/gguf_mutants.py makes them;
benchmarks/fuzz_gguf.py runs 10,000)."""

from __future__ import annotations

import struct
import time

import gguf_mutants as G
import pytest

from framework.model.default import model_path
from framework.model.gguf_file import ModelFileError
from framework.model.model import Model

SEED = 20261201
N_MUTANTS = 200
SECONDS, MEMORY = 5.0, 2 << 30          # per file


@pytest.fixture(autouse=True)
def no_index_cache(monkeypatch):
    """Mutants are parsed afresh (an index cache would only add writes); tests/test_caches.py covers it."""
    monkeypatch.setenv("FRAMEWORK_CACHE", "off")


@pytest.fixture(scope="module")
def layout():
    return G.scan(model_path("smollm2"))


def test_mutants_are_accepted_or_named(layout, tmp_path):
    mutator = G.Mutator(layout, SEED)
    tally = G.Tally()
    t0 = time.perf_counter()
    with G.memoized_tokenizers():
        for i in range(N_MUTANTS):
            mutant = mutator.make()
            path = mutant.write(tmp_path / f"m{i}.gguf")
            tally.add(mutant, G.open_like_info(path, SECONDS, MEMORY))
            path.unlink()
    bad = {k: tally.examples[k] for k in ("raw", "hang", "memory", "unnamed") if tally.counts[k]}
    assert not bad, f"{dict(tally.counts)} in {time.perf_counter() - t0:.0f} s; examples: {bad}"
    # the mutants reach both sides: real errors, and files that still load
    assert tally.counts["named"] > N_MUTANTS // 2 and tally.counts["accepted"] > 0, dict(tally.counts)
    assert len(tally.by_kind) >= 15, sorted(tally.by_kind)


def test_mutants_info_accepts_run_or_are_named_through_the_cli(layout, tmp_path):
    """The CLI path: mutants that load, through `framework run -m FILE -n 1 hi` in-process, with the real
    tensor data (two here: each run unpacks every weight; the benchmark runs hundreds)."""
    mutator = G.Mutator(layout, SEED + 1)
    outcomes = []
    with G.memoized_tokenizers():
        while len(outcomes) < 2:
            mutant = mutator.make()
            path = mutant.write(tmp_path / "m.gguf")
            if G.open_like_info(path, SECONDS, MEMORY).kind == "accepted":
                mutant.write(path, layout, real_body=True)
                outcomes.append((mutant.detail, G.run_cli(path, 120, 4 << 30)))
            path.unlink()
    assert all(o.kind in ("ran", "ran_other", "named") for _, o in outcomes), outcomes


# -- the cases measured before this hardening, each with what it says now ------------------------------
def _open(layout, tmp_path, header: bytes) -> str:
    path = tmp_path / "bad.gguf"
    G.Mutant("case", "", header, len(header) + layout.data_size).write(path)
    t0 = time.perf_counter()
    with pytest.raises(ModelFileError) as e:
        with G.limits(SECONDS, MEMORY):
            Model(path).tokenizer
    assert time.perf_counter() - t0 < SECONDS
    msg = str(e.value)
    assert str(path) in msg
    return msg


def _kv(layout, key, vtype, payload, add=False):
    kvs = [kv for kv in layout.kvs if kv.key != key] if add else layout.kvs
    kvs = kvs + [G.KV(key, vtype, payload)] if add else [G.KV(key, vtype, payload) if kv.key == key else kv
                                                           for kv in kvs]
    return layout.header(kvs=kvs)


@pytest.mark.parametrize("key,vtype,payload,words", [
    ("tokenizer.ggml.merges", G.INT32, G.scalar(G.INT32, 5), ("the integer 5", "an array of strings")),
    ("tokenizer.ggml.bos_token_id", G.ARRAY, G.array(G.INT32, [1, 2]), ("an array of 2 integers", "an integer")),
    ("llama.attention.head_count", G.UINT32, G.scalar(G.UINT32, 0), ("the integer 0", "from 1 to")),
    ("llama.attention.layer_norm_rms_epsilon", G.FLOAT32, G.scalar(G.FLOAT32, float("inf")),
     ("the number inf", "a finite number above 0 and below 1")),
    ("llama.attention.layer_norm_rms_epsilon", G.FLOAT32, G.scalar(G.FLOAT32, 2.0**40),
     ("1099511627776", "below 1")),
    ("llama.rope.freq_base", G.FLOAT32, G.scalar(G.FLOAT32, float("nan")), ("nan", "a finite number above 0")),
    ("llama.block_count", G.UINT64, G.scalar(G.UINT64, 2**31), ("2147483648", "from 1 to 4096")),
    ("llama.block_count", G.UINT64, G.scalar(G.UINT64, 2**40), ("1099511627776",)),
    ("llama.block_count", G.UINT32, G.scalar(G.UINT32, 31), ("says 31 layers", "holds tensors for 30")),
    ("llama.attention.head_count_kv", G.UINT32, G.scalar(G.UINT32, 4), ("not a multiple", "head_count_kv")),
    ("general.architecture", G.INT32, G.scalar(G.INT32, 7), ("general.architecture", "a string")),
    ("tokenizer.ggml.model", G.STRING, G.string("bert"), ("unsupported tokenizer model 'bert'",)),
    ("tokenizer.ggml.model", G.STRING, G.string("llama"), ("no byte-fallback token for", "of the 256 bytes")),
], ids=lambda v: v if isinstance(v, str) else "")
def test_bad_metadata_names_the_key_the_value_and_what_is_expected(layout, tmp_path, key, vtype, payload, words):
    msg = _open(layout, tmp_path, _kv(layout, key, vtype, payload))
    assert key.split(".")[-1] in msg or key in msg, msg
    for w in words:
        assert w in msg, (w, msg)


@pytest.mark.parametrize("length", [2**62, 2**40])
def test_absurd_array_length_fails_fast_naming_the_key(layout, tmp_path, length):
    kv = layout.kv("tokenizer.ggml.token_type")
    payload = struct.pack("<IQ", G.INT32, length) + kv.payload[12:]
    msg = _open(layout, tmp_path, _kv(layout, kv.key, G.ARRAY, payload))
    assert "'tokenizer.ggml.token_type'" in msg and f"an array of {length} INT32 values" in msg
    assert "truncated" in msg or "corrupt" in msg


@pytest.mark.parametrize("field,value", [("n_kv", 2**40), ("n_tensors", 2**62)])
def test_huge_counts_fail_fast(layout, tmp_path, field, value):
    msg = _open(layout, tmp_path, layout.header(**{field: value}))
    assert str(value) in msg


def test_a_weight_with_swapped_dimensions_names_the_tensor_and_both_shapes(layout, tmp_path):
    tensors = list(layout.tensors)
    i = next(i for i, t in enumerate(tensors) if t.name == b"blk.1.attn_k.weight")
    t = tensors[i]
    tensors[i] = G.TensorInfo(t.name, [t.dims[1], t.dims[0]], t.ttype, t.offset)
    msg = _open(layout, tmp_path, layout.header(tensors=tensors))
    assert "'blk.1.attn_k.weight'" in msg and "shape [576, 192]" in msg and "needs [192, 576]" in msg
    assert "n_head_kv*head_dim = 3*64" in msg


def test_extra_tensors_are_reported_not_refused(layout, tmp_path):
    tensors = list(layout.tensors)
    i = next(i for i, t in enumerate(tensors) if t.name == b"output_norm.weight")
    tensors.append(G.TensorInfo(b"token_types.weight", list(tensors[i].dims), tensors[i].ttype,
                                tensors[i].offset))
    # the extra entry shares output_norm's bytes: give output_norm a copy at the end of the data instead
    path = tmp_path / "extra.gguf"
    end = -(-layout.data_size // 32) * 32
    tensors[i] = G.TensorInfo(b"output_norm.weight", tensors[i].dims, tensors[i].ttype, end)
    header = layout.header(tensors=tensors)
    G.Mutant("extra", "", header, len(header) + end + 576 * 4).write(path)
    model = Model(path)
    assert model.notes and "token_types.weight" in model.notes[0] and "does not use" in model.notes[0]


def test_framework_serve_reports_extra_tensors_too(tmp_path, monkeypatch):
    """`serve` says them as `run` does (a tiny qwen3 with one tensor more; reserved, nothing loaded)."""
    import numpy as np
    import tiny_models as T

    from framework.plugins.cpu.device import CpuDevice
    from framework.serve.models import load_models
    real = T._tensors
    monkeypatch.setattr(T, "_tensors", lambda spec, n: real(spec, n) + [("extra_head.weight",
                                                                         np.ones(8, np.float32), None)])
    path = T.write("qwen3", tmp_path / "extra.gguf")
    said = []
    load_models([str(path)], [CpuDevice()], n_ctx=32, n_batch=16, parallel=1, max_queue=1,
                say=said.append)
    assert any(line.startswith("note: ") and "extra_head.weight" in line and "does not use" in line
               for line in said), said


# -- every architecture's weights against its hyper-parameters (tiny models) ----------------------------
@pytest.fixture(scope="module")
def tiny_layouts(tmp_path_factory):
    import tiny_models as T
    folder = tmp_path_factory.mktemp("tiny")
    return {a: G.scan(T.write(a, folder / f"{a}.gguf")) for a in ("qwen2", "qwen3", "qwen35", "llama", "gemma4")}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen35", "gemma4"])
def test_mutants_of_other_architectures_are_accepted_or_named(tiny_layouts, tmp_path, arch):
    """The same on tiny models of the other architectures and vocabularies (Llama 3's and Qwen's BPE, the
    hybrid's ssm keys and weights): 100 mutants each, about 2 s."""
    mutator = G.Mutator(tiny_layouts[arch], SEED + 2)
    tally = G.Tally()
    with G.memoized_tokenizers():
        for _ in range(100):
            mutant = mutator.make()
            tally.add(mutant, G.open_like_info(mutant.write(tmp_path / "m.gguf"), SECONDS, MEMORY))
    bad = {k: tally.examples[k] for k in ("raw", "hang", "memory", "unnamed") if tally.counts[k]}
    assert not bad, f"{dict(tally.counts)}; examples: {bad}"
    assert tally.counts["named"] > 50 and tally.counts["accepted"] > 0, dict(tally.counts)


def _with_dims(layout, tmp_path, name: bytes, dims: list[int]) -> str:
    tensors = [G.TensorInfo(t.name, dims, t.ttype, t.offset) if t.name == name else t for t in layout.tensors]
    assert tensors != layout.tensors, name
    return _open(layout, tmp_path, layout.header(tensors=tensors))


@pytest.mark.parametrize("arch,name,words", [
    ("qwen2", "blk.1.attn_k.bias", ("the rows of attn_k.weight",)),
    ("qwen3", "blk.0.attn_q_norm.weight", ("head_dim",)),
    ("qwen35", "blk.0.ssm_conv1d.weight", ("conv channels", "conv_kernel = 4")),
    ("qwen35", "blk.1.ssm_a", ("time_step_rank = 4",)),
    ("qwen35", "blk.2.ssm_out.weight", ("inner_size = 128",)),
    ("qwen35", "blk.3.attn_q.weight", ("Q and its gate",)),
    ("llama", "rope_freqs.weight", ("n_rot / 2",)),
    ("llama", "blk.1.ffn_down.weight", ("n_embd, n_ff",)),
    ("gemma4", "blk.1.attn_q.weight", ("layer 1: 4 heads of",)),
    ("gemma4", "blk.0.attn_k_norm.weight", ("layer 0's head size",)),
])
def test_every_architecture_checks_its_weights_shapes(tiny_layouts, tmp_path, arch, name, words):
    """A weight whose shape does not follow from the hyper-parameters (2-D: dimensions swapped; 1-D: made
    2-D with as many elements, so its bytes stay where they were) is named with the shape found and the
    shape needed."""
    layout = tiny_layouts[arch]
    t = next(t for t in layout.tensors if t.name == name.encode())
    dims = t.dims[::-1] if len(t.dims) == 2 else [t.dims[0] // 2, 2]
    msg = _with_dims(layout, tmp_path, t.name, dims)
    found, need = list(reversed(dims)), list(reversed(t.dims))
    assert f"tensor '{name}' has shape {found}" in msg and f"needs {need}" in msg and f"{arch} architecture" in msg
    for w in words:
        assert w in msg, (w, msg)


def test_a_missing_linear_attention_weight_is_named_with_its_shape(tiny_layouts, tmp_path):
    layout = tiny_layouts["qwen35"]
    tensors = [G.TensorInfo(b"blk.0.ssm_b", t.dims, t.ttype, t.offset) if t.name == b"blk.0.ssm_a" else t
               for t in layout.tensors]
    msg = _open(layout, tmp_path, layout.header(tensors=tensors))
    assert "tensor 'blk.0.ssm_a' is missing; the qwen35 architecture needs it with shape [4]" in msg


@pytest.mark.parametrize("key,vtype,payload,shown", [
    ("tokenizer.ggml.tokens", G.FLOAT32, G.scalar(G.FLOAT32, 1.5), "tokens: the number 1.5; not usable here"),
    ("general.architecture", G.INT32, G.scalar(G.INT32, 7), "architecture  (the integer 7), NOT SUPPORTED"),
    ("general.name", G.ARRAY, G.array(G.INT32, [1, 2, 3]), "name          (an array of 3 integers)"),
    ("tokenizer.ggml.model", G.UINT8, G.scalar(G.UINT8, 3), "tokenizer     (the integer 3) (pre: smollm)"),
], ids=lambda v: v if isinstance(v, str) and "." in v else "")
def test_framework_info_describes_a_file_with_wrong_types(layout, tmp_path, capsys, key, vtype, payload, shown):
    """`framework info` describes what it can of a broken file (it is how one looks into one), and says
    what is wrong, with exit 0, never a traceback."""
    from framework.cli.main import main
    path = tmp_path / "bad.gguf"
    header = _kv(layout, key, vtype, payload)
    G.Mutant("case", "", header, len(header) + layout.data_size).write(path)
    rc = main(["info", "-m", str(path)])
    out, err = capsys.readouterr()
    assert rc == 0 and "Traceback" not in err, err
    assert f"file          {path}" in out and "tensors       272" in out and shown in out, out
