"""llama.cpp's speculative decoding beside ours, each as a ratio to its own engine's target alone: the same
target and draft files, the same prompts (benchmarks/prompts), greedy, the same token count and threads.

    python benchmarks/llama_speculative_bench.py --tools ~/.cache/framework/llama.cpp/build-0.3.36/bin \
        [--target ~/.cache/framework/models/qwen25-coder-1.5b.gguf] \
        [--draft ~/.cache/framework/models/qwen25-coder-0.5b.gguf] [--tokens 64] [--prompts 2] [--repeats 3] \
        [--threads 1] [--draft-n 4] [--backends cpu]

benchmarks/build_llama_tools.sh builds the tools. For every prompt, after one warm-up run of each, the
engines take turns --repeats times (the first one alternating), and each runs three ways:
- the target alone: ours `framework`'s Session and generate (as benchmarks/lookup_bench.py); llama.cpp's
  llama-completion on the same prompt (-no-cnv, no chat template, as ours), its "eval time" line;
- prompt lookup: ours `--draft ngram:3`; llama.cpp's llama-lookup (its n-gram cache of the context, n-grams
  of 1 to 4 tokens);
- the draft model: ours the 0.5B with adaptive drafting (p_min 0.75, as `framework run`); llama.cpp's
  llama-speculative with -md (it has no p_min: it drafts --draft-n tokens every round).
Both engines draft at most --draft-n tokens a round. Speeds are decode tokens a second, the prompt's prefill
left out (llama.cpp's "decoded N tokens in S seconds" and "eval time" lines; ours as lookup_bench). EOS is
ignored by both (--ignore-eos), so each generates --tokens tokens (llama.cpp's lookup and speculative may
overshoot by a round; the count is printed). Greedy text with a draft is checked against the same engine's
target alone: ours must match token for token (it stops otherwise); llama.cpp's is reported (same_text).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import lookup_bench as ours  # noqa: E402

MODELS = Path.home() / ".cache" / "framework" / "models"
WAYS = ("alone", "lookup", "draft")
EVAL = re.compile(r":\s+eval time =\s*([\d.]+) ms /\s*(\d+) (?:runs|tokens)")
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
COUNTS = re.compile(r"\b(n_drafted|n_accept)\s*=\s*(\d+)")


def log(*a) -> None:
    print(*a, flush=True)


# -- llama.cpp ---------------------------------------------------------------------------------------
def llama(args, way: str, prompt: str) -> dict:
    """One run of a llama.cpp tool: decode tok/s, tokens, drafted and accepted, and the generated text."""
    common = ["-m", args.target, "-p", prompt, "-n", str(args.tokens), "--temp", "0", "--ignore-eos",
              "--no-escape", "-t", str(args.threads), "-tb", str(args.threads), "-c", "2048"]
    tool, extra = {"alone": ("llama-completion", ["-no-cnv"]),
                   "lookup": ("llama-lookup", ["--spec-draft-n-max", str(args.draft_n)]),
                   "draft": ("llama-speculative", ["-md", args.draft, "-td", str(args.threads),
                                                   "--spec-draft-n-max", str(args.draft_n)])}[way]
    p = subprocess.run([str(Path(args.tools) / tool)] + common + extra, capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise SystemExit(f"{tool} exited with {p.returncode}: {p.stderr[-2000:]}")
    if way == "alone":
        m = EVAL.search(p.stderr)
        if not m:
            raise SystemExit(f"{tool}: no 'eval time' line in its output: {p.stderr[-2000:]}")
        ms, runs = float(m[1]), int(m[2])
        row = {"tok_s": runs / (ms / 1000), "tokens": runs + 1}
    else:
        m = DECODED.search(p.stderr)
        if not m:
            raise SystemExit(f"{tool}: no 'decoded N tokens' line in its output: {p.stderr[-2000:]}")
        row = {"tok_s": int(m[1]) / float(m[2]), "tokens": int(m[1]),
               **{k: int(v) for k, v in COUNTS.findall(p.stderr)}}
    row["text"] = generated(p.stdout, prompt)
    return row


def generated(stdout: str, prompt: str) -> str:
    """The text after the prompt in a tool's output (each prints the prompt, then what it generates)."""
    tail = prompt.rstrip()[-40:]
    at = stdout.find(tail)
    return stdout[at + len(tail):].strip() if at >= 0 else stdout.strip()


def same_start(a: str, b: str) -> bool:
    n = min(len(a), len(b))
    return n > 0 and a[:n] == b[:n]


def where_differs(got: str, want: str) -> str:
    """The first character where a drafted text leaves the target's own, with a little of each after it."""
    i = next((k for k in range(min(len(got), len(want))) if got[k] != want[k]), min(len(got), len(want)))
    return f"at character {i} of {len(want)}: {got[i:i + 30]!r} against {want[i:i + 30]!r}"


# -- ours ----------------------------------------------------------------------------------------------
def framework(args, way: str, env: dict, ids: list[int]) -> dict:
    model, devs, drafter = env["model"], env["devs"], env["drafter"]
    if way == "alone":
        tokens, speed = ours.alone(model, devs, ids, args.tokens)
        return {"tok_s": speed, "tokens": len(tokens), "ids": tokens}
    spec, draft_model = ("ngram:3", None) if way == "lookup" else (args.draft, drafter)
    tokens, speed, info = ours.with_draft(model, devs, ids, args.tokens, spec, draft_model, args.draft_n, ours.P_MIN)
    return {"tok_s": speed, "tokens": len(tokens), "ids": tokens, "n_drafted": info["drafted"],
            "n_accept": info["accepted"]}


