"""Shared fixtures: the two real models, llama.cpp's reference outputs, CPU sessions."""

from __future__ import annotations

import json
import os
import resource
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

from framework.model.default import model_path  # noqa: F401 (the tests import it from here)

# llama.cpp's outputs for both models, kept in the repository (tests/reference/README.md says how they were made)
REF_DIR = Path(__file__).resolve().parent / "reference"
MODELS = ("smollm2", "gemma3")


@lru_cache(maxsize=None)
def load_model(name: str):
    """One Model per name for the whole run (weights stay memory-mapped)."""
    from framework.model.model import Model
    return Model(model_path(name))


@lru_cache(maxsize=None)
def reference(name: str) -> tuple[dict, dict]:
    if not REF_DIR.is_dir():
        pytest.fail(f"llama.cpp's reference outputs are missing: expected {REF_DIR}")
    ref = json.loads((REF_DIR / f"{name}.json").read_text(encoding="utf-8"))
    arrays = dict(np.load(REF_DIR / f"{name}.npz"))
    return ref, arrays


def reference_text(ref: dict) -> str:
    # read_bytes keeps the file's exact newlines (text mode would translate \r\n)
    return (REF_DIR / ref["text"]["text_file"]).read_bytes().decode("utf-8")


@lru_cache(maxsize=None)
def numerics_report() -> tuple[str, ...]:
    """What results on this machine depend on, so a failure elsewhere says what differed: the CPU's
    instruction sets, and OpenVINO's defaults against the settings the plugin requests and a compiled
    model reports."""
    from framework.plugins.cpu.device import CpuDevice
    from framework.plugins.openvino_npu.device import settings_report
    from framework.plugins.openvino_npu.options import cpu_isa
    lines = [f"cpu instruction sets: {cpu_isa() or 'none of avx2, avx512*, amx* in /proc/cpuinfo'}",
             f"cpu plugin, as the tests' registry makes it: {CpuDevice().description}; "
             f"with CpuDevice('q8'): {CpuDevice('q8').description}"]
    try:
        lines += settings_report()
    except Exception as e:  # noqa: BLE001 - the report says it; test_openvino.py fails on it with the detail
        lines.append(f"openvino: cannot report its settings: {type(e).__name__}: {e}")
    return tuple(lines)


def pytest_configure(config) -> None:
    # OpenVINO's compiled-model cache: a folder of this run's own, removed when it ends (the compiled models of
    # one run are about 4 GB). Set before any device is made, so every OpenVINO device of the run (and every
    # command a test starts) uses it; a test of the cache itself uses a folder of its own.
    # The tests compare devices and plans against the cpu plugin as the core's reference kernels (bit for bit in
    # tests/test_multi_device.py, by ggml's per-op NMSE on whole graphs in the conformance suite): they run it
    # on its float32 path. Its default, the quantized products with 8-bit activations, is checked against
    # llama.cpp on both real models (tests/test_reference_cpu.py runs both paths) and kernel by kernel
    # (tests/test_cpu_quantized.py); a test that wants it asks for CpuDevice("q8").
    os.environ.setdefault("FRAMEWORK_CPU_MATMUL", "f32")
    config._ov_cache = tempfile.mkdtemp(prefix="framework-openvino-cache-")
    config._ov_cache_env = os.environ.get("FRAMEWORK_OPENVINO_CACHE_DIR")
    os.environ["FRAMEWORK_OPENVINO_CACHE_DIR"] = config._ov_cache


def pytest_unconfigure(config) -> None:
    if not hasattr(config, "_ov_cache"):
        return
    shutil.rmtree(config._ov_cache, ignore_errors=True)
    if config._ov_cache_env is None:
        os.environ.pop("FRAMEWORK_OPENVINO_CACHE_DIR", None)
    else:
        os.environ["FRAMEWORK_OPENVINO_CACHE_DIR"] = config._ov_cache_env


def pytest_report_header(config) -> list[str]:
    return list(numerics_report())


# The test command must stay under CI's 8 GB: after each test, the peak resident memory of this process and of
# the largest process it started and waited for; each rise of 100 MB or more is kept with the test that made it.
_PEAK_STEP_KB = 100_000
_peaks: dict[str, list[tuple[int, str]]] = {"this process": [], "a process it started": []}


def pytest_runtest_logreport(report) -> None:
    if report.when != "teardown":
        return
    for who, kind in (("this process", resource.RUSAGE_SELF), ("a process it started", resource.RUSAGE_CHILDREN)):
        kb = resource.getrusage(kind).ru_maxrss
        if kb >= (_peaks[who][-1][0] if _peaks[who] else 0) + _PEAK_STEP_KB:
            _peaks[who].append((kb, report.nodeid))


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    # -q hides the header: then, or when something failed, the same lines close the report
    if config.get_verbosity() < 0 or terminalreporter.stats.get("failed") or terminalreporter.stats.get("error"):
        terminalreporter.write_sep("-", "machine")
        for line in numerics_report():
            terminalreporter.write_line(line)
    terminalreporter.write_sep("-", "peak resident memory (the last rises of 100 MB or more, and the test after which)")
    for who, rises in _peaks.items():
        for kb, nodeid in rises[-3:]:
            terminalreporter.write_line(f"{who}: {kb / 1e6:.2f} GB after {nodeid}")


@pytest.fixture(scope="session")
def registry():
    from framework.registry import default_registry
    return default_registry()


def mapping_rss_kb(path: Path) -> int:
    """Resident kB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[:1].isalnum() and "-" in line.split()[0] and ":" not in line.split()[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total
