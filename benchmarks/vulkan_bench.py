"""Speed of the Vulkan plugin on a real GPU, next to PyTorch on the same GPU (benchmarks/vulkan_h200.sh
runs it on the nvidia-h200 machine). Prints, in one run:

* the adapter (name, type, backend, binding limit);
* a device-to-device copy through PyTorch (bytes read + written per second): the bandwidth ceiling;
* each quantized matrix-vector kernel (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K; about 0.5 GB of weights):
  weight bytes read per second, over wall time of back-to-back runs and over GPU timestamps, and
  those as shares of the copy's figure; --variants compares kernel shapes (FRAMEWORK_VULKAN_MATVEC);
* the tiled matrix-matrix kernel's rate on a prefill-sized product;
* both model architectures at their real sizes and tensor types, random weights (GGUF files written
  here from benchmarks/vulkan_models.json), through the framework's Session on vulkan:0: prefill of
  256 tokens and decode tok/s, medians of --runs timed runs after warm-up (with the slowest and
  fastest); and PyTorch bf16 eager on the same architectures and sizes, measured the same way (random
  weights, manual decode loop with a KV cache); --matmul-variants compares prefill kernel settings
  (FRAMEWORK_VULKAN_MATMUL); --unfuse-variants compares the plugin's decode fusions
  (FRAMEWORK_VULKAN_UNFUSE: ";all" measures every fusion on, then none), with the dispatches a decode
  step takes and the decode logits against the CPU plugin for each, and where a decode step's wall
  time goes (host_breakdown: the program's run, the wait for the GPU, the read-back, the rest; the
  GPU time of the step's one pass; a cProfile of 32 steps);
* a correctness check on that GPU: the op conformance cases, and the random-weight models' logits
  against the CPU plugin.

Timings on lavapipe (Mesa's CPU Vulkan driver) are not GPU figures: the script says so and refuses
to compare them unless --allow-cpu-adapter is given.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from framework.plugins.vulkan.fusion import UNFUSE_ENV

# byte offsets of f16 scales inside a block (kept finite and small so values stay finite)
F16_FIELDS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q8_0": (0,), "Q4_K": (0, 2), "Q6_K": (208,),
              "Q5_1": (0, 2), "Q2_K": (80, 82), "Q3_K": (108,), "Q5_K": (0, 2)}


T0 = time.monotonic()


def log(*a):
    """A line of the run's output, after the seconds since the start (a run must fit in its time)."""
    print(f"[{time.monotonic() - T0:5.0f} s]", *a, flush=True)


def random_raw(rng, qtype: str, shape) -> np.ndarray:
    """Random GGUF bytes of a weight: values do not change speed; scales are small finite f16s."""
    if qtype == "F32":
        return (rng.standard_normal(math.prod(shape), dtype=np.float32) * 0.02).view(np.uint8)
    if qtype == "F16":
        return (rng.standard_normal(math.prod(shape), dtype=np.float32) * 0.02).astype(np.float16).view(np.uint8)
    per, size = GGML_QUANT_SIZES[Q[qtype]]
    nb = math.prod(shape) // per
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off:off + 2] = rng.uniform(0.0005, 0.002, size=nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1)


# ------------------------------------------------------------------------------------------------------
# GGUF files of the models' shapes
# ------------------------------------------------------------------------------------------------------

def add_placeholder_vocab(w, n_vocab: int) -> None:
    """A SentencePiece-style vocabulary of n_vocab made-up pieces, for programs that refuse a file without
    one (llama.cpp's llama-bench draws random token ids below the vocabulary's size): the pieces change no
    timing, the size (the output product's rows) is the model's."""
    import gguf
    special = ["<unk>", "<s>", "</s>"]
    byte_pieces = [f"<0x{b:02X}>" for b in range(256)]
    if n_vocab < len(special) + len(byte_pieces):
        raise ValueError(f"a placeholder vocabulary needs at least {len(special) + len(byte_pieces)} pieces "
                         f"(3 special, 256 bytes); the model's vocab_size is {n_vocab}")
    tokens = special + byte_pieces + [f"t{i}" for i in range(n_vocab - len(special) - len(byte_pieces))]
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * len(byte_pieces) + [gguf.TokenType.NORMAL] * (n_vocab - 3 - len(byte_pieces)))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * n_vocab)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)


