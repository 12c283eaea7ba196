"""The CUDA plugin. Everything that runs without a GPU runs here: discovery where CuPy is missing (the
reason it gives), its settings, its kernel table through the skeleton's lowering (every conformance
case lowered, every launch a kernel that kernels.cu defines, with every parameter its signature
names) and the kernel source's shape. The tests that need a CUDA GPU skip, with cuda:0's reason,
where there is none (CI's machines; benchmarks/cuda_h100.sh runs the GPU side on one)."""

from __future__ import annotations

import importlib.util
import os
import re
from functools import partial

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from framework import settings
from framework.backend import Lowering, c_kernels, weight_words
from framework.conformance.cases import all_cases, nmse
from framework.contract import ops
from framework.core.scheduler import Executor, make_plan
from framework.core.scheduler.errors import CapabilityError
from framework.plugins.cpu.device import CpuDevice
from framework.plugins.cuda import coverage, kernels, options, signatures
from framework.plugins.cuda.device import CudaDevice, devices
from framework.plugins.cuda.program import TABLE

HAS_CUPY = importlib.util.find_spec("cupy") is not None


@pytest.fixture(scope="module")
def cuda0():
    dev = devices()[0]
    if not dev.available:
        pytest.skip(f"needs a CUDA GPU: {dev.unavailable_reason}")
    return dev


# -- discovery and settings ----------------------------------------------------------------------------
@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed here: its absence cannot be seen")
def test_without_cupy_cuda0_is_unavailable_naming_cupy_and_the_install():
    (dev,) = devices()
    assert dev.name == "cuda:0" and not dev.available
    assert dev.unavailable_reason.startswith("CuPy is not installed or cannot be imported (No module named 'cupy')")
    assert "pip install cupy-cuda12x" in dev.unavailable_reason
    assert "unavailable: CuPy is not installed" in dev.describe()


@pytest.mark.parametrize("var, value, words", [
    (options.DISABLE_OPS_ENV, "GLU,FROB", "FROB is not an op the CUDA plugin has a kernel for"),
    (options.MAX_ALLOC_ENV, "0", f"{options.MAX_ALLOC_ENV}='0' is not a whole number of bytes, at least 1"),
    (options.GRAPHS_ENV, "maybe", f"{options.GRAPHS_ENV}='maybe' is not 1, true, yes or on"),
])
def test_bad_settings_are_the_reason_named(monkeypatch, var, value, words):
    monkeypatch.setenv(var, value)
    (dev,) = devices()
    assert not dev.available
    assert dev.unavailable_reason.startswith("bad cuda settings: ") and words in dev.unavailable_reason


def test_settings_parse(monkeypatch):
    from framework.contract import settings
    monkeypatch.setenv(options.DISABLE_OPS_ENV, "glu, rope")
    monkeypatch.setenv(options.GRAPHS_ENV, "off")
    monkeypatch.setenv(options.TF32_ENV, "0")
    assert settings.read(options.DISABLE_OPS_ENV) == {"GLU", "ROPE"}
    assert settings.read(options.GRAPHS_ENV) is False and settings.read(options.TF32_ENV) is False
    assert options.problem() is None


def test_cupy_compiles_into_the_projects_cache(monkeypatch, tmp_path):
    from framework import caches
    from framework.plugins.cuda import discovery
    monkeypatch.setenv("FRAMEWORK_CACHE", str(tmp_path))
    monkeypatch.delenv("CUPY_CACHE_DIR", raising=False)
    discovery._cupy_cache()
    assert discovery.cache_dir() == tmp_path / "cuda" and "cuda" in caches.CACHES
    assert os.environ["CUPY_CACHE_DIR"] == str(tmp_path / "cuda")
    monkeypatch.setenv("FRAMEWORK_CACHE", "off")
    monkeypatch.delenv("CUPY_CACHE_IN_MEMORY", raising=False)
    discovery._cupy_cache()
    assert discovery.cache_dir() is None and os.environ["CUPY_CACHE_IN_MEMORY"] == "1"


