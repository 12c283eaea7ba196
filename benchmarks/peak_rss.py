"""Peak resident memory of `framework run -n 8` per plugin, next to the model file's size (docs/memory.md).

    .venv/bin/python benchmarks/peak_rss.py                    # both models, every plugin present here
    .venv/bin/python benchmarks/peak_rss.py --models smollm2 --backends cpu,openvino:CPU

Each run is its own process (its peak is read with os.wait4), after a first run that fills the on-disk
caches (the GGUF index, OpenVINO's compiled models, XDNA's packed tiles), so the figure is a second run's;
a baseline process that only imports the framework and loads the plugins is measured the same way.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from framework.model.default import model_path  # noqa: E402

BACKENDS = {"cpu": ("cpu", {}), "openvino:CPU": ("openvino:CPU", {}), "vulkan:0": ("vulkan:0", {}),
            "opencl:0": ("opencl:0", {}), "xdna:0 (host arm),cpu": ("xdna:0,cpu", {"FRAMEWORK_XDNA_HOST_ARM": "1"})}
BASELINE = "from framework.core.registry import default_registry; default_registry()"


def peak_rss(argv: list[str], env: dict) -> tuple[int, int]:
    """(exit status, peak RSS in bytes) of one process."""
    proc = subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        print(proc.stderr.read().decode()[-800:], file=sys.stderr)
    proc.stderr.close()
    return proc.returncode, usage.ru_maxrss * 1024


def held_per_byte(models: list[str], devices=None) -> dict[tuple[str, str], float]:
    """What each available device (of ``devices``, default the registry's) says it will hold for a model's
    weights (Device.weight_nbytes, the figure reservation counts), per byte of the weights in the file:
    {(model, device name): ratio}."""
    from framework.core.registry import default_registry
    from framework.model.model import Model
    devices = [d for d in (devices or default_registry().devices()) if d.available]
    held = {}
    for name in models:
        model = Model(model_path(name))
        graph_weights = [model.arch.weight(n) for n in model.arch.weight_names()]
        in_file = sum(t.nbytes for t in graph_weights)
        for d in devices:
            held[name, d.name] = sum(d.weight_nbytes(t) for t in graph_weights) / in_file
    return held


def baseline_rss() -> int:
    """Peak RSS in bytes of a process that imports the framework and loads every plugin, no model."""
    return peak_rss([sys.executable, "-c", BASELINE], {})[1]


def run_peak_rss(name: str, key: str) -> int | None:
    """Peak RSS in bytes of a second `framework run -n 8` of a model on one BACKENDS key (the first fills the
    on-disk caches); None when the run fails (its error is printed)."""
    spec, env = BACKENDS[key]
    argv = [sys.executable, "-m", "framework", "run", "-m", str(model_path(name)), "-n", "8",
            "--backends", spec, "Once upon a time"]
    if peak_rss(argv, env)[0]:
        return None
    rc, peak = peak_rss(argv, env)
    return None if rc else peak


def backend_keys(backends: str) -> list[str]:
    """The BACKENDS keys a comma-separated --backends value names (a key or its first word)."""
    wanted = backends.split(",")
    return [k for k in BACKENDS if k.split(" ")[0] in wanted or k in wanted]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="smollm2,gemma3")
    p.add_argument("--backends", default=",".join(BACKENDS), help=f"keys of: {'; '.join(BACKENDS)}")
    args = p.parse_args()
    models = args.models.split(",")
    held = held_per_byte(models)
    devices = sorted({d for _, d in held}, key=lambda d: [k for _, k in held].index(d))
    print("weights held per byte of the file's weights (Device.weight_nbytes over every tensor):")
    print(f"{'model':<8} " + " ".join(f"{d:>13}" for d in devices))
    for name in models:
        print(f"{name:<8} " + " ".join(f"{held[name, d]:>13.2f}" for d in devices))
    print()
    base = baseline_rss()
    print(f"baseline (python, the framework and every plugin loaded, no model): {base / 2**20:.0f} MiB")
    print(f"{'model':<8} {'file MiB':>8}  {'backends':<24} {'peak MiB':>8} {'over baseline':>13} {'/ file':>7}")
    for name in models:
        size = model_path(name).stat().st_size
        for key in backend_keys(args.backends):
            peak = run_peak_rss(name, key)
            if peak is None:
                print(f"{name:<8} {size / 2**20:>8.1f}  {key:<24} failed")
                continue
            print(f"{name:<8} {size / 2**20:>8.1f}  {key:<24} {peak / 2**20:>8.0f} {(peak - base) / 2**20:>13.0f} "
                  f"{(peak - base) / size:>7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
