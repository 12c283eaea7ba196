"""Where the cpu plugin's q8 path may part from llama.cpp's CPU arithmetic on Gemma 3, tried by emulation
against llama.cpp's outputs (tests/reference): ggml-cpu computes GEGLU through a float16 table
(GGML_GELU_FP16: x rounded to float16, the GELU of that rounded to float16) and keeps K and V in float16,
where the q8 path computes GELU in float32 over a float32 cache. Each configuration NAME is
PATH-GELU-KV: PATH q8 or f32, GELU exact or table, KV f32 or f16 (q, k and v rounded to float16 before
attention). Per configuration: teacher-forced top-1 agreement and worst gap, the NMSE of the prompts' last
logits, perplexity and top-1 agreement on the reference text.

    .venv/bin/python benchmarks/q8_vs_ggml_rounding.py q8-exact-f32 q8-table-f32 q8-exact-f16 f32-exact-f32
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import framework.plugins.cpu.attention as attention  # noqa: E402
from conftest import load_model, reference, reference_text  # noqa: E402
from framework.core.graph import reference as kernels  # noqa: E402
from framework.plugins.cpu.device import CpuDevice  # noqa: E402
from framework.runtime.perplexity import perplexity  # noqa: E402
from framework.runtime.session import Session  # noqa: E402
from reference_checks import teacher_forced  # noqa: E402

EXACT_GELU, ATTEND = kernels.GLU["geglu"], attention.flash_attn_ext


def f16(a):
    return np.asarray(a, np.float32).astype(np.float16).astype(np.float32)


def gelu_table(x):
    """ggml_vec_geglu_f32's GGML_GELU_FP16 arm: 0 at or below -10, x at or above 10, else the table."""
    y = f16(EXACT_GELU(f16(x)))
    return np.where(x >= 10, x, np.where(x <= -10, np.float32(0), y)).astype(np.float32)


def attend_f16(q, k, v, mask=None, *, scale):
    return ATTEND(f16(q), f16(k), f16(v), mask, scale=scale)


def main(names: list[str]) -> None:
    model = load_model("gemma3")
    ref, arrays = reference("gemma3")
    ids = model.tokenizer.encode(reference_text(ref))
    top1_ref = arrays[ref["text"]["top1_key"]]
    for name in names:
        path, gelu, kv = name.split("-")
        kernels.GLU["geglu"] = gelu_table if gelu == "table" else EXACT_GELU
        attention.flash_attn_ext = attend_f16 if kv == "f16" else ATTEND
        s = Session(model, [CpuDevice(path)], n_ctx=1024)
        agree, total, worst, _ = teacher_forced(s, ref)
        errors = []
        for p in ref["prompts"]:
            s.reset()
            got, want = s.eval(p["ids"]), arrays[p["last_logits_key"]]
            errors.append(float(np.mean((got - want) ** 2) / np.mean(want ** 2)))
        r = perplexity(s, ids, window=len(ids))
        top1 = float(np.mean(r.top1[:len(top1_ref)] == top1_ref))
        print(f"{name}: teacher-forced {agree}/{total}, worst gap {worst:.3f}; last-logit NMSE max {max(errors):.2e} "
              f"median {np.median(errors):.2e}; perplexity {r.perplexity:.4f} (llama.cpp "
              f"{ref['text']['perplexity']:.4f}); text top-1 {top1:.4f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:] or ["q8-exact-f32", "q8-table-f32"])