# -- the kernel table, through the skeleton ---------------------------------------------------------------
def test_the_table_covers_the_claimed_ops_and_they_are_the_op_tables():
    assert coverage.COVERED <= set(ops.OPS)
    assert set(TABLE.ops) == coverage.COVERED - set(ops.VIEW_OPS)
    for (op, param), codes in c_kernels.CHOICES.items():     # every value given a code is one the op table has
        choices = next(p for p in ops.spec(op).params if p.name == param).choices
        assert set(codes) <= {c[0] if isinstance(c, tuple) else c for c in choices}, (op, param)
    assert coverage.WEIGHT_TYPES >= {"F32", "F16", "Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"}


def test_every_kernel_of_the_table_is_defined_in_the_source_with_its_own_parameters():
    defined = kernels.defined_kernels()
    assert set(defined) == set(signatures.SIGNATURES)
    assert all(args == name for name, args in defined.items())
    header = signatures.c_header()
    for name in signatures.SIGNATURES:
        assert f"#define ARGS_{name} " in header
    assert "const uint ashape_x, const uint ashape_y, const uint ashape_z, const uint ashape_w" in header


def test_the_source_is_cuda_c_with_no_opencl_left():
    text = kernels.SOURCE.read_text()
    for opencl in ("__kernel", "__global ", "__local ", "barrier(", "reqd_work_group_size", "(float4)(", ".s0"):
        assert opencl not in text, opencl
    src = kernels.source()
    assert src.startswith(signatures.c_header()) and "#define OP_SILU 2\n" in src
    assert not re.search(r"^// @shared", src, re.M) and "KERNEL void binary(ARGS_binary)" in src   # spliced


def test_a_shared_section_that_does_not_exist_is_named(tmp_path):
    src = tmp_path / "kernels.cu"
    src.write_text("// @shared elementwise\n// @shared no_such_section\n")
    with pytest.raises(ValueError, match=r"kernels.cu asks for '// @shared no_such_section'.*sections: defaults, act"):
        c_kernels.source(signatures.KERNELS, src)


def _lower_all(dev):
    """Every conformance case's graph lowered for dev (placed on the CPU device for its fragment)."""
    lowered = []
    for case in all_cases():
        b = case.build()
        if not all(dev.supports_op(n).ok for n in b.graph.nodes if n.op in dev.supported_ops):
            continue
        if any(n.op not in dev.supported_ops for n in b.graph.nodes):
            continue
        for frag in make_plan(b.graph, [CpuDevice()]).fragments:
            lowered.append((case.id, Lowering(dev, frag, TABLE)))
    return lowered


def test_every_conformance_case_lowers_to_defined_kernels():
    dev = CudaDevice(0, reason="lowering only")
    defined = kernels.defined_kernels()
    lowered = _lower_all(dev)
    assert len(lowered) > 20
    names = set()
    for case_id, lw in lowered:
        assert lw.steps, case_id
        for st in lw.steps:
            assert st.kernel.kernel in defined, (case_id, st.name)
            assert len(st.binds) == sum(k in signatures.TENSOR_KINDS for k, _ in signatures.params(st.kernel.kernel))
            grid, block = st.grid
            assert grid >= 1 and block in (kernels.EWG, kernels.RWG, kernels.AWG) or block % 32 == 0, st.name
            names.add(st.name.split(" ")[0])
    for kernel in ("MUL_MAT[matvec]", "FLASH_ATTN_EXT[split]", "FLASH_ATTN_EXT", "RMS_NORM+MUL", "ROPE", "SET_ROWS"):
        assert any(n.startswith(kernel) for n in names), (kernel, sorted(names))


