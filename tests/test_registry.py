"""Plugins are validated when they register; a broken plugin is reported with its distribution and
never takes the others down; a device failing at run time is never silently replaced."""

import os
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest
from conftest import load_model

from framework.contract import Device, DeviceType, Verdict, hookimpl
from framework import registry as registry_module
from framework.registry import Registry
from framework.core.scheduler import DeviceRunError
from framework.plugins.cpu.device import CpuDevice
from framework.runtime.session import Session


def test_a_hook_with_the_wrong_signature_is_refused_naming_plugin_and_hook():
    class BadHook:
        @hookimpl
        def framework_devices(self, unexpected_argument):
            return []

    record = Registry().register(BadHook(), "badhook", "badhook-dist 1.0")
    assert record.error and "does not fit the plugin contract" in record.error
    assert "framework_devices" in record.error and "unexpected_argument" in record.error


def test_a_device_missing_required_methods_is_reported_with_what_is_missing():
    class Half(Device):
        name = "half:0"
        type = DeviceType.ACCEL

        def supports_op(self, node):
            return Verdict.yes()

    class Plugin:
        @hookimpl
        def framework_devices(self):
            return [Half(), object()]

    reg = Registry()
    record = reg.register(Plugin(), "half", "half-dist 0.1")
    assert "half:0" in record.error and "compile() is not implemented" in record.error
    assert reg.devices() == []
    assert "plugin 'half' (half-dist 0.1)" in reg.describe_devices()


def test_a_plugin_that_fails_to_import_is_reported_and_the_others_still_load(monkeypatch):
    real = registry_module.entry_points

    def with_a_broken_one(group):
        broken = EntryPoint(name="broken", value="no_such_module_for_framework:plugin", group=group)
        return [broken, *real(group=group)]

    monkeypatch.setattr(registry_module, "entry_points", with_a_broken_one)
    reg = Registry().load_entry_points()
    assert "failed to import no_such_module_for_framework:plugin" in reg.plugins["broken"].error
    assert "ModuleNotFoundError" in reg.plugins["broken"].error
    assert "cpu" in {d.name for d in reg.devices()}
    assert "plugin 'broken'" in reg.describe_devices()


def test_autoload_can_be_switched_off_and_plugins_blocked(monkeypatch):
    monkeypatch.setenv("FRAMEWORK_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert Registry().load_entry_points().plugins == {}
    monkeypatch.delenv("FRAMEWORK_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("FRAMEWORK_BLOCK_PLUGINS", "cpu")
    assert "cpu" not in Registry().load_entry_points().plugins


def test_a_device_that_fails_while_running_stops_the_run_with_its_own_words():
    class Failing(CpuDevice):
        name = "failing"

        def compile(self, fragment):
            program = super().compile(fragment)

            class Broken:
                def run(self, args):
                    raise RuntimeError("DRIVER_TIMEOUT on queue 3")

            return Broken() if any(n.op == "ROPE" for n in fragment.nodes) else program

    model = load_model("smollm2")
    session = Session(model, [Failing(), CpuDevice()], n_ctx=64)
    with pytest.raises(DeviceRunError) as info:
        session.eval([1, 2, 3])
    text = str(info.value)
    assert "device failing failed while running fragment" in text and "DRIVER_TIMEOUT on queue 3" in text
    assert session.executor.stats["cpu"]["runs"] == 0          # nothing was re-run elsewhere
    assert np.isfinite(Session(model, [CpuDevice()], n_ctx=64).eval([1, 2, 3])).all()


def test_a_plugin_whose_library_is_missing_loads_and_says_so(tmp_path):
    """On a machine without openvino (a child process where `import openvino` fails), `framework backends`
    lists the OpenVINO devices as unavailable with the reason instead of a failed plugin, and the tests'
    report header, which asks OpenVINO for its settings, still builds."""
    (tmp_path / "sitecustomize.py").write_text("import sys\nsys.modules['openvino'] = None   # import openvino fails\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root), str(root / "tests")])}
    gone = subprocess.run([sys.executable, "-c", "import openvino"], env=env, capture_output=True, text=True)
    assert gone.returncode != 0 and "ModuleNotFoundError" in gone.stderr           # the shim holds
    listed = subprocess.run([sys.executable, "-m", "framework", "backends"], env=env, capture_output=True, text=True,
                            timeout=600)
    assert listed.returncode == 0, listed.stderr
    rows = [ln for ln in listed.stdout.splitlines() if "openvino" in ln]
    assert any(ln.startswith("openvino:CPU") and "unavailable" in ln for ln in rows), listed.stdout
    assert "openvino is not installed: pip install 'openvino>=2025.0'" in listed.stdout
    assert not any("plugin failed" in ln for ln in rows), listed.stdout               # not a failed plugin
    header = subprocess.run([sys.executable, "-c", "import conftest; print(*conftest.numerics_report(), sep='\\n')"],
                            env=env, capture_output=True, text=True, timeout=600, cwd=root / "tests")
    assert header.returncode == 0, header.stderr
    assert "cpu instruction sets" in header.stdout and "openvino: cannot report its settings" in header.stdout
