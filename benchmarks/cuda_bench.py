"""The CUDA plugin on a real GPU, next to the Vulkan and OpenCL plugins on the same GPU
(benchmarks/cuda_h100.sh runs it on the lent machine). Prints, in one run, in this order:

* the devices of the three plugins, their physical ids (one chip: one id), cuda:0's data;
* the op conformance cases on cuda:0 against the CPU plugin (ggml's NMSE thresholds);
* per model shape (SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M, Qwen2.5-Coder 1.5B Q4_K_M; random weights of
  the real tensor types, GGUF files written here from benchmarks/vulkan_models.json): cuda:0's logits
  against the CPU plugin (a prefill and decode steps: NMSE, correlation, argmax agreement; the bound
  is NMSE_BOUND), then prefill of --prompt tokens and decode of --decode tokens, tok/s (medians of
  timed runs after warm-up) on cuda:0 with CUDA graphs, on cuda:0 without them (FRAMEWORK_CUDA_GRAPHS=0),
  on vulkan:0 and on opencl:0, and cuda:0's kernels a decode step;
* the brief's case on one chip: a target's KV cache on vulkan:0 and a draft made of its first layers on
  cuda:0 must be refused at reservation naming the one physical device; placed with the target, the
  draft runs.

The JSON (--out) is written after each part, so a run stopped at its limit keeps what it measured.
--stand-in NAME (a dry run where there is no CUDA GPU) measures that device in cuda:0's place: its
figures are not CUDA figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import opencl_bench as ob
import vulkan_bench as vb

T0 = time.perf_counter()
NMSE_BOUND = 5e-4          # ggml's bound for matrix products (test-backend-ops), on the logits
DRAFT_LAYERS = 2


def log(*a):
    print(f"[{time.perf_counter() - T0:4.0f} s]", *a, flush=True)


def guarded(what: str, fn, *args, **kwargs):
    """fn's result, or None with the error logged: one failing part must not cost the others' figures."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        log(f"{what} FAILED: {type(e).__name__}: {str(e)[:2000]}")
        return None


def find_devices(stand_in: str | None) -> dict:
    """cuda:0 (or the stand-in), vulkan:0 and opencl:0 where their plugins find them, each listed."""
    from framework.plugins.cuda.device import devices as cuda_devices
    from framework.plugins.opencl.device import devices as opencl_devices
    from framework.plugins.vulkan.device import devices as vulkan_devices
    found = {}
    for key, make in (("cuda", cuda_devices), ("vulkan", vulkan_devices), ("opencl", opencl_devices)):
        devs = guarded(f"{key} discovery", make) or []
        for d in devs:
            log(f"  {d.describe()}  physical id {getattr(d, 'physical_id', None)}")
        if devs and devs[0].available:
            found[key] = devs[0]
    if stand_in:
        found["cuda"] = found[stand_in.split(":")[0]]
        log(f"DRY RUN: {stand_in} stands in for cuda:0; no figure below is a CUDA figure")
    if "cuda" not in found:
        raise SystemExit("cuda:0 is unavailable (its reason is above)")
    if not stand_in:       # cuda:0 again, its programs launched kernel by kernel (the setting is read at creation)
        from framework.plugins.cuda.device import CudaDevice
        from framework.plugins.cuda.options import GRAPHS_ENV, X8_ENV
        found["cuda_no_graphs"] = with_env(GRAPHS_ENV, "0", CudaDevice, 0, found["cuda"].data)
        found["cuda_x8_off"] = with_env(X8_ENV, "off", CudaDevice, 0, found["cuda"].data)   # f32 x everywhere
    return found


def speed(dev, model, n_prompt: int, n_decode: int, rng, runs: int) -> dict:
    """opencl_bench's prefill and decode tok/s (medians of timed runs after a warm-up that loads the
    weights and compiles, and captures, the programs), with the kernels a decode step makes."""
    from framework.runtime.session import Session
    out = ob.model_speed(dev, None, model, n_prompt, n_decode, rng, runs, bounds=False)
    s = Session(model, [dev], n_ctx=1024, n_batch=n_prompt)
    s.eval([1, 2])
    s.eval([3])
    out["kernels_per_decode_step"] = sum(len(p.steps) for p in vb._programs(s, 1))
    out["report"] = dev.report_line() if hasattr(dev, "report_line") else ""
    return out


def within_bound(c: dict) -> bool:
    return c["nmse_vs_cpu"] <= NMSE_BOUND and c["nmse_decode_vs_cpu"] <= NMSE_BOUND


