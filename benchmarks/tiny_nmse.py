"""How far the tiny models' logits are from llama.cpp's (tests/reference/tiny/), on the CPU plugin's two
paths, and how much of that llama.cpp's own rounding of activations makes.

Per architecture, the worst NMSE over the references' prompts (a prefill and 8 decode steps each, llama.cpp's
greedy tokens fed back): the float32 path (FRAMEWORK_CPU_MATMUL=f32) and the q8 path (activations rounded as
llama.cpp rounds them for each weight type) against llama.cpp on the mixed-type file; and, given llama.cpp's
logits on the same weights decoded to F32 (where llama.cpp rounds no activation), llama.cpp against itself
(mixed file against the decoded one) and our float32 path against llama.cpp on the decoded file.

    # llama.cpp's logits on the decoded files (a Python with llama-cpp-python 0.3.36, gguf and quicktok-v1):
    PYTHON benchmarks/tiny_nmse.py llama DIR
    # the table (the project's venv):
    .venv/bin/python benchmarks/tiny_nmse.py ours DIR
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import tiny_models  # noqa: E402

REF = ROOT / "tests" / "reference" / "tiny"
ARCHS = ("qwen2", "qwen3", "llama", "qwen35", "gemma4")
DECODED = ("qwen2", "qwen3", "llama", "qwen35")


def prompts(arch: str) -> list[dict]:
    return json.loads((REF / f"{arch}.json").read_text(encoding="utf-8"))["prompts"]


def nmse(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sum((a - b) ** 2) / np.sum(b ** 2))


def worst(ours: dict, theirs: dict) -> float:
    return max(nmse(o, t) for k in ours for o, t in zip(ours[k], theirs[k].astype(np.float32)))


def llama(out: Path) -> None:
    from llama_cpp import Llama
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for arch in DECODED:
            path = tiny_models.write(arch, Path(tmp) / f"tiny-{arch}-decoded.gguf", decoded=True)
            llm = Llama(str(path), n_ctx=512, n_batch=512, n_threads=2, logits_all=True, verbose=False, seed=0)
            arrays = {}
            for p in prompts(arch):
                llm.reset()
                llm.eval(p["ids"])
                rows = [np.array(llm.scores[len(p["ids"]) - 1], dtype=np.float32)]
                for t in p["greedy_ids"]:
                    llm.eval([t])
                    rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
                arrays[p["steps_key"]] = np.stack(rows)
            np.savez(out / f"{arch}-decoded.npz", **arrays)
            print(arch, "written", flush=True)
            del llm


def ours_logits(path: Path, arch: str, mode: str) -> dict:
    from framework.model.model import Model
    from framework.plugins.cpu.device import CpuDevice
    from framework.runtime.session import Session
    session = Session(Model(path), [CpuDevice(mode)], n_ctx=256)
    out = {}
    for p in prompts(arch):
        session.reset()
        out[p["steps_key"]] = np.stack([session.eval(p["ids"])] + [session.eval([t]) for t in p["greedy_ids"]])
    return out


def ours(llama_dir: Path | None) -> None:
    print("| architecture | float32 path | q8 path | llama.cpp vs itself (mixed vs decoded) | float32 path vs "
          "llama.cpp, decoded file |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHS:
            mixed = dict(np.load(REF / f"{arch}.npz"))
            path = tiny_models.write(arch, Path(tmp) / f"tiny-{arch}.gguf")
            cells = [worst(ours_logits(path, arch, m), mixed) for m in ("f32", "q8")]
            npz = llama_dir / f"{arch}-decoded.npz" if llama_dir else None
            if npz and npz.is_file():
                decoded = dict(np.load(npz))
                twin = tiny_models.write(arch, Path(tmp) / f"tiny-{arch}-decoded.gguf", decoded=True)
                cells += [worst(decoded, mixed), worst(ours_logits(twin, arch, "f32"), decoded)]
            print(f"| {arch} | " + " | ".join(f"{c:.2e}" for c in cells) + " |" + " - |" * (4 - len(cells)),
                  flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in ("llama", "ours") or (sys.argv[1] == "llama" and len(sys.argv) < 3):
        sys.exit(__doc__)
    if sys.argv[1] == "llama":
        llama(Path(sys.argv[2]))
    else:
        ours(Path(sys.argv[2]) if len(sys.argv) > 2 else None)
