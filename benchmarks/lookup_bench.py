"""Drafts (prompt lookup, --draft ngram[:N], or a draft model file) against the target alone, on two prompt
sets kept in the repository: code edits (benchmarks/prompts/code_edits.jsonl: a source file and an
instruction, the answer copying most of it) and free text (benchmarks/prompts/free_text.jsonl: questions,
stories).

    python benchmarks/lookup_bench.py [--models smollm2,gemma3] [--backends cpu] [--backends openvino:CPU]
    python benchmarks/lookup_bench.py --models ~/.cache/framework/models/qwen25-coder-1.5b.gguf \
        --draft ngram:3 --draft ~/.cache/framework/models/qwen25-coder-0.5b.gguf --tokens 64 --prompts 3 \
        --repeats 3 --threads 1

First, on each device list, the cost of verifying 2, 4 and 8 rows (a step with the logits of every row)
against one decode step: what a round costs when its drafts are refused; and a draft model's own decode
step against the target's. Then for every model, device list and prompt, greedy, --tokens tokens: the
target alone and with each --draft (adaptive drafting on; a model draft with --draft-p-min), taking turns
--repeats times after a warm-up of each; decode tok/s (medians; every engine by one wall clock from its
first token to its last, the loop between steps included), drafted and accepted tokens, tokens per
target step, the share of the decode time spent drafting, and the ratio to the target alone, per prompt set
(the median of its prompts). A draft model's prefill of the prompt is not decode time (it is printed).
Greedy output with every draft is checked to be the target's own, token for token.
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

from framework.model.default import resolve_model  # noqa: E402
from framework.model.model import Model  # noqa: E402
from framework.registry import default_registry  # noqa: E402
from framework.runtime.generate import generate  # noqa: E402
from framework.runtime.lookup import is_lookup  # noqa: E402
from framework.runtime.sampling import Sampler, SamplingParams  # noqa: E402
from framework.runtime.session import Session  # noqa: E402
from framework.runtime.speculative import SpeculativeDecoder, make_draft  # noqa: E402

SETS = ("code_edits", "free_text")
GREEDY = SamplingParams()
P_MIN = 0.75                # `framework run`'s default --draft-p-min (llama.cpp's)


def log(*a) -> None:
    print(*a, flush=True)


def prompt_set(name: str, limit: int | None) -> list[dict]:
    lines = (ROOT / "benchmarks" / "prompts" / f"{name}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()][:limit]


def load(name: str) -> Model:
    return Model(resolve_model(str(Path(name).expanduser()) if not is_lookup(name) else name))


def alone(model, devs, ids, n) -> tuple[list[int], float]:
    s = Session(model, devs, n_ctx=len(ids) + n + 8)
    s.reserve(len(ids), n)
    for plan, _ in s.plans.values():       # weights and programs before the clock, as with_draft's prepare
        s.executor.prepare(plan)
    return timed(generate(s, ids, n, Sampler(GREEDY)))


def timed(pieces) -> tuple[list[int], float]:
    """The tokens of a generation, and its tokens a second after the first token by one wall clock for every
    engine: the target alone and each draft are timed alike, the loop's own work between steps included."""
    tokens, first = [], None
    for p in pieces:
        tokens.append(p.token)
        if first is None:
            first = time.perf_counter()
    seconds = time.perf_counter() - first if first is not None else 0.0
    return tokens, (len(tokens) - 1) / seconds if seconds else 0.0


def with_draft(model, devs, ids, n, spec: str, drafter: Model | None, n_draft: int, p_min: float,
               inexact: bool = False) -> tuple[list[int], float, dict]:
    s = Session(model, devs, n_ctx=len(ids) + n + 8)
    draft = make_draft(spec, s, devs, load=lambda _path: drafter)
    d = SpeculativeDecoder(s, draft, n_draft, baseline=0, p_min=0.0 if drafter is None else p_min, inexact=inexact)
    d.reserve(len(ids), n)
    d.prepare()
    tokens, speed = timed(d.generate(ids, n, Sampler(GREEDY)))
    st = d.stats
    info = {"drafted": st.drafted, "accepted": st.accepted, "paused": st.paused, "rounds": st.rounds,
            "tokens_per_step": round(st.tokens_per_step, 3),
            "draft_share": round(st.draft_seconds / st.seconds, 3) if st.seconds else 0.0,
            "target_ms_a_round": round(1000 * (st.seconds - st.draft_seconds) / st.rounds, 1) if st.rounds else 0.0}
    if draft.session is not None:
        info["draft_prefill_s"] = round(draft.session.prefill.seconds, 2)
    return tokens, speed, info


def step_costs(model, devs, rows=(2, 4, 8), repeats: int = 7) -> dict:
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
    out = {"decode_ms": round(one * 1000, 2), **{f"verify_{t}": round(median(t) / one, 3) for t in rows}}
    if s.argmax_on_device and rows:
        out.update(greedy_step_costs(s, base, rows, repeats))
    return out