def rounding_class(c: dict, devs: dict, model) -> None:
    """Where cuda:0's check is over the bound, the same check twice more: cuda:0 with f32 x everywhere
    (FRAMEWORK_CUDA_X8=off: the kernels' own exactness, against the bound), and the CPU plugin's 8-bit
    activations against its f32 path (how far rounding x to 8 bits alone moves this file's logits: the
    random-weight Gemma 3 amplifies any rounding, docs/cuda.md)."""
    from framework.plugins.cpu.device import CpuDevice
    if c["within_bound"] or "cuda_x8_off" not in devs:
        return
    off = c["x8_off"] = guarded("the check with f32 x", vb.check_models_against_cpu, devs["cuda_x8_off"], model)
    if off:
        off["within_bound"] = within_bound(off)
    c["cpu_q8_vs_cpu_f32"] = guarded("the CPU plugin's 8-bit activations", vb.check_models_against_cpu,
                                     CpuDevice("q8"), model)


def rounding_only(args, work: Path, rng) -> None:
    """The CPU plugin's 8-bit activations against its f32 path on the files the check reads (written as it
    writes them): how far rounding x alone moves each file's logits."""
    from framework.model.model import Model
    from framework.plugins.cpu.device import CpuDevice
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    for name in args.models.split(","):
        path = work / f"{name}-random.gguf"
        if not (args.keep_models and path.exists()):
            vb.write_model(name, specs[name], path, rng)
        c = vb.check_models_against_cpu(CpuDevice("q8"), Model(path))
        log(f"{name}: the cpu plugin's 8-bit activations vs its f32 path on random weights: {c}")


def with_env(name: str, value: str, fn, *a):
    """fn(*a) with the variable set to value (unset: '')."""
    os.environ[name] = value
    try:
        return fn(*a)
    finally:
        os.environ.pop(name, None)


def models_section(args, result, devs, rng, work: Path, save) -> None:
    from framework.model.model import Model
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    result["models"] = {}
    cuda = devs["cuda"]
    for name in args.models.split(","):
        path = work / f"{name}-random.gguf"
        if not (args.keep_models and path.exists()):
            vb.write_model(name, specs[name], path, rng)
        model = Model(path)
        entry = result["models"][name] = {"arch": model.hp.arch}
        if not args.skip_check:
            c = entry["check"] = guarded(f"{name} check", vb.check_models_against_cpu, cuda, model)
            if c:
                c["within_bound"] = within_bound(c)
                rounding_class(c, devs, model)
            log(f"{name}: cuda:0 vs the cpu plugin on random weights (bound NMSE {NMSE_BOUND}): {c}")
            p = entry["check_prefill"] = guarded(f"{name} prefill check", vb.check_prefill_against_cpu, cuda, model,
                                                 [""])
            log(f"{name}: a 64-token prefill on cuda:0 (the tiled products) vs the cpu plugin: {p}")
            save()
        for key, label in (("cuda", "cuda:0"), ("cuda_no_graphs", "cuda:0 without graphs"), ("vulkan", "vulkan:0"),
                           ("opencl", "opencl:0")):
            dev = devs.get(key)
            wanted = key in args.devices.split(",") and (key == "cuda" or name not in args.only_cuda.split(","))
            if dev is None or not wanted:
                continue
            r = entry[key] = guarded(f"{name} on {label}", speed, dev, model, args.prompt, args.decode, rng, args.runs)
            if r:
                log(f"{name}: {label} prefill {r['prefill_tok_s']:.0f} tok/s, decode {r['decode_tok_s']:.1f} tok/s "
                    f"(greedy steps{' queued ahead' if r['decode_pipelined'] else ''}; the logits path, in turns: "
                    f"{r['decode_logits_path_tok_s']:.1f}) ({r['kernels_per_decode_step']} kernels a decode step) "
                    f"{r['report']}")
            save()
            gc.collect()
        base = entry.get("cuda")
        for other in ("vulkan", "opencl", "cuda_no_graphs"):
            o = entry.get(other)
            if base and o:
                log(f"{name}: cuda:0 / {other}: prefill {base['prefill_tok_s'] / o['prefill_tok_s']:.2f}x, decode "
                    f"{base['decode_tok_s'] / o['decode_tok_s']:.2f}x")
        del model
        gc.collect()
        if not args.keep_models:
            path.unlink()


