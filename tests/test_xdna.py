"""The XDNA plugin (framework.plugins.xdna): tile geometry, the packed-weight cache, plans and chains,
the host arm on both real models against llama.cpp's outputs, discovery, and the thin pyxrt layer
against a test double of pyxrt with the real signatures (tests/fake_pyxrt.py).

No NPU here: everything that needs one runs either on the host arm (an emulation: the same packed
tiles, chains and runlist construction, numpy in place of the NPU) or through the pyxrt double.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import fake_pyxrt as fx
import numpy as np
import pytest
from conftest import load_model, reference, reference_text
from gguf import GGMLQuantizationType, quants
from reference_checks import assert_teacher_forced, assert_text_metrics

from framework.core.graph import F32, GraphBuilder, LeafKind, leaf
from framework.registry import default_registry
from framework.core.scheduler import DeviceRunError, Executor, make_plan
from framework.plugins.xdna import tiles
from framework.plugins.xdna.cache import (
    model_key,
    source_digest,
    store_container,
)
from framework.plugins.xdna.device import XdnaDevice, host_arm_device, read_config
from framework.plugins.xdna.discovery import discover
from framework.plugins.xdna.geometry import (
    CHUNK_BYTES,
    CHUNK_KIND,
    GeometryError,
    check_container,
    tile_grid,
)
from framework.plugins.xdna.kernels import ABI, FORMAT, KernelSetError, load_kernel_set
from framework.plugins.xdna.profiles import PROFILES, get_profile, profile_for_pci
from framework.plugins.xdna.xrt import XdnaRunError, XrtSession
from framework.runtime.session import Session

Q4_1, Q4_0, Q8_0, Q4_K = (GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q8_0,
                          GGMLQuantizationType.Q4_K)
XDNA_ENV = ("FRAMEWORK_XDNA_KERNELS", "FRAMEWORK_XDNA_MAX_CHAIN", "FRAMEWORK_XDNA_HOST_ARM", "FRAMEWORK_XDNA_PROFILE",
            "FRAMEWORK_XDNA_REQUANTIZE", "FRAMEWORK_XDNA_TIMEOUT_MS", "FRAMEWORK_XDNA_CACHE_DIR")
FAKE_MAGIC = 0x464B4745          # first word of the double's instruction streams: then m, k, n


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in XDNA_ENV:
        monkeypatch.delenv(var, raising=False)
    fx.reset()
    fx.KERNELS["MLIR_AIE"] = fake_gemm


@pytest.fixture(scope="module")
def cpu():
    return default_registry().select("cpu")[0]


# -- helpers -------------------------------------------------------------------------------------------
def q_weight(name: str, shape: tuple[int, int], dtype=Q4_1, seed: int = 0):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(shape).astype(np.float32) * 0.05
    return leaf(name, dtype, shape, LeafKind.WEIGHT), np.ascontiguousarray(quants.quantize(values, dtype))


def q_weights(names: list[str], shape: tuple[int, int]) -> tuple[list, dict]:
    """q_weight for each name (seeds 0, 1, ...): the leaves, and their raw bytes by name."""
    pairs = [q_weight(name, shape, seed=i) for i, name in enumerate(names)]
    return [w for w, _ in pairs], {w.name: raw for w, raw in pairs}


def matmul_graph(weights: list, n_tokens: int, k: int):
    """One input x (n_tokens, k) multiplied by every weight: independent products, one fragment."""
    b = GraphBuilder()
    x = b.input("x", F32, (n_tokens, k))
    outs = [b.mul_mat(b.use(w), x, name=f"y{i}") for i, w in enumerate(weights)]
    return b.build(outs), x


def run_graph(devices, graph, x_leaf, x, raws: dict):
    plan = make_plan(graph, devices)
    ex = Executor(devices, lambda t: raws[t.name])
    return plan, ex.run(plan, {id(x_leaf): x})


def subsequence(calls: list[tuple], wanted: list) -> None:
    """Every item of wanted appears in calls, in this order (a callable item is a predicate)."""
    i = 0
    for w in wanted:
        while i < len(calls) and not (w(calls[i]) if callable(w) else calls[i] == w):
            i += 1
        assert i < len(calls), f"{w} not found in order; calls: {calls}"
        i += 1


def fake_gemm(r: fx.run) -> None:
    """What an NPU GEMM of this plugin's ABI computes, for the double: reads the shape from the
    instruction stream (or ELF), A as bf16, W as tiles, writes C as float32, device copies only."""
    if r.kernel.elf is not None:
        words = r.kernel.elf.words
    else:
        words = r.args[1].dev.view("<u4")
    magic, m, k, n = (int(w) for w in words[:4])
    assert magic == FAKE_MAGIC
    assert r.args[0] == 3
    a = tiles.from_bf16(r.args[3].dev.view(np.uint16)[:m * k]).reshape(m, k)
    w = tiles.decode(r.args[4].dev, tile_grid((n, k)), crop=False)
    c = (a @ w.T).astype(np.float32)
    r.args[5].dev[:m * n * 4] = c.reshape(-1).view(np.uint8)


def make_kernel_set(folder: Path, shapes, *, flow: str = "insts", insts_count: str = "words",
                    xclbins: int = 1) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, (m, k, n) in enumerate(shapes):
        words = np.array([FAKE_MAGIC, m, k, n, 0, 0, 0, 0], dtype="<u4")
        xclbin = f"gemm{i % xclbins}.xclbin"
        (folder / xclbin).write_text(json.dumps({"uuid": f"uuid-{i % xclbins}", "kernels": ["MLIR_AIE"]}))
        if flow == "elf":
            name = f"gemm_{m}x{k}x{n}.elf"
            (folder / name).write_bytes(words.tobytes())
            entries.append({"m": m, "k": k, "n": n, "elf": name, "xclbin": xclbin})
        elif i % 2:
            name = f"insts_{m}x{k}x{n}.txt"
            (folder / name).write_text("\n".join(f"{w:08x}" for w in words) + "\n")
            entries.append({"m": m, "k": k, "n": n, "insts": name, "xclbin": xclbin})
        else:
            name = f"insts_{m}x{k}x{n}.bin"
            (folder / name).write_bytes(words.tobytes())
            entries.append({"m": m, "k": k, "n": n, "insts": name, "xclbin": xclbin})
    (folder / "kernels.json").write_text(json.dumps({"format": FORMAT, "abi": ABI, "kernel": "MLIR_AIE",
                                                     "insts_count": insts_count, "gemm": entries}))
    return folder


def npu_device(folder: Path, cache: Path, *, profile: str = "xdna2", max_chain: int | None = None) -> XdnaDevice:
    ks = load_kernel_set(folder)
    session = XrtSession(fx, fx.device(0), ks, get_profile(profile), "xdna:0")
    return XdnaDevice(0, profile=profile, arm="npu", physical_id="0000:c5:00.1", session=session, kernel_set=ks,
                      max_chain=max_chain, cache_root=cache)


SMOL_GRIDS = [(768, 576), (768, 192), (768, 1536), (1536, 576)]      # (padded k, padded n) of SmolLM2's weights


# -- geometry ------------------------------------------------------------------------------------------
def test_tile_layout_is_5120_bytes_of_q4_1():
    assert CHUNK_BYTES == 256 * 2 + 256 * 2 + 4096 == 5120
    g = tile_grid((576, 8960))
    assert (g.padded_rows, g.padded_cols, g.tiles, g.nbytes) == (576, 8960, 18 * 35, 18 * 35 * 5120)
    assert tile_grid((192, 576)).padded_shape == (192, 768)          # K padded to a multiple of 256
    assert tile_grid((100, 256)).padded_shape == (128, 256)          # N to a multiple of 32
    wide = tile_grid((8960, 640), (9216, 768))
    assert wide.wider and wide.tiles == 288 * 3


def test_container_checks_accept_exact_and_declared_wider_grids_only():
    shape = (640, 8960)                       # ffn_down of an 8960-wide MLP
    exact = tile_grid(shape).nbytes
    assert check_container("w", shape, exact, offset=0).padded_shape == (640, 8960)
    padded = tile_grid(shape, (640, 9216))
    assert check_container("w", shape, padded.nbytes, offset=0, padded_shape=(640, 9216)) == padded
    # the padded size without its declaration, or with a narrower one: refused, with the numbers
    with pytest.raises(GeometryError) as e:
        check_container("blk.3.ffn_down.weight", shape, padded.nbytes, offset=4096)
    msg = str(e.value)
    for part in ("'blk.3.ffn_down.weight'", "offset 4096", f"{padded.nbytes} bytes", f"valid sizes are {exact}",
                 "remainder 0", "not decoding on a guess"):
        assert part in msg, (part, msg)
    with pytest.raises(GeometryError, match="narrower"):
        check_container("w", shape, exact, offset=0, padded_shape=(640, 8704))
    with pytest.raises(GeometryError, match="remainder 1000 bytes"):
        check_container("w", shape, padded.nbytes - 4120, offset=0, padded_shape=(640, 9216))
    with pytest.raises(GeometryError, match="chunks are 'q4_0_tile_32x256_bf16' of 4608 bytes"):
        check_container("w", shape, exact, offset=0, chunk_kind="q4_0_tile_32x256_bf16", chunk_bytes=4608)


def test_repacked_types_keep_their_integers():
    """Q4_1, Q4_0 and (from Gemma's file) Q4_K: the decoded tiles are the file's integers times its
    scales, with scales and minimums rounded to bfloat16 and nothing else changed."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((70, 576)).astype(np.float32)
    for dtype in (Q4_1, Q4_0):
        raw = quants.quantize(x, dtype)
        q, scale, minimum = tiles.groups_from_gguf(raw, dtype, 70, 576)
        want = quants.dequantize(raw, dtype).reshape(70, 576)
        ref = q.astype(np.float32).reshape(70, 18, 32) * scale[..., None] + minimum[..., None]
        np.testing.assert_allclose(ref.reshape(70, 576), want, rtol=1e-6, atol=1e-7)     # the file's integers
        g = tile_grid((70, 576))
        got = tiles.decode(tiles.pack(raw, dtype, g), g)
        bf = (q.astype(np.float32).reshape(70, 18, 32) * tiles.round_bf16(scale)[..., None]
              + tiles.round_bf16(minimum)[..., None]).reshape(70, 576)
        np.testing.assert_array_equal(got, bf)
    gemma = load_model("gemma3")
    entry = next(e for e in gemma.file.tensors.values() if e.dtype.name == "Q4_K")
    raw = np.asarray(gemma.file.tensor_bytes(entry.name))
    want = quants.dequantize(raw.reshape(entry.shape[0], -1), Q4_K).reshape(entry.shape)
    q, scale, minimum = tiles.groups_from_gguf(raw, Q4_K, *entry.shape)
    rows, k = entry.shape
    exact = (q.astype(np.float32).reshape(rows, k // 32, 32) * scale[..., None] + minimum[..., None]).reshape(rows, k)
    np.testing.assert_allclose(exact, want, rtol=1e-6, atol=1e-6)
    g = tile_grid(entry.shape)
    got = tiles.decode(tiles.pack(raw, Q4_K, g), g)
    bound = (15 * np.abs(scale) + np.abs(minimum)) * 2.0 ** -8       # bf16 rounding of scale and minimum
    assert np.all(np.abs(got - want).reshape(rows, k // 32, 32) <= bound[..., None] + 1e-7)


def test_other_types_are_refused_unless_requantizing_is_asked_for(tmp_path):
    w, raw = q_weight("blk.0.attn_v.weight", (64, 256), Q8_0)
    graph, _ = matmul_graph([w], 2, 256)
    dev = host_arm_device(0, cache_root=tmp_path)
    verdict = dev.supports_op(graph.nodes[0])
    assert not verdict.ok and verdict.code == "unsupported_dtype"
    assert "weight type Q8_0" in verdict.reason and "no exact tile form" in verdict.reason
    assert "requantizing it to Q4_1 tiles would change results" in verdict.reason
    lossy = host_arm_device(0, cache_root=tmp_path, requantize=True)
    assert lossy.supports_op(graph.nodes[0]).ok
    lossy.load_weight(w, raw)
    assert "Q8_0 requantized to Q4_1 tiles" in lossy.conversions() and "lossy" in lossy.conversions()


# -- the packed cache ------------------------------------------------------------------------------------
def test_second_load_is_a_read(tmp_path, cpu):
    model = load_model("smollm2")
    ids = reference("smollm2")[0]["prompts"][0]["ids"]
    first = host_arm_device(0, cache_root=tmp_path)
    a = Session(model, [first, cpu], n_ctx=64, n_layers=2).eval(ids)
    n = 2 * 7                                           # 7 Q4_1 matrices a layer
    assert (first.store.stats.packed, first.store.stats.read) == (n, 0)
    second = host_arm_device(0, cache_root=tmp_path)
    b = Session(model, [second, cpu], n_ctx=64, n_layers=2).eval(ids)
    assert (second.store.stats.packed, second.store.stats.read) == (0, n)
    np.testing.assert_array_equal(a, b)
    folder = tmp_path / model_key(model.file.tensor_bytes("blk.0.ffn_up.weight"))
    manifest = json.loads((folder / "manifest.json").read_text())
    e = manifest["tensors"]["blk.0.ffn_up.weight"]
    assert e["shape"] == [1536, 576] and e["padded_shape"] == [1536, 768]
    assert e["size"] == 48 * 3 * CHUNK_BYTES and e["offset"] % 4096 == 0
    assert e["chunk_kind"] == CHUNK_KIND and e["geometry_version"] == 1 and e["source_dtype"] == "Q4_1"
    # a cache of another geometry version is stale: replaced, never read
    manifest["geometry_version"] = 0
    (folder / "manifest.json").write_text(json.dumps(manifest))
    third = host_arm_device(0, cache_root=tmp_path)
    c = Session(model, [third, cpu], n_ctx=64, n_layers=2).eval(ids)
    assert (third.store.stats.packed, third.store.stats.read) == (n, 0)
    np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("orientation", ["ffn_up", "ffn_down"])
def test_padded_truncated_and_foreign_containers(tmp_path, orientation):
    """Failure 4 of the brief: intermediate size 8960 stored on a 9216-wide grid. A correct cache and the
    padded one load and give identical outputs; a truncated one and one of another chunk kind are never
    decoded: reported (naming the tensor, offset, sizes and remainder) and repacked from the GGUF bytes."""
    hidden = 64
    shape, padded = ((8960, hidden), (9216, 256)) if orientation == "ffn_up" else ((hidden, 8960), (64, 9216))
    name = f"blk.0.{orientation}.weight"
    w, raw = q_weight(name, shape)
    graph, xl = matmul_graph([w], 3, shape[1])
    x = np.random.default_rng(2).standard_normal((3, shape[1])).astype(np.float32)

    def run(root):
        return run_graph([host_arm_device(0, cache_root=root)], graph, xl, x, {name: raw})[1][0]

    correct = run(tmp_path / "correct")
    key = model_key(raw)
    wide = tiles.pack(raw, Q4_1, tile_grid(shape, padded))
    assert wide.size == tile_grid(shape, padded).nbytes > tile_grid(shape).nbytes
    store_container(tmp_path / "padded" / key, name, wide, shape=shape, padded_shape=padded, source_dtype="Q4_1",
                    source_digest_=source_digest(raw))
    dev = host_arm_device(0, cache_root=tmp_path / "padded")
    out = run_graph([dev], graph, xl, x, {name: raw})[1][0]
    assert dev.store.stats.read == 1 and dev.store.stats.packed == 0
    np.testing.assert_array_equal(out, correct)

    def rebuilt(root):
        dev = host_arm_device(0, cache_root=root)
        np.testing.assert_array_equal(run_graph([dev], graph, xl, x, {name: raw})[1][0], correct)
        assert (dev.store.stats.packed, dev.store.stats.read) == (1, 0)
        again = host_arm_device(0, cache_root=root)                  # the repacked entry is read back
        np.testing.assert_array_equal(run_graph([again], graph, xl, x, {name: raw})[1][0], correct)
        assert (again.store.stats.read, again.store.stats.rebuilt) == (1, [])
        (msg,) = dev.store.stats.rebuilt
        return msg

    entry = store_container(tmp_path / "truncated" / key, name, wide[:-3000], shape=shape, padded_shape=padded,
                            source_dtype="Q4_1", source_digest_=source_digest(raw))
    msg = rebuilt(tmp_path / "truncated")
    for part in (f"'{name}'", f"offset {entry['offset']}", f"{wide.size - 3000} bytes", "valid sizes are",
                 str(tile_grid(shape).nbytes), str(wide.size), f"remainder {(wide.size - 3000) % CHUNK_BYTES}"):
        assert part in msg, (part, msg)

    other = np.zeros(tile_grid(shape).tiles * 4608, dtype=np.uint8)
    store_container(tmp_path / "foreign" / key, name, other, shape=shape, padded_shape=tile_grid(shape).padded_shape,
                    source_dtype="Q4_1", source_digest_=source_digest(raw), chunk_kind="q4_0_tile_32x256_bf16",
                    chunk_bytes=4608)
    assert re.search(rf"'{name}' at offset 0 .*chunks are 'q4_0_tile_32x256_bf16' of 4608",
                     rebuilt(tmp_path / "foreign"))


def test_truncated_file_is_reported_and_repacked_not_a_short_read(tmp_path):
    w, raw = q_weight("blk.1.attn_q.weight", (96, 512))
    graph, xl = matmul_graph([w], 1, 512)
    x = np.ones((1, 512), dtype=np.float32)
    first = run_graph([host_arm_device(0, cache_root=tmp_path)], graph, xl, x, {w.name: raw})[1][0]
    folder = tmp_path / model_key(raw)
    data = (folder / "packed.bin").read_bytes()
    (folder / "packed.bin").write_bytes(data[:-1234])
    dev = host_arm_device(0, cache_root=tmp_path)
    np.testing.assert_array_equal(run_graph([dev], graph, xl, x, {w.name: raw})[1][0], first)
    (msg,) = dev.store.stats.rebuilt
    assert re.search(r"'blk.1.attn_q.weight' at offset 0 .*truncated.*remainder", msg)
    assert dev.store.stats.packed == 1


def test_a_cache_folder_that_cannot_be_written_packs_in_memory(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    w, raw = q_weight("blk.0.attn_k.weight", (32, 256))
    graph, xl = matmul_graph([w], 1, 256)
    dev = host_arm_device(0, cache_root=blocker / "xdna")
    run_graph([dev], graph, xl, np.ones((1, 256), np.float32), {w.name: raw})
    assert dev.store.stats.packed == 1 and "a-file" in dev.store.stats.unwritable


def test_model_with_padded_mlp_containers_gives_identical_logits(tmp_path, cpu):
    """SmolLM2's MLP weights (intermediate 1536) stored on a 2048-wide grid by 'another packer':
    decoded on that grid and cropped, the logits are bit for bit those of the plugin's own cache."""
    model = load_model("smollm2")
    ids = reference("smollm2")[0]["prompts"][0]["ids"]
    plain = Session(model, [host_arm_device(0, cache_root=tmp_path / "plain"), cpu], n_ctx=64, n_layers=2).eval(ids)
    for il in range(2):
        for part, padded in (("ffn_up", (2048, 768)), ("ffn_gate", (2048, 768)), ("ffn_down", (576, 2048))):
            name = f"blk.{il}.{part}.weight"
            entry = model.file.tensors[name]
            raw = model.file.tensor_bytes(name)
            store_container(tmp_path / "wide" / model_key(raw), name, tiles.pack(raw, entry.dtype,
                            tile_grid(entry.shape, padded)), shape=entry.shape, padded_shape=padded,
                            source_dtype=entry.dtype.name, source_digest_=source_digest(raw))
    dev = host_arm_device(0, cache_root=tmp_path / "wide")
    wide = Session(model, [dev, cpu], n_ctx=64, n_layers=2).eval(ids)
    assert dev.store.stats.read == 6 and dev.store.stats.packed == 8
    np.testing.assert_array_equal(wide, plain)


# -- plans and chains --------------------------------------------------------------------------------------
def test_plan_puts_matrix_products_on_the_npu_and_the_rest_on_the_host(tmp_path, cpu):
    model = load_model("smollm2")
    dev = host_arm_device(0, cache_root=tmp_path)
    session = Session(model, [dev, cpu], n_ctx=64)
    plan, _ = session.plan(1, 0, 1)
    for n in plan.graph.nodes:
        p = plan.placement[id(n)]
        if n.op == "MUL_MAT" and n.src[0].kind == LeafKind.WEIGHT and n.src[0].dtype.name == "Q4_1":
            assert p.device == "xdna:0", (n.name, p)
        elif n.op == "MUL_MAT" and n.src[0].kind == LeafKind.WEIGHT:           # the Q8_0 output projection
            assert p.device == "cpu" and "weight type Q8_0" in p.refusals["xdna:0"].reason
        elif n.op not in ("RESHAPE", "VIEW", "PERMUTE", "TRANSPOSE"):
            assert p.device == "cpu", (n.name, p)
            # pinned to the cache's device (pass 1), or refused by xdna with its reason (pass 2)
            assert p.reason.startswith("pinned") or p.refusals["xdna:0"].code == "unsupported_op", (n.name, p)
    d = plan.to_dict()
    assert d["emulation"] == {"xdna:0": "xdna2 on the xdna host arm (numpy)"}
    assert "EMULATION" in dev.describe() and "EMULATION" in dev.description
    assert d["per_device"]["xdna:0"]["nodes"] >= 7 * model.hp.n_layer


def test_chains_never_exceed_the_limit_and_results_do_not_depend_on_it(tmp_path, cpu):
    model = load_model("smollm2")
    p = reference("smollm2")[0]["prompts"][0]
    out = {}
    for limit in (1, 2, 24):
        dev = host_arm_device(0, cache_root=tmp_path, max_chain=limit)
        s = Session(model, [dev, cpu], n_ctx=64, n_layers=3)
        s.eval(p["ids"])
        out[limit] = s.eval(p["greedy_ids"][:1])                 # a decode step
        assert dev.stats.chains and max(dev.stats.chains) <= limit
        plan, _ = s.plan(1, len(p["ids"]), 1)
        for f in plan.fragments:
            if f.device == "xdna:0":
                assert all(sum(1 for n in f.nodes[a:b] if n.op == "MUL_MAT") <= limit for a, b in f.submissions)
        if limit == 2:
            assert 2 in dev.stats.chains                  # q, k, v: chains of 2 and 1
        if limit == 24:
            assert 3 in dev.stats.chains                  # q, k, v chained in one runlist
    np.testing.assert_array_equal(out[1], out[24])
    np.testing.assert_array_equal(out[2], out[24])


def test_a_42_run_fragment_is_cut_to_the_profile_limit(tmp_path):
    """Failure 5: 42 products in one fragment. The plan cuts it into submissions of at most 24 and the
    NPU arm (through the pyxrt double, whose driver times out chains longer than 24) runs two
    runlists; a limit of 42 is not even accepted by the device."""
    weights, raws = q_weights([f"blk.{i}.attn_q.weight" for i in range(42)], (32, 256))
    graph, xl = matmul_graph(weights, 1, 256)
    x = np.random.default_rng(3).standard_normal((1, 256)).astype(np.float32)
    ks = make_kernel_set(tmp_path / "ks", [(1, 256, 32)])
    fx.behaviour.timeout_chains_over = 24
    dev = npu_device(ks, tmp_path / "cache")
    plan, outs = run_graph([dev], graph, xl, x, raws)
    (frag,) = plan.fragments
    assert frag.submissions == [(0, 24), (24, 42)] and plan.per_device()["xdna:0"]["submissions"] == 2
    assert [c[1] for c in fx.CALLS if c[0] == "runlist.execute"] == [24, 18]
    assert dev.stats.chains == {24: 1, 18: 1}
    host = run_graph([host_arm_device(0, cache_root=tmp_path / "cache")], graph, xl, x, raws)[1]
    for a, b in zip(outs, host):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="max_chain 42 must be between 1 and profile xdna2's 24"):
        host_arm_device(0, max_chain=42)


# -- the thin pyxrt layer, against the double ----------------------------------------------------------------
def test_npu_arm_call_order_buffer_flags_and_results(tmp_path):
    w, raw = q_weight("blk.0.ffn_up.weight", (64, 256))
    w2, raw2 = q_weight("blk.0.ffn_gate.weight", (64, 256), seed=5)
    graph, xl = matmul_graph([w, w2], 3, 256)
    x = np.random.default_rng(4).standard_normal((3, 256)).astype(np.float32)
    ks = make_kernel_set(tmp_path / "ks", [(1, 256, 64), (2, 256, 64)])
    dev = npu_device(ks, tmp_path / "cache")
    _, outs = run_graph([dev], graph, xl, x, {w.name: raw, w2.name: raw2})
    grid = tile_grid((64, 256))
    words = 8
    subsequence(fx.CALLS, [
        ("device", 0), ("xclbin", "gemm0.xclbin"), ("register_xclbin", "gemm0.xclbin"), ("hw_context", "uuid-0"),
        ("kernel", "MLIR_AIE"),
        ("bo", words * 4, "cacheable", 1), ("bo.write", words * 4, 0, 1), ("bo.sync", "XCL_BO_SYNC_BO_TO_DEVICE", 1),
        ("bo", grid.nbytes, "host_only", 4), ("bo.write", grid.nbytes, 0, 4),
        ("bo.sync", "XCL_BO_SYNC_BO_TO_DEVICE", 4),
        ("bo", grid.nbytes, "host_only", 4),                                    # the second weight
        ("bo", 2 * 256 * 2, "host_only", 3), ("bo", 2 * 64 * 4, "host_only", 5),  # A and C of the m=2 kernel
        ("bo.write", 2 * 256 * 2, 0, 3), ("bo.sync", "XCL_BO_SYNC_BO_TO_DEVICE", 3),
        ("run", "MLIR_AIE"), ("run.set_arg", 0, 3), ("run.set_arg", 1, "bo"), ("run.set_arg", 2, words),
        ("run.set_arg", 3, "bo"), ("run.set_arg", 4, "bo"), ("run.set_arg", 5, "bo"),
        ("runlist",), ("runlist.add",), ("runlist.add",), ("runlist.add",), ("runlist.add",),
        ("runlist.execute", 4), ("runlist.wait",),
        ("bo.sync", "XCL_BO_SYNC_BO_FROM_DEVICE", 5), ("bo.read", 2 * 64 * 4, 0, 5)])
    assert not any(c[0] == "run.start" for c in fx.CALLS)          # runs of a runlist are never started alone
    # 3 rows: one run of m=2 and one of m=1 per product, all four chained
    assert dev.stats.chains == {4: 1}
    host = run_graph([host_arm_device(0, cache_root=tmp_path / "cache")], graph, xl, x, {w.name: raw, w2.name: raw2})[1]
    for a, b in zip(outs, host):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def spoil_padding(buf: np.ndarray, wide, shape) -> np.ndarray:
    """A wider container as a careless packer might leave it: 0xFF (bf16 NaN scales, q = 15) in every
    byte that lies outside the shape: the extra tiles, the rows past N and the groups past K."""
    own = tile_grid(shape)
    t = buf.copy().reshape(wide.row_tiles, wide.col_tiles, CHUNK_BYTES)
    t[own.row_tiles:], t[:, own.col_tiles:] = 0xFF, 0xFF
    rows_last = shape[0] - (own.row_tiles - 1) * 32
    cols_last = shape[1] - (own.col_tiles - 1) * 256
    t[own.row_tiles - 1, :, rows_last * 16:512] = 0xFF
    t[own.row_tiles - 1, :, 512 + rows_last * 16:1024] = 0xFF
    t[own.row_tiles - 1, :, 1024 + rows_last * 128:] = 0xFF
    for r in range(32):
        t[:, own.col_tiles - 1, r * 16 + cols_last // 16:(r + 1) * 16] = 0xFF
        t[:, own.col_tiles - 1, 512 + r * 16 + cols_last // 16:512 + (r + 1) * 16] = 0xFF
        t[:, own.col_tiles - 1, 1024 + r * 128 + cols_last // 2:1024 + (r + 1) * 128] = 0xFF
    return t.reshape(-1)


def test_npu_arm_takes_a_wider_container_on_the_shape_s_own_grid(tmp_path):
    """The NPU's GEMMs are per grid: a container padded wider is re-tiled exactly onto the shape's own
    grid (tiles are independent chunks) and whatever the other packer left outside the shape is
    cleared, so no NaN of its padding reaches the products."""
    shape, padded = (40, 320), (96, 768)
    w, raw = q_weight("blk.0.ffn_up.weight", shape)
    graph, xl = matmul_graph([w], 2, shape[1])
    x = np.random.default_rng(7).standard_normal((2, shape[1])).astype(np.float32)
    wide = tile_grid(shape, padded)
    spoiled = spoil_padding(tiles.pack(raw, Q4_1, wide), wide, shape)
    assert np.isnan(tiles.decode(spoiled, wide, crop=False)).any()
    clean = run_graph([host_arm_device(0, cache_root=tmp_path / "clean")], graph, xl, x, {w.name: raw})[1][0]
    store_container(tmp_path / "wide" / model_key(raw), w.name, spoiled, shape=shape, padded_shape=padded,
                    source_dtype="Q4_1", source_digest_=source_digest(raw))
    host = run_graph([host_arm_device(0, cache_root=tmp_path / "wide")], graph, xl, x, {w.name: raw})[1][0]
    np.testing.assert_array_equal(host, clean)
    ks = make_kernel_set(tmp_path / "ks", [(2, 512, 64)])
    npu = run_graph([npu_device(ks, tmp_path / "wide")], graph, xl, x, {w.name: raw})[1][0]
    assert np.isfinite(npu).all()
    np.testing.assert_allclose(npu, host, rtol=1e-5, atol=1e-5)
    assert ("bo", tile_grid(shape).nbytes, "host_only", 4) in fx.CALLS      # the shape's own grid, not 96 x 768
    assert np.array_equal(tiles.regrid(tiles.pack(raw, Q4_1, wide), wide, tile_grid(shape)),
                          tiles.pack(raw, Q4_1, tile_grid(shape)))


def test_npu_arm_runs_a_model_like_the_host_arm(tmp_path, cpu):
    """SmolLM2 (3 layers), prefill and decode, through the double: every GEMM of the plan is a run of the
    kernel set (m = 1 or 4; a 5-token prefill is 4 + 1 rows), and the logits are the host arm's."""
    model = load_model("smollm2")
    p = reference("smollm2")[0]["prompts"][0]
    shapes = [(m, k, n) for m in (1, 4) for k, n in SMOL_GRIDS]
    ks = make_kernel_set(tmp_path / "ks", shapes)
    results = []
    for dev in (npu_device(ks, tmp_path / "cache", max_chain=2), host_arm_device(0, cache_root=tmp_path / "cache")):
        s = Session(model, [dev, cpu], n_ctx=64, n_layers=3)
        results.append((s.eval(p["ids"]), s.eval(p["greedy_ids"][:1]), dev))
    (npu_pre, npu_dec, npu), (host_pre, host_dec, _) = results
    # the same arithmetic summed in another order (padded, per run): float32 noise, which rounding the
    # activations to bf16 at every product can turn into one bf16 step here and there
    for got, want in ((npu_pre, host_pre), (npu_dec, host_dec)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=3e-2)
        assert int(got.argmax()) == int(want.argmax()) and np.corrcoef(got, want)[0, 1] > 0.99999
    assert max(npu.stats.chains) == 2
    assert all(c[1] <= 2 for c in fx.CALLS if c[0] == "runlist.execute")


def test_timeouts_become_errors_that_name_the_chain_the_limit_and_the_option(tmp_path):
    weights, raws = q_weights([f"blk.0.w{i}.weight" for i in range(3)], (32, 256))
    graph, xl = matmul_graph(weights, 1, 256)
    x = np.ones((1, 256), dtype=np.float32)
    ks = make_kernel_set(tmp_path / "ks", [(1, 256, 32)])
    fx.behaviour.timeout_chains_over = 2           # this "driver" times out chains of more than 2
    with pytest.raises(DeviceRunError) as e:
        run_graph([npu_device(ks, tmp_path / "c", max_chain=3)], graph, xl, x, raws)
    assert isinstance(e.value.__cause__, XdnaRunError)
    msg = str(e.value)
    for part in ("a chain of 3 runs", "ERT_CMD_STATE_TIMEOUT", "run 3 of the chain", "the limit is 3 runs",
                 "FRAMEWORK_XDNA_MAX_CHAIN=1", "runlist failed execution", "GEMMs y0, y1, y2"):
        assert part in msg, (part, msg)
    fx.CALLS.clear()
    run_graph([npu_device(ks, tmp_path / "c", max_chain=2)], graph, xl, x, raws)        # lowered: it runs
    assert [c[1] for c in fx.CALLS if c[0] == "runlist.execute"] == [2]
    assert ("run.start",) in fx.CALLS                               # the third run alone: started and waited

    fx.behaviour.single_run_state = "ERT_CMD_STATE_TIMEOUT"
    with pytest.raises(DeviceRunError, match=r"a chain of 1 runs .*ERT_CMD_STATE_TIMEOUT.*run.wait\(10000 ms\)"):
        run_graph([npu_device(ks, tmp_path / "c", max_chain=1)], graph, xl, x, raws)


def test_without_runlist_every_run_is_waited_alone(tmp_path, monkeypatch):
    """An XRT older than 2.17 has no runlist: runs are started and waited one by one."""
    monkeypatch.delattr(fx, "runlist")
    w, raw = q_weight("blk.0.w.weight", (32, 256))
    w2, raw2 = q_weight("blk.0.v.weight", (32, 256), seed=3)
    graph, xl = matmul_graph([w, w2], 1, 256)
    ks = make_kernel_set(tmp_path / "ks", [(1, 256, 32)])
    dev = npu_device(ks, tmp_path / "c")
    run_graph([dev], graph, xl, np.ones((1, 256), np.float32), {w.name: raw, w2.name: raw2})
    assert [c for c in fx.CALLS if c[0] in ("run.start", "run.wait")] == [("run.start",), ("run.wait", 10000)] * 2


def test_elf_flow_and_byte_counted_instruction_streams(tmp_path):
    w, raw = q_weight("blk.0.w.weight", (32, 256))
    graph, xl = matmul_graph([w], 1, 256)
    x = np.random.default_rng(6).standard_normal((1, 256)).astype(np.float32)
    want = run_graph([host_arm_device(0, cache_root=tmp_path / "c")], graph, xl, x, {w.name: raw})[1][0]
    ks = make_kernel_set(tmp_path / "elf", [(1, 256, 32)], flow="elf")
    got = run_graph([npu_device(ks, tmp_path / "c")], graph, xl, x, {w.name: raw})[1][0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    subsequence(fx.CALLS, [("elf", "gemm_1x256x32.elf"), ("module", "gemm_1x256x32.elf"), ("ext.kernel", "MLIR_AIE"),
                           ("ext.bo", tile_grid((32, 256)).nbytes), ("run.set_arg", 0, 3), ("run.set_arg", 1, 0),
                           ("run.set_arg", 2, 0)])
    fx.reset()
    fx.KERNELS["MLIR_AIE"] = fake_gemm
    ks = make_kernel_set(tmp_path / "bytes", [(1, 256, 32)], insts_count="bytes")
    run_graph([npu_device(ks, tmp_path / "c")], graph, xl, x, {w.name: raw})
    assert ("run.set_arg", 2, 32) in fx.CALLS                         # 8 words = 32 bytes


def test_kernel_sets_are_checked(tmp_path):
    ks = make_kernel_set(tmp_path / "ks", [(1, 256, 32)])
    spec = json.loads((ks / "kernels.json").read_text())
    with pytest.raises(KernelSetError, match="no kernels.json"):
        load_kernel_set(tmp_path)
    (ks / "kernels.json").write_text(json.dumps({**spec, "abi": "bf16-gemm"}))
    with pytest.raises(KernelSetError, match="kernel ABI 'bf16-gemm'.*refusing"):
        load_kernel_set(ks)
    (ks / "kernels.json").write_text(json.dumps({**spec, "gemm": [{"m": 1, "k": 250, "n": 32, "insts": "x"}]}))
    with pytest.raises(KernelSetError, match="multiple of 256"):
        load_kernel_set(ks)
    # a device with a kernel set refuses products the set has no GEMM for
    ks = make_kernel_set(tmp_path / "ks2", [(1, 256, 32)])
    dev = npu_device(ks, tmp_path / "c")
    w, _ = q_weight("blk.0.w.weight", (64, 256))
    graph, _ = matmul_graph([w], 1, 256)
    v = dev.supports_op(graph.nodes[0])
    assert not v.ok and v.code == "unsupported_shape" and "no GEMM for k=256 n=64" in v.reason
    # one hardware context per xclbin, within the profile's budget
    ks = make_kernel_set(tmp_path / "ks3", [(1, 256, 32 * (i + 1)) for i in range(7)], xclbins=7)
    with pytest.raises(RuntimeError, match="needs 7 hardware contexts .* profile xdna supports 6"):
        npu_device(ks, tmp_path / "c", profile="xdna").session.open()


# -- discovery ---------------------------------------------------------------------------------------------
def fake_sysfs(root: Path, accels: list[tuple[str, str, str, str]]) -> tuple[Path, Path]:
    """accels: (name, driver, device id, revision) -> /sys/class/accel and /dev/accel under root."""
    sysfs, devroot = root / "sys/class/accel", root / "dev/accel"
    sysfs.mkdir(parents=True)
    devroot.mkdir(parents=True)
    for i, (name, driver, dev_id, rev) in enumerate(accels):
        pci = root / f"sys/devices/pci0000:00/0000:c{5 + i}:00.1"
        pci.mkdir(parents=True)
        (pci / "device").write_text(dev_id + "\n")
        (pci / "revision").write_text(rev + "\n")
        drv = root / f"sys/bus/pci/drivers/{driver}"
        drv.mkdir(parents=True, exist_ok=True)
        (pci / "driver").symlink_to(drv)
        (sysfs / name).mkdir()
        (sysfs / name / "device").symlink_to(pci)
        (devroot / name).touch()
    return sysfs, devroot


def no_pyxrt():
    return None, "pyxrt not importable: XRT not installed (ModuleNotFoundError: No module named 'pyxrt')"


def test_no_npu_here_is_listed_unavailable_with_the_reasons(tmp_path):
    (dev,) = discover({}, sysfs=tmp_path / "none", pyxrt_loader=no_pyxrt)
    assert dev.name == "xdna:0" and not dev.available
    assert "pyxrt not importable: XRT not installed" in dev.unavailable_reason
    assert "no /dev/accel device bound to amdxdna" in dev.unavailable_reason
    sysfs, devroot = fake_sysfs(tmp_path / "vpu", [("accel0", "intel_vpu", "0x7d1d", "0x04")])
    (dev,) = discover({}, sysfs=sysfs, devroot=devroot, pyxrt_loader=no_pyxrt)
    assert "found accel0 bound to intel_vpu" in dev.unavailable_reason
    # this machine, through the registry and the entry point
    reg = default_registry()
    assert reg.plugins["xdna"].error is None
    (real,) = reg.plugins["xdna"].devices
    assert real.name == "xdna:0" and not real.available and "amdxdna" in real.unavailable_reason


def test_host_arm_is_asked_for_and_says_it_is_an_emulation(tmp_path):
    (dev,) = discover({"FRAMEWORK_XDNA_HOST_ARM": "1"}, sysfs=tmp_path / "none", pyxrt_loader=no_pyxrt)
    assert dev.available and dev.arm == "host" and dev.emulation == "xdna2 on the xdna host arm (numpy)"
    assert "no NPU: pyxrt not importable" in dev.description and dev.physical_id == "host-cpu"
    (dev,) = discover({"FRAMEWORK_XDNA_HOST_ARM": "xdna", "FRAMEWORK_XDNA_MAX_CHAIN": "4"},
                      sysfs=tmp_path / "none", pyxrt_loader=no_pyxrt)
    assert dev.profile.name == "xdna" and dev.limits.max_chain == 4
    for bad, why in (("0", "not a positive whole number"), ("99", "exceeds the profile's limit of 24")):
        (dev,) = discover({"FRAMEWORK_XDNA_MAX_CHAIN": bad}, sysfs=tmp_path / "none", pyxrt_loader=no_pyxrt)
        assert not dev.available and why in dev.unavailable_reason
    assert read_config({"FRAMEWORK_XDNA_REQUANTIZE": "maybe"}).problems


def test_device_profile_brings_up_the_host_arm_in_place_of_an_absent_npu(tmp_path):
    """--device-profile xdna2 (Device.with_options) is the way to ask for the emulation, as for OpenVINO's
    npu37xx; bad settings stay an unavailable device with their reason, never a silent host arm."""
    (absent,) = discover({}, sysfs=tmp_path / "none", pyxrt_loader=no_pyxrt)
    assert set(absent.profiles) == {"xdna", "xdna2"}
    dev = absent.with_options(profile="xdna2")
    assert dev.available and dev.arm == "host" and dev.emulation == "xdna2 on the xdna host arm (numpy)"
    assert "NPU arm unavailable: pyxrt not importable" in dev.description
    assert absent.with_options(profile="xdna").limits.max_chain == get_profile("xdna").max_chain
    (bad,) = discover({"FRAMEWORK_XDNA_MAX_CHAIN": "0"}, sysfs=tmp_path / "none", pyxrt_loader=no_pyxrt)
    assert bad.bad_settings and not absent.bad_settings          # a field, not a prefix of the reason
    assert not bad.with_options(profile="xdna2").available


@pytest.mark.parametrize("profile", ["xdna", "xdna2"])
def test_the_chain_setting_holds_under_every_profile(tmp_path, profile):
    """FRAMEWORK_XDNA_MAX_CHAIN=2 travels with the absent NPU into the host arm --device-profile brings up (it
    was validated, then dropped: chains of the profile's 24); a limit above the profile's is refused by name."""
    (absent,) = discover({"FRAMEWORK_XDNA_MAX_CHAIN": "2", "FRAMEWORK_XDNA_REQUANTIZE": "allow"},
                         sysfs=tmp_path / "none", pyxrt_loader=no_pyxrt)
    dev = absent.with_options(profile=profile)
    assert dev.arm == "host" and dev.max_chain == 2 and dev.limits.max_chain == 2 and dev.requantize
    assert "chains of at most 2 runs" in dev.description
    assert dev.with_options(max_chain=1).max_chain == 1           # an explicit option still wins
    with pytest.raises(ValueError, match=f"exceeds profile {profile}'s limit of {get_profile(profile).max_chain}"):
        absent.with_options(profile=profile, max_chain=get_profile(profile).max_chain + 1)


def test_the_chain_setting_shows_in_the_plan_under_a_profile(capsys, monkeypatch, tmp_path):
    """The plan's report says what runs: chains of at most 2 commands, not the profile's 24."""
    from framework.cli import main
    monkeypatch.setenv("FRAMEWORK_XDNA_MAX_CHAIN", "2")
    out = tmp_path / "split.txt"
    assert main(["split", "-m", "smollm2", "--backends", "npu,cpu", "--device-profile", "xdna2", "--phase", "decode",
                 "--ctx", "64", "-n", "2", "-o", str(out)]) == 0
    xdna_line = next(line for line in out.read_text().splitlines() if line.strip().startswith("xdna:0"))
    assert "longest chain 2 of 2 commands" in xdna_line, xdna_line


def test_npu_discovery_steps(tmp_path):
    sysfs, devroot = fake_sysfs(tmp_path, [("accel0", "amdxdna", "0x17f0", "0x10"),
                                           ("accel1", "amdxdna", "0x1502", "0x00")])
    fx.behaviour.n_devices = 2

    def loader():
        return fx, ""
    # opened, but no kernel set
    devs = discover({}, sysfs=sysfs, devroot=devroot, pyxrt_loader=loader)
    assert [d.name for d in devs] == ["xdna:0", "xdna:1"]
    assert [d.profile.name for d in devs] == ["xdna2", "xdna"]
    assert [d.physical_id for d in devs] == ["0000:c5:00.1", "0000:c6:00.1"]
    assert all(not d.available and d.unavailable_reason.startswith("no kernel set: set FRAMEWORK_XDNA_KERNELS")
               for d in devs)
    # a kernel set: both available, NPU arm, not an emulation
    ks = make_kernel_set(tmp_path / "ks", [(1, 256, 32)])
    devs = discover({"FRAMEWORK_XDNA_KERNELS": str(ks)}, sysfs=sysfs, devroot=devroot, pyxrt_loader=loader)
    assert all(d.available and d.arm == "npu" and d.emulation is None for d in devs)
    assert "kernel set" in devs[0].description and devs[0].limits.max_chain == 24
    # XRT refuses to open the device: its own words
    fx.behaviour.device_error = "open: /dev/accel/accel0: Permission denied"
    devs = discover({"FRAMEWORK_XDNA_KERNELS": str(ks)}, sysfs=sysfs, devroot=devroot, pyxrt_loader=loader)
    assert devs[0].unavailable_reason == "pyxrt.device(0) failed: open: /dev/accel/accel0: Permission denied"
    # a broken kernel set
    fx.behaviour.device_error = None
    devs = discover({"FRAMEWORK_XDNA_KERNELS": str(tmp_path)}, sysfs=sysfs, devroot=devroot, pyxrt_loader=loader)
    assert "FRAMEWORK_XDNA_KERNELS: kernel set" in devs[0].unavailable_reason and "kernels.json" in \
        devs[0].unavailable_reason
    # the accel node is missing
    (devroot / "accel0").unlink()
    devs = discover({}, sysfs=sysfs, devroot=devroot, pyxrt_loader=loader)
    assert "accel0 is bound to amdxdna but" in devs[0].unavailable_reason


def test_profiles_are_data():
    assert PROFILES["xdna"].hw_contexts == 6 and PROFILES["xdna2"].hw_contexts == 16
    assert all(p.ops == {"MUL_MAT"} and p.max_chain == 24 for p in PROFILES.values())
    assert profile_for_pci(0x17F0, 0x20)[0].name == "xdna2"           # Krackan
    assert profile_for_pci(0x1502, 0x00)[0].name == "xdna"            # Phoenix / Hawk Point
    prof, note = profile_for_pci(0x17F2, 0x10)
    assert prof.name == "xdna" and "not in the profile table" in note


def test_pyxrt_import_says_what_is_missing(monkeypatch, tmp_path):
    from framework.plugins.xdna import xrt
    monkeypatch.setattr(xrt, "XRT_PYTHON_DIRS", (str(tmp_path / "opt/xilinx/xrt/python"),))
    monkeypatch.delenv("XILINX_XRT", raising=False)
    mod, why = xrt.import_pyxrt("pyxrt_not_here")
    assert mod is None and why.startswith("pyxrt not importable: XRT not installed")
    (tmp_path / "opt/xilinx/xrt/python").mkdir(parents=True)
    (tmp_path / "opt/xilinx/xrt/python" / "pyxrt_not_here.py").write_text("raise ImportError('libxrt_coreutil.so.2')\n")
    mod, why = xrt.import_pyxrt("pyxrt_not_here")
    assert mod is None and "libxrt_coreutil.so.2" in why and "opt/xilinx/xrt/python" in why


# -- both models on the host arm against llama.cpp -------------------------------------------------------------
@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def host_arm_case(request, tmp_path_factory, cpu):
    model = load_model(request.param)
    dev = host_arm_device(0, cache_root=tmp_path_factory.mktemp("xdna-cache"))
    return request.param, model, Session(model, [dev, cpu], n_ctx=1024), dev


def test_both_models_on_xdna_and_cpu_meet_the_reference_bounds(host_arm_case):
    """--backends xdna:0,cpu with the host arm: the matrix products with exact tile forms run as packed
    tiles (bf16 scales, bf16 activations), the rest on the CPU; llama.cpp's bounds still hold."""
    name, model, session, dev = host_arm_case
    ref, arrays = reference(name)
    assert_teacher_forced(session, ref)
    assert_text_metrics(session, ref, arrays, model.tokenizer, reference_text(ref))
    expected = {"smollm2": 7 * 30, "gemma3": 27}[name]     # SmolLM2: every Q4_1 matrix; Gemma: its Q4_K ones
    assert len(dev.stats.weights) == expected and dev.stats.runs > 0
    assert all("repacked" in how for how in dev.stats.weights.values())


@pytest.mark.parametrize("profile", ["xdna", "xdna2"])
def test_linear_attention_is_refused_with_the_npus_own_reason(profile):
    """GatedDeltaNet is refused as on every NPU profile, but the reason speaks of this device, not of what
    Intel's NPU 37xx did with it."""
    from framework.contract import NPU_REFUSED_OPS
    dev = host_arm_device(0, profile)
    assert set(dev.refused_ops) == set(NPU_REFUSED_OPS)
    reason = dev.refused_ops["GATED_DELTA_NET"].reason
    assert f"profile {profile} refuses GATED_DELTA_NET" in reason and "AIE array" in reason
    assert "37xx" not in reason and "Intel" not in reason