def test_decode_products_take_the_cores_fusion_groups(monkeypatch):
    """The DECODE cases lowered with the core's product groups (fused.py): the norm in the prologue of the
    product that reads it alone, gate and up with the GLU in one launch, the residual add in the epilogue,
    the attention block as rowvec3 (norm, Q, K, V), rope_kv and the attention; with FRAMEWORK_CUDA_UNFUSE=attn
    the block's nodes one by one, with all, every node (the norm's gain MUL too: rms_mul)."""
    dev = CudaDevice(0, reason="lowering only")
    cases = {c.id: c for c in all_cases() if c.id.startswith("DECODE-")}

    def names(case_id):
        (frag,) = make_plan(cases[case_id].build().graph, [CpuDevice()]).fragments
        return [st.name.split(" ")[0] for st in Lowering(dev, frag, TABLE).steps]
    one = next(i for i in cases if "-1-layer-" in i)
    fused = names(one)
    assert fused.count("NORM+MUL_MATx2+GLU") == 1 and fused.count("MUL_MAT+ADD") == 2, fused
    assert "GLU" not in fused and fused[-1] == "NORM+MUL_MAT" and "FLASH_ATTN_EXT" in fused, fused
    assert fused.count("NORM+MUL_MATx3") == 1 and fused.count("ROPE+SET_ROWS") == 1 and "ROPE" not in fused, fused
    monkeypatch.setenv(options.UNFUSE_ENV, "attn")
    split = names(one)
    assert "NORM+MUL_MATx3" not in split and "ROPE" in split and split.count("MUL_MAT[matvec]") == 3, split
    monkeypatch.setenv(options.UNFUSE_ENV, "all")
    plain = names(one)
    assert not any(n.startswith(("NORM+", "MUL_MAT+")) for n in plain) and "GLU" in plain, plain
    assert "RMS_NORM" in plain and "RMS_NORM+MUL" not in plain, plain        # rms_mul is among all
    assert len(plain) >= len(fused) + 3, (plain, fused)


def _quantized_qwen2(tmp_path, monkeypatch):
    """The tiny Qwen2 (biases on Q, K and V) with every matrix of a type the kernels read."""
    import dataclasses

    import tiny_models

    from framework.model.model import Model
    types = (("Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q4_K", "Q6_K"), ("Q5_0", "Q8_0", "Q4_1", "Q4_0", "Q8_0",
                                                                        "Q8_0", "Q4_K"))
    monkeypatch.setitem(tiny_models.SPECS, "qwen2", dataclasses.replace(tiny_models.SPECS["qwen2"], types=types))
    return Model(tiny_models.write("qwen2", tmp_path / "tiny-qwen2-quantized.gguf"))


def _decode_steps(model, rows: int = 1):
    """A step of `rows` rows with every row's logits (1: decode; more: a speculative round's verification),
    lowered for a cuda:0 known only to lower."""
    from framework.model.arch.base import KVCache
    graph, _ = model.build_step(rows, 256, rows, KVCache(model.hp, 512))
    (frag,) = make_plan(graph, [CpuDevice()]).fragments
    return graph, Lowering(CudaDevice(0, reason="lowering only"), frag, TABLE).steps


def test_qwen2s_biases_are_added_as_products_store(tmp_path, monkeypatch):
    """Qwen2's Q, K and V biases: inside an attention group, rowvec3 adds them (has_b bits); with the group
    off (FRAMEWORK_CUDA_UNFUSE=attn), each matrix-vector product adds its bias as it stores (r_ld 0: one row
    repeated). Either way a decode step launches no ADD for them."""
    model = _quantized_qwen2(tmp_path, monkeypatch)
    graph, steps = _decode_steps(model)
    biased = {n.name for n in graph.nodes if n.op == "ADD" and n.src[1].is_leaf}
    stacks = [st for st in steps if st.kernel.kernel == "rowvec3"]
    assert len(stacks) == model.hp.n_layer and all(st.params["has_b"] == 7 for st in stacks), [st.name for st in steps]
    assert all(st.name.startswith("NORM+MUL_MATx3+ADD") for st in stacks)
    assert not any(st.name.startswith(("ADD ", "ROPE ")) for st in steps), [st.name for st in steps]
    monkeypatch.setenv(options.UNFUSE_ENV, "attn")
    _, steps = _decode_steps(model)
    products = [st for st in steps if st.name.startswith("MUL_MAT[matvec]+ADD[bias]")]
    assert len(products) == 3 * model.hp.n_layer, [st.name for st in steps]
    assert all(st.params["r_ld"] == 0 and st.params["has_r"] == 1 for st in products)
    assert not {st.name.split(" ")[1] for st in steps if st.name.startswith("ADD ")} & biased
    residual = [st for st in steps if st.kernel.kernel == "matvec_q" and st.params["has_r"] and st not in products]
    assert all(st.params["r_ld"] == st.params["ld"] for st in residual)


