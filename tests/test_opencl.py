"""The OpenCL plugin (framework.plugins.opencl) on whatever OpenCL device pyopencl finds: in CI, PoCL (an
OpenCL driver that runs on the host CPU; `make test` installs it).

What runs here, and what is left to other files (PoCL on CI's 2 shared cores runs the models' products
at about numpy's speed, but every kernel built costs a compile, and the GPU kernels run slowly on it):

* discovery: the device is an OpenCL one with its data; the reasons for no device (no pyopencl, no ICD
  loader, no ICD file, ICD files naming drivers that do not load) are precise, the last two in a real
  process with OCL_ICD_VENDORS pointing elsewhere; PoCL is the host CPU, and `framework backends` says
  that opencl:0, vulkan:0 (lavapipe) and cpu are one physical device;
* the op conformance suite on opencl:0 runs in tests/test_conformance.py (every available device),
  with the kernels a CPU device takes (register-tiled products, sequential attention); here, the
  kernels a GPU takes forced on PoCL: the cooperative matrix-vector kernel (sums in local memory),
  its integer form with x in 8 bits, the local-memory tiled product, attention with barriers and
  split over the keys, for every weight type the plugin reads, and weights split into chunks when a
  device's largest allocation is small; residual adds fused into the products and norms before them,
  and a SCALE into the ROPE before it;
  verdicts with reason codes; programs built once; a run
  enqueues its kernels on one in-order queue without any host synchronisation; the report line names
  the enqueue path; the next run enqueued ahead behind a user event (backend/ahead.py): decode steps
  bit-identical to those without, a released run ahead leaving caches and later steps unchanged,
  handles of earlier runs keeping their values (enqueued ahead on the device's worker thread and inline),
  the gate opened and the worker thread stopped when the device is collected or closed, an enqueue error
  on the worker raised in the run that takes it, naming the program and the kernel;
* both models against llama.cpp's reference outputs (tests/reference), held to the README's bounds
  in the cheapest form that still means something (as tests/test_vulkan.py's quick mode): the first
  prompt teacher-forced (prompt and llama.cpp's greedy tokens in one prefill: every prediction within
  1.0 of the top logit, 90% top-1), and the text's first 48 tokens: perplexity within 0.5% of the CPU
  plugin's on the same prefix, per-token NLL within 0.05 of it and within 0.1 of llama.cpp's on
  average, top-1 agreement with llama.cpp of 90% or more (the README's 1% / 94% are for the whole
  text; the CPU plugin's own exact forward is 1.4% off llama.cpp's perplexity on a 64-token prefix);
* the fused decode kernels a GPU takes (framework/core/graph/fusion.py decides, fused.py lowers), forced
  on PoCL, on the conformance suite's DECODE cases against the CPU plugin;
* SmolLM2's first prompt through the fused decode path with the GPU kernels forced (at most 150 kernels
  a step): llama.cpp's first 12 greedy tokens fed one decode step at a time, within the
  README's bounds; decode steps equal one prefill (the KV cache lives in device memory); both models'
  first prompt teacher-forced in a mixed plan with the cpu plugin (which takes GLU and ROPE).
"""

from __future__ import annotations

import os
import subprocess
import sys
from functools import partial

import numpy as np
import pytest
from conftest import load_model, reference
from reference_checks import assert_decode_equals_prefill, assert_teacher_forced

from framework.contract import DeviceType, Verdict, settings
from framework.core.graph import F32, GraphBuilder, LeafKind, Tensor, leaf
from framework.core.scheduler import Executor, make_plan
from framework.core.scheduler.verdicts import ask
from framework.plugins.cpu.device import CpuDevice
from framework.runtime.perplexity import perplexity
from framework.runtime.session import Session

PREFIX = 48
N_BATCH = 64
ALL_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K", "F16", "F32")


@pytest.fixture(scope="module")
def ocl(registry):
    devs = [d for d in registry.devices() if d.name.startswith("opencl:")]
    assert devs, f"the opencl plugin registered no device:\n{registry.describe_devices()}"
    dev = devs[0]
    if not dev.available:
        pytest.fail(f"opencl:0 is unavailable: {dev.unavailable_reason} (make test installs pocl-opencl-icd and "
                    f"ocl-icd-libopencl1)")
    return dev


@pytest.fixture
def variant(ocl):
    """The device with some settings changed for one test (restored after): its programs stay built."""
    saved = {k: getattr(ocl, k) for k in ("is_cpu", "max_alloc", "disabled", "int_dot", "ptx")}
    yield ocl
    for k, v in saved.items():
        setattr(ocl, k, v)


# ------------------------------------------------------------------------------------------------------
# discovery and identity
# ------------------------------------------------------------------------------------------------------

def test_the_device_is_an_opencl_device_with_its_data(ocl):
    assert ocl.name == "opencl:0"
    for key in ("platform", "vendor", "version", "global_mem_bytes", "max_alloc_bytes", "max_work_group_size",
                "max_work_item_sizes", "local_mem_bytes", "fp16", "subgroups", "opencl_c_version"):
        assert key in ocl.data, key
    assert ocl.data["global_mem_bytes"] > 0 and 0 < ocl.data["max_alloc_bytes"] <= ocl.data["global_mem_bytes"]
    assert ocl.limits.dtypes >= set(ALL_TYPES)
    if ocl.type == DeviceType.CPU:
        assert ocl.physical_id == "host-cpu"        # PoCL runs on the host's CPU, as the cpu plugin does
    if "portable computing language" in ocl.data["platform"].lower():
        assert ocl.type == DeviceType.CPU and "PoCL" in ocl.description and "not GPU figures" in ocl.description


def _discover_in_a_process(env: dict) -> str:
    code = "from framework.plugins.opencl.discovery import discover; print(discover().reason)"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_no_icd_file_is_a_precise_reason(tmp_path):
    reason = _discover_in_a_process({"OCL_ICD_VENDORS": str(tmp_path)})
    assert "no OpenCL platform" in reason and "no ICD file in " + str(tmp_path) in reason
    assert "pocl-opencl-icd" in reason


