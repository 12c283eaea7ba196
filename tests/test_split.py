"""`framework split`: the views of a plan (terminal text, plan record, Graphviz, interactive HTML),
for two-device plans of the default model (Gemma 3 270M) on cpu and example:0, and for plans that
failed reservation. The HTML page is opened in a real browser: Debian's chromium, headless, driven
by playwright; the screenshot is kept in artifacts/split.png.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from conftest import load_model, model_path
from framework_plugin_example import ExampleDevice

from framework.cli import main as cli_main
from framework.core.graph import VIEW_OPS
from framework.runtime.session import Session
from framework.viz import UNPLACED, GraphvizMissing, PlanView, render_dot, render_text, write_view
from framework.viz import dot as dot_module
from framework.core.scheduler.fallbacks import count, group_fallbacks
from framework.viz.record import human_bytes

N_CTX, N_PROMPT, N_PREDICT = 256, 8, 4
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "artifacts"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
EXAMPLE_ENV = ("FRAMEWORK_EXAMPLE_REFUSE", "FRAMEWORK_EXAMPLE_MAX_PROGRAMS", "FRAMEWORK_EXAMPLE_MAX_CHAIN",
               "FRAMEWORK_EXAMPLE_MEMORY")


@pytest.fixture(autouse=True)
def _no_example_settings(monkeypatch):
    for var in EXAMPLE_ENV:
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def gemma():
    return load_model("gemma3")


@pytest.fixture(scope="module")
def cpu(registry):
    return registry.select("cpu")[0]


def make_view(model, devices, **session_args) -> PlanView:
    session = Session(model, devices, n_ctx=N_CTX, **session_args)
    return PlanView.from_session(session, N_PROMPT, N_PREDICT)


@pytest.fixture(scope="module")
def two_device(gemma, cpu) -> PlanView:
    """Gemma on example:0 first, cpu second; example:0 refuses ROPE, so every ROPE falls back to cpu."""
    view = make_view(gemma, [ExampleDevice(refuse="ROPE"), cpu])
    assert view.error is None and view.reservation is not None
    return view


# -- checking the terminal text against the plan ------------------------------------------------

def phase_sections(text: str, view: PlanView) -> dict[str, list[str]]:
    out, current = {}, None
    for line in text.splitlines():
        head = line.split(":", 1)[0]
        if head in view.plans and not line.startswith(" "):
            current = out.setdefault(head, [])
        elif current is not None and line.startswith("  "):
            current.append(line)
        else:
            current = None
    return out


def check_text_against_plan(text: str, view: PlanView) -> dict[str, dict[int, str]]:
    """Every fragment has its line: device, node count and range, first and last node, each tensor
    copied in with its bytes and source device, its fallbacks. Returns phase -> fragment -> its line."""
    sections = phase_sections(text, view)
    assert set(sections) == set(view.plans), (set(sections), text[:2000])
    devices = "|".join(re.escape(d) for d in view.lanes)
    head = re.compile(rf"^  #(\d+)\s+({devices})\s+(\d+) nodes?\s+\[(\d+)-(\d+)\] (\S+)(?: \.\. (\S+))?")
    lines_of = {}
    for phase, plan in view.plans.items():
        lines = sections[phase]
        assert lines[0].startswith(phase) is False     # the phase's own header is not indented
        heads = [(i, head.match(line)) for i, line in enumerate(lines)]
        heads = [(i, m) for i, m in heads if m]
        assert len(heads) == len(plan.fragments), phase
        index = {id(n): i for i, n in enumerate(plan.graph.nodes)}
        lines_of[phase] = {}
        for (i, m), f in zip(heads, plan.fragments):
            assert int(m[1]) == f.index and m[2] == f.device and int(m[3]) == len(f.nodes)
            assert int(m[4]) == index[id(f.nodes[0])] and int(m[5]) == index[id(f.nodes[-1])]
            assert m[6] == f.nodes[0].name and (m[7] or m[6]) == f.nodes[-1].name
            detail = lines[i + 1] if i + 1 < len(lines) and not head.match(lines[i + 1]) else ""
            lines_of[phase][f.index] = lines[i] + "\n" + detail
            copies = [c for c in plan.copies if c.fragment == f.index]
            if copies:
                assert detail.strip().startswith("in: "), (lines[i], detail)
                for c in copies:
                    assert f"{c.tensor} {human_bytes(c.nbytes)}" in detail, (c, detail)
                    assert f"from {c.src_device}" in detail
            else:
                assert "in: " not in detail
            fallbacks = [n for n in f.nodes if plan.placement[id(n)].refusals]
            if fallbacks and f.device != UNPLACED:
                assert f"fallback {len(fallbacks)} ({', '.join(sorted({n.op for n in fallbacks}))})" in detail
        per_device = [line for line in lines if line.startswith("  per device: ")]
        assert len(per_device) == 1
        for dev, use in plan.per_device().items():
            assert f"{dev} {count(use['nodes'], 'node')}, {count(use['fragments'], 'fragment')}" in per_device[0]
    return lines_of


def copy_edges(plan) -> dict[tuple[int, int], int]:
    """(fragment that made the tensor, fragment that reads it) -> bytes copied."""
    frag_of = {n.name: f.index for f in plan.fragments for n in f.nodes}
    edges: dict[tuple[int, int], int] = {}
    for c in plan.copies:
        key = (frag_of[c.tensor], c.fragment)
        edges[key] = edges.get(key, 0) + c.nbytes
    return edges


def plain(record) -> object:
    return json.loads(json.dumps(record))


# -- a two-device plan ----------------------------------------------------------------------------

def test_text_summary_of_a_two_device_plan(two_device):
    plan = next(iter(two_device.plans.values()))
    assert {f.device for f in plan.fragments} == {"example:0", "cpu"} and plan.copies and plan.fallbacks
    text = render_text(two_device)
    assert "RESERVATION FAILED" not in text and "<-- ERROR" not in text
    lines = check_text_against_plan(text, two_device)
    # the ROPE fallbacks: each one on its cpu fragment's line, and once per op with example:0's refusal
    for phase, p in two_device.plans.items():
        for f in p.fragments:
            if any(n.op == "ROPE" for n in f.nodes):
                assert f.device == "cpu" and "fallback" in lines[phase][f.index]
        assert re.search(r"fallback: 36 ROPE nodes would run on cpu \(first: Qcur_rope-0\); example:0: "
                         r"refused_by_config: example:0 is configured to refuse ROPE", text)
    # budgets, against what reservation counted
    for dev, n in two_device.reservation.programs.items():
        assert re.search(rf"^  {re.escape(dev)}\s+live programs {n} of no limit;", text, re.MULTILINE), dev
    mem = two_device.reservation.memory["example:0"]
    assert f"memory {human_bytes(mem['total'])} of no limit (weights {human_bytes(mem['weights'])}" in text


def test_json_is_the_plan_record(two_device, tmp_path):
    path = write_view(two_device, tmp_path / "plan.json")
    record = json.loads(path.read_text())
    assert record["devices"] == ["example:0", "cpu"] and record["error"] is None
    assert record["plans"].keys() == two_device.plans.keys()
    for phase, plan in two_device.plans.items():
        assert record["plans"][phase] == plain(plan.to_dict())
    assert record["reservation"] == plain({"programs": two_device.reservation.programs,
                                           "memory": two_device.reservation.memory})


def test_dot_has_a_box_per_fragment_and_an_edge_per_copy(two_device):
    text = render_dot(two_device)
    for p, plan in enumerate(two_device.plans.values()):
        assert len(re.findall(rf"^    p{p}f\d+ \[", text, re.MULTILINE)) == len(plan.fragments)
        for (a, b), nbytes in copy_edges(plan).items():
            assert re.search(rf'p{p}f{a} -> p{p}f{b} \[label="{re.escape(human_bytes(nbytes))}', text), (a, b)


def test_svg_with_graphviz_or_how_to_get_it(two_device, tmp_path, monkeypatch):
    target = tmp_path / "plan.svg"
    if dot_module.dot_program():
        write_view(two_device, target)
        assert target.read_text().lstrip().startswith("<?xml") and "<svg" in target.read_text()
    monkeypatch.setattr(dot_module, "dot_program", lambda: None)
    monkeypatch.setattr("framework.viz.dot_program", lambda: None)
    target = tmp_path / "again.svg"
    with pytest.raises(GraphvizMissing, match=r"apt-get install graphviz.*dot -Tsvg .*again\.dot -o .*again\.svg"):
        write_view(two_device, target)
    assert not target.exists() and (tmp_path / "again.dot").read_text().startswith("digraph plan {")


# -- plans that failed reservation -------------------------------------------------------------

FAILURES = {
    # code: (devices, session arguments, node named, tensor named, budget exceeded)
    "no_device_for_node": (lambda cpu: [ExampleDevice(refuse="ROPE")], {}, "Qcur_rope-0", None, None),
    "program_budget": (lambda cpu: [ExampleDevice(refuse="ROPE", max_programs=3), cpu], {}, None, None, "programs"),
    "buffer_not_usable": (lambda cpu: [cpu, ExampleDevice(refuse="SET_ROWS")], {"kv_device": "example:0"},
                          "k_cache_write-0", "cache_k_l0", None),
    # alone: with a device after it, the layers it cannot hold would go on to that one (tests/test_memory_fit.py)
    "out_of_memory": (lambda cpu: [ExampleDevice(memory=1 << 20)], {}, None, None, "memory"),
    "strict_fallback": (lambda cpu: [ExampleDevice(refuse="ROPE"), cpu], {"strict": True}, "Qcur_rope-0", None, None),
}


@pytest.fixture(scope="module")
def failed(gemma, cpu):
    views = {}

    def get(code):
        if code not in views:
            devices, kwargs = FAILURES[code][0](cpu), FAILURES[code][1]
            views[code] = make_view(gemma, devices, **kwargs)
        return views[code]
    return get


@pytest.mark.parametrize("code", list(FAILURES))
def test_failed_reservation_text_and_json_show_where(code, failed, tmp_path):
    view = failed(code)
    _, _, node, tensor, budget = FAILURES[code]
    e = view.error
    assert e is not None and e.code == code and view.reservation is None
    assert len(view.plans) == 2                                  # every shape the run would use is still planned
    assert (e.node, e.tensor, view.error_budget) == (node, tensor, budget)

    text = render_text(view)
    assert f"RESERVATION FAILED: [{code}]" in text and (e.fix is None or e.fix in text)
    lines = check_text_against_plan(text, view)
    for phase, plan in view.plans.items():
        marks = view.error_marks(plan)
        marked = [i for i, line in lines[phase].items() if "<-- ERROR" in line.splitlines()[0]]
        if node:
            (frag,) = [f.index for f in plan.fragments if any(n.name == node for n in f.nodes)]
            assert marked == [frag] == marks["fragments"] and marks["nodes"] == [node]
            assert f"<-- ERROR [{code}] at {node}" in lines[phase][frag]
        else:
            assert marked == [] and marks["nodes"] == []
        if tensor:    # the other nodes that read or write it are named with it
            assert marks["tensor"] == tensor and marks["tensor_nodes"]
            for name in marks["tensor_nodes"]:
                n = next(n for n in plan.graph.nodes if n.name == name)
                assert n.op not in VIEW_OPS and any(s.storage.name == tensor for s in n.src)
    budget_lines = [line for line in text.splitlines() if "live programs" in line and "<-- ERROR" in line]
    if budget:
        (dev,) = e.devices
        assert len(budget_lines) == 1 and budget_lines[0].strip().startswith(dev)
        assert budget_lines[0].endswith(f"<-- ERROR [{code}] {budget}")
        b = view.budgets()[dev]
        used = b["programs"] if budget == "programs" else b["memory"]["total"]
        limit = b["max_live_programs"] if budget == "programs" else b["memory_bytes"]
        assert used > limit
    else:
        assert budget_lines == []

    record = json.loads(write_view(view, tmp_path / "failed.json").read_text())
    assert {k: v for k, v in record["error"].items() if k != "marks"} == plain(e.to_dict())
    assert record["error"]["marks"] == plain({ph: view.error_marks(p) for ph, p in view.plans.items()})
    for phase, plan in view.plans.items():
        assert record["plans"][phase] == plain(plan.to_dict())


def test_a_node_no_device_accepts_gets_a_lane_of_its_own(failed):
    view = failed("no_device_for_node")
    assert view.lanes == ["example:0", UNPLACED]
    for plan in view.plans.values():
        for n in plan.graph.nodes:
            p = plan.placement[id(n)]
            if n.op == "ROPE":
                assert p.device == UNPLACED and p.reason.startswith("no selected device accepts it (example:0: ")
                assert p.refusals["example:0"].code == "refused_by_config"
            elif n.op not in VIEW_OPS:
                assert p.device == "example:0", (n.name, p)
            if p.device != UNPLACED:         # the stand-in's "placed_elsewhere" is no refusal, nor a fallback
                assert UNPLACED not in p.refusals, (n.name, p)
        assert all(p.device == UNPLACED or UNPLACED not in p.refusals for _, p in plan.fallbacks)
        assert "placed_elsewhere" not in render_text(view)


# -- the command ------------------------------------------------------------------------------

def test_split_command_writes_every_format(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_REFUSE", "ROPE")
    model = str(model_path("gemma3"))
    base = ["split", "-m", model, "--backends", "example:0,cpu", "--ctx", str(N_CTX), "--prompt-tokens", str(N_PROMPT),
            "-n", str(N_PREDICT)]
    assert cli_main(base + ["--phase", "decode", "-o", str(tmp_path / "p.json")]) == 0
    record = json.loads((tmp_path / "p.json").read_text())
    assert list(record["plans"]) == ["decode[tokens=1,kv=256]"]
    assert {fb["op"] for fb in record["plans"]["decode[tokens=1,kv=256]"]["fallbacks"]} == {"ROPE"}
    capsys.readouterr()
    assert cli_main(base + ["--phase", "prefill"]) == 0            # no -o: the summary on the terminal
    out = capsys.readouterr().out
    assert out.startswith("plan of ") and "\nprefill[tokens=8,kv=256]: 654 nodes" in out
    assert "\ndecode[" not in out                                # only the phase asked for
    for name in ("p.html", "p.txt", "p.dot"):
        assert cli_main(base + ["-o", str(tmp_path / name)]) == 0
        assert (tmp_path / name).stat().st_size > 1000
    assert (tmp_path / "p.html").read_text().startswith("<!DOCTYPE html>")


def test_split_command_on_a_failed_reservation(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("FRAMEWORK_EXAMPLE_REFUSE", "ROPE")
    monkeypatch.setenv("COLUMNS", "200")
    rc = cli_main(["split", "-m", str(model_path("gemma3")), "--backends", "example:0", "--ctx", str(N_CTX),
                   "-o", str(tmp_path / "f.json")])
    assert rc == 1                                              # the view is written; the plan failed
    assert "reservation failed [no_device_for_node]" in capsys.readouterr().err
    record = json.loads((tmp_path / "f.json").read_text())
    assert record["error"]["code"] == "no_device_for_node" and record["error"]["node"] == "Qcur_rope-0"


@pytest.mark.parametrize("args, message", [
    (["--device-profile", "npu37xx"], "none of the selected devices (cpu) offers it"),   # cpu's plugin has none
    (["-o", "plan"], "name the file .html, .svg, .dot, .json or .txt"),
    (["-o", "plan.png"], "cannot tell the view format from 'plan.png'"),
])
def test_split_command_refuses_what_it_cannot_do(args, message, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["split", "-m", str(model_path("smollm2")), "--backends", "cpu", *args]) == 2
    assert message in capsys.readouterr().err


def test_device_profile_is_passed_to_the_plugin_that_offers_it(registry, tmp_path):
    able = [d for d in registry.devices() if d.available and "npu37xx" in d.profiles]
    if not able:
        pytest.skip("no available device offers device profiles (the openvino plugin's do)")
    dev = able[0]
    rc = cli_main(["split", "-m", str(model_path("smollm2")), "--backends", f"{dev.name},cpu",
                   "--device-profile", "npu37xx", "--ctx", str(N_CTX), "-n", "2", "-o", str(tmp_path / "p.txt")])
    assert rc == 0
    text = (tmp_path / "p.txt").read_text()
    assert f"on {dev.name} (EMULATION of npu37xx), cpu" in text
    assert re.search(rf"^  {re.escape(dev.name)}\s+live programs \d+ of 255;", text, re.MULTILINE), text


# -- the view of a plan that ran ---------------------------------------------------------------

def test_view_of_a_run_has_measured_time(cpu, tmp_path):
    from framework.cli.split import write_run_view
    model = load_model("smollm2")
    session = Session(model, [ExampleDevice(refuse="ROPE"), cpu], n_ctx=N_CTX, n_layers=2)
    session.eval([1, 2, 3, 4, 5])
    session.eval([6])
    view = PlanView.after_run(session)
    assert set(view.device_seconds) == {"example:0", "cpu"} and view.device_seconds["example:0"] > 0
    if not hasattr(session.executor, "fragment_stats"):      # the executor keeps time per device only
        assert any("time per fragment was not recorded" in n for n in view.notes)
        # what the executor records with the patch in docs/split.md: seconds and runs per (plan, fragment)
        session.executor.fragment_stats = {(id(p), f.index): {"seconds": 0.001 * (f.index + 1), "runs": 1}
                                           for p, _ in session.plans.values() for f in p.fragments}
        view = PlanView.after_run(session)
    for phase, plan in view.plans.items():
        assert set(view.measured[phase]) == {f.index for f in plan.fragments}
    text = render_text(view)
    assert re.search(r"^  #0 .* \d+\.\d\d ms in 1 run$", text, re.MULTILINE), text
    write_run_view(session, tmp_path / "ran.html")
    page = (tmp_path / "ran.html").read_text()
    assert '"measured":true' in page and '"seconds":' in page


# -- the page, in a real browser ---------------------------------------------------------------

@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (never `playwright install`)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_page(browser, path: Path):
    page = browser.new_page(viewport={"width": 1500, "height": 950})
    requests, problems = [], []
    page.on("request", lambda r: requests.append(r.url))
    page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: problems.append(str(e)))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=15000)
    return page, requests, problems


def test_page_in_a_browser(browser, two_device, tmp_path):
    path = write_view(two_device, tmp_path / "split.html")
    page, requests, problems = open_page(browser, path)
    plan = next(iter(two_device.plans.values()))

    # one lane per device, a block per fragment in the lane of its device, the totals in the header
    assert page.locator("#labels .lab").evaluate_all("els => els.map(e => e.dataset.device)") == ["example:0", "cpu"]
    assert page.locator("#svg rect.lane").count() == 2
    blocks = page.locator("#svg g.frag").evaluate_all("els => els.map(e => [+e.dataset.index, e.dataset.device])")
    assert blocks == [[f.index, f.device] for f in plan.fragments]
    for dev, use in plan.per_device().items():
        cells = page.locator(f"#devices tr[data-device='{dev}'] td").all_inner_texts()
        assert cells[1:5] == [str(use[k]) for k in ("nodes", "fragments", "submissions", "programs")], cells
    assert page.locator("#svg path.copy").count() == len(copy_edges(plan))      # arrows between fragments
    fallback_blocks = {f.index for f in plan.fragments if any(plan.placement[id(n)].refusals for n in f.nodes)}
    assert set(page.locator("#svg g.frag.fb").evaluate_all("els => els.map(e => +e.dataset.index)")) == fallback_blocks

    # click a fragment: its nodes, with op, shape, dtype, why, and example:0's refusal for the ROPEs
    frag = next(f for f in plan.fragments if f.device == "cpu" and any(n.op == "ROPE" for n in f.nodes))
    page.locator(f"#svg g.frag[data-index='{frag.index}'] rect.b").click()
    rows = page.locator("#nodes tbody tr")
    assert rows.evaluate_all("els => els.map(e => e.dataset.node)") == [n.name for n in frag.nodes]
    for k, n in enumerate(frag.nodes):
        cells = rows.nth(k).locator("td").all_inner_texts()
        p = plan.placement[id(n)]
        assert cells[1:6] == [n.name, n.op, str(list(n.shape)), n.dtype.name, p.device], cells
        assert p.reason in cells[6]
        for dev, why in p.refusals.items():
            assert f"{dev}: {why}" in cells[7].replace("\n", " ")
    assert f"Fragment #{frag.index} on" in page.locator("#detail h2").inner_text()

    # search by node or tensor name; Enter selects the match
    page.fill("#search", "Kcur_rope-3")
    page.wait_for_function("document.getElementById('count').textContent.includes('match')")
    page.press("#search", "Enter")
    target = next(f for f in plan.fragments if any(n.name == "Kcur_rope-3" for n in f.nodes))
    assert page.locator("#svg g.frag.sel").evaluate("e => +e.dataset.index") == target.index
    assert page.locator("#nodes tr.hit").get_attribute("data-node") == "Kcur_rope-3"
    page.fill("#search", "blk.5.attn_q.weight")                  # a tensor: the node that reads it
    page.wait_for_function("document.getElementById('count').textContent.startsWith('1 match')")
    assert "Qcur-5" in page.locator("#results li").first.inner_text()
    page.fill("#search", "")

    # zoom to a layer: the timeline widens and scrolls to it, its blocks labelled
    width = float(page.locator("#svg").get_attribute("width"))
    page.select_option("#layer", "5")
    assert float(page.locator("#svg").get_attribute("width")) > 3 * width
    assert page.locator("#scroll").evaluate("e => e.scrollLeft") > 0
    target = next(f for f in plan.fragments if any(n.name == "Qcur_rope-5" for n in f.nodes))
    page.locator(f"#svg g.frag[data-index='{target.index}'] rect.b").click()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "split-layer.png"))
    page.select_option("#layer", "")

    # the other phase
    page.locator("nav#phases button").nth(1).click()
    decode = list(two_device.plans.values())[1]
    assert page.locator("#svg g.frag").count() == len(decode.fragments)
    page.locator("nav#phases button").nth(0).click()
    page.locator(f"#svg g.frag[data-index='{frag.index}'] rect.b").click()

    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "split.png"))
    assert requests == [path.as_uri()], requests            # nothing but the page itself
    assert problems == []
    page.close()


def test_page_groups_fallbacks_whose_reasons_name_each_weight_under_its_timeline(browser, gemma, cpu, tmp_path):
    """A device that declares F32 weights only refuses every quantized MUL_MAT with a reason naming the
    weight: the text and the page give one line per op, device and reason code (with the count and the
    first node), and the page shows the timeline before that list."""
    from framework.contract import Limits
    from framework.plugins.cpu.device import CpuDevice

    class F32Only(CpuDevice):
        name = "f32only"
        limits = Limits(dtypes=frozenset({"F32"}))

    view = make_view(gemma, [F32Only(), cpu])
    plan = next(iter(view.plans.values()))
    refused = {n.src[0].name for n, p in plan.fallbacks if n.op == "MUL_MAT"}
    groups = group_fallbacks([plan])
    assert len(refused) > 100 and len(groups) == 2                   # MUL_MAT and GET_ROWS, unsupported_dtype
    text = render_text(view)
    phase = next(iter(view.plans))
    section = text.split(phase + ":", 1)[1]
    lines = [ln for ln in section.splitlines() if ln.startswith("  fallback: ")][:len(groups)]
    assert [ln.strip() for ln in lines] == [g.line(planned=True) for g in groups]
    mm = next(g for g in groups if g.op == "MUL_MAT")
    assert f"fallback: {count(mm.count, 'MUL_MAT node')} ran on cpu (first: {mm.first}); f32only: unsupported_dtype: " \
           f"f32only declares weight types F32;" in mm.line()
    page, requests, problems = open_page(browser, write_view(view, tmp_path / "grouped.html"))
    items = page.locator("#fallbacks li").all_inner_texts()
    assert len(items) == len(groups) and any(it.startswith(f"{mm.count} × MUL_MAT → cpu f32only: ") for it in items)
    timeline, listed = page.locator("#timeline").bounding_box(), page.locator("#fallbacks").bounding_box()
    assert timeline["y"] + timeline["height"] <= listed["y"] and timeline["y"] < 300, (timeline, listed)
    page.locator("#fallbacks [data-goto]").first.click()              # the first node, in its fragment
    assert page.locator("#nodes tr.hit").get_attribute("data-node") == groups[0].first
    assert requests == [page.url] and problems == []
    page.close()


def test_failed_page_shows_the_error_on_its_node(browser, failed, tmp_path):
    view = failed("buffer_not_usable")
    path = write_view(view, tmp_path / "failed.html")
    page, requests, problems = open_page(browser, path)
    plan = next(iter(view.plans.values()))
    marks = view.error_marks(plan)
    banner = page.locator("#error")
    assert banner.is_visible() and "buffer_not_usable" in banner.inner_text()
    assert page.locator("#svg g.frag.err").evaluate_all("els => els.map(e => +e.dataset.index)") == marks["fragments"]
    assert page.locator("#svg path.errmark").count() == 1
    page.locator("#error [data-goto]").click()                  # the node the error names
    row = page.locator("#nodes tr.err")
    assert row.get_attribute("data-node") == view.error.node and "buffer_not_usable" in row.inner_text()
    page.locator("#error [data-search]").click()                # the tensor it names
    assert page.locator("#results li").count() >= 1
    page.locator("#error [data-goto]").click()
    page.evaluate("window.scrollTo(0, 0)")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "split-failed.png"))
    assert requests == [path.as_uri()] and problems == []
    page.close()


def test_header_table_fits_a_1600_px_window(browser, registry, tmp_path):
    """The widest header there is: an emulation's long label, every budget, and the measured time of a run;
    in a 1600 px window the devices table ends inside it (no sideways scrolling of the page)."""
    from framework.cli.split import write_run_view
    devices = registry.select("npu,cpu", "xdna2")
    session = Session(load_model("smollm2"), devices, n_ctx=N_CTX, n_layers=2)
    session.eval([1, 2, 3, 4, 5])
    session.eval([6])
    path = tmp_path / "ran.html"
    write_run_view(session, path)
    page = browser.new_page(viewport={"width": 1600, "height": 950})
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-ready='1']", timeout=15000)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "split-header-1600.png"))
    box = page.evaluate("() => { const r = document.getElementById('devices').getBoundingClientRect(); "
                        "return {right: r.right, columns: document.getElementById('devices').rows[0].cells.length, "
                        "page: document.documentElement.scrollWidth, emulation: document.querySelector("
                        "'#devices .emu') !== null}; }")
    assert box["emulation"] and box["columns"] == 12, box             # the label and the measured column shown
    assert box["right"] <= 1600 and box["page"] <= 1600, box