def test_several_rows_of_x_are_multiplied_in_8_bits(tmp_path, monkeypatch):
    """By default (FRAMEWORK_CUDA_X8=rows) a verification step's products (4 rows of x) take x in 8 bits:
    quantized once per value (Q, K and V share one QUANT_X, as gate and up do), then one matvec_q8 launch a
    product for all 4 rows. With off, f32 x (matvec_q, no QUANT_X); with all, a decode step's products outside
    the fused groups too; a bad value is refused naming the variable."""
    monkeypatch.delenv(options.X8_ENV, raising=False)
    assert settings.read(options.X8_ENV) == "rows" == CudaDevice.x8      # the default
    model = _quantized_qwen2(tmp_path, monkeypatch)
    _, steps = _decode_steps(model, 4)
    products = [st for st in steps if st.kernel.kernel in ("matvec_q", "matvec_q8")]
    quants = [st for st in steps if st.kernel.kernel == "quant_x"]
    assert products and all(st.kernel.kernel == "matvec_q8" and st.params["M"] == 4 for st in products)
    assert all(st.kernel.options["MV_X8"] == 1 and st.kernel.options["MV_XL"] == 0 for st in products)
    made = {st.writes[0] for st in quants}
    read = [v for st in products for v in st.reads if v in made]
    assert len(read) == len(products) and set(read) == made           # every product reads one, each is read
    assert len(quants) == 4 * model.hp.n_layer + 1 < len(products)    # attn in, attn out, ffn in, ffn out; the head
    monkeypatch.setattr(CudaDevice, "x8", "off")     # FRAMEWORK_CUDA_X8=off (a device with a GPU reads it)
    _, steps = _decode_steps(model, 4)
    assert not any(st.kernel.kernel in ("quant_x", "matvec_q8") for st in steps)
    assert any(st.kernel.kernel == "matvec_q" and st.params["M"] == 4 for st in steps)
    monkeypatch.setenv(options.UNFUSE_ENV, "glu")    # gate and up, and down, as plain products
    _, one = _decode_steps(model, 1)
    monkeypatch.setattr(CudaDevice, "x8", "all")
    _, one_x8 = _decode_steps(model, 1)
    plain = [st.name for st in one if st.kernel.kernel == "matvec_q"]
    assert plain and [st.name for st in one_x8 if st.kernel.kernel == "matvec_q8"] == \
        [n.replace("[matvec]", "[matvec-x8]") for n in plain]
    fused = [st.name for st in one if st.kernel.kernel.startswith("rowvec")]
    assert fused and fused == [st.name for st in one_x8 if st.kernel.kernel.startswith("rowvec")]
    monkeypatch.setenv(options.X8_ENV, "some")
    assert options.X8_ENV in options.problem() and "rows, all, off" in options.problem()


def test_matvec_and_tile_shapes():
    sh = kernels.matvec_shape(gpr=18, m=1, rows=576)       # a small decode product: narrow blocks
    assert sh["MV_TPR"] == 16 and sh["MV_WG"] == 64 and sh["MV_R"] == 1 and sh["MV_XL"] == 1
    big = kernels.matvec_shape(gpr=128, m=1, rows=151936)
    assert big["MV_TPR"] == 32 and big["MV_WG"] == 256 and big["MV_R"] == 4
    assert kernels.matvec_rows(gpr=18, m=8) == 8 and kernels.matvec_rows(gpr=48, m=8) == 4   # x in shared memory
    assert kernels.matvec_rows(gpr=280, m=8, x8=True) == 8          # 8-bit x is read from the caches: all rows
    x8 = kernels.matvec_shape(gpr=48, m=4, rows=8960, x8=True)
    assert (x8["MV_X8"], x8["MV_XL"], x8["MV_MM"], x8["MV_R"]) == (1, 0, 4, 2)   # an x load serves 2 weight rows
    long = kernels.matvec_shape(gpr=280, m=1, rows=1536)    # the 1.5B's down product: teams of 4 warps
    assert long["MV_TPR"] == 128 and long["MV_WG"] % long["MV_TPR"] == 0
    assert kernels.matmul_shape(512, 4096)["MM_BM"] == 64 and kernels.matmul_shape(8, 64)["MM_BM"] == 32
    assert kernels.matmul_threads(kernels.matmul_shape(512, 4096)) == 128             # 4 warps of fragments
    assert kernels.matmul_threads(kernels.matmul_shape(512, 4096, mma=False)) == 256  # 4 x 4 outputs a thread


