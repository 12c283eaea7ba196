"""A plugin that is present but wrong is caught, by name: at registration (a misspelt hook, a device name
another plugin offers, a hook that raises, a contract version this framework lacks), wherever a verdict
is asked (planning, the KV-cache placement, a buffer check, the conformance suite), and at every
fragment boundary while running (too few outputs, a wrong shape, values that are not finite). Each
mistake is made by a real plugin registered through the Registry (tests/buggy_plugin.py, or a class
here), and each error names the plugin, the device, the node and the fix; nothing continues."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import load_model, model_path

import buggy_plugin
from framework import contract
from framework.contract import Device, Verdict, hookimpl
from framework.registry import Registry
from framework.core.scheduler import DeviceRunError
from framework.core.scheduler.errors import PluginContractError
from framework.plugins import cpu as cpu_plugin
from framework.plugins.cpu.device import CpuDevice
from framework.runtime.session import Session

N_LAYERS = 2          # two layers of SmolLM2: a middle layer and the output layer, cheaply
PROMPT = [1, 504, 3458, 282]


def registered(mistake: str, take: str = "^result_output$") -> tuple[Registry, list[Device]]:
    """The buggy plugin registered as a distribution would be, and the devices [buggy:0, cpu]."""
    class Plugin:
        FRAMEWORK_CONTRACT = 1

        @hookimpl
        def framework_devices(self):
            return [buggy_plugin.BuggyDevice(mistake, take)]

    reg = Registry()
    reg.register(Plugin(), "buggy", "buggy-plugin 0.1")
    reg.register(cpu_plugin, "cpu", "framework")
    return reg, reg.select("buggy:0,cpu")


def session(devices, **kw) -> Session:
    return Session(load_model("smollm2"), devices, n_ctx=64, n_batch=16, n_layers=N_LAYERS, **kw)


def assert_names(text: str, *parts: str) -> None:
    for part in parts:
        assert part in text, f"{part!r} not in:\n{text}"


# -- at registration ---------------------------------------------------------------------------------------

def test_a_misspelt_hook_is_refused_with_the_hook_it_meant():
    class Misspelt:
        @hookimpl
        def framework_device(self):          # framework_devices
            return [CpuDevice()]

    reg = Registry()
    record = reg.register(Misspelt(), "misspelt", "misspelt-plugin 1.2")
    assert_names(record.error, "'framework_device'", "not a hook of the contract", "did you mean 'framework_devices'")
    assert reg.devices() == [] and not reg.pm.has_plugin("misspelt")
    assert_names(reg.describe_devices(), "plugin 'misspelt' (misspelt-plugin 1.2)", "did you mean 'framework_devices'")


def test_two_plugins_offering_one_device_name_are_both_named():
    class One:
        @hookimpl
        def framework_devices(self):
            return [buggy_plugin.BuggyDevice("shape", name="dup:0")]

    reg = Registry()
    assert reg.register(One(), "first", "first-plugin 1.0").error is None
    second = reg.register(One(), "second", "second-plugin 2.0")
    assert_names(second.error, "device 'dup:0'", "plugin 'first' (first-plugin 1.0) already offers",
                 "'second' is not loaded", "FRAMEWORK_BLOCK_PLUGINS")
    assert [d.plugin for d in reg.devices()] == ["first (first-plugin 1.0)"]
    assert_names(reg.describe_devices(), "plugin 'second' (second-plugin 2.0)")


def test_a_raising_device_constructor_is_told_to_return_an_unavailable_device():
    class NoDriver(Device):
        def __init__(self):
            raise OSError("libnpu.so.1: cannot open shared object file")

    class Plugin:
        @hookimpl
        def framework_devices(self):
            return [NoDriver()]

    record = Registry().register(Plugin(), "nodriver", "nodriver-plugin 0.3")
    assert_names(record.error, "framework_devices() raised OSError: libnpu.so.1", "available = False",
                 "unavailable_reason", "instead of raising")


def test_a_contract_version_this_framework_lacks_is_refused():
    class Future:
        FRAMEWORK_CONTRACT = contract.CONTRACT_VERSION + 1

        @hookimpl
        def framework_devices(self):
            return [CpuDevice()]

    record = Registry().register(Future(), "future", "future-plugin 9.0")
    assert_names(record.error, f"FRAMEWORK_CONTRACT = {contract.CONTRACT_VERSION + 1}",
                 f"implements contract version {contract.CONTRACT_VERSION}")
    assert buggy_plugin.FRAMEWORK_CONTRACT in contract.CONTRACT_VERSIONS


# -- wherever a verdict is asked ---------------------------------------------------------------------------

@pytest.mark.parametrize("mistake, said", [("bool", "returned True"), ("raise", "raised KeyError")])
def test_a_bad_verdict_is_a_named_error_in_the_kv_cache_placement(mistake, said):
    _, devices = registered(mistake)
    with pytest.raises(PluginContractError) as info:
        session(devices)                                   # Session._place_cache asks the first device
    e = info.value
    assert_names(str(e), "plugin buggy (buggy-plugin 0.1)", "device buggy:0", "about node 'k_cache_write-0'", said,
                 "fix: in the plugin's device class BuggyDevice")
    assert e.plugin == "buggy (buggy-plugin 0.1)" and e.devices == ("buggy:0",) and e.node == "k_cache_write-0"


@pytest.mark.parametrize("mistake, said", [("bool", "never a bare bool"), ("raise", "supports_op never raises")])
def test_a_bad_verdict_is_a_named_error_in_planning(mistake, said):
    _, devices = registered(mistake)
    s = session(devices, kv_device="cpu")                 # the cache placed without asking buggy:0
    with pytest.raises(PluginContractError) as info:
        s.reserve(len(PROMPT), 2)
    assert_names(str(info.value), "plugin buggy (buggy-plugin 0.1)", "device buggy:0", "about node 'inp_embd'", said)


def test_an_exception_in_supports_buffer_is_a_named_error_at_reservation():
    """The cache on example:0 (which refuses attention), attention on buggy:0, which must say whether it
    can use the cache's buffer: its supports_buffer raises."""
    from framework_plugin_example import ExampleDevice
    _, (buggy, cpu) = registered("buffer", take="^kqv-0$")
    owner = ExampleDevice(refuse="FLASH_ATTN_EXT")
    s = session([owner, buggy, cpu], kv_device="example:0")
    with pytest.raises(PluginContractError) as info:
        s.reserve(len(PROMPT), 2)
    assert_names(str(info.value), "plugin buggy (buggy-plugin 0.1)", "device buggy:0",
                 "supports_buffer('example_private')", "raised AttributeError", "supports_buffer never raises")