def test_icd_files_naming_missing_drivers_are_listed(tmp_path):
    (tmp_path / "bogus.icd").write_text("libno-such-opencl-driver.so\n")
    reason = _discover_in_a_process({"OCL_ICD_VENDORS": str(tmp_path)})
    assert "did not load" in reason and "bogus.icd: libno-such-opencl-driver.so" in reason


def _rediscover(monkeypatch, fail_import: str):
    import builtins

    from framework.plugins.opencl import discovery
    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "pyopencl" or name.startswith("pyopencl."):
            raise ImportError(fail_import)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    discovery.discover.cache_clear()
    try:
        return discovery.discover()
    finally:
        discovery.discover.cache_clear()


def test_unavailable_without_pyopencl(monkeypatch):
    found = _rediscover(monkeypatch, "No module named 'pyopencl'")
    assert not found.devices and "pyopencl is not installed" in found.reason and "pip install" in found.reason
    from framework.plugins.opencl.device import OpenCLDevice
    dev = OpenCLDevice(0, reason=found.reason)
    assert not dev.available and "pyopencl" in dev.unavailable_reason
    node = Tensor("x", F32, (2,), op="ADD", src=(leaf("a", F32, (2,), LeafKind.INPUT),) * 2)
    assert ask(dev, node).code == "unavailable"


def test_unavailable_without_the_icd_loader(monkeypatch):
    # what importing a pyopencl built against the system's loader says when libOpenCL.so.1 is gone
    found = _rediscover(monkeypatch, "libOpenCL.so.1: cannot open shared object file: No such file or directory")
    assert not found.devices and "ICD loader" in found.reason and "ocl-icd-libopencl1" in found.reason


def test_pci_ids_resolve_to_one_string(tmp_path):
    """A GPU reached through two plugins: Vulkan knows its vendor and device id, OpenCL its PCI address;
    both resolve to the address where sysfs ties them together (a fake sysfs tree here)."""
    from framework.core.physical import pci_physical_id
    for addr, ids in (("0000:3b:00.0", ("0x10de", "0x2335")), ("0000:00:02.0", ("0x8086", "0x46a6"))):
        (tmp_path / addr).mkdir()
        (tmp_path / addr / "vendor").write_text(ids[0] + "\n")
        (tmp_path / addr / "device").write_text(ids[1] + "\n")
    assert pci_physical_id(0x10DE, 0x2335, sysfs=str(tmp_path)) == "0000:3b:00.0"
    assert pci_physical_id(address="0000:3B:00.0", sysfs=str(tmp_path)) == "0000:3b:00.0"
    assert pci_physical_id(0x1002, 0x744C, sysfs=str(tmp_path)) == "pci 1002:744c"     # not in this host


def test_backends_say_pocl_and_lavapipe_are_the_host_cpu(capsys, registry):
    from framework.cli.main import main
    names = {d.name: d for d in registry.devices()}
    if "vulkan:0" not in names or names["vulkan:0"].type != DeviceType.CPU or names["opencl:0"].type != DeviceType.CPU:
        pytest.skip("needs lavapipe as vulkan:0 and PoCL as opencl:0 (CI's software drivers)")
    main(["backends"])
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("one physical device (host-cpu)"))
    for name in ("cpu", "opencl:0", "vulkan:0"):
        assert name in line.split("reached as:")[1].replace(" ", "").split(","), line


# ------------------------------------------------------------------------------------------------------
# ops: the kernels a GPU takes, forced on PoCL
# ------------------------------------------------------------------------------------------------------

def _check_case(dev, case, refs={}):  # noqa: B006 (the CPU reference's results, kept across tests)
    from framework.conformance.cases import nmse
    b = case.build()
    refused = [v for n in b.graph.nodes for v in [ask(dev, n)] if not v.ok]
    assert not refused, f"{case.id}: {refused}"
    if case.id not in refs:
        plan = make_plan(b.graph, [CpuDevice()])
        refs[case.id] = [np.array(o) for o in Executor([CpuDevice()], b.weight_bytes).run(plan, b.fresh_inputs())]
    plan = make_plan(b.graph, [dev])
    assert {plan.device_of(n) for n in b.graph.nodes} == {dev.name}
    outs = Executor([dev], b.weight_bytes).run(plan, b.fresh_inputs())
    for out, ref in zip(outs, refs[case.id]):
        assert np.isfinite(out).all(), case.id
        err = nmse(out, ref)
        assert err <= b.tolerance, f"{dev.name} {case.id}: NMSE {err:.3e} > {b.tolerance:.0e}"
    return plan


def _mul_mat(qtype: str, n: int, k: int, m: int):
    from framework.conformance.cases import Case, Q, mul_mat_weight
    return Case(f"ocl-MUL_MAT-{qtype}-{n}x{k}-x{m}", "MUL_MAT", partial(mul_mat_weight, qtype=Q[qtype], n=n, k=k, m=m))


@pytest.mark.parametrize("shape,m", [("x8=0", 1), ("x8=1,tpr=4,r=2,wg=64", 3)])
def test_gpu_matvec_kernels(variant, monkeypatch, shape, m):
    """The cooperative matrix-vector kernel (teams of threads share a row's groups, x staged in local
    memory, sums meeting in local memory: PoCL has no PTX), with x in f32 and in 8 bits (QUANT_X, integer
    dot products: cl_khr_integer_dot_product's where the device has it, else the same sums in integer
    arithmetic), one and several rows of x, every weight type (one build each: PoCL compiles slowly)."""
    monkeypatch.setenv("FRAMEWORK_OPENCL_MATVEC", shape)
    variant.is_cpu = False
    for q in ALL_TYPES[:6]:
        _check_case(variant, _mul_mat(q, 70, 512, m))


@pytest.mark.parametrize("shape,q,n,k,m", [("xl=0,tpr=8,r=1", "Q6_K", 33, 768, 8), ("v=0", "Q4_K", 70, 512, 3),
                                           ("tpr=32,wg=32,r=3", "Q5_0", 40, 576, 2)])