def test_tensor_cores_from_compute_capability_8():
    def dev(cc):
        d = CudaDevice(0, reason="lowering only")
        d.data = {"compute_capability": cc}
        return d
    assert kernels.tensor_cores(dev("9.0")) and kernels.tensor_cores(dev("8.0"))
    assert not kernels.tensor_cores(dev("7.5")) and not kernels.tensor_cores(dev("6.1"))
    off = dev("9.0")
    off.tf32 = False              # FRAMEWORK_CUDA_TF32=off
    assert not kernels.tensor_cores(off)


def test_unavailable_device_keeps_limits_as_data():
    dev = CudaDevice(3, reason="no GPU here")
    assert dev.name == "cuda:3" and not dev.available and dev.max_chunk_bytes == options.MAX_BUFFER
    assert dev.buffer_type.name == "cuda:3" and "Q4_K" in dev.limits.dtypes
    # queued_inputs comes from the program class (backend_limits): the CUDA program copies a held token on the device
    assert dev.limits.queued_inputs is CudaDevice.program_class.stage_device_inputs is True


# -- on a CUDA GPU ---------------------------------------------------------------------------------------------
def test_cuda0_properties(cuda0):
    d = cuda0.data
    assert re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.0", d["pci_address"])
    assert cuda0.physical_id == d["pci_address"] and re.fullmatch(r"\d+\.\d+", d["compute_capability"])
    assert d["global_mem_bytes"] > 1 << 30


@pytest.mark.parametrize("case", [c for c in all_cases() if c.id.startswith(("MUL_MAT", "DECODE-", "FLASH"))][:40] +
                         [c for c in all_cases() if c.id.startswith("ARGMAX")], ids=lambda c: c.id)
def test_cases_on_cuda0(cuda0, case):
    b = case.build()
    other = sorted({t.dtype.name for t in b.graph.leaves if t.kind.name == "WEIGHT"} - coverage.WEIGHT_TYPES)
    if other:          # a weight type the kernels do not read: refused at planning, naming it
        with pytest.raises(CapabilityError, match=f"cuda:0 declares weight types .*'{other[0]}'|is {other[0]}"):
            make_plan(b.graph, [cuda0])
        return
    ref = Executor([CpuDevice()], b.weight_bytes).run(make_plan(b.graph, [CpuDevice()]), b.fresh_inputs())
    outs = Executor([cuda0], b.weight_bytes).run(make_plan(b.graph, [cuda0]), b.fresh_inputs())
    for o, r in zip(outs, ref):
        if np.asarray(r).dtype == np.int32:         # indices (ARGMAX): exactly the reference's
            assert np.array_equal(o, r), case.id
        else:
            assert nmse(np.asarray(o), np.asarray(r)) <= b.tolerance, case.id