# -- at fragment boundaries --------------------------------------------------------------------------------

def run_prompt(devices, **kw):
    s = session(devices, **kw)
    s.reserve(len(PROMPT), 2)
    return s, s.eval(PROMPT)


def test_a_wrong_shape_on_the_output_layer_stops_the_run_naming_the_kernel():
    _, devices = registered("shape")
    with pytest.raises(DeviceRunError) as info:
        run_prompt(devices)
    e = info.value
    assert (e.device, e.plugin, e.node) == ("buggy:0", "buggy (buggy-plugin 0.1)", "result_output")
    assert_names(str(e), "device buggy:0 (plugin buggy (buggy-plugin 0.1))", "node 'result_output' (MUL_MAT",
                 "expected shape [1, 49152] float32, got shape [1, 49151] float32",
                 "fix: the kernel for MUL_MAT in BuggyDevice", "docs/ops.md")


def test_a_wrong_shape_in_a_middle_layer_is_blamed_on_its_device_not_the_next():
    _, devices = registered("shape", take="^ffn_out-0$")
    s = session(devices)
    with pytest.raises(DeviceRunError) as info:
        s.eval(PROMPT)
    assert (info.value.device, info.value.node) == ("buggy:0", "ffn_out-0")
    assert str(info.value).startswith("device buggy:0 (plugin buggy (buggy-plugin 0.1)): fragment 1 on buggy:0")
    assert s.executor.stats["cpu"]["runs"] == 1           # the fragment before it; nothing after it ran


def test_one_output_too_few_is_named_instead_of_a_key_error():
    _, devices = registered("too-few", take="-1$")           # all of layer 1: a fragment with several outputs
    with pytest.raises(DeviceRunError) as info:
        run_prompt(devices)
    e = info.value
    assert e.device == "buggy:0" and e.fragment is not None
    assert_names(str(e), "program.run returned", "outputs; the fragment has", "Program.run returns a list with one "
                 "handle per fragment.outputs", "plugin buggy (buggy-plugin 0.1)")