def write_model(name: str, spec: dict, path: Path, rng, vocab: bool = False) -> Path:
    """A GGUF file of spec's metadata and tensor shapes and types, random weights; vocab: with a
    placeholder vocabulary of the model's size (add_placeholder_vocab)."""
    import gguf
    meta = spec["metadata"]
    arch = meta["general.architecture"]
    w = gguf.GGUFWriter(str(path), arch)
    if vocab:
        add_placeholder_vocab(w, int(meta[f"{arch}.vocab_size"]))
    for k, v in meta.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, float):
            w.add_float32(k, v)
        else:
            w.add_string(k, v)
    for tname, dtype, shape in spec["tensors"]:
        if dtype == "F32" and len(shape) == 1:
            data = np.ones(shape, np.float32)      # norm gains
            w.add_tensor(tname, data)
            continue
        raw = random_raw(rng, dtype, shape)
        per, size = GGML_QUANT_SIZES[Q[dtype]]
        raw_shape = list(shape[:-1]) + [shape[-1] // per * size]
        w.add_tensor(tname, raw.reshape(raw_shape), raw_dtype=Q[dtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ------------------------------------------------------------------------------------------------------
# Vulkan measurements
# ------------------------------------------------------------------------------------------------------

def vulkan_device():
    from framework.plugins.vulkan.device import devices
    devs = devices()
    for d in devs:
        log(f"  {d.describe()}")
    dev = devs[0]
    if not dev.available:
        raise SystemExit(f"vulkan:0 unavailable: {dev.unavailable_reason}")
    return dev


def wait(dev):
    """Until the queue has run everything submitted (a 16-byte read-back waits for the work before it;
    wgpu 0.32's on_submitted_work_done_sync is broken)."""
    dev.gpu.queue.read_buffer(dev.dummy(), 0, 16)


def program_for(dev, graph, weight_bytes):
    from framework.core.scheduler import Executor, make_plan
    plan = make_plan(graph, [dev])
    ex = Executor([dev], weight_bytes)
    ex.prepare(plan)
    (frag,) = plan.fragments
    prog = ex.programs[(dev.name, frag.program)]
    return plan, ex, frag, prog


def matvec_bandwidth(dev, qtype: str, target_bytes: int, rng, reps: int, m: int = 1,
                     variants: tuple[str, ...] = ("",), env: str = "FRAMEWORK_VULKAN_MATVEC") -> list[dict]:
    """Weight bytes read per second by one MUL_MAT of a (n, 4096) weight and m rows of x, for each
    kernel variant (a setting of `env`, FRAMEWORK_VULKAN_MATVEC or _MATMUL; "" = the plugin's own choice): wall
    time over `reps` back-to-back runs, and the GPU time of the kernel from timestamps where the adapter has them."""
    import gc

    from framework.core.graph import F32, GraphBuilder, LeafKind, leaf
    k = 4096
    per, size = GGML_QUANT_SIZES[Q[qtype]]
    row = k // per * size
    n = max(64, target_bytes // row // 64 * 64)
    raw = random_raw(rng, qtype, (n, k))
    x = rng.standard_normal((m, k)).astype(np.float32)
    out = []
    for var in variants:
        os.environ[env] = var
        b = GraphBuilder()
        wt = leaf("w", Q[qtype], (n, k), LeafKind.WEIGHT)
        y = b.mul_mat(b.use(wt), b.input("x", F32, (m, k)))
        _plan, ex, _frag, prog = program_for(dev, b.build([y]), lambda t: raw)
        args = [ex.weights[(dev.name, id(wt))], dev.from_host(x)]
        prog.run(args)
        wait(dev)
        t0 = time.perf_counter()
        for _ in range(reps):
            prog.run(args)
        wait(dev)
        dt = (time.perf_counter() - t0) / reps
        gpu_s = None
        if dev.timestamps:
            dev.profile = {}
            for _ in range(5):
                prog.run(args)
            prof, dev.profile = dev.profile, None
            gpu_s = sum(v[0] for v in prof.values()) / 5
        out.append({"type": qtype, "variant": var, "rows": n, "cols": k, "m": m, "weight_bytes": int(raw.nbytes),
                    "seconds": dt, "read_GBps": raw.nbytes / dt / 1e9, "TFLOPs": 2 * n * k * m / dt / 1e12,
                    "gpu_seconds": gpu_s, "gpu_read_GBps": raw.nbytes / gpu_s / 1e9 if gpu_s else None,
                    "kernel": " + ".join(s.name.split(" ")[0] for s in prog.steps)})
        del ex, prog, args
        gc.collect()
    os.environ.pop(env, None)
    return out


def spread(times: list[float], n_tokens: int) -> dict:
    """tok/s of timed runs: the median (the figure reported) and the slowest and fastest run."""
    rates = sorted(n_tokens / t for t in times)
    return {"median": float(np.median(rates)), "min": rates[0], "max": rates[-1], "runs": len(rates)}


def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def vulkan_prefill(s, prompt, runs: int) -> dict:
    """Prefill tok/s over `runs` timed runs after a warm-up (weights loaded and programs compiled by
    then): each run resets the session and evaluates the whole prompt (logits of the last token)."""
    def once():
        s.reset()
        s.eval(prompt)
    once()
    return spread(timed(once, runs), len(prompt))


def model_speed(dev, model, n_prompt: int, n_decode: int, rng, runs: int = 5) -> dict:
    from framework.runtime.session import Session
    n_vocab = model.hp.n_vocab
    prompt = [int(t) for t in rng.integers(0, n_vocab, size=n_prompt)]
    s = Session(model, [dev], n_ctx=1024, n_batch=n_prompt)
    t0 = time.perf_counter()
    s.eval(prompt)                                    # loads weights, compiles (not timed)
    first = time.perf_counter() - t0
    prefill = vulkan_prefill(s, prompt, runs)
    tok = int(np.argmax(s.eval([1])))
    for _ in range(8):                                # the decode plan is compiled here (not timed)
        tok = int(np.argmax(s.eval([tok])))

    def decode_run():                                 # n_decode tokens after the prompt, each run
        s.reset()
        s.eval(prompt)
        t0 = time.perf_counter()
        t = tok
        for _ in range(n_decode):
            t = int(np.argmax(s.eval([t])))
        return time.perf_counter() - t0
    decode = spread([decode_run() for _ in range(max(1, runs // 2 + 1))], n_decode)
    out = {"prefill_tok_s": prefill["median"], "prefill_runs": prefill, "decode_tok_s": decode["median"],
           "decode_runs": decode, "decode_ms_per_token": 1e3 / decode["median"], "first_prefill_s": first,
           "dispatches_per_decode_step": sum(len(dev_prog.steps) for dev_prog in _programs(s, 1)),
           "prefill_kernels": sorted({st.name.split(" ")[0] for p in _programs(s, n_prompt) for st in p.steps}),
           "decode_kernels": sorted({st.name.split(" ")[0] for p in _programs(s, 1) for st in p.steps})}
    out["host"] = host_breakdown(dev, s, tok, 32)
    if dev.timestamps:      # GPU time per kernel (one pass per dispatch while profiling)
        for phase, run in (("prefill", lambda: (s.reset(), s.eval(prompt))),
                           ("decode", lambda: [s.eval([tok]) for _ in range(8)])):
            dev.profile = {}
            run()
            prof, dev.profile = dev.profile, None
            n = n_prompt if phase == "prefill" else 8
            total = sum(v[0] for v in prof.values())
            out[f"gpu_ms_per_{phase}_token"] = total / n * 1e3
            out[f"gpu_profile_{phase}"] = {k: round(v[0] / n * 1e6, 1) for k, v in
                                           sorted(prof.items(), key=lambda kv: -kv[1][0])}
            if phase == "prefill":
                s.reset()
                s.eval(prompt)
    return out


def host_breakdown(dev, s, tok: int, n: int) -> dict:
    """Where a decode step's wall time goes (ms a step, over n steps): the program's run (arguments bound,
    tables and uploads, the dispatches encoded and submitted), the device's synchronize (waiting for the
    GPU), to_host (the logits read back), and the rest (session and executor); then the GPU time of the
    step's one pass (timestamps around it), and the host functions that take most time (cProfile).

    The finer split ("split"): the session's own time (eval, outside the executor), the executor's own
    (outside the program's run, the wait and the read-back), the sampler (the argmax of this loop); the
    program's run as before_submit (binding, tables, uploads), submit (queue.submit), encode_next (the next
    step's command buffer, recorded after the submission while the GPU works) and results (the output
    handles); and the window from the submission's return to the wait's end, which holds the GPU's pass."""
    import cProfile
    import io
    import pstats
    progs = _programs(s, 1)
    acc = {"run": 0.0, "synchronize": 0.0, "to_host": 0.0}
    fine = dict.fromkeys(("eval", "executor_run", "sampler", "encode", "results", "submit", "window"), 0.0)
    marks = {"submitted": None}

    def timer(name, fn, into=acc):
        def timed_call(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                t1 = time.perf_counter()
                into[name] += t1 - t0
                if name == "synchronize" and marks["submitted"] is not None:
                    fine["window"] += t1 - marks["submitted"]
                    marks["submitted"] = None
        return timed_call

    queue = dev.gpu.queue
    queue_submit = queue.submit

    def submit(*a, **k):
        t0 = time.perf_counter()
        try:
            return queue_submit(*a, **k)
        finally:
            t1 = time.perf_counter()
            if marks["submitted"] is None:      # the step's own submission (wgpu's map adds an empty one, waited)
                fine["submit"] += t1 - t0
                marks["submitted"] = t1
    for p in progs:
        p.run = timer("run", p.run)            # instance attributes over the methods, removed below
        p._encode = timer("encode", p._encode, fine)
        p.results = timer("results", p.results, fine)
    dev.synchronize, dev.to_host = timer("synchronize", dev.synchronize), timer("to_host", dev.to_host)
    s.eval = timer("eval", s.eval, fine)
    s.executor.run = timer("executor_run", s.executor.run, fine)
    queue.submit = submit
    argmax = timer("sampler", np.argmax, fine)
    try:
        t0 = time.perf_counter()
        for _ in range(n):
            tok = int(argmax(s.eval([tok])))
        wall = time.perf_counter() - t0
    finally:
        for p in progs:
            del p.run, p._encode, p.results
        del dev.synchronize, dev.to_host, s.eval, s.executor.run, queue.submit
    out = {k: round(v / n * 1e3, 3) for k, v in acc.items()}
    out["wall"] = round(wall / n * 1e3, 3)
    out["rest"] = round(out["wall"] - sum(out[k] for k in acc), 3)
    ms = {k: v / n * 1e3 for k, v in fine.items()}
    split = {"session": ms["eval"] - ms["executor_run"],
             "executor": ms["executor_run"] - sum(acc.values()) / n * 1e3,
             "sampler": ms["sampler"],
             "before_submit": acc["run"] / n * 1e3 - ms["submit"] - ms["encode"] - ms["results"],
             "submit": ms["submit"], "encode_next": ms["encode"], "results": ms["results"],
             "wait": acc["synchronize"] / n * 1e3, "to_host": acc["to_host"] / n * 1e3,
             "submit_to_wait_end": ms["window"]}
    out["split"] = {k: round(v, 3) for k, v in split.items()}
    out["dispatches"] = sum(len(p.steps) for p in progs)
    if dev.timestamps:
        dev.pass_times = []
        for _ in range(n):
            tok = int(np.argmax(s.eval([tok])))
        times, dev.pass_times = dev.pass_times, None
        out["gpu_one_pass"] = round(float(np.median(times)) * 1e3, 3)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        tok = int(np.argmax(s.eval([tok])))
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
    out["cprofile_top"] = [line for line in text.getvalue().splitlines() if line.strip()][-19:]
    return out


def prefill_variants(dev, model, n_prompt: int, rng, variants: list[str], runs: int) -> list[dict]:
    """Prefill tok/s (median of `runs`) and the prefill's GPU profile for each FRAMEWORK_VULKAN_MATMUL
    setting ("" = the plugin's own choice), a new session each (programs are made per session)."""
    from framework.plugins.vulkan.kernel_shapes import MATMUL_ENV
    from framework.runtime.session import Session
    prompt = [int(t) for t in rng.integers(0, model.hp.n_vocab, size=n_prompt)]
    out = []
    for var in variants:
        os.environ[MATMUL_ENV] = var
        s = Session(model, [dev], n_ctx=1024, n_batch=n_prompt)
        s.eval(prompt)
        r = {"variant": var, **vulkan_prefill(s, prompt, runs)}
        if dev.timestamps:
            dev.profile = {}
            s.reset()
            s.eval(prompt)
            prof, dev.profile = dev.profile, None
            r["gpu_us_per_token"] = {k: round(v[0] / n_prompt * 1e6, 1) for k, v in
                                     sorted(prof.items(), key=lambda kv: -kv[1][0]) if k.startswith("MUL_MAT")}
            r["gpu_us_per_token_all"] = round(sum(v[0] for v in prof.values()) / n_prompt * 1e6, 1)
        out.append(r)
        del s
    os.environ.pop(MATMUL_ENV, None)
    return out


def _programs(session, n_tokens):
    out = []
    for key, (plan, _) in session.plans.items():
        if key[0] == n_tokens:
            for f in plan.fragments:
                out.append(session.executor.programs[(f.device, f.program)])
            break
    return out


CHECK_IDS = (1, 50, 300, 7000, 12, 99, 4000, 5)


def cpu_reference(model) -> np.ndarray:
    """The CPU plugin's logits of every row of CHECK_IDS: the reference of each check of a model."""
    from framework.plugins.cpu.device import CpuDevice
    from framework.runtime.session import Session
    ids = [t % model.hp.n_vocab for t in CHECK_IDS]
    return Session(model, [CpuDevice("f32")], n_ctx=256, n_batch=8).eval(ids, all_logits=True)


def check_models_against_cpu(dev, model, b: np.ndarray | None = None) -> dict:
    """vulkan:0 against the CPU plugin (`b`, from cpu_reference): one prefill of CHECK_IDS, and its last
    four rows again as decode steps after the first four (the decode kernels, fused where they are)."""
    from framework.runtime.session import Session
    ids = [t % model.hp.n_vocab for t in CHECK_IDS]
    if b is None:
        b = cpu_reference(model)
    a = Session(model, [dev], n_ctx=256, n_batch=8).eval(ids, all_logits=True)
    s = Session(model, [dev], n_ctx=256, n_batch=8)
    s.eval(ids[:4])
    steps = np.stack([s.eval([t]) for t in ids[4:]])
    corr = float(min(np.corrcoef(a[i], b[i])[0, 1] for i in range(len(ids))))
    nmse = float(np.sum((a - b) ** 2) / np.sum(b ** 2))
    nmse_decode = float(np.sum((steps - b[4:]) ** 2) / np.sum(b[4:] ** 2))
    return {"min_corr_vs_cpu": corr, "nmse_vs_cpu": nmse, "nmse_decode_vs_cpu": nmse_decode,
            "argmax_agree": float(np.mean(a.argmax(1) == b.argmax(1))),
            "decode_argmax_agree": float(np.mean(steps.argmax(1) == b[4:].argmax(1)))}


def check_prefill_against_cpu(dev, model, variants) -> dict:
    """Logits of one 64-token prefill (more than 8 rows: the tiled products) against the CPU plugin, for
    each FRAMEWORK_VULKAN_MATMUL setting: NMSE over all logits, and the share of equal argmaxes."""
    from framework.plugins.cpu.device import CpuDevice
    from framework.runtime.session import Session
    ids = [int(t) for t in np.random.default_rng(1).integers(0, model.hp.n_vocab, size=64)]
    b = Session(model, [CpuDevice("f32")], n_ctx=256, n_batch=64).eval(ids, all_logits=True)
    out = {}
    for var in variants:
        os.environ["FRAMEWORK_VULKAN_MATMUL"] = var
        a = Session(model, [dev], n_ctx=256, n_batch=64).eval(ids, all_logits=True)
        out[var or "default"] = {"nmse": float(np.sum((a - b) ** 2) / np.sum(b ** 2)),
                                 "argmax_agree": float(np.mean(a.argmax(1) == b.argmax(1)))}
    os.environ.pop("FRAMEWORK_VULKAN_MATMUL", None)
    return out


def conformance(dev, select=lambda case_id: True, deadline: float = math.inf) -> dict:
    """The op conformance cases `select` takes, on `dev` against the CPU plugin (ggml's NMSE thresholds),
    until time.monotonic() passes `deadline`: the cases left then are counted, not run."""
    from framework.conformance.cases import all_cases, nmse
    from framework.core.scheduler import Executor, make_plan
    from framework.core.scheduler.verdicts import ask
    from framework.plugins.cpu.device import CpuDevice
    cpu = CpuDevice("f32")
    ok = refused = left = 0
    failed = []
    for case in all_cases():
        if not select(case.id):
            continue
        if time.monotonic() > deadline:
            left += 1
            continue
        b = case.build()
        if not all(ask(dev, n).ok for n in b.graph.nodes):     # the central checks too (op list, weight types)
            refused += 1
            continue
        outs = []
        try:
            for d in (dev, cpu):
                plan = make_plan(b.graph, [d])
                outs.append([np.array(o) for o in Executor([d], b.weight_bytes).run(plan, b.fresh_inputs())])
        except Exception as e:       # the case failed on the device: count it, go on  # noqa: BLE001
            failed.append((case.id, f"{type(e).__name__}: {e}"))
            continue
        errs = [nmse(o, r) for o, r in zip(*outs)]
        if all(e <= b.tolerance for e in errs):
            ok += 1
        else:
            failed.append((case.id, max(errs)))
    out = {"passed": ok, "refused": refused, "failed": failed}
    if left:
        out["not_run_past_the_deadline"] = left
    return out


def is_decode_case(case_id: str) -> bool:
    """The conformance cases of whole decode steps: those the fused kernels run on a GPU."""
    return case_id.startswith("DECODE-")


# ------------------------------------------------------------------------------------------------------
# PyTorch: the copy ceiling and eager bf16 models
# ------------------------------------------------------------------------------------------------------

def torch_copy_bandwidth() -> float:
    import torch
    n = 2 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(20):
        y.copy_(x)
    e1.record()
    torch.cuda.synchronize()
    dt = e0.elapsed_time(e1) / 1e3 / 20
    del x, y
    torch.cuda.empty_cache()
    return 2 * n / dt / 1e9


class TorchLM:
    """Eager bf16 forward of the llama (SmolLM2) and gemma3 graphs, random weights, KV cache."""

    def __init__(self, hp, arch: str, n_ctx: int):
        import torch
        self.t = torch
        self.hp, self.arch = hp, arch
        dev, dt = "cuda", torch.bfloat16
        g = torch.Generator(device=dev).manual_seed(0)

        def w(*shape):
            return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * 0.02).to(dt)

        e, hd, nh, nkv, ff = hp.n_embd, hp.head_dim, hp.n_head, hp.n_head_kv, hp.n_ff
        self.emb = w(hp.n_vocab, e)
        self.layers = []
        for _ in range(hp.n_layer):
            L = {"q": w(nh * hd, e), "k": w(nkv * hd, e), "v": w(nkv * hd, e), "o": w(e, nh * hd),
                 "gate": w(ff, e), "up": w(ff, e), "down": w(e, ff),
                 "n1": torch.ones(e, device=dev, dtype=dt), "n2": torch.ones(e, device=dev, dtype=dt)}
            if arch == "gemma3":
                L.update(qn=torch.ones(hd, device=dev, dtype=dt), kn=torch.ones(hd, device=dev, dtype=dt),
                         pn1=torch.ones(e, device=dev, dtype=dt), pn2=torch.ones(e, device=dev, dtype=dt))
            self.layers.append(L)
        self.norm = torch.ones(e, device=dev, dtype=dt)
        self.kc = torch.zeros(hp.n_layer, n_ctx, nkv, hd, device=dev, dtype=dt)
        self.vc = torch.zeros_like(self.kc)
        self.n_ctx = n_ctx

    def rms(self, x, wgt):
        t = self.t
        xf = x.float()
        return (xf * t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.hp.rms_eps)).to(x.dtype) * wgt

    def tables(self, pos, base):
        t = self.t
        d = self.hp.n_rot
        half = d // 2
        inv = 1.0 / (base ** (t.arange(0, half, device=pos.device, dtype=t.float32) * 2 / d))
        ang = pos.float()[:, None] * inv[None, :]
        return ang.cos()[:, None, :].to(t.bfloat16), ang.sin()[:, None, :].to(t.bfloat16)

    def rope(self, x, cs):
        t = self.t
        cos, sin = cs
        half = x.shape[-1] // 2
        if self.arch == "gemma3":
            x0, x1 = x[..., :half], x[..., half:]
            return t.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)
        x0, x1 = x[..., 0::2], x[..., 1::2]
        return t.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1).flatten(-2)

    def forward(self, tokens, start: int):
        t, hp = self.t, self.hp
        F = t.nn.functional
        T = tokens.shape[0]
        pos = t.arange(start, start + T, device=tokens.device)
        x = self.emb[tokens]
        if self.arch == "gemma3":
            x = x * math.sqrt(hp.n_embd)
        n_kv = start + T
        s_idx = t.arange(n_kv, device=tokens.device)
        causal = s_idx[None, :] <= pos[:, None]
        masks = {False: causal[None, None]}
        tables = {hp.rope_base: self.tables(pos, hp.rope_base)}
        if self.arch == "gemma3":
            masks[True] = (causal & ((pos[:, None] - s_idx[None, :]) < hp.sliding_window))[None, None]
            tables[hp.rope_base_swa] = self.tables(pos, hp.rope_base_swa)
        for il, L in enumerate(self.layers):
            h = self.rms(x, L["n1"])
            q = (h @ L["q"].T).view(T, hp.n_head, hp.head_dim)
            k = (h @ L["k"].T).view(T, hp.n_head_kv, hp.head_dim)
            v = (h @ L["v"].T).view(T, hp.n_head_kv, hp.head_dim)
            swa = self.arch == "gemma3" and hp.swa_layers[il]
            cs = tables[hp.rope_base_swa if swa else hp.rope_base]
            if self.arch == "gemma3":
                q, k = self.rms(q, L["qn"]), self.rms(k, L["kn"])
            q, k = self.rope(q, cs), self.rope(k, cs)
            self.kc[il, start:start + T] = k
            self.vc[il, start:start + T] = v
            kk, vv = self.kc[il, :n_kv], self.vc[il, :n_kv]
            att = F.scaled_dot_product_attention(q.transpose(0, 1)[None], kk.transpose(0, 1)[None],
                                                 vv.transpose(0, 1)[None], attn_mask=masks[swa], enable_gqa=True)
            att = att[0].transpose(0, 1).reshape(T, -1) @ L["o"].T
            if self.arch == "gemma3":
                att = self.rms(att, L["pn1"])
            x = x + att
            h = self.rms(x, L["n2"])
            gate, up = h @ L["gate"].T, h @ L["up"].T
            act = F.gelu(gate, approximate="tanh") if self.arch == "gemma3" else F.silu(gate)
            y = (act * up) @ L["down"].T
            if self.arch == "gemma3":
                y = self.rms(y, L["pn2"])
            x = x + y
        x = self.rms(x[-1:], self.norm)
        return x @ self.emb.T


def torch_model_speed(hp, arch: str, n_prompt: int, n_decode: int, runs: int = 5) -> dict:
    """The same measures as model_speed: prefill (logits of the last token) and decode, medians of
    timed runs after warm-up, CUDA synchronized around each."""
    import torch
    m = TorchLM(hp, arch, 1024)
    prompt = torch.randint(0, hp.n_vocab, (n_prompt,), device="cuda")

    def prefill():
        logits = m.forward(prompt, 0)
        torch.cuda.synchronize()
        return logits

    def decode_run():
        tok = prefill().argmax(-1)
        t0 = time.perf_counter()
        for pos in range(n_prompt, n_prompt + n_decode):
            tok = m.forward(tok, pos).argmax(-1)     # stays on the GPU: no host round trip per token
        torch.cuda.synchronize()
        return time.perf_counter() - t0
    with torch.inference_mode():
        for _ in range(2):
            prefill()
        pre = spread(timed(prefill, runs), n_prompt)
        decode_run()                                 # warm-up of the one-token shapes
        dec = spread([decode_run() for _ in range(max(1, runs // 2 + 1))], n_decode)
    m = None                                         # the weights go before the next model's
    torch.cuda.empty_cache()
    return {"prefill_tok_s": pre["median"], "prefill_runs": pre, "decode_tok_s": dec["median"], "decode_runs": dec}


# ------------------------------------------------------------------------------------------------------

def attempt(result: dict, what: str, fn, *a):
    """fn(*a), or None where it raises: the error (with its traceback) goes to the log and to the run's
    "errors", and the run goes on to the next measurement, so that one run tells everything it can."""
    import traceback
    try:
        return fn(*a)
    except Exception as e:  # noqa: BLE001
        log(f"ERROR in {what}: {type(e).__name__}: {e}\n{traceback.format_exc()}")
        result.setdefault("errors", []).append(f"{what}: {type(e).__name__}: {e}")
        return None


MAX_CHECK_NMSE = 1e-3   # logits of a random-weight model against the CPU plugin (lavapipe: 5e-6 to 3e-5)


def summary(result: dict) -> list[str]:
    """The table a run ends with: each model's prefill and decode on vulkan:0 with each fusion setting and
    in PyTorch, dispatches a decode step, and the ratios; goal 1 (decode at least 400 tok/s in at most
    150 dispatches a step, prefill not slower than unfused) read off the figures."""
    head = (f"{'model':<9} {'run':<42} {'prefill tok/s':>13} {'decode tok/s':>12} {'ms/token':>8} "
            f"{'dispatches/step':>15} {'GPU ms/token':>12}")
    rows = [head]
    notes = []
    for name, e in result.get("models", {}).items():
        runs = e.get("vulkan_by_unfuse") or ({"": e["vulkan"]} if "vulkan" in e else {})
        for var, tv in runs.items():
            label = "vulkan:0 fused" if var == "" else f"vulkan:0 UNFUSE={var}"
            gpu = tv.get("gpu_ms_per_decode_token")
            rows.append(f"{name:<9} {label:<42} {tv['prefill_tok_s']:>13.0f} {tv['decode_tok_s']:>12.1f} "
                        f"{tv['decode_ms_per_token']:>8.2f} {tv['dispatches_per_decode_step']:>15} "
                        f"{'' if gpu is None else f'{gpu:.3f}':>12}")
        tt = e.get("torch_eager_bf16")
        if tt:
            rows.append(f"{name:<9} {'PyTorch eager bf16':<42} {tt['prefill_tok_s']:>13.0f} "
                        f"{tt['decode_tok_s']:>12.1f} {1e3 / tt['decode_tok_s']:>8.2f}")
        fused = runs.get("") or e.get("vulkan")
        if not fused:
            continue
        unfused = [tv for var, tv in runs.items() if var]
        line = (f"{name}: fused decode {fused['decode_tok_s']:.1f} tok/s in "
                f"{fused['dispatches_per_decode_step']} dispatches a step")
        if unfused:
            u = unfused[0]
            line += (f"; fused/unfused decode {fused['decode_tok_s'] / u['decode_tok_s']:.2f}x, prefill "
                     f"{fused['prefill_tok_s'] / u['prefill_tok_s']:.2f}x")
        if tt:
            line += (f"; vulkan fused/PyTorch decode {fused['decode_tok_s'] / tt['decode_tok_s']:.2f}x, prefill "
                     f"{fused['prefill_tok_s'] / tt['prefill_tok_s']:.2f}x")
        met = fused["decode_tok_s"] >= 400 and fused["dispatches_per_decode_step"] <= 150
        line += f"; goal 1 (decode >= 400 tok/s, <= 150 dispatches): {'met' if met else 'NOT met'}"
        checks = {"fused": e.get("check"), **e.get("check_by_unfuse", {})}
        checked = [f"{v} NMSE {c['nmse_vs_cpu']:.1e}, decode steps {c['nmse_decode_vs_cpu']:.1e}"
                   for v, c in checks.items() if c]
        line += f"; logits vs cpu plugin: {'; '.join(checked)}" if checked else "; logits not checked"
        bad = [v for v, c in checks.items() if c and max(c["nmse_vs_cpu"], c["nmse_decode_vs_cpu"]) > MAX_CHECK_NMSE]
        if bad:
            line += f"; CHECK FAILED (NMSE above {MAX_CHECK_NMSE:g}): {', '.join(bad)}"
        notes.append(line)
    for key in ("conformance_decode_steps", "conformance"):
        if key in result:
            c = result[key]
            notes.append(f"{key}: {c['passed']} passed, {c['refused']} refused, {len(c['failed'])} failed"
                         + (f" {c['failed']}" if c["failed"] else "")
                         + (f", {c['not_run_past_the_deadline']} not run (past --deadline-s)"
                            if c.get("not_run_past_the_deadline") else ""))
    if result.get("errors"):
        notes.append(f"ERRORS ({len(result['errors'])}): " + "; ".join(result["errors"]))
    return rows + notes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--work", default="/tmp/vulkan_bench")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--matvec-bytes", type=int, default=512 << 20)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--allow-cpu-adapter", action="store_true",
                    help="measure on a CPU (software) adapter, lavapipe: a dry run, its timings are not GPU figures")
    ap.add_argument("--gpu-kernels", action="store_true",
                    help="a CPU adapter takes a GPU's kernels and fusions (as the tests do; with --allow-cpu-adapter)")
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--skip-matvec", action="store_true", help="no matrix-vector kernel figures")
    ap.add_argument("--skip-matmul", action="store_true", help="no figure of the tiled product on (N, 4096) x 256")
    ap.add_argument("--prefill-only", action="store_true", help="models: only --matmul-variants' prefill figures")
    ap.add_argument("--matvec-only", action="store_true", help="only the copy and the matrix kernels")
    ap.add_argument("--variants", default="", help="';'-separated FRAMEWORK_VULKAN_MATVEC settings to compare")
    ap.add_argument("--runs", type=int, default=5, help="timed prefill runs per model (decode: runs // 2 + 1)")
    ap.add_argument("--matmul-variants", default="",
                    help="';'-separated FRAMEWORK_VULKAN_MATMUL settings: model prefill of each, before the rest")
    ap.add_argument("--expect-adapter", default="NVIDIA", help="refuse an adapter whose name lacks this")
    ap.add_argument("--unfuse-variants", default="",
                    help="';'-separated FRAMEWORK_VULKAN_UNFUSE settings ('' every fusion on, 'all' none): the models' "
                         "prefill, decode, dispatches a step and GPU profile with each, and the decode check")
    ap.add_argument("--conformance", choices=("all", "decode", "none"), default="all",
                    help="conformance cases run: the whole decode steps (DECODE-*) before the models, the rest "
                         "after them ('decode': only those)")
    ap.add_argument("--deadline-s", type=float, default=math.inf,
                    help="seconds from the start after which the conformance cases left are counted, not run")
    ap.add_argument("--summary-of", metavar="JSON",
                    help="print the SUMMARY of a run's vulkan_h200.json, measure nothing")
    args = ap.parse_args()
    if args.summary_of:
        print("\n".join(["SUMMARY of " + args.summary_of, *summary(json.loads(Path(args.summary_of).read_text()))]))
        return
    deadline = time.monotonic() + args.deadline_s
    rng = np.random.default_rng(0)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out) / "vulkan_h200.json"
    result: dict = {"args": {k: None if v == math.inf else v for k, v in vars(args).items()}}

    def save():                      # after each stage: a run cut short keeps what it measured
        out.write_text(json.dumps(result, indent=1, default=str))

    import wgpu
    log(f"wgpu {wgpu.__version__}; VK_DRIVER_FILES={os.environ.get('VK_DRIVER_FILES', '')}")
    dev = vulkan_device()
    result["adapter"] = dev.data
    log(f"adapter: {dev.data['adapter']} ({dev.data['adapter_type']}, backend {dev.data['backend']}, driver "
        f"{dev.data['driver']}), storage bindings up to {dev.max_binding / 2**30:.2f} GiB, "
        f"subgroups {dev.subgroups} (sizes {dev.data['subgroup_size']})")
    if dev.data["backend"] != "Vulkan":
        raise SystemExit(f"the adapter's backend is {dev.data['backend']}, not Vulkan")
    if dev.cpu_adapter and not args.allow_cpu_adapter:
        raise SystemExit("the adapter is a CPU (software) one: its timings are not GPU figures")
    if not dev.cpu_adapter and args.expect_adapter.lower() not in str(dev.data["adapter"]).lower():
        raise SystemExit(f"the adapter is {dev.data['adapter']!r}, not the expected {args.expect_adapter!r} GPU")
    if dev.cpu_adapter:
        log("DRY RUN on a CPU adapter: no figure below is a GPU figure"
            + (" (a GPU's kernels and fusions forced)" if args.gpu_kernels else ""))
        result["dry_run_on_cpu_adapter"] = True
        if args.gpu_kernels:
            dev.cpu_adapter = False
    save()

    check_conformance = not args.skip_check and not args.matvec_only and args.conformance != "none"
    if check_conformance:
        t0 = time.perf_counter()
        result["conformance_decode_steps"] = conformance(dev, is_decode_case)
        log(f"conformance on {dev.name}, whole decode steps (the fused kernels): "
            f"{result['conformance_decode_steps']} ({time.perf_counter() - t0:.0f} s)")
        save()

    copy = None
    if not args.skip_torch:
        copy = torch_copy_bandwidth()
        log(f"PyTorch device-to-device copy: {copy:.0f} GB/s (read + written)")
    result["copy_GBps"] = copy

    result["matvec"] = []
    variants = tuple(args.variants.split(";")) if args.variants else ("",)
    for qt in () if args.skip_matvec else ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"):
        for r in matvec_bandwidth(dev, qt, args.matvec_bytes, rng, args.reps, variants=variants):
            share = f", {r['read_GBps'] / copy:.0%} of the copy" if copy else ""
            gpu = (f"; GPU time {r['gpu_seconds'] * 1e6:.0f} us, {r['gpu_read_GBps']:.0f} GB/s"
                   + (f", {r['gpu_read_GBps'] / copy:.0%}" if copy else "")) if r["gpu_seconds"] else ""
            log(f"matvec {qt}{' [' + r['variant'] + ']' if r['variant'] else ''}: {r['rows']}x{r['cols']} "
                f"({r['weight_bytes'] / 2**20:.0f} MiB) {r['seconds'] * 1e6:.0f} us, read {r['read_GBps']:.0f} GB/s"
                f"{share}{gpu}  [{r['kernel']}]")
            r["share_of_copy"] = r["read_GBps"] / copy if copy else None
            result["matvec"].append(r)
    result["matmul"] = []
    mm_variants = tuple(args.matmul_variants.split(";")) if args.matmul_variants else ("",)
    for qt in () if args.skip_matmul else ("Q8_0", "Q4_K", "Q6_K"):
        for r in matvec_bandwidth(dev, qt, 64 << 20, rng, 10, m=256, variants=mm_variants,
                                  env="FRAMEWORK_VULKAN_MATMUL"):
            flops = 2 * r['rows'] * r['cols'] * 256 / r['gpu_seconds'] if r["gpu_seconds"] else 0
            gpu = f", GPU time {flops / 1e12:.1f} TFLOP/s" if flops else ""
            log(f"tiled matmul {qt} [{r['variant'] or 'default'}]: {r['rows']}x{r['cols']} by 256 rows: "
                f"{r['seconds'] * 1e3:.2f} ms, {r['TFLOPs']:.1f} TFLOP/s{gpu}  [{r['kernel']}]")
            result["matmul"].append(r)
    save()
    if args.matvec_only:
        args.models = ""

    from framework.model.model import Model
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    result["models"] = {}
    for name, spec in specs.items():
        if name not in args.models.split(","):
            continue
        path = write_model(name, spec, work / f"{name}-random.gguf", rng)
        model = Model(path)
        entry = result["models"][name] = {"arch": model.hp.arch, "file_bytes": path.stat().st_size}
        if args.matmul_variants:
            entry["prefill_variants"] = prefill_variants(dev, model, args.prompt, rng,
                                                         args.matmul_variants.split(";"), args.runs)
            for r in entry["prefill_variants"]:
                log(f"{name}: prefill [{r['variant'] or 'default'}] {r['median']:.0f} tok/s (runs {r['min']:.0f}.."
                    f"{r['max']:.0f}); GPU us/token {r.get('gpu_us_per_token_all')}: {r.get('gpu_us_per_token')}")
        reference = None
        if not args.skip_check:
            reference = attempt(result, f"{name}: the CPU plugin's logits", cpu_reference, model)
            entry["check"] = attempt(result, f"{name}: check", check_models_against_cpu, dev, model, reference)
            log(f"{name}: vulkan vs cpu plugin on random weights: {entry['check']}")
            entry["prefill_check"] = attempt(result, f"{name}: prefill check", check_prefill_against_cpu, dev, model,
                                             mm_variants)
            log(f"{name}: prefill of 64 tokens (tiled products) vs cpu plugin, per --matmul-variants setting: "
                f"{entry['prefill_check']}")
            save()
        if args.prefill_only:
            continue
        fusion_variants = args.unfuse_variants.split(";") if args.unfuse_variants else [None]
        for var in fusion_variants:          # the first is the one compared with PyTorch
            label = "" if var is None else f" [FRAMEWORK_VULKAN_UNFUSE={var!r}]"
            if var is not None:
                os.environ[UNFUSE_ENV] = var
                if not args.skip_check and var:      # "" is every fusion on: the check above
                    check = attempt(result, f"{name}{label}: check", check_models_against_cpu, dev, model, reference)
                    entry.setdefault("check_by_unfuse", {})[var] = check
                    log(f"{name}{label}: vulkan vs cpu plugin on random weights: {check}")
            tv = attempt(result, f"{name}{label}: speed", model_speed, dev, model, args.prompt, args.decode, rng,
                         args.runs)
            save()
            if tv is None:
                continue
            entry.setdefault("vulkan", tv)
            if var is not None:
                entry.setdefault("vulkan_by_unfuse", {})[var] = tv
            log(f"{name}{label}: vulkan:0 prefill {tv['prefill_tok_s']:.0f} tok/s (median of {args.runs}; "
                f"{tv['prefill_runs']['min']:.0f}..{tv['prefill_runs']['max']:.0f}), decode "
                f"{tv['decode_tok_s']:.1f} tok/s ({tv['decode_runs']['min']:.1f}..{tv['decode_runs']['max']:.1f}; "
                f"{tv['decode_ms_per_token']:.2f} ms/token, {tv['dispatches_per_decode_step']} dispatches a step); "
                f"prefill kernels {tv['prefill_kernels']}; decode kernels {tv['decode_kernels']}")
            h = tv["host"]
            log(f"  decode host breakdown (ms a step, {h['dispatches']} dispatches): wall {h['wall']}, program run "
                f"{h['run']}, synchronize {h['synchronize']}, to_host {h['to_host']}, rest {h['rest']}; GPU time of "
                f"the step's one pass {h.get('gpu_one_pass')}")
            if "split" in h:
                log(f"  decode host split (ms a step): {h['split']}")
            log("  cProfile of 32 decode steps, by own time:\n    " + "\n    ".join(h["cprofile_top"]))
            for phase in ("prefill", "decode"):
                if f"gpu_profile_{phase}" in tv:
                    log(f"  {phase}: GPU {tv[f'gpu_ms_per_{phase}_token']:.3f} ms/token; per kernel (us/token): "
                        f"{tv[f'gpu_profile_{phase}']}")
            save()
        os.environ.pop(UNFUSE_ENV, None)
        if not args.skip_torch:
            tt = attempt(result, f"{name}: PyTorch eager bf16", torch_model_speed, model.hp, model.hp.arch, args.prompt,
                         args.decode, args.runs)
            if tt is not None:
                entry["torch_eager_bf16"] = tt
                pre, dec = tt["prefill_runs"], tt["decode_runs"]
                tv = entry.get("vulkan")
                ratios = (f" -> vulkan/torch (medians): prefill {tv['prefill_tok_s'] / tt['prefill_tok_s']:.2f}x, "
                          f"decode {tv['decode_tok_s'] / tt['decode_tok_s']:.2f}x") if tv else ""
                log(f"{name}: PyTorch eager bf16 prefill {tt['prefill_tok_s']:.0f} tok/s ({pre['min']:.0f}.."
                    f"{pre['max']:.0f}), decode {tt['decode_tok_s']:.1f} tok/s ({dec['min']:.1f}..{dec['max']:.1f})"
                    f"{ratios}")
        save()
        del model
        path.unlink()

    if check_conformance and args.conformance == "all":
        t0 = time.perf_counter()
        result["conformance"] = conformance(dev, lambda case_id: not is_decode_case(case_id), deadline)
        log(f"conformance on {dev.name}, every other case: {result['conformance']} "
            f"({time.perf_counter() - t0:.0f} s)")
    result["summary"] = summary(result)
    save()
    dry = " (DRY RUN on a CPU adapter: not GPU figures)" if result.get("dry_run_on_cpu_adapter") else ""
    log("\n".join(["", f"SUMMARY{dry}", *result["summary"]]))
    log(f"wrote {out}")
    if result.get("errors") or any("CHECK FAILED" in line for line in result["summary"]) or any(
            result.get(k, {}).get("failed") for k in ("conformance_decode_steps", "conformance")):
        sys.exit(3)


if __name__ == "__main__":
    main()