def test_gpu_matvec_other_shapes(variant, monkeypatch, shape, q, n, k, m):
    """The same kernel with x read from global memory (what rows of x too many for local memory take) and
    a row of groups that is no power of two, the first version (v=0, kept for comparison), and teams of
    a whole work-group with a partial last one (the code does not depend on the weight type: one each)."""
    monkeypatch.setenv("FRAMEWORK_OPENCL_MATVEC", shape)
    variant.is_cpu = False
    _check_case(variant, _mul_mat(q, n, k, m))


def test_matvec_shape_choice_and_settings(variant, monkeypatch):
    """matvec_shape's documented choices (x in 8 bits with dp4a from 4 MiB, f32 x staged in local memory
    where it fits, warp shuffles where PTX is found), and settings it cannot take named as errors.
    PoCL takes no PTX: the probe is not even tried there."""
    from framework.plugins.opencl import kernels
    variant.is_cpu = False
    variant.ptx = None
    assert kernels.ptx(variant) == {"dp4a": False, "shfl": False, "fence": False}
    assert variant.data["inline_ptx"] == "no: not NVIDIA's OpenCL platform"
    small = kernels.matvec_shape(variant, 20, 1, 2048, 1 << 20)
    assert (small["v"], small["x8"], small["xl"], small["xg"], small["dp4a"], small["shfl"]) == (1, 0, 1, 32, 0, 0)
    variant.ptx = {"dp4a": True, "shfl": True}            # as on an NVIDIA GPU whose probes passed
    big = kernels.matvec_shape(variant, 128, 1, 232960, 512 << 20)
    assert {k: big[k] for k in ("v", "tpr", "r", "wg", "x8", "xl", "dp4a", "shfl")} == \
        {"v": 1, "tpr": 32, "r": 4, "wg": 256, "x8": 1, "xl": 0, "dp4a": 1, "shfl": 1}
    assert kernels.matvec_shape(variant, 128, 8, 4096, 1 << 20)["xl"] == 0       # 8 rows of 4096: 147 KB
    assert kernels.matvec_shape(variant, 128, 2, 4096, 1 << 20)["xl"] == 1
    variant.ptx = {"dp4a": False, "shfl": False}
    for setting, says in (("r=3,foo=1", "'foo=1' is not a setting"), ("tpr=3", "'tpr=3' is not a setting"),
                          ("x8", "'x8' is not a setting"), ("dp4a=1", "does not take PTX's dp4a"),
                          ("v=0,shfl=1", "shfl=1 needs v=1"), ("x8=1,xl=1", "xl=1 stages f32 x"),
                          ("wg=64,tpr=32,r=8", None), ("wg=2048", "not a setting")):
        monkeypatch.setenv("FRAMEWORK_OPENCL_MATVEC", setting)
        if says is None:
            kernels.matvec_shape(variant, 16, 1, 100, 1000)
            continue
        with pytest.raises(ValueError, match="FRAMEWORK_OPENCL_MATVEC") as e:
            kernels.matvec_shape(variant, 16, 1, 100, 1000)
        assert says in str(e.value) and variant.name in str(e.value), str(e.value)


def test_gpu_kernel_names(variant, monkeypatch):
    """The launches a GPU device makes for decode and prefill products and decode attention."""
    from framework.conformance.cases import Case, flash_attn
    from framework.plugins.opencl.program import ClProgram
    variant.is_cpu = False
    monkeypatch.setenv("FRAMEWORK_OPENCL_MATVEC", "x8=1")
    names = []
    for case in (_mul_mat("Q4_K", 64, 256, 1), _mul_mat("Q4_K", 64, 256, 20),
                 Case("ocl-attn-T1-KV300", "FLASH_ATTN_EXT", partial(flash_attn, t=1, n_kv=300, h=4, hkv=2, d=64))):
        plan = make_plan(case.build().graph, [variant])
        names += [s.name.split(" ")[0] for s in ClProgram(variant, plan.fragments[0]).steps]
    assert names == ["QUANT_X", "MUL_MAT[matvec-x8]", "MUL_MAT[tile-32x32]", "FLASH_ATTN_EXT[split]",
                     "FLASH_ATTN_EXT[combine]"]


def test_the_source_has_no_variadic_macro():
    """OpenCL C 1.2 has no variadic macros: NVIDIA's compiler refuses kernels.cl with one, while PoCL (the
    tests' device) accepts it, so only the text can show it here."""
    import re
    from framework.plugins.opencl import kernels
    defines = re.findall(r"^\s*#\s*define\s+\w+\([^)]*\)", kernels.source(), re.M)
    assert defines and not [d for d in defines if "..." in d]


@pytest.mark.parametrize("shape,types", [("bm=32,bn=32,tm=4,tn=4", ALL_TYPES[:6]), ("bm=64,bn=64,tm=4,tn=4", ("Q4_K",)),
                                         ("bm=32,bn=64,tm=2,tn=4", ("Q6_K",))])
def test_gpu_tiled_product(variant, monkeypatch, shape, types):
    """The local-memory tiled product a GPU takes for prefill, partial tiles along both axes: every weight
    type with one tile, other tiles with one type (the tile's code does not depend on the type)."""
    monkeypatch.setenv("FRAMEWORK_OPENCL_MATMUL", shape)
    variant.is_cpu = False
    for q in types:
        _check_case(variant, _mul_mat(q, 70, 512, 33))


def test_gpu_attention(variant):
    """Attention with barriers (one work-group per query row and head), and split over the keys into
    several work-groups plus a combine (few query rows: decode), with GQA, windows and unwritten rows."""
    from framework.conformance.cases import Case, flash_attn, kv_attention
    variant.is_cpu = False
    cases = [
        Case("ocl-attn-T7-KV7-H4-Hkv1-D64", "FLASH_ATTN_EXT", partial(flash_attn, t=7, n_kv=7, h=4, hkv=1, d=64)),
        Case("ocl-attn-T5-KV12-H8-Hkv2-D80", "FLASH_ATTN_EXT", partial(flash_attn, t=5, n_kv=12, h=8, hkv=2, d=80)),
        Case("ocl-split-attn-T1-KV300-H9-Hkv3-D64", "FLASH_ATTN_EXT",
             partial(flash_attn, t=1, n_kv=300, h=9, hkv=3, d=64)),
        Case("ocl-split-attn-T2-KV520-H4-Hkv1-D256-window", "FLASH_ATTN_EXT",
             partial(flash_attn, t=2, n_kv=520, h=4, hkv=1, d=256, window=300)),
        Case("ocl-split-attn-T1-KV700-H4-Hkv2-D32-unwritten", "FLASH_ATTN_EXT",
             partial(flash_attn, t=1, n_kv=700, h=4, hkv=2, d=32, n_past=450)),
        Case("ocl-split-kv-attention-ctx512-T1-past300", "SET_ROWS",
             partial(kv_attention, n_ctx=512, t=1, n_past=300, h=9, hkv=3, d=64)),
    ]
    for c in cases:
        _check_case(variant, c)