def test_a_cache_write_gone_wrong_after_steps_that_wrote_in_place_is_still_named():
    """Steps whose program gave back the caches' own handles skip their checks (a decode step returns one a
    cache); a later step whose cache write comes back otherwise is checked again, and stopped."""
    _, devices = registered("cache-later", take=".")        # every node: one fragment on buggy:0
    s = session(devices)
    s.eval(PROMPT)
    s.eval([1])                                             # the decode program's first run: checked in full
    second = s.eval([2])                                    # its second: the caches' own handles again
    assert np.isfinite(second).all() and s.n_past == len(PROMPT) + 2
    with pytest.raises(DeviceRunError) as info:
        s.eval([3])
    e = info.value
    assert e.device == "buggy:0" and e.node.startswith(("k_cache_write", "v_cache_write"))
    assert_names(str(e), "expected shape", "fix: the kernel for SET_ROWS in BuggyDevice")


def test_nans_from_a_plugin_outside_the_distribution_stop_the_run_at_their_source():
    _, devices = registered("nan", take="^ffn_(gate|up|swiglu)-0$")     # with products: not smoothed away
    s = session(devices)
    with pytest.raises(DeviceRunError) as info:
        s.eval(PROMPT)
    e = info.value
    assert (e.device, e.node) == ("buggy:0", "ffn_swiglu-0")
    assert_names(str(e), "values are not finite (the first, nan", "from finite inputs",
                 "fix: the kernel for GLU in BuggyDevice")


class NanCpu(CpuDevice):
    """The built-in CPU device with one wrong kernel: ffn_swiglu-0 comes out NaN. It stands for a device of
    this distribution (its module says so), whose values are not checked unless --check-values."""

    name = "nancpu"

    def compile(self, fragment):
        program = super().compile(fragment)
        program.steps = [((lambda *a, f=fn: np.full_like(f(*a), np.nan)) if n.name == "ffn_swiglu-0" else fn, o, i)
                         for (fn, o, i), n in zip(program.steps, fragment.nodes)]
        return program


NanCpu.__module__ = "framework.plugins.cpu.device"


def nan_cpu_then_correct_plugin() -> list[Device]:
    _, (buggy, _) = registered("none", take="^ffn_out-0$")
    return [buggy, NanCpu()]


def test_nans_from_an_unchecked_device_are_blamed_on_it_not_on_the_checked_one_that_read_them():
    with pytest.raises(DeviceRunError) as info:
        session(nan_cpu_then_correct_plugin(), kv_device="nancpu").eval(PROMPT)
    assert info.value.device == "nancpu" and info.value.node == "ffn_swiglu-0"
    assert_names(str(info.value), "device nancpu", "'ffn_swiglu-0' (GLU", "it reached fragment 1 on buggy:0")


def test_check_values_checks_the_distribution_s_own_devices_too():
    s = session(nan_cpu_then_correct_plugin(), kv_device="nancpu", check_values=True)
    assert s.executor.value_checked == {"buggy:0", "nancpu"}
    with pytest.raises(DeviceRunError) as info:
        s.eval(PROMPT)
    assert info.value.device == "nancpu" and info.value.node == "ffn_swiglu-0"
    assert_names(str(info.value), "fragment 0 on nancpu", "from finite inputs")


def test_nan_logits_never_pass_even_unchecked():
    s = session([NanCpu()])
    assert s.executor.value_checked == set()
    with pytest.raises(DeviceRunError, match="node 'result_output'.*not finite"):
        s.eval(PROMPT)


def test_a_correct_plugin_passes_every_check_and_matches_the_cpu():
    _, (buggy, cpu) = registered("none", take="^(ffn_|result_output)")
    s, logits = run_prompt([buggy, cpu])
    assert "buggy:0" in s.executor.value_checked and s.executor.stats["buggy:0"]["runs"] > 0
    ref = session([CpuDevice()]).eval(PROMPT)
    np.testing.assert_allclose(logits, ref, rtol=1e-5, atol=1e-4)


# -- the command line: an installed distribution, a non-zero exit, the names -------------------------------

