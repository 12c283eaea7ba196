"""The OpenVINO plugin (framework/plugins/openvino_npu) on openvino:CPU: real compiled models.

Discovery (openvino:CPU available, openvino:NPU unavailable with the reason), NPU profiles applied
as emulations, every op's translation against the CPU plugin's kernels, compressed weights, both
models against llama.cpp's reference with and without the npu37xx profile, a mixed plan with the
cpu device, the compiled-model count of a whole generation, the program budget at reservation,
and OpenVINO's on-disk cache.
"""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import load_model, mapping_rss_kb, reference, reference_text
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf import quants as gguf_quants
from reference_checks import assert_teacher_forced, assert_text_metrics

from framework.contract import DeviceType, Verdict
from framework.core.graph import (
    F32,
    I32,
    GraphBuilder,
    LeafKind,
    Tensor,
    leaf,
)
from framework.core.graph.quants import dequantize
from framework.core.scheduler import (
    CapabilityError,
    DeviceRunError,
    DeviceSelectionError,
    Executor,
    make_plan,
)
from framework.core.scheduler.verdicts import ask
from framework.plugins.cpu.device import CpuDevice
from framework.plugins.openvino_npu import translate as TR
from framework.plugins.openvino_npu import weights as W
from framework.plugins.openvino_npu.device import OpenVinoDevice, discover
from framework.plugins.openvino_npu.options import (
    DYNQUANT_ENV,
    THREADS_ENV,
    OpenVinoSettingError,
    cpu_isa,
    dot_product_isa,
)
from framework.plugins.openvino_npu.profiles import (
    PROFILES,
    UnknownProfileError,
    profile_for_architecture,
)
from framework.runtime.context import padded_rows
from framework.runtime.session import Session

sys.path.insert(0, str(Path(__file__).parent))
import test_ops as T

Q = GGMLQuantizationType
NPU_CTX, NPU_BATCH = 512, 64          # the emulated NPU: fixed 64-token chunks over a fixed 512-row cache


@pytest.fixture(scope="module")
def ov_cpu(registry):
    (dev,) = registry.select("openvino:CPU")
    return dev


@pytest.fixture(scope="module")
def npu(ov_cpu):
    return ov_cpu.with_options(profile="npu37xx")


@pytest.fixture(autouse=True)
def _free_compiled_models():
    """A test's sessions, and the compiled models they hold, go when it ends; the collector takes the cycles
    (a recording wrapper refers to its device)."""
    yield
    gc.collect()


# ---------------------------------------------------------------------------------------------
# devices and profiles
# ---------------------------------------------------------------------------------------------

def test_openvino_cpu_is_found_and_npu_is_unavailable_with_the_reason(registry):
    by_name = {d.name: d for d in registry.devices()}
    cpu = by_name["openvino:CPU"]
    assert cpu.available and cpu.type == DeviceType.CPU and cpu.physical_id == "host-cpu"
    assert cpu.weights_in_programs and cpu.emulation is None
    assert "OpenVINO CPU" in cpu.description
    assert "DYNAMIC_QUANTIZATION_GROUP_SIZE" in cpu.description and "INFERENCE_PRECISION_HINT" in cpu.description
    npu = by_name["openvino:NPU"]
    assert not npu.available and npu.type == DeviceType.NPU
    assert "reports no NPU" in npu.unavailable_reason and "/dev/accel" in npu.unavailable_reason
    with pytest.raises(DeviceSelectionError) as err:
        registry.select("openvino:NPU")
    assert "reports no NPU" in str(err.value)
    with pytest.raises(DeviceSelectionError) as err:
        registry.select("npu")
    assert "openvino:NPU" in str(err.value) and "reports no NPU" in str(err.value)


def test_profile_is_an_emulation_with_the_profile_limits(ov_cpu, npu):
    assert npu.name == "openvino:CPU" and npu.emulation == "npu37xx"
    assert npu.limits.max_live_programs == 255 and npu.limits.static_shapes
    assert "EMULATION of npu37xx" in npu.describe()
    assert ov_cpu.emulation is None and ov_cpu.limits.max_live_programs is None    # the original is untouched
    gdn = Tensor(name="gdn-0", dtype=F32, shape=(4, 8), op="GATED_DELTA_NET",
                 src=(leaf("x", F32, (4, 8), LeafKind.INPUT),))
    verdict = ask(npu, gdn)            # refused_ops, applied by the framework's one check
    assert isinstance(verdict, Verdict) and not verdict and verdict.code == "refused_by_profile"
    assert "npu37xx" in verdict.reason and "GatedDeltaNet" in verdict.reason
    assert ask(ov_cpu, gdn).code == "unsupported_op"
    assert ov_cpu.with_options(profile="npu40xx").emulation == "npu40xx"
    with pytest.raises(UnknownProfileError, match="npu37xx"):
        ov_cpu.with_options(profile="npu99")


def test_real_npu_profile_comes_from_its_architecture():
    assert profile_for_architecture("3720")[0] is PROFILES["npu37xx"]
    assert profile_for_architecture("4000")[0] is PROFILES["npu40xx"]
    prof, note = profile_for_architecture("5010")
    assert prof is PROFILES["npu37xx"] and "not in the profile table" in note


# ---------------------------------------------------------------------------------------------
# ops: the CPU plugin's cases through make_plan / Executor on openvino:CPU
# ---------------------------------------------------------------------------------------------

def run_on(dev, b: GraphBuilder, outputs, inputs, weights=None):
    graph = b.build(outputs)
    plan = make_plan(graph, [dev])
    assert all(plan.device_of(n) == dev.name for n in graph.nodes) and not plan.fallbacks
    weights = weights or {}
    ex = Executor([dev], lambda t: weights[t.name])
    return ex.run(plan, inputs), ex


def test_every_supported_op_has_a_translation():
    """device.py declares the ops it accepts without importing OpenVINO; translate_ops.TRANSLATE, the dispatch by op
    name, translates exactly those, so no accepted op fails at translation and no translation goes unused."""
    from framework.plugins.openvino_npu.device import SUPPORTED_OPS
    from framework.plugins.openvino_npu.translate_ops import TRANSLATE
    assert set(TRANSLATE) == set(SUPPORTED_OPS)