def _residual_block(g, *, qtype: str, n: int, k: int, m: int):
    """x + W h, then y + norm(y) * gain: the layers' residual adds, after a product and after a norm."""
    from framework.conformance.cases import Q
    y = g.b.add(g.b.mul_mat(g.weight("blk.0.attn_output.weight", Q[qtype], (n, k)), g.f32("h", (m, k))),
                g.f32("x", (m, n)))
    gain = g.weight("blk.0.post_attention_norm.weight", Q.F32, (n,))
    return [g.b.add(g.b.mul(g.b.rms_norm(y, 1e-6), gain), y)]


@pytest.mark.parametrize("is_cpu,m", [(True, 1), (True, 9), (False, 1), (False, 9)])
def test_residual_adds_are_fused(variant, is_cpu, m):
    """A product or a norm whose only reader is an ADD of a residual writes the sum itself: no ADD
    launch, the same values (CPU and GPU kernels, decode and prefill shapes)."""
    from framework.conformance.cases import Case
    from framework.plugins.opencl.program import ClProgram
    variant.is_cpu = is_cpu
    case = Case(f"ocl-residual-{is_cpu}-{m}", "ADD", partial(_residual_block, qtype="Q4_1", n=96, k=256, m=m))
    plan = _check_case(variant, case)
    names = [s.name.split(" ")[0] for s in ClProgram(variant, plan.fragments[0]).steps]
    assert names[-1] == "RMS_NORM+MUL+ADD", names
    if not is_cpu and m == 1:            # decode on a GPU: the fused product kernel (rowvec) adds it
        assert names[-2] == "MUL_MAT+ADD", names
    else:
        assert names[-2].startswith("MUL_MAT[") and names[-2].endswith("]+ADD"), names
    assert "ADD" not in names, names


def test_rope_then_scale_is_one_launch(ocl):
    """Gemma's query scaling after ROPE: one launch, the same values."""
    from framework.conformance.cases import Case
    from framework.plugins.opencl.program import ClProgram

    def rope_scale(g):
        pos = g.ints("inp_pos", np.arange(3, 8))
        return [g.b.scale(g.b.rope_ext(g.f32("q", (5, 4, 64)), pos, 64, "neox", 10000.0), 0.125)]
    plan = _check_case(ocl, Case("ocl-rope-scale", "ROPE", rope_scale))
    assert [s.name.split(" ")[0] for s in ClProgram(ocl, plan.fragments[0]).steps] == ["ROPE+SCALE"]


def test_weights_over_the_largest_allocation_are_split(variant):
    """A weight larger than the device's largest allocation is kept in chunks of rows, each its own
    buffer, and every kernel that reads weights runs once per chunk: not refused."""
    from framework.conformance.cases import Case, Q, get_rows_weight
    variant.max_alloc = 20480
    for is_cpu, types in ((True, ("Q8_0", "Q4_1", "F16", "F32")), (False, ("Q4_K",))):
        variant.is_cpu = is_cpu            # the CPU kernels, then the GPU ones
        for q in types:
            assert len(variant.chunk_plan(q, (200, 512))) >= 3
            for m in (1, 9):
                _check_case(variant, _mul_mat(q, 200, 512, m))
            _check_case(variant, Case(f"ocl-split-GET_ROWS-{q}", "GET_ROWS",
                                      partial(get_rows_weight, qtype=Q[q], n_rows=200, width=512, n_out=9)))
    # a fused product (the norm in its prologue, its input y written by the first chunk's kernel) per chunk
    from framework.conformance.cases import decode_norm_product
    from framework.plugins.opencl.program import ClProgram
    plan = _check_case(variant, Case("ocl-split-fused-Q4_1", "MUL_MAT",
                                     partial(decode_norm_product, qtype=Q.Q4_1, n=200, k=512)))
    names = [st.name.split(" ")[0] for st in ClProgram(variant, plan.fragments[0]).steps]
    assert names == ["NORM+MUL_MAT"] * len(variant.chunk_plan("Q4_1", (200, 512))) and len(names) >= 3, names
    b = _mul_mat("Q8_0", 200, 512, 1).build()
    ex = Executor([variant], b.weight_bytes)
    ex.prepare(make_plan(b.graph, [variant]))
    (w,) = ex.weights.values()
    assert len(w.chunks) >= 3 and all(c.buffer.size <= 20480 for c in w.chunks)


def test_verdicts(ocl, variant):
    from gguf import GGMLQuantizationType as Q
    x = leaf("x", F32, (4, 8), LeafKind.INPUT)
    v = ask(ocl, Tensor("y", F32, (4, 8), op="GATED_DELTA_NET", src=(x,)))
    assert not v.ok and v.code == "unsupported_op" and "GATED_DELTA_NET" in v.reason
    # a value of a choice parameter the kernels have no code for is refused, never computed as another
    v = ask(ocl, Tensor("y", F32, (4, 8), op="UNARY", src=(x,), params={"op": "relu"}))
    assert not v.ok and v.code == "unsupported_op" and "op='relu'" in v.reason and "gelu" in v.reason
    b = GraphBuilder()
    y = b.mul_mat(b.use(leaf("w", Q.Q5_1, (8, 64), LeafKind.WEIGHT)), b.input("x", F32, (1, 64)))
    v = ask(ocl, y)
    assert not v.ok and v.code == "unsupported_dtype" and "Q5_1" in v.reason
    big = b.flash_attn_ext(b.input("q", F32, (1, 2, 512)), b.input("k", F32, (4, 1, 512)),
                           b.input("v", F32, (4, 1, 512)), None, 1.0)
    v = ask(ocl, big)
    assert not v.ok and v.code == "unsupported_shape" and "head size 512" in v.reason
    variant.max_alloc = 1024
    v = ask(ocl, b.add(b.input("a", F32, (64, 8)), b.input("c", F32, (64, 8))))
    assert not v.ok and v.code == "unsupported_shape" and "more than one allocation" in v.reason
    variant.disabled = frozenset({"GLU"})
    node = b.glu(b.input("g", F32, (2, 8)), b.input("u", F32, (2, 8)), "swiglu")
    v = ask(ocl, node)
    assert not v.ok and v.code == "refused_by_profile" and isinstance(v, Verdict)


