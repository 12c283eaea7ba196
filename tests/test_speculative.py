"""Speculative decoding (framework/runtime/speculative.py): a draft proposes tokens, the target checks them in
one multi-token step, rejected ones are rolled back.

- the tiny Gemma 4 target and its MTP assistant (tests/tiny_models.py) against llama.cpp's draft-mtp
  (tests/reference/tiny/gemma4-assistant.json): the assistant's draft tokens and logits for the same inputs,
  over two rounds around a verification and a rollback;
- correct by construction: greedy output with speculation is the target's own greedy output, token for
  token (every kind of draft on the tiny Gemma 4; self-speculative decoding on SmolLM2 and Gemma 3 270M's
  real weights); with sampling, rejection sampling keeps the target's distribution (a chi-square test on a
  four-token vocabulary, fixed seed), and a draft identical to the target has every token accepted;
- reservation of target and draft together: the design brief's shared-KV failure with real devices (the
  target's cache in Vulkan memory on lavapipe, a layers:K draft on cpu) before any weight loads, and its
  fix (the draft on vulkan:0, or a draft with its own cache); the program budget counted over both; the
  refusals (a recurrent target, another vocabulary).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REF_DIR, load_model, reference

import tiny_models
from framework.conformance.cases import nmse
from framework.core.scheduler import CapabilityError
from framework.model.model import Model
from framework.runtime.generate import generate
from framework.runtime.sampling import Sampler, SamplingParams
from framework.runtime.session import Session
from framework.runtime.speculative import (SpeculationError, SpeculativeDecoder, accept_sampled, make_draft,
                                           picker)

NMSE_MATMUL = 5e-4
N_REAL = 12             # tokens generated per prompt with the real models
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def gemma4_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma4")
    ref = json.loads((REF_DIR / "tiny" / "gemma4-assistant.json").read_text(encoding="utf-8"))
    target = tiny_models.write("gemma4", out / "tiny-gemma4.gguf")
    assistant = tiny_models.write("gemma4-assistant", out / "tiny-gemma4-assistant.gguf")
    assert tiny_models.digest(target) == ref["target_sha256"], "rerun tests/make_tiny_reference.py"
    assert tiny_models.digest(assistant) == ref["assistant_sha256"], "rerun tests/make_tiny_reference.py"
    return target, assistant, ref


@pytest.fixture(scope="module")
def cpu(registry):
    return registry.select("cpu")


def speculative(model, devices, spec, n_draft=4, n_ctx=256, draft_devices=None):
    target = Session(model, devices, n_ctx=n_ctx)
    return SpeculativeDecoder(target, make_draft(str(spec), target, draft_devices or devices), n_draft, baseline=0)


def run(decoder, ids, n, params=GREEDY):
    decoder.reserve(len(ids), n)
    return [p.token for p in decoder.generate(ids, n, Sampler(params))]


def plain_greedy(session, ids, n):
    session.reset()
    return [p.token for p in generate(session, ids, n, Sampler(GREEDY))]


# -- the Gemma 4 pair against llama.cpp ---------------------------------------------------------------------

def _same_token(ours: np.ndarray, theirs: np.ndarray, want: int, where: str) -> None:
    """llama.cpp's token must be our argmax, unless its best two logits are closer than the NMSE bound lets two
    logits move (a near-tie, as tests/test_tiny_models.py allows)."""
    tie = 4 * np.sqrt(NMSE_MATMUL) * float(np.sqrt(np.mean(theirs.astype(np.float64) ** 2)))
    top2 = np.sort(theirs)[-2:]
    if top2[1] - top2[0] > tie:
        assert int(np.argmax(ours)) == want, f"{where}: our token {int(np.argmax(ours))}, llama.cpp's {want}"


def test_assistant_drafts_equal_llama_cpp(gemma4_files, cpu):
    """For each prompt, the inputs llama.cpp's draft-mtp gave its assistant (the target's greedy token, the
    target's hidden state, the position after the context): the same draft tokens and logits within
    ggml's bound; then the target's verification, the rollback of the rejected drafts and a second round
    from the hidden state of the last accepted token."""
    target_path, assistant_path, ref = gemma4_files
    arrays = dict(np.load(REF_DIR / "tiny" / "gemma4-assistant.npz"))
    prefill = dict(np.load(REF_DIR / "tiny" / "gemma4.npz"))         # row 0 of p{i}_steps: the prefill's last
    decoder = speculative(Model(target_path), cpu, assistant_path, n_draft=ref["n_draft"])
    target, draft = decoder.target, decoder.draft
    assert draft.kind == "assistant" and draft.model.arch.target_layers() == [2, 3]
    pick = picker(Sampler(GREEDY))
    steps = 0
    for n, p in enumerate(ref["prompts"]):
        want1, want_verify, want2 = (arrays[k].astype(np.float32) for k in p["keys"])
        target.reset()
        decoder.reserve(len(p["ids"]), 2 * ref["n_draft"] + 2)
        logits = target.eval(p["ids"])
        _same_token(logits, prefill[f"p{n}_steps"][0].astype(np.float32), p["first"], "first token")
        draft.start(p["ids"])
        for round_, (token, drafts, want) in enumerate(((p["first"], p["drafts"], want1), (p["next"], p["drafts2"],
                                                                                           want2))):
            h, pos0 = draft.pending_h, target.n_past
            for i, d in enumerate(drafts):       # llama.cpp's previous draft as the input, our hidden state
                logits, h = draft.session.draft_step(token, h, pos0)
                assert nmse(logits, want[i]) < NMSE_MATMUL, f"round {round_ + 1} step {i}: {nmse(logits, want[i])}"
                _same_token(logits, want[i], d, f"{p['ids']} round {round_ + 1} draft {i}")
                token = d
                steps += 1
            if round_ == 0:
                rows = target.eval([p["first"]] + drafts, all_logits=True)
                for i, (ours, theirs) in enumerate(zip(rows, want_verify)):
                    assert nmse(ours, theirs) < NMSE_MATMUL, f"verification row {i}"
                target.rewind(len(p["ids"]) + 1 + p["accepted"])
                draft.accepted(p["accepted"])
        # and the drafting loop itself proposes llama.cpp's tokens (the pending state after the rollback)
        assert draft.propose(p["ids"], p["next"], ref["n_draft"], pick)[0] == p["drafts2"]
    assert steps == 2 * ref["n_draft"] * len(ref["prompts"])


# -- correct by construction: greedy ---------------------------------------------------------------------

@pytest.mark.parametrize("spec", ["assistant", "layers:2", "layers:5", "own-cache"])
def test_greedy_speculation_is_the_targets_own_greedy_output(gemma4_files, cpu, spec):
    """layers:5 reads layer 4's shared K and V (Gemma 4's shared-KV layers); own-cache is the target's own
    file as a draft with a cache of its own: every draft accepted, the draft catching up two tokens a round."""
    target_path, assistant_path, ref = gemma4_files
    model = Model(target_path)
    ids = ref["prompts"][0]["ids"]
    want = plain_greedy(Session(model, cpu, n_ctx=256), ids, 16)
    path = {"assistant": assistant_path, "own-cache": target_path}.get(spec, spec)
    decoder = speculative(model, cpu, path, n_draft=3)
    assert run(decoder, ids, 16) == want
    st = decoder.stats
    assert st.tokens == 15 and st.drafted >= st.accepted
    if spec == "own-cache":
        assert st.accepted == st.drafted and st.tokens_per_step == pytest.approx(15 / st.rounds)
        assert st.rounds == 4           # 4 tokens a round (3 drafts and the target's next), the last round 3


@pytest.mark.parametrize("name,k", [("smollm2", 26), ("gemma3", 15)])
def test_self_speculative_real_models(name, k, cpu):
    """The first K layers of the real model and its head as the draft, on the target's cache: the greedy
    text of two reference prompts with and without speculation is the same. (K close to the model's depth
    keeps the test cheap: most drafts are accepted, a few rejected.)"""
    model = load_model(name)
    ref, _ = reference(name)
    target = Session(model, cpu, n_ctx=64)
    for p in ref["prompts"][:2]:
        want = plain_greedy(target, p["ids"], N_REAL)
        target.reset()
        decoder = SpeculativeDecoder(target, make_draft(f"layers:{k}", target, cpu), 2, baseline=0)
        got = run(decoder, p["ids"], N_REAL)
        assert model.tokenizer.decode(got) == model.tokenizer.decode(want), p["prompt"]
        assert got == want
        assert decoder.stats.accepted > 0, decoder.stats.line()
        target.partners = []


# -- correct by construction: sampling --------------------------------------------------------------------

SAMPLED_Q = (np.array([0.2, 0.2, 0.5, 0.1]),
             np.array([[0.3, 0.3, 0.2, 0.2], [0.1, 0.1, 0.7, 0.1], [0.6, 0.2, 0.1, 0.1], [0.25, 0.25, 0.25, 0.25]]))
# an ngram draft's proposals are deterministic: token 2, then 1 after 2 (else 0), all the mass on each
LOOKUP_Q = (np.eye(4)[2], np.eye(4)[[0, 0, 1, 0]])


@pytest.mark.parametrize("q", [SAMPLED_Q, LOOKUP_Q], ids=["sampled", "deterministic"])
def test_rejection_sampling_keeps_the_target_distribution(q):
    """Two positions over four tokens: the target's p(x1), p(x2 | x1) and a draft's q that differ (a draft
    model's distributions, or the one-hot proposals of prompt lookup). A round drafts two tokens from q and
    accepts them with accept_sampled; when it emits only x1, x2 is drawn from p(. | x1) directly. The pairs
    must follow p(x1) p(x2 | x1): chi-square over the 16 pairs below chi2(15)'s 0.999 quantile (37.70), and a
    total variation under 0.02, with 20000 rounds."""
    rng = np.random.default_rng(1234)
    p1 = np.array([0.5, 0.25, 0.15, 0.10])
    p2 = np.array([[0.1, 0.6, 0.2, 0.1], [0.4, 0.1, 0.1, 0.4], [0.25, 0.25, 0.25, 0.25], [0.7, 0.1, 0.1, 0.1]])
    q1, q2 = q
    p3 = np.full(4, 0.25)
    counts = np.zeros((4, 4))
    accepted = 0
    n = 20000
    for _ in range(n):
        d1 = int(rng.choice(4, p=q1))
        d2 = int(rng.choice(4, p=q2[d1]))
        q_rows = [None, None] if q is LOOKUP_Q else [q1, q2[d1]]    # prompt lookup passes no distribution
        n_ok, new = accept_sampled([p1, p2[d1], p3], q_rows, [d1, d2], rng)
        out = [d1, d2][:n_ok] + [new]
        if len(out) == 1:
            out.append(int(rng.choice(4, p=p2[out[0]])))
        counts[out[0], out[1]] += 1
        accepted += n_ok > 0
    expected = n * p1[:, None] * p2
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    tv = 0.5 * float(np.abs(counts / n - expected / n).sum())
    assert chi2 < 37.70, (chi2, counts)
    assert tv < 0.02, tv
    # the first draft is accepted with probability sum(min(p1, q1)) (Leviathan et al.'s beta)
    assert accepted / n == pytest.approx(np.minimum(p1, q1).sum(), abs=0.015)


def test_sampled_speculation_with_the_target_as_draft_accepts_every_token(gemma4_files, cpu):
    """p == q: every draft is accepted (min(1, p/q) = 1), and every token is one the target's sampler could
    pick (within top-k of the target's logits after the tokens before it)."""
    target_path, _, ref = gemma4_files
    model = Model(target_path)
    ids = ref["prompts"][1]["ids"]
    params = SamplingParams(temperature=0.9, top_k=5, top_p=1.0, seed=7)
    decoder = speculative(model, cpu, target_path, n_draft=3)
    got = run(decoder, ids, 12, params)
    assert len(got) == 12 and decoder.stats.accepted == decoder.stats.drafted > 0
    check = Session(model, cpu, n_ctx=256)
    rows = check.eval(ids + got[:-1], all_logits=True)[len(ids) - 1:]
    for tok, row in zip(got, rows):
        assert tok in set(np.argsort(-row)[:5].tolist())


# -- planned together --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_qwen2(tmp_path_factory):
    return Model(tiny_models.write("qwen2", tmp_path_factory.mktemp("qwen2") / "tiny-qwen2.gguf"))


@pytest.fixture(scope="module")
def vk(registry):
    (dev,) = registry.select("vulkan:0")
    if not dev.available:
        pytest.fail(f"vulkan:0 is unavailable: {dev.unavailable_reason} (make test installs Mesa's lavapipe)")
    return dev


def test_draft_on_cpu_of_a_target_on_vulkan_fails_before_any_weight_loads(tiny_qwen2, vk, cpu):
    """The design brief's failure with real devices: the target's KV cache in Vulkan device memory (lavapipe),
    a layers:1 draft on cpu, which writes that cache: reservation fails naming the tensor, its buffer and
    device, the draft's node and its device, and the fix; nothing is loaded or compiled."""
    decoder = speculative(tiny_qwen2, [vk, *cpu], "layers:1", n_draft=2, n_ctx=64, draft_devices=cpu)
    assert {r.device for r in decoder.target.residence.values()} == {"vulkan:0"}
    with pytest.raises(CapabilityError) as info:
        decoder.reserve(6, 8)
    e = info.value
    assert (e.code, e.tensor, e.node, e.devices) == ("buffer_not_usable", "cache_k_l0", "k_cache_write-0",
                                                     ("vulkan:0", "cpu"))
    text = str(e)
    for part in ("pre-allocated tensor 'cache_k_l0' (the target's, shared with the draft)", "buffer 'vulkan:0'",
                 "(SET_ROWS) of the draft", "placed on cpu", "cpu cannot access buffers of type 'vulkan:0'",
                 "fix: place the draft with the target: list vulkan:0 first in --draft-backends",
                 "a draft model file with a cache of its own"):
        assert part in text, part
    for s in (decoder.target, decoder.draft.session):
        assert s.executor.weights == {} and s.executor.programs == {}


@pytest.mark.parametrize("draft", ["layers:1 on vulkan:0", "own cache on cpu"])
def test_the_fix_runs_on_vulkan(tiny_qwen2, vk, cpu, tmp_path, draft):
    """The draft with the target (vulkan:0 first in its list), or a draft with its own cache on cpu: it runs,
    and greedy output is the target's own."""
    ids = tiny_qwen2.tokenizer.encode("The capital of France is")
    want = plain_greedy(Session(tiny_qwen2, [vk, *cpu], n_ctx=64), ids, 8)
    spec, devices = (("layers:1", [vk, *cpu]) if draft.startswith("layers") else
                     (tiny_models.write("qwen2", tmp_path / "draft.gguf"), cpu))
    decoder = speculative(tiny_qwen2, [vk, *cpu], spec, n_draft=2, n_ctx=64, draft_devices=devices)
    assert run(decoder, ids, 8) == want
    shared = decoder.draft.shared()
    if draft.startswith("layers"):
        assert shared["cache_k_l0"].device == "vulkan:0" and shared["cache_k_l0"].owner == "the target"
        assert "cache_k_l1" not in shared           # the draft's one layer touches layer 0's cache only
        # the draft's weights are the target's, loaded once: no second copy, programs shared too
        assert decoder.draft.session.executor.weights is decoder.target.executor.weights
    else:
        assert shared == {}


def test_program_budget_counts_target_and_draft_together(tiny_qwen2, registry):
    """An emulated NPU's budget is per process: with a budget the target alone fits, the target and a
    draft with its own programs do not, and reservation says how many programs both need."""
    (ov,) = registry.select("openvino:CPU")
    alone = Session(tiny_qwen2, [ov.with_options(profile="npu37xx")] + registry.select("cpu"), n_ctx=64,
                    n_batch=16)
    need = alone.reserve(6, 8).programs["openvino:CPU"]
    npu = ov.with_options(profile="npu37xx", max_live_programs=need + 1)
    target = Session(tiny_qwen2, [npu] + registry.select("cpu"), n_ctx=64, n_batch=16)
    assert target.reserve(6, 8).programs["openvino:CPU"] == need
    decoder = SpeculativeDecoder(target, make_draft("layers:1", target, [npu] + registry.select("cpu")), 2, baseline=0,
                                 inexact=True)          # an NPU declares no exact rows (tests/test_exact_rows.py)
    with pytest.raises(CapabilityError) as info:
        decoder.reserve(6, 8)
    e = info.value
    assert e.code == "program_budget" and e.limit == f"max_live_programs={need + 1}"
    assert "draft decode[" in str(e) and "prefill[" in str(e)


def test_refusals(tmp_path, cpu, gemma4_files):
    qwen35 = Model(tiny_models.write("qwen35", tmp_path / "tiny-qwen35.gguf"))
    with pytest.raises(SpeculationError, match="keeps recurrent state .* cannot be rolled back"):
        make_draft("layers:1", Session(qwen35, cpu, n_ctx=64), cpu)
    with pytest.raises(ValueError, match="cannot be rewound"):
        s = Session(qwen35, cpu, n_ctx=64)
        s.eval([1, 2, 3])
        s.rewind(1)
    target = Session(Model(gemma4_files[0]), cpu, n_ctx=64)
    llama = tiny_models.write("llama", tmp_path / "tiny-llama.gguf")
    with pytest.raises(SpeculationError, match="a draft must share the target's vocabulary"):
        make_draft(str(llama), target, cpu)
    with pytest.raises(SpeculationError, match="K must be between 1 and 5"):
        make_draft("layers:6", target, cpu)
    with pytest.raises(SpeculationError, match="not a file"):
        make_draft("nothing.gguf", target, cpu)


# -- the command ----------------------------------------------------------------------------------------------

def run_cli(capsys, *argv):
    from framework.cli import main
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_run_reports_the_speculation_and_writes_it_in_the_plan(capsys, tmp_path, gemma4_files):
    target, assistant, _ = gemma4_files
    plan, view = tmp_path / "plan.json", tmp_path / "view.txt"
    code, out, err = run_cli(capsys, "run", "Hello there", "-m", target, "--draft", assistant, "--draft-n", 3, "-n", 10,
                             "--ctx", 128, "--plan", plan, "--plan-view", view)
    assert code == 0 and out.startswith("Hello there")
    assert ("draft tiny-gemma4-assistant.gguf (gemma4-assistant, 2 layers reading the target's cache of layers "
            "2, 3)") in err
    assert "uses the target's KV cache of layers 2-3 and token_embd.weight in place (on cpu)" in err
    assert "speculative: drafted" in err and "tokens per target step" in err and "for the target alone" in err
    assert "draft placement" in err
    record = json.loads(plan.read_text())["draft"]
    st = record["stats"]
    assert record["kind"] == "assistant" and record["n_draft"] == 3
    assert st["tokens"] == 9 and st["drafted"] >= st["accepted"] >= 0 and st["rounds"] > 0
    assert st["tokens_per_target_step"] == pytest.approx(st["tokens"] / st["rounds"], abs=1e-3)
    assert st["baseline"]["tokens"] == 7 and st["baseline"]["tokens_per_second"] > 0 and "speedup" in st
    assert set(record["shared"]) == {"cache_k_l2", "cache_v_l2", "cache_k_l3", "cache_v_l3", "token_embd.weight"}
    assert all(k.startswith("draft decode[") for k in record["plans"])
    text = view.read_text()
    assert "draft decode[" in text and "shared with the target, in place: cache_k_l2" in text
    assert "note: speculative: drafted" in text


def test_check_and_split_show_the_shared_kv_error(capsys, tmp_path, tiny_qwen2, vk):
    path = tiny_qwen2.file.path
    args = ("-m", path, "--backends", "vulkan:0,cpu", "--draft", "layers:1", "--draft-backends", "cpu", "--ctx", 64,
            "-n", 4, "--prompt-tokens", 6)
    code, out, err = run_cli(capsys, "check", *args)
    assert code == 1 and "error: [buffer_not_usable] pre-allocated tensor 'cache_k_l0'" in err
    assert "list vulkan:0 first in --draft-backends" in err
    dot = tmp_path / "split.dot"
    code, out, err = run_cli(capsys, "split", *args, "-o", dot)
    assert code == 1 and "reservation failed [buffer_not_usable]" in err
    graph = dot.read_text()
    assert "shared [shape=cylinder" in graph and "the target's, shared in place" in graph
    code, out, err = run_cli(capsys, "split", *args, "--phase", "decode")
    draft = out[out.index("draft decode["):]
    assert "<-- ERROR [buffer_not_usable] at k_cache_write-0" in draft
    assert "cache_k_l0, cache_v_l0 (buffer 'vulkan:0' on vulkan:0)" in draft
    target = out[out.index("\ndecode["):out.index("draft decode[")]
    assert "<-- ERROR" not in target          # the same node name in the target's plan is not the error
    code, out, err = run_cli(capsys, "check", "-m", path, "--backends", "vulkan:0,cpu", "--draft", "layers:1",
                             "--ctx", 64, "-n", 4, "--prompt-tokens", 6)
    assert code == 0 and "draft layers:1" in out and "draft decode[tokens=1,kv=64]" in out


def test_a_draft_catching_up_after_a_pause_runs_only_reserved_shapes_where_shapes_compile(gemma4_files):
    """On a device that compiles a program per step shape (limits.padded_rows: openvino:CPU), a draft model's
    catch-up after a pause (every token since its last step) takes only steps of 2 and 16 rows, reserved with
    the run: nothing is planned or compiled inside the run (on openvino:CPU the 0.5B's probes compiled there,
    50-70% of a free-text run's time), and the text is the target's own."""
    import dataclasses

    from framework.plugins.cpu.device import CpuDevice
    from framework.runtime.speculative import catch_up_steps
    assert catch_up_steps(41, 16) == [16, 16, 9] and catch_up_steps(7, 16) == [2, 2, 2, 1]
    assert catch_up_steps(2, 16) == [2] and catch_up_steps(12, 16) == [12]
    dev = CpuDevice()
    dev.limits = dataclasses.replace(dev.limits, padded_rows=True)
    target_path, _, ref = gemma4_files
    model, ids = Model(target_path), ref["prompts"][0]["ids"]
    want = plain_greedy(Session(model, [dev], n_ctx=256, n_batch=64), ids, 60)
    target = Session(model, [dev], n_ctx=256, n_batch=64)
    decoder = SpeculativeDecoder(target, make_draft(str(target_path), target, [dev]), 3, baseline=0)
    decoder.reserve(len(ids), 60)
    draft = decoder.draft.session
    reserved = set(draft.plans)
    prompt_rows = {k[0] for k in draft.context.shapes_for(len(ids), 0)}
    assert {k[0] for k in reserved} == {1, 2, 16} | prompt_rows
    decoder.adaptive.pause = 40          # 40 rounds without drafting, then a catch-up of 41 tokens: 16, 16 and 9
    got = [p.token for p in decoder.generate(ids, 60, Sampler(GREEDY))]
    assert got == want and decoder.stats.paused == 40 and decoder.stats.accepted > 0
    assert set(draft.plans) == reserved