@pytest.mark.parametrize("name", T.DEVICE_OPS)
def test_op_matches_the_float64_reference(ov_cpu, name):
    b, outputs, inputs, ref, tol = T._device_case(name, np.random.default_rng(1234))
    (out,), ex = run_on(ov_cpu, b, outputs, inputs)
    T.check(out, ref, tol)
    assert ex.stats[ov_cpu.name]["compiles"] == 1


def test_set_rows_writes_the_cache_in_place_and_attention_sees_the_new_rows(ov_cpu):
    rng = np.random.default_rng(7)
    t, s, hkv, h, d = 3, 8, 2, 4, 16
    b = GraphBuilder()
    ck, cv = (leaf(f"cache_{x}_l0", F32, (s + 4, hkv * d), LeafKind.CACHE) for x in "kv")
    tq, tk, tv = b.input("q", F32, (t, h, d)), b.input("k", F32, (t, hkv * d)), b.input("v", F32, (t, hkv * d))
    rows, mask = b.input("rows", I32, (t,)), b.input("mask", F32, (t, s))
    kw, vw = b.set_rows(b.use(ck), tk, rows), b.set_rows(b.use(cv), tv, rows)
    out = b.flash_attn_ext(tq, b.view(kw, (s, hkv, d)), b.view(vw, (s, hkv, d)), mask, 0.25)
    graph = b.build([out])
    old_k, old_v = T.f32(rng, s + 4, hkv * d), T.f32(rng, s + 4, hkv * d)
    vals = {id(tq): T.f32(rng, t, h, d), id(tk): T.f32(rng, t, hkv * d), id(tv): T.f32(rng, t, hkv * d),
            id(rows): np.array([3, 4, s + 1], dtype=np.int32),          # the last one: a scratch row past the view
            id(mask): T.causal_mask(t, s, 3)}
    results = {}
    for dev in (ov_cpu, CpuDevice()):
        ex = Executor([dev], lambda _: None)
        plan = make_plan(graph, [dev])
        ex.prepare(plan)
        for c, old in ((ck, old_k), (cv, old_v)):
            ex.caches[id(c)][1][...] = old
        handle = ex.caches[id(ck)][1]
        (res,) = ex.run(plan, vals)
        if dev is ov_cpu:
            assert ex.caches[id(ck)][1] is handle       # written in place: the same array, no copy
        results[dev.name] = res, ex.caches[id(ck)][1].copy(), ex.caches[id(cv)][1].copy()
    (a, ka, va), (c, kc, vc) = results["openvino:CPU"], results["cpu"]
    np.testing.assert_array_equal(ka, kc)
    np.testing.assert_array_equal(va, vc)
    assert np.isfinite(a).all()
    T.check(a, c.astype(np.float64), T.NMSE_MATMUL)


QTYPES = [Q.F32, Q.F16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]