@pytest.mark.parametrize("tensor_cores", [1, 0], ids=["tf32-mma", "f32-fma"])
def test_tiled_products_on_cuda0_with_and_without_tensor_cores(cuda0, monkeypatch, tensor_cores):
    """Prefill's products (more than 8 rows of x) of every weight type the kernels read, by both of the tiled
    kernel's ways of multiplying: tensor cores, as compute capability 8.0 on takes, and f32 multiply-adds, as
    older GPUs and FRAMEWORK_CUDA_TF32=off take."""
    monkeypatch.setattr(cuda0, "tf32", bool(tensor_cores))
    cases = [c for c in all_cases() if c.id.startswith("MUL_MAT") and "prefill" in c.id]
    ran = 0
    for case in cases:
        b = case.build()
        types = {t.dtype.name for t in b.graph.leaves if t.kind.name == "WEIGHT"}
        if types - coverage.WEIGHT_TYPES or not types & set(weight_words.QUANT_TYPES):
            continue         # read by other kernels (float weights: mul_mat_f), or refused
        ref = Executor([CpuDevice()], b.weight_bytes).run(make_plan(b.graph, [CpuDevice()]), b.fresh_inputs())
        ex = Executor([cuda0], b.weight_bytes)
        outs = ex.run(make_plan(b.graph, [cuda0]), b.fresh_inputs())
        tiles = [st for p in ex.programs.values() for st in p.steps if st.kernel.kernel == "matmul_q"]
        assert tiles and all(st.kernel.options["MM_MMA"] == tensor_cores for st in tiles), case.id
        for o, r in zip(outs, ref):
            assert nmse(np.asarray(o), np.asarray(r)) <= b.tolerance, case.id
        ran += 1
    assert ran >= 4


@pytest.mark.parametrize("x8", ["rows", "off"])
def test_several_row_products_on_cuda0_match_the_cpu_plugin(cuda0, monkeypatch, x8):
    """Products of 2, 4 and 8 rows of x (a speculative round's verification) by every weight type the kernels
    read, x in 8 bits (matvec_q8, the default) and in f32 (FRAMEWORK_CUDA_X8=off), against the CPU plugin."""
    from framework.conformance.cases import Case, mul_mat_weight
    monkeypatch.setattr(cuda0, "x8", x8)
    ran = 0
    for qt in sorted(coverage.WEIGHT_TYPES & set(weight_words.QUANT_TYPES)):
        for m in (2, 4, 8):
            b = Case(f"MUL_MAT-{qt}-verify-w48x512-x{m}x512", "MUL_MAT",
                     partial(mul_mat_weight, qtype=GGMLQuantizationType[qt], n=48, k=512, m=m)).build()
            ref = Executor([CpuDevice()], b.weight_bytes).run(make_plan(b.graph, [CpuDevice()]), b.fresh_inputs())
            ex = Executor([cuda0], b.weight_bytes)
            outs = ex.run(make_plan(b.graph, [cuda0]), b.fresh_inputs())
            kernel = {st.kernel.kernel for p in ex.programs.values() for st in p.steps} & {"matvec_q", "matvec_q8"}
            assert kernel == {"matvec_q8" if x8 == "rows" else "matvec_q"}, b.case.id
            assert nmse(np.asarray(outs[0]), np.asarray(ref[0])) <= b.tolerance, b.case.id
            ran += 1
    assert ran >= 18


def test_qwen2_verification_steps_on_cuda0_match_the_cpu_plugin(cuda0, monkeypatch, tmp_path):
    """A verification step of 4 rows (every row's logits) after a prompt, x in 8 bits, against the CPU plugin."""
    from framework.runtime.session import Session
    model = _quantized_qwen2(tmp_path, monkeypatch)
    got, want = Session(model, [cuda0], n_ctx=64), Session(model, [CpuDevice()], n_ctx=64)
    got.eval([3, 1, 4, 1, 5]), want.eval([3, 1, 4, 1, 5])
    a, b = got.eval([9, 2, 6, 5], all_logits=True, prompt=False), want.eval([9, 2, 6, 5], all_logits=True, prompt=False)
    assert nmse(np.asarray(a), np.asarray(b)) <= 5e-4
    assert (np.argmax(a, axis=-1) == np.argmax(b, axis=-1)).all()
    assert any(st.kernel.kernel == "matvec_q8" for p in got.executor.programs.values() for st in p.steps)


def test_qwen2_decode_with_biased_attention_groups_matches_the_cpu_plugin(cuda0, monkeypatch, tmp_path):
    from framework.runtime.session import Session
    model = _quantized_qwen2(tmp_path, monkeypatch)
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    got, want = Session(model, [cuda0], n_ctx=64), Session(model, [CpuDevice()], n_ctx=64)
    got.eval(ids[:3]), want.eval(ids[:3])
    for t in ids[3:]:
        a, b = got.eval([t]), want.eval([t])
        assert nmse(np.asarray(a), np.asarray(b)) <= 5e-4 and int(np.argmax(a)) == int(np.argmax(b))
    assert any(st.kernel.kernel == "rowvec3" for p in got.executor.programs.values() for st in p.steps)


