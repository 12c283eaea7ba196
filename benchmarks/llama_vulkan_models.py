"""Write the random-weight GGUF files that benchmarks/llama_vulkan_h200.sh gives llama.cpp's llama-bench:
the shapes, tensor types and metadata of benchmarks/vulkan_models.json (the same that vulkan_bench.py
gives vulkan:0), with a placeholder vocabulary of the model's size, which llama.cpp needs to load a file.

    python benchmarks/llama_vulkan_models.py DIR [--models smollm2,gemma3]

prints one line a model: its name and the file written."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from vulkan_bench import ROOT, write_model


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", type=Path)
    ap.add_argument("--models", default="smollm2,gemma3")
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    rng = np.random.default_rng(0)
    for name in args.models.split(","):
        if name not in specs:
            raise SystemExit(f"no model {name!r} in benchmarks/vulkan_models.json (it has {', '.join(specs)})")
        path = write_model(name, specs[name], args.dir / f"{name}-random-vocab.gguf", rng, vocab=True)
        print(name, path, flush=True)


if __name__ == "__main__":
    main()