# -- both ----------------------------------------------------------------------------------------------
def one_prompt(args, env: dict, set_name: str, p: dict, turn_order: list[str]) -> list[dict]:
    """Warm-up, then --repeats turns of both engines; a row per engine with medians and ratios."""
    ids = env["model"].tokenizer.encode(p["prompt"])
    runs: dict[str, dict[str, list[dict]]] = {e: {w: [] for w in WAYS} for e in turn_order}
    for turn in range(args.repeats + 1):                   # turn 0 warms both up and is not counted
        order = turn_order if turn % 2 == 0 else turn_order[::-1]
        for engine in order:
            for way in WAYS:
                r = framework(args, way, env, ids) if engine == "framework" else llama(args, way, p["prompt"])
                if turn:
                    runs[engine][way].append(r)
    rows = []
    for engine, by in runs.items():
        want = by["alone"][0]
        row = {"engine": engine, "set": set_name, "prompt": p["name"], "prompt_tokens": len(ids),
               "threads": args.threads}
        for way in WAYS:
            row[f"{way}_tok_s"] = round(statistics.median(r["tok_s"] for r in by[way]), 2)
            row[f"{way}_tokens"] = by[way][-1]["tokens"]
            if way != "alone":
                last = by[way][-1]
                row[f"{way}_drafted"], row[f"{way}_accepted"] = last.get("n_drafted"), last.get("n_accept")
                row[f"{way}_ratio"] = round(row[f"{way}_tok_s"] / row["alone_tok_s"], 3)
                if engine == "framework":
                    if any(r["ids"] != want["ids"] for r in by[way]):
                        raise SystemExit(f"{p['name']}: our greedy text with the {way} draft differs from the "
                                         f"target's own")
                    row[f"{way}_same_text"] = True
                else:
                    row[f"{way}_same_text"] = all(same_start(r["text"], want["text"]) for r in by[way])
                    if not row[f"{way}_same_text"]:
                        row[f"{way}_differs"] = where_differs(by[way][-1]["text"], want["text"])
        rows.append(row)
        log(json.dumps(row))
    return rows


def summary(rows: list[dict], sets: list[str]) -> None:
    log("\n| set | engine | target alone tok/s | lookup tok/s | lookup / alone | 0.5B draft tok/s | "
        "draft / alone |")
    log("| --- | --- | --- | --- | --- | --- | --- |")
    for set_name in sets:
        for engine in ("framework", "llama.cpp"):
            mine = [r for r in rows if r["set"] == set_name and r["engine"] == engine]
            if not mine:
                continue
            med = lambda key: statistics.median(r[key] for r in mine)   # noqa: E731
            rng = lambda key: f"{min(r[key] for r in mine):.2f} to {max(r[key] for r in mine):.2f}"   # noqa: E731
            log(f"| {set_name} | {engine} | {med('alone_tok_s'):.1f} | {med('lookup_tok_s'):.1f} | "
                f"{med('lookup_ratio'):.2f}x ({rng('lookup_ratio')}) | {med('draft_tok_s'):.1f} | "
                f"{med('draft_ratio'):.2f}x ({rng('draft_ratio')}) |")
    log("(medians over the set's prompts, the range of the prompts' ratios in brackets)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", required=True, help="the folder of llama-completion, llama-lookup and "
                    "llama-speculative (benchmarks/build_llama_tools.sh prints it)")
    ap.add_argument("--target", default=str(MODELS / "qwen25-coder-1.5b.gguf"))
    ap.add_argument("--draft", default=str(MODELS / "qwen25-coder-0.5b.gguf"))
    ap.add_argument("--backends", default="cpu", help="our device list (default: cpu)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens generated per run (default: 64)")
    ap.add_argument("--draft-n", type=int, default=4, help="the most tokens drafted a round, both engines "
                    "(default: 4, as lookup_bench)")
    ap.add_argument("--prompts", type=int, default=2, help="the first N prompts of each set (default: 2)")
    ap.add_argument("--sets", default=",".join(ours.SETS))
    ap.add_argument("--repeats", type=int, default=3, help="timed turns of each engine per prompt (default: 3)")
    ap.add_argument("--threads", type=int, default=1, help="threads of both engines (default: 1)")
    ap.add_argument("--out", help="write every row as JSON here (default: none)")
    args = ap.parse_args()
    import numba
    numba.set_num_threads(args.threads)
    model = ours.load(args.target)
    env = {"model": model, "devs": ours.default_registry().select(args.backends), "drafter": ours.load(args.draft)}
    rows: list[dict] = []
    sets = args.sets.split(",")
    for i, set_name in enumerate(sets):
        for j, p in enumerate(ours.prompt_set(set_name, args.prompts)):
            order = ["framework", "llama.cpp"] if (i + j) % 2 == 0 else ["llama.cpp", "framework"]
            rows += one_prompt(args, env, set_name, p, order)
    summary(rows, sets)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
