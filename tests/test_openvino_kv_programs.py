"""openvino:CPU runs a step at every KV length on one compiled model (kv_programs.py): the first KV length on a
model of fixed shapes, and once a second is met, every length on one model whose KV length is dynamic (the first
length's model freed), with the same logits as a model per length; a fragment whose KV length shows anywhere but
its attentions' views and masks keeps a model per length; two models whose tensors are named alike never share
one."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import tiny_models

from framework.contract import LeafKind
from framework.model.model import Model
from framework.plugins.openvino_npu.device import OpenVinoDevice
from framework.plugins.openvino_npu.kv_programs import KV_PROGRAMS_ENV, family_key, kv_length
from framework.runtime.context import KV_PAD, padded_rows
from framework.runtime.session import Session

pytest.importorskip("openvino")
PROMPT = KV_PAD - 4            # decode crosses from a KV length of KV_PAD to 2 * KV_PAD after 4 steps
DECODE = 8


@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory) -> Model:
    return Model(tiny_models.write("qwen2", tmp_path_factory.mktemp("kvprog") / "tiny-qwen2.gguf"))


@pytest.fixture(autouse=True)
def _free_compiled_models():
    yield
    gc.collect()


def decode(model: Model, mode: str, monkeypatch, device: OpenVinoDevice | None = None):
    """Logits of a prompt of PROMPT tokens and DECODE greedy steps, on a fresh openvino:CPU (its own stats)."""
    monkeypatch.setenv(KV_PROGRAMS_ENV, mode)
    dev = device or OpenVinoDevice("CPU", cache_dir=None)
    s = Session(model, [dev], n_ctx=2 * KV_PAD)
    rng = np.random.default_rng(5)
    out = [s.eval([int(t) for t in rng.integers(20, 200, PROMPT)])]
    for _ in range(DECODE):
        out.append(s.eval([int(np.argmax(out[-1]))]))
    return out, dev, s


def decoding(s: Session, tokens: int = 1) -> list:
    """The session's programs of steps of that many tokens (one: decode)."""
    return [p for p in s.executor.programs.values() if p.fragment.nodes[0].shape[0] == tokens]


def test_decode_at_two_kv_lengths_runs_on_one_compiled_model_with_the_same_logits(tiny_qwen2, monkeypatch):
    per_length, d1, s1 = decode(tiny_qwen2, "per_length", monkeypatch)
    shared, d2, s = decode(tiny_qwen2, "shared", monkeypatch)
    assert d1.stats.compiled == 3 and d1.stats.shared == 0          # the prompt, decode at 256, decode at 512
    # the prompt, decode at 256 (fixed shapes), then at 512 one model for every length, which 256's takes too
    assert d2.stats.compiled == 3 and d2.stats.shared == 1
    gc.collect()
    assert d1.stats.live == 3 and d2.stats.live == 2                # the fixed model of 256 is freed
    decode_programs = decoding(s)
    assert sorted(p.kv for p in decode_programs) == [KV_PAD, 2 * KV_PAD]
    assert decode_programs[0].family is decode_programs[1].family
    assert any(f.kind == "kv_window" for f in decode_programs[0].translation.feeds)
    assert "1 more step shape ran on them (one model for every KV length)" in d2.compile_summary()
    assert "more step shape" not in d1.compile_summary()
    # reservation's count of the models' own memory (a copy of their weights each): the models compiled here
    one = sum(d2.weight_nbytes(t) for t in decode_programs[0].fragment.inputs if t.kind == LeafKind.WEIGHT)
    assert one > 0
    for dev, sess, mode, models in ((d2, s, "shared", 2), (d1, s1, "per_length", 3)):
        monkeypatch.setenv(KV_PROGRAMS_ENV, mode)
        fragments = [p.fragment for p in sess.executor.programs.values()]
        assert len(fragments) == 3 and dev.programs_nbytes(fragments) == models * one
    for a, b in zip(per_length, shared):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * float(np.abs(a).max()))


def test_one_kv_length_runs_on_a_model_of_fixed_shapes(tiny_qwen2, monkeypatch):
    """A run that decodes at one KV length keeps the fastest model, its shapes fixed."""
    monkeypatch.setenv(KV_PROGRAMS_ENV, "shared")
    dev = OpenVinoDevice("CPU", cache_dir=None)
    s = Session(tiny_qwen2, [dev], n_ctx=2 * KV_PAD)
    logits = s.eval(list(range(20, 40)))
    for _ in range(4):
        logits = s.eval([int(np.argmax(logits))])
    (program,) = decoding(s)
    assert program.kv == KV_PAD and dev.stats.compiled == 2 and dev.stats.shared == 0
    assert not any(f.kind == "kv_window" for f in program.translation.feeds)