def test_programs_built_once_one_queue_and_no_host_sync(ocl, monkeypatch):
    """Kernels are built once per device and set of options; a run enqueues its kernels on the device's one
    in-order queue and returns without waiting on the device (no finish, no wait, no blocking copy):
    only reading a result back waits. (Runs enqueued ahead are off here: the next test is theirs.)"""
    import pyopencl as cl

    from framework.conformance.cases import all_cases
    monkeypatch.setenv("FRAMEWORK_OPENCL_PREENQUEUE", "0")
    case = next(c for c in all_cases() if c.id.startswith("SET_ROWS+FLASH_ATTN_EXT"))
    b = case.build()
    plan = make_plan(b.graph, [ocl])
    ex = Executor([ocl], b.weight_bytes)
    first = [np.array(o) for o in ex.run(plan, b.fresh_inputs())]
    built = len(ocl.programs)
    (prog,) = ex.programs.values()
    assert not ocl.queue.properties & cl.command_queue_properties.OUT_OF_ORDER_EXEC_MODE_ENABLE
    syncs = []
    copy = cl.enqueue_copy

    def recording_copy(queue, dst, src, **kw):
        if kw.get("is_blocking", True):
            syncs.append("blocking enqueue_copy")
        return copy(queue, dst, src, **kw)

    monkeypatch.setattr(cl, "enqueue_copy", recording_copy)
    monkeypatch.setattr(cl, "wait_for_events", lambda *a: syncs.append("wait_for_events"))
    monkeypatch.setattr(cl.CommandQueue, "finish", lambda self: syncs.append("finish"))
    monkeypatch.setattr(cl.Event, "wait", lambda self: syncs.append("Event.wait"))
    enqueued = ocl.enqueued
    args = [ocl.from_host(b.fresh_inputs()[id(t)]) if t.kind == LeafKind.INPUT else ex.caches[id(t)][1]
            for t in plan.fragments[0].inputs]
    results = prog.run(args)
    assert syncs == [] and ocl.enqueued - enqueued == len(prog.steps)
    monkeypatch.undo()
    out = ocl.to_host(results[plan.fragments[0].outputs.index(plan.graph.outputs[0])])
    np.testing.assert_allclose(out, first[0], rtol=1e-5, atol=1e-5)
    for _ in range(2):
        ex.run(plan, b.fresh_inputs())
    assert len(ocl.programs) == built


def test_report_line_says_how_kernels_are_enqueued(ocl, monkeypatch):
    """The report line names the enqueue path (ctypes' clEnqueueNDRangeKernel, or pyopencl's call where no
    OpenCL library is found: a fallback said, never silent) and whether runs are enqueued ahead."""
    from framework.plugins.opencl import enqueue
    line = ocl.report_line()
    assert enqueue.how() in line and "runs enqueued ahead behind a user event" in line, line
    monkeypatch.setattr(enqueue, "_library", lambda: (None, "no OpenCL library found beside pyopencl"))
    monkeypatch.setenv("FRAMEWORK_OPENCL_PREENQUEUE", "off")
    line = ocl.report_line()
    assert "pyopencl's enqueue_nd_range_kernel (no OpenCL library found beside pyopencl)" in line, line
    assert "no run enqueued ahead (FRAMEWORK_OPENCL_PREENQUEUE=0" in line, line


@pytest.mark.parametrize("kernels", ["cpu", "gpu"])
def test_runs_enqueued_ahead_equal_runs_enqueued_when_they_come(variant, monkeypatch, kernels):
    """SmolLM2's decode steps with the next step enqueued ahead behind a user event (backend/ahead.py) give the
    logits of steps enqueued when they come (FRAMEWORK_OPENCL_PREENQUEUE=0), bit for bit, enqueued ahead inline
    and on the device's worker thread; steps after the
    second are taken from ahead (no kernel enqueued when they come). A run ahead released instead (here by
    reading the caches back) replays the step before with its own values: the caches read then, and the
    steps after, equal those of the run without it. With the kernels a CPU device takes, and those a GPU
    takes forced on PoCL (fused, the split attention with its counters)."""
    ocl = variant
    if kernels == "gpu":
        ocl.is_cpu = False
        session = Session(load_model("smollm2"), [ocl], n_ctx=256, n_batch=N_BATCH)
    else:
        session = _session("smollm2", ocl)
    p = reference("smollm2")[0]["prompts"][0]
    follow = p["greedy_ids"][:5]

    def decode() -> tuple[list, list]:
        session.reset()
        session.eval(p["ids"])
        logits = [np.array(session.eval([t])) for t in follow[:3]]
        n = session.n_past                 # rows written so far (later ones hold what an earlier test left)
        caches = [ocl.to_host(h)[:n] for dev, h in session.executor.caches.values() if dev == ocl.name]
        logits += [np.array(session.eval([t])) for t in follow[3:]]
        return logits, caches

    got = {}
    for mode in ("inline", "thread"):                # on the caller's thread, and on the device's worker thread
        monkeypatch.setenv("FRAMEWORK_OPENCL_PREENQUEUE", mode)
        taken, released = ocl.ahead_taken, ocl.ahead_released
        got[mode] = decode()
        assert ocl.ahead_taken - taken == 2, "steps 3 and 5 taken from ahead (the one after 3, released by the reads)"
        assert ocl.ahead_released - released >= 1 and ocl.pending is not None
        ocl.synchronize()                            # waits for what is before the gate, not for the gate
        ocl.queue.finish()                           # the queue taken for anything else releases it first
        assert ocl.pending is None
    monkeypatch.setenv("FRAMEWORK_OPENCL_PREENQUEUE", "0")
    taken = ocl.ahead_taken
    plain = decode()
    assert ocl.ahead_taken == taken and ocl.pending is None
    for mode, ahead in got.items():
        assert len(ahead[1]) == len(plain[1]) > 0
        for g, want in zip(ahead[0] + ahead[1], plain[0] + plain[1]):
            np.testing.assert_array_equal(g, want, err_msg=mode)


