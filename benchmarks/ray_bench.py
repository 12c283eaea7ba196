"""Prefill and decode speed, and network bytes per token: one process, one Ray node, two Ray nodes, in one run.

Without --ray-address it starts a cluster of two nodes on loopback on this machine
(``ray.cluster_utils.Cluster``, resources ``framework:n1`` and ``framework:n2``) and shuts it down at the end.
The two-node run splits the model pipeline-wise: n1 keeps the input and the first half of the layers (the
smallest --device-memory cap that does), n2 the rest. Medians over --repeats; bytes per token are what the
remote devices counted (Device.run_figures: step inputs sent, results read back, activations node to node).

    .venv/bin/python benchmarks/ray_bench.py                       # the tiny llama model (tests/tiny_models.py)
    .venv/bin/python benchmarks/ray_bench.py --model smollm2 --prompt-tokens 64 --decode-tokens 16

Every device computes on one thread (OMP_NUM_THREADS=1 and its kin, set here and inherited by the local
cluster's workers). On one machine the nodes share its cores: the figures show the cost of the hops, not a
speed-up (a pipeline of whole layers runs its nodes one after another; docs/distributed.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")     # a local cluster on loopback only
# one thread per device everywhere: Ray runs a node's workers on its CPUs (num_cpus=1 here), and a process whose
# BLAS spins two threads on cores the nodes also use would be measured against an unequal footing
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
ROOT = Path(__file__).resolve().parent.parent


def model_path(name: str, work: Path) -> Path:
    if name == "tiny":
        sys.path.insert(0, str(ROOT / "tests"))
        import tiny_models
        return tiny_models.write("llama", work / "tiny-llama.gguf")
    from framework.model.default import resolve_model as packaged
    return packaged(name)


def split_session(Session, model, devices, **kw):
    """n1 capped to keep the input and the first half of the layers (bisection on the memory fit)."""
    want = 1 + model.hp.n_layer // 2
    lo, hi = 1, 1 << 34
    while lo < hi:
        mid = (lo + hi) // 2
        kept = Session(model, devices, memory_caps={devices[0].name: mid}, **kw).fit.kept().get(devices[0].name, [])
        lo, hi = (lo, mid) if len([p for p in kept if p != "output"]) >= want else (mid + 1, hi)
    return Session(model, devices, memory_caps={devices[0].name: lo}, **kw)


def network(devices) -> int:
    return sum(d.run_figures().get("network_bytes", 0) for d in devices)


def measure(session, prompt: list[int], n_decode: int, repeats: int) -> dict:
    pre, dec, pre_bytes, dec_bytes = [], [], [], []
    session.eval(prompt[:2])            # weights loaded and programs compiled before the clock starts
    for _ in range(repeats):
        session.reset()
        b0 = network(session.devices)
        t0 = time.perf_counter()
        logits = session.eval(prompt)
        t1 = time.perf_counter()
        b1 = network(session.devices)
        for _ in range(n_decode):
            logits = session.eval([int(logits.argmax())])
        t2 = time.perf_counter()
        b2 = network(session.devices)
        pre.append(len(prompt) / (t1 - t0))
        dec.append(n_decode / (t2 - t1))
        pre_bytes.append((b1 - b0) / len(prompt))
        dec_bytes.append((b2 - b1) / n_decode)
    return {"prefill_tok_s": statistics.median(pre), "decode_tok_s": statistics.median(dec),
            "prefill_net_bytes_per_token": statistics.median(pre_bytes),
            "decode_net_bytes_per_token": statistics.median(dec_bytes)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="'tiny' (tests/tiny_models.py's llama), or a packaged model name")
    ap.add_argument("--ray-address", help="an existing cluster with nodes framework:n1 and framework:n2")
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--decode-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", help="write the figures as JSON")
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    cluster = None
    if args.ray_address:
        os.environ["RAY_ADDRESS"] = args.ray_address
    else:
        node = {"num_cpus": 1, "object_store_memory": 80 << 20, "include_dashboard": False}
        cluster = Cluster(initialize_head=True, head_node_args={**node, "resources": {"framework:n1": 1}})
        cluster.add_node(**{**node, "resources": {"framework:n2": 1}})
        os.environ["RAY_ADDRESS"] = cluster.address
    os.environ.setdefault("FRAMEWORK_RAY_PLUGINS", "cpu")
    os.environ.setdefault("FRAMEWORK_BLOCK_PLUGINS", "opencl,openvino,vulkan,xdna,example")
    try:
        from framework.registry import default_registry
        from framework.model.model import Model
        from framework.runtime.session import Session
        with tempfile.TemporaryDirectory() as work:
            model = Model(model_path(args.model, Path(work)))
            registry = default_registry()
            text = "The capital of France is Paris, and the capital of Italy is Rome. " * 64
            prompt = model.tokenizer.encode(text)[:args.prompt_tokens]
            kw = {"n_ctx": args.prompt_tokens + args.decode_tokens + 8, "n_batch": args.prompt_tokens}
            runs = {
                "one process (cpu)": Session(model, registry.select("cpu"), **kw),
                "one node (ray:n1/cpu)": Session(model, registry.select("ray:n1/cpu"), **kw),
                "two nodes (ray:n1/cpu, ray:n2/cpu)": split_session(Session, model,
                                                                    registry.select("ray:n1/cpu,ray:n2/cpu"), **kw),
            }
            results = {}
            for name, session in runs.items():
                results[name] = measure(session, prompt, args.decode_tokens, args.repeats)
                r = results[name]
                print(f"{name:38s} prefill {r['prefill_tok_s']:8.1f} tok/s  decode {r['decode_tok_s']:7.1f} tok/s  "
                      f"network {r['prefill_net_bytes_per_token']:9.0f} B/token prefill, "
                      f"{r['decode_net_bytes_per_token']:9.0f} B/token decode", flush=True)
            base = results["one process (cpu)"]
            for name, r in results.items():
                print(f"{name:38s} x{r['prefill_tok_s'] / base['prefill_tok_s']:.2f} prefill, "
                      f"x{r['decode_tok_s'] / base['decode_tok_s']:.2f} decode (of one process)")
            record = {"model": args.model, "n_layer": model.hp.n_layer, "n_embd": model.hp.n_embd,
                      "n_vocab": model.hp.n_vocab, "prompt_tokens": len(prompt), "decode_tokens": args.decode_tokens,
                      "repeats": args.repeats, "results": results}
            if args.out:
                Path(args.out).write_text(json.dumps(record, indent=2))
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
