"""The Vulkan plugin (framework.plugins.vulkan) on whatever Vulkan adapter wgpu finds: in CI, Mesa's
lavapipe (a software Vulkan driver running on the host CPU; `make test` installs it).

What runs here, and how it is reduced for lavapipe's speed (about 0.5 GMAC/s on CI's 2 cores, some
50 times slower than numpy):

* discovery: the adapter is a Vulkan one, its limits are reported; every unavailable reason (no wgpu,
  no loader, no driver, only non-Vulkan adapters) is precise;
* every case of the op conformance suite (framework/conformance/cases.py) against the CPU plugin with
  ggml's NMSE thresholds, the refusals limited to the weight types the plugin does not claim and the
  ops it has no kernel for; the MUL_MAT cases again with the cooperative matrix-vector kernel a GPU
  adapter uses (lavapipe, a CPU adapter, normally takes the register-tiled kernel), with f16 arithmetic
  off, and with weights split into several chunks (a binding limit made small); the whole decode steps
  (DECODE cases) with the kernels a GPU fuses them into, each fusion turned off in turn;
* both models against llama.cpp's reference outputs (tests/reference), in full, with the README's
  bounds as test_reference_cpu.py applies them: teacher-forced greedy on every prompt, perplexity and
  top-1 agreement over the whole text (about 10 minutes of the test run on lavapipe).
  FRAMEWORK_VULKAN_QUICK=1 reduces them for a quick local check: teacher-forced greedy on the first
  prompt only, and the text's first 48 tokens. On a prefix the README's bounds (1% perplexity, 94%
  top-1) are not meaningful -- the CPU plugin's exact float32 forward is itself 1.4% off llama.cpp's
  perplexity on SmolLM2's first 64 tokens -- so the prefix is held to the CPU plugin's own result on
  it (perplexity within 0.5%, per-token NLL within 0.05 on average) and to llama.cpp's per-token NLL
  (mean difference under 0.1) and top-1 (at least 90%);
* the decode kernels a GPU adapter takes (fused, at most 150 dispatches a step; and unfused) forced on
  lavapipe with both models' real weights: llama.cpp's greedy tokens for the first prompt fed one
  decode step at a time, within the README's bounds;
* decode steps (KV cache on the device) equal one prefill; a mixed plan with the cpu plugin; one
  submission per run and pipelines made once.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import load_model, reference, reference_text
from reference_checks import assert_decode_equals_prefill, assert_teacher_forced, assert_text_metrics

from framework.contract import DeviceType, Verdict
from framework.core.graph import F32, GraphBuilder, LeafKind, Tensor, leaf
from framework.core.scheduler import Executor, make_plan
from framework.core.scheduler.verdicts import ask
from framework.plugins.cpu.device import CpuDevice
from framework.runtime.perplexity import perplexity
from framework.runtime.session import Session

FULL = os.environ.get("FRAMEWORK_VULKAN_QUICK") != "1"
PREFIX = 48


@pytest.fixture(scope="module")
def vk(registry):
    devs = [d for d in registry.devices() if d.name.startswith("vulkan:")]
    assert devs, f"the vulkan plugin registered no device:\n{registry.describe_devices()}"
    dev = devs[0]
    if not dev.available:
        pytest.fail(f"vulkan:0 is unavailable: {dev.unavailable_reason} (make test installs mesa-vulkan-drivers "
                    f"and libvulkan1)")
    return dev


# ------------------------------------------------------------------------------------------------------
# discovery
# ------------------------------------------------------------------------------------------------------

def test_the_device_is_a_vulkan_adapter(vk):
    assert vk.name == "vulkan:0"
    assert vk.data["backend"] == "Vulkan", vk.data
    if vk.type == DeviceType.CPU:
        assert vk.physical_id == "host-cpu"     # lavapipe runs on the host's CPU, as the cpu plugin does
    else:
        assert vk.physical_id.startswith("pci ") or vk.physical_id.count(":") == 2, vk.physical_id
    for key in ("max_buffer_size", "max_storage_buffer_binding_size", "max_compute_workgroup_size",
                "max_compute_invocations_per_workgroup", "shader_f16", "subgroups"):
        assert key in vk.data, key
    if "llvmpipe" in vk.data["adapter"]:
        assert vk.type == DeviceType.CPU and "lavapipe" in vk.description and "not GPU figures" in vk.description
    assert vk.limits.dtypes >= {"Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K", "F32", "F16"}


def _rediscover(monkeypatch, **patches):
    from framework.plugins.vulkan import discovery
    for name, value in patches.items():
        monkeypatch.setattr(discovery, name, value)
    monkeypatch.setattr(discovery, "_cached", None)
    try:
        return discovery.discover()
    finally:
        discovery._cached = None


def test_unavailable_without_wgpu(monkeypatch):
    import builtins
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "wgpu" or name.startswith("wgpu."):
            raise ImportError("No module named 'wgpu'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    found = _rediscover(monkeypatch)
    assert not found.adapters and "wgpu" in found.reason and "pip install" in found.reason


def test_unavailable_without_loader(monkeypatch):
    found = _rediscover(monkeypatch, find_loader=lambda: None)
    assert not found.adapters and "Vulkan loader" in found.reason and "libvulkan1" in found.reason


def test_unavailable_without_driver(monkeypatch):
    found = _rediscover(monkeypatch, icd_manifests=list)
    assert not found.adapters and "no Vulkan driver" in found.reason and "mesa-vulkan-drivers" in found.reason


def test_non_vulkan_adapters_are_refused(monkeypatch):
    import wgpu
    import wgpu.backends.wgpu_native  # noqa: F401  (which replaces wgpu.gpu: patch the one discovery uses)

    class FakeAdapter:
        info = {"device": "Some GL renderer", "backend_type": "OpenGL", "adapter_type": "IntegratedGPU"}  # noqa: RUF012

    monkeypatch.setattr(wgpu.gpu, "enumerate_adapters_sync", lambda: [FakeAdapter()])
    found = _rediscover(monkeypatch)
    assert not found.adapters and "only non-Vulkan adapters" in found.reason and "OpenGL" in found.reason
    from framework.plugins.vulkan.device import VulkanDevice
    dev = VulkanDevice(0, None, found.reason)
    assert not dev.available and "OpenGL" in dev.unavailable_reason
    node = Tensor("x", F32, (2,), op="ADD", src=(leaf("a", F32, (2,), LeafKind.INPUT),) * 2)
    assert not ask(dev, node).ok


# ------------------------------------------------------------------------------------------------------
# ops: the conformance cases
# ------------------------------------------------------------------------------------------------------

def _cases():
    from framework.conformance.cases import all_cases
    return all_cases()


CASES = _cases()
_refs: dict[str, list] = {}


def _run(dev, b, times=1):
    plan = make_plan(b.graph, [dev])
    assert all(plan.device_of(n) == dev.name for n in b.graph.nodes)
    ex = Executor([dev], b.weight_bytes)
    return [[np.array(o, copy=True) for o in ex.run(plan, b.fresh_inputs())] for _ in range(times)]


def _declared_gap(n, v) -> bool:
    """A refusal the plugin owns up to: a weight type it does not claim, or an op (or an op's variant) it
    has no kernel for: Qwen3.5's CONCAT, SSM_CONV and GATED_DELTA_NET, sigmoid and softplus, rope
    frequency factors."""
    from framework.conformance.cases import EXTRA_WEIGHT_TYPES
    from framework.plugins.vulkan.verdicts import OPS
    from framework.plugins.vulkan.wgsl import UNARY_CODE
    if any(s.dtype.name in {q.name for q in EXTRA_WEIGHT_TYPES} for s in n.src):
        return True
    return v.code == "unsupported_op" and (n.op not in OPS or (n.op == "UNARY" and n.params["op"] not in UNARY_CODE)
                                           or (n.op == "ROPE" and len(n.src) > 2))


def _check_case(dev, case):
    from framework.conformance.cases import nmse
    b = case.build()
    refused = [(n, v) for n in b.graph.nodes for v in [ask(dev, n)] if not v.ok]
    if refused:
        for n, v in refused:
            assert isinstance(v, Verdict) and v.code and v.reason
            assert _declared_gap(n, v), f"{case.id}: refused {n.describe()}: {v}"
        return "refused"
    if case.id not in _refs:
        (_refs[case.id],) = _run(CpuDevice(), b)
    (outs,) = _run(dev, b)
    for out, ref, t in zip(outs, _refs[case.id], b.graph.outputs):
        if t.dtype.name == "I32":       # indices (ARGMAX): exactly the reference's
            assert out.dtype == np.int32 and np.array_equal(out, ref), case.id
            continue
        assert out.shape == t.shape and out.dtype == np.float32 and np.isfinite(out).all(), case.id
        err = nmse(out, ref)
        assert err <= b.tolerance, f"{dev.name} {case.id}: NMSE {err:.3e} > {b.tolerance:.0e}"
    return "ok"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_conformance_case(vk, case):
    _check_case(vk, case)


@pytest.fixture
def variant(vk):
    """The device with some settings changed for one test (restored after): its pipelines stay cached."""
    saved = {"cpu_adapter": vk.cpu_adapter, "f16": vk.f16, "max_binding": vk.max_binding, "disabled": vk.disabled}
    yield vk
    for k, v in saved.items():
        setattr(vk, k, v)


MUL_MAT_CASES = [c for c in CASES if c.op in ("MUL_MAT", "GET_ROWS", "FLASH_ATTN_EXT", "SET_ROWS")]


def test_cooperative_matvec_and_f32_kernels(variant):
    """The kernels a GPU adapter takes (cooperative matrix-vector for decode, attention split across
    workgroups when few query rows, tiles by output size), with and without f16."""
    from functools import partial

    from framework.conformance.cases import Case, flash_attn, kv_attention
    long_attention = [  # more keys than one workgroup takes: the split ("flash decoding") path
        Case("split-attn-T1-KV300-H9-Hkv3-D64", "FLASH_ATTN_EXT", partial(flash_attn, t=1, n_kv=300, h=9, hkv=3, d=64)),
        Case("split-attn-T2-KV520-H4-Hkv1-D256-window", "FLASH_ATTN_EXT",
             partial(flash_attn, t=2, n_kv=520, h=4, hkv=1, d=256, window=300)),
        Case("split-attn-T1-KV700-H4-Hkv2-D32-unwritten", "FLASH_ATTN_EXT",
             partial(flash_attn, t=1, n_kv=700, h=4, hkv=2, d=32, n_past=450)),
        Case("split-kv-attention-ctx512-T1-past300", "SET_ROWS",
             partial(kv_attention, n_ctx=512, t=1, n_past=300, h=9, hkv=3, d=64)),
    ]
    variant.cpu_adapter = False
    for f16 in (True, False):
        variant.f16 = f16 and "shader-f16" in variant.adapter.features
        results = [_check_case(variant, c) for c in MUL_MAT_CASES]
        assert results.count("ok") >= len(results) - 12
        assert all(_check_case(variant, c) == "ok" for c in long_attention)


DECODE_CASES = [c for c in CASES if c.id.startswith("DECODE-")]


@pytest.mark.parametrize("unfuse", ["", "attn", "combine", "norm", "add", "glu", "attn,norm,add,glu"])
def test_fused_decode_kernels(variant, monkeypatch, unfuse):
    """Whole decode steps of small llama and gemma3 models (the conformance suite's DECODE cases) with the
    kernels a GPU fuses them into, and with each fusion turned off by FRAMEWORK_VULKAN_UNFUSE: every
    output, the caches included, against the CPU plugin."""
    monkeypatch.setenv("FRAMEWORK_VULKAN_UNFUSE", unfuse)
    variant.cpu_adapter = False
    for case in DECODE_CASES:
        assert _check_case(variant, case) == "ok"
        plan = make_plan(case.build().graph, [variant])
        names = [st.name.split(" ")[0] for st in variant.compile(plan.fragments[0]).steps]
        off = set(unfuse.split(","))
        assert any(n.startswith("NORM+") for n in names) == ("norm" not in off), names
        if "-layer" in case.id:
            assert any(n.endswith("QKV+ROPE+SET_ROWS+FLASH_ATTN_EXT") for n in names) == ("attn" not in off), names
            assert any("GLU" in n and "MUL_MAT" in n for n in names) == ("glu" not in off), names


def test_fused_attention_with_its_own_products(variant, monkeypatch):
    """The attention block with Q, K and V made before it by their own matrix-vector kernel (what heads as
    large as Gemma 3's take: the core's fusion.ATTN_OWN_PRODUCTS, here 0 so the small models take it too),
    every output of the DECODE cases against the CPU plugin."""
    from framework.core.graph import fusion
    monkeypatch.setattr(fusion, "ATTN_OWN_PRODUCTS", 0)
    variant.cpu_adapter = False
    for case in DECODE_CASES:
        assert _check_case(variant, case) == "ok"
        if "-layer" in case.id:
            plan = make_plan(case.build().graph, [variant])
            names = [st.name.split(" ")[0] for st in variant.compile(plan.fragments[0]).steps]
            assert "ROPE+SET_ROWS+FLASH_ATTN_EXT" in names and "NORM+MUL_MATx3" in names, names
            assert not any(n.endswith("QKV+ROPE+SET_ROWS+FLASH_ATTN_EXT") for n in names), names


@pytest.mark.parametrize("shape", ["x8=1", "x8=1,tpr=4,sg=1,r=2", "x8=0,tpr=8,sg=0,r=1", "x8=0,r=8,wg=128"])
def test_fused_decode_kernel_shapes(variant, monkeypatch, shape):
    """The fused kernels in other matrix-vector shapes (FRAMEWORK_VULKAN_MATVEC): x quantized to 8 bits in
    the kernel's prologue, sums through subgroup shuffles or workgroup memory, several rows a thread.
    (With 8-bit x forced on every product, whole random layers lose about as much as MUL_MAT's threshold
    allows, fused or not: the single products are the check there.)"""
    monkeypatch.setenv("FRAMEWORK_VULKAN_MATVEC", shape)
    variant.cpu_adapter = False
    single = [c for c in DECODE_CASES if "+MUL_MAT-" in c.id]
    for case in DECODE_CASES if "x8=0" in shape else single:
        assert _check_case(variant, case) == "ok"


def test_unknown_fusion_names_are_refused(vk, monkeypatch):
    case = DECODE_CASES[-1]
    monkeypatch.setenv("FRAMEWORK_VULKAN_UNFUSE", "attn,gluu")
    with pytest.raises(Exception, match=r"FRAMEWORK_VULKAN_UNFUSE='attn,gluu': no fusion named 'gluu'; the fusions "
                                        r"are attn, combine, norm, add, glu, rms_mul, or 'all'"):
        _run(vk, case.build())


@pytest.mark.parametrize("shape", ["x8=1", "x8=1,r=8", "x8=1,tpr=4,sg=1,r=2", "x8=0,r=4", "x8=0,tpr=4,sg=1"])
def test_matvec_shapes(variant, monkeypatch, shape):
    """Every shape of the matrix-vector kernel (FRAMEWORK_VULKAN_MATVEC): x in 8 bits (integer dot
    products) or f32, several weight rows per thread, sums through subgroup shuffles (a team of 4
    threads fits in lavapipe's subgroups) or workgroup memory; 1 to 8 rows of x."""
    from functools import partial

    from framework.conformance.cases import Case, Q, mul_mat_weight
    monkeypatch.setenv("FRAMEWORK_VULKAN_MATVEC", shape)
    variant.cpu_adapter = False
    for q in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K):
        for m in (1, 2, 5):
            assert _check_case(variant, Case(f"matvec-{shape}-{q.name}-{m}", "MUL_MAT",
                                             partial(mul_mat_weight, qtype=q, n=70, k=512, m=m))) == "ok"


@pytest.mark.parametrize("shape", [f"reg=0,{tile}f16={f16}" for f16 in (0, 1)
                                   for tile in ("", "bm=64,bn=64,split=1,", "bm=32,bn=32,kg=2,split=3,")])
def test_tiled_matmul_shapes(variant, monkeypatch, shape):
    """The workgroup-memory tiled product a GPU takes for prefill (FRAMEWORK_VULKAN_MATMUL forces it on
    lavapipe): tiles of 64 x 64, 64 x 32, 32 x 32, one or two groups a step, K split into parts (the last
    one shorter) or not, in f32 and in f16 (x scaled per group, codes in f16, partial sums of a group
    in f16), for every weight type; partial tiles along both axes."""
    from functools import partial

    from framework.conformance.cases import Case, Q, mul_mat_weight
    if "f16=1" in shape:
        if "shader-f16" not in variant.gpu.features:
            pytest.skip(f"the device {variant.data['adapter']!r} has no shader-f16 (not offered, or "
                        "FRAMEWORK_VULKAN_F16=0): the f16 tiles cannot run")
        variant.f16 = True
    monkeypatch.setenv("FRAMEWORK_VULKAN_MATMUL", shape)
    for q in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q6_K):
        for n, k, m in ((70, 512, 33), (130, 768, 9)):
            assert _check_case(variant, Case(f"tile-{shape}-{q.name}-{n}x{k}-{m}", "MUL_MAT",
                                             partial(mul_mat_weight, qtype=q, n=n, k=k, m=m))) == "ok"


def test_weights_split_across_bindings(variant):
    """A weight larger than one storage binding is split into chunks of rows, not refused."""
    from functools import partial

    from framework.conformance.cases import Case, Q, get_rows_weight, mul_mat_weight
    variant.max_binding = 20480
    for cpu_adapter in (True, False):
        variant.cpu_adapter = cpu_adapter
        for q in (Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.Q4_1, Q.Q5_0, Q.Q4_0, Q.F32):
            assert len(variant.chunk_plan(q.name, (200, 512))) >= 3
            for m in (1, 3, 9):
                assert _check_case(variant, Case(f"split-MUL_MAT-{q.name}-{m}", "MUL_MAT",
                                                 partial(mul_mat_weight, qtype=q, n=200, k=512, m=m))) == "ok"
            assert _check_case(variant, Case(f"split-GET_ROWS-{q.name}", "GET_ROWS",
                                             partial(get_rows_weight, qtype=q, n_rows=200, width=512,
                                                     n_out=9))) == "ok"


def test_verdicts(vk, variant):
    x = leaf("x", F32, (4, 8), LeafKind.INPUT)
    v = ask(vk, Tensor("y", F32, (4, 8), op="GATED_DELTA_NET", src=(x,)))
    assert not v.ok and v.code == "unsupported_op" and "GATED_DELTA_NET" in v.reason
    from gguf import GGMLQuantizationType as Q
    b = GraphBuilder()
    y = b.mul_mat(b.use(leaf("w", Q.Q5_1, (8, 64), LeafKind.WEIGHT)), b.input("x", F32, (1, 64)))
    v = ask(vk, y)
    assert not v.ok and v.code == "unsupported_dtype" and "Q5_1" in v.reason
    variant.disabled = frozenset({"GLU"})
    g = GraphBuilder()
    node = g.glu(g.input("a", F32, (2, 8)), g.input("b", F32, (2, 8)), "swiglu")
    v = ask(vk, node)
    assert not v.ok and v.code == "refused_by_profile"


def test_parameter_blocks_are_filled_and_read_by_name():
    """A kernel's parameter block is one definition: the WGSL struct it reads and the words the lowering
    fills by name. A field missing or unknown on either side is an error naming it, never a word left 0."""
    from framework.plugins.vulkan import wgsl
    block = wgsl.Params("ncols nrows eps:f32")
    assert block.word == {"ncols": 8, "nrows": 9, "eps": 10}
    assert "struct Params { offs: array<vec4<u32>, 2>, ncols: u32, nrows: u32, eps: f32 }" in block.header()
    assert block.pack("RMS_NORM x", {"ncols": 4, "nrows": 2, "eps": 1e-6}) == [(8, "u32", 4), (9, "u32", 2),
                                                                             (10, "f32", 1e-6)]
    with pytest.raises(ValueError, match=r"RMS_NORM x: parameters missing \['eps'\], unknown \['epsilon'\]"):
        block.pack("RMS_NORM x", {"ncols": 4, "nrows": 2, "epsilon": 1e-6})
    with pytest.raises(ValueError, match=r"reads parameter fields \['gain'\]"):
        block.source("let g = U.gain;")
    assert wgsl.Params("a b", bindings=13).word == {"a": 16, "b": 17}     # 13 binding offsets take 4 vec4s
    for name, (body, params) in wgsl.SIMPLE.items():                     # every simple kernel's fields declared
        assert params.source(body) == wgsl.simple(name)


def test_kernel_sources_are_files_with_named_pieces():
    """A kernel's text is a file (kernels/NAME.wgsl) whose shared pieces (the entry point, the activation
    functions) are filled by name; a piece missing or unknown is an error naming the file."""
    from framework.plugins.vulkan import wgsl
    assert {"binary", "rms_norm", "matvec", "matmul_tile"} <= {p.stem for p in wgsl.KERNELS.glob("*.wgsl")}
    assert wgsl.source("binary", each_element=wgsl._EACH_ELEMENT, index4=wgsl._INDEX4) == wgsl.BINARY
    with pytest.raises(ValueError, match=r"kernels/binary.wgsl needs index4, not given"):
        wgsl.source("binary", each_element=wgsl._EACH_ELEMENT)
    with pytest.raises(ValueError, match=r"kernels/rms_norm.wgsl has no @@gain@@"):
        wgsl.source("rms_norm", gain="")


def test_rope_rows_are_the_reference_table():
    """A step's rope table is rows of one table by position (made once, grown past its end): the same values
    as the reference's table of the step's own positions, for a decode step, a prefill chunk, positions past
    the first rows and in any order."""
    from framework.backend import RopeRows, rope_table
    rows = RopeRows()
    for pos in ([0], [7], [RopeRows.FIRST - 1], [RopeRows.FIRST], [5000], list(range(40, 72)), [9, 2, 9]):
        pos = np.array(pos, dtype=np.int32)
        for n_dims, base in ((64, 100000.0), (256, 10000.0)):
            got, want = rows.table(pos, n_dims, base, 1.0), rope_table(pos, n_dims, base, 1.0)
            assert got.shape == want.shape == (len(pos), n_dims // 2, 2) and got.dtype == np.float32
            np.testing.assert_allclose(got, want, rtol=0, atol=2e-7)
    assert len(rows.rows[(64, 100000.0, 1.0)]) >= 5001


def test_one_submission_per_run_and_pipelines_made_once(vk):
    case = next(c for c in CASES if c.id.startswith("SET_ROWS+FLASH_ATTN_EXT"))
    b = case.build()
    plan = make_plan(b.graph, [vk])
    ex = Executor([vk], b.weight_bytes)
    ex.run(plan, b.fresh_inputs())
    pipes, submits = len(vk._pipelines), vk.submits
    for _ in range(3):
        ex.run(plan, b.fresh_inputs())
    assert len(vk._pipelines) == pipes
    assert vk.submits - submits == 3 * len(plan.fragments)
    # how the commands were encoded is said, whichever way it was (wgpu-native's C functions or wgpu's methods)
    assert "pass commands through wgpu" in vk.compile_summary()


# ------------------------------------------------------------------------------------------------------
# the models
# ------------------------------------------------------------------------------------------------------

# Gemma's logits are 1 MiB a token: batches whose logits fit one lavapipe storage binding (128 MiB)
N_BATCH = {"smollm2": 64, "gemma3": 64}


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def case(request, vk):
    model = load_model(request.param)
    session = Session(model, [vk], n_ctx=1024 if FULL else 256, n_batch=N_BATCH[request.param])
    return request.param, model, session


def test_teacher_forced_greedy(case):
    name, _, session = case
    ref = reference(name)[0]
    if FULL:
        assert_teacher_forced(session, ref)
        return
    assert_teacher_forced(session, dict(ref, prompts=ref["prompts"][:1]))


def test_text(case, registry):
    name, model, session = case
    ref, arrays = reference(name)
    if FULL:
        assert_text_metrics(session, ref, arrays, model.tokenizer, reference_text(ref))
        return
    ids = ref["text"]["ids"][:PREFIX]
    got = perplexity(session, ids, window=PREFIX)
    cpu = perplexity(Session(model, registry.select("cpu"), n_ctx=256, n_batch=64), ids, window=PREFIX)
    assert abs(got.perplexity / cpu.perplexity - 1) <= 0.005, (got.perplexity, cpu.perplexity)
    assert float(np.mean(np.abs(got.nll - cpu.nll))) <= 0.05
    want_nll = arrays[ref["text"]["nll_key"]][:PREFIX - 1]
    assert float(np.mean(np.abs(got.nll - want_nll))) <= 0.1
    assert float(np.mean(got.top1 == arrays[ref["text"]["top1_key"]][:PREFIX])) >= 0.90


MAX_DECODE_DISPATCHES = 150     # a decode step's dispatches on a GPU, fused (docs/vulkan.md, "Fusion")


def _decode_steps(session) -> list[str]:
    (program,) = [session.executor.programs[(f.device, f.program)] for key, (plan, _) in session.plans.items()
                  if key[0] == 1 for f in plan.fragments]
    return [st.name.split(" ")[0] for st in program.steps]


@pytest.mark.parametrize("name,fused", [("smollm2", True), ("gemma3", True), ("smollm2", False)],
                         ids=["smollm2-fused", "gemma3-fused", "smollm2-unfused"])
def test_gpu_decode_kernels_follow_llama_cpp(variant, monkeypatch, name, fused):
    """The decode kernels a GPU adapter takes on the real weights, forced on lavapipe: fused (every layer's
    attention block, its output projection with the combine and the residual add, gate and up with the
    norm and the GLU, the down projection; x in 8 bits inside the output head's kernel) in at most
    MAX_DECODE_DISPATCHES dispatches a step, and unfused (FRAMEWORK_VULKAN_UNFUSE=all: the cooperative
    matrix-vector kernel, QUANT_X for the output projection, every op its own dispatch). llama.cpp's
    greedy tokens for the first prompt, fed one decode step at a time, stay within the README's bounds."""
    if not fused:
        monkeypatch.setenv("FRAMEWORK_VULKAN_UNFUSE", "all")
    variant.cpu_adapter = False
    model = load_model(name)
    session = Session(model, [variant], n_ctx=256, n_batch=N_BATCH[name])
    ref = reference(name)[0]
    assert_teacher_forced(session, dict(ref, prompts=ref["prompts"][:1]), by_decode=True)
    steps = _decode_steps(session)
    layers = model.hp.n_layer
    if fused:
        assert len(steps) <= MAX_DECODE_DISPATCHES, (len(steps), sorted(set(steps)))
        # Gemma 3's heads (256 rows of 640) have Q, K and V in a kernel of their own, SmolLM2's inside
        attn = "ROPE+SET_ROWS+FLASH_ATTN_EXT" if name == "gemma3" else "NORM+QKV+ROPE+SET_ROWS+FLASH_ATTN_EXT"
        assert steps.count(attn) == layers
        assert steps.count("NORM+MUL_MATx3") == (layers if name == "gemma3" else 0)
        assert steps.count("NORM+MUL_MATx2+GLU") == layers
        assert steps.count("COMBINE+MUL_MAT" + ("+ADD" if name == "smollm2" else "")) == layers
    else:
        assert len(steps) > 3 * MAX_DECODE_DISPATCHES and "QUANT_X" in steps
        assert steps.count("MUL_MAT[matvec]") == 7 * layers + 1 and steps.count("ROPE") == 2 * layers


def test_weights_larger_than_a_binding_are_split(case):
    name, model, session = case
    vk = session.devices[0]
    for handle in session.executor.weights.values():
        if handle.nbytes > vk.max_binding:
            assert len(handle.chunks) > 1
    big = [t for t in model.arch._weights.values() if t.nbytes > vk.max_binding]
    if name == "gemma3" and vk.max_binding < 2**28:
        assert big, "gemma3's token embedding (178 MB) should exceed lavapipe's 128 MiB binding"


def test_decode_steps_equal_prefill(case):
    """The KV cache lives on the device: decoding token by token gives one prefill's logits."""
    name, _, session = case
    if name != "smollm2" and not FULL:
        pytest.skip("FRAMEWORK_VULKAN_QUICK=1: one model is enough for a quick check")
    assert_decode_equals_prefill(session, reference(name)[0], n_follow=4, tol=2e-3)


def test_mixed_plan_with_cpu(vk, variant, registry):
    """vulkan:0 refuses GLU and ROPE here, so the cpu plugin takes them in every layer: activations cross
    devices several times a layer, the KV cache stays on vulkan:0 (attention, which reads it in place,
    too)."""
    variant.disabled = frozenset({"GLU", "ROPE"})
    model = load_model("smollm2")
    cpu = registry.select("cpu")
    mixed = Session(model, [vk] + cpu, n_ctx=256, n_batch=64)
    p = reference("smollm2")[0]["prompts"][1]
    plan, _ = mixed.plan(len(p["ids"]), 0, 1)
    on = {plan.device_of(n) for n in plan.graph.nodes}
    assert on == {"vulkan:0", "cpu"}
    assert {n.op for n, _ in plan.fallbacks} == {"GLU", "ROPE"}
    assert all(r.device == "vulkan:0" for r in mixed.residence.values())
    got = mixed.eval(p["ids"])
    want = Session(model, cpu, n_ctx=256, n_batch=64).eval(p["ids"])
    assert int(np.argmax(got)) == int(np.argmax(want)) == p["greedy_ids"][0]
    assert np.corrcoef(got, want)[0, 1] > 0.9999


def test_device_times_add_up_to_the_wall_time(variant, registry):
    """The time reported per device includes the wait for the device's results (Device.synchronize) and
    its transfers: over a prefill and decode steps of a plan split between vulkan:0 and cpu, the devices'
    times add up to the steps' wall time, less the executor's own bookkeeping. Without the wait, vulkan:0
    showed about a tenth of it (the runs return once their commands are submitted)."""
    import time
    variant.disabled = frozenset({"GLU", "ROPE"})
    model = load_model("smollm2")
    session = Session(model, [variant] + registry.select("cpu"), n_ctx=256, n_batch=64)
    ids = reference("smollm2")[0]["prompts"][0]["ids"]
    session.plan(len(ids), 0)
    session.plan(1, len(ids))                        # compiled before the clock starts
    t0 = time.perf_counter()
    logits = session.eval(ids)
    for _ in range(2):
        logits = session.eval([int(np.argmax(logits))])
    wall = time.perf_counter() - t0
    seconds = {name: st["seconds"] for name, st in session.executor.stats.items()}
    assert set(seconds) == {"vulkan:0", "cpu"}
    assert 0.85 * wall <= sum(seconds.values()) <= wall, (seconds, wall)
