"""Greedy steps that take their argmax where the logits are made (ARGMAX in the graph) and, where every device
declares Limits.queued_inputs (cuda:0: tests/test_cuda.py), are queued before the token of the step before is
read (runtime/greedy.py), on opencl:0 (PoCL in CI: a device with memory of its own, on the shared C kernels
the CUDA plugin runs) against the logits path. opencl:0 does not declare queued_inputs (a new buffer bound
releases its runs enqueued ahead): the tests of the queued path turn it on, as the path it then takes is the
one cuda:0 takes, on a real device that reads a held input in place."""

from __future__ import annotations

import numpy as np
import pytest

from dataclasses import replace

from framework.core.scheduler.errors import DeviceRunError
from framework.runtime.context import phase_name
from framework.runtime.generate import generate
from framework.runtime.greedy import checked_index, greedy_tokens, pipelined
from framework.runtime.sampling import Sampler, SamplingParams
from framework.runtime.session import Session

from conftest import load_model

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def ocl(registry):
    dev = next((d for d in registry.devices() if d.name == "opencl:0"), None)
    if dev is None or not dev.available:
        pytest.fail(f"opencl:0 is unavailable: {dev.unavailable_reason if dev else 'not registered'} (make test "
                    f"installs pocl-opencl-icd and ocl-icd-libopencl1)")
    return dev


@pytest.fixture
def queued(ocl):
    """opencl:0 as a device that declares Limits.queued_inputs (restored after)."""
    limits = ocl.limits
    ocl.limits = replace(limits, queued_inputs=True)
    yield ocl
    ocl.limits = limits


@pytest.fixture(scope="module")
def model():
    return load_model("smollm2")


def logits_path(model, devices, ids: list[int], n: int) -> tuple[list[int], int]:
    """n greedy tokens from eval's logits, one step after another (the path before ARGMAX), and n_past."""
    s = Session(model, devices, n_ctx=256)
    tok = [int(np.argmax(s.eval(ids)))]
    while len(tok) < n:
        tok.append(int(np.argmax(s.eval([tok[-1]]))))
    return tok, s.n_past


@pytest.mark.parametrize("path", ["one by one", "queued"])
def test_greedy_steps_give_the_logits_paths_tokens(ocl, model, request, path):
    dev = request.getfixturevalue("queued") if path == "queued" else ocl
    ids = model.tokenizer.encode(PROMPT)
    s = Session(model, [dev], n_ctx=256)
    assert s.argmax_on_device and pipelined(s) == (path == "queued")
    taken = ocl.ahead_taken
    got = list(greedy_tokens(s, ids, 12))
    want, n_past = logits_path(model, [ocl], ids, 12)
    assert got == want
    assert s.n_past == n_past == len(ids) + 11          # the last token is not run through the model
    assert s.prefill.tokens == len(ids) and s.decode.tokens == 11 and s.decode.seconds > 0
    names = [phase_name(k) for k in s.plans]
    assert names == [f"prefill[tokens={len(ids)},kv=256,argmax]", "decode[tokens=1,kv=256,argmax]"], names
    if path == "one by one":    # the index read back with the run, as logits are: the runs enqueued ahead are taken
        assert ocl.ahead_taken >= taken + 8


def test_a_step_queued_past_the_callers_last_token_leaves_the_context(queued, model):
    ids = model.tokenizer.encode(PROMPT)
    s = Session(model, [queued], n_ctx=256)
    tokens = greedy_tokens(s, ids, 12)
    first = [next(tokens) for _ in range(5)]
    assert s.n_past == len(ids) + 5                     # the step on the fifth token is queued
    tokens.close()
    assert s.n_past == len(ids) + 4
    assert first + list(greedy_tokens(s, [first[-1]], 3)) == logits_path(model, [queued], ids, 8)[0]


def test_generate_greedy_matches_its_logits_path_up_to_a_stop_token(queued, model):
    ids = model.tokenizer.encode(PROMPT)
    want, _ = logits_path(model, [queued], ids, 10)
    stop = frozenset({want[6]}) - frozenset(want[:6])
    seen = []                                           # an observer sends generate down the logits path
    runs = {}
    for path, sampler in (("greedy", Sampler(SamplingParams())),
                          ("logits", Sampler(SamplingParams(), observe=lambda logits, t: seen.append(t)))):
        s = Session(model, [queued], n_ctx=256)
        pieces = list(generate(s, ids, 10, sampler, stop))
        runs[path] = ([p.token for p in pieces], s.n_past)
    assert seen and runs["greedy"] == runs["logits"]
    assert runs["greedy"][0] == (want[:6] if stop else want)