def test_a_family_is_the_step_with_its_kv_length_set_aside(tiny_qwen2):
    s = Session(tiny_qwen2, [OpenVinoDevice("CPU", cache_dir=None)], n_ctx=4 * KV_PAD)
    ctx = s.context

    def fragment(rows: int, kv: int):
        plan = s.make_plans([ctx.rows_key(rows, kv, rows)])[ctx.rows_key(rows, kv, rows)]
        (f,) = plan.fragments
        return f

    one = [fragment(1, kv) for kv in (KV_PAD, 2 * KV_PAD, 3 * KV_PAD)]
    assert [kv_length(f) for f in one] == [KV_PAD, 2 * KV_PAD, 3 * KV_PAD]
    assert len({family_key(f, kv_length(f)) for f in one}) == 1
    assert len({f.structure for f in one}) == 3                     # the core's keys: one a KV length
    four = fragment(4, KV_PAD)
    assert family_key(four, KV_PAD) != family_key(one[0], KV_PAD)   # other rows: another family
    prompt = [fragment(64, kv) for kv in (KV_PAD, 2 * KV_PAD)]      # more queries than attend_rows takes
    assert [kv_length(f) for f in prompt] == [KV_PAD, 2 * KV_PAD]
    assert family_key(prompt[0], KV_PAD) == family_key(prompt[1], 2 * KV_PAD) != family_key(one[0], KV_PAD)


def test_chunks_of_several_tokens_at_three_kv_lengths_share_one_model(tiny_qwen2, monkeypatch):
    """Steps of 12 tokens, run as 16 (padded rows; more than attend_rows takes: the attention over the window and the
    new rows with one softmax) at KV lengths 256, 512 and 768: a fixed model, then one dynamic model for the other
    two, the same logits as a model per length. The two prompt chunks (240 and 237 tokens, both run as 256) are one
    family too."""
    def run(mode):
        monkeypatch.setenv(KV_PROGRAMS_ENV, mode)
        dev = OpenVinoDevice("CPU", cache_dir=None)
        s = Session(tiny_qwen2, [dev], n_ctx=3 * KV_PAD)
        rng = np.random.default_rng(7)
        chunk = lambda n: [int(t) for t in rng.integers(20, 200, n)]  # noqa: E731
        out = [s.eval(chunk(KV_PAD - 16)), s.eval(chunk(12))]       # KV 256
        out += [s.eval(chunk(KV_PAD - 19)), s.eval(chunk(12))]      # 489 tokens, then 501: KV 512
        out += [s.eval(chunk(12))]                                  # 513: KV 768
        return out, dev, decoding(s, padded_rows(12, s.n_batch))

    per_length, d1, _ = run("per_length")
    shared, d2, twelve = run("shared")
    assert sorted(p.kv for p in twelve) == [KV_PAD, 2 * KV_PAD, 3 * KV_PAD]
    assert len({id(p.family) for p in twelve}) == 1
    assert d1.stats.compiled == 5 and d2.stats.compiled == 4 and d2.stats.shared == 3
    for a, b in zip(per_length, shared):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-4 * float(np.abs(a).max()))


def test_models_named_alike_never_share_a_compiled_model(tmp_path, monkeypatch):
    """Two files of one architecture and shapes (their tensors named alike) on one device: each decodes on a model
    of its own weights."""
    a = Model(tiny_models.write("qwen2", tmp_path / "a.gguf"))
    b = Model(tiny_models.write("qwen2", tmp_path / "b.gguf"))
    dev = OpenVinoDevice("CPU", cache_dir=None)
    _, _, sa = decode(a, "shared", monkeypatch, dev)
    _, _, sb = decode(b, "shared", monkeypatch, dev)
    assert dev.stats.compiled == 6 and dev.stats.shared == 2       # each: prompt, decode at 256, at every length
    families = {id(p.family) for s in (sa, sb) for p in decoding(s)}
    assert len(families) == 2


def test_a_family_kept_per_length_is_said_with_its_reason(tiny_qwen2, monkeypatch):
    """A family whose translation refuses a dynamic KV length (DynamicKVError, made to happen here) keeps a model
    per length, and the device's compile summary says how many step shapes and why: no fallback unsaid."""
    from framework.plugins.openvino_npu import translator
    from framework.plugins.openvino_npu.kv_programs import DynamicKVError
    real = translator.translate

    def refusing(fragment, weights, kv=None):
        if kv is not None:
            raise DynamicKVError("FLASH_ATTN_EXT kqv-0 does not read the cache window just written in place")
        return real(fragment, weights, kv)
    monkeypatch.setattr(translator, "translate", refusing)
    _, dev, s = decode(tiny_qwen2, "shared", monkeypatch)
    assert dev.stats.compiled == 3 and dev.stats.shared == 0      # the prompt, decode at 256 and at 512, fixed
    assert len({id(p.family) for p in decoding(s)}) == 2
    assert ("1 step shape kept a model per KV length (FLASH_ATTN_EXT kqv-0 does not read the cache window just "
            "written in place)") in dev.compile_summary()