# K-quants have no quantizer in gguf.quants: random blocks with finite f16 super-block scales at these offsets
K_F16 = {Q.Q2_K: (80, 82), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def raw_weight(qtype, shape, seed=3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = T.f32(rng, *shape)
    if qtype == Q.F32:
        return values.view(np.uint8).reshape(-1)
    if qtype in K_F16:
        per, size = GGML_QUANT_SIZES[qtype]
        n = values.size // per
        blocks = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
        for off in K_F16[qtype]:
            blocks[:, off:off + 2] = rng.uniform(0.001, 0.05, (n, 1)).astype(np.float16).view(np.uint8)
        return blocks.reshape(-1)
    return np.ascontiguousarray(gguf_quants.quantize(values, qtype)).view(np.uint8).reshape(-1)


@pytest.mark.parametrize("qtype", QTYPES + [Q.Q2_K], ids=lambda q: q.name)
def test_weights_repack_exactly(qtype):
    raw = raw_weight(qtype, (4, 256))
    ref = dequantize(raw.reshape(-1), qtype, (4, 256))
    w = W.load("w", qtype, (4, 256), raw.reshape(-1), bits=4)
    np.testing.assert_allclose(W.values(w), ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max())
    assert w.nbytes == W.nbytes_for(qtype, (4, 256), 4)
    if qtype.name in W.COMPRESSED_TYPES:
        assert w.kind == "compressed"
        assert w.element == {"Q4_0": "i4", "Q4_1": "i4", "Q4_K": "u4"}.get(qtype.name, "i8")
        # the K-quants' minimums stay the file's 6-bit codes with -dmin as their scale, Q4_1's and Q5_1's are floats
        assert w.offset_form == {"Q4_K": "codes", "Q5_K": "codes", "Q4_1": "float32", "Q5_1": "float32"}.get(qtype.name)
        assert w.nbytes < ref.nbytes / 2
    elif qtype == Q.Q2_K:
        assert w.kind == "plain" and "converted to float32 at load" in W.CONVERTED["Q2_K"]


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_quantized_matmul_runs_on_compressed_constants(ov_cpu, qtype):
    rng = np.random.default_rng(11)
    raw = raw_weight(qtype, (64, 256), seed=11)
    tw = leaf("blk.0.ffn_up.weight", qtype, (64, 256), LeafKind.WEIGHT)
    b = GraphBuilder()
    x = T.f32(rng, 3, 256)
    tx = b.input("x", F32, x.shape)
    (out,), ex = run_on(ov_cpu, b, [b.mul_mat(b.use(tw), tx)], {id(tx): x}, {tw.name: raw.reshape(-1)})
    T.check(out, T.ref_mul_mat(dequantize(raw.reshape(-1), qtype, (64, 256)), x), T.NMSE_MATMUL)
    (program,) = ex.programs.values()
    kinds = {str(n.get_rt_info()["layerType"].astype(str)) for n in program.compiled.get_runtime_model().get_ops()}
    assert "FullyConnected" in kinds                  # one fused kernel over the integer weights
    consts = [str(n.get_rt_info()["outputPrecisions"].astype(str))
              for n in program.compiled.get_runtime_model().get_ops()
              if str(n.get_rt_info()["layerType"].astype(str)) == "Const"]
    assert any(p in ("i4", "u4", "i8") for p in consts), consts


def test_repacked_weights_leave_the_file_pages_and_never_touch_other_memory(tmp_path):
    """Once a weight is repacked, the device drops the model file's pages it was read from (its copy and the compiled
    models' hold the values): the mapping's resident size falls, and the bytes still read back from the file. Memory
    that is not a read-only file mapping (a copy, an anonymous mapping, a copy-on-write one) is left as it is
    (MADV_DONTNEED would zero it or undo its changes)."""
    from framework.contract import release_file_pages
    raw = raw_weight(Q.Q8_0, (256, 1024), seed=9).reshape(-1)
    path = tmp_path / "w.bin"
    path.write_bytes(bytes(4096) + raw.tobytes() + bytes(4096))
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    part = mapped[4096:4096 + raw.size]
    assert np.array_equal(part, raw) and mapping_rss_kb(path) >= raw.size // 1024
    tw = leaf("blk.0.ffn_up.weight", Q.Q8_0, (256, 1024), LeafKind.WEIGHT)
    handle = OpenVinoDevice("CPU", cache_dir=None).load_weight(tw, part)
    assert mapping_rss_kb(path) < raw.size // 1024 // 4
    assert np.array_equal(part, raw)                       # read again from the file
    np.testing.assert_array_equal(W.values(handle), dequantize(raw, Q.Q8_0, (256, 1024)))
    anon = raw.copy()
    release_file_pages(anon[4096:])
    assert np.array_equal(anon, raw)
    import mmap
    shared = mmap.mmap(-1, raw.size)                       # an anonymous mapping: dropped, its pages would be zeros
    shared[:] = raw.tobytes()
    release_file_pages(np.frombuffer(shared, dtype=np.uint8))
    assert np.array_equal(np.frombuffer(shared, dtype=np.uint8), raw)
    cow = np.memmap(path, dtype=np.uint8, mode="c")        # copy-on-write: dropped, its changes would be lost
    cow[4096:] ^= 0xFF
    release_file_pages(cow[4096:4096 + raw.size])
    assert np.array_equal(cow[4096:4096 + raw.size], raw ^ 0xFF)


def _fully_connected(program) -> int:
    return sum(str(n.get_rt_info()["layerType"].astype(str)) == "FullyConnected"
               for n in program.compiled.get_runtime_model().get_ops())


@pytest.mark.parametrize("offsets", ["zero_point", "product"])
def test_products_of_one_input_by_weights_of_one_form_are_one_kernel(ov_cpu, offsets, monkeypatch):
    """Q, K and V (gate and up) read one input: weights of one compressed form (element type, block size, scale
    type, offsets) become one product of their rows, split after. Q4_1 and Q4_1 are one (i4 with offsets), Q8_0
    and Q5_0 another (both i8 without offsets), the F16 weight stays apart: 3 kernels for 5 products, each output
    still its own weight's product, and the weights' values unchanged. With the offsets as a product of their own
    (translate.OFFSETS "product"), the fused Q4_1 pair's offsets are one more (float32) kernel."""
    monkeypatch.setattr(TR, "OFFSETS", offsets)
    shapes = {"q": (Q.Q4_1, 64), "k": (Q.Q4_1, 32), "v": (Q.Q8_0, 32), "u": (Q.Q5_0, 48), "p": (Q.F16, 16)}
    program = _products_of_one_input(ov_cpu, shapes, 3, seed=12)
    assert _fully_connected(program) == (3 if offsets == "zero_point" else 4)


def _products_of_one_input(dev, shapes: dict, rows: int, seed: int, nonzero_scales: tuple = ()):
    """Products of one (rows, 256) input by weights {name: (type, rows)} on ``dev``, each output and each weight's
    values checked against the file's; the compiled program. ``nonzero_scales``: Q4_K weights given no 6-bit scale
    of 0 (so the zero point form applies to them: translate.zero_point_ok)."""
    rng = np.random.default_rng(seed)
    raws = {f"blk.0.{k}.weight": raw_weight(qt, (n, 256), seed=i) for i, (k, (qt, n)) in enumerate(shapes.items())}
    for k in nonzero_scales:
        raws[f"blk.0.{k}.weight"].reshape(-1, 144)[:, 4:16] |= 1
    b = GraphBuilder()
    x = T.f32(rng, rows, 256)
    tx = b.input("x", F32, x.shape)
    leaves = [leaf(f"blk.0.{k}.weight", qt, (n, 256), LeafKind.WEIGHT) for k, (qt, n) in shapes.items()]
    outs, ex = run_on(dev, b, [b.mul_mat(b.use(tw), tx) for tw in leaves], {id(tx): x}, raws)
    for tw, out in zip(leaves, outs):
        ref = dequantize(raws[tw.name], tw.dtype, tw.shape)
        T.check(out, T.ref_mul_mat(ref, x), T.NMSE_MATMUL)
        np.testing.assert_allclose(W.values(ex.weights[(dev.name, id(tw))]), ref, rtol=1e-6,
                                   atol=1e-6 * np.abs(ref).max())
    (program,) = ex.programs.values()
    return program


@pytest.mark.parametrize("offsets", ["zero_point", "product"])
def test_a_4bit_product_of_many_rows_runs_in_parts(ov_cpu, offsets, monkeypatch):
    """A 4-bit product of more than translate.PRODUCT_ROWS rows (here gate and up fused, 2 x 40 Q4_K rows, with the
    limit at 24) runs as 4 products of 20 rows, their outputs side by side: each output still its own weight's
    product; with the offsets as their own product, one more kernel for the whole. An 8-bit weight of as many rows
    stays one product."""
    monkeypatch.setattr(TR, "OFFSETS", offsets)
    monkeypatch.setattr(TR, "PRODUCT_ROWS", 24)
    shapes = {"ffn_gate": (Q.Q4_K, 40), "ffn_up": (Q.Q4_K, 40), "attn_v": (Q.Q8_0, 80)}
    program = _products_of_one_input(ov_cpu, shapes, 1, seed=13, nonzero_scales=("ffn_gate", "ffn_up"))
    assert _fully_connected(program) == 1 + (4 if offsets == "zero_point" else 5)

# ---------------------------------------------------------------------------------------------
# settings: every one that changes results is requested, and a compiled model reports it
# ---------------------------------------------------------------------------------------------

def _compressed_product(dev):
    """A compiled Q4_K product on ``dev`` (a compressed FullyConnected, where dynamic quantization applies)."""
    raw = raw_weight(Q.Q4_K, (64, 256), seed=5)
    tw = leaf("blk.0.ffn_up.weight", Q.Q4_K, (64, 256), LeafKind.WEIGHT)
    b = GraphBuilder()
    tx = b.input("x", F32, (1, 256))
    x = T.f32(np.random.default_rng(5), 1, 256)
    (out,), ex = run_on(dev, b, [b.mul_mat(b.use(tw), tx)], {id(tx): x}, {tw.name: raw.reshape(-1)})
    (program,) = ex.programs.values()
    return out, program


def _plain_program(dev, cols: int = 8):
    """A compiled graph without a compressed product: it compiles with any setting on any CPU (OpenVINO 2026.4
    cannot compile a compressed product with dynamic quantization when oneDNN is capped below AVX-512)."""
    b = GraphBuilder()
    x = b.input("x", F32, (2, cols))
    (out,), ex = run_on(dev, b, [b.scale(x, 2.0)], {id(x): np.ones((2, cols), dtype=np.float32)})
    np.testing.assert_array_equal(out, 2.0)
    (program,) = ex.programs.values()
    return program


def test_requested_settings_are_the_effective_ones(ov_cpu):
    """The plugin requests INFERENCE_PRECISION_HINT and DYNAMIC_QUANTIZATION_GROUP_SIZE itself (OpenVINO's own
    choice differs between CPUs: a group of 32 with AVX-512 VNNI, none on AVX2), and every compiled model
    reports them; the report of the test run prints both beside the CPU's instruction sets."""
    requested = ov_cpu.compiling.requested()
    assert requested == {"INFERENCE_PRECISION_HINT": ov_cpu.compiling.precision,
                         "DYNAMIC_QUANTIZATION_GROUP_SIZE": ov_cpu.compiling.group_size()}
    assert ov_cpu.compile_config().items() >= requested.items()
    _, program = _compressed_product(ov_cpu)
    assert {k: program.effective[k] for k in requested} == requested
    quantized = ov_cpu.with_options(dynamic_quantization=32, cache_dir=None)
    assert "groups of 32 (DYNAMIC_QUANTIZATION_GROUP_SIZE 32)" in quantized.description
    assert _plain_program(quantized).effective["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 32


def test_a_compiled_model_with_other_settings_is_an_error(ov_cpu):
    """Were OpenVINO to compile with another setting than the one requested (one it does not apply on this CPU),
    results would change without a word: the device refuses the program, naming the setting and both values."""
    class Overridden(OpenVinoDevice):
        def compile_config(self):
            group = self.compiling.dynamic_quantization + 16
            return {**super().compile_config(), "DYNAMIC_QUANTIZATION_GROUP_SIZE": group}

    dev = Overridden("CPU", cache_dir=None, dynamic_quantization=0)
    with pytest.raises(DeviceRunError) as err:
        _plain_program(dev)
    assert "DYNAMIC_QUANTIZATION_GROUP_SIZE: requested 0, compiled model has 16" in str(err.value)
    assert DYNQUANT_ENV in str(err.value)
    assert dev.live_programs() == 0


def test_backends_lists_the_settings(capsys):
    from framework.cli.main import main
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "openvino:CPU" in out and "INFERENCE_PRECISION_HINT" in out and "DYNAMIC_QUANTIZATION_GROUP_SIZE" in out


def test_dynamic_quantization_environment_override(monkeypatch):
    monkeypatch.delenv(DYNQUANT_ENV, raising=False)
    # the plugin's choice, not OpenVINO's
    assert OpenVinoDevice("CPU", cache_dir=None).compiling.dynamic_quantization == "auto"
    gpu = OpenVinoDevice("GPU", available=False, cache_dir=None)    # auto is 0 there, and it says so
    assert gpu.compiling.requested()["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 0
    assert "(DYNAMIC_QUANTIZATION_GROUP_SIZE auto: 0, not measured on an OpenVINO GPU)" in gpu.description
    for value, want in (("32", 32), ("off", 0), ("0", 0), (" 64 ", 64), ("auto", "auto"), (" Auto", "auto")):
        monkeypatch.setenv(DYNQUANT_ENV, value)
        assert OpenVinoDevice("CPU", cache_dir=None).compiling.dynamic_quantization == want
    for bad in ("yes", "-1", "3.5"):
        monkeypatch.setenv(DYNQUANT_ENV, bad)
        with pytest.raises(OpenVinoSettingError) as err:
            OpenVinoDevice("CPU", cache_dir=None)
        assert f"{DYNQUANT_ENV}={bad!r} is not accepted" in str(err.value) and "0 or off" in str(err.value)
        assert "positive group size" in str(err.value) and "or auto" in str(err.value)


def test_auto_group_size_reaches_every_product_of_a_model(ov_cpu):
    """FRAMEWORK_OPENVINO_DYNAMIC_QUANTIZATION=auto: each compiled model quantizes its activations in groups of 32,
    or of 16 where it holds a weight in groups of 16 (Q6_K's), since OpenVINO quantizes a product's activations only
    where the group size divides its weight's group; the device's description says so, and every compiled model
    reports its own size back."""
    from framework.plugins.openvino_npu.options import group_size_for

    q4_1, q8_0, q6_k = (W.load("w", qt, (64, 256), raw_weight(qt, (64, 256))) for qt in (Q.Q4_1, Q.Q8_0, Q.Q6_K))
    assert (q4_1.group, q8_0.group, q6_k.group) == (32, 32, 16)
    assert group_size_for([q4_1, q8_0]) == 32 and group_size_for([q4_1, q6_k, q8_0]) == 16
    dev = ov_cpu.with_options(dynamic_quantization="auto")
    # auto quantizes only where the CPU has an 8-bit dot product (test_auto_is_0_without_an_8bit_dot_product
    # checks the other side on every CPU)
    want = 32 if dev.compiling.dot_product else 0
    if dev.compiling.dot_product:
        assert "groups of 32, or 16 where" in dev.description
        assert f"(DYNAMIC_QUANTIZATION_GROUP_SIZE auto: this CPU has {dev.compiling.dot_product})" in dev.description
    s = Session(load_model("smollm2"), [dev], n_ctx=512)       # Q4_1 products and a Q8_0 output head: 32
    s.eval([1, 2, 3])
    s.eval([4])
    assert {p.effective["DYNAMIC_QUANTIZATION_GROUP_SIZE"] for p in s.executor.programs.values()} == {want}
    assert {p.requested["DYNAMIC_QUANTIZATION_GROUP_SIZE"] for p in s.executor.programs.values()} == {want}


AUTO_WITHOUT_DOT_PRODUCT = """
from framework.plugins.openvino_npu.device import OpenVinoDevice
from framework.plugins.openvino_npu.options import dot_product_isa
dev = OpenVinoDevice("CPU", cache_dir=None)
c = dev.compiling
print(c.dynamic_quantization, dot_product_isa(), c.requested()["DYNAMIC_QUANTIZATION_GROUP_SIZE"])
print(dev.description)
"""


def test_auto_is_0_without_an_8bit_dot_product():
    """The default, auto, keeps float32 activations where the CPU has no 8-bit dot product: here oneDNN capped at
    AVX2 (ONEDNN_MAX_CPU_ISA, read once a process, hence the child process), where OpenVINO cannot compile a product
    with quantized activations at all (_plain_program's note); the device says why in its description, and a real
    model compiles and runs under the cap with the default."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"}
    env.pop(DYNQUANT_ENV, None)
    out = subprocess.run([sys.executable, "-c", AUTO_WITHOUT_DOT_PRODUCT], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    first, description = out.stdout.splitlines()[-2:]
    assert first == "auto None 0"
    assert "DYNAMIC_QUANTIZATION_GROUP_SIZE auto: 0, no 8-bit dot product on this CPU" in description
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in description
    run = subprocess.run([sys.executable, "-m", "framework.cli.main", "run", "-m", "smollm2", "--backends",
                          "openvino:CPU", "--strict", "-n", "2", "Hi"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]


def test_thread_count_setting_reaches_the_compiled_model(monkeypatch, capsys):
    """FRAMEWORK_OPENVINO_THREADS sets INFERENCE_NUM_THREADS (framework bench sets it to --threads, the count
    llama.cpp gets); a value it does not accept makes the devices unavailable with the reason."""
    monkeypatch.setenv(THREADS_ENV, "1")
    dev = OpenVinoDevice("CPU", cache_dir=None)
    assert dev.compiling.threads == 1 and "1 thread (INFERENCE_NUM_THREADS)" in dev.description
    assert dev.compile_config()["INFERENCE_NUM_THREADS"] == 1
    assert _plain_program(dev).effective["INFERENCE_NUM_THREADS"] == 1
    monkeypatch.delenv(THREADS_ENV)
    assert "INFERENCE_NUM_THREADS" not in OpenVinoDevice("CPU", cache_dir=None).compile_config()
    monkeypatch.setenv(THREADS_ENV, "two")
    cpu = next(d for d in discover() if d.ov_name == "CPU")
    assert not cpu.available and THREADS_ENV in cpu.unavailable_reason


def test_bench_gives_openvino_the_thread_count_of_its_peer(monkeypatch, capsys):
    """`framework bench --threads 1` makes openvino:CPU with INFERENCE_NUM_THREADS 1 (llama.cpp gets 1), leaves
    the process's environment as it was, and names the device's settings (precision, activation quantization,
    threads) in its report, so that a figure says which arithmetic it measured."""
    import framework.bench as bench
    from framework.cli.main import main
    made = []

    def select(spec, profile=None, threads=None):
        made.extend(real(spec, profile, threads))
        return made

    real = bench.select_devices
    monkeypatch.setattr(bench, "select_devices", select)
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert main(["bench", "--reservation-only", "--threads", "1", "--backends", "openvino:CPU", "-m", "smollm2"]) == 0
    (dev,) = made
    assert dev.compiling.threads == 1 and dev.compile_config()["INFERENCE_NUM_THREADS"] == 1
    assert THREADS_ENV not in os.environ
    err = capsys.readouterr().err
    assert "OpenVINO's CPU device" in err
    assert f"device openvino:CPU: {dev.description}" in err and "DYNAMIC_QUANTIZATION_GROUP_SIZE" in err
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")    # the mode moves llama.cpp's figures
    mode = thp.read_text().split("[")[1].split("]")[0] if thp.exists() else "unknown ("
    assert f"transparent huge pages: {mode}" in err


# ---------------------------------------------------------------------------------------------
# the two models against llama.cpp, with and without the npu37xx profile
# ---------------------------------------------------------------------------------------------

# Each test opens its own sessions and drops them: a compiled model holds the model's weights (about 450 MB
# for Gemma 3), and a session keeps one per step shape it has met, so sessions shared across tests would keep
# every shape of every test alive at once.

@pytest.fixture(params=["smollm2", "gemma3"])
def ov_session(request, ov_cpu):
    return request.param, Session(load_model(request.param), [ov_cpu], n_ctx=512)


@pytest.fixture(params=["smollm2", "gemma3"])
def npu_session(request, npu):
    return request.param, Session(load_model(request.param), [npu], n_ctx=NPU_CTX, n_batch=NPU_BATCH)


def _last_logits(session, name):
    ref, arrays = reference(name)
    for p in ref["prompts"]:
        session.reset()
        logits = session.eval(p["ids"])
        assert int(np.argmax(logits)) == p["greedy_ids"][0]
        assert np.corrcoef(logits, arrays[p["last_logits_key"]])[0, 1] > 0.995, p["prompt"]


def test_models_match_llama_cpp_by_decode(ov_session):
    """The prompts' last logits, and llama.cpp's tokens fed one decode step at a time (the decode model)."""
    name, session = ov_session
    _last_logits(session, name)
    assert_teacher_forced(session, reference(name)[0], by_decode=True)
    plan = next(iter(session.plans.values()))[0]
    assert len(plan.fragments) == 1 and plan.fragments[0].device == "openvino:CPU"   # the whole graph, one model


def test_models_match_llama_cpp_by_prefill(ov_session):
    name, session = ov_session
    assert_teacher_forced(session, reference(name)[0])


def test_models_match_llama_cpp_on_the_text(ov_session):
    name, session = ov_session
    ref, arrays = reference(name)
    assert_text_metrics(session, ref, arrays, session.model.tokenizer, reference_text(ref))


def test_8bit_activations_in_groups_of_16_hold_the_reference_bounds(ov_cpu):
    """FRAMEWORK_OPENVINO_DYNAMIC_QUANTIZATION=16, the setting behind issue 20's CPU decode figures (docs/openvino.md):
    the activations really are quantized (the logits move off the float32 translation's), and llama.cpp's bounds still
    hold, decode step by decode step. OpenVINO's CPU plugin quantizes activations only where the CPU has an 8-bit dot
    product (AVX-512 VNNI or AVX-VNNI); an AVX2-only CPU has no such kernel (docs/openvino.md)."""
    if dot_product_isa() is None:
        pytest.skip(f"no 8-bit dot product for OpenVINO to quantize activations with here ({cpu_isa()})")
    name = "smollm2"
    exact = Session(load_model(name), [ov_cpu.with_options(dynamic_quantization=0)], n_ctx=512)
    quantized = Session(load_model(name), [ov_cpu.with_options(dynamic_quantization=16)], n_ctx=512)
    ids = reference(name)[0]["prompts"][0]["ids"]
    assert np.abs(quantized.eval(ids) - exact.eval(ids)).max() > 1e-3
    del exact
    _last_logits(quantized, name)
    assert_teacher_forced(quantized, reference(name)[0], by_decode=True)
    assert {p.effective["DYNAMIC_QUANTIZATION_GROUP_SIZE"] for p in quantized.executor.programs.values()} == {16}


def test_models_match_llama_cpp_under_npu37xx(npu_session):
    name, session = npu_session
    ref, arrays = reference(name)
    _last_logits(session, name)
    assert_teacher_forced(session, ref)
    assert_text_metrics(session, ref, arrays, session.model.tokenizer, reference_text(ref))
    shapes = {(p.graph.meta["n_tokens"], p.graph.meta["n_kv"]) for p, _ in session.plans.values()}
    assert shapes <= {(NPU_BATCH, NPU_CTX), (1, NPU_CTX)}


def _record_runs(dev, runs: list) -> None:
    """Every run of the programs ``dev`` compiles from now on appends (program, args, results) to ``runs``,
    arrays copied as they were when passed in and when returned. (Fragments of the same structure share one
    program: a step's runs follow its plan's fragments in order.)"""
    compile_program = dev.compile

    def copy(x):
        return np.array(x, copy=True) if isinstance(x, np.ndarray) else x

    def compile(fragment):
        program = compile_program(fragment)
        run = program.run

        def recorded(args):
            before = [copy(a) for a in args]
            results = run(args)
            runs.append((program, before, [copy(r) for r in results]))
            return results

        program.run = recorded
        return program

    dev.compile = compile


def _check_cache_writes(runs, first_row: int, n_rows: int, n_ctx: int = 0) -> int:
    """Each OpenVINO run of one step wrote rows first_row.. first_row + n_rows of each cache it writes (and the
    step's padding rows, scratch rows from n_ctx on), with exactly the new rows its own model produced, and left
    every other row as it was. Returns the caches checked."""
    checked = 0
    for program, args, results in runs:
        if not hasattr(program, "translation"):
            continue
        for o, after in zip(program.translation.outputs, results):
            if o[0] != "cache":
                continue
            _, cache_arg, new_idx, rows_arg, rows_idx = o
            req = program.request
            rows = np.asarray(args[rows_arg] if rows_arg is not None else req.get_output_tensor(rows_idx).data)
            want = np.arange(first_row, first_row + n_rows)
            np.testing.assert_array_equal(rows, np.concatenate([want, n_ctx + np.arange(len(rows) - n_rows)]))
            # the values the program produced, in the rows it was given
            np.testing.assert_array_equal(after[rows], req.get_output_tensor(new_idx).data.reshape(len(rows), -1))
            untouched = np.ones(len(after), dtype=bool)
            untouched[rows] = False
            np.testing.assert_array_equal(after[untouched], args[cache_arg][untouched])
            checked += 1
    return checked


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_decode_steps_equal_prefill(ov_cpu, name):
    """Decode steps give the logits one prefill of the whole sequence gives, and each step writes its K and V
    rows, in place, with the values its own compiled model produced. With activations not quantized (the
    plugin's setting, requested explicitly: OpenVINO's own choice differs between CPUs) one row and many rows
    go through the same float32 arithmetic; the cache check holds bit for bit whatever the setting."""
    dev = ov_cpu.with_options(dynamic_quantization=0)
    session = Session(load_model(name), [dev], n_ctx=256)
    p = reference(name)[0]["prompts"][0]
    follow = p["greedy_ids"][:6]
    whole = session.eval(p["ids"] + follow, all_logits=True)
    session.reset()
    session.eval(p["ids"])
    caches = {k: h for k, (_, h) in session.executor.caches.items()}
    runs: list = []
    _record_runs(dev, runs)
    for i, tok in enumerate(follow):
        runs.clear()
        step = session.eval([tok])
        (program,) = {id(r[0]): r[0] for r in runs}.values()
        assert program.effective["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == 0
        assert _check_cache_writes(runs, len(p["ids"]) + i, 1) == 2 * session.model.hp.n_layer
        np.testing.assert_allclose(step, whole[len(p["ids"]) + i], rtol=2e-3, atol=2e-3)
    # the KV cache stayed where it was allocated: the same arrays, written in place, nothing copied
    assert all(session.executor.caches[k][1] is h for k, h in caches.items())
    assert session.executor.stats["openvino:CPU"]["bytes_copied"] == 0


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_a_whole_generation_needs_at_most_three_compiled_models_under_npu37xx(npu, name):
    ids = reference(name)[0]["prompts"][1]["ids"] * 8          # more than one 64-token chunk
    generation = Session(load_model(name), [npu], n_ctx=NPU_CTX, n_batch=NPU_BATCH)
    reservation = generation.reserve(len(ids), 40)
    assert reservation.programs["openvino:CPU"] <= 3
    logits = generation.eval(ids)
    for _ in range(39):
        logits = generation.eval([int(np.argmax(logits))])
    assert len(generation.executor.programs) <= 3
    assert generation.executor.stats["openvino:CPU"]["compiles"] <= 3


def test_mixed_plan_with_the_cpu_device_matches_llama_cpp(ov_cpu):
    """openvino:CPU refuses GET_ROWS: the embedding lookup and the output-row selection run on cpu,
    everything else on openvino:CPU, with copies between them."""
    dev = ov_cpu.with_options(refuse={"GET_ROWS": "refused for this test"})
    session = Session(load_model("smollm2"), [dev, CpuDevice()], n_ctx=256)
    ref = reference("smollm2")[0]
    assert_teacher_forced(session, ref)
    plan = next(iter(session.plans.values()))[0]
    assert {f.device for f in plan.fragments} == {"openvino:CPU", "cpu"} and plan.copies
    assert all(p.device == "cpu" for n, p in plan.fallbacks if n.op == "GET_ROWS")


def test_attention_on_cpu_reads_the_cache_openvino_writes(ov_cpu):
    """FLASH_ATTN_EXT refused: every layer's attention reads, on cpu, the cache rows openvino:CPU wrote. Checked
    bit for bit, whatever OpenVINO's settings: the K and V windows cpu received are the cache arrays as the
    OpenVINO program left them, whose new rows are the ones that program produced. The logits, computed by
    two engines, are only compared loosely against the cpu device alone (they differ by float rounding, and
    more where OpenVINO quantizes activations)."""
    model = load_model("gemma3")
    dev = ov_cpu.with_options(refuse={"FLASH_ATTN_EXT": "refused for this test"})
    cpu = CpuDevice()
    mixed = Session(model, [dev, cpu], n_ctx=64, n_layers=2)
    alone = Session(model, [CpuDevice()], n_ctx=64, n_layers=2)
    runs: list = []
    _record_runs(dev, runs)
    _record_runs(cpu, runs)
    ids = reference("gemma3")[0]["prompts"][1]["ids"]
    for tokens, first_row in [(ids, 0)] + [([tok], len(ids) + i) for i, tok in enumerate((5, 6))]:
        runs.clear()
        got, want = mixed.eval(tokens, all_logits=True), alone.eval(tokens, all_logits=True)
        rows = padded_rows(len(tokens), mixed.n_batch)           # openvino:CPU's steps come padded
        (plan,) = [p for p, _ in mixed.plans.values() if p.graph.meta["n_tokens"] == rows]
        assert [f.device for f in plan.fragments] == [dev.name, "cpu"] * 2 + [dev.name]
        assert _check_cache_writes(runs, first_row, len(tokens), mixed.n_ctx) == 4        # K and V of 2 layers
        written = {t.name: after for f, (_, _, results) in zip(plan.fragments, runs)
                   for t, after in zip(f.outputs, results) if t.op == "SET_ROWS"}
        views = 0
        for f, (_, args, _) in zip(plan.fragments, runs):
            for t, a in zip(f.inputs, args):
                if f.device == "cpu" and t.op == "VIEW" and t.src[0].op == "SET_ROWS":
                    cache = written[t.src[0].name]
                    np.testing.assert_array_equal(a.reshape(-1, cache.shape[1]), cache[:a.size // cache.shape[1]])
                    views += 1
        assert views == 4
        for g, w in zip(got, want):
            assert np.corrcoef(g, w)[0, 1] > 0.999
    assert {n.op for n, _ in next(iter(mixed.plans.values()))[0].fallbacks} == {"FLASH_ATTN_EXT"}


# ---------------------------------------------------------------------------------------------
# the program budget: counted at reservation, before anything is compiled
# ---------------------------------------------------------------------------------------------

def write_deep_llama(path: Path, n_layer: int, n_embd: int = 32, n_ff: int = 64, n_vocab: int = 64) -> Path:
    """A small llama of many layers (float32 weights), to fragment past an NPU's budget."""
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), "llama")
    for key, value in {"llama.embedding_length": n_embd, "llama.attention.head_count": 2,
                       "llama.attention.head_count_kv": 1, "llama.block_count": n_layer,
                       "llama.context_length": 256, "llama.feed_forward_length": n_ff,
                       "llama.vocab_size": n_vocab}.items():
        w.add_uint32(key, value)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    hd = n_embd // 2

    def t(name, *shape):
        w.add_tensor(name, (rng.standard_normal(shape) * 0.1).astype(np.float32))

    t("token_embd.weight", n_vocab, n_embd)
    w.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    for il in range(n_layer):
        p = f"blk.{il}."
        w.add_tensor(p + "attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        t(p + "attn_q.weight", n_embd, n_embd)
        t(p + "attn_k.weight", hd, n_embd)
        t(p + "attn_v.weight", hd, n_embd)
        t(p + "attn_output.weight", n_embd, n_embd)
        t(p + "ffn_gate.weight", n_ff, n_embd)
        t(p + "ffn_up.weight", n_ff, n_embd)
        t(p + "ffn_down.weight", n_embd, n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_fragmented_plan_fails_at_reservation_naming_count_and_budget(tmp_path, monkeypatch, ov_cpu):
    """One op refused per layer (GLU) splits every layer's graph; with weights folded into programs
    every fragment is its own compiled model. 140 layers need 2 x 141 = 282 > 255 for prefill and
    decode: reservation says so, naming the count and the budget, and nothing is compiled."""
    from framework.model.model import Model
    monkeypatch.setenv("FRAMEWORK_CACHE", str(tmp_path / "index"))
    model = Model(write_deep_llama(tmp_path / "deep.gguf", 140))
    npu = ov_cpu.with_options(profile="npu37xx", refuse={"GLU": "refused for this test"})
    session = Session(model, [npu, CpuDevice()], n_ctx=128, n_batch=16)
    with pytest.raises(CapabilityError) as err:
        session.reserve(20, 10)
    e = err.value
    assert e.code == "program_budget" and e.limit == "max_live_programs=255" and e.devices == ("openvino:CPU",)
    assert "EMULATION of npu37xx" in str(e) and "allows 255" in str(e) and "need 282 distinct programs" in str(e)
    assert npu.stats.compiled == npu.stats.from_cache == 0 and not session.executor.programs
    # the unfragmented plan of the same model fits: one compiled model per phase
    whole = Session(model, [ov_cpu.with_options(profile="npu37xx"), CpuDevice()], n_ctx=128, n_batch=16)
    assert whole.reserve(20, 10).programs == {"openvino:CPU": 2}


def test_real_model_fragmented_count_is_checked_against_the_budget(ov_cpu):
    """SmolLM2 (30 layers) with GLU refused: the count (62) is known at reservation; below it, an error."""
    model = load_model("smollm2")
    fits = Session(model, [ov_cpu.with_options(profile="npu37xx", refuse={"GLU": "test"}), CpuDevice()], n_ctx=128,
                   n_batch=16)
    assert fits.reserve(20, 10).programs["openvino:CPU"] == 62
    tight = ov_cpu.with_options(profile="npu37xx", refuse={"GLU": "test"}, max_live_programs=40)
    with pytest.raises(CapabilityError) as err:
        Session(model, [tight, CpuDevice()], n_ctx=128, n_batch=16).reserve(20, 10)
    assert "allows 40" in str(err.value) and "need 62" in str(err.value)
    assert tight.stats.compiled == 0


def test_budget_counts_programs_other_sessions_hold(ov_cpu):
    """The budget is per process: a second session on the same (emulated) NPU, say a draft model beside
    its target, is refused at reservation while the first holds its programs, and fits once they are
    freed."""
    import gc
    model = load_model("smollm2")
    ids = reference("smollm2")[0]["prompts"][0]["ids"]

    def session():
        dev = ov_cpu.with_options(profile="npu37xx", max_live_programs=3, cache_dir=None)
        return dev, Session(model, [dev], n_ctx=64, n_batch=16, n_layers=2)

    dev_a, first = session()
    first.eval(ids)
    first.eval([5])
    assert dev_a.live_programs() == 2 and first.executor.programs_per_device() == {"openvino:CPU": 2}
    first.reserve(len(ids), 4)                  # its own programs are not counted twice
    dev_b, second = session()
    with pytest.raises(CapabilityError) as err:
        second.reserve(len(ids), 4)
    e = err.value
    assert e.code == "program_budget" and e.limit == "max_live_programs=3"
    assert "need 2 distinct programs" in str(e) and "other sessions of this process already hold 2" in str(e)
    assert "close the other sessions" in e.fix and dev_b.stats.compiled == 0
    del first
    gc.collect()
    assert dev_b.live_programs() == 0
    assert second.reserve(len(ids), 4).programs == {"openvino:CPU": 2}


def test_device_refuses_to_compile_past_its_budget(ov_cpu):
    """The guard behind reservation: the budget+1-th live compiled model is an error that says so."""
    dev = ov_cpu.with_options(profile="npu37xx", max_live_programs=2, cache_dir=None)
    programs = []
    for k in range(3):
        b = GraphBuilder()
        x = b.input("x", F32, (2, 4 + k))
        plan = make_plan(b.build([b.scale(x, 2.0)]), [dev])
        ex = Executor([dev], lambda _: None)
        if k < 2:
            ex.prepare(plan)
            programs.append(ex)
        else:
            with pytest.raises(DeviceRunError, match="budget is 2"):
                ex.prepare(plan)


# ---------------------------------------------------------------------------------------------
# OpenVINO's on-disk cache: a second run compiles nothing
# ---------------------------------------------------------------------------------------------

def test_second_run_compiles_nothing(tmp_path, ov_cpu):
    model = load_model("smollm2")
    ids = reference("smollm2")[0]["prompts"][0]["ids"]
    outs = []
    for run in range(2):
        dev = ov_cpu.with_options(cache_dir=tmp_path / "ov-cache")      # a fresh device, as a new process has
        session = Session(model, [dev], n_ctx=64, n_layers=3)
        logits = session.eval(ids)
        outs.append(session.eval([int(np.argmax(logits))]))
        if run == 0:
            assert dev.stats.compiled == 2 and dev.stats.from_cache == 0
        else:
            assert dev.stats.compiled == 0 and dev.stats.from_cache == 2
            assert "this run compiled nothing" in dev.compile_summary()
    np.testing.assert_array_equal(outs[0], outs[1])
    # OpenVINO's CPU plugin applies DYNAMIC_QUANTIZATION_GROUP_SIZE when it imports a cached model: a blob
    # compiled with one setting is imported under another, and reports the one requested
    for k, dq in enumerate((0, 32)):
        dev = ov_cpu.with_options(cache_dir=tmp_path / "ov-cache-plain", dynamic_quantization=dq)
        assert _plain_program(dev, cols=12).effective["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == dq
        assert (dev.stats.compiled, dev.stats.from_cache) == ((1, 0) if k == 0 else (0, 1))


def test_program_budget_error_names_what_splits_the_layers_and_how_many_fit(ov_cpu):
    """An NPU's budget overrun says which refusals cut its layers into more programs and how many whole layers
    the budget holds, so the fix is a number, not a guess. (Reservation only: nothing is compiled.)"""
    from framework.registry import default_registry
    model = load_model("smollm2")
    dev = ov_cpu.with_options(profile="npu37xx", max_live_programs=40, cache_dir=None,
                              refuse={"ROPE": "refused here to split every layer"})
    session = Session(model, [dev, *default_registry().select("cpu")], n_ctx=256)
    with pytest.raises(CapabilityError) as err:
        session.reserve(8, 2)
    e = err.value
    n_layer = model.hp.n_layer
    assert e.code == "program_budget" and "allows 40 live compiled programs" in str(e)
    assert f"its fragments are split by the nodes it refuses: {2 * n_layer} ROPE (refused_by_profile)" in str(e)
    fit = re.search(r"at most 40 fit \(the programs of layers 0-(\d+), (\d+) of (\d+) layers\)", e.fix)
    assert fit and int(fit[3]) == n_layer and int(fit[2]) == int(fit[1]) + 1 and 0 < int(fit[2]) < n_layer, e.fix
    # the count holds: the model cut to that many layers fits the budget, one layer more does not
    layers = int(fit[2])
    assert Session(model, [dev, *default_registry().select("cpu")], n_ctx=256, n_layers=layers).reserve(8, 2)
    with pytest.raises(CapabilityError):
        Session(model, [dev, *default_registry().select("cpu")], n_ctx=256, n_layers=layers + 1).reserve(8, 2)
    assert dev.stats.compiled == 0
