"""The measurements behind the plugin's choices (docs/openvino.md), reproducible:

    python -m framework.plugins.openvino_npu.measure fc          # compressed FullyConnected forms, 1 thread
    python -m framework.plugins.openvino_npu.measure cpu-time    # decode and prefill CPU time per token,
                                                                 # openvino:CPU and llama.cpp, 1 thread each
    python -m framework.plugins.openvino_npu.measure precision   # INFERENCE_PRECISION_HINT f32 / bf16 / f16
    python -m framework.plugins.openvino_npu.measure rope        # the pair swap of rope: Gather against Roll
    python -m framework.plugins.openvino_npu.measure fused       # Q, K, V and gate, up as separate products
                                                                 # or fused into two (SmolLM2's shapes)
    python -m framework.plugins.openvino_npu.measure floor       # a decode step's time per kernel kind, from
                                                                 # OpenVINO's profiler, and the ceiling that
                                                                 # the FullyConnected kernels alone leave

CPU time (not wall time) on one thread is what other work on the machine disturbs least.
Tokens per second against llama.cpp on two threads come from `framework bench --backends openvino:CPU`.
"""

from __future__ import annotations

import sys
import time

import numpy as np


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
    from ...model.default import model_path
    from ...model.model import Model
    from ...runtime.session import Session
    from .device import OpenVinoDevice

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
    from ...model.default import model_path
    path = model_path(name)
    llm = Llama(str(path), n_ctx=512, n_batch=512, n_threads=1, n_threads_batch=1, verbose=False)
    times = _cpu_time_per_token(llm.reset, llm.eval, ids)
    llm.close()
    return times


def _ids(name: str) -> list[int]:
    from ...bench import prompt_ids
    from ...model.default import model_path
    from ...model.model import Model
    return prompt_ids(Model(model_path(name)).tokenizer, 128)


def cpu_time() -> None:
    for name in ("smollm2", "gemma3"):
        ids = _ids(name)
        d, p = _openvino_cpu_time(name, ids)
        print(f"{name} openvino:CPU: decode {d * 1e3:.1f} ms, prefill {p * 1e3:.2f} ms CPU time per token (1 thread)")
        ref = _llama_cpu_time(name, ids)
        if ref:
            print(f"{name} llama.cpp:    decode {ref[0] * 1e3:.1f} ms, prefill {ref[1] * 1e3:.2f} ms CPU time per token "
                  f"(1 thread)")


def precision() -> None:
    ids = _ids("smollm2")
    for hint in ("f32", "bf16", "f16"):
        d, p = _openvino_cpu_time("smollm2", ids, hint)
        print(f"INFERENCE_PRECISION_HINT {hint}: decode {d * 1e3:.1f} ms, prefill {p * 1e3:.2f} ms CPU time per token")


def rope(t: int = 1, h: int = 9, d: int = 64, layers: int = 60) -> None:
    """The swap of each pair's members in rope (interleaved pairs), two ways, per (t, h, d) tensor."""
    import openvino as ov
    from openvino import opset13 as ops

    from .translate import rope_partner

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


def floor(names=("smollm2", "gemma3"), steps: int = 20) -> dict:
    """Decode on openvino:CPU (2 threads, as `framework bench`) with OpenVINO's per-node profiler on:
    milliseconds per token by kernel kind, and the tokens per second the FullyConnected kernels alone
    would allow if everything else cost nothing."""
    import collections

    from ...model.default import model_path
    from ...model.model import Model
    from ...runtime.session import Session
    from .device import OpenVinoDevice, OvProgram

    programs: list[OvProgram] = []

    class Profiled(OpenVinoDevice):
        def compile_config(self):
            cfg = {**super().compile_config(), "PERF_COUNT": True}
            cfg.pop("CACHE_DIR", None)          # a cached blob would come back without the profiler
            return cfg

        def compile(self, fragment):
            program = super().compile(fragment)
            programs.append(program)
            return program

    from ...bench import prompt_ids

    out = {}
    for name in names:
        model = Model(model_path(name))
        s = Session(model, [Profiled("CPU")], n_ctx=512)
        logits = s.eval(prompt_ids(model.tokenizer, 256))   # as framework bench
        for _ in range(3):
            logits = s.eval([int(np.argmax(logits))])
        decode = programs[-1]
        per_kind: dict[str, float] = collections.defaultdict(float)
        wall = time.perf_counter()
        for _ in range(steps):
            logits = s.eval([int(np.argmax(logits))])
            for info in decode.request.get_profiling_info():
                per_kind[info.node_type] += info.real_time.total_seconds() / steps
        wall = (time.perf_counter() - wall) / steps
        fc = sum(v for k, v in per_kind.items() if k.startswith("FullyConnected"))
        kernels = sum(per_kind.values())
        print(f"{name}: decode {wall * 1e3:.1f} ms a token ({1 / wall:.1f} tok/s); OpenVINO's kernels "
              f"{kernels * 1e3:.1f} ms, of which FullyConnected {fc * 1e3:.1f} ms: the weight products alone allow "
              f"at most {1 / fc:.1f} tok/s")
        for kind, v in sorted(per_kind.items(), key=lambda kv: -kv[1])[:8]:
            print(f"    {kind:28s} {v * 1e3:6.2f} ms")
        out[name] = {"wall_s": wall, "kernels_s": kernels, "fc_s": fc}
    return out


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "fc"
    {"fc": fc, "cpu-time": cpu_time, "precision": precision, "rope": rope, "fused": fused, "floor": floor}[what]()