def test_decode_steps_replayed_as_graphs_equal_launched_ones(cuda0, monkeypatch, tmp_path):
    """A tiny llama (its weight types the kernels do not read go to the CPU plugin: cuda:0 runs the rest, in
    fragments that each are a program captured and replayed)."""
    import tiny_models

    from framework.model.model import Model
    from framework.runtime.session import Session
    model = Model(tiny_models.write("llama", tmp_path / "tiny-llama.gguf"))
    ids = [1, 2, 3, 4, 5, 6]
    graphs = Session(model, [cuda0, CpuDevice()], n_ctx=64)
    graphs.eval(ids[:2])
    replayed = np.stack([graphs.eval([t]) for t in ids[2:]])
    assert cuda0.captures >= 1 and cuda0.replays >= 1
    monkeypatch.setenv(options.GRAPHS_ENV, "0")
    plain = CudaDevice(cuda0.index, cuda0.data)
    s = Session(model, [plain, CpuDevice()], n_ctx=64)
    s.eval(ids[:2])
    np.testing.assert_allclose(replayed, np.stack([s.eval([t]) for t in ids[2:]]), rtol=1e-5, atol=1e-5)


def test_greedy_steps_queued_on_cuda0_give_the_logits_paths_tokens(cuda0, monkeypatch, tmp_path):
    """Greedy decoding with each step queued before the step before's token is read (its token copied on the
    device from that step's ARGMAX into the values buffer, so one graph is captured and replayed) gives the
    tokens of the logits read back and np.argmax, step by step."""
    from framework.runtime.greedy import greedy_tokens, pipelined
    from framework.runtime.session import Session
    model = _quantized_qwen2(tmp_path, monkeypatch)        # every weight a type cuda:0 reads: no cpu in the list
    s = Session(model, [cuda0], n_ctx=64)
    assert pipelined(s)
    captures = cuda0.captures
    got = list(greedy_tokens(s, [1, 2, 3], 20))
    plain = Session(model, [cuda0], n_ctx=64)
    want = [int(np.argmax(plain.eval([1, 2, 3])))]
    while len(want) < 20:
        want.append(int(np.argmax(plain.eval([want[-1]]))))
    assert got == want and s.n_past == 3 + 19
    assert cuda0.captures - captures <= 4, "greedy steps were captured again and again: their buffers changed"


def test_greedy_verification_by_argmax_rows_on_cuda0_gives_the_logits_paths_text(cuda0, monkeypatch, tmp_path):
    """A greedy speculative round verified by each row's ARGMAX on cuda:0 accepts what the same rows' logits read
    back accept: the same text either way (the several-row steps' own kernels both times)."""
    from framework.runtime.sampling import Sampler, SamplingParams
    from framework.runtime.session import Session
    from framework.runtime.speculative import SpeculativeDecoder, make_draft
    model = _quantized_qwen2(tmp_path, monkeypatch)
    ids = [1, 2, 3, 1, 2, 3, 1, 2]                     # prompt lookup finds continuations: drafts are proposed
    texts, greedy_rows = [], []
    for on_device in (True, False):
        s = Session(model, [cuda0], n_ctx=64)
        s.argmax_on_device = on_device
        decoder = SpeculativeDecoder(s, make_draft("ngram:2", s, [cuda0]), 3, baseline=2, inexact=True)
        decoder.reserve(len(ids), 16, greedy=True)
        texts.append([p.token for p in decoder.generate(ids, 16, Sampler(SamplingParams()))])
        assert decoder.stats.drafted > 0, decoder.stats.line()
        greedy_rows.append(any(k[0] > 1 and k[3:] == ("argmax",) for k in s.plans))
    assert texts[0] == texts[1] and greedy_rows == [True, False]
