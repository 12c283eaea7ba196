"""Memory-aware placement (framework/core/scheduler/memory.py, pass 2 of plan.py): a device whose memory
cannot hold all that its verdicts accept keeps whole layers, in order, with their KV caches, and the next
device in the list takes the rest; every moved node says so with the numbers.

What runs here, and how it is kept cheap on lavapipe (vulkan:0 in CI, a software Vulkan driver):
* plans (no weight loaded, nothing compiled) of both models with vulkan:0 capped at several sizes by
  --device-memory (Session(memory_caps=...)): the layers split as a prefix on vulkan:0 and the rest on the
  cpu, the caches with their layers, the copies between devices counted and named, the memory within the
  cap, both phases split alike, and the numbers of a move checked as the real thresholds (a cap of what the
  move says the next layer needs takes that layer);
* one real run on lavapipe (Gemma 3, part of its layers on vulkan:0, the rest on the cpu) against
  llama.cpp's greedy tokens with the README's bounds (tests/reference_checks.py), on the first prompt;
* the example plugin (examples/plugin-example) capped, through its own memory setting and a cap, and a
  `framework run` of it with the cpu that gives llama.cpp's greedy text, its private buffers crossing at the
  cut;
* a cascade over three devices, a budget the plugin reports as free memory, --strict with a cap, a cap too
  small for anything, and the reports: `framework check`, `--plan` JSON, `framework split`, the run summary.
"""

from __future__ import annotations

import json

import pytest
from conftest import load_model, reference
from framework_plugin_example import ExampleDevice
from reference_checks import assert_teacher_forced

from framework.cli import main
from framework.cli.common import device_memory
from framework.core.graph import VIEW_OPS
from framework.core.scheduler import CapabilityError
from framework.core.scheduler.memory import INPUT, OUTPUT, parts_of
from framework.runtime.session import Session

MiB = 1 << 20
N_CTX, N_BATCH = 256, 32
PROMPT, PREDICT = 8, 8
CAPS = {"smollm2": (16, 40, 80), "gemma3": (16, 40, 80)}     # MiB: a few layers, a third, most of them


