"""A real GGUF file through this framework and through llama.cpp, side by side: token ids, logits, greedy
tokens and perplexity. For the files benchmarks/fetch_pypi_models.py assembles (no test needs them);
docs/models.md, "Real files from PyPI", has the figures.

    LLAMA_CPP_LIB_PATH=... PYTHONPATH=.../llama_cpp_python-0.3.36 \\
        python benchmarks/real_model_check.py FILE [--backends cpu] [--threads 2] [--out result.json]

llama.cpp runs first (its model closed before this framework loads the file, so the two never share
memory). For each prompt: llama.cpp's prefill and DECODE greedy steps; this framework fed the same
tokens (llama.cpp's greedy continuation, so both see one context at every step) gives the logits the
NMSE is taken on, sum((ours - theirs)^2) / sum(theirs^2) as ggml's test-backend-ops computes it, and
then decodes greedily on its own, so the report says where the two greedy runs part, if they do.
Perplexity: one window over the first TEXT_TOKENS tokens of a license text, both sides, with the
top-1 agreement between them.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

PROMPTS = ("The capital of France is",
           "def fibonacci(n):",
           "# Python function that returns the n-th prime number\n",
           "Once upon a time, in a small village by the sea,")
STRINGS = ("Hello world", " hello  world\n\tthe end", "naïve café — 北京市 🤖 ok", "x = [1, 22, 333, 4444, 55555]",
           "  def f(a,b):\n        return a**b  # power", "I'm can't won't they'd", "<|im_start|>user\nhi<|im_end|>")
DECODE = 16
TEXT = Path("/usr/share/common-licenses/Apache-2.0")
TEXT_TOKENS = 192
TEXT_CHARS = 2000           # more than TEXT_TOKENS tokens of it


def nmse(ours: np.ndarray, theirs: np.ndarray) -> float:
    ours, theirs = ours.astype(np.float64), theirs.astype(np.float64)
    return float(np.sum((ours - theirs) ** 2) / np.sum(theirs ** 2))


def nll_rows(logits: np.ndarray, ids: list[int]) -> np.ndarray:
    """Negative log-likelihood of ids[1:] given the rows before them."""
    x = logits[:-1].astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(x - m).sum(axis=1)))
    return lse - x[np.arange(len(ids) - 1), ids[1:]]


def llama_side(path: Path, threads: int, text: str, kv: str) -> dict:
    from llama_cpp import GGML_TYPE_F16, GGML_TYPE_F32, Llama
    kv_type = {"f16": GGML_TYPE_F16, "f32": GGML_TYPE_F32}[kv]
    llm = Llama(str(path), n_ctx=1024, n_batch=512, n_threads=threads, n_threads_batch=threads, logits_all=True,
                verbose=False, seed=0, type_k=kv_type, type_v=kv_type)
    add_bos = llm.tokenize(b"a", add_bos=True) != llm.tokenize(b"a", add_bos=False)
    res = {"add_bos": add_bos, "tokenize": [llm.tokenize(s.encode(), add_bos=False, special=False) for s in STRINGS],
           "prompts": []}
    for prompt in PROMPTS:
        llm.reset()
        ids = llm.tokenize(prompt.encode(), add_bos=True, special=False)
        t0 = time.perf_counter()
        llm.eval(ids)
        rows, greedy = [np.array(llm.scores[len(ids) - 1], dtype=np.float32)], []
        for _ in range(DECODE):
            greedy.append(int(np.argmax(rows[-1])))
            llm.eval([greedy[-1]])
            rows.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32))
        res["prompts"].append({"prompt": prompt, "ids": ids, "greedy": greedy, "rows": np.stack(rows[:DECODE]),
                               "text": llm.detokenize(greedy).decode("utf-8", "replace"),
                               "seconds": time.perf_counter() - t0})
    raw = llm.tokenize(text.encode(), add_bos=False, special=False)[:TEXT_TOKENS]
    ids = llm.tokenize(b"", add_bos=True, special=False) + raw if add_bos else raw
    llm.reset()
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
    nll = nll_rows(logits, ids)
    res["text"] = {"raw": raw, "ids": ids, "perplexity": float(math.exp(nll.mean())), "top1": logits.argmax(axis=1)}
    llm.close()
    return res


def llama_perplexity(path: Path, threads: int, text_file: Path) -> tuple[int, float]:
    """llama.cpp's perplexity of a whole text file in one window, scored as `framework perplexity` scores
    it (every token after the first, given all before it): the figure to set beside that command's."""
    from llama_cpp import Llama
    text = text_file.read_text(encoding="utf-8")
    llm = Llama(str(path), n_ctx=2048, n_batch=2048, n_threads=threads, n_threads_batch=threads, logits_all=True,
                verbose=False)
    ids = llm.tokenize(text.encode(), add_bos=llm.tokenize(b"a", add_bos=True) != llm.tokenize(b"a", add_bos=False),
                       special=False)
    if len(ids) > 2048:
        raise SystemExit(f"{text_file}: {len(ids)} tokens, more than the one 2048-token window this scores")
    llm.eval(ids)
    nll = nll_rows(np.array(llm.scores[:len(ids)], dtype=np.float32), ids)
    llm.close()
    return len(ids), float(math.exp(nll.mean()))


