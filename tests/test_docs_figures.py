"""docs/memory.md's declared bytes per file byte hold for the plugins present, read the way
benchmarks/docs_figures.py reads them (so a change to what a device holds, or to the doc's tables, that
leaves the other behind fails here); the peak resident sets are measured by the script, not here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from framework.plugins.cpu.device import CpuDevice

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def docs_figures():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "benchmarks" / "docs_figures.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_script_reads_both_memory_tables(docs_figures):
    tables = docs_figures.markdown_tables(docs_figures.MEMORY_DOC.read_text())
    held = docs_figures.doc_cells(docs_figures.table_starting(tables, docs_figures.HELD_TABLE))
    peaks = docs_figures.doc_cells(docs_figures.table_starting(tables, docs_figures.PEAK_TABLE))
    for model in ("smollm2", "gemma3"):
        assert {(model, d) for d in ("cpu", "openvino:CPU", "vulkan:0", "opencl:0")} <= held.keys()
        assert {(model, d) for d in ("cpu", "openvino:CPU", "vulkan:0", "opencl:0", "xdna:0")} <= peaks.keys()
    assert all(v > 100 for v in peaks.values())         # MiB, the first figure of each cell


def test_the_declared_bytes_per_file_byte_are_what_the_devices_declare(docs_figures, registry):
    """The doc's cpu column is the plugin's default, quantized path (the tests' registry runs it in float32)."""
    cpu = CpuDevice("q8")
    if not cpu.available:
        pytest.skip(cpu.unavailable_reason)
    tables = docs_figures.markdown_tables(docs_figures.MEMORY_DOC.read_text())
    doc = docs_figures.doc_cells(docs_figures.table_starting(tables, docs_figures.HELD_TABLE))
    devices = [cpu] + [d for d in registry.devices() if d.name != "cpu"]
    measured = docs_figures.peak_rss.held_per_byte(["smollm2", "gemma3"], devices)
    compared = [(key, value, measured[key]) for key, value in doc.items() if key in measured]
    assert any(key[1] == "cpu" for key, _, _ in compared)
    for key, value, now in compared:
        assert abs(now - value) < 0.006, f"docs/memory.md says {value} for {key}, the device declares {now:.3f}"