def test_the_cli_stops_with_the_names_and_a_failing_exit_status(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "buggy_plugin.py").write_text(Path(buggy_plugin.__file__).read_text())
    dist = site / "buggy_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: buggy-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[framework.backends]\nbuggy = buggy_plugin\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "FRAMEWORK_BUGGY": "nan", "FRAMEWORK_BUGGY_TAKE": "^result_norm$"}
    cmd = [sys.executable, "-m", "framework.cli.main", "run", "Hello", "-n", "4", "-m", str(model_path("smollm2")),
           "--backends", "buggy:0,cpu", "--ctx", "64"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0, res.stdout + res.stderr
    text = " ".join(res.stderr.split())
    assert_names(text, "device buggy:0 (plugin buggy (buggy-plugin 0.1))", "node 'result_norm' (MUL", "not finite",
                 "fix:")
    assert "Traceback" not in res.stderr and "decode" not in res.stderr, textwrap.shorten(res.stderr, 2000)


# -- what a plugin imports ---------------------------------------------------------------------------------

def _framework_imports(path: Path, package: str) -> list[tuple[str, list[str]]]:
    """(module, names) of every import of a framework module in a file of `package`, relative ones resolved."""
    import ast
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = parts[: len(parts) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names = [a.name for a in node.names]
            if module == "framework" and names in (["contract"], ["backend"]):     # from framework import contract
                module, names = f"framework.{names[0]}", []
            found.append((module, names))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names]
    return [(m, names) for m, names in found if m == "framework" or m.startswith("framework.")]


# The ray plugin's node agent is a framework installation on another machine: it loads that machine's
# plugins through the registry and asks them through the one central check, as the planner here does.
HOSTS_A_REGISTRY = {("framework/plugins/ray/agent.py", "framework.registry"),
                    ("framework/plugins/ray/agent.py", "framework.core.scheduler.verdicts")}


def test_plugins_reach_the_framework_only_through_the_contract():
    """Every built-in plugin and the example distribution import from framework.contract only (besides
    their own package, and the backend skeleton framework.backend that device-memory plugins build on;
    imports inside functions too), and only names the module's __all__ lists: that is the whole contract."""
    from framework import backend
    root = Path(__file__).resolve().parents[1]
    folders = [(p, f"framework.plugins.{p.name}") for p in (root / "framework" / "plugins").iterdir() if p.is_dir()
               and (p / "__init__.py").exists()]
    folders.append((root / "examples" / "plugin-example" / "framework_plugin_example", "framework_plugin_example"))
    checked = 0
    for folder, package in folders:
        for path in folder.glob("*.py"):
            for imported, names in _framework_imports(path, package):
                if imported.startswith(package):
                    continue
                checked += 1
                if (path.relative_to(root).as_posix(), imported) in HOSTS_A_REGISTRY:
                    continue
                module = {"framework.contract": contract, "framework.backend": backend}.get(imported)
                assert module is not None, f"{path.relative_to(root)} imports {imported}"
                missing = set(names) - set(module.__all__)
                assert not missing, f"{path.relative_to(root)} imports {missing}, not in {imported}.__all__"
    assert checked > 10
    assert all(hasattr(m, name) for m in (contract, backend) for name in m.__all__)


def test_the_conformance_suite_and_the_planner_give_one_answer_from_declared_data():
    """A device that relies on Limits.dtypes and refused_ops alone (its supports_op accepts everything):
    the suite asks through the same check as the planner, so it skips what a run would not give it."""
    from framework.conformance.cases import all_cases
    from framework.conformance.test_ops import verdicts
    from framework.contract import Limits

    class Declared(CpuDevice):
        name = "declared"
        limits = Limits(dtypes=frozenset({"F32", "Q8_0"}))
        refused_ops = {"ROPE": Verdict.no("refused_by_profile", "declared refuses ROPE")}

    case = next(c for c in all_cases() if c.id.startswith("MUL_MAT-Q4_0-decode"))
    graph = case.build().graph
    (node, v), = verdicts(Declared(), graph)
    assert v.code == "unsupported_dtype" and "Q4_0" in v.reason
    from framework.core.scheduler import make_plan
    plan = make_plan(graph, [Declared(), CpuDevice()])
    assert plan.device_of(node) == "cpu"
    assert plan.placement[id(node)].refusals["declared"].code == "unsupported_dtype"
    rope = next(c for c in all_cases() if c.op == "ROPE").build().graph
    assert {v.code for _, v in verdicts(Declared(), rope) if not v.ok} == {"refused_by_profile"}


@pytest.mark.parametrize("command", ["run", "perplexity", "bench"])
def test_check_values_is_an_option_of_the_commands_that_run(command):
    from framework.cli.main import build_parser
    extra = ["-f", "x.txt"] if command == "perplexity" else []
    assert build_parser().parse_args([command, *extra, "--check-values"]).check_values is True
    assert build_parser().parse_args([command, *extra]).check_values is False