def framework_side(path: Path, backends: str, ref: dict, text: str) -> dict:
    from framework.terminal import select_devices
    from framework.model.model import Model
    from framework.runtime.perplexity import perplexity
    from framework.runtime.session import Session
    model = Model(path)
    session = Session(model, select_devices(backends), n_ctx=1024)
    tok = model.tokenizer
    res = {"tokenize": [tok.encode(s, add_bos=False) for s in STRINGS], "prompts": []}
    for p in ref["prompts"]:
        session.reset()
        t0 = time.perf_counter()
        rows = [session.eval(p["ids"])]
        for t in p["greedy"][:-1]:                 # llama.cpp's tokens: one context for both at every step
            rows.append(session.eval([t]))
        rows = np.stack(rows)
        session.reset()                            # then greedy on its own
        row, own = session.eval(p["ids"]), []
        for _ in range(DECODE):
            own.append(int(np.argmax(row)))
            row = session.eval([own[-1]])
        res["prompts"].append({"rows": rows, "own": own, "text": tok.decode(own), "seconds": time.perf_counter() - t0})
    ids = ref["text"]["ids"]
    ours_ids = tok.encode(text, add_bos=False)[:TEXT_TOKENS]
    session.reset()
    r = perplexity(session, ids, window=len(ids))
    res["text"] = {"ids_equal": ours_ids == ref["text"]["raw"], "perplexity": r.perplexity, "top1": r.top1[:len(ids)]}
    return res


def compare(path: Path, ref: dict, ours: dict) -> dict:
    out = {"file": str(path), "strings_equal": sum(a == b for a, b in zip(ref["tokenize"], ours["tokenize"])),
           "strings": len(STRINGS), "prompts": []}
    for lp, fp in zip(ref["prompts"], ours["prompts"]):
        per_step = [nmse(a, b) for a, b in zip(fp["rows"], lp["rows"])]
        top1_same = [int(np.argmax(a)) == int(np.argmax(b)) for a, b in zip(fp["rows"], lp["rows"])]
        # where the top-1s differ: how far llama.cpp's token sits below our top logit (a near-tie is small)
        gaps = [float(a.max() - a[int(np.argmax(b))]) for a, b, same in zip(fp["rows"], lp["rows"], top1_same)
                if not same]
        part = next((i for i, (a, b) in enumerate(zip(fp["own"], lp["greedy"])) if a != b), None)
        out["prompts"].append({
            "prompt": lp["prompt"], "n_prompt": len(lp["ids"]), "nmse_prefill": per_step[0],
            "nmse_decode_max": max(per_step[1:]), "nmse_decode_median": float(np.median(per_step[1:])),
            "top1_equal_teacher_forced": f"{sum(top1_same)}/{len(top1_same)}", "gaps_where_top1_differs": gaps,
            "greedy_equal": part is None, "greedy_parts_at": part,
            "llama_text": lp["text"], "framework_text": fp["text"]})
    t_ref, t_ours = ref["text"], ours["text"]
    out["text"] = {"tokens": len(t_ref["ids"]), "ids_equal": t_ours["ids_equal"],
                   "perplexity_llama_cpp": t_ref["perplexity"], "perplexity_framework": t_ours["perplexity"],
                   "ratio": t_ours["perplexity"] / t_ref["perplexity"],
                   "top1_agreement": float(np.mean(t_ours["top1"] == t_ref["top1"]))}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--backends", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-kv", choices=("f16", "f32"), default="f16",
                    help="llama.cpp's KV cache type (f16 is its default; this framework's cpu cache is float32)")
    ap.add_argument("--out", type=Path, help="write the comparison as JSON here too")
    ap.add_argument("--llama-perplexity-of", type=Path, metavar="TEXT",
                    help="only print llama.cpp's perplexity of this text file in one window (compare with "
                         "`framework perplexity -m FILE -f TEXT --ctx N`, N at least its tokens)")
    a = ap.parse_args(argv)
    if a.llama_perplexity_of:
        n, ppl = llama_perplexity(a.file, a.threads, a.llama_perplexity_of)
        print(f"llama.cpp perplexity {ppl:.4f} over {n} tokens ({n - 1} scored, one window)")
        return 0
    text = TEXT.read_text(encoding="utf-8")[:TEXT_CHARS]
    ref = llama_side(a.file, a.threads, text, a.llama_kv)
    gc.collect()
    import numba
    numba.set_num_threads(min(a.threads, numba.config.NUMBA_NUM_THREADS))
    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    ours = framework_side(a.file, a.backends, ref, text)
    result = compare(a.file, ref, ours)
    result["backends"], result["threads"], result["llama_kv"] = a.backends, a.threads, a.llama_kv
    text_out = json.dumps(result, indent=1, ensure_ascii=False)
    print(text_out)
    if a.out:
        a.out.write_text(text_out + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