def test_handles_of_earlier_runs_keep_their_values(ocl, monkeypatch):
    """Outputs of runs that enqueued the next ahead are read back from pinned host memory their run copied
    them to; a handle of an earlier run than the last reads its own buffer instead: read after later runs,
    every handle gives its own run's values (those of the same runs without runs ahead)."""
    from framework.conformance.cases import all_cases
    from framework.backend import StagedTensor
    case = next(c for c in all_cases() if c.id.startswith("SET_ROWS+FLASH_ATTN_EXT"))
    b = case.build()
    plan = make_plan(b.graph, [ocl])
    ex = Executor([ocl], b.weight_bytes)
    base = b.fresh_inputs()
    ex.run(plan, base)
    (prog,) = ex.programs.values()
    frag = plan.fragments[0]
    at = frag.outputs.index(plan.graph.outputs[0])

    def runs(read_at_once: bool) -> tuple[list, list]:
        handles, values = [], []
        for k in range(4):
            inputs = {i: v * np.float32(1 + k) if v.dtype == np.float32 else v for i, v in base.items()}
            args = [ocl.from_host(inputs[id(t)]) if t.kind == LeafKind.INPUT else ex.caches[id(t)][1]
                    for t in frag.inputs]
            handles.append(prog.run(args)[at])
            if read_at_once:
                values.append(ocl.to_host(handles[-1]))
        return handles, values

    got = {}
    for mode in ("thread", "inline"):        # enqueued ahead on the device's worker thread, and on the caller's
        monkeypatch.setenv("FRAMEWORK_OPENCL_PREENQUEUE", mode)
        ahead, _ = runs(False)
        assert any(isinstance(h, StagedTensor) for h in ahead) and ocl.pending is not None
        got[mode] = [ocl.to_host(h) for h in ahead]
    monkeypatch.setenv("FRAMEWORK_OPENCL_PREENQUEUE", "0")
    _, want = runs(True)
    assert not np.array_equal(want[0], want[1])
    for mode, values in got.items():
        for g, w in zip(values, want):
            np.testing.assert_array_equal(g, w, err_msg=mode)


def _conformance_program(dev):
    """The SET_ROWS+FLASH_ATTN_EXT case's one program on dev, run once: (executor, plan, program, its args)."""
    from framework.conformance.cases import all_cases
    case = next(c for c in all_cases() if c.id.startswith("SET_ROWS+FLASH_ATTN_EXT"))
    b = case.build()
    plan = make_plan(b.graph, [dev])
    ex = Executor([dev], b.weight_bytes)
    inputs = b.fresh_inputs()
    first = [np.array(o) for o in ex.run(plan, inputs)]
    (prog,) = ex.programs.values()
    args = [dev.from_host(inputs[id(t)]) if t.kind == LeafKind.INPUT else ex.caches[id(t)][1]
            for t in plan.fragments[0].inputs]
    return ex, plan, prog, args, first, inputs


def test_a_worker_enqueue_error_reaches_the_caller(ocl, monkeypatch):
    """A run ahead whose enqueueing fails on the worker thread raises in the run that takes it, on the caller's
    thread, naming the program and the kernel; its gate is opened all the same (the queue goes on: a later run
    gives the first run's values)."""
    import threading

    from framework.plugins.opencl import enqueue
    if enqueue._library()[0] is None:
        pytest.skip("no OpenCL library for ctypes here: kernels go through pyopencl, which this test does not fail")
    monkeypatch.setenv("FRAMEWORK_OPENCL_PREENQUEUE", "thread")
    ex, plan, prog, args, first, inputs = _conformance_program(ocl)
    real, on_worker = prog.launches.fn, []

    def failing(*a):
        if threading.current_thread() is not threading.main_thread():
            on_worker.append(1)
            if len(on_worker) == 2:
                return -5                     # CL_OUT_OF_RESOURCES, on the run ahead's second kernel
        return real(*a)

    prog.launches.fn = failing
    try:
        prog.run(args)                        # the same buffers again: the next run enqueued ahead, on the worker
        assert ocl.pending is not None and ocl.pending.program() is prog
        with pytest.raises(RuntimeError) as err:
            prog.run(args)                    # takes it: the worker's error raised here
    finally:
        prog.launches.fn = real
    msg = str(err.value)
    assert prog.name in msg and prog.steps[1].name in msg and "OUT_OF_RESOURCES" in msg, msg
    assert ocl.pending is None and len(on_worker) == 2
    again = [np.array(o) for o in ex.run(plan, inputs)]
    for g, w in zip(again, first):
        np.testing.assert_array_equal(g, w)


def test_the_worker_thread_is_gone_after_close(ocl, monkeypatch):
    """close() releases the run ahead (its gate opened once the worker has enqueued it) and stops the worker
    thread; the device runs on after it (a new worker for the next run ahead)."""
    import pyopencl as cl

    from framework.plugins.opencl.device import OpenCLDevice
    monkeypatch.setenv("FRAMEWORK_OPENCL_PREENQUEUE", "thread")
    dev = OpenCLDevice(0, cl.Platform.from_int_ptr(ocl.cl_device.platform.int_ptr), ocl.cl_device)
    ex, plan, prog, args, first, inputs = _conformance_program(dev)
    for _ in range(2):
        ex.run(plan, inputs)
    thread, gate = dev.worker.thread, dev.pending.gate
    assert thread.is_alive()
    dev.close()
    assert not thread.is_alive() and thread not in __import__("threading").enumerate()
    assert dev.pending is None and gate.command_execution_status == cl.command_execution_status.COMPLETE
    again = [np.array(o) for o in ex.run(plan, inputs)]
    for g, w in zip(again, first):
        np.testing.assert_array_equal(g, w)
    dev.close()