def greedy_step_costs(s: Session, base: int, rows, repeats: int) -> dict:
    """Where the session takes its argmax on the device, what a greedy speculative round's steps cost: a
    verification step of T rows that reads each row's ARGMAX (verify_T_argmax), over a greedy decode step
    (one index read back, decode_argmax_ms) and over one token of greedy decoding queued ahead as a run without
    a draft decodes (decode_queued_ms: runtime/greedy.py; the same as decode_argmax_ms where it cannot queue)."""
    from framework.runtime.greedy import greedy_tokens

    def median(t: int) -> float:
        times = []
        for _ in range(repeats + 1):
            s.rewind(base)
            t0 = time.perf_counter()
            s.step(list(range(100, 100 + t)), True, False, greedy=True)
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    def queued() -> float:
        times = []
        for _ in range(repeats + 1):
            s.rewind(base)
            tokens = greedy_tokens(s, [100], 17)
            next(tokens)                            # the first step, not timed
            t0 = time.perf_counter()
            for _ in tokens:
                pass
            times.append((time.perf_counter() - t0) / 16)
        return statistics.median(times[1:])
    one, q = median(1), queued()
    each = {t: median(t) for t in rows}
    return {"decode_argmax_ms": round(one * 1000, 2), "decode_queued_ms": round(q * 1000, 2),
            **{f"verify_{t}_argmax": round(each[t] / one, 3) for t in rows},
            **{f"verify_{t}_argmax_over_queued": round(each[t] / q, 3) for t in rows}}


def short(spec: str) -> str:
    return spec if is_lookup(spec) else Path(spec).name.removesuffix(".gguf")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3", help="packaged names or GGUF files (default: "
                    "smollm2,gemma3)")
    ap.add_argument("--backends", action="append", help="a device list, repeatable (default: cpu)")
    ap.add_argument("--draft", action="append", help="a draft: ngram[:N] or a draft model's GGUF file, repeatable: "
                    "each one taking turns with the target alone (default: ngram:3)")
    ap.add_argument("--draft-n", type=int, default=4, help="the most tokens drafted a round (default: 4)")
    ap.add_argument("--draft-p-min", type=float, default=P_MIN, help=f"a model draft stops at the first token it "
                    f"puts below this (default: {P_MIN}, as `framework run`)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per prompt (default: 128)")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of each engine per prompt (default: 3)")
    ap.add_argument("--sets", default=",".join(SETS), help=f"prompt sets (default: {','.join(SETS)})")
    ap.add_argument("--prompts", type=int, help="the first N prompts of each set; 0: the step costs alone "
                    "(default: all)")
    ap.add_argument("--threads", type=int, help="the cpu plugin's threads (default: numba's own)")
    ap.add_argument("--draft-inexact", action="store_true", help="verify on devices that do not declare a several-"
                    "row step equal to one-row steps (openvino:CPU): as `framework run --draft-inexact`; a text "
                    "that then differs from the target's own is reported (its first differing token), not refused")
    ap.add_argument("--out", help="write every figure as JSON here (default: none)")
    args = ap.parse_args()
    if args.threads:
        import numba
        numba.set_num_threads(args.threads)
    registry = default_registry()
    specs = [s if is_lookup(s) else str(resolve_model(str(Path(s).expanduser()))) for s in args.draft or ["ngram:3"]]
    drafters = {spec: None if is_lookup(spec) else load(spec) for spec in specs}
    results = []
    for name in args.models.split(","):
        model = load(name)
        for backends in args.backends or ["cpu"]:
            devs = registry.select(backends)
            log(f"== {short(name)} on {backends}: verification cost {step_costs(model, devs)}")
            for spec, drafter in drafters.items():
                if drafter is not None:
                    own = step_costs(drafter, devs, rows=())
                    log(f"== draft {short(spec)} on {backends}: decode step {own['decode_ms']} ms")
            for set_name in args.sets.split(",") if args.prompts != 0 else []:
                run_set(args, model, name, backends, devs, drafters, set_name, results)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


def run_set(args, model, name, backends, devs, drafters, set_name, results) -> None:
    ratios: dict[str, list[float]] = {spec: [] for spec in drafters}
    for p in prompt_set(set_name, args.prompts):
        ids = model.tokenizer.encode(p["prompt"])
        want, _ = alone(model, devs, ids, args.tokens)                 # warm-up, and the reference
        for spec, drafter in drafters.items():
            with_draft(model, devs, ids, args.tokens, spec, drafter, args.draft_n, args.draft_p_min,
                       args.draft_inexact)
        base, fast, info, differs = [], {spec: [] for spec in drafters}, {}, {}
        for _ in range(args.repeats):                                  # taking turns
            base.append(alone(model, devs, ids, args.tokens)[1])
            for spec, drafter in drafters.items():
                got, speed, info[spec] = with_draft(model, devs, ids, args.tokens, spec, drafter, args.draft_n,
                                                    args.draft_p_min, args.draft_inexact)
                if got != want and not args.draft_inexact:
                    raise SystemExit(f"{name} {backends} {p['name']}: greedy text with --draft {spec} differs from "
                                     f"the target's own")
                if got != want:        # allowed by --draft-inexact: where, reported with the figures
                    differs[spec] = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                                         min(len(got), len(want)))
                fast[spec].append(speed)
        alone_tok_s = round(statistics.median(base), 2)
        for spec in drafters:
            row = {"model": short(name), "backends": backends, "set": set_name, "prompt": p["name"],
                   "draft": short(spec), "alone_tok_s": alone_tok_s,
                   "draft_tok_s": round(statistics.median(fast[spec]), 2), **info[spec]}
            row["ratio"] = round(row["draft_tok_s"] / alone_tok_s, 3)
            if args.draft_inexact:
                row["same_text"] = spec not in differs
                if spec in differs:
                    row["first_different_token"] = differs[spec]
            ratios[spec].append(row["ratio"])
            results.append(row)
            log(json.dumps(row))
    for spec, r in ratios.items():
        log(f"{short(name)} {backends} {set_name} --draft {short(spec)}: median ratio {statistics.median(r):.2f}x "
            f"(min {min(r):.2f}x, max {max(r):.2f}x) over {len(r)} prompts")


if __name__ == "__main__":
    main()