def test_the_context_limit_ends_queued_decoding_as_it_ends_one_by_one(queued, model):
    ids = model.tokenizer.encode(PROMPT)
    s = Session(model, [queued], n_ctx=len(ids) + 3)
    got = list(greedy_tokens(s, ids, 10))
    assert len(got) == 4 and s.n_past == s.n_ctx


def test_a_host_memory_session_takes_its_argmax_here(registry, model):
    cpu = registry.select("cpu")
    s = Session(model, cpu, n_ctx=256)
    assert not s.argmax_on_device and not pipelined(s)
    ids = model.tokenizer.encode(PROMPT)
    assert list(greedy_tokens(s, ids, 4)) == logits_path(model, cpu, ids, 4)[0]
    assert all(len(k) == 3 for k in s.plans)            # no ARGMAX graphs: nothing would be saved


def test_an_index_of_minus_one_is_an_error_naming_the_node_and_the_devices(ocl, model):
    s = Session(model, [ocl], n_ctx=256)
    plan, _ = s.plan(1, 0, 1, greedy=True)
    argmax = plan.graph.outputs[0]
    with pytest.raises(DeviceRunError, match="(?s)node 'argmax.*the logits '.*not finite.*opencl:0.*--check-values"):
        checked_index(s, np.array([-1], np.int32), lambda: argmax)
    assert argmax.op == "ARGMAX" and checked_index(s, np.array([7], np.int32), lambda: None) == 7


def test_a_prompt_over_n_batch_is_counted_once_on_the_queued_path(queued, model):
    ids = model.tokenizer.encode(PROMPT + " a city that")
    s = Session(model, [queued], n_ctx=256, n_batch=4)
    got = list(greedy_tokens(s, ids, 5))
    assert len(ids) > 4 and got == logits_path(model, [queued], ids, 5)[0]
    assert s.prefill.tokens == len(ids) and s.decode.tokens == 4


def test_vulkan0_takes_the_argmax_on_the_device_too(registry, model):
    """vulkan:0 (lavapipe in CI) runs ARGMAX (its two WGSL kernels): greedy steps read back one index."""
    vk = next((d for d in registry.devices() if d.name == "vulkan:0" and d.available), None)
    if vk is None:
        pytest.fail("vulkan:0 is unavailable (make test installs mesa-vulkan-drivers and libvulkan1)")
    ids = model.tokenizer.encode(PROMPT)
    s = Session(model, [vk], n_ctx=256)
    assert s.argmax_on_device and not pipelined(s)
    assert list(greedy_tokens(s, ids, 6)) == logits_path(model, [vk], ids, 6)[0]
    assert all(k[3:] == ("argmax",) for k in s.plans)


def test_bench_says_how_its_greedy_decode_took_its_tokens(ocl, queued, registry, model):
    from types import SimpleNamespace

    from framework.bench import _greedy_how
    how = {name: _greedy_how(SimpleNamespace(session=Session(model, devs, n_ctx=64)))
           for name, devs in (("cpu", registry.select("cpu")), ("ocl", [queued]))}
    assert how["cpu"] == "" and "queued before the step before's token is read" in how["ocl"]


def test_greedy_verification_reads_each_rows_argmax_from_the_device(ocl, model, monkeypatch):
    """A greedy speculative round's target step ends in ARGMAX over every row where the target takes its argmax
    on the device (n indices read back, not n rows of logits), and its baseline decodes as greedy decoding does:
    the text is the logits path's, drafts are accepted, and every verification shape reserved is an ARGMAX one."""
    from framework.runtime.speculative import SpeculativeDecoder, make_draft
    from test_lookup_draft import EDIT        # a prompt the answer copies from: drafts are accepted
    ids = model.tokenizer.encode(EDIT)
    want, _ = logits_path(model, [ocl], ids, 24)
    s = Session(model, [ocl], n_ctx=256)
    decoder = SpeculativeDecoder(s, make_draft("ngram:3", s, [ocl]), 4, baseline=4)
    decoder.reserve(len(ids), 24, greedy=True)
    rows = [k for k in s.plans if k[0] > 1 and k[2] is None and k[1] > len(ids)]     # verification shapes
    assert rows and all(k[3:] == ("argmax",) for k in rows), rows
    steps = []
    step = Session.step
    monkeypatch.setattr(Session, "step", lambda self, chunk, *a, **kw: steps.append((len(chunk), kw.get("greedy")))
                        or step(self, chunk, *a, **kw))
    got = [p.token for p in decoder.generate(ids, 24, Sampler(SamplingParams()))]
    assert got == want
    st = decoder.stats
    assert st.accepted > 0 and st.baseline_tokens == 3, st.line()
    assert any(n > 1 and greedy for n, greedy in steps), steps       # verified by ARGMAX rows
    assert s.prefill.tokens == len(ids)                               # the baseline's steps are not the prompt's
