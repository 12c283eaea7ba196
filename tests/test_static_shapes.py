"""Fixed-shape sessions (what static-shape devices such as NPUs demand): every prefill chunk is
padded to the chunk size, every step attends over the whole context, and the results equal the
dynamic-shape session's."""

import numpy as np
import pytest
from conftest import load_model, reference
from reference_checks import assert_teacher_forced

from framework.contract import Limits
from framework.plugins.cpu.device import CpuDevice
from framework.runtime.session import Session


@pytest.fixture(scope="module")
def static_cpu():
    dev = CpuDevice()
    dev.limits = Limits(static_shapes=True)      # this instance only: the CPU itself has no such need
    return dev


def test_static_session_uses_two_shapes_and_matches_dynamic(static_cpu):
    model = load_model("smollm2")
    prompt = reference("smollm2")[0]["prompts"][1]["ids"]
    static = Session(model, [static_cpu], n_ctx=300, n_batch=8)
    dynamic = Session(model, [CpuDevice()], n_ctx=300, n_batch=8)
    reservation = static.reserve(len(prompt), 20)
    assert len(reservation.plans) == 2                       # one prefill chunk shape, one decode shape
    assert all(p.graph.meta["n_kv"] == 300 for p in reservation.plans.values())
    np.testing.assert_allclose(static.eval(prompt), dynamic.eval(prompt), rtol=1e-4, atol=1e-4)
    for tok in (5, 6, 7):
        np.testing.assert_allclose(static.eval([tok]), dynamic.eval([tok]), rtol=1e-4, atol=1e-4)
    assert len(static.plans) == 2


def test_static_padding_never_leaks_into_the_context(static_cpu):
    """A chunk padded past the end of the context writes scratch rows, not real ones."""
    model = load_model("smollm2")
    session = Session(model, [static_cpu], n_ctx=20, n_batch=16)
    assert session.cache.k[0].shape[0] == 20 + 16
    ids = list(range(100, 118))                              # 18 tokens: chunks of 16 and 2 (+14 padding)
    logits = session.eval(ids, all_logits=True)
    assert logits.shape == (18, model.hp.n_vocab) and np.isfinite(logits).all()
    ref = Session(model, [CpuDevice()], n_ctx=20, n_batch=16).eval(ids, all_logits=True)
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-4)


def test_static_session_matches_llama_cpp(static_cpu):
    assert_teacher_forced(Session(load_model("gemma3"), [static_cpu], n_ctx=128, n_batch=64),
                          reference("gemma3")[0])
