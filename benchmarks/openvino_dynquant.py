"""`openvino_measure.py dynquant` (benchmarks/openvino_measure.py) on a machine the model files cannot be
carried to: GGUF files of the two models' shapes and tensor types with random weights
(benchmarks/vulkan_models.json), so the speed figures hold and the reference bounds are not measured.
benchmarks/openvino_dynquant_h200.sh runs it on the nvidia-h200 machine (an AMX CPU)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def main() -> None:
    import openvino_measure as measure
    from vulkan_bench import write_model

    from framework.model.model import Model
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    folder = Path(tempfile.mkdtemp(prefix="openvino-dynquant-"))
    models = {f"{name} (random weights)": Model(write_model(name, spec, folder / f"{name}.gguf",
                                                            np.random.default_rng(0)))
              for name, spec in specs.items()}
    measure.dynquant(models, rounds=int(os.environ.get("ROUNDS", "3")))


if __name__ == "__main__":
    main()