def test_a_run_ahead_is_released_when_its_device_is_collected(ocl, monkeypatch):
    """A device dropped with a run enqueued ahead on its worker thread (the end of a process, a session closed)
    opens its gate from the device's finalizer and stops the thread: the queue is never left behind an unset
    event."""
    import gc

    import pyopencl as cl

    from framework.conformance.cases import all_cases
    from framework.plugins.opencl.device import OpenCLDevice
    monkeypatch.setenv("FRAMEWORK_OPENCL_PREENQUEUE", "thread")
    dev = OpenCLDevice(0, cl.Platform.from_int_ptr(ocl.cl_device.platform.int_ptr), ocl.cl_device)
    case = next(c for c in all_cases() if c.id.startswith("SET_ROWS+FLASH_ATTN_EXT"))
    b = case.build()
    plan = make_plan(b.graph, [dev])
    ex = Executor([dev], b.weight_bytes)
    for _ in range(3):
        ex.run(plan, b.fresh_inputs())
    gate = dev.pending.gate
    assert gate.command_execution_status != cl.command_execution_status.COMPLETE
    thread = dev.worker.thread
    assert thread.is_alive()
    del dev, ex, plan
    gc.collect()
    assert gate.command_execution_status == cl.command_execution_status.COMPLETE
    assert not thread.is_alive(), "the finalizer stops the worker thread"


def test_a_run_ahead_is_kept_only_where_a_replay_is_harmless():
    """A program whose kernels read a written argument (a cache) before writing it would not replay its last
    run unchanged: it enqueues nothing ahead."""
    from framework.backend.ahead import replayable

    class St:
        def __init__(self, reads=(), writes=()):
            self.arg_reads, self.arg_writes = reads, writes

    assert replayable([St(reads=(0,)), St(writes=(1,)), St(reads=(1,))], written_args={1})
    assert replayable([St(reads=(1,), writes=(1,)), St(reads=(1,))], written_args={1})   # writes rows, reads them
    assert not replayable([St(reads=(1,)), St(writes=(1,))], written_args={1})


# ------------------------------------------------------------------------------------------------------
# the models
# ------------------------------------------------------------------------------------------------------

_sessions: dict[str, Session] = {}


def _session(name: str, ocl) -> Session:
    """One opencl:0 session per model for the whole file (its programs are compiled once)."""
    if name not in _sessions:
        _sessions[name] = Session(load_model(name), [ocl], n_ctx=256, n_batch=N_BATCH)
    return _sessions[name]


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def case(request, ocl):
    yield request.param, load_model(request.param), _session(request.param, ocl)
    _sessions.pop(request.param, None)


def test_teacher_forced_first_prompt(case):
    name, _, session = case
    ref = reference(name)[0]
    assert_teacher_forced(session, dict(ref, prompts=ref["prompts"][:1]))
    assert all(r.device == "opencl:0" for r in session.residence.values())
    held = [h for dev, h in session.executor.caches.values()]
    assert held and all(dev_h.buffer is not None and dev_h.host is None for dev_h in held)    # device memory


def test_text_prefix(case, registry):
    name, model, session = case
    ref, arrays = reference(name)
    ids = ref["text"]["ids"][:PREFIX]
    got = perplexity(session, ids, window=PREFIX)
    cpu = perplexity(Session(model, registry.select("cpu"), n_ctx=256, n_batch=N_BATCH), ids, window=PREFIX)
    assert abs(got.perplexity / cpu.perplexity - 1) <= 0.005, (got.perplexity, cpu.perplexity)
    assert float(np.mean(np.abs(got.nll - cpu.nll))) <= 0.05
    want_nll = arrays[ref["text"]["nll_key"]][:PREFIX - 1]
    assert float(np.mean(np.abs(got.nll - want_nll))) <= 0.1
    assert float(np.mean(got.top1 == arrays[ref["text"]["top1_key"]][:PREFIX])) >= 0.90


def test_decode_steps_equal_prefill(ocl):
    """The KV cache lives on the device: decoding token by token gives one prefill's logits (SmolLM2 only:
    the decode path is the same code for both models, and PoCL is slow)."""
    session = _session("smollm2", ocl)
    assert_decode_equals_prefill(session, reference("smollm2")[0], n_follow=4, tol=2e-3)


MAX_DECODE_KERNELS = 150     # a decode step's kernels on a GPU, fused (docs/opencl.md, "Fused decode kernels")


def test_fused_decode_kernels(variant, monkeypatch):
    """Whole decode steps of small llama and gemma3 models (the conformance suite's DECODE cases) with the
    kernels a GPU fuses them into (framework/core/graph/fusion.py), forced on PoCL: every output, the caches
    included, against the CPU plugin. Together they take every prologue (the norm alone, after a residual
    add, after a post-norm and its add, after a SCALE; the split attention's combine), both epilogues
    (residual add, GLU), the attention block with and without per-head norms, neox and normal rope, and
    weights of six types side by side in one kernel. The attention block combines its parts itself (its
    last work-group a head), so the output projection reads its result; with the combine fusion off,
    flash_combine does, one kernel more. (Unfused, the same cases run in test_conformance.)"""
    from framework.conformance.cases import all_cases
    from framework.plugins.opencl.program import ClProgram
    variant.is_cpu = False
    attn = "NORM+QKV+ROPE+SET_ROWS+FLASH_ATTN_EXT"
    for case in [c for c in all_cases() if c.id.startswith("DECODE-")]:
        plan = _check_case(variant, case)
        names = [st.name.split(" ")[0] for st in ClProgram(variant, plan.fragments[0]).steps]
        assert any(n.startswith("NORM+") for n in names), (case.id, names)
        if "-layer" in case.id:
            layers = int(case.id.split("-")[2])
            assert names.count(attn) == layers, (case.id, names)
            assert names.count("NORM+MUL_MATx2+GLU") == layers, (case.id, names)
            after = [names[i + 1] for i, n in enumerate(names) if n == attn]
            assert set(after) <= {"MUL_MAT", "MUL_MAT+ADD"}, (case.id, names)     # the fused product, plain x
            unfused = {"ROPE", "GLU", "RMS_NORM+MUL", "FLASH_ATTN_EXT[split]", "FLASH_ATTN_EXT[combine]"}
            assert not unfused & set(names), (case.id, names)
    monkeypatch.setenv("FRAMEWORK_OPENCL_UNFUSE", "combine")   # the partials combined by a kernel of their own
    layered = next(c for c in all_cases() if c.id.startswith("DECODE-") and "-layers-" in c.id)
    plan = _check_case(variant, layered)
    names = [st.name.split(" ")[0] for st in ClProgram(variant, plan.fragments[0]).steps]
    assert names.count("FLASH_ATTN_EXT[combine]") == names.count(attn) == int(layered.id.split("-")[2]), names
    monkeypatch.setenv("FRAMEWORK_OPENCL_UNFUSE", "all")      # every fusion off, by name: node by node
    plan = _check_case(variant, case)
    names = [st.name.split(" ")[0] for st in ClProgram(variant, plan.fragments[0]).steps]
    assert "RMS_NORM" in names and not any(n.startswith(("NORM+", "COMBINE+", "RMS_NORM+")) for n in names), names


