"""The measurements behind the plugin's choices (docs/openvino.md), reproducible:

    python benchmarks/openvino_measure.py fc          # compressed FullyConnected forms, 1 thread
    python benchmarks/openvino_measure.py cpu-time    # decode and prefill CPU time per token,
                                                      # openvino:CPU and llama.cpp, 1 thread each
    python benchmarks/openvino_measure.py precision   # INFERENCE_PRECISION_HINT f32 / bf16 / f16
    python benchmarks/openvino_measure.py rope        # the pair swap of rope: Gather against Roll
    python benchmarks/openvino_measure.py fused       # Q, K, V and gate, up as separate products
                                                      # or fused into two (SmolLM2's shapes)
    python benchmarks/openvino_measure.py floor       # a decode step's time per kernel kind and per
                                                      # weight shape, from OpenVINO's profiler, and the
                                                      # ceiling the FullyConnected kernels alone leave
    python benchmarks/openvino_measure.py fused-model # both models with their products fused and separate,
                                                      # interleaved in one process: tok/s and logits
    python benchmarks/openvino_measure.py ab SETTING=A,B [model ...] [rounds=N]
                                                      # a translate setting's values (e.g. OFFSETS=product,
                                                      # zero_point, or the device's DYNAMIC_QUANTIZATION=0,32),
                                                      # each model compiled with each, 1 thread,
                                                      # interleaved with llama.cpp: tok/s, CPU time, logits
    python benchmarks/openvino_measure.py zero-points # Q4_1's and Q4_K's block offsets as their own product or
                                                      # as a float zero point, per weight shape, 1 thread
    python benchmarks/openvino_measure.py decode-gap [model] [dq=N,..] [layers=N,..]
                                                      # decode against prefill with activations quantized,
                                                      # over the first layers of a model
    python benchmarks/openvino_measure.py host        # a decode step's wall time: OpenVINO's infer, the
                                                      # program's feeding and cache writes, the session
    python benchmarks/openvino_measure.py threads     # openvino:CPU with OpenVINO's own thread count (one per
                                                      # core) and with INFERENCE_NUM_THREADS 1, against
                                                      # llama.cpp on 1 thread, interleaved: decode tok/s
    python benchmarks/openvino_measure.py big-decode FILE.gguf [profile] [offsets=product|zero_point] [dq=0,16,auto]
                                                      [steps=32] [rounds=5]
                                                      # decode of a large model with one compiled model (the
                                                      # prompt fed a token a step), against llama.cpp in a
                                                      # child process, interleaved; peak resident memory
    python benchmarks/openvino_measure.py fc-forms [all]
                                                      # the 1.5B's dominant compressed products, 1 thread, in
                                                      # every weight form and group size, with
                                                      # DYNAMIC_QUANTIZATION_GROUP_SIZE 0, 16, 32 and 128
    python benchmarks/openvino_measure.py offset-forms
                                                      # the K-quants' block offsets product, 1 thread: a float32
                                                      # matrix against the file's 6-bit minimums as u8 codes
    python benchmarks/openvino_measure.py row-parts [rows=N,N,...] [dq=N]
                                                      # a 4-bit product of many rows whole or in parts of at most
                                                      # translate.PRODUCT_ROWS (or each N), 1 query and 64, 1 thread
    python benchmarks/openvino_measure.py own-head [profile]
                                                      # attention over cache rows: each kv head's query group
                                                      # against its own rows (grouped), or every head against
                                                      # all rows with its own picked by a Gather or a one-hot sum
    python benchmarks/openvino_measure.py model-memory [model or GGUF path ...]
                                                      # resident memory a compiled decode model adds: one more
                                                      # KV length with one model per length, and with one model
                                                      # for every length (kv_programs.py)
    python benchmarks/openvino_measure.py rows-dq [model ...] [dq=16,32] [rows=1,8] [rounds=N]
                                                      # batched decode steps of 1 and 8 sequences (a server's
                                                      # step) with each DYNAMIC_QUANTIZATION_GROUP_SIZE, the
                                                      # settings taking turns step by step in one process,
                                                      # 2 threads: median ms a step
    python benchmarks/openvino_measure.py dynquant    # DYNAMIC_QUANTIZATION_GROUP_SIZE 0 against
                                                      # OpenVINO's default: a 4096x4096 int4 product,
                                                      # decode speed, and llama.cpp's reference
                                                      # bounds (tests/reference_checks.py)

CPU time (not wall time) on one thread is what other work on the machine disturbs least.
Tokens per second against llama.cpp on two threads come from `framework bench --backends openvino:CPU`.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def fc(n: int = 1536, k: int = 576, layers: int = 30) -> None:
    """One thread, M = 1: the time of an (n, k) product for each weight form OpenVINO can fuse."""
    import openvino as ov
    from openvino import opset13 as ops
    rng = np.random.default_rng(0)
    g = 32

    def weight(kind: str, zp: bool):
        if kind == "f32":
            return ops.constant((rng.standard_normal((n, k)) * 0.01).astype(np.float32))
        if kind in ("i4", "i8"):
            lo, hi = (-8, 8) if kind == "i4" else (-127, 127)
            w = ops.constant(rng.integers(lo, hi, (n, k // g, g)).astype(np.int8), getattr(ov.Type, kind))
        else:
            hi = 16 if kind == "u4" else 255
            w = ops.constant(rng.integers(0, hi, (n, k // g, g)).astype(np.uint8), getattr(ov.Type, kind))
        x = ops.convert(w, ov.Type.f32)
        if zp:
            x = ops.subtract(x, ops.constant(rng.uniform(0, 15, (n, k // g, 1)).astype(np.float32)))
        s = ops.convert(ops.constant(rng.uniform(0.001, 0.01, (n, k // g, 1)).astype(np.float16)), ov.Type.f32)
        return ops.reshape(ops.multiply(x, s), ops.constant(np.array([n, k], dtype=np.int64)), False)

    core = ov.Core()
    for kind, zp in (("f32", False), ("i8", False), ("u8", True), ("u4", True), ("i4", False)):
        p = ops.parameter([1, k], ov.Type.f32, name="x")
        model = ov.Model([ops.concat([ops.matmul(p, weight(kind, zp), False, True) for _ in range(layers)], 0)], [p])
        req = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1}
                                 ).create_infer_request()
        x = np.ones((1, k), dtype=np.float32)
        for _ in range(5):
            req.infer([x])
        best = min(_timed(req.infer, [x]) for _ in range(40))
        print(f"{kind}{' with a float zero point' if zp else ''}: {best / layers * 1e6:.0f} us per ({n}, {k}) product")


def _timed(fn, *args) -> float:
    t = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t


def _openvino_cpu_time(name: str, ids: list[int], precision: str = "f32") -> tuple[float, float]:
    from framework.model.default import model_path
    from framework.model.model import Model
    from framework.plugins.openvino_npu.device import OpenVinoDevice
    from framework.runtime.session import Session

    class OneThread(OpenVinoDevice):
        def compile_config(self):
            return {**super().compile_config(), "INFERENCE_NUM_THREADS": 1}

    model = Model(model_path(name))
    s = Session(model, [OneThread("CPU", precision=precision)], n_ctx=512)
    s.eval(ids)
    s.eval([5])
    return _cpu_time_per_token(s.reset, s.eval, ids)


def _cpu_time_per_token(reset, evaluate, ids: list[int], rounds: int = 3, steps: int = 20) -> tuple[float, float]:
    """(decode, prefill) CPU seconds per token, the best of ``rounds``: a prefill of ``ids``, then
    ``steps`` one-token decodes."""
    decode = prefill = 1e9
    for _ in range(rounds):
        reset()
        c = time.process_time()
        evaluate(ids)
        prefill = min(prefill, (time.process_time() - c) / len(ids))
        c = time.process_time()
        for _ in range(steps):
            evaluate([5])
        decode = min(decode, (time.process_time() - c) / steps)
    return decode, prefill


def _llama_cpu_time(name: str, ids: list[int]) -> tuple[float, float] | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from framework.model.default import model_path
    path = model_path(name)
    llm = Llama(str(path), n_ctx=512, n_batch=512, n_threads=1, n_threads_batch=1, verbose=False)
    times = _cpu_time_per_token(llm.reset, llm.eval, ids)
    llm.close()
    return times


def _ids(name: str) -> list[int]:
    from framework.bench import prompt_ids
    from framework.model.default import model_path
    from framework.model.model import Model
    return prompt_ids(Model(model_path(name)).tokenizer, 128)


def cpu_time() -> None:
    for name in ("smollm2", "gemma3"):
        ids = _ids(name)
        d, p = _openvino_cpu_time(name, ids)
        print(f"{name} openvino:CPU: decode {d * 1e3:.1f} ms, prefill {p * 1e3:.2f} ms CPU time per token (1 thread)")
        ref = _llama_cpu_time(name, ids)
        if ref:
            print(f"{name} llama.cpp:    decode {ref[0] * 1e3:.1f} ms, prefill {ref[1] * 1e3:.2f} ms "
                  f"CPU time per token (1 thread)")


def precision() -> None:
    ids = _ids("smollm2")
    for hint in ("f32", "bf16", "f16"):
        try:
            d, p = _openvino_cpu_time("smollm2", ids, hint)
        except Exception as e:  # noqa: BLE001 - a hint this CPU does not take: the device says so
            print(f"INFERENCE_PRECISION_HINT {hint}: {type(e).__name__}: {e}")
            continue
        print(f"INFERENCE_PRECISION_HINT {hint}: decode {d * 1e3:.1f} ms, prefill {p * 1e3:.2f} ms CPU time per token")


def rope(t: int = 1, h: int = 9, d: int = 64, layers: int = 60) -> None:
    """The swap of each pair's members in rope (interleaved pairs), two ways, per (t, h, d) tensor."""
    import openvino as ov
    from openvino import opset13 as ops

    from framework.plugins.openvino_npu.rope import rope_partner

    def i64(v):
        return ops.constant(np.array(v, dtype=np.int64))

    def swap(kind, y):
        if kind == "gather":
            return ops.gather(y, ops.constant(rope_partner("normal", d, d)), i64(2))
        pairs = ops.roll(ops.reshape(y, i64([t, h, d // 2, 2]), False), i64([1]), i64([3]))
        return ops.reshape(pairs, i64([t, h, d]), False)

    core = ov.Core()
    feeds = [np.random.default_rng(0).standard_normal(s).astype(np.float32) for s in ((t, h, d), (t, 1, d), (t, 1, d))]
    for kind in ("gather", "roll"):
        x, c, s = (ops.parameter(list(a.shape), ov.Type.f32) for a in feeds)
        y = x.output(0)
        for _ in range(layers):
            y = ops.add(ops.multiply(y, c), ops.multiply(swap(kind, y), s)).output(0)
        req = core.compile_model(ov.Model([y], [x, c, s]), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
                                 ).create_infer_request()
        for _ in range(5):
            req.infer(feeds)
        ts = sorted(_timed(req.infer, feeds) for _ in range(40))
        print(f"{kind}: {ts[len(ts) // 2] / layers * 1e6:.1f} us per rope of ({t}, {h}, {d}) (median of 40)")


def fused(layers: int = 30, k: int = 576, repeats: int = 2) -> None:
    """M = 1, 2 threads: a layer's five input products (q 576, k 192, v 192, gate 1536, up 1536 rows, as
    SmolLM2's) as five FullyConnected nodes, or fused into two (960 and 3072 rows), over 30 layers."""
    import openvino as ov
    from openvino import opset13 as ops
    rng = np.random.default_rng(0)
    g = 32

    def product(x, n):
        codes = ops.constant(rng.integers(-8, 8, (n, k // g, g)).astype(np.int8), ov.Type.i4)
        w = ops.subtract(ops.convert(codes, ov.Type.f32), ops.constant(rng.random((n, k // g, 1), dtype=np.float32)))
        scale = ops.convert(ops.constant(rng.uniform(0.001, 0.01, (n, k // g, 1)).astype(np.float16)), ov.Type.f32)
        w = ops.reshape(ops.multiply(w, scale), ops.constant(np.array([n, k], dtype=np.int64)), False)
        return ops.reduce_sum(ops.matmul(x, w, False, True), ops.constant(np.array([1])), True)

    core = ov.Core()
    for _ in range(repeats):
        for shapes in ((576, 192, 192, 1536, 1536), (960, 3072)):
            p = ops.parameter([1, k], ov.Type.f32, name="x")
            h = p.output(0)
            for _ in range(layers):       # each layer's input depends on the last, as in a model
                total = None
                for n in shapes:
                    y = product(h, n)
                    total = y if total is None else ops.add(total, y)
                h = ops.add(h, ops.multiply(total, ops.constant(np.float32(1e-6)))).output(0)
            req = core.compile_model(ov.Model([h], [p]), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}
                                     ).create_infer_request()
            x = np.ones((1, k), dtype=np.float32)
            for _ in range(5):
                req.infer([x])
            ts = sorted(_timed(req.infer, [x]) for _ in range(30))
            what = "separate (5 products)" if len(shapes) == 5 else "fused (2 products)"
            print(f"{what}: {ts[len(ts) // 2] * 1e3:.2f} ms for {layers} layers (median of 30)")


def _profiled_device():
    """openvino:CPU's device class compiling with OpenVINO's per-node profiler on (PERF_COUNT), never from the
    on-disk cache (a cached blob would come back without the profiler)."""
    from framework.plugins.openvino_npu.device import OpenVinoDevice

    class Profiled(OpenVinoDevice):
        def compile_config(self):
            cfg = {**super().compile_config(), "PERF_COUNT": True}
            cfg.pop("CACHE_DIR", None)
            return cfg
    return Profiled


def floor(names=("smollm2", "gemma3"), steps: int = 20) -> dict:
    """Decode on openvino:CPU (2 threads, as `framework bench`) with OpenVINO's per-node profiler on:
    milliseconds per token by kernel kind and how many kernels of each kind a step runs, and the tokens per
    second the FullyConnected kernels alone would allow if everything else cost nothing. ``floor separate``
    keeps every product separate (translate.FUSE_PRODUCTS off), for comparison."""
    import collections

    if "separate" in sys.argv[2:]:
        from framework.plugins.openvino_npu import translate
        translate.FUSE_PRODUCTS = False

    from framework.model.default import model_path
    from framework.model.model import Model
    from framework.plugins.openvino_npu.device import OvProgram
    from framework.runtime.session import Session

    programs: list[OvProgram] = []

    class Profiled(_profiled_device()):
        def compile(self, fragment):
            program = super().compile(fragment)
            programs.append(program)
            return program

    from framework.bench import prompt_ids

    out = {}
    for name in names:
        model = Model(model_path(name))
        s = Session(model, [Profiled("CPU")], n_ctx=512)
        logits = s.eval(prompt_ids(model.tokenizer, 256))   # as framework bench
        for _ in range(3):
            logits = s.eval([int(np.argmax(logits))])
        decode = programs[-1]
        per_kind: dict[str, float] = collections.defaultdict(float)
        count: dict[str, int] = collections.Counter()
        wall = time.perf_counter()
        for _ in range(steps):
            logits = s.eval([int(np.argmax(logits))])
            for info in decode.request.get_profiling_info():
                per_kind[info.node_type] += info.real_time.total_seconds() / steps
                if info.status == info.Status.EXECUTED and info.real_time.total_seconds() > 0:
                    count[info.node_type] += 1
        wall = (time.perf_counter() - wall) / steps
        fc = sum(v for k, v in per_kind.items() if k.startswith("FullyConnected"))
        kernels = sum(per_kind.values())
        print(f"{name}: decode {wall * 1e3:.1f} ms a token ({1 / wall:.1f} tok/s); OpenVINO's kernels "
              f"{kernels * 1e3:.1f} ms in {sum(count.values()) / steps:.0f} kernels a step, of which FullyConnected "
              f"{fc * 1e3:.1f} ms: the weight products alone allow at most {1 / fc:.1f} tok/s")
        for kind, v in sorted(per_kind.items(), key=lambda kv: -kv[1])[:12]:
            print(f"    {kind:28s} {v * 1e3:6.2f} ms in {count[kind] / steps:4.0f} kernels")
        _products_by_shape(decode, top=12)
        out[name] = {"wall_s": wall, "kernels_s": kernels, "fc_s": fc}
    return out


def fused_model(names=("smollm2", "gemma3"), rounds: int = 5) -> None:
    """Each model's products fused (translate.FUSE_PRODUCTS, the plugin's translation) and separate: translation_ab
    on two threads."""
    translation_ab("FUSE_PRODUCTS", (True, False), names, rounds, threads=None)


def translation_ab(setting: str, values, names=("smollm2", "gemma3"), rounds: int = 5, threads: int | None = 1,
                   llama: bool = True) -> None:
    """A translate setting's values (read when a step's model is translated, at compile), each model compiled once
    with each, in one process and interleaved rounds with llama.cpp on the same threads (a slow period of a shared
    machine hits all): prefill and decode tok/s as `framework bench` measures them (a 256-token prompt, 32 decoded),
    medians, decode ratios to the first value and to llama.cpp, CPU time a decoded token, and the largest logit
    difference from the first value's translation. From the command line: ``ab SETTING=A,B [model or GGUF path
    ...] [rounds=N] [threads=N]``, e.g.
    ``ab OFFSETS=product,zero_point smollm2``; ``DYNAMIC_QUANTIZATION=0,32`` compares the device's
    DYNAMIC_QUANTIZATION_GROUP_SIZE instead, ``KV_PROGRAMS=per_length,shared`` FRAMEWORK_OPENVINO_KV_PROGRAMS (read
    when each engine's steps are compiled, at its start)."""
    from framework.bench import FrameworkEngine, LlamaCppEngine, interleave, llama_cpp_installed
    from framework.model.default import resolve_model
    from framework.plugins.openvino_npu import translate, translate_attention
    from framework.plugins.openvino_npu.device import OpenVinoDevice

    from framework.plugins.openvino_npu.kv_programs import KV_PROGRAMS_ENV
    device_setting = setting == "DYNAMIC_QUANTIZATION"     # the device's, not the translation's
    env_setting = {"KV_PROGRAMS": KV_PROGRAMS_ENV}.get(setting)     # an environment setting of the plugin's
    if env_setting:
        device_setting, before = True, os.environ.get(env_setting)
    # the attention's settings (ROW_ATTENTION, OWN_BY_GATHER, ROW_ATTENTION_MAX_T) are translate_attention's
    module = translate_attention if hasattr(translate_attention, setting) else translate
    first = None if device_setting else getattr(module, setting)
    for name in names:
        engines = {}
        for v in values:
            kwargs = {"dynamic_quantization": v} if device_setting and not env_setting else {}
            if env_setting:
                os.environ[env_setting] = v
            elif not device_setting:
                setattr(module, setting, v)
            engines[f"{setting}={v}"] = FrameworkEngine(
                resolve_model(name), [OpenVinoDevice("CPU", threads=threads, **kwargs)], 256, 32)
            if env_setting:     # compiled now, while the setting holds (a run would compile them under another)
                e = engines[f"{setting}={v}"]
                for plan, _ in e.session.plans.values():
                    e.session.executor.prepare(plan)
                print(f"{name} {setting}={v}: {e.session.devices[0].compile_summary()}", flush=True)
        if env_setting and before is None:
            os.environ.pop(env_setting)
        elif env_setting:
            os.environ[env_setting] = before
        if not device_setting:
            setattr(module, setting, first)
        logits = {k: e.session.eval(e.ids) for k, e in engines.items()}
        runs = {k: e.run for k, e in engines.items()}
        peer = None
        if llama and llama_cpp_installed():
            peer = LlamaCppEngine(resolve_model(name), next(iter(engines.values())).ids, 32, threads or 2)
            runs["llama.cpp"] = peer.run
        got = interleave(runs, rounds)
        base = next(iter(engines))
        for k, e in engines.items():        # CPU time on the calling thread and OpenVINO's: what load disturbs least
            cpu = _cpu_time_per_token(e.session.reset, e.session.eval, e.ids, rounds=rounds)[0]
            d = got[k]["decode"]
            vs = f"; {d.median / got['llama.cpp']['decode'].median:.2f}x llama.cpp's" if peer else ""
            print(f"{name} {k}: prefill {got[k]['prefill'].median:.1f}, decode {d.median:.1f} tok/s "
                  f"({d.min:.1f}-{d.max:.1f}; {d.median / got[base]['decode'].median:.2f}x {base}'s{vs}); "
                  f"CPU time a decoded token {cpu * 1e3:.1f} ms "
                  f"(best of {rounds}); largest logit difference from {base} "
                  f"{np.abs(logits[k] - logits[base]).max():.2e} (of {np.abs(logits[base]).max():.1f})", flush=True)
        if peer:
            d = got["llama.cpp"]
            print(f"{name} llama.cpp ({threads or 2} thread(s)): prefill {d['prefill'].median:.1f}, decode "
                  f"{d['decode'].median:.1f} tok/s ({d['decode'].min:.1f}-{d['decode'].max:.1f}); medians of "
                  f"{rounds} interleaved rounds", flush=True)
            peer.close()
        del engines


def _rss() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise SystemExit("model-memory reads /proc/self/status (Linux)")


def model_memory(names=("smollm2",), lengths=(256, 512, 768)) -> None:
    """The resident memory each decode step shape's compiled model adds, compiled in turn at KV lengths 256, 512
    and 768, with FRAMEWORK_OPENVINO_KV_PROGRAMS per_length (a model per length) and shared (kv_programs.py), each
    on a fresh device; and the weights' bytes as the plugin holds them. The first compile also loads the weights."""
    from framework.core.graph import LeafKind
    from framework.model.default import resolve_model
    from framework.model.model import Model
    from framework.plugins.openvino_npu.device import OpenVinoDevice
    from framework.plugins.openvino_npu.kv_programs import KV_PROGRAMS_ENV
    from framework.runtime.session import Session
    setting = os.environ.get(KV_PROGRAMS_ENV)
    for name in names:
        model = Model(resolve_model(name))
        for mode in ("per_length", "shared"):
            os.environ[KV_PROGRAMS_ENV] = mode
            dev = OpenVinoDevice("CPU", cache_dir=None)
            s = Session(model, [dev], n_ctx=max(lengths) + 256, n_batch=64)
            keys = [s.context.rows_key(1, kv, 1) for kv in lengths]
            s.reserve_shapes(keys)
            grew, before = [], _rss()
            for k in keys:
                s.executor.prepare(s.plans[k][0])
                grew.append(_rss() - before)
                before = _rss()
            plan = s.plans[keys[0]][0]
            weights = sum(dev.weight_nbytes(t) for f in plan.fragments for t in f.inputs
                          if t.is_leaf and t.kind == LeafKind.WEIGHT)
            print(f"{name} {KV_PROGRAMS_ENV}={mode}: weights {weights / 2**20:.0f} MiB; resident memory added by the "
                  f"decode model at KV " + ", ".join(f"{kv} {g / 2**20:.0f} MiB" for kv, g in zip(lengths, grew))
                  + f" (the first with the weights' load); {dev.compile_summary()}", flush=True)
            del s, dev
    if setting is None:                 # the setting as it was before
        os.environ.pop(KV_PROGRAMS_ENV)
    else:
        os.environ[KV_PROGRAMS_ENV] = setting


def _setting_values(word: str) -> tuple[str, tuple]:
    """"OFFSETS=product,zero_point" -> ("OFFSETS", ("product", "zero_point")), numbers and booleans as such."""
    import ast
    setting, _, values = word.partition("=")

    def value(v):
        try:
            return ast.literal_eval(v)
        except (ValueError, SyntaxError):
            return v
    return setting, tuple(value(v) for v in values.split(","))


class _TimedRequest:
    """An infer request that adds the seconds each ``infer`` takes to ``seconds``."""

    def __init__(self, request, seconds: list):
        self.request, self.seconds = request, seconds

    def infer(self, *args, **kwargs):
        t = time.perf_counter()
        out = self.request.infer(*args, **kwargs)
        self.seconds.append(time.perf_counter() - t)
        return out

    def __getattr__(self, name):
        return getattr(self.request, name)


def host(names=("smollm2", "gemma3"), steps: int = 32, rounds: int = 3) -> None:
    """Where a decode step's wall time goes, the profiler off: OpenVINO's infer call, the rest of the
    program's run (feeding the inputs, writing the new K and V rows into the cache, copying the outputs out),
    and the session and executor around it (inputs, masks, checks). Medians over ``rounds`` of ``steps`` steps
    after a 256-token prompt, as `framework bench`."""
    from framework.bench import prompt_ids
    from framework.model.default import model_path
    from framework.model.model import Model
    from framework.plugins.openvino_npu.device import OpenVinoDevice
    from framework.runtime.session import Session

    infer: list[float] = []
    runs: list[float] = []

    class Timed(OpenVinoDevice):
        def compile(self, fragment):
            program = super().compile(fragment)
            plain_run = program.run

            def run(args):
                if not isinstance(program.request, _TimedRequest) and program.request is not None:
                    program.request = _TimedRequest(program.request, infer)
                t = time.perf_counter()
                out = plain_run(args)
                runs.append(time.perf_counter() - t)
                return out

            program.run = run
            return program

    for name in names:
        model = Model(model_path(name))
        s = Session(model, [Timed("CPU")], n_ctx=512)
        ids = prompt_ids(model.tokenizer, 256)
        figures = []
        for _ in range(rounds + 1):
            s.reset()
            logits = s.eval(ids)
            infer.clear()
            runs.clear()
            evals = []
            for _ in range(steps):
                t = time.perf_counter()
                logits = s.eval([int(np.argmax(logits))])
                evals.append(time.perf_counter() - t)
            figures.append([np.median(evals), np.median(runs), np.median(infer)])
        step, run, inf = np.median(np.array(figures[1:]), axis=0)
        print(f"{name}: decode step {step * 1e3:.2f} ms (median): OpenVINO's infer {inf * 1e3:.2f} ms, the rest of "
              f"the program's run {(run - inf) * 1e3:.2f} ms (inputs, cache rows, outputs), session and executor "
              f"{(step - run) * 1e3:.2f} ms", flush=True)
        del s


def _matvec(n: int, k: int, group_size: int | None, threads: int | None) -> tuple[float, float, float]:
    """(median seconds, median CPU seconds, NMSE against float64) of an (n, k) i4 product, M = 1, with
    DYNAMIC_QUANTIZATION_GROUP_SIZE ``group_size`` (None: OpenVINO's default)."""
    import openvino as ov
    from openvino import opset13 as ops
    rng = np.random.default_rng(0)
    g = 32
    codes = rng.integers(-8, 8, (n, k // g, g)).astype(np.int8)
    scale = rng.uniform(0.001, 0.01, (n, k // g, 1)).astype(np.float16)
    p = ops.parameter([1, k], ov.Type.f32, name="x")
    w = ops.multiply(ops.convert(ops.constant(codes, ov.Type.i4), ov.Type.f32), ops.convert(ops.constant(scale),
                                                                                           ov.Type.f32))
    w = ops.reshape(w, ops.constant(np.array([n, k], dtype=np.int64)), False)
    cfg = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY"}
    if threads:
        cfg["INFERENCE_NUM_THREADS"] = threads
    if group_size is not None:
        cfg["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = group_size
    req = ov.Core().compile_model(ov.Model([ops.matmul(p, w, False, True)], [p]), "CPU", cfg).create_infer_request()
    x = rng.standard_normal((1, k)).astype(np.float32)
    for _ in range(10):
        req.infer([x])
    walls, cpus = [], []
    for _ in range(60):
        c, t = time.process_time(), time.perf_counter()
        req.infer([x])
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    ref = (codes.astype(np.float64) * scale.astype(np.float64)).reshape(n, k) @ x[0].astype(np.float64)
    y = req.get_output_tensor(0).data[0].astype(np.float64)
    return float(np.median(walls)), float(np.median(cpus)), float(((y - ref) ** 2).mean() / (ref ** 2).mean())


def _reference_bounds(session, name: str) -> str:
    """llama.cpp's bounds (tests/reference/README.md), measured: a checkout's tests/ folder is needed."""
    tests = Path(__file__).resolve().parents[1] / "tests"
    if not (tests / "reference_checks.py").is_file():
        return f"reference bounds not measured: no {tests / 'reference_checks.py'} (run from a checkout)"
    sys.path.insert(0, str(tests))
    import json

    import reference_checks as R

    from framework.runtime.perplexity import perplexity
    ref = json.loads((tests / "reference" / f"{name}.json").read_text(encoding="utf-8"))
    arrays = dict(np.load(tests / "reference" / f"{name}.npz"))
    forced = R.teacher_forced(session, ref)
    decoded = R.teacher_forced(session, ref, by_decode=True)
    text = (tests / "reference" / ref["text"]["text_file"]).read_bytes().decode("utf-8")
    result = perplexity(session, session.model.tokenizer.encode(text), window=len(ref["text"]["ids"]))
    top1 = arrays[ref["text"]["top1_key"]]
    agreement = float(np.mean(result.top1[:len(top1)] == top1))
    ppl = result.perplexity / ref["text"]["perplexity"] - 1
    ok = (not forced[3] and not decoded[3] and forced[0] >= R.MIN_GREEDY_AGREEMENT * forced[1]
          and decoded[0] >= R.MIN_GREEDY_AGREEMENT * decoded[1] and abs(ppl) <= R.MAX_PPL_RATIO_ERROR
          and agreement >= R.MIN_TOP1_AGREEMENT)
    return (f"teacher-forced top-1 {forced[0]}/{forced[1]} (largest gap {forced[2]:.2f}), by decode "
            f"{decoded[0]}/{decoded[1]} (largest gap {decoded[2]:.2f}); perplexity {ppl * 100:+.2f}%, top-1 on the "
            f"text {agreement * 100:.1f}%: bounds {'hold' if ok else 'FAIL'}")


def _decode_against_prefill(session, ids: list[int], follow: list[int]) -> float:
    session.reset()
    whole = session.eval(ids + follow, all_logits=True)
    session.reset()
    session.eval(ids)
    return max(float(np.abs(session.eval([t]) - whole[len(ids) + i]).max()) for i, t in enumerate(follow))


def decode_gap(names=("smollm2", "gemma3")) -> None:
    """Decode against prefill with activations quantized: the largest logit difference between 6 decode steps after
    an 8-token prompt and a prefill of all 14 tokens, one thread, for DYNAMIC_QUANTIZATION_GROUP_SIZE 0 and each
    ``dq=N`` (default 32), over the first ``layers=1,2,...`` layers (default all); first, each product alone at
    1 to 256 queries (_products_across_queries)."""
    from framework.bench import prompt_ids
    from framework.model.default import model_path
    from framework.model.model import Model
    from framework.plugins.openvino_npu.device import OpenVinoDevice
    from framework.runtime.session import Session

    words = dict(w.split("=", 1) for w in sys.argv[2:] if "=" in w)
    dqs = [0] + [int(v) for v in words.get("dq", "32").split(",")]
    layers = [int(v) for v in words["layers"].split(",")] if "layers" in words else [None]
    _products_across_queries(dqs)
    for name in [w for w in sys.argv[2:] if "=" not in w] or names:
        model = Model(model_path(name))
        ids = prompt_ids(model.tokenizer, 14)
        for n in layers:
            for dq in dqs:
                s = Session(model, [OpenVinoDevice("CPU", cache_dir=None, dynamic_quantization=dq, threads=1)],
                            n_ctx=512, n_layers=n)
                print(f"{name}, {n or model.hp.n_layer} layers, DYNAMIC_QUANTIZATION_GROUP_SIZE {dq}: decode against "
                      f"prefill, largest logit difference {_decode_against_prefill(s, ids[:8], ids[8:14]):.4f}",
                      flush=True)
                del s


def _products_across_queries(dqs, queries=(1, 2, 8, 32, 256), n: int = 512, k: int = 1536) -> None:
    """One product alone (translate.weight_product on a Q4_1, Q8_0 or Q6_K weight of random blocks, their f16 scales
    and minimums finite) compiled for each query count: the largest difference of its first row's outputs from the
    one-query model's, for each DYNAMIC_QUANTIZATION_GROUP_SIZE, one thread."""
    import openvino as ov
    from gguf import GGML_QUANT_SIZES

    from framework.contract import DType
    from framework.plugins.openvino_npu import translate
    from framework.plugins.openvino_npu import weights as W

    rng = np.random.default_rng(0)
    x = rng.standard_normal((max(queries), k)).astype(np.float32)
    core = ov.Core()
    for tname in ("Q4_1", "Q8_0", "Q6_K"):
        dtype = getattr(DType, tname)
        per, size = GGML_QUANT_SIZES[dtype]
        raw = rng.integers(0, 256, (n * k // per, size), dtype=np.uint8)
        for at in {"Q4_1": (0, 2), "Q8_0": (0,), "Q6_K": (208,)}[tname]:     # d (and Q4_1's m)
            raw[:, at:at + 2] = rng.uniform(0.001, 0.05, (len(raw), 1)).astype(np.float16).view(np.uint8)
        w = W.load("w", dtype, (n, k), raw.reshape(-1))
        for dq in dqs:
            first = {}
            for m in queries:
                p = ov.opset13.parameter([m, k], ov.Type.f32, name="x")
                model = ov.Model([translate.weight_product(p.output(0), (m, k), w, (n, k))], [p])
                cfg = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1,
                       "DYNAMIC_QUANTIZATION_GROUP_SIZE": dq}
                req = core.compile_model(model, "CPU", cfg).create_infer_request()
                req.infer([x[:m]])
                first[m] = req.get_output_tensor(0).data[0].copy()
            diffs = ", ".join(f"{m}: {np.abs(first[m] - first[1]).max():.1e}" for m in queries[1:])
            print(f"{tname} {n} x {k} alone, DYNAMIC_QUANTIZATION_GROUP_SIZE {dq}: first row's largest difference "
                  f"from one query, by query count: {diffs}", flush=True)


def dynquant(models: dict | None = None, rounds: int = 3) -> None:
    """DYNAMIC_QUANTIZATION_GROUP_SIZE 0 against OpenVINO's default on this CPU, in interleaved rounds: a
    4096x4096 i4 product (M = 1), then each model's decode speed, the largest difference between its decode
    and prefill logits, and llama.cpp's reference bounds. ``models``: name -> Model (default: the two
    bundled models; random weights of their shapes come from benchmarks/openvino_dynquant.py, and have no
    reference to meet)."""
    import openvino as ov

    from framework.model.default import model_path
    from framework.model.model import Model
    from framework.plugins.openvino_npu.device import OpenVinoDevice
    from framework.plugins.openvino_npu.options import cpu_isa
    from framework.runtime.session import Session
    c = ov.Core()
    default = c.get_property("CPU", "DYNAMIC_QUANTIZATION_GROUP_SIZE")
    print(f"CPU: {c.get_property('CPU', 'FULL_DEVICE_NAME')}, {os.cpu_count()} threads; {cpu_isa()}; OpenVINO "
          f"{ov.get_version()}; its DYNAMIC_QUANTIZATION_GROUP_SIZE here: {default}", flush=True)
    settings = {"0": 0, f"default ({default})": None}
    for threads in (1, None):
        runs: dict = {k: [] for k in settings}
        for _ in range(rounds):
            for label, gs in settings.items():
                try:
                    runs[label].append(_matvec(4096, 4096, gs, threads))
                except RuntimeError as e:
                    runs[label].append(str(e).strip().splitlines()[-1][:200])
        for label, got in runs.items():
            n_threads = threads or c.get_property('CPU', 'INFERENCE_NUM_THREADS') or 'all'
            what = f"4096x4096 i4 product, M = 1, {n_threads} " \
                   f"thread(s), group size {label}"
            ok = [r for r in got if not isinstance(r, str)]
            if not ok:
                print(f"{what}: fails: {got[0]}", flush=True)
                continue
            wall, cpu = np.median([r[0] for r in ok]), np.median([r[1] for r in ok])
            print(f"{what}: {wall * 1e3:.2f} ms (CPU time {cpu * 1e3:.2f}"
                  f" ms), NMSE against float64 {ok[0][2]:.1e}", flush=True)
    if models is None:
        models = {name: Model(model_path(name)) for name in ("smollm2", "gemma3")}
    for name, model in models.items():
        tok = model.tokenizer if model.file.metadata.get("tokenizer.ggml.tokens") else None
        if tok is not None:
            from framework.bench import prompt_ids
            ids = prompt_ids(tok, 128)
        else:
            ids = [int(i) for i in np.random.default_rng(0).integers(10, 1000, 128)]
        for label, gs in settings.items():
            dq = default if gs is None else gs
            try:
                _dynquant_model(name, model, ids, label, dq, rounds, Session, OpenVinoDevice, bounds=tok is not None)
            except Exception as e:  # noqa: BLE001 - a setting OpenVINO cannot compile here: said, then the next one
                print(f"{name}, group size {label}: fails: {type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}",
                      flush=True)


def _dynquant_model(name, model, ids, label, dq, rounds, Session, OpenVinoDevice, bounds: bool) -> None:
    class OneThread(OpenVinoDevice):
        def compile_config(self):
            return {**super().compile_config(), "INFERENCE_NUM_THREADS": 1}

    s = Session(model, [OneThread("CPU", cache_dir=None, dynamic_quantization=dq)], n_ctx=512)
    s.eval(ids)
    s.eval([5])
    cpu, _ = _cpu_time_per_token(s.reset, s.eval, ids, rounds=rounds)
    del s
    s = Session(model, [OpenVinoDevice("CPU", cache_dir=None, dynamic_quantization=dq)], n_ctx=512)
    walls = []
    for _ in range(rounds + 1):           # the first round compiles and warms up, and is not counted
        s.reset()
        s.eval(ids)
        t = time.perf_counter()
        for _ in range(32):
            s.eval([5])
        walls.append(32 / (time.perf_counter() - t))
    gap = _decode_against_prefill(s, ids[:8], ids[8:14])
    print(f"{name}, group size {label}: decode {cpu * 1e3:.1f} ms CPU time a token (1 thread), "
          f"{np.median(walls[1:]):.1f} tok/s (all threads, median of {rounds}); decode against prefill: largest "
          f"logit difference {gap:.4f}", flush=True)
    if bounds:
        print(f"    {_reference_bounds(s, name)}", flush=True)


def threads(names=("smollm2", "gemma3"), rounds: int = 5) -> None:
    """openvino:CPU with OpenVINO's thread count (INFERENCE_NUM_THREADS unset: one thread per core under the LATENCY
    hint) and with 1 thread, and llama.cpp on 1 thread, in interleaved rounds as `framework bench` runs them (a
    256-token prompt, 32 decoded): prefill and decode tok/s, medians, and each against llama.cpp."""
    from framework.bench import FrameworkEngine, LlamaCppEngine, interleave
    from framework.model.default import model_path
    from framework.plugins.openvino_npu.device import OpenVinoDevice

    for name in names:
        engines = {f"openvino:CPU, {label}": FrameworkEngine(model_path(name), [OpenVinoDevice("CPU", threads=n)], 256,
                                                             32)
                   for label, n in (("OpenVINO's thread count", 0), ("1 thread", 1))}
        ids = next(iter(engines.values())).ids
        ref = LlamaCppEngine(model_path(name), ids, 32, 1)
        runs = {k: e.run for k, e in engines.items()}
        runs["llama.cpp, 1 thread"] = ref.run
        try:
            got = interleave(runs, rounds)
        finally:
            ref.close()
        peer = got["llama.cpp, 1 thread"]
        for label, g in got.items():
            pre, dec = g["prefill"], g["decode"]
            print(f"{name}, {label}: prefill {pre.median:.1f} tok/s ({pre.median / peer['prefill'].median:.2f}x "
                  f"llama.cpp), decode {dec.median:.1f} tok/s ({dec.median / peer['decode'].median:.2f}x; "
                  f"min {dec.min:.1f}, max {dec.max:.1f}; medians of {rounds})", flush=True)
        del engines


def fc_forms(rounds: int = 7) -> None:
    """One thread, M = 1: the CPU time of the compressed products that dominate the larger models' decode steps, in
    every weight form OpenVINO's CPU plugin runs as a compressed FullyConnected (i4 / u4 / i8 / u8 codes; groups of
    16 to 128 values or one scale a row; no zero point, a float one, or one of the codes' own type), each with
    DYNAMIC_QUANTIZATION_GROUP_SIZE 0, 16, 32 and 128, taking turns (medians of ``rounds``). Each line says whether the
    form holds the GGUF blocks' values exactly (Q4_K: 4-bit codes, a scale and a float minimum per 32 values; Q6_K:
    6-bit codes, a scale per 16) and the product's NMSE against float64 with the form's own values. ``fc-forms all``
    adds Gemma 3's output head (262144 x 640, slow to compile)."""
    import openvino as ov
    from openvino import opset13 as ops

    rng = np.random.default_rng(0)
    keep = []
    codes_of = {"i4": (-8, 8, ov.Type.i4), "u4": (0, 16, ov.Type.u4), "i8": (-32, 32, ov.Type.i8),
                "u8": (0, 64, ov.Type.u8)}

    def packed(q, element):             # 4-bit codes two a byte, element 2i in the low nibble (flattened)
        if element.endswith("4"):
            u = q.reshape(-1).astype(np.uint8) & 0x0F
            keep.append(np.ascontiguousarray(u[0::2] | (u[1::2] << 4)))
            return ops.constant(ov.Tensor(keep[-1], ov.Shape(list(q.shape)), codes_of[element][2]))
        return ops.constant(ov.Tensor(q.astype(np.int8 if element == "i8" else np.uint8)))

    def model(n, k, element, g, zp, scale_type):
        lo, hi, _ = codes_of[element]
        q = rng.integers(lo, hi, (n, k // g, g))
        x = ops.parameter([1, k], ov.Type.f32, name="x")
        c = ops.convert(packed(q, element), ov.Type.f32)
        values = q.astype(np.float64)
        if zp == "float":
            z = rng.uniform(-2, 2, (n, k // g, 1)).astype(np.float32)
            c, values = ops.subtract(c, ops.constant(z)), values - z
        elif zp == "codes":             # a zero point of the codes' own type (its middle, as Q6_K's 32)
            z = rng.integers(lo, hi, (n, k // g, 1))
            c, values = ops.subtract(c, ops.convert(packed(z, element), ov.Type.f32)), values - z
        scale = rng.uniform(0.001, 0.01, (n, k // g, 1)).astype(scale_type)
        values = (values * scale.astype(np.float64)).reshape(n, k)
        sc = ops.constant(scale)
        if scale_type != np.float32:
            sc = ops.convert(sc, ov.Type.f32)
        w = ops.reshape(ops.multiply(c, sc), ops.constant(np.array([n, k], dtype=np.int64)), False)
        return ov.Model([ops.matmul(x, w, False, True)], [x]), values

    q4k = "exact for Q4_K (today's form)"
    q6k = "exact for Q6_K (today's form)"
    forms = [("gate+up", 17920, 1536, "i4", 32, "float", np.float32, q4k),
             ("gate+up", 17920, 1536, "u4", 32, None, np.float32, "exact for Q4_K with its minimum as a product"),
             ("gate+up", 17920, 1536, "u4", 32, "codes", np.float32, "not exact: Q4_K's minimum is no integer code"),
             ("gate+up", 17920, 1536, "u4", 64, "codes", np.float32, "not exact"),
             ("gate+up", 17920, 1536, "u4", 128, "codes", np.float32, "not exact"),
             ("gate+up", 17920, 1536, "i4", 32, None, np.float16, "not exact (a symmetric 4-bit form)"),
             ("gate+up", 17920, 1536, "i4", 128, None, np.float16, "not exact"),
             ("gate+up", 17920, 1536, "i4", 1536, None, np.float32, "not exact (a scale a row)"),
             ("gate+up", 17920, 1536, "u8", 32, "codes", np.float32, "not exact (8 bits for 4)"),
             ("gate+up", 17920, 1536, "i8", 1536, None, np.float32, "not exact (a scale a row)"),
             ("down", 1536, 8960, "i8", 16, None, np.float32, q6k),
             ("down", 1536, 8960, "u8", 16, "codes", np.float32, "exact for Q6_K (zero point 32)"),
             ("down", 1536, 8960, "i8", 32, None, np.float32, "not exact: Q6_K has a scale per 16"),
             ("down", 1536, 8960, "u8", 32, "codes", np.float32, "not exact"),
             ("down", 1536, 8960, "i8", 128, None, np.float32, "not exact"),
             ("down", 1536, 8960, "i8", 8960, None, np.float32, "not exact (a scale a row)"),
             ("down", 1536, 8960, "i4", 32, None, np.float16, "not exact (4 bits for 6)")]
    if "all" in sys.argv[2:]:
        forms.append(("Gemma 3 output head, Q8_0", 262144, 640, "i8", 32, None, np.float16, "exact for Q8_0"))
    core = ov.Core()
    reqs, refs = {}, {}
    for form in forms:
        m, values = model(*form[1:7])
        refs[form] = values
        for dq in (0, 16, 32, 128):
            cfg = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1,
                   "DYNAMIC_QUANTIZATION_GROUP_SIZE": dq, "PERF_COUNT": True}
            try:
                reqs[(form, dq)] = core.compile_model(m, "CPU", cfg).create_infer_request()
            except RuntimeError as e:
                print(f"{form[:7]} DYNAMIC_QUANTIZATION_GROUP_SIZE {dq}: does not compile ({str(e)[:120]})")
    times: dict = {key: [] for key in reqs}
    x = rng.standard_normal((1, max(f[2] for f in forms))).astype(np.float32)
    for _ in range(rounds):
        for (form, dq), req in reqs.items():
            c = time.thread_time()
            req.infer([x[:, :form[2]]])
            times[(form, dq)].append(time.thread_time() - c)
    for (form, dq), got in times.items():
        what, n, k, element, g, zp, scale_type, exact = form
        ref = refs[form] @ x[0, :k].astype(np.float64)
        y = reqs[(form, dq)].get_output_tensor(0).data[0].astype(np.float64)
        nmse = float(((y - ref) ** 2).mean() / (ref ** 2).mean())
        t = float(np.median(got))
        kernel = next((f"{i.node_type} {i.exec_type}" for i in reqs[(form, dq)].get_profiling_info()
                       if i.node_type.startswith("FullyConnected")), "no FullyConnected kernel")
        print(f"{what} {n} x {k}: {element}, groups of {g}, zero point {zp or 'none'}, "
              f"{np.dtype(scale_type).name} scales, DYNAMIC_QUANTIZATION_GROUP_SIZE {dq}: {t * 1e3:.2f} ms CPU time "
              f"({n * k / t / 1e9:.1f} G weights/s), NMSE {nmse:.1e}, {kernel}; {exact}", flush=True)


def offset_forms(rounds: int = 21) -> None:
    """One thread, M = 1: the kernel time of a Q4_K weight's offsets product (offsets @ block_sums(x), the
    plugin's own translate.offset_product) with the offsets as a float32 (rows, blocks) matrix (the form before,
    and Q4_1's and Q5_1's) or as the file's 6-bit minimums, u8 codes in groups of 8 with -dmin as their scale
    (the K-quants' form now), on the 1.5B's and Gemma 3's shapes, taking turns (medians of ``rounds``, from
    OpenVINO's profiler). Both forms' results against float64."""
    import dataclasses

    import openvino as ov
    from openvino import opset13 as ops

    from framework.contract import DType
    from framework.plugins.openvino_npu import translate
    from framework.plugins.openvino_npu import weights as W

    rng = np.random.default_rng(0)
    shapes = [("1.5B gate+up", 17920, 1536), ("1.5B q+k", 1792, 1536), ("1.5B attn_output", 1536, 1536),
              ("Gemma 3 down", 640, 2048)]
    core = ov.Core()
    cfg = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1,
           "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "PERF_COUNT": True}
    reqs, refs, xs = {}, {}, {}
    for what, n, k in shapes:
        raw = rng.integers(0, 256, (n * k // 256, 144), dtype=np.uint8)
        raw[:, 0:4] = rng.uniform(0.001, 0.05, (n * k // 256, 2)).astype(np.float16).view(np.uint8)
        codes = W.load("w", DType.Q4_K, (n, k), raw.reshape(-1))
        dense = dataclasses.replace(codes, offset=codes.offsets, offset_codes=None, offset_scale=None,
                                    _constants={})
        xs[what] = rng.standard_normal((1, k)).astype(np.float32)
        refs[what] = codes.offsets.astype(np.float64) @ xs[what][0].astype(np.float64).reshape(-1, 32).sum(-1)
        for form, w in (("float32 matrix", dense), ("u8 codes, groups of 8", codes)):
            x = ops.parameter([1, k], ov.Type.f32, name="x")
            m = ov.Model([translate.offset_product(w, x.output(0), (1, k))], [x])
            reqs[(what, form)] = core.compile_model(m, "CPU", cfg).create_infer_request()
    times: dict = {key: [] for key in reqs}
    for _ in range(rounds):
        for (what, form), req in reqs.items():
            req.infer([xs[what]])
            times[(what, form)].append(sum(i.real_time.total_seconds() for i in req.get_profiling_info()))
    for (what, form), got in times.items():
        y = reqs[(what, form)].get_output_tensor(0).data[0].astype(np.float64)
        err = float(np.abs(y - refs[what]).max() / np.abs(refs[what]).max())
        kernels = sorted({f"{i.node_type} {i.exec_type}" for i in reqs[(what, form)].get_profiling_info()
                          if i.real_time.total_seconds() > 0})
        n, k = next((n, k) for w_, n, k in shapes if w_ == what)
        print(f"{what} ({n} x {k}), offsets {n} x {k // 32}: {form}: {np.median(got) * 1e6:.0f} us kernel time, "
              f"largest error against float64 "
              f"{err:.1e} of the largest value; kernels {', '.join(kernels)}", flush=True)


def zero_points(rounds: int = 21) -> None:
    """One thread, M = 1: the kernel time of a weight product (the plugin's own translate.weight_product) with the
    block offsets of Q4_1 (f16 scales and minimums) and Q4_K (float32 scales, 6-bit minimum codes) added as their
    own product (OFFSETS "product": block sums, a FullyConnected, an add) or subtracted as a float zero point in the
    decompression ("zero_point"), on SmolLM2's and the 1.5B's shapes, taking turns (medians of ``rounds``, from
    OpenVINO's profiler; kernel counts; largest error against float64 of the file's values)."""
    import openvino as ov

    from framework.contract import DType
    from framework.core.graph import quants
    from framework.plugins.openvino_npu import translate
    from framework.plugins.openvino_npu import weights as W

    rng = np.random.default_rng(0)
    shapes = [("Q4_1", "SmolLM2 gate+up", 3072, 576), ("Q4_1", "SmolLM2 down", 576, 1536),
              ("Q4_1", "SmolLM2 q+k+v", 960, 576), ("Q4_1", "wide", 8192, 576), ("Q4_1", "deep", 1536, 1536),
              ("Q4_1", "deeper", 576, 4608), ("Q4_1", "1.5B-shaped gate+up part", 3584, 1536),
              ("Q4_K", "small gate+up", 3072, 512), ("Q4_K", "1.5B gate+up part", 3584, 1536),
              ("Q4_K", "1.5B attn_output", 1536, 1536)]
    block = {"Q4_1": (32, 20), "Q4_K": (256, 144)}
    core = ov.Core()
    cfg = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1,
           "DYNAMIC_QUANTIZATION_GROUP_SIZE": 0, "PERF_COUNT": True}
    reqs, refs, xs = {}, {}, {}
    for tname, what, n, k in shapes:
        size, nbytes = block[tname]
        raw = rng.integers(0, 256, (n * k // size, nbytes), dtype=np.uint8)
        raw[:, 0:4] = rng.uniform(0.001, 0.05, (n * k // size, 2)).astype(np.float16).view(np.uint8)
        if tname == "Q4_K":     # no 6-bit scale or minimum code of 0: a zero scale would keep the product form
            raw[:, 4:16] |= 0x11
        dtype = getattr(DType, tname)
        xs[what] = rng.standard_normal((1, k)).astype(np.float32)
        dense = quants.dequantize(raw.reshape(-1), dtype, (n, k))
        refs[what] = dense.astype(np.float64) @ xs[what][0].astype(np.float64)
        for form in ("product", "zero_point"):
            translate.OFFSETS = form
            w = W.load("w", dtype, (n, k), raw.reshape(-1))
            x = ov.opset13.parameter([1, k], ov.Type.f32, name="x")
            m = ov.Model([translate.weight_product(x.output(0), (1, k), w, (n, k))], [x])
            reqs[(what, tname, form)] = core.compile_model(m, "CPU", cfg).create_infer_request()
    translate.OFFSETS = "product"
    times: dict = {key: [] for key in reqs}
    for _ in range(rounds):
        for key, req in reqs.items():
            req.infer([xs[key[0]]])
            times[key].append(sum(i.real_time.total_seconds() for i in req.get_profiling_info()))
    for (what, tname, form), got in times.items():
        req = reqs[(what, tname, form)]
        n, k = next((n, k) for _, w_, n, k in shapes if w_ == what)
        kernels = [i for i in req.get_profiling_info() if i.real_time.total_seconds() > 0]
        y = req.get_output_tensor(0).data[0].astype(np.float64)
        err = f", largest error {np.abs(y - refs[what]).max() / np.abs(refs[what]).max():.1e} of the largest value"
        print(f"{tname} {what} ({n} x {k}), offsets as {form}: {np.median(got) * 1e6:.0f} us kernel time in "
              f"{len(kernels)} kernels{err}", flush=True)


def row_parts(layers: int = 16, rounds: int = 9) -> None:
    """One thread: ``layers`` distinct Q4_K weights of the 1.5B's fused gate and up (17920 x 1536, together more than
    the last-level cache, as in a model) by one input, through the plugin's own translate.weight_product, with
    translate.PRODUCT_ROWS as it is (parts) and above the rows (whole), at 1 query (decode) and 64 (prefill), taking
    turns (medians of ``rounds``, kernel time from OpenVINO's profiler); the parts' outputs against the whole's.
    ``rows=8960,8192,2048`` measures parts of at most each of those instead of PRODUCT_ROWS (one query only);
    ``dq=16`` compiles with that DYNAMIC_QUANTIZATION_GROUP_SIZE (default 0)."""
    import openvino as ov
    from openvino import opset13 as ops

    from framework.contract import DType
    from framework.plugins.openvino_npu import translate
    from framework.plugins.openvino_npu import weights as W

    rng = np.random.default_rng(0)
    n, k = 17920, 1536
    ws = []
    for _ in range(layers):
        raw = rng.integers(0, 256, (n * k // 256, 144), dtype=np.uint8)
        raw[:, 0:4] = rng.uniform(0.001, 0.05, (n * k // 256, 2)).astype(np.float16).view(np.uint8)
        ws.append(W.load("w", DType.Q4_K, (n, k), raw.reshape(-1)))
    core = ov.Core()
    dq = next((int(w[3:]) for w in sys.argv[2:] if w.startswith("dq=")), 0)
    cfg = {"INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": 1,
           "DYNAMIC_QUANTIZATION_GROUP_SIZE": dq, "PERF_COUNT": True}
    print(f"DYNAMIC_QUANTIZATION_GROUP_SIZE {dq}")
    reqs, limit = {}, translate.PRODUCT_ROWS
    asked = [int(v) for w in sys.argv[2:] if w.startswith("rows=") for v in w[5:].split(",")]
    for m in ((1,) if asked else (1, 64)):
        for form, rows in [(f"parts of at most {r} rows", r) for r in asked or [limit]] + [("whole", n)]:
            translate.PRODUCT_ROWS = rows
            x = ops.parameter([m, k], ov.Type.f32, name="x")
            outs = [translate.weight_product(x.output(0), (m, k), w, (n, k)) for w in ws]
            reqs[(m, form)] = core.compile_model(ov.Model(outs, [x]), "CPU", cfg).create_infer_request()
    translate.PRODUCT_ROWS = limit
    xs = {m: rng.standard_normal((m, k)).astype(np.float32) for m in {m for m, _ in reqs}}
    times: dict = {key: [] for key in reqs}
    for _ in range(rounds):
        for (m, form), req in reqs.items():
            req.infer([xs[m]])
            times[(m, form)].append(sum(i.real_time.total_seconds() for i in req.get_profiling_info()
                                        if i.node_type.startswith("FullyConnected")))
    for (m, form), got in times.items():
        t = float(np.median(got))
        whole = reqs[(m, "whole")].get_output_tensor(0).data
        diff = float(np.abs(reqs[(m, form)].get_output_tensor(0).data - whole).max() / np.abs(whole).max())
        print(f"{layers} x Q4_K {n} x {k}, {m} quer{'y' if m == 1 else 'ies'}, {form}: {t * 1e3:.1f} ms "
              f"FullyConnected kernel time ({layers * n * k / t / 1e9:.1f} G weights/s), largest difference from "
              f"the whole product {diff:.1e} of its largest value", flush=True)


def own_head(rows: int = 288, rounds: int = 40) -> None:
    """Attention over cache rows (translate_attention.attend_rows) with SmolLM2's heads (9 query heads, 3 kv heads
    of 64), 30 layers, 1 thread: each kv head's group of query heads against its own rows in one batched product
    (translate_attention.ROW_ATTENTION "grouped"), or every query head against every kv head's rows with its own
    picked by one Gather (translate_attention.OWN_BY_GATHER) or by a product with a one-hot mask and its sum; CPU
    time of the 30 layers, medians, for 1 and 5 queries a step. ``own-head profile`` adds OpenVINO's per-kernel times
    for each form."""
    import collections

    import openvino as ov
    from openvino import opset13 as ops

    from framework.plugins.openvino_npu import translate as TR
    from framework.plugins.openvino_npu import translate_attention as TA
    hkv, g, d, layers = 3, 3, 64, 30
    h = hkv * g
    profile = "profile" in sys.argv[2:]
    rng = np.random.default_rng(0)
    core = ov.Core()
    forms = {"grouped": ("grouped", True), "Gather": ("all", True), "one-hot product and sum": ("all", False)}
    for t in (1, 5):
        def build(form: str):
            TA.ROW_ATTENTION, TA.OWN_BY_GATHER = forms[form]
            TR._SHARED = {}
            q = ops.parameter([t, h, d], ov.Type.f32, name="q")
            m = ops.parameter([t, rows], ov.Type.f32, name="m")
            kv = [ops.parameter([rows, hkv * d], ov.Type.f32, name=f"kv{i}") for i in range(2 * layers)]
            new = ops.parameter([t, hkv * d], ov.Type.f32, name="new")
            m_new = ops.parameter([t, t], ov.Type.f32, name="m_new")
            x = q.output(0)
            for i in range(layers):
                parts = [(kv[2 * i].output(0), kv[2 * i + 1].output(0), m.output(0), rows),
                         (new.output(0), new.output(0), m_new.output(0), t)]
                x = ops.add(x, TA.attend_rows(x, parts, 0.125, hkv)).output(0)
            TR._SHARED, TA.ROW_ATTENTION, TA.OWN_BY_GATHER = None, "auto", True
            return ov.Model([ops.result(x)], [q, m, *kv, new, m_new])

        feeds = [rng.standard_normal((t, h, d)).astype(np.float32), np.zeros((t, rows), np.float32),
                 *[rng.standard_normal((rows, hkv * d)).astype(np.float32) * 0.1 for _ in range(2 * layers)],
                 rng.standard_normal((t, hkv * d)).astype(np.float32), np.zeros((t, t), np.float32)]
        cfg = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY",
               "PERF_COUNT": profile}
        reqs = {k: core.compile_model(build(k), "CPU", cfg).create_infer_request() for k in forms}
        outs = {}
        for k, r in reqs.items():
            r.infer(feeds, share_inputs=True)
            outs[k] = r.get_output_tensor(0).data.copy()
        times: dict = {k: [] for k in reqs}
        kinds: dict = {k: collections.defaultdict(float) for k in reqs}
        counts: dict = {k: collections.Counter() for k in reqs}
        for _ in range(rounds):
            for k, r in reqs.items():
                c = time.thread_time()
                r.infer(feeds, share_inputs=True)
                times[k].append(time.thread_time() - c)
                for info in r.get_profiling_info() if profile else ():
                    if info.status == info.Status.EXECUTED and info.real_time.total_seconds() > 0:
                        kinds[k][f"{info.node_type} ({info.exec_type})"] += info.real_time.total_seconds() / rounds
                        counts[k][f"{info.node_type} ({info.exec_type})"] += 1
        gap = max(float(np.abs(outs[k] - outs["Gather"]).max()) for k in outs)
        print(f"{t} quer{'y' if t == 1 else 'ies'} a step over {rows} rows: " + ", ".join(
            f"{k} {np.median(v) * 1e3:.2f} ms" for k, v in times.items()) + f" for {layers} layers; largest "
            f"difference between forms {gap:.1e}", flush=True)
        for k in kinds if profile else ():
            print(f"    {k}: " + "; ".join(f"{kind} {v * 1e3:.2f} ms in {counts[k][kind] // rounds}"
                                          for kind, v in sorted(kinds[k].items(), key=lambda kv: -kv[1])[:6]))


_LLAMA_CHILD = """
import sys, time
import numpy as np
from llama_cpp import Llama
path, n_ctx = sys.argv[1], int(sys.argv[2])
llm = Llama(path, n_ctx=n_ctx, n_batch=512, n_threads=1, n_threads_batch=1, verbose=False)
for line in sys.stdin:
    words = line.split()
    if words[0] == "prompt":
        llm.reset()
        llm.eval([int(w) for w in words[1:]])
        print("ok", flush=True)
    else:
        t, c = time.perf_counter(), time.process_time()
        for _ in range(int(words[1])):
            llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
        print(int(words[1]) / (time.perf_counter() - t), (time.process_time() - c) / int(words[1]), flush=True)
"""


def _products_by_shape(program, top: int = 8) -> None:
    """The last step's FullyConnected kernel time by weight shape (every layer's product of one shape summed), with
    the weights a second that makes: which products bound a decode step."""
    import collections

    ops_by_name = {op.get_friendly_name(): op for op in program.compiled.get_runtime_model().get_ops()}
    by_shape: dict = collections.defaultdict(lambda: [0.0, 0])
    for info in program.request.get_profiling_info():
        op = ops_by_name.get(info.node_name)
        if op is None or not info.node_type.startswith("FullyConnected") or op.get_input_size() < 2:
            continue
        shape = tuple(op.input(1).get_partial_shape().to_shape())
        by_shape[(info.node_type, shape)][0] += info.real_time.total_seconds()
        by_shape[(info.node_type, shape)][1] += 1
    print("    FullyConnected kernels by weight shape:", flush=True)
    for (kind, shape), (t, n) in sorted(by_shape.items(), key=lambda kv: -kv[1][0])[:top]:
        rate = f", {n * np.prod(shape) / t / 1e9:.1f} G weights/s" if t > 0 else ""
        print(f"      {kind} {shape[0]} x {shape[1]} (x{n}): {t * 1e3:.2f} ms{rate}", flush=True)


def big_decode(path: str, profile: str = "", n_prompt: int = 64, steps: int = 32, rounds: int = 5,
               dqs: tuple = (None,)) -> None:
    """Decode of a model too large for two compiled models in this machine's share of memory: the prompt is fed one
    token a step, so that one compiled model (the decode step's) serves the whole run, its cache window (n_kv) one
    size throughout (n_prompt + rounds * steps <= 256). Rounds of ``steps`` decoded tokens, ours and llama.cpp's (1
    thread each; llama.cpp in a child process, so each process's peak memory is its own), taking turns from the same
    position; decode tok/s medians, and this process's peak resident memory. ``profile`` "profile": the model is
    compiled with OpenVINO's profiler (PERF_COUNT) and the kernel time a step by kind is printed after. ``dqs``
    (``dq=0,16`` on the command line): one session for each DYNAMIC_QUANTIZATION_GROUP_SIZE (one compiled model
    each), all taking turns with llama.cpp; None is the device's setting (FRAMEWORK_OPENVINO_DYNAMIC_QUANTIZATION)."""
    import subprocess

    from framework.bench import prompt_ids
    from framework.model.model import Model
    from framework.plugins.openvino_npu.device import OpenVinoDevice
    from framework.runtime.context import KV_PAD
    from framework.runtime.session import Session

    if n_prompt + (rounds + 1) * steps > KV_PAD:
        raise SystemExit(f"{n_prompt} + {rounds + 1} x {steps} tokens would cross a cache window of {KV_PAD} rows")
    model = Model(Path(path))
    ids = prompt_ids(model.tokenizer, n_prompt)

    make = _profiled_device() if profile == "profile" else OpenVinoDevice
    sessions = {}
    for dq in dqs:
        dev = make("CPU", threads=1, dynamic_quantization=dq)
        name = f"DYNAMIC_QUANTIZATION_GROUP_SIZE {dev.compiling.dynamic_quantization}"
        sessions[name] = Session(model, [dev], n_ctx=KV_PAD)
    child = subprocess.Popen([sys.executable, "-c", _LLAMA_CHILD, path, str(KV_PAD)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)

    def ask(line: str) -> str:
        child.stdin.write(line + "\n")
        child.stdin.flush()
        return child.stdout.readline().strip()

    logits, fed = {}, 0.0
    for label, s in sessions.items():
        t = time.perf_counter()
        for i in ids:
            logits[label] = s.eval([i])
        fed = max(fed, time.perf_counter() - t)
    ask("prompt " + " ".join(map(str, ids)))
    ours = {label: ([], []) for label in sessions}
    theirs, cpu_theirs = [], []
    for r in range(rounds + 1):         # the first round warms up and is not counted
        for label, s in sessions.items():
            t, c = time.perf_counter(), time.process_time()
            for _ in range(steps):
                logits[label] = s.eval([int(np.argmax(logits[label]))])
            if r:
                ours[label][0].append(steps / (time.perf_counter() - t))
                ours[label][1].append((time.process_time() - c) / steps)
        peer, peer_cpu = map(float, ask(f"decode {steps}").split())
        if r:
            theirs.append(peer)
            cpu_theirs.append(peer_cpu)
    child.stdin.close()
    child.wait()
    if profile == "profile":
        import collections
        for label, s in sessions.items():
            (program,) = s.executor.programs.values()
            kinds: dict = collections.defaultdict(float)
            for info in program.request.get_profiling_info():   # the last step's
                kinds[(info.node_type, info.exec_type)] += info.real_time.total_seconds()
            total = sum(kinds.values())
            print(f"{label}: kernels of the last step: {total * 1e3:.1f} ms", flush=True)
            for (kind, how), v in sorted(kinds.items(), key=lambda kv: -kv[1])[:5]:
                print(f"    {kind} ({how}): {v * 1e3:.1f} ms, {v / total:.0%}", flush=True)
            _products_by_shape(program)
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    size = Path(path).stat().st_size
    for label, (rates, cpus) in ours.items():
        print(f"{Path(path).name}: openvino:CPU (1 thread, {label}) decode {np.median(rates):.2f} tok/s (min "
              f"{min(rates):.2f}, max {max(rates):.2f}), llama.cpp (1 thread) {np.median(theirs):.2f} tok/s (min "
              f"{min(theirs):.2f}, max {max(theirs):.2f}): {np.median(rates) / np.median(theirs):.2f}x, medians of "
              f"{rounds} rounds of {steps} tokens after a {n_prompt}-token prompt (fed one token a step: "
              f"{len(ids) / fed:.1f} tok/s); CPU time a decoded token {np.median(cpus) * 1e3:.0f} ms against "
              f"{np.median(cpu_theirs) * 1e3:.0f} ms ({np.median(cpu_theirs) / np.median(cpus):.2f}x)", flush=True)
    print(f"{len(sessions)} compiled model(s); peak resident {peak / 1e9:.2f} GB, {peak / size:.1f}x the file "
          f"({size / 1e9:.2f} GB)", flush=True)


def rows_dq(names=("gemma3",), dqs=(16, 32), rows=(1, 8), rounds: int = 8, steps: int = 8) -> None:
    """Batched decode steps (runtime/batch.py, as a server's) of ``rows`` sequences on openvino:CPU with each
    DYNAMIC_QUANTIZATION_GROUP_SIZE, 2 threads. The settings take turns every ``steps`` steps in one process, so
    this host's drift (a quarter of its speed within an hour) falls on each alike; medians over the rounds after
    the first, robust to the one step that compiles when the cache passes a length."""
    from framework.model.default import resolve_model
    from framework.model.model import Model
    from framework.plugins.openvino_npu.device import OpenVinoDevice
    from framework.runtime.batch import Batch, Part
    from framework.runtime.session import Session
    for name in names:
        model = Model(resolve_model(name))
        runs = {}
        for dq in dqs:
            dev = OpenVinoDevice("CPU").with_options(dynamic_quantization=dq, threads=2)
            for r in rows:
                b = Batch(Session(model, [dev], n_ctx=r * (24 + rounds * steps + 8), n_batch=32, out_rows=r))
                for seq in range(r):
                    b.step([Part(seq, [100 + (seq * 7 + i) % 1000 for i in range(24)])])
                runs[(dq, r)] = (b, [])
        for rnd in range(rounds + 1):
            for (dq, r), (b, times) in runs.items():
                for _ in range(steps):
                    t = time.perf_counter()
                    b.step([Part(seq, [1]) for seq in range(r)])
                    if rnd:
                        times.append(time.perf_counter() - t)
        for r in rows:
            got = {dq: float(np.median(runs[(dq, r)][1])) * 1e3 for dq in dqs}
            print(f"{name}, {r} sequence{'s' if r > 1 else ''} a step: " + ", ".join(
                f"DYNAMIC_QUANTIZATION_GROUP_SIZE {dq} {ms:.2f} ms" for dq, ms in got.items()) +
                f" (medians of {rounds * steps} steps, in turns)", flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "fc"
    for word in [w for w in sys.argv[2:] if w.startswith("offsets=")]:    # translate.OFFSETS for this run
        from framework.plugins.openvino_npu import translate
        translate.OFFSETS = word.split("=", 1)[1]
        sys.argv.remove(word)
    if what == "big-decode":
        words = dict(w.split("=", 1) for w in sys.argv[2:] if "=" in w)
        dqs = tuple(v if v == "auto" else int(v) for v in words["dq"].split(",")) if "dq" in words else (None,)
        big_decode(*[w for w in sys.argv[2:4] if "=" not in w], steps=int(words.get("steps", 32)),
                   rounds=int(words.get("rounds", 5)), dqs=dqs)
        raise SystemExit(0)
    if what == "rows-dq":
        words = dict(w.split("=", 1) for w in sys.argv[2:] if "=" in w)
        rows_dq(tuple(w for w in sys.argv[2:] if "=" not in w) or ("gemma3",),
                dqs=tuple(int(v) for v in words.get("dq", "16,32").split(",")),
                rows=tuple(int(v) for v in words.get("rows", "1,8").split(",")), rounds=int(words.get("rounds", 8)))
        raise SystemExit(0)
    if what == "model-memory":
        model_memory(tuple(sys.argv[2:]) or ("smollm2",))
        raise SystemExit(0)
    if what == "ab":
        given = [w.partition("=") for w in sys.argv[3:]]
        opts = {k: int(v) for k, _, v in given if k in ("rounds", "threads")}
        names = tuple(w for w in sys.argv[3:] if w.partition("=")[0] not in ("rounds", "threads"))
        translation_ab(*_setting_values(sys.argv[2]), names=names or ("smollm2", "gemma3"),
                       rounds=opts.get("rounds", 5), threads=opts.get("threads", 1))
        raise SystemExit(0)
    {"threads": threads, "fc-forms": fc_forms, "offset-forms": offset_forms, "zero-points": zero_points,
     "decode-gap": decode_gap, "row-parts": row_parts, "own-head": own_head, "fc": fc, "cpu-time": cpu_time,
     "precision": precision, "rope": rope, "fused": fused,
     "floor": floor, "dynquant": dynquant, "host": host,
     "fused-model": fused_model}[what]()