@pytest.fixture(autouse=True)
def _no_example_settings(monkeypatch):
    for var in ("FRAMEWORK_EXAMPLE_REFUSE", "FRAMEWORK_EXAMPLE_MAX_PROGRAMS", "FRAMEWORK_EXAMPLE_MAX_CHAIN",
                "FRAMEWORK_EXAMPLE_MEMORY"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def vk(registry):
    dev = registry.select("vulkan:0")[0]
    if not dev.available:
        pytest.fail(f"vulkan:0 is unavailable: {dev.unavailable_reason} (make test installs mesa-vulkan-drivers)")
    return dev


@pytest.fixture(scope="module")
def cpu(registry):
    return registry.select("cpu")[0]


def capped(model, devices, caps_mib: dict[str, float], **kwargs) -> tuple[Session, dict]:
    """A session with these caps, reserved for a short run: (session, phase -> plan)."""
    session = Session(model, devices, n_ctx=N_CTX, n_batch=N_BATCH,
                      memory_caps={d: int(c * MiB) for d, c in caps_mib.items()}, **kwargs)
    return session, session.reserve(PROMPT, PREDICT).plans


def kept_layers(session, device: str) -> list[int]:
    return [p for p in session.fit.kept().get(device, []) if isinstance(p, int)]


def part_devices(plan) -> dict:
    """part (layer index, "input", "output") -> the devices its computing nodes run on."""
    parts = parts_of(plan.graph)
    out: dict = {}
    for n in plan.graph.nodes:
        if n.op not in VIEW_OPS:
            out.setdefault(parts[id(n)], set()).add(plan.device_of(n))
    return out


def check_split(session, plans, first: str) -> tuple[list[int], dict]:
    """The properties every capped plan has; returns the layers `first` keeps and part -> device."""
    n_layer = session.model.hp.n_layer
    placed = None
    for plan in plans.values():
        parts = part_devices(plan)
        assert all(len(devs) == 1 for devs in parts.values()), parts            # every part whole
        one = {p: next(iter(d)) for p, d in parts.items()}
        assert placed is None or one == placed                                  # both phases split alike
        placed = one
        layers = [il for il in range(n_layer) if one[il] == first]
        assert layers == list(range(len(layers)))                               # a prefix, in order
        # the copies: one per change of device between consecutive parts, of the part's last node
        order = [INPUT, *range(n_layer), OUTPUT]
        last = {parts_of(plan.graph)[id(n)]: n.name for n in plan.graph.nodes if n.op not in VIEW_OPS}
        want = sorted(last[a] for a, b in zip(order, order[1:]) if one[a] != one[b])
        assert sorted(c.tensor for c in plan.copies) == want, (plan.copies, want)
        for n in plan.graph.nodes:                                              # moved nodes carry the numbers
            p = plan.placement[id(n)]
            if n.op not in VIEW_OPS and p.device != first:
                (move,) = p.memory
                assert move.device == first and move.held <= move.limit < move.needed
                assert p.refusals[first].code == "memory" and p.refusals[first].reason.startswith("it has ")
    for t in session.cache.tensors():                                           # each cache with its layer
        assert session.residence[id(t)].device == placed[t.layer], t.name
    return [il for il in range(n_layer) if placed[il] == first], placed


# -- the split, planned ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, cap", [(m, c) for m, caps in CAPS.items() for c in caps])
def test_capped_vulkan_keeps_whole_layers_in_order(vk, cpu, name, cap):
    model = load_model(name)
    session, plans = capped(model, [vk, cpu], {"vulkan:0": cap})
    layers, placed = check_split(session, plans, "vulkan:0")
    assert 0 < len(layers) < model.hp.n_layer, (name, cap, layers)
    for plan in plans.values():                                   # within the cap in every phase
        assert 0 < plan.memory["vulkan:0"]["total"] <= cap * MiB
        assert plan.budgets["vulkan:0"].nbytes == cap * MiB and plan.budgets["vulkan:0"].source == "capped"
    # the embedding table does not fit beside the layers: it stays on the cpu, a second cut (two copies)
    (move,) = [m for m in session.fit.device_moves()["vulkan:0"] if m.part == "input"]
    table = vk.weight_nbytes(model.arch.weight("token_embd.weight"))
    assert move.needed > cap * MiB and move.needed - move.held >= table
    assert placed[INPUT] == placed[OUTPUT] == "cpu"
    assert all(len(p.copies) == 2 for p in plans.values())


@pytest.mark.parametrize("name", list(CAPS))
def test_the_numbers_of_a_move_are_the_thresholds(vk, cpu, name):
    """What a move says the next layer would need is the exact cap that takes that layer too."""
    model = load_model(name)
    session, _ = capped(model, [vk, cpu], {"vulkan:0": 40})
    k = len(kept_layers(session, "vulkan:0"))
    (move,) = [m for m in session.fit.device_moves()["vulkan:0"] if m.part == f"layer {k}"]
    more, _ = capped(model, [vk, cpu], {"vulkan:0": move.needed / MiB})
    assert kept_layers(more, "vulkan:0") == list(range(k + 1))
    same, _ = capped(model, [vk, cpu], {"vulkan:0": (move.needed - 1) / MiB})
    assert kept_layers(same, "vulkan:0") == list(range(k))


def test_all_layers_but_not_the_embedding_table(vk, cpu):
    """Gemma 3's 170 MiB embedding table (tied to the output) does not fit 150 MiB, its 18 layers do: they
    all run on vulkan:0, the token lookup and the output head on the cpu, two copies a step."""
    model = load_model("gemma3")
    session, plans = capped(model, [vk, cpu], {"vulkan:0": 150})
    layers, placed = check_split(session, plans, "vulkan:0")
    assert layers == list(range(model.hp.n_layer)) and placed[INPUT] == placed[OUTPUT] == "cpu"
    assert vk.weight_nbytes(model.arch.weight("token_embd.weight")) > 150 * MiB
    for plan in plans.values():
        assert [c.tensor for c in plan.copies] == ["inp_scaled", f"l_out-{model.hp.n_layer - 1}"]


@pytest.mark.parametrize("name", list(CAPS))
def test_a_cap_that_holds_everything_changes_nothing(vk, cpu, name):
    model = load_model(name)
    free = Session(model, [vk, cpu], n_ctx=N_CTX, n_batch=N_BATCH).reserve(PROMPT, PREDICT)
    session, plans = capped(model, [vk, cpu], {"vulkan:0": 400})
    assert not session.fit.moves and session.fit.lines() == []
    for phase, plan in plans.items():
        assert [p.device for p in plan.placement.values()] == [p.device for p in free.plans[phase].placement.values()]
        assert not plan.copies and not plan.fallbacks


def test_the_fit_is_deterministic(vk, cpu):
    model = load_model("smollm2")
    records = [json.dumps(capped(model, [vk, cpu], {"vulkan:0": 40})[1]["decode[tokens=1,kv=256]"].to_dict())
               for _ in range(2)]
    assert records[0] == records[1]


def test_a_cap_too_small_for_anything(vk, cpu):
    """Nothing fits 1 MiB: every node runs on the cpu, each saying why; alone, vulkan:0 fails at reservation
    with the out-of-memory error naming the largest tensors."""
    model = load_model("smollm2")
    session, plans = capped(model, [vk, cpu], {"vulkan:0": 1})
    layers, placed = check_split(session, plans, "vulkan:0")
    assert layers == [] and set(placed.values()) == {"cpu"}
    for plan in plans.values():
        assert not plan.copies and "vulkan:0" not in plan.per_device()
        reasons = {plan.placement[id(n)].refusals["vulkan:0"].reason for n in plan.graph.nodes if n.op not in VIEW_OPS}
        assert all("it has 1.0 MiB (capped) and keeps no layer" in r for r in reasons), reasons
    alone = Session(model, [vk], n_ctx=N_CTX, n_batch=N_BATCH, memory_caps={"vulkan:0": MiB})
    with pytest.raises(CapabilityError) as info:
        alone.reserve(PROMPT, PREDICT)
    e = info.value
    assert e.code == "out_of_memory" and e.devices == ("vulkan:0",) and e.limit == f"memory_bytes={MiB}"
    assert "device vulkan:0 has 1.0 MiB (capped)" in str(e) and "largest: token_embd.weight" in str(e)


def test_strict_treats_a_move_for_memory_as_a_fallback(vk, cpu):
    model = load_model("smollm2")
    session = Session(model, [vk, cpu], n_ctx=N_CTX, n_batch=N_BATCH, strict=True, memory_caps={"vulkan:0": 40 * MiB})
    with pytest.raises(CapabilityError) as info:
        session.reserve(PROMPT, PREDICT)
    e = info.value
    assert e.code == "strict_fallback" and "would not run on vulkan:0" in str(e)
    assert "vulkan:0: memory: it has 40.0 MiB (capped)" in str(e)
    assert "lift the cap of --device-memory" in e.fix and "with layer" in e.fix
    capped(model, [vk, cpu], {"vulkan:0": 400}, strict=True)          # a cap that holds everything: strict passes


def test_a_cache_on_the_kv_device_leaves_room_for_layers(vk, cpu):
    """--kv-device cpu: every cache on the cpu, so vulkan:0 holds layers without their caches, more of them."""
    model = load_model("smollm2")
    with_caches, _ = capped(model, [vk, cpu], {"vulkan:0": 40})
    session, plans = capped(model, [vk, cpu], {"vulkan:0": 40}, kv_device="cpu")
    assert {r.device for r in session.residence.values()} == {"cpu"}
    assert len(kept_layers(session, "vulkan:0")) > len(kept_layers(with_caches, "vulkan:0"))
    assert all(plan.memory["vulkan:0"]["caches"] == 0 for plan in plans.values())


# -- a real run within llama.cpp's bounds ------------------------------------------------------------

def test_a_split_run_follows_llama_cpp(vk, cpu):
    """Gemma 3 with vulkan:0 capped at 80 MiB: its first layers on lavapipe, the rest on the cpu; llama.cpp's
    greedy tokens for the first prompt, fed in one prefill, within the README's bounds."""
    model = load_model("gemma3")
    ref = reference("gemma3")[0]
    session = Session(model, [vk, cpu], n_ctx=N_CTX, n_batch=64, memory_caps={"vulkan:0": 80 * MiB})
    assert 0 < len(kept_layers(session, "vulkan:0")) < model.hp.n_layer
    assert_teacher_forced(session, dict(ref, prompts=ref["prompts"][:1]))
    stats = session.executor.stats
    assert stats["vulkan:0"]["runs"] > 0 and stats["cpu"]["runs"] > 0
    (plan,) = [p for p, _ in session.plans.values()]
    assert len(plan.copies) == 2 and stats["vulkan:0"]["bytes_copied"] == stats["vulkan:0"]["runs"] * sum(
        c.nbytes for c in plan.copies if c.dst_device == "vulkan:0")


# -- the example plugin ------------------------------------------------------------------------------

def test_the_example_plugin_capped(cpu):
    """example:0 declaring 40 MiB (its own memory setting), and a tighter cap over it: the smaller wins, and
    the layers it cannot hold go to the cpu (test_run_summary_shows_memory_per_phase runs such a plan)."""
    model = load_model("smollm2")
    declared, _ = capped(model, [ExampleDevice(memory=40 * MiB), cpu], {})
    assert declared.budgets["example:0"].source == "declared"
    session, plans = capped(model, [ExampleDevice(memory=40 * MiB), cpu], {"example:0": 20})
    assert session.budgets["example:0"].nbytes == 20 * MiB and session.budgets["example:0"].source == "capped"
    layers, _ = check_split(session, plans, "example:0")
    assert 0 < len(layers) < len(kept_layers(declared, "example:0"))


def test_a_cascade_over_three_devices(vk, cpu):
    """example:0 and vulkan:0 both capped: each keeps the next layers in order, the cpu the rest."""
    model = load_model("smollm2")
    session, plans = capped(model, [ExampleDevice(), vk, cpu], {"example:0": 16, "vulkan:0": 16})
    a, b = kept_layers(session, "example:0"), kept_layers(session, "vulkan:0")
    assert a == list(range(len(a))) and b == list(range(len(a), len(a) + len(b))) and a and b
    for plan in plans.values():
        placed = {p: next(iter(d)) for p, d in part_devices(plan).items()}
        assert [placed[il] for il in range(model.hp.n_layer)] == (
            ["example:0"] * len(a) + ["vulkan:0"] * len(b) + ["cpu"] * (model.hp.n_layer - len(a) - len(b)))
        assert len(plan.copies) == 3           # input (cpu) -> example:0 -> vulkan:0 -> cpu
        moved = [plan.placement[id(n)] for n in plan.graph.nodes if placed.get(parts_of(plan.graph)[id(n)]) == "cpu"
                 and n.op not in VIEW_OPS]
        assert all([m.device for m in p.memory] == ["example:0", "vulkan:0"] for p in moved)


def test_free_memory_a_plugin_reports_is_the_budget(cpu):
    class Reporting(ExampleDevice):
        def free_memory(self) -> int:
            return 20 * MiB

    model = load_model("smollm2")
    session, plans = capped(model, [Reporting(memory=40 * MiB), cpu], {})
    assert session.budgets["example:0"].nbytes == 20 * MiB and session.budgets["example:0"].source == "reported free"
    assert all(plan.memory["example:0"]["total"] <= 20 * MiB for plan in plans.values())


# -- the command line and the reports ---------------------------------------------------------------

@pytest.mark.parametrize("text, want", [("vulkan:0=200M", ("vulkan:0", 200 * MiB)),
                                        ("npu:0=1.5G", ("npu:0", 3 << 29)), ("cpu=4096", ("cpu", 4096)),
                                        ("example:0 = 512KiB", ("example:0", 512 << 10))])
def test_device_memory_sizes(text, want):
    assert device_memory(text) == want


def run_cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, " ".join(captured.err.split())


@pytest.mark.parametrize("argv, expect", [
    (["--device-memory", "vulkan:0"], "'vulkan:0' is not DEVICE=SIZE"),
    (["--device-memory", "vulkan:0=lots"], "'vulkan:0=lots' is not DEVICE=SIZE"),
    (["--device-memory", "vulkan:0=0"], "the size must be at least 1 byte"),
    (["--device-memory", "example:0=1M"], "--device-memory names example:0, which is not among the selected"),
    (["--device-memory", "cpu=1G", "--device-memory", "cpu=2G"], "--device-memory caps cpu twice"),
])
def test_bad_device_memory_is_a_usage_error(capsys, argv, expect):
    try:
        code = main(["check", "-m", "smollm2", "--backends", "cpu", *argv])
    except SystemExit as e:             # argparse's usage error
        code = e.code
    err = " ".join(capsys.readouterr().err.split())
    assert code == 2 and expect in err, err


def test_check_and_its_plan_json_show_memory_per_phase(capsys, tmp_path, vk):
    path = tmp_path / "plan.json"
    code, out, _ = run_cli(capsys, "check", "-m", "smollm2", "--backends", "vulkan:0,cpu", "--device-memory",
                           "vulkan:0=40M", "--ctx", str(N_CTX), "--batch", str(N_BATCH), "--prompt-tokens",
                           str(PROMPT), "-n", str(PREDICT), "--plan", str(path))
    assert code == 0
    for phase in ("prefill[tokens=8,kv=256]", "decode[tokens=1,kv=256]"):
        assert any(line.strip().startswith(phase + "  vulkan:0:") and "MiB of 40.0 MiB (capped)" in line
                   for line in out.splitlines()), out
    assert "memory fit: vulkan:0 keeps layers 0-" in out and "memory fit: cpu keeps input, layers" in out
    assert "fallback for memory:" in out
    record = json.loads(path.read_text())
    for plan in record["plans"].values():
        memory = plan["memory"]["vulkan:0"]
        assert memory["limit"] == 40 * MiB and memory["limit_source"] == "capped"
        assert 0 < plan["memory"]["vulkan:0"]["total"] <= 40 * MiB
        moved = [n for n in plan["nodes"] if "memory" in n]
        assert moved and all(n["device"] == "cpu" and n["memory"][0]["device"] == "vulkan:0" for n in moved)
        assert plan["fit"]["budgets"]["vulkan:0"] == {"nbytes": 40 * MiB, "source": "capped"}
        on_vk = {n["layer"] for n in plan["nodes"] if n["device"] == "vulkan:0" and "layer" in n}
        moved_layers = {n["layer"] for n in moved if "layer" in n}
        assert on_vk and moved_layers and on_vk.isdisjoint(moved_layers) and on_vk | moved_layers == set(range(30))
    code, _, err = run_cli(capsys, "check", "-m", "smollm2", "--backends", "vulkan:0,cpu", "--device-memory",
                           "vulkan:0=40M", "--ctx", str(N_CTX), "--strict")
    assert code == 1 and "[strict_fallback]" in err and "memory: it has 40.0 MiB (capped)" in err


def test_split_view_shows_the_budget_and_the_fit(capsys, tmp_path, vk):
    args = ["split", "-m", "gemma3", "--backends", "vulkan:0,cpu", "--device-memory", "vulkan:0=40M", "--ctx",
            str(N_CTX), "--batch", str(N_BATCH), "--prompt-tokens", str(PROMPT), "-n", str(PREDICT)]
    code, out, _ = run_cli(capsys, *args)
    assert code == 0
    assert "vulkan:0     live programs" in out and "of 40.0 MiB, capped" in out
    assert out.count("memory fit: vulkan:0 keeps layers 0-") == 2           # under each phase
    assert "fallback for memory" in out
    page = tmp_path / "plan.html"
    code, _, _ = run_cli(capsys, *args, "-o", str(page))
    html = page.read_text()
    assert code == 0 and "memory fit: vulkan:0 keeps layers 0-" in html and '"limit_source":"capped"' in html


def test_run_summary_shows_memory_per_phase(capsys):
    """A run on the example plugin capped at 40 MiB and the cpu: llama.cpp's greedy text (the private buffers
    crossed at the cut through to_host/from_host), and the summary's memory per phase against the cap."""
    p = reference("smollm2")[0]["prompts"][0]
    code, out, err = run_cli(capsys, "run", p["prompt"], "-m", "smollm2", "-n", "6", "--backends", "example:0,cpu",
                             "--device-memory", "example:0=40M", "--ctx", str(N_CTX), "--batch", str(N_BATCH))
    assert code == 0 and out.startswith(p["prompt"] + p["greedy_text"][:8]), out
    assert "memory pre/dec" in err and "of 40.0 MiB" in err
    assert "memory fit: example:0 keeps layers 0-" in err and "fallback for memory" in err