def one_chip(devs, rng, work: Path) -> dict:
    """A target's KV cache on vulkan:0, a draft of its first layers sharing it on cuda:0: refused at
    reservation naming the one physical device; on vulkan:0 with the target, the draft runs."""
    from framework.core.scheduler import CapabilityError
    from framework.model.model import Model
    from framework.runtime.session import Session
    vk, cuda = devs["vulkan"], devs["cuda"]
    out = {"physical_ids": [vk.physical_id, cuda.physical_id], "one_chip": vk.physical_id == cuda.physical_id}
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    model = Model(vb.write_model("smollm2", specs["smollm2"], work / "one-chip.gguf", rng))
    target = Session(model, [vk], n_ctx=256, kv_device=vk.name)
    draft = Session(model, [cuda], n_layers=DRAFT_LAYERS, share_kv_with=target)
    try:
        draft.reserve(8, 4)
        out["refused"] = False
    except CapabilityError as e:
        text = str(e)
        out.update(refused=True, code=e.code, error=text,
                   names_the_chip=f"same physical device ({vk.physical_id}) reached through two plugins" in text)
    prompt = [int(t) for t in rng.integers(0, model.hp.n_vocab, size=8)]
    target.eval(prompt)
    together = Session(model, [vk], n_layers=DRAFT_LAYERS, share_kv_with=target)
    together.reserve(len(prompt), 2)
    together.n_past = target.n_past
    shared = together.eval([prompt[-1]])
    alone = Session(model, [vk], n_ctx=256, n_layers=DRAFT_LAYERS)
    alone.eval(prompt)
    out["placed_together_runs"] = bool(np.allclose(shared, alone.eval([prompt[-1]]), rtol=1e-4, atol=1e-4))
    return out


def set_constants(pairs) -> None:
    """--set NAME=VALUE: a kernel shape's constant for this run (a sweep of what kernels.py chooses)."""
    from framework.plugins.cuda import kernels
    for kv in pairs:
        name, _, value = kv.partition("=")
        if not hasattr(kernels, name):
            raise SystemExit(f"--set {kv}: framework.plugins.cuda.kernels has no constant {name}")
        if not value.lstrip("-").isdigit():
            raise SystemExit(f"--set {kv}: {name} takes a whole number (NAME=VALUE)")
        setattr(kernels, name, int(value))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--work", default="/tmp/cuda_bench")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5, help="timed prefill runs per model (decode: runs // 2 + 1)")
    ap.add_argument("--models", default="smollm2,gemma3,qwen25-coder-1.5b")
    ap.add_argument("--only-cuda", default="qwen25-coder-1.5b", help="models measured on cuda:0 only")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--devices", default="cuda,cuda_no_graphs,vulkan,opencl",
                    help="what the model section measures: cuda, cuda_no_graphs, vulkan, opencl (default: all)")
    ap.add_argument("--keep-models", action="store_true", help="keep the random-weight files in --work, and reuse "
                    "them where they are (runs of two trees taking turns write each once)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a constant of framework.plugins.cuda.kernels for this run (a sweep, not a user setting)")
    ap.add_argument("--skip-conformance", action="store_true")
    ap.add_argument("--conformance-s", type=float, default=150, help="seconds after which cases left are counted")
    ap.add_argument("--stand-in", help="a dry run: this device (opencl:0 or vulkan:0) in cuda:0's place")
    ap.add_argument("--rounding-only", action="store_true", help="only the CPU plugin's 8-bit activations against "
                    "its f32 path on each model's random-weight file (no GPU needed), then stop")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.rounding_only:
        return rounding_only(args, work, rng)
    out = Path(args.out) / "cuda_bench.json"
    result: dict = {"args": vars(args)}

    def save():
        out.write_text(json.dumps(result, indent=1, default=str))

    set_constants(args.set)
    devs = find_devices(args.stand_in)
    result["devices"] = {k: {"name": d.name, "physical_id": d.physical_id, "description": d.description}
                         for k, d in devs.items()}
    save()
    if not args.skip_conformance:
        t0 = time.perf_counter()
        result["conformance"] = c = guarded("conformance", vb.conformance, devs["cuda"],
                                            deadline=time.monotonic() + args.conformance_s)
        log(f"conformance on {devs['cuda'].name}: {c} ({time.perf_counter() - t0:.0f} s)")
        save()
        if not c or not c["passed"]:
            raise SystemExit(f"no conformance case passed on {devs['cuda'].name}: the rest would measure nothing")
    if "vulkan" in devs:
        result["one_chip"] = oc = guarded("one chip", one_chip, devs, rng, work)
        log(f"one chip (target's cache on vulkan:0, draft on {devs['cuda'].name}): {oc}")
        save()
    models_section(args, result, devs, rng, work, save)
    log("done")


if __name__ == "__main__":
    main()
