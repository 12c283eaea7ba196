"""Speed of the OpenCL plugin on a real GPU, next to the Vulkan plugin and PyTorch eager on the same GPU
(benchmarks/opencl_h200.sh runs it on the nvidia-h200 machine). Prints, in one run, in this order:

* the OpenCL devices, and opencl:0's data (it must be a GPU whose name holds --expect-device);
* a correctness check on that GPU: the op conformance cases on opencl:0 (and, with each model below,
  the random-weight model's logits against the CPU plugin);
* device-to-device copies: OpenCL's (enqueue_copy on opencl:0) and PyTorch's, bytes read + written a
  second: the bandwidth ceilings; which inline PTX opencl:0 takes (kernels.ptx's probes);
* both model architectures at their real sizes and tensor types with random weights (GGUF files
  written here from benchmarks/vulkan_models.json): prefill of --prompt tokens and decode tok/s,
  medians of timed runs after warm-up, on opencl:0 (with each --decode-variants setting of
  FRAMEWORK_OPENCL_MATVEC, the first the one reported; "" is the plugin's choice), on vulkan:0 and in
  PyTorch bf16 eager; what bounds decode on opencl:0: kernels a decode step, host time a step inside
  the program runs (enqueueing, no waiting) and per kernel enqueue, device time a step (profiling
  events, with the kernels that take it), and wall time a step; then --pairs decode runs of each plugin
  taken in turns (ABBA), opencl:0's and vulkan:0's medians and the median of the pairs' ratios (the
  host's speed drifts within a run, so the ratio of runs seconds apart is the one to quote), with
  opencl:0 also without its runs enqueued ahead (FRAMEWORK_OPENCL_PREENQUEUE=0), with them enqueued on the
  device's worker thread (=thread; the default is inline), and so with Python's own switch interval
  (FRAMEWORK_OPENCL_ENQUEUE_SWITCH_US=0) in the same turns, and opencl:0's report line (how kernels are
  enqueued, runs taken from ahead and released);
* the tiled product on (N, 4096) by 256 rows (prefill), TFLOP/s;
* each quantized matrix-vector kernel (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K; an (N, 4096) weight of
  --matvec-bytes by one row of x) with each --big-variants setting: weight bytes read a second over
  wall time of back-to-back runs and over device time (OpenCL profiling events), and their shares of
  both copies (goal: 60%);
* with --model-matvecs, each --variants setting on every matrix-vector product of both models' decode
  steps at their real sizes and types (device time, the L2 cache overwritten before each run, as in a
  decode step whose weights are many times the cache), and per model and setting the device time of a
  decode step's products (each product's time by how many a step makes): which setting is best.

Every matrix-vector result is checked against numpy (gguf's dequantization) on its first and last
1024 rows. Settings not yet measured --deadline seconds after the start are listed as skipped (the
models come first, so their figures never depend on the sweep's length), and the JSON (--out) is
written after each part, so a run stopped at its limit keeps what it measured.

Figures of a CPU OpenCL device (PoCL) are not GPU figures: the script refuses one unless told
(--allow-cpu-device; --gpu-kernels makes it take the GPU kernels, to try the script without a GPU).
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

import vulkan_bench as vb
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

T0 = time.perf_counter()
_log = vb.log


def log(*a):
    """vb.log with the seconds since the start (the run has a time limit on the lent machine)."""
    _log(f"[{time.perf_counter() - T0:4.0f} s]", *a)


vb.log = log                   # vulkan_bench's own lines too
MATVEC_ENV = "FRAMEWORK_OPENCL_MATVEC"
MATMUL_ENV = "FRAMEWORK_OPENCL_MATMUL"
QUANT = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K")


def guarded(what: str, fn, *args, **kwargs):
    """fn's result, or None with the error logged: one failing part (a kernel the driver will not build)
    must not cost the figures of the others in a run on a lent machine."""
    try:
        return fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001
        log(f"{what} FAILED: {type(e).__name__}: {str(e)[:2000]}")
        return None


def conformance(dev) -> dict:
    """Every conformance case on dev against the CPU plugin; a case that raises is listed with its error."""
    from framework.conformance.cases import all_cases, nmse
    from framework.core.scheduler import Executor, make_plan
    from framework.core.scheduler.verdicts import ask
    from framework.plugins.cpu.device import CpuDevice
    cpu = CpuDevice("f32")
    ok = refused = 0
    failed, errors = [], []
    for case in all_cases():
        b = case.build()
        if not all(ask(dev, n).ok for n in b.graph.nodes):     # the central checks too (op list, weight types)
            refused += 1
            continue
        try:
            outs = [[np.array(o) for o in Executor([d], b.weight_bytes).run(make_plan(b.graph, [d]), b.fresh_inputs())]
                    for d in (dev, cpu)]
        except Exception as e:  # noqa: BLE001
            errors.append((case.id, f"{type(e).__name__}: {str(e)[:300]}"))
            continue
        errs = [nmse(o, r) for o, r in zip(*outs)]
        if all(e <= b.tolerance for e in errs):
            ok += 1
        else:
            failed.append((case.id, max(errs)))
    return {"passed": ok, "refused": refused, "failed": failed, "errors": errors}


def opencl_devices():
    """(opencl:0, its profiling twin: the same OpenCL device with a queue that records kernel times)."""
    from framework.plugins.opencl.device import PROFILE_ENV, OpenCLDevice, devices
    devs = devices()
    for d in devs:
        log(f"  {d.describe()}")
    dev = devs[0]
    if not dev.available:
        raise SystemExit(f"opencl:0 unavailable: {dev.unavailable_reason}")
    os.environ[PROFILE_ENV] = "1"
    twin = OpenCLDevice(dev.index, dev.cl_device.platform, dev.cl_device)
    os.environ.pop(PROFILE_ENV)
    assert twin.profile is not None and dev.profile is None
    return dev, twin


def opencl_copy_bandwidth(dev, twin, nbytes: int = 2 << 30) -> dict:
    """Bytes read + written a second by enqueue_copy between two device buffers: wall time of 20 copies
    back to back, and device time from profiling events."""
    import pyopencl as cl
    nbytes = min(nbytes, dev.max_alloc // 2 * 2)
    out = {}
    for d, key in ((dev, "wall"), (twin, "device")):
        a, b = d.new_buffer(nbytes), d.new_buffer(nbytes)
        for _ in range(3):
            cl.enqueue_copy(d.queue, b, a, byte_count=nbytes)
        d.queue.finish()
        t0 = time.perf_counter()
        events = [cl.enqueue_copy(d.queue, b, a, byte_count=nbytes) for _ in range(20)]
        d.queue.finish()
        dt = (time.perf_counter() - t0) / 20
        if key == "device":
            dt = sum(e.profile.end - e.profile.start for e in events) * 1e-9 / 20
        out[key] = 2 * nbytes / dt / 1e9
        del a, b, events
        gc.collect()
    return out


def matvec_rows(qtype: str, target_bytes: int, k: int = 4096) -> int:
    per, size = GGML_QUANT_SIZES[Q[qtype]]
    return max(64, target_bytes // (k // per * size) // 64 * 64)


class MatvecCase:
    """One MUL_MAT of an (n, k) weight (random, of `qtype`) by m rows of x, uploaded once per device (the
    profiling twin; dev too where wall=True), with numpy's result (gguf's dequantization) on its first
    and last `check_rows` rows; measure() times it with one setting of `env`, the program rebuilt."""

    def __init__(self, dev, twin, qtype: str, n: int, k: int, rng, m: int = 1, env: str = MATVEC_ENV,
                 wall: bool = True, check_rows: int = 1024, extra: dict | None = None):
        from gguf.quants import dequantize

        from framework.core.graph import F32, GraphBuilder, LeafKind, leaf
        self.twin, self.qtype, self.n, self.k, self.m, self.env, self.wall = twin, qtype, n, k, m, env, wall
        self.extra = extra or {}
        raw = vb.random_raw(rng, qtype, (n, k))
        self.nbytes = int(raw.nbytes)
        x = rng.standard_normal((m, k)).astype(np.float32)
        self.sel = np.unique(np.r_[0:min(n, check_rows), max(0, n - check_rows):n])
        per, size = GGML_QUANT_SIZES[Q[qtype]]
        deq = dequantize(raw.reshape(n, k // per * size)[self.sel], Q[qtype]).astype(np.float64)
        self.want = x.astype(np.float64) @ deq.T
        b = GraphBuilder()
        wt = leaf("w", Q[qtype], (n, k), LeafKind.WEIGHT)
        graph = b.build([b.mul_mat(b.use(wt), b.input("x", F32, (m, k)))])
        self.setups = []
        for d in ((dev, twin) if wall else (twin,)):
            _plan, ex, frag, _prog = vb.program_for(d, graph, lambda t: raw)
            self.setups.append((d, ex, frag, [ex.weights[(d.name, id(wt))], d.from_host(x)]))

    def row(self, var: str) -> dict:
        return {"type": self.qtype, "variant": var, "rows": self.n, "cols": self.k, "m": self.m,
                "weight_bytes": self.nbytes, **self.extra}

    def measure(self, var: str, reps: int, flush=None, deadline: float | None = None) -> dict:
        """Wall time over `reps` back-to-back runs (where wall=True) and device time from profiling events
        (5 runs; with `flush`, a device buffer larger than the L2 cache, that buffer is overwritten before
        each, so that the weight comes from DRAM as in a decode step, not from the cache the previous run
        filled), with its split by kernel (x's quantization, the product); the result against numpy's. A
        setting that fails gives its error (the others still run); none is measured past `deadline`."""
        import pyopencl as cl

        from framework.backend import weight_words
        from framework.plugins.opencl import kernels
        row = self.row(var)
        if deadline is not None and time.perf_counter() > deadline:
            row["skipped"] = "out of time"
            return row
        n, k, m = self.n, self.k, self.m
        os.environ[self.env] = var
        try:
            if self.env == MATVEC_ENV:
                row["shape"] = kernels.matvec_shape(self.twin, k // 32, m, n, n * weight_words.row_bytes(self.qtype, k))
            for d, _ex, frag, args in self.setups:
                prog = d.compile(frag)
                (y,) = prog.run(args)
                got = d.to_host(y).reshape(m, n)[:, self.sel]
                row["nmse_vs_numpy"] = float(np.sum((got - self.want) ** 2) / np.sum(self.want ** 2))
                row["kernel"] = " + ".join(st.name.split(" ")[0] for st in prog.steps)
                if d is not self.twin:
                    t0 = time.perf_counter()
                    for _ in range(reps):
                        prog.run(args)
                    d.queue.finish()
                    row["seconds"] = (time.perf_counter() - t0) / reps
                else:
                    d.profile.clear()
                    for _ in range(5):
                        if flush is not None:
                            cl.enqueue_fill_buffer(d.queue, flush, np.uint32(0), 0, flush.size)
                        prog.run(args)
                    row["device_seconds"] = sum(v[0] for v in d.profile.values()) / 5
                    row["device_us_by_kernel"] = {key: round(v[0] / 5 * 1e6, 2) for key, v in d.profile.items()}
                del prog
        except Exception as e:  # noqa: BLE001  (one setting the driver refuses must not cost the others)
            row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:1500]}"
            log(f"matvec {self.qtype} {n}x{k} [{var}] FAILED: {row['error'][:400]}")
            return row
        finally:
            os.environ.pop(self.env, None)
        if self.wall:
            row["read_GBps"] = self.nbytes / row["seconds"] / 1e9
            row["TFLOPs"] = 2 * n * k * m / row["seconds"] / 1e12
        row["device_read_GBps"] = self.nbytes / row["device_seconds"] / 1e9
        return row


def matvec_bandwidth(dev, twin, qtype: str, n: int, k: int, rng, reps: int, m: int = 1,
                     variants: tuple[str, ...] = ("",), env: str = MATVEC_ENV, deadline: float | None = None
                     ) -> list[dict]:
    """MatvecCase's figures for each setting of `env` in turn."""
    case = MatvecCase(dev, twin, qtype, n, k, rng, m, env)
    out = [case.measure(var, reps, deadline=deadline) for var in variants]
    del case
    gc.collect()
    return out


def decode_matvecs(specs: dict, names: list[str]) -> list[tuple[str, str, int, int, int]]:
    """(model, type, rows, columns, count) of every matrix-vector product of a decode step, at the models'
    real sizes and types: each distinct quantized 2-D weight with how many a step reads (the layers'
    weights, the output head: output.weight, else the token embedding, tied), largest first."""
    out = []
    for name in names:
        tensors = {tn: (t, tuple(sh)) for tn, t, sh in specs[name]["tensors"] if len(sh) == 2}
        head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
        count: dict[tuple[str, tuple], int] = {}
        for tn, ts in tensors.items():
            if ts[0] in QUANT and (tn.startswith("blk.") or tn == head):
                count[ts] = count.get(ts, 0) + 1
        for (t, sh), c in sorted(count.items(), key=lambda kv: -kv[0][1][0] * kv[0][1][1]):
            out.append((name, t, sh[0], sh[1], c))
    return out


def decode_matvec_summary(rows: list[dict], copy_GBps: float) -> dict:
    """Per model and setting: the device time of a decode step's matrix-vector products (each measured
    product times how many a step makes), the weight bytes they read and the rate, and whether every
    product was measured and matched numpy; per model, the setting with the least time."""
    out: dict = {}
    for r in rows:
        m = out.setdefault(r["model"], {}).setdefault(r["variant"], {"us": 0.0, "bytes": 0, "measured": 0,
                                                                      "products": 0, "all_ok": True})
        m["products"] += 1
        if "device_seconds" not in r:
            m["all_ok"] = False
            continue
        m["measured"] += 1
        m["us"] += r["count"] * r["device_seconds"] * 1e6
        m["bytes"] += r["count"] * r["weight_bytes"]
        m["all_ok"] &= r["nmse_vs_numpy"] <= 1e-3
    for model in out.values():
        for m in model.values():
            m["GBps"] = m["bytes"] / m["us"] / 1e3 if m["us"] else None
            m["share_of_opencl_copy"] = m["GBps"] / copy_GBps if m["GBps"] else None
        complete = {v: m for v, m in model.items() if m["all_ok"] and m["measured"] == m["products"]}
        if complete:
            model["best"] = min(complete, key=lambda v: complete[v]["us"])
    return out


def log_matvec(r: dict, copy: dict, torch_copy) -> None:
    tag = f" [{r['variant']}]" if r["variant"] else " [default]"
    if "error" in r:
        return
    shape = ",".join(f"{k}={v}" for k, v in r.get("shape", {}).items())
    check = f"nmse vs numpy {r['nmse_vs_numpy']:.1e}" + ("  WRONG" if r["nmse_vs_numpy"] > 1e-3 else "")
    wall = f"wall {r['seconds'] * 1e6:.0f} us, {r['read_GBps']:.0f} GB/s; " if "seconds" in r else ""
    shares = f"{r['share_of_opencl_copy']:.0%} of OpenCL's copy" + (
        f", {r['share_of_torch_copy']:.0%} of PyTorch's" if r.get("share_of_torch_copy") else "")
    split = r.get("device_us_by_kernel", {})
    split = f" = {' + '.join(f'{k} {v:.1f}' for k, v in split.items())}" if len(split) > 1 else ""
    what = f"{r['model']} x{r['count']} " if "model" in r else ""
    log(f"matvec {what}{r['type']}{tag}: {r['rows']}x{r['cols']} ({r['weight_bytes'] / 2**20:.2f} MiB): {wall}device "
        f"{r['device_seconds'] * 1e6:.1f} us{split}, {r['device_read_GBps']:.0f} GB/s ({shares}); {check}  "
        f"[{r['kernel']}] ({shape})")


def decode_bounds(dev, twin, model, prompt, tok: int, n_steps: int = 32) -> dict:
    """What a decode step of opencl:0 costs: kernels, host time inside the program runs (enqueueing
    only: a run never waits; the run ahead enqueued inline, inside the run, so this is the enqueue cost),
    device time (profiling twin), wall time (inline too)."""
    from framework.plugins.opencl.program import ClProgram
    from framework.runtime.session import Session
    s = Session(model, [dev], n_ctx=1024, n_batch=len(prompt))
    s.eval(prompt)
    for _ in range(4):
        tok = int(np.argmax(s.eval([tok])))          # decode plan made and compiled (not timed)
    host = [0.0]
    real_run = ClProgram.run

    def timed_run(self, args):
        t0 = time.perf_counter()
        try:
            return real_run(self, args)
        finally:
            host[0] += time.perf_counter() - t0

    from framework.plugins.opencl.options import PREENQUEUE_ENV
    ClProgram.run = timed_run
    saved = os.environ.get(PREENQUEUE_ENV)
    os.environ[PREENQUEUE_ENV] = "inline"        # the run ahead enqueued inside the run: its host time is the cost
    try:
        t0 = time.perf_counter()
        for _ in range(n_steps):
            tok = int(np.argmax(s.eval([tok])))
        wall = (time.perf_counter() - t0) / n_steps
    finally:
        ClProgram.run = real_run
        if saved is None:
            os.environ.pop(PREENQUEUE_ENV, None)
        else:
            os.environ[PREENQUEUE_ENV] = saved
    kernels = sum(len(p.steps) for p in vb._programs(s, 1))
    t = Session(model, [twin], n_ctx=1024, n_batch=len(prompt))
    t.eval(prompt)
    for _ in range(4):
        t.eval([tok])
    twin.profile.clear()
    for _ in range(8):
        t.eval([tok])
    device = sum(v[0] for v in twin.profile.values()) / 8
    per_kernel = {k: round(v[0] / 8 * 1e6, 1) for k, v in sorted(twin.profile.items(), key=lambda kv: -kv[1][0])}
    return {"kernels_per_step": kernels, "host_ms_per_step": host[0] / n_steps * 1e3,
            "host_us_per_enqueue": host[0] / n_steps / kernels * 1e6, "device_ms_per_step": device * 1e3,
            "wall_ms_per_step": wall * 1e3, "device_us_per_step_by_kernel": per_kernel,
            "bound_by": "host (enqueueing)" if host[0] / n_steps > device else "device"}


def model_speed(dev, twin, model, n_prompt: int, n_decode: int, rng, runs: int, bounds: bool = True) -> dict:
    from framework.runtime.session import Session
    prompt = [int(t) for t in rng.integers(0, model.hp.n_vocab, size=n_prompt)]
    s = Session(model, [dev], n_ctx=1024, n_batch=n_prompt)
    t0 = time.perf_counter()
    s.eval(prompt)                                    # loads weights, builds and compiles (not timed)
    first = time.perf_counter() - t0
    prefill = vb.vulkan_prefill(s, prompt, runs)      # (generic: resets, evaluates, medians)
    from framework.runtime.greedy import pipelined
    for path in ("greedy", "logits"):               # both paths' programs compiled (and captured)
        decode_run(s, prompt, 8, path)
    s.reset()
    tok = int(np.argmax(s.eval(prompt)))            # decode_bounds' first token
    # greedy: the framework's greedy decoding (runtime/greedy.py: the argmax on the device where it can, each step
    # queued before the step before's token is read); logits: eval's logits read back, np.argmax here, step by step
    times: dict = {"greedy": [], "logits": []}
    for i in range(max(1, runs // 2 + 1)):
        for path in (("greedy", "logits") if i % 2 == 0 else ("logits", "greedy")):
            times[path].append(decode_run(s, prompt, n_decode, path))
    decode, logits = (vb.spread(times[k], n_decode) for k in ("greedy", "logits"))
    out = {"prefill_tok_s": prefill["median"], "prefill_runs": prefill, "decode_tok_s": decode["median"],
           "decode_runs": decode, "decode_ms_per_token": 1e3 / decode["median"], "first_prefill_s": first,
           "decode_logits_path_tok_s": logits["median"], "decode_logits_path_runs": logits,
           "decode_pipelined": pipelined(s),
           "prefill_kernels": sorted({st.name.split(" ")[0] for p in vb._programs(s, n_prompt) for st in p.steps})}
    out["decode_bounds"] = guarded("decode bounds", decode_bounds, dev, twin, model, prompt, tok) if bounds else None
    return out


def decode_run(s, prompt: list[int], n_decode: int, path: str) -> float:
    """Seconds of n_decode greedy decode steps in the steady state: from the token of the first decode step
    after the prompt to that of the (n_decode + 1)th, through runtime/greedy.py (path "greedy": a step's host
    work may run before the step before is done) or eval's logits and np.argmax step by step ("logits")."""
    from framework.runtime.greedy import greedy_tokens
    s.reset()
    if path == "greedy":
        tokens = greedy_tokens(s, prompt, n_decode + 2)
        next(tokens)
        next(tokens)
        t0 = time.perf_counter()
        for _ in tokens:
            pass
        return time.perf_counter() - t0
    t = int(np.argmax(s.eval(prompt)))
    t = int(np.argmax(s.eval([t])))
    t0 = time.perf_counter()
    for _ in range(n_decode):
        t = int(np.argmax(s.eval([t])))
    return time.perf_counter() - t0


def decode_interleaved(dev, vk, model, n_prompt: int, n_decode: int, rng, pairs: int) -> dict:
    """Decode on opencl:0 and vulkan:0 in turns (ABBA: a pair's order flips each time), so both see the same
    machine: the host's speed drifts over a run by up to half. n_decode tokens after an n_prompt prompt per
    run, as model_speed's; medians of each device's runs and of the pairs' ratios."""
    from framework.runtime.session import Session
    prompt = [int(t) for t in rng.integers(0, model.hp.n_vocab, size=n_prompt)]
    sessions = {}
    for key, d in (("opencl", dev), ("vulkan", vk)):
        s = sessions[key] = Session(model, [d], n_ctx=1024, n_batch=n_prompt)
        s.eval(prompt)
        for _ in range(8):
            s.eval([1])                               # the decode plan compiled (not timed)

    def decode_run(s) -> float:
        s.reset()
        s.eval(prompt)
        t0 = time.perf_counter()
        t = 1
        for _ in range(n_decode):
            t = int(np.argmax(s.eval([t])))
        return n_decode / (time.perf_counter() - t0)
    from framework.plugins.opencl.options import PREENQUEUE_ENV, SWITCH_ENV
    # opencl:0 in other settings, in the same turns: without runs enqueued ahead, with them enqueued on the
    # device's worker thread (the default is inline, on the caller's), and so with Python's own switch interval
    series = {"opencl": {}, "vulkan": {}, "plain": {PREENQUEUE_ENV: "0"}, "thread": {PREENQUEUE_ENV: "thread"},
              "thread_pyswitch": {PREENQUEUE_ENV: "thread", SWITCH_ENV: "0"}}
    for key in series:
        sessions.setdefault(key, sessions["opencl"])
    rates: dict = {k: [] for k in series}
    for i in range(pairs):
        for key in (list(series) if i % 2 == 0 else list(series)[::-1]):
            os.environ.update(series[key])
            try:
                rates[key].append(decode_run(sessions[key]))
            finally:
                for name in series[key]:
                    os.environ.pop(name, None)
    ratios = [a / b for a, b in zip(rates["opencl"], rates["vulkan"])]
    gains = [a / b for a, b in zip(rates["opencl"], rates["plain"])]
    med = {k: float(np.median(v)) for k, v in rates.items()}
    return {"pairs": pairs, "opencl_tok_s": rates["opencl"], "vulkan_tok_s": rates["vulkan"],
            "opencl_plain_tok_s": rates["plain"], "opencl_thread_tok_s": rates["thread"],
            "opencl_thread_pyswitch_tok_s": rates["thread_pyswitch"],
            "opencl_median": med["opencl"], "vulkan_median": med["vulkan"], "opencl_plain_median": med["plain"],
            "opencl_thread_median": med["thread"], "opencl_thread_pyswitch_median": med["thread_pyswitch"],
            "thread_over_default_median": float(np.median([a / b for a, b in zip(rates["thread"], rates["opencl"])])),
            "ratio_median": float(np.median(ratios)), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ahead_gain_median": float(np.median(gains)), "report_line": dev.report_line()}


def log_model(name: str, to: dict, tag: str) -> None:
    b = to["decode_bounds"] or {}
    log(f"{name}: opencl:0{tag} prefill {to['prefill_tok_s']:.0f} tok/s ({to['prefill_runs']['min']:.0f}.."
        f"{to['prefill_runs']['max']:.0f}), decode {to['decode_tok_s']:.1f} tok/s ({to['decode_runs']['min']:.1f}.."
        f"{to['decode_runs']['max']:.1f}; {to['decode_ms_per_token']:.2f} ms/token); prefill kernels "
        f"{to['prefill_kernels']}")
    if b:
        log(f"  decode step: {b['kernels_per_step']} kernels, host {b['host_ms_per_step']:.2f} ms "
            f"({b['host_us_per_enqueue']:.1f} us an enqueue), device {b['device_ms_per_step']:.2f} ms, wall "
            f"{b['wall_ms_per_step']:.2f} ms: bound by the {b['bound_by']}; device us by kernel "
            f"{b['device_us_per_step_by_kernel']}")


def models_section(args, result, specs, dev, twin, vk, rng, work: Path, save) -> None:
    """Both models (random weights, real shapes and types): the check against the CPU plugin, prefill and
    decode on opencl:0 with each --decode-variants setting (the first with what bounds decode), vulkan:0
    and PyTorch eager."""
    from framework.model.model import Model
    result["models"] = {}
    decode_variants = args.decode_variants.split(";")
    for name, spec in specs.items():
        if name not in args.models.split(","):
            continue
        path = vb.write_model(name, spec, work / f"{name}-random.gguf", rng)
        model = Model(path)
        entry = result["models"][name] = {"arch": model.hp.arch}
        if not args.skip_check:
            entry["check"] = guarded(f"{name} check", vb.check_models_against_cpu, dev, model)
            log(f"{name}: opencl:0 vs cpu plugin on random weights: {entry['check']}")
        for i, var in enumerate(decode_variants):
            os.environ[MATVEC_ENV] = var
            tag = f" [{MATVEC_ENV}={var}]" if var else ""
            to = guarded(f"{name} on opencl:0{tag}", model_speed, dev, twin, model, args.prompt, args.decode, rng,
                         args.runs, bounds=i == 0)
            os.environ.pop(MATVEC_ENV)
            entry["opencl" if i == 0 else f"opencl[{var}]"] = to
            if to is not None:
                log_model(name, to, tag)
        to = entry.get("opencl")
        if to is not None and len(decode_variants) > 1:
            for var in decode_variants[1:]:
                other = entry.get(f"opencl[{var}]")
                if other:
                    log(f"{name}: decode [{decode_variants[0] or 'default'}] / [{var}]: "
                        f"{to['decode_tok_s'] / other['decode_tok_s']:.2f}x")
        if vk is not None and to is not None:
            try:
                entry["vulkan"] = tv = vb.model_speed(vk, model, args.prompt, args.decode, rng, args.runs)
                log(f"{name}: vulkan:0 prefill {tv['prefill_tok_s']:.0f} tok/s, decode {tv['decode_tok_s']:.1f} tok/s "
                    f"({tv['dispatches_per_decode_step']} dispatches a step) -> opencl/vulkan: prefill "
                    f"{to['prefill_tok_s'] / tv['prefill_tok_s']:.2f}x, decode "
                    f"{to['decode_tok_s'] / tv['decode_tok_s']:.2f}x")
            except Exception as e:  # noqa: BLE001  (report, keep the rest)
                log(f"{name}: vulkan:0 failed: {type(e).__name__}: {e}")
            if args.pairs:
                entry["interleaved"] = il = guarded(f"{name} interleaved decode", decode_interleaved, dev, vk, model,
                                                    args.prompt, args.decode, rng, args.pairs)
                if il:
                    log(f"{name}: decode in turns ({il['pairs']} pairs): opencl:0 {il['opencl_median']:.1f} tok/s, "
                        f"vulkan:0 {il['vulkan_median']:.1f} tok/s; opencl/vulkan {il['ratio_median']:.2f}x "
                        f"(pairs {il['ratio_min']:.2f}x..{il['ratio_max']:.2f}x); opencl:0 without runs enqueued "
                        f"ahead {il['opencl_plain_median']:.1f} tok/s (with/without {il['ahead_gain_median']:.2f}x); "
                        f"enqueued ahead on the worker thread {il['opencl_thread_median']:.1f} tok/s (thread/default "
                        f"{il['thread_over_default_median']:.2f}x); on the thread with Python's switch interval "
                        f"{il['opencl_thread_pyswitch_median']:.1f} tok/s")
                    log(f"  {il['report_line']}")
        if not args.skip_torch and to is not None:
            try:
                entry["torch_eager_bf16"] = tt = vb.torch_model_speed(model.hp, model.hp.arch, args.prompt,
                                                                      args.decode, args.runs)
                log(f"{name}: PyTorch eager bf16 prefill {tt['prefill_tok_s']:.0f} tok/s, decode "
                    f"{tt['decode_tok_s']:.1f} tok/s -> opencl/torch: prefill "
                    f"{to['prefill_tok_s'] / tt['prefill_tok_s']:.2f}x, "
                    f"decode {to['decode_tok_s'] / tt['decode_tok_s']:.2f}x")
            except Exception as e:  # noqa: BLE001
                log(f"{name}: PyTorch baseline failed: {type(e).__name__}: {e}")
        del model
        path.unlink()
        gc.collect()
        save()


def flush_buffer(twin):
    """A device buffer of twice the L2 cache (at least 256 MiB): overwritten before a timed product, so
    its weight is read from DRAM, as in a decode step whose weights are many times the cache."""
    l2 = int(twin.cl_device.global_mem_cache_size or 0)
    return twin.new_buffer(min(twin.max_alloc, max(256 << 20, 2 * l2)) // 4 * 4)


def sweep_section(args, result, specs, dev, twin, copy, torch_copy, rng, deadline: float, save) -> None:
    """The matrix-vector kernels: each --big-variants setting on an (N, 4096) weight of --matvec-bytes per
    type (the goal's figure), then each --variants setting on every product of both models' decode steps
    (device time, L2 flushed before each run), settings left at the deadline skipped and listed."""
    result["matvec"] = []
    big = tuple(args.big_variants.split(";"))
    for qt in () if args.skip_big else QUANT:
        n = matvec_rows(qt, args.matvec_bytes)
        for r in guarded(f"matvec {qt}", matvec_bandwidth, dev, twin, qt, n, 4096, rng, args.reps, variants=big,
                         deadline=deadline) or []:
            if "device_seconds" in r:
                r["share_of_opencl_copy"] = r["device_read_GBps"] / copy["device"]
                r["share_of_torch_copy"] = r["device_read_GBps"] / torch_copy if torch_copy else None
                log_matvec(r, copy, torch_copy)
            result["matvec"].append(r)
        save()
    result["model_matvec"] = []
    if args.model_matvecs:
        decode_sweep(args, result, specs, dev, twin, copy, rng, deadline, save)
    skipped = [f"{r.get('model', '')} {r['type']} {r['rows']}x{r['cols']} [{r['variant']}]".strip()
               for r in result["matvec"] + result["model_matvec"] if r.get("skipped")]
    if skipped:
        log(f"not measured (past the deadline, --deadline {args.deadline:.0f} s): {len(skipped)}: {skipped}")
    save()


def decode_sweep(args, result, specs, dev, twin, copy, rng, deadline: float, save) -> None:
    """Each --variants setting on every matrix-vector product of both models' decode steps, and per model
    and setting a decode step's product time (decode_matvec_summary)."""
    flush = flush_buffer(twin)
    log(f"every matrix-vector product of a decode step, device time, the L2 cache flushed before each run "
        f"({flush.size >> 20} MiB overwritten; L2 {twin.cl_device.global_mem_cache_size >> 20} MiB):")
    variants = tuple(args.variants.split(";"))
    cases = []
    for name, qt, n, k, count in decode_matvecs(specs, [m for m in args.models.split(",") if m]):
        case = guarded(f"matvec {name} {qt} {n}x{k}", MatvecCase, dev, twin, qt, n, k, rng, wall=False,
                       extra={"model": name, "count": count})
        if case is not None:
            cases.append(case)
    # setting by setting over every product: a run cut short by the deadline still has whole settings
    for var in variants:
        for case in cases:
            r = case.measure(var, 0, flush=flush, deadline=deadline)
            if "device_seconds" in r:
                r["share_of_opencl_copy"] = r["device_read_GBps"] / copy["device"]
                log_matvec(r, copy, None)
            result["model_matvec"].append(r)
        save()
    del cases
    gc.collect()
    result["decode_matvec_summary"] = summary = decode_matvec_summary(result["model_matvec"], copy["device"])
    for model, by_var in summary.items():
        best = by_var.get("best")
        best = "none complete" if best is None else f"[{best or 'default'}]"
        log(f"{model}: a decode step's matrix-vector products, device time by setting (L2 flushed; best: {best}):")
        complete_first = lambda vm: (not vm[1]["all_ok"] or vm[1]["measured"] < vm[1]["products"], vm[1]["us"])  # noqa: E731
        for var, m in sorted(((v, m) for v, m in by_var.items() if v != "best"), key=complete_first):
            rate = f"{m['GBps']:.0f} GB/s, {m['share_of_opencl_copy']:.0%} of the copy" if m["GBps"] else "-"
            log(f"  [{var or 'default'}] {m['us']:.0f} us ({rate}); {m['measured']}/{m['products']} products measured"
                f"{'' if m['all_ok'] else ', NOT all measured or matching numpy'}")
    save()


def final_summary(result: dict) -> None:
    """The run's figures in a few lines at its end (the device tool returns the output's tail)."""
    copy = (result.get("opencl_copy_GBps") or {}).get("device")
    log(f"SUMMARY: OpenCL device copy {copy:.0f} GB/s; inline PTX: {result.get('inline_ptx')}; conformance "
        f"{result.get('conformance', {}).get('passed', '-')} passed, "
        f"failed {result.get('conformance', {}).get('failed')}")
    for name, e in result.get("models", {}).items():
        runs = {k: v for k, v in e.items() if k.startswith("opencl") and v}
        parts = [f"{k} {v['decode_tok_s']:.1f} tok/s decode, {v['prefill_tok_s']:.0f} prefill" for k, v in runs.items()]
        if "vulkan" in e:
            parts.append(f"vulkan:0 {e['vulkan']['decode_tok_s']:.1f} decode")
        if e.get("interleaved"):
            il = e["interleaved"]
            parts.append(f"in turns: opencl {il['opencl_median']:.1f} / vulkan {il['vulkan_median']:.1f} tok/s = "
                         f"{il['ratio_median']:.2f}x (opencl without runs ahead {il['opencl_plain_median']:.1f}, "
                         f"thread {il['opencl_thread_median']:.1f}, thread with Python's switch interval "
                         f"{il['opencl_thread_pyswitch_median']:.1f})")
        b = (e.get("opencl") or {}).get("decode_bounds") or {}
        if b:
            parts.append(f"step: {b['kernels_per_step']} kernels, host {b['host_ms_per_step']:.2f} ms, device "
                         f"{b['device_ms_per_step']:.2f} ms, bound by the {b['bound_by']}")
        log(f"SUMMARY {name}: check {e.get('check')}; " + "; ".join(parts))
    by_type: dict = {}
    for r in result.get("matvec", []):
        if "device_read_GBps" in r:
            by_type.setdefault(r["type"], []).append(r)
    for qt, rows in by_type.items():
        best = max(rows, key=lambda r: r["device_read_GBps"])
        cells = ", ".join(f"[{r['variant'] or 'default'}] {r['device_read_GBps']:.0f}"
                          + ("!" if r["nmse_vs_numpy"] > 1e-3 else "") for r in rows)
        log(f"SUMMARY matvec {qt} {rows[0]['rows']}x{rows[0]['cols']}: GB/s {cells}; "
            f"best [{best['variant'] or 'default'}] {best['share_of_opencl_copy']:.0%} of the copy (goal 60%)")
    for model, by_var in result.get("decode_matvec_summary", {}).items():
        ranked = sorted(((v, m) for v, m in by_var.items() if v != "best" and m["all_ok"]
                         and m["measured"] == m["products"]), key=lambda vm: vm[1]["us"])
        cells = ", ".join(f"[{v or 'default'}] {m['us']:.0f}" for v, m in ranked)
        log(f"SUMMARY {model} decode-step products, us (complete settings, fastest first): {cells}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--work", default="/tmp/opencl_bench")
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--runs", type=int, default=5, help="timed prefill runs per model (decode: runs // 2 + 1)")
    ap.add_argument("--pairs", type=int, default=6, help="decode runs of each plugin taken in turns (0: none)")
    ap.add_argument("--matvec-bytes", type=int, default=512 << 20)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--big-variants", default="",
                    help="';'-separated FRAMEWORK_OPENCL_MATVEC settings on the --matvec-bytes weights")
    ap.add_argument("--variants", default="",
                    help="';'-separated FRAMEWORK_OPENCL_MATVEC settings on the models' products (--model-matvecs)")
    ap.add_argument("--decode-variants", default="",
                    help="';'-separated FRAMEWORK_OPENCL_MATVEC settings for the models' runs, the first reported as "
                         "opencl:0's (with what bounds decode); '' is the plugin's choice")
    ap.add_argument("--deadline", type=float, default=1e9,
                    help="seconds from the start after which no further matrix-vector setting is measured")
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--skip-vulkan", action="store_true")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--skip-big", action="store_true", help="leave out the --matvec-bytes weights")
    ap.add_argument("--matvec-only", action="store_true", help="only the copies and the matrix kernels")
    ap.add_argument("--skip-matmul", action="store_true", help="leave out the tiled product (prefill)")
    ap.add_argument("--model-matvecs", action="store_true",
                    help="also each --variants setting on every matrix-vector product of the models' decode steps "
                         "(device time)")
    ap.add_argument("--allow-cpu-device", action="store_true")
    ap.add_argument("--gpu-kernels", action="store_true",
                    help="a CPU device (PoCL) takes the GPU kernels: to try this script without a GPU (its "
                         "timings are not GPU figures)")
    ap.add_argument("--expect-device", default="NVIDIA", help="refuse an OpenCL device whose name lacks this")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {"args": vars(args)}
    out = Path(args.out) / "opencl_h200.json"

    def save():                      # after every part: a run stopped at its limit keeps what it measured
        result["elapsed_s"] = time.perf_counter() - T0
        out.write_text(json.dumps(result, indent=1, default=str))

    import pyopencl as cl
    log(f"pyopencl {cl.VERSION_TEXT}; platforms: {[p.name for p in cl.get_platforms()]}")
    dev, twin = opencl_devices()
    result["device"] = {k: v for k, v in dev.data.items() if k != "extensions"}
    result["physical_id"] = dev.physical_id
    log(f"opencl:0: {dev.data['device']} ({dev.data['platform']}, {dev.data['version']}, driver "
        f"{dev.data['driver_version']}), physical id {dev.physical_id}, {dev.data['compute_units']} compute units, "
        f"allocations up to {dev.max_alloc / 2**30:.1f} GiB, integer dot product {dev.int_dot}, fp16 "
        f"{dev.data['fp16']}, subgroups {dev.data['subgroups']}")
    if dev.is_cpu and not args.allow_cpu_device:
        raise SystemExit("opencl:0 is a CPU device: its timings are not GPU figures")
    if not dev.is_cpu and args.expect_device.lower() not in dev.data["device"].lower():
        raise SystemExit(f"opencl:0 is {dev.data['device']!r}, not the expected {args.expect_device!r} GPU")
    if args.gpu_kernels:
        dev.is_cpu = twin.is_cpu = False
        log("--gpu-kernels: the CPU device takes the GPU kernels (timings are not GPU figures)")

    vk = None
    if not args.skip_vulkan and not args.matvec_only:
        try:
            vk = vb.vulkan_device()
            result["vulkan_physical_id"] = vk.physical_id
            same = "the same chip as opencl:0" if vk.physical_id == dev.physical_id else "NOT reported as the same chip"
            log(f"vulkan:0: {vk.data['adapter']}, physical id {vk.physical_id}: {same}")
        except SystemExit as e:        # report, and keep the OpenCL figures
            log(f"vulkan:0 not measured: {e}")

    if not args.skip_check:
        t0 = time.perf_counter()
        result["conformance"] = conformance(dev)
        log(f"conformance on opencl:0: {result['conformance']} ({time.perf_counter() - t0:.0f} s)")

    copy = opencl_copy_bandwidth(dev, twin)        # (no guard: without it no share means anything)
    result["opencl_copy_GBps"] = copy
    log(f"OpenCL device-to-device copy: {copy['wall']:.0f} GB/s wall, {copy['device']:.0f} GB/s device time "
        f"(read + written)")
    torch_copy = None
    if not args.skip_torch:
        torch_copy = vb.torch_copy_bandwidth()
        log(f"PyTorch device-to-device copy: {torch_copy:.0f} GB/s (read + written)")
    result["torch_copy_GBps"] = torch_copy

    from framework.plugins.opencl.kernels import ptx
    ptx(dev)
    result["inline_ptx"] = dev.data.get("inline_ptx")
    log(f"inline PTX on opencl:0: {dev.data.get('inline_ptx')} (twin: {ptx(twin)})")
    from framework.plugins.opencl import enqueue
    result["enqueue"] = enqueue.how()
    log(f"kernels enqueued by {result['enqueue']}")
    result["extensions"] = sorted(str(dev.cl_device.extensions).split())
    log(f"opencl:0 extensions: {' '.join(result['extensions'])}")
    save()
    specs = json.loads((ROOT / "benchmarks" / "vulkan_models.json").read_text())
    if not args.matvec_only:       # the models first: their figures must not depend on the sweep's time
        models_section(args, result, specs, dev, twin, vk, rng, work, save)

    result["matmul"] = []
    for qt in () if args.skip_matmul else ("Q8_0", "Q4_K", "Q6_K"):
        for r in guarded(f"tiled matmul {qt}", matvec_bandwidth, dev, twin, qt, matvec_rows(qt, 64 << 20), 4096, rng,
                         10, m=256, env=MATMUL_ENV) or []:
            if "error" in r:
                continue
            r["device_TFLOPs"] = 2 * r["rows"] * r["cols"] * 256 / r["device_seconds"] / 1e12
            log(f"tiled matmul {qt}: {r['rows']}x{r['cols']} by 256 rows: {r['seconds'] * 1e3:.2f} ms wall, "
                f"{r['TFLOPs']:.1f} TFLOP/s; device {r['device_TFLOPs']:.1f} TFLOP/s; nmse vs numpy "
                f"{r['nmse_vs_numpy']:.1e}  [{r['kernel']}]")
            result["matmul"].append(r)
    save()
    sweep_section(args, result, specs, dev, twin, copy, torch_copy, rng, T0 + args.deadline, save)
    save()
    guarded("summary", final_summary, result)
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