def test_fused_attention_with_its_own_products(variant, monkeypatch):
    """The attention block with Q, K and V made before it by one rowvec3 launch over the three weights (what
    heads as large as Gemma 3's take: fusion.ATTN_OWN_PRODUCTS, here 0 so the small models take it too),
    forced on PoCL: every output of the DECODE cases with layers, the caches included, against the CPU
    plugin; with the keys cut into as many parts as they allow (one block of keys each: PoCL's two compute
    units otherwise make two parts a head, of several blocks, as the other fused tests take)."""
    from framework.conformance.cases import all_cases
    from framework.core.graph import fusion
    from framework.plugins.opencl import fused
    from framework.plugins.opencl.program import ClProgram
    monkeypatch.setattr(fusion, "ATTN_OWN_PRODUCTS", 0)
    monkeypatch.setattr(fused, "ATTN_GROUPS_PER_UNIT", 1 << 12)
    variant.is_cpu = False
    for case in [c for c in all_cases() if c.id.startswith("DECODE-") and "-layer" in c.id]:
        plan = _check_case(variant, case)
        names = [st.name.split(" ")[0] for st in ClProgram(variant, plan.fragments[0]).steps]
        layers = int(case.id.split("-")[2])
        assert names.count("ROPE+SET_ROWS+FLASH_ATTN_EXT") == layers, (case.id, names)
        assert names.count("NORM+MUL_MATx3") == layers, (case.id, names)
        assert not any(n.endswith("QKV+ROPE+SET_ROWS+FLASH_ATTN_EXT") for n in names), (case.id, names)


def test_unknown_fusion_names_are_refused(ocl, monkeypatch):
    from framework.plugins.opencl import options
    monkeypatch.setenv("FRAMEWORK_OPENCL_UNFUSE", "attn,gluu")
    with pytest.raises(Exception, match=r"FRAMEWORK_OPENCL_UNFUSE='attn,gluu': no fusion named 'gluu'; the fusions "
                                        r"are attn, combine, norm, add, glu, rms_mul"):
        settings.read(options.UNFUSE_ENV)


def test_gpu_decode_kernels_follow_llama_cpp(variant):
    """The decode kernels a GPU takes on SmolLM2's real weights, forced on PoCL: fused (every layer's
    attention block, combining its parts itself, its output projection with the residual add, gate and up
    with the norm and the GLU, the down projection with its residual add) in at most MAX_DECODE_KERNELS a step;
    llama.cpp's first 12 greedy tokens for the first prompt, fed one decode step at a time, stay within
    the README's bounds (the attention's counters, which its work-groups leave at zero for the next step,
    run step after step). (The unfused GPU kernels, x in 8 bits among them, are test_gpu_matvec_kernels'.)"""
    variant.is_cpu = False
    model = load_model("smollm2")
    session = Session(model, [variant], n_ctx=256, n_batch=N_BATCH)
    ref = reference("smollm2")[0]
    p = ref["prompts"][0]
    assert_teacher_forced(session, dict(ref, prompts=[dict(p, greedy_ids=p["greedy_ids"][:12])]), by_decode=True)
    (program,) = [session.executor.programs[(f.device, f.program)] for key, (plan, _) in session.plans.items()
                  if key[0] == 1 for f in plan.fragments]
    steps = [st.name.split(" ")[0] for st in program.steps]
    layers = model.hp.n_layer
    assert len(steps) <= MAX_DECODE_KERNELS, (len(steps), sorted(set(steps)))
    assert steps.count("NORM+QKV+ROPE+SET_ROWS+FLASH_ATTN_EXT") == layers
    assert steps.count("NORM+MUL_MATx2+GLU") == layers and steps.count("MUL_MAT+ADD") == 2 * layers


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_mixed_plan_with_cpu(ocl, variant, registry, name):
    """opencl:0 refuses GLU and ROPE here, so the cpu plugin takes them in every layer: activations cross
    devices several times a layer, the KV cache stays on opencl:0; the first prompt, teacher-forced,
    stays within the README's bounds."""
    variant.disabled = frozenset({"GLU", "ROPE"})
    model = load_model(name)
    mixed = Session(model, [ocl] + registry.select("cpu"), n_ctx=256, n_batch=N_BATCH)
    ref = reference(name)[0]
    p = ref["prompts"][0]
    plan, _ = mixed.plan(len(p["ids"] + p["greedy_ids"]), 0, None)
    assert {plan.device_of(n) for n in plan.graph.nodes} == {"opencl:0", "cpu"}
    assert {n.op for n, _ in plan.fallbacks} == {"GLU", "ROPE"}
    assert all(r.device == "opencl:0" for r in mixed.residence.values())
    assert_teacher_forced(mixed, dict(ref, prompts=[p]))
