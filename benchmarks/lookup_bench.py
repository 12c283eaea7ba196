"""Prompt lookup (--draft ngram[:N]) against the target alone, on two prompt sets kept in the repository:
code edits (benchmarks/prompts/code_edits.jsonl: a source file and an instruction, the answer copying most
of it) and free text (benchmarks/prompts/free_text.jsonl: questions, stories).

    python benchmarks/lookup_bench.py [--models smollm2,gemma3] [--backends cpu] [--backends openvino:CPU]

For every model, device list and prompt, greedy, --tokens tokens: the target alone and with the ngram draft
(adaptive drafting on), taking turns --repeats times after a warm-up of each; decode tok/s (medians),
drafted and accepted tokens, tokens per target step, and the ratio of the two speeds, per prompt set (the
median of its prompts). Then the cost of verifying 2, 4 and 8 rows (a step with the logits of every row)
against one decode step, on each device list: what a round costs when its drafts are refused.
Greedy output with the draft is checked to be the target's own, token for token.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from framework.model.default import model_path  # noqa: E402
from framework.model.model import Model  # noqa: E402
from framework.registry import default_registry  # noqa: E402
from framework.runtime.generate import generate  # noqa: E402
from framework.runtime.sampling import Sampler, SamplingParams  # noqa: E402
from framework.runtime.session import Session  # noqa: E402
from framework.runtime.speculative import SpeculativeDecoder, make_draft  # noqa: E402

SETS = ("code_edits", "free_text")
GREEDY = SamplingParams()


def log(*a) -> None:
    print(*a, flush=True)


def prompt_set(name: str) -> list[dict]:
    lines = (ROOT / "benchmarks" / "prompts" / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def alone(model, devs, ids, n) -> tuple[list[int], float]:
    s = Session(model, devs, n_ctx=len(ids) + n + 8)
    s.reserve(len(ids), n)
    tokens = [p.token for p in generate(s, ids, n, Sampler(GREEDY))]
    return tokens, (len(tokens) - 1) / s.decode.seconds


def with_ngram(model, devs, ids, n, spec: str, n_draft: int) -> tuple[list[int], float, dict]:
    s = Session(model, devs, n_ctx=len(ids) + n + 8)
    d = SpeculativeDecoder(s, make_draft(spec, s, devs), n_draft, baseline=0)
    d.reserve(len(ids), n)
    tokens = [p.token for p in d.generate(ids, n, Sampler(GREEDY))]
    st = d.stats
    return tokens, st.tokens_per_second, {"drafted": st.drafted, "accepted": st.accepted, "paused": st.paused,
                                          "tokens_per_step": round(st.tokens_per_step, 3)}


def verify_costs(model, devs, rows=(2, 4, 8), repeats: int = 7) -> dict:
    """Median seconds of a verification step of T rows (all logits) over a decode step's, after 64 tokens."""
    s = Session(model, devs, n_ctx=128, n_batch=64)
    s.eval(list(range(10, 74)))
    base = s.n_past

    def median(t: int) -> float:
        times = []
        for _ in range(repeats + 1):
            s.rewind(base)
            t0 = time.perf_counter()
            s.eval(list(range(100, 100 + t)), all_logits=True, prompt=False)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])
    one = median(1)
    return {"decode_ms": round(one * 1000, 2), **{f"verify_{t}": round(median(t) / one, 3) for t in rows}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3", help="packaged names or GGUF files (default: "
                    "smollm2,gemma3)")
    ap.add_argument("--backends", action="append", help="a device list, repeatable (default: cpu)")
    ap.add_argument("--draft", default="ngram:3", help="the draft spec (default: ngram:3)")
    ap.add_argument("--draft-n", type=int, default=4, help="tokens drafted a round (default: 4)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per prompt (default: 128)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each engine per prompt (default: 3)")
    ap.add_argument("--sets", default=",".join(SETS), help=f"prompt sets (default: {','.join(SETS)})")
    ap.add_argument("--out", help="write every figure as JSON here (default: none)")
    args = ap.parse_args()
    registry = default_registry()
    results = []
    for name in args.models.split(","):
        model = Model(model_path(name))
        for spec in args.backends or ["cpu"]:
            devs = registry.select(spec)
            log(f"== {name} on {spec}: verification cost {verify_costs(model, devs)}")
            for set_name in args.sets.split(","):
                ratios = []
                for p in prompt_set(set_name):
                    ids = model.tokenizer.encode(p["prompt"])
                    want, _ = alone(model, devs, ids, args.tokens)             # warm-up, and the reference
                    with_ngram(model, devs, ids, args.tokens, args.draft, args.draft_n)
                    base, fast, info = [], [], {}
                    for _ in range(args.repeats):                              # taking turns
                        base.append(alone(model, devs, ids, args.tokens)[1])
                        got, speed, info = with_ngram(model, devs, ids, args.tokens, args.draft, args.draft_n)
                        if got != want:
                            raise SystemExit(f"{name} {spec} {p['name']}: greedy text with {args.draft} differs "
                                             f"from the target's own")
                        fast.append(speed)
                    row = {"model": name, "backends": spec, "set": set_name, "prompt": p["name"],
                           "alone_tok_s": round(statistics.median(base), 2),
                           "ngram_tok_s": round(statistics.median(fast), 2), **info}
                    row["ratio"] = round(row["ngram_tok_s"] / row["alone_tok_s"], 3)
                    ratios.append(row["ratio"])
                    results.append(row)
                    log(json.dumps(row))
                log(f"{name} {spec} {set_name}: median ratio {statistics.median(ratios):.2f}x "
                    f"(min {min(ratios):.2f}x, max {max(ratios):.2f}x) over {len(ratios)} prompts")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
