"""Self-speculative decoding (--draft layers:K --draft-n N) on both models: acceptance, speed-up, a sweep of
K and N, and where it does not pay.

    python benchmarks/speculative_bench.py                                # cpu and openvino:CPU, real weights
    python benchmarks/speculative_bench.py --backends vulkan:0,cpu --random-weights \\
        --acceptance benchmarks/speculative_acceptance.json               # a GPU without the model files

Three parts, per model:

1. Acceptance (real weights, greedy; it depends on the weights, not on the device): the target's greedy
   continuation of each prompt, then for every K the draft's (first K layers and the head) argmax at every
   position given the target's tokens before it, in one teacher-forced pass. A draft of N tokens after
   position i is accepted up to its first mismatch, so rounds of speculative decoding are replayed exactly
   from these matches: tokens per target step tau(K, N) and the acceptance rate, for every N. Written to
   --acceptance-out (benchmarks/speculative_acceptance.json is this script's output on this machine).
2. Step costs on each --backends list: a decode step of the target, a decode step of each K-layer draft,
   and a T-token verification step (logits of every row) for T = 2 .. N_max + 1: medians of --repeats runs
   after a warm-up. The speed-up a (K, N) can give is then tau * t_decode / (N * t_draft(K) + t_verify(N+1)).
3. Measured (real weights only): the best (K, N) per device, end to end through `framework run`'s decoder
   on every prompt, --repeats times: acceptance, tokens per target step, decode tok/s with speculation and
   of the target alone (timed in the same run); medians.

With --random-weights (a machine the model files cannot reach: the H200, see benchmarks/speculative_h200.sh)
the models are built from benchmarks/vulkan_models.json (the real shapes and tensor types, random values),
part 1 is read from --acceptance instead, and part 3 is skipped (random weights accept nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from framework.runtime.sampling import Sampler, SamplingParams  # noqa: E402
from framework.runtime.session import Session  # noqa: E402
from framework.runtime.speculative import SpeculativeDecoder, make_draft  # noqa: E402

SWEEP_K = {"smollm2": (4, 8, 12, 16, 20, 24, 28), "gemma3": (2, 4, 6, 9, 12, 15, 17)}
SWEEP_N = (1, 2, 3, 4)


def log(*a):
    print(*a, flush=True)


def devices(spec: str):
    """A --backends list; without an installed distribution (the H200's PYTHONPATH run) the plugins are
    made directly."""
    try:
        from framework.registry import default_registry
        reg = default_registry()
        if reg.devices():
            return reg.select(spec)
    except ImportError:
        pass
    made = {}
    for name in spec.split(","):
        if name == "cpu":
            from framework.plugins.cpu.device import CpuDevice
            made[name] = CpuDevice()
        elif name.startswith("vulkan:"):
            from framework.plugins.vulkan.device import devices as vk
            made[name] = vk()[int(name.split(":")[1])]
        else:
            raise SystemExit(f"{name}: only cpu and vulkan:N without an installed framework")
    return list(made.values())


def load_models(names: list[str], random_weights: bool):
    from framework.model.model import Model
    if not random_weights:
        from framework.model.default import model_path
        return {n: Model(model_path(n)) for n in names}
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from vulkan_bench import write_model
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    work = Path("/tmp/speculative_bench")
    work.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    return {n: Model(write_model(n, specs[n], work / f"{n}-random.gguf", rng)) for n in names}


def prompts(name: str, count: int, model, random_weights: bool) -> list[list[int]]:
    if random_weights:
        rng = np.random.default_rng(1)
        return [[int(t) for t in rng.integers(0, model.hp.n_vocab, size=8)] for _ in range(count)]
    ref = json.loads((ROOT / "tests" / "reference" / f"{name}.json").read_text(encoding="utf-8"))
    return [p["ids"] for p in ref["prompts"][:count]]


# -- 1. acceptance -------------------------------------------------------------------------------------------

def rounds(matches: list[bool], n_draft: int, n_tokens: int) -> tuple[int, int, int]:
    """Replay greedy speculative rounds: matches[i] says whether the draft's token at generated position i
    (given the target's tokens before it) is the target's. Returns (rounds, drafted, accepted) over n_tokens
    tokens after the first (the prefill's)."""
    i, n_rounds, drafted, accepted = 1, 0, 0, 0
    while i < n_tokens:
        n = min(n_draft, n_tokens - i - 1)
        a = 0
        while a < n and matches[i + a]:
            a += 1
        n_rounds, drafted, accepted = n_rounds + 1, drafted + n, accepted + a
        i += a + 1
    return n_rounds, drafted, accepted


def acceptance(model, devs, ids_list, n_tokens: int, sweep_k) -> dict:
    target = Session(model, devs, n_ctx=256)
    out = {}
    conts = []
    for ids in ids_list:                     # the target's own greedy continuation
        target.reset()
        toks = [int(np.argmax(target.eval(ids)))]
        for _ in range(n_tokens - 1):
            toks.append(int(np.argmax(target.eval([toks[-1]]))))
        conts.append(toks)
    for k in sweep_k:
        draft = Session(model, devs, n_ctx=256, n_layers=k, draft_of=target)
        per_n = {n: [0, 0, 0] for n in SWEEP_N}
        for ids, toks in zip(ids_list, conts):
            draft.reset()
            rows = draft.eval(ids + toks[:-1], all_logits=True)[len(ids) - 1:]
            matches = [int(np.argmax(r)) == t for r, t in zip(rows, toks)]
            for n in SWEEP_N:
                r, d, a = rounds(matches, n, n_tokens)
                per_n[n] = [per_n[n][0] + r, per_n[n][1] + d, per_n[n][2] + a]
        out[str(k)] = {str(n): {"rounds": r, "drafted": d, "accepted": a, "acceptance": a / d if d else 0.0,
                                "tokens_per_step": len(ids_list) * (n_tokens - 1) / r}
                       for n, (r, d, a) in per_n.items()}
        log(f"  K={k:>2}: " + "  ".join(f"N={n} acc {v['acceptance']:.2f} tau {v['tokens_per_step']:.2f}"
                                       for n, v in ((int(n), v) for n, v in out[str(k)].items())))
    return out


# -- 2. step costs ------------------------------------------------------------------------------------------

def median_time(fn, repeats: int) -> float:
    fn()                                    # warm-up: loads, compiles
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def step_costs(model, devs, ids, sweep_k, n_max: int, repeats: int) -> dict:
    target = Session(model, devs, n_ctx=256)
    target.eval(ids)
    base = target.n_past

    def at(session, tokens, all_logits=False):
        def fn():
            session.n_past = base
            session.eval(tokens, all_logits=all_logits)
        return fn
    costs = {"decode": median_time(at(target, [1]), repeats),
             "verify": {str(t): median_time(at(target, [1] * t, True), repeats) for t in range(2, n_max + 2)},
             "draft": {}}
    for k in sweep_k:
        draft = Session(model, devs, n_layers=k, share_kv_with=target)
        costs["draft"][str(k)] = median_time(at(draft, [1]), repeats)
    return costs


def predicted(acc: dict, costs: dict) -> list[dict]:
    rows = []
    for k, per_n in acc.items():
        if k not in costs["draft"]:
            continue
        for n, a in per_n.items():
            if str(int(n) + 1) not in costs["verify"]:
                continue
            step = int(n) * costs["draft"][k] + costs["verify"][str(int(n) + 1)]
            rows.append({"K": int(k), "N": int(n), "acceptance": a["acceptance"], "tau": a["tokens_per_step"],
                         "speedup": a["tokens_per_step"] * costs["decode"] / step})
    return sorted(rows, key=lambda r: -r["speedup"])


# -- 3. measured ------------------------------------------------------------------------------------------------

def measured(model, devs, ids_list, k: int, n: int, n_tokens: int, repeats: int) -> dict:
    from framework.runtime.speculative import SpecStats
    target = Session(model, devs, n_ctx=256)
    dec = SpeculativeDecoder(target, make_draft(f"layers:{k}", target, devs), n)
    runs = []
    for rep in range(repeats + 1):          # the first round of prompts warms up (loads, compiles)
        for ids in ids_list:
            target.reset()
            dec.stats = SpecStats()
            dec.reserve(len(ids), n_tokens)
            dec.prepare()
            list(dec.generate(ids, n_tokens, Sampler(SamplingParams())))
            if rep:
                runs.append(dec.stats)
    med = statistics.median
    return {"K": k, "N": n, "runs": len(runs), "acceptance": med(s.acceptance for s in runs),
            "tokens_per_step": med(s.tokens_per_step for s in runs),
            "tok_s": med(s.tokens_per_second for s in runs),
            "target_alone_tok_s": med(s.baseline_tokens_per_second for s in runs),
            "speedup": med(s.speedup for s in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--backends", action="append", help="a device list, repeatable (default: cpu and "
                    "openvino:CPU,cpu)")
    ap.add_argument("--prompts", type=int, default=3, help="reference prompts per model")
    ap.add_argument("--tokens", type=int, default=32, help="tokens generated per prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--acceptance", help="read part 1 from this JSON instead of measuring it")
    ap.add_argument("--acceptance-out", default=str(ROOT / "benchmarks" / "speculative_acceptance.json"),
                    help="where part 1 is written (and read from when it holds the model, unless --remeasure)")
    ap.add_argument("--remeasure", action="store_true", help="measure part 1 even when the file has it")
    ap.add_argument("--out", help="write every figure as JSON here")
    args = ap.parse_args()
    backends = args.backends or ["cpu", "openvino:CPU,cpu"]
    names = args.models.split(",")
    if args.random_weights and not args.acceptance:
        raise SystemExit("--random-weights needs --acceptance FILE (acceptance is a property of the real weights)")
    models = load_models(names, args.random_weights)
    result: dict = {"backends": backends, "tokens": args.tokens, "prompts": args.prompts, "models": {}}
    acc_file = Path(args.acceptance or args.acceptance_out)
    acc_all = json.loads(acc_file.read_text()) if acc_file.is_file() and not args.remeasure else {}
    for name in names:
        model = models[name]
        ids_list = prompts(name, args.prompts, model, args.random_weights)
        sweep_k = [k for k in SWEEP_K.get(name, ()) if k < model.hp.n_layer]
        if name in acc_all:
            sweep_k = [int(k) for k in acc_all[name]]
        res = result["models"][name] = {"n_layer": model.hp.n_layer}
        if name not in acc_all:
            log(f"{name}: acceptance of layers:K drafts, greedy, {len(ids_list)} prompts x {args.tokens} tokens")
            acc_all[name] = acceptance(model, devices("cpu"), ids_list, args.tokens, sweep_k)
            Path(args.acceptance_out).write_text(json.dumps(acc_all, indent=1) + "\n")
            log(f"  written to {args.acceptance_out}")
        res["acceptance"] = acc_all[name]
        for spec in backends:
            devs = devices(spec)
            log(f"{name} on {spec}: step costs (medians of {args.repeats})")
            costs = step_costs(model, devs, ids_list[0], sweep_k, max(SWEEP_N), args.repeats)
            log(f"  decode {costs['decode'] * 1e3:.1f} ms; verify " + ", ".join(
                f"T={t} {v * 1e3:.1f}" for t, v in costs["verify"].items()) + " ms; draft " + ", ".join(
                f"K={k} {v * 1e3:.1f}" for k, v in costs["draft"].items()) + " ms")
            table = predicted(acc_all[name], costs)
            for r in table[:5]:
                log(f"  K={r['K']:>2} N={r['N']}: acceptance {r['acceptance']:.2f}, {r['tau']:.2f} tokens per target "
                    f"step, predicted x{r['speedup']:.2f}")
            entry = {"costs": costs, "predicted": table}
            if not args.random_weights and table:
                best = table[0]
                m = measured(model, devs, ids_list, best["K"], best["N"], args.tokens, args.repeats)
                entry["measured"] = m
                verdict = "pays" if m["speedup"] > 1 else "does NOT pay"
                log(f"  measured K={m['K']} N={m['N']} ({m['runs']} runs): acceptance {m['acceptance']:.2f}, "
                    f"{m['tokens_per_step']:.2f} tokens per target step, {m['tok_s']:.2f} tok/s against "
                    f"{m['target_alone_tok_s']:.2f} for the target alone: x{m['speedup']:.2f}, speculation {verdict}")
            res[spec] = entry
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        log(f"figures written to {args.out}")


if __name__ == "__main__":
    main()
