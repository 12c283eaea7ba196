"""The measurements behind the plugin's choices (docs/openvino.md), reproducible:

    python -m framework.plugins.openvino_npu.measure fc          # compressed FullyConnected forms, 1 thread
    python -m framework.plugins.openvino_npu.measure cpu-time    # decode and prefill CPU time per token,
                                                                 # openvino:CPU and llama.cpp, 1 thread each
    python -m framework.plugins.openvino_npu.measure precision   # INFERENCE_PRECISION_HINT f32 / bf16 / f16

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
    from ...model.default import default_model_path, smollm2_path
    from ...model.model import Model
    from ...runtime.session import Session
    from .device import OpenVinoDevice

    class OneThread(OpenVinoDevice):
        def compile_config(self):
            return {**super().compile_config(), "INFERENCE_NUM_THREADS": 1}

    model = Model({"smollm2": smollm2_path, "gemma3": default_model_path}[name]())
    s = Session(model, [OneThread("CPU", precision=precision)], n_ctx=512)
    s.eval(ids)
    s.eval([5])
    decode = prefill = 1e9
    for _ in range(3):
        s.reset()
        c = time.process_time()
        s.eval(ids)
        prefill = min(prefill, (time.process_time() - c) / len(ids))
        c = time.process_time()
        for _ in range(20):
            s.eval([5])
        decode = min(decode, (time.process_time() - c) / 20)
    return decode, prefill


def _llama_cpu_time(name: str, ids: list[int]) -> tuple[float, float] | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from ...model.default import default_model_path, smollm2_path
    path = {"smollm2": smollm2_path, "gemma3": default_model_path}[name]()
    llm = Llama(str(path), n_ctx=512, n_batch=512, n_threads=1, n_threads_batch=1, verbose=False)
    decode = prefill = 1e9
    for _ in range(3):
        llm.reset()
        c = time.process_time()
        llm.eval(ids)
        prefill = min(prefill, (time.process_time() - c) / len(ids))
        c = time.process_time()
        for _ in range(20):
            llm.eval([5])
        decode = min(decode, (time.process_time() - c) / 20)
    llm.close()
    return decode, prefill


def _ids(name: str) -> list[int]:
    from ...bench import prompt_ids
    from ...model.default import default_model_path, smollm2_path
    from ...model.model import Model
    return prompt_ids(Model({"smollm2": smollm2_path, "gemma3": default_model_path}[name]()).tokenizer, 128)


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


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "fc"
    {"fc": fc, "cpu-time": cpu_time, "precision": precision}[what]()
