"""Two devices, real models, real computation: the built-in cpu device and example:0 from the
third-party distribution framework-plugin-example (examples/plugin-example, installed into the
venv and discovered through its entry point).

example:0 runs the core's reference kernels behind a private buffer type its handles cannot leave
without a copy, so every mixed plan below must give the CPU-only session's logits: any tensor
that crossed devices without to_host/from_host would have failed loudly.
"""

from __future__ import annotations

import itertools
import re
from importlib.metadata import entry_points

import numpy as np
import pytest
from conftest import load_model, model_path, reference
from framework_plugin_example import (  # pip install -e examples/plugin-example
    EXAMPLE_BUFFER,
    ExampleBuffer,
    ExampleDevice,
)

from framework.cli import main as cli_main
from framework.contract import HOST_BUFFER, BufferType, DeviceType
from framework.core.graph import OPS, VIEW_OPS
from framework.registry import ALIASES, contract_problems, default_registry
from framework.core.scheduler import CapabilityError
from framework.runtime.session import Session

N_CTX = 256
EXAMPLE_ENV = ("FRAMEWORK_EXAMPLE_REFUSE", "FRAMEWORK_EXAMPLE_MAX_PROGRAMS", "FRAMEWORK_EXAMPLE_MAX_CHAIN",
               "FRAMEWORK_EXAMPLE_MEMORY")
TIGHT = {"rtol": 1e-6, "atol": 1e-6}     # same kernels, same float32 arithmetic: only copies differ


@pytest.fixture(autouse=True)
def _no_example_settings(monkeypatch):
    """The example device reads its settings from the environment: start every test from none."""
    for var in EXAMPLE_ENV:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def cpu(registry):
    return registry.select("cpu")[0]


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2")


@pytest.fixture(scope="module")
def prompt():
    """A 5-token prompt and llama.cpp's first greedy token after it (one decode step)."""
    p = reference("smollm2")[0]["prompts"][0]
    return p["ids"], p["greedy_ids"][0]


def prefill_and_decode(session: Session, ids: list[int], follow: int) -> tuple[np.ndarray, np.ndarray]:
    session.reset()
    return session.eval(ids), session.eval([follow])


@pytest.fixture(scope="module")
def cpu_logits(smollm2, cpu, prompt):
    """The CPU-only session's logits after the prompt and after one decode step (the reference)."""
    return prefill_and_decode(Session(smollm2, [cpu], n_ctx=N_CTX), *prompt)


def assert_matches_cpu(session: Session, prompt, cpu_logits) -> None:
    got = prefill_and_decode(session, *prompt)
    for g, want in zip(got, cpu_logits):
        np.testing.assert_allclose(g, want, **TIGHT)


def prefill_plan(session: Session):
    (plan,) = [p for key, (p, _) in session.plans.items() if key[0] > 1]
    return plan


def error_of(excinfo) -> tuple[CapabilityError, str]:
    return excinfo.value, str(excinfo.value)


# -- a. discovery ------------------------------------------------------------------------------

def test_example_plugin_is_discovered_through_its_entry_point():
    (ep,) = entry_points(group="framework.backends", name="example")
    assert ep.value == "framework_plugin_example"
    assert ep.dist is not None and ep.dist.name == "framework-plugin-example"

    reg = default_registry()
    rec = reg.plugins["example"]
    assert rec.error is None
    assert rec.distribution.split()[0] == "framework-plugin-example"
    (dev,) = rec.devices
    assert isinstance(dev, ExampleDevice)
    assert dev.name == "example:0" and dev.type == DeviceType.ACCEL and dev.physical_id == "host-cpu"
    assert dev.available and "example" in dev.description.lower()
    assert dev.buffer_type == BufferType("example_private", host=False) == EXAMPLE_BUFFER
    assert contract_problems(dev) == []
    assert reg.plugins["cpu"].distribution.split()[0] == "framework"

    # one CPU reached through two plugins (other plugins may reach it too)
    assert any({"cpu", "example:0"} <= {d.name for d in g} for g in reg.same_silicon()), reg.same_silicon()


