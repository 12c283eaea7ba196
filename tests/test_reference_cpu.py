"""Both models on the CPU plugin against llama.cpp's outputs (tests/reference)."""

import numpy as np
import pytest
from conftest import MODELS, load_model, reference, reference_text
from reference_checks import assert_decode_equals_prefill, assert_teacher_forced, assert_text_metrics

from framework.plugins.cpu.device import CpuDevice
from framework.runtime.session import Session


@pytest.fixture(scope="module", params=[(m, path) for path in ("q8", "f32") for m in MODELS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def case(request):
    """Each model on both paths of the cpu plugin: its default (q8: the GGUF blocks times 8-bit activations)
    and FRAMEWORK_CPU_MATMUL=f32 (float32 weights, the core's reference kernels)."""
    name, path = request.param
    model = load_model(name)
    device = CpuDevice(path)
    if not device.available:        # q8 where numba compiles for a CPU without AVX2
        pytest.skip(f"cpu plugin's {path} path unavailable: {device.unavailable_reason}")
    session = Session(model, [device], n_ctx=1024)
    return name, model, session


def test_last_logits_follow_llama_cpp(case):
    name, model, session = case
    ref, arrays = reference(name)
    for p in ref["prompts"]:
        session.reset()
        logits = session.eval(p["ids"])
        want = arrays[p["last_logits_key"]]
        assert int(np.argmax(logits)) == p["greedy_ids"][0]
        assert np.corrcoef(logits, want)[0, 1] > 0.995, p["prompt"]


def test_teacher_forced_greedy(case):
    name, _, session = case
    assert_teacher_forced(session, reference(name)[0])


def test_teacher_forced_greedy_through_decode_steps(case):
    """The same bounds with llama.cpp's tokens fed one decode step at a time: every prompt on the default q8
    path; the first on the float32 path, whose decode step reads the head in float32 (Gemma 3's 671 MB a
    step) and whose rows are the reference kernels' that the prefill tests above already hold."""
    name, _, session = case
    ref = reference(name)[0]
    if session.devices[0].fast is False:
        ref = dict(ref, prompts=ref["prompts"][:1])
    assert_teacher_forced(session, ref, by_decode=True)


def test_text_perplexity_and_top1(case):
    name, model, session = case
    ref, arrays = reference(name)
    assert_text_metrics(session, ref, arrays, model.tokenizer, reference_text(ref))


def test_chunked_prefill_equals_one_chunk(case):
    """Prefill in chunks of 7 tokens must give the logits of a single chunk."""
    name, model, session = case
    ids = reference(name)[0]["prompts"][1]["ids"]
    session.reset()
    whole = session.eval(ids, all_logits=True)
    chunked = Session(model, session.devices, n_ctx=256, n_batch=7)
    parts = chunked.eval(ids, all_logits=True)
    np.testing.assert_allclose(parts, whole, rtol=2e-3, atol=2e-3)


def test_decode_steps_equal_prefill(case):
    name, _, session = case
    assert_decode_equals_prefill(session, reference(name)[0], n_follow=8, tol=1e-3)
