"""The backend conformance suite (framework.conformance), run as a plugin author runs it: in a
separate pytest process, `pytest --pyargs framework.conformance --device NAME`, from a directory
outside the project. The runs are independent processes, so they are all started at once.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from framework.registry import default_registry

PLUGIN_MODULE = "framework.conformance.pytest_plugin"
TIMEOUT_S = 300


def _entry_point_installed() -> bool:
    return any(ep.value.split(":")[0].strip() == PLUGIN_MODULE for ep in entry_points(group="pytest11"))


def suite_command(*args: str) -> list[str]:
    # pytest parses --device before it imports anything named by --pyargs, so the option comes from a
    # pytest plugin (entry point group pytest11 in pyproject.toml); an install made before that entry
    # point existed needs the plugin named with -p.
    plugin = [] if _entry_point_installed() else ["-p", PLUGIN_MODULE]
    return [sys.executable, "-m", "pytest", *plugin, "--pyargs", "framework.conformance", "-q", "-p",
            "no:cacheprovider", *args]


@cache
def registry():
    return default_registry()


def _device_names() -> list[str]:
    """Every available device of this environment: cpu, example:0 where the example plugin is
    installed, and those of any other installed plugin."""
    return [d.name for d in registry().devices() if d.available]


def only_plugin(plugin: str | None) -> dict[str, str]:
    """Environment that loads no installed plugin but `plugin` (FRAMEWORK_BLOCK_PLUGINS): a run for one
    device need not start every other plugin's runtime. The reference kernels come from the core."""
    blocked = [b for b in os.environ.get("FRAMEWORK_BLOCK_PLUGINS", "").split(",") if b.strip()]
    blocked += [name for name in registry().plugins if name != plugin]
    return {"FRAMEWORK_BLOCK_PLUGINS": ",".join(blocked)}


def _plugin_of(device: str) -> str:
    return next(r.name for r in registry().plugins.values() if any(d.name == device for d in r.devices))


PROBE_PLUGIN = '''
from framework.contract import Device, DeviceType, ReferenceProgram, Verdict, hookimpl, reference


class ProbeDevice(Device):
    """The reference kernels with one bug: ROPE rotates every token one position too far."""
    name = "probe:0"
    type = DeviceType.ACCEL
    physical_id = "host-cpu"

    def supports_op(self, node):
        return Verdict.yes()        # every op of the table has a reference kernel (the framework checks the op)

    def compile(self, fragment):
        program = ReferenceProgram(fragment.nodes, fragment.inputs, fragment.outputs)
        late = [(lambda x, pos, *factors, p=n.params: reference.rope(x, pos + 1, *factors, **p))
                if n.op == "ROPE" else fn for (fn, _, _), n in zip(program.steps, fragment.nodes)]
        program.steps = [(fn, out, ins) for fn, (_, out, ins) in zip(late, program.steps)]
        return program


@hookimpl
def framework_devices():
    return [ProbeDevice()]
'''


def _install_probe(root: Path) -> str:
    """A throwaway plugin distribution (entry point 'probe') importable from `root`/site."""
    site = root / "site"
    (site / "conformance_probe").mkdir(parents=True)
    (site / "conformance_probe" / "__init__.py").write_text(textwrap.dedent(PROBE_PLUGIN))
    dist = site / "conformance_probe-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: conformance-probe\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text("[framework.backends]\nprobe = conformance_probe\n")
    return os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)


@dataclass
class Result:
    returncode: int
    stdout: str

    def summary(self) -> dict[str, int]:
        """Counts from pytest's last line ("12 passed, 3 skipped in 1.2s")."""
        lines = [ln for ln in self.stdout.splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)", last)}

    def tail(self, n: int = 4000) -> str:
        return self.stdout[-n:]