def test_backends_command_lists_the_example_device(capsys, monkeypatch):
    assert cli_main(["backends"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^example:0\s+ACCEL\s+example\s+host-cpu\s+available$", out, re.M), out
    assert re.search(r"^plugins: .*\bexample \(framework-plugin-example [\d.]+\)", out, re.M), out
    assert re.search(r"^cpu\s+CPU\s+cpu\b", out, re.M), out
    # the same-silicon note names both devices of host-cpu
    assert re.search(r"^one physical device \(host-cpu\) is reached as: .*\bcpu\b.*\bexample:0\b", out, re.M), out


def test_configuration_from_environment_and_constructor(monkeypatch):
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_REFUSE", "rope, GLU")
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_MAX_PROGRAMS", "7")
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_MAX_CHAIN", "5")
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_MEMORY", "1000000")
    dev = default_registry().plugins["example"].devices[0]       # the entry point's device reads them
    assert dev.refuse == {"ROPE", "GLU"}
    assert (dev.limits.max_live_programs, dev.limits.max_chain, dev.limits.memory_bytes) == (7, 5, 1_000_000)

    # constructor arguments win over the environment
    dev = ExampleDevice(refuse=["ADD"], max_programs=2, max_chain=3, memory=4096)
    assert dev.refuse == {"ADD"}
    assert (dev.limits.max_live_programs, dev.limits.max_chain, dev.limits.memory_bytes) == (2, 3, 4096)

    # a malformed setting: the device is listed, unavailable, with the reason; selecting it says why
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_MAX_CHAIN", "lots")
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_REFUSE", "ROEP")
    reg = default_registry()
    (dev,) = reg.plugins["example"].devices
    assert not dev.available and contract_problems(dev) == []
    assert "FRAMEWORK_EXAMPLE_MAX_CHAIN='lots'" in dev.unavailable_reason and "ROEP" in dev.unavailable_reason
    from framework.core.scheduler import DeviceSelectionError
    with pytest.raises(DeviceSelectionError, match="example:0' is unavailable: bad configuration"):
        reg.select("example:0,cpu")


def test_private_buffer_cannot_reach_the_cpu_without_a_copy(cpu):
    ex = ExampleDevice()
    assert not cpu.supports_buffer(EXAMPLE_BUFFER)
    assert cpu.supports_buffer(EXAMPLE_BUFFER).code == "unsupported_buffer"
    assert ex.supports_buffer(EXAMPLE_BUFFER) and ex.supports_buffer(HOST_BUFFER)
    assert ex.supports_buffer(cpu.weight_buffer_type)                  # host memory, readable
    assert not ex.supports_buffer(BufferType("someone_elses", host=False))

    host = np.arange(6, dtype=np.float32).reshape(2, 3)
    handle = ex.from_host(host)
    assert isinstance(handle, ExampleBuffer) and handle.array is not host
    back = ex.to_host(handle)
    np.testing.assert_array_equal(back, host)
    assert back is not handle.array
    # anything that hands the handle itself to numpy (the CPU's kernels) fails loudly
    with pytest.raises(TypeError, match="to_host"):
        np.asarray(handle)
    for op, args in (("ADD", (host, handle)), ("ADD", (handle, host)), ("MUL_MAT", (host, handle)),
                     ("RMS_NORM", (handle,)), ("GET_ROWS", (handle, np.array([0], dtype=np.int32)))):
        kw = {"eps": 1e-6} if op == "RMS_NORM" else {}
        with pytest.raises((TypeError, AttributeError)):
            OPS[op].kernel(*args, **kw)
    with pytest.raises(TypeError):
        ex.to_host(host)                  # not its memory


# -- b. a mixed plan ---------------------------------------------------------------------------

def test_mixed_plan_matches_cpu_with_fallbacks_copies_and_shared_programs(smollm2, cpu, prompt, cpu_logits):
    ex = ExampleDevice(refuse="ROPE")
    session = Session(smollm2, [ex, cpu], n_ctx=N_CTX)
    reservation = session.reserve(len(prompt[0]), 2)
    assert ex.compiled == 0 and session.executor.weights == {}

    assert_matches_cpu(session, prompt, cpu_logits)

    plan = prefill_plan(session)
    record = plan.to_dict()
    # every ROPE, and only ROPE, fell back to the cpu, with example:0's own refusal
    fallbacks = record["fallbacks"]
    n_layer = smollm2.hp.n_layer
    assert len(fallbacks) == 2 * n_layer
    for fb in fallbacks:
        assert fb["op"] == "ROPE" and fb["device"] == "cpu"
        assert fb["refusals"]["example:0"].startswith("refused_by_config: example:0 is configured to refuse ROPE")
    for node in record["nodes"]:
        if node["op"] == "ROPE":
            assert node["reason"].startswith("fallback: refused by example:0")

    # copies both ways, each carrying bytes
    assert plan.copies and all(c.nbytes > 0 for c in plan.copies)
    assert {(c.src_device, c.dst_device) for c in plan.copies} == {("example:0", "cpu"), ("cpu", "example:0")}
    # fragments alternate devices
    devs = [f.device for f in plan.fragments]
    assert set(devs) == {"example:0", "cpu"}
    assert all(a != b for a, b in itertools.pairwise(devs))
    # repeated layers hash alike: few programs for many fragments
    use = plan.per_device()["example:0"]
    assert use["fragments"] >= n_layer
    assert use["programs"] * 5 < use["fragments"], use
    # the executor compiled one program per distinct structure over both phases, and ran them all
    assert ex.compiled == reservation.programs["example:0"] == session.executor.stats["example:0"]["compiles"]
    ran = sum(p.per_device()["example:0"]["fragments"] for p, _ in session.plans.values())
    assert ex.runs == ran
    # the example device's weights are its own handles
    assert all(isinstance(h, ExampleBuffer) for (d, _), h in session.executor.weights.items() if d == "example:0")


# -- c. smoothing ------------------------------------------------------------------------------

def test_lone_accepted_adds_are_smoothed_onto_the_cpu(smollm2, cpu, prompt, cpu_logits):
    refused = sorted(set(OPS) - VIEW_OPS - {"ADD"})
    ex = ExampleDevice(refuse=refused)
    session = Session(smollm2, [ex, cpu], n_ctx=N_CTX)
    session.reserve(len(prompt[0]), 2)
    plan = prefill_plan(session)

    adds = [n for n in plan.graph.nodes if n.op == "ADD"]
    assert len(adds) == 2 * smollm2.hp.n_layer
    for n in adds:
        assert ex.supports_op(n)                                    # pass 2 put it on example:0 ...
        p = plan.placement[id(n)]
        assert p.device == "cpu", (n.name, p)                        # ... pass 3 moved it back
        assert p.reason.startswith("smoothed"), (n.name, p.reason)
        assert "from example:0 to cpu" in p.reason
    reasons = {n["name"]: n["reason"] for n in plan.to_dict()["nodes"]}
    assert all(reasons[n.name].startswith("smoothed") for n in adds)
    # no ping-pong: one fragment, no copies, and example:0 compiles nothing
    assert [f.device for f in plan.fragments] == ["cpu"] and plan.copies == []

    assert_matches_cpu(session, prompt, cpu_logits)
    assert ex.compiled == 0 and ex.submitted == []


# -- d. chain limit ----------------------------------------------------------------------------

def _expected_submissions(plan, device: str) -> list[int]:
    out = []
    for f in plan.fragments:
        if f.device != device:
            continue
        assert f.submissions[0][0] == 0 and f.submissions[-1][1] == len(f.nodes)
        assert all(a[1] == b[0] for a, b in zip(f.submissions, f.submissions[1:]))   # contiguous
        out += [sum(1 for n in f.nodes[s:e] if n.op not in VIEW_OPS) for s, e in f.submissions]
    return out


def test_chain_limit_from_environment_is_respected(monkeypatch, smollm2, cpu, prompt, cpu_logits):
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_MAX_CHAIN", "5")
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_REFUSE", "ROPE")
    reg = default_registry()
    devices = reg.select("example:0,cpu")
    ex = devices[0]
    assert ex.limits.max_chain == 5
    session = Session(smollm2, devices, n_ctx=N_CTX)
    session.reserve(len(prompt[0]), 2)
    plans = [p for p, _ in session.plans.values()]
    for plan in plans:
        expected = _expected_submissions(plan, "example:0")
        assert max(expected) == 5 and all(1 <= c <= 5 for c in expected)
        for f, rec in zip(plan.fragments, plan.to_dict()["fragments"]):
            assert rec["submissions"] == [list(s) for s in f.submissions]
            if f.device == "example:0":
                assert len(f.submissions) == -(-f.commands // 5)
        assert plan.per_device()["example:0"]["submissions"] > plan.per_device()["example:0"]["fragments"]

    assert_matches_cpu(session, prompt, cpu_logits)
    # what the device ran: prefill's submissions, then decode's, each of at most 5 commands
    prefill, decode = prefill_plan(session), next(p for k, (p, _) in session.plans.items() if k[0] == 1)
    assert ex.submitted == _expected_submissions(prefill, "example:0") + _expected_submissions(decode, "example:0")
    assert max(ex.submitted) <= 5
    assert sum(ex.submitted) == sum(f.commands for p in (prefill, decode) for f in p.fragments
                                    if f.device == "example:0")


def test_chain_limit_from_constructor_cuts_the_plan(smollm2, cpu, prompt):
    ex = ExampleDevice(max_chain=5)
    session = Session(smollm2, [ex, cpu], n_ctx=N_CTX)
    session.reserve(len(prompt[0]), 2)
    (fragment,) = prefill_plan(session).fragments                 # everything on example:0
    assert fragment.device == "example:0"
    counts = _expected_submissions(prefill_plan(session), "example:0")
    assert len(counts) == -(-fragment.commands // 5) and max(counts) == 5


# -- e. program budget -------------------------------------------------------------------------

def test_program_budget_fails_at_reservation_before_anything_loads(smollm2, cpu, prompt):
    n_prompt, n_predict = len(prompt[0]), 2
    # how many programs the plans need when nothing limits them
    free = Session(smollm2, [ExampleDevice(refuse="ROPE"), cpu], n_ctx=N_CTX)
    needed = free.reserve(n_prompt, n_predict).programs["example:0"]
    assert needed > 3

    ex = ExampleDevice(refuse="ROPE", max_programs=3)
    session = Session(smollm2, [ex, cpu], n_ctx=N_CTX)
    with pytest.raises(CapabilityError) as info:
        session.reserve(n_prompt, n_predict)
    e, text = error_of(info)
    assert e.code == "program_budget"
    assert e.devices == ("example:0",) and e.limit == "max_live_programs=3"
    assert "device example:0" in text and "allows 3 live compiled programs" in text
    assert f"need {needed} distinct programs" in text
    assert e.fix
    assert session.executor.weights == {} and session.executor.programs == {} and session.executor.caches == {}
    assert ex.compiled == 0 and ex.submitted == []


# -- f. memory ---------------------------------------------------------------------------------

def test_memory_limit_fails_at_reservation(monkeypatch, smollm2, cpu, prompt):
    needed = Session(smollm2, [ExampleDevice(), cpu], n_ctx=N_CTX).reserve(len(prompt[0]), 2).memory["example:0"]
    limit = 1 << 20
    assert needed["total"] > limit
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_MEMORY", str(limit))
    devices = default_registry().select("example:0")     # alone: a device after it would take what does not fit
    session = Session(smollm2, devices, n_ctx=N_CTX)
    with pytest.raises(CapabilityError) as info:
        session.reserve(len(prompt[0]), 2)
    e, text = error_of(info)
    assert e.code == "out_of_memory"
    assert e.devices == ("example:0",) and e.limit == f"memory_bytes={limit}"
    assert "device example:0 has 1.0 MiB" in text
    assert f"the plans need {needed['total'] / 2**20:.1f} MiB" in text
    assert f"weights {needed['weights'] / 2**20:.1f}" in text
    assert session.executor.weights == {} and devices[0].compiled == 0



def test_programs_that_hold_memory_count_at_reservation(smollm2, prompt):
    """A device whose compiled programs hold memory of their own (Device.programs_nbytes, as OpenVINO's models
    keep a copy of their weights) has it counted in the memory check, once a distinct program: too many step
    shapes for its memory are refused at reservation, naming the programs and a fix."""
    each = 8 << 20

    class Holding(ExampleDevice):
        def programs_nbytes(self, fragments):
            return each * len({f.program for f in fragments})

    need = Session(smollm2, [Holding()], n_ctx=N_CTX).reserve(len(prompt[0]), 2).memory["example:0"]
    assert need["programs"] >= 2 * each and need["programs"] % each == 0        # prefill's and decode's at least
    assert need["total"] == need["weights"] + need["caches"] + need["activations"] + need["programs"]
    session = Session(smollm2, [Holding(memory=need["total"] - each)], n_ctx=N_CTX)
    with pytest.raises(CapabilityError) as info:
        session.reserve(len(prompt[0]), 2)
    e, text = error_of(info)
    assert e.code == "out_of_memory" and f"compiled programs {need['programs'] / 2**20:.1f} MiB" in text
    assert "--parallel" in e.fix and session.executor.weights == {}


@pytest.mark.parametrize("short_of", ["caches", "weights"])
def test_out_of_memory_names_what_drives_the_need_and_a_fix_that_works(smollm2, cpu, prompt, short_of):
    """The error names the largest weights and the caches; its fix, applied, makes the plans fit: a
    --ctx that fits when the caches are what overflows, another device after it when the weights alone do
    (the layers that do not fit go on to it)."""
    n_ctx = 2048
    need = Session(smollm2, [ExampleDevice(), cpu], n_ctx=n_ctx).reserve(len(prompt[0]), 2).memory["example:0"]
    assert need["caches"] > 0                                    # example:0 holds the KV cache
    limit = (need["total"] - need["caches"] // 2 if short_of == "caches" else need["weights"] // 2)
    session = Session(smollm2, [ExampleDevice(memory=limit)], n_ctx=n_ctx)
    with pytest.raises(CapabilityError) as info:
        session.reserve(len(prompt[0]), 2)
    e, text = error_of(info)
    assert e.code == "out_of_memory" and "token_embd.weight" in text          # the largest weight, named
    assert "cache_k_l0" in text and f"of {n_ctx} rows" in text
    if short_of == "caches":
        m = re.search(r"--ctx (\d+)\)", e.fix)
        assert m, e.fix
        fitted = Session(smollm2, [ExampleDevice(memory=limit)], n_ctx=int(m.group(1)))
        assert fitted.reserve(len(prompt[0]), 2).memory["example:0"]["total"] <= limit
    else:
        assert "the weights alone need" in e.fix and "list another device after example:0" in e.fix
        fitted = Session(smollm2, [ExampleDevice(memory=limit), cpu], n_ctx=n_ctx).reserve(len(prompt[0]), 2)
        assert 0 < fitted.memory["example:0"]["total"] <= limit and fitted.memory["cpu"]["weights"] > 0


# -- g. --strict -------------------------------------------------------------------------------

def test_strict_refuses_fallbacks_and_lists_them(smollm2, cpu, prompt):
    ok = Session(smollm2, [ExampleDevice(), cpu], n_ctx=N_CTX, strict=True)
    ok.reserve(len(prompt[0]), 2)                                # nothing refused: strict is satisfied

    ex = ExampleDevice(refuse="ROPE")
    session = Session(smollm2, [ex, cpu], n_ctx=N_CTX, strict=True)
    with pytest.raises(CapabilityError) as info:
        session.reserve(len(prompt[0]), 2)
    e, text = error_of(info)
    assert e.code == "strict_fallback"
    assert e.node == "Qcur_rope-0" and e.devices == ("example:0", "cpu")
    assert f"{2 * smollm2.hp.n_layer} nodes" in text and "would not run on example:0" in text
    # one line for the op and its reason, not one per node
    n = 2 * smollm2.hp.n_layer
    assert re.search(rf"\n    {n} ROPE nodes -> cpu \(first: Qcur_rope-0, .*; also Kcur_rope-0, Qcur_rope-1 and "
                     rf"{n - 3} more\); example:0: refused_by_config: .*refuse ROPE", text), text
    assert "Kcur_rope-1 (" not in text
    assert session.executor.weights == {} and ex.compiled == 0


# -- h. a node no device accepts ---------------------------------------------------------------

def test_node_no_device_accepts(smollm2, prompt):
    ex = ExampleDevice(refuse="ROPE")
    session = Session(smollm2, [ex], n_ctx=N_CTX)
    with pytest.raises(CapabilityError) as info:
        session.reserve(len(prompt[0]), 2)
    e, text = error_of(info)
    assert e.code == "no_device_for_node"
    assert e.node == "Qcur_rope-0" and e.devices == ("example:0",)
    assert "no device accepts node 'Qcur_rope-0' (ROPE" in text
    assert "example:0 says refused_by_config: example:0 is configured to refuse ROPE" in text
    assert e.fix and session.executor.weights == {}


# -- i. bad --backends -------------------------------------------------------------------------

@pytest.mark.parametrize("spec, message", [
    ("nope", "unknown backend 'nope'"),
    ("npu", "alias 'npu' matches no available NPU device"),
    ("gpu", "alias 'gpu' matches no available GPU device"),
    ("", "--backends is empty"),
    ("cpu,nope", "unknown backend 'nope'"),
])
def test_bad_backends_on_the_command_line(capsys, monkeypatch, registry, spec, message):
    kind = ALIASES.get(spec)
    if kind is not None and any(d.type == kind and d.available for d in registry.devices()):
        pytest.skip(f"this machine has an available {kind.value} device, so '{spec}' is not a bad value here")
    monkeypatch.setenv("COLUMNS", "1000")
    rc = cli_main(["run", "-m", str(model_path("smollm2")), "--backends", spec, "-n", "1"])
    assert rc == 2
    captured = capsys.readouterr()
    err = re.sub(r"\x1b\[[0-9;]*m", "", captured.err)
    assert "error:" in err and message in err, err
    for device in ("cpu (CPU, available)", "example:0 (ACCEL, available)"):   # every device is listed
        assert device in err, err
    assert captured.out == ""                                   # nothing was generated


def test_capability_error_on_the_command_line_keeps_its_code(capsys, monkeypatch):
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_REFUSE", "ROPE")
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_MAX_PROGRAMS", "2")
    rc = cli_main(["run", "-m", str(model_path("smollm2")), "--backends", "example:0,cpu", "-n", "2",
                   "--ctx", str(N_CTX)])
    assert rc == 1                                              # a capability error, on every command
    err = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().err)
    assert "allows 2 live compiled programs" in err, err       # reservation failed before loading
    assert "[program_budget]" in err, err


# -- j. the KV cache on the example device -----------------------------------------------------

def _cache_nodes(plan):
    writes = [n for n in plan.graph.nodes if n.op == "SET_ROWS"]
    reads = [n for n in plan.graph.nodes if n.op not in VIEW_OPS and n.op != "SET_ROWS"
             and any(s.storage.is_leaf and s.storage.kind is not None and s.storage.kind.value == "cache"
                     for s in n.src)]
    return writes, reads


def test_kv_cache_on_the_example_device(smollm2, cpu, prompt, cpu_logits):
    ex = ExampleDevice(refuse="ROPE")
    session = Session(smollm2, [ex, cpu], n_ctx=N_CTX, kv_device="example:0")
    homes = set(session.residence.values())
    assert {(h.device, h.buffer) for h in homes} == {("example:0", EXAMPLE_BUFFER)}
    assert len(session.residence) == 2 * smollm2.hp.n_layer
    session.reserve(len(prompt[0]), 2)

    for plan, _ in session.plans.values():
        writes, reads = _cache_nodes(plan)
        assert len(writes) == 2 * smollm2.hp.n_layer and len(reads) == smollm2.hp.n_layer
        for n in writes:
            p = plan.placement[id(n)]
            assert p.device == "example:0" and p.reason.startswith("pinned"), (n.name, p)
            assert "held on example:0" in p.reason
        for n in reads:
            assert plan.device_of(n) == "example:0", n.name

    assert_matches_cpu(session, prompt, cpu_logits)
    caches = session.executor.caches
    assert len(caches) == 2 * smollm2.hp.n_layer
    assert all(dev == "example:0" and isinstance(h, ExampleBuffer) for dev, h in caches.values())
    # the cache rows the steps wrote are there, on example:0 (prompt + one decode step)
    k0 = caches[id(session.cache.k[0])][1].array
    n = len(prompt[0]) + 1
    assert np.abs(k0[:n]).sum(axis=1).min() > 0 and not k0[n:].any()


def test_cache_readers_are_pinned_through_views_when_the_cpu_comes_first(smollm2, cpu, prompt, cpu_logits):
    ex = ExampleDevice()
    session = Session(smollm2, [cpu, ex], n_ctx=N_CTX, kv_device="example:0")
    session.reserve(len(prompt[0]), 2)
    plan = prefill_plan(session)
    writes, reads = _cache_nodes(plan)
    for n in writes + reads:
        p = plan.placement[id(n)]
        assert p.device == "example:0" and p.reason.startswith("pinned"), (n.name, p)
    assert_matches_cpu(session, prompt, cpu_logits)


def test_cpu_cannot_write_a_cache_held_in_the_private_buffer(smollm2, cpu, prompt):
    ex = ExampleDevice(refuse="SET_ROWS")       # the cache's owner will not write it: cpu would have to
    session = Session(smollm2, [cpu, ex], n_ctx=N_CTX, kv_device="example:0")
    with pytest.raises(CapabilityError) as info:
        session.reserve(len(prompt[0]), 2)
    e, text = error_of(info)
    assert e.code == "buffer_not_usable"
    assert e.tensor == "cache_k_l0" and e.node == "k_cache_write-0" and e.devices == ("example:0", "cpu")
    assert "example_private" in text and "same physical device (host-cpu)" in text
    assert session.executor.weights == {} and session.executor.caches == {}


# -- Gemma 3: one mixed run --------------------------------------------------------------------

def test_gemma3_mixed_plan_matches_cpu(cpu):
    model = load_model("gemma3")
    p = reference("gemma3")[0]["prompts"][0]
    ids, follow = p["ids"], p["greedy_ids"][0]
    want = prefill_and_decode(Session(model, [cpu], n_ctx=N_CTX), ids, follow)

    ex = ExampleDevice(refuse="GLU")            # Gemma's GEGLU falls back; the KV cache stays on example:0
    session = Session(model, [ex, cpu], n_ctx=N_CTX)
    session.reserve(len(ids), 2)
    assert {h.device for h in session.residence.values()} == {"example:0"}
    plan = prefill_plan(session)
    assert {fb["op"] for fb in plan.to_dict()["fallbacks"]} == {"GLU"}
    use = plan.per_device()["example:0"]
    assert use["fragments"] >= model.hp.n_layer and use["programs"] < use["fragments"] // 2, use

    got = prefill_and_decode(session, ids, follow)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, **TIGHT)
    assert int(np.argmax(got[0])) == follow
