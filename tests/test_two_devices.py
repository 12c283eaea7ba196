"""Two devices of one plugin on one host, as two GPUs of one machine would be: PoCL exposes its CPU
driver twice (``POCL_DEVICES="pthread pthread"``), so the OpenCL plugin discovers opencl:0 and opencl:1.

What a two-GPU host needs that these two can show without one: the plugin enumerates both devices; the
registry says they are one chip when their physical ids match (both PoCL devices are the host CPU) and
nothing when they differ; a layer split forced by a memory cap plans the copies between them, counts
their bytes, and generates the text one device generates alone. The split's speed on two real GPUs is
benchmarks/two_gpu.sh's, on a machine with two.

Every run is a child process: PoCL reads POCL_DEVICES once, when OpenCL is first initialised.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from framework_plugin_example import ExampleDevice  # pip install -e examples/plugin-example

from framework.contract import DeviceType, hookimpl
from framework.core.registry import Registry

TWO_POCL = {"POCL_DEVICES": "pthread pthread"}
PROMPT = "The capital of France is"


def _framework(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "framework", *args], env={**os.environ, **TWO_POCL, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def two_opencl_devices():
    out = _framework("backends")
    assert out.returncode == 0, out.stderr
    if "opencl:1 " not in out.stdout:
        pytest.skip(f"PoCL did not expose its CPU driver twice with POCL_DEVICES='pthread pthread':\n{out.stdout}")
    return out.stdout


def test_two_devices_of_one_plugin_on_one_chip_are_reported_as_one(two_opencl_devices):
    line = next(ln for ln in two_opencl_devices.splitlines() if ln.startswith("one physical device (host-cpu)"))
    assert "opencl:0" in line and "opencl:1" in line, line


def test_a_split_across_two_devices_plans_its_copies_and_generates_one_devices_text(tmp_path):
    plan_file = tmp_path / "plan.json"
    split = _framework("run", "-m", "smollm2", PROMPT, "-n", "8", "--backends", "opencl:0,opencl:1",
                       "--device-memory", "opencl:0=60M", "--plan", str(plan_file))
    assert split.returncode == 0, split.stderr
    alone = _framework("run", "-m", "smollm2", PROMPT, "-n", "8", "--backends", "opencl:0")
    assert alone.returncode == 0, alone.stderr
    assert split.stdout.split("\nmodel ")[0] == alone.stdout.split("\nmodel ")[0]
    # the note names the two devices of one plugin as one chip, not as two plugins
    assert "opencl:0 and opencl:1 are devices of the opencl plugin on one physical device (host-cpu)" in \
        split.stderr, split.stderr

    decode = next(p for name, p in json.loads(plan_file.read_text())["plans"].items() if name.startswith("decode"))
    assert set(decode["devices"]) == {"opencl:0", "opencl:1"}
    assert decode["fit"]["kept"]["opencl:0"].startswith("layers 0-"), decode["fit"]["kept"]
    between = [c for c in decode["copies"] if {c["src_device"], c["dst_device"]} == {"opencl:0", "opencl:1"}]
    # the hidden state crosses at the split, one row of n_embd float32 each way
    assert between and all(c["nbytes"] == 576 * 4 for c in between), decode["copies"]
    assert {c["dst_device"] for c in between} == {"opencl:0", "opencl:1"}


class _Gpu(ExampleDevice):
    """The example plugin's device (the core's reference kernels) under another name and a GPU's id."""

    type = DeviceType.GPU

    def __init__(self, index: int, physical_id: str):
        super().__init__(index)
        self.name, self.physical_id = f"twogpu:{index}", physical_id


class _TwoGpus:
    """A plugin with two GPUs whose physical ids are given: two chips, or one chip listed twice."""

    def __init__(self, ids: tuple[str, str]):
        self.ids = ids

    @hookimpl
    def framework_devices(self):
        return [_Gpu(i, pid) for i, pid in enumerate(self.ids)]


@pytest.mark.parametrize(("ids", "one_chip"), [(("0000:3b:00.0", "0000:5e:00.0"), False),
                                               (("0000:3b:00.0", "0000:3b:00.0"), True)])
def test_two_gpus_are_one_chip_only_when_their_ids_match(ids, one_chip):
    registry = Registry()
    registry.register(_TwoGpus(ids), "twogpu")
    assert registry.plugins["twogpu"].error is None, registry.plugins["twogpu"].error
    groups = [[d.name for d in g] for g in registry.same_silicon()]
    assert groups == ([["twogpu:0", "twogpu:1"]] if one_chip else [])