class Runs:
    """Suite runs started together; `result(key)` waits for one."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}

    def start(self, key: str, *args: str, env: dict | None = None) -> None:
        out = self.root / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', key)}.out"
        with open(out, "w") as f:      # a file, not a pipe: no run waits for its output to be read
            proc = subprocess.Popen(suite_command(*args), cwd=self.root, stdout=f, stderr=subprocess.STDOUT, text=True,
                                    env={**os.environ, **(env or {})})
        self.procs[key] = (proc, out)

    def result(self, key: str) -> Result:
        proc, out = self.procs[key]
        proc.wait(timeout=TIMEOUT_S)
        return Result(proc.returncode, out.read_text())

    def stop(self) -> None:
        for proc, _ in self.procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    r = Runs(tmp_path_factory.mktemp("conformance"))
    for name in _device_names():
        r.start(f"device:{name}", "--device", name, env=only_plugin(_plugin_of(name)))
    r.start("unknown", "--device", "no-such-device:7")       # every plugin: the message lists every device
    r.start("probe", "--device", "probe:0", "-k", "ROPE or SCALE",
            env={"PYTHONPATH": _install_probe(r.root), **only_plugin("probe")})
    if "example:0" in _device_names():
        r.start("refuse", "--device", "example:0", "-k", "ROPE", "-rs",
                env={"FRAMEWORK_EXAMPLE_REFUSE": "ROPE", **only_plugin("example")})
    yield r
    r.stop()


@pytest.mark.parametrize("name", _device_names())
def test_suite_passes_on_every_available_device(runs, name):
    res = runs.result(f"device:{name}")
    counts = res.summary()
    assert res.returncode == 0, res.tail()
    assert counts.get("passed", 0) > 300, res.tail()
    assert not counts.get("failed") and not counts.get("error") and not counts.get("errors"), res.tail()
    if name == "cpu":       # the reference accepts every case of its own suite
        assert not counts.get("skipped"), res.tail()


def test_unknown_device_fails_listing_the_devices(runs):
    res = runs.result("unknown")
    assert res.returncode not in (0, 5), res.tail()          # a failure: not success, not "no tests collected"
    assert "unknown backend 'no-such-device:7'" in res.stdout, res.tail()
    assert "cpu (CPU, available)" in res.stdout, res.tail()   # the registry's list of devices
    assert "skipped" not in res.stdout, res.tail()


@pytest.mark.skipif("example:0" not in _device_names(),
                    reason="the example plugin (entry point 'example') is not installed")
def test_refused_ops_are_skipped_with_the_verdict(runs):
    res = runs.result("refuse")
    counts = res.summary()
    assert res.returncode == 0, res.tail()
    assert counts.get("skipped", 0) > 10 and not counts.get("failed"), res.tail()
    assert "not supported by example:0" in res.stdout and "refused_by_config" in res.stdout, res.tail()


def test_suite_catches_a_wrong_kernel(runs):
    """A device that accepts ROPE and computes it wrongly fails, with the error metric in the report."""
    res = runs.result("probe")
    counts = res.summary()
    assert res.returncode == 1, res.tail()
    assert counts.get("failed", 0) >= 8 and counts.get("passed", 0) > 0, res.tail()
    failed = re.findall(r"FAILED \S+::(\w+)\[probe:0-(\S+?)\]", res.stdout)
    assert failed, res.tail()
    assert all(test == "test_matches_cpu_reference" and case.startswith("ROPE") for test, case in failed), failed
    assert "NMSE" in res.stdout and "ggml's threshold for ROPE" in res.stdout, res.tail()


def test_documented_command_needs_no_extra_flags():
    """`pytest --pyargs framework.conformance --device NAME` works as written only when the pytest11 entry
    point is installed (pyproject.toml: [project.entry-points.pytest11])."""
    if not _entry_point_installed():
        pytest.skip("the pytest11 entry point framework.conformance.pytest_plugin is not installed (add it to "
                    "pyproject.toml and reinstall); until then --device needs -p framework.conformance.pytest_plugin")
