"""The CPU plugin's fast path (framework/plugins/cpu/quantized.py) against the reference kernel, per weight
type: the GGUF blocks times 8-bit activations must give what the float32 weights (gguf's decoder) give,
within the activations' rounding, on every instruction set the kernels use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache

import gguf
import numpy as np
import pytest
from conftest import mapping_rss_kb, model_path

from framework.core.graph.dtypes import DType
from framework.core.graph.quants import dequantize
from framework.plugins.cpu import quantized
from framework.plugins.cpu.device import MATMUL_ENV, CpuDevice

# A weight of each type the kernels read: the models' own tensors where a model has that type (rows
# 0..63), else gguf's quantizer on random values (Q4_0, Q5_1: neither model holds them), else random
# bytes with their float16 scales set to small values (Q5_K, Q3_K, IQ4_NL, IQ4_XS: gguf cannot quantize them).
FROM_MODEL = {"Q4_1": ("smollm2", "blk.0.ffn_down.weight"), "Q8_0": ("smollm2", "token_embd.weight"),
              "Q5_0": ("gemma3", "blk.0.attn_k.weight"), "Q4_K": ("gemma3", "blk.0.attn_output.weight"),
              "Q6_K": ("gemma3", "blk.0.ffn_down.weight")}
ROWS = 64
# byte offsets of a block's float16 scales
SCALES_AT = {"Q5_K": (0, 2), "Q3_K": (108,), "IQ4_NL": (0,), "IQ4_XS": (0,)}


@cache
def weight(fmt: str) -> tuple[np.ndarray, tuple[int, int]]:
    """(raw bytes uint8 (rows, bytes per row), (rows, K)) of a weight of type fmt."""
    if fmt in FROM_MODEL:
        name, tensor = FROM_MODEL[fmt]
        t = next(t for t in gguf.GGUFReader(model_path(name)).tensors if t.name == tensor)
        assert t.tensor_type.name == fmt, f"{name}'s {tensor} is {t.tensor_type.name}, not {fmt}"
        raw = np.array(t.data[:ROWS])
        return raw, (ROWS, int(t.shape[0]))
    rng = np.random.default_rng(1)
    if fmt not in SCALES_AT:
        values = rng.standard_normal((ROWS, 512)).astype(np.float32)
        return gguf.quants.quantize(values, gguf.GGMLQuantizationType[fmt]), (ROWS, 512)
    per_block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt]]
    blocks = rng.integers(0, 256, (ROWS, 512 // per_block, block_bytes), dtype=np.uint8)
    for at in SCALES_AT[fmt]:
        scales = rng.uniform(0.002, 0.02, blocks.shape[:2]).astype(np.float16)
        blocks[:, :, at:at + 2] = scales.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(ROWS, -1), (ROWS, 512)


def activations(m: int, k: int) -> np.ndarray:
    x = np.random.default_rng(m).standard_normal((m, k)).astype(np.float32)
    x[:, ::7] *= 8.0                       # groups with a large value, as a model's outliers
    return x


def f16(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).astype(np.float32)


def q8_groups(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(int values, float16 scales, unrounded scales) of x in ggml's q8_0 / q8_1 groups of 32 (AVX2):
    q = round(x * 127 / max|x|), the block's scale fp16(max|x| / 127)."""
    g = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(g).max(axis=2, keepdims=True)
    q = np.rint(g * (np.float32(127.0) / np.where(amax > 0, amax, np.float32(1.0))))
    d = amax / np.float32(127.0)
    return q, f16(d), d


def q8_reference(x: np.ndarray, fmt: str) -> np.ndarray:
    """x after the fast path's activation rounding, in numpy (float32, as the kernel rounds), then in
    float64: llama.cpp's q8_0 (see q8_groups) or, for the K-quants, q8_K (per 256 values, v the value of
    largest magnitude: s = -127 / v, q = min(127, round(s * x)), d = 1 / s)."""
    if DType[fmt] in quantized.K_QUANTS:
        g = x.reshape(x.shape[0], -1, 256)
        top = np.take_along_axis(g, np.abs(g).argmax(axis=2)[..., None], axis=2)
        iscale = np.float32(-127.0) / np.where(top != 0, top, np.float32(1.0))
        q = np.minimum(127, np.rint(iscale * g))
        return (q.astype(np.float64) * (np.float32(1.0) / iscale)).reshape(x.shape)
    q, d, _ = q8_groups(x)
    return (q.astype(np.float64) * d).reshape(x.shape)


def q8_1_sums(x: np.ndarray, raw: np.ndarray, fmt: str) -> np.ndarray:
    """What q8_1's float16 sums add to a Q4_1 or Q5_1 product beyond q8_reference's values: each weight
    block's minimum times (fp16(d * sum of q) - fp16(d) * sum of q), (M, N)."""
    if fmt not in ("Q4_1", "Q5_1"):
        return np.zeros((x.shape[0], raw.shape[0]))
    q, d16, d = q8_groups(x)
    s = q.sum(axis=2)
    delta = f16(d[..., 0] * s) - d16[..., 0] * s                      # (M, groups)
    block = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[fmt]][1]
    mins = raw.reshape(raw.shape[0], -1, block)[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float64)
    return delta.astype(np.float64) @ mins.T


@pytest.mark.parametrize("fmt", quantized.FORMATS)
@pytest.mark.parametrize("m", [1, 7, quantized.TILED_FROM + 3])
def test_fast_product_equals_reference(fmt, m):
    """Against the reference (the weight decoded by gguf, times the activations as rounded to 8 bits, in
    float64) the fast path may differ only by float32 sums; against the unrounded activations, by what
    8-bit activations cost (llama.cpp's CPU products round the same way). m = 7 runs the few-row kernel's
    4-, 2- and 1-row passes, TILED_FROM + 3 the tiled kernel's tiles and its one-row tail."""
    raw, shape = weight(fmt)
    w = dequantize(raw.reshape(-1), DType[fmt], shape).astype(np.float64)
    x = activations(m, shape[1])
    got = quantized.QuantizedWeight(raw, DType[fmt], shape).matmul(x)
    assert got.shape == (m, shape[0]) and got.dtype == np.float32
    scale = np.abs(w).max() * np.abs(x).max() * np.sqrt(shape[1])
    exact = q8_reference(x, fmt) @ w.T + q8_1_sums(x, raw, fmt)
    err = np.abs(got - exact).max() / scale
    assert err < 2e-6, f"{fmt}: fast path off the reference of the same rounding by {err:.2e} (scaled)"
    rel = np.linalg.norm(got - x.astype(np.float64) @ w.T) / np.linalg.norm(x.astype(np.float64) @ w.T)
    # rounding to steps of max|x| / 127 costs about (max / 127 / sqrt(12)) / rms of x: 1.4% for these values
    # in groups of 32, more in the K-quants' blocks of 256 (a larger maximum per block)
    bound = 4e-2 if DType[fmt] in quantized.K_QUANTS else 2.5e-2
    assert rel < bound, f"{fmt}: 8-bit activations cost {rel:.2%} of the product, over {bound:.1%}"


def test_every_type_without_a_kernel_rounds_its_activations():
    """On the q8 path no weight type is multiplied with unrounded activations unless llama.cpp does so (F32)."""
    from framework.model.gguf_file import SUPPORTED_TYPES
    assert {t for t in SUPPORTED_TYPES if t.name != "F32"} - quantized.FAST_TYPES == set(quantized.ACTIVATION_ROUNDING)


@pytest.mark.parametrize("dtype", sorted(t.name for t in quantized.ACTIVATION_ROUNDING))
def test_types_without_a_kernel_round_as_llama_cpp(dtype):
    """Their products: the float32 weight times the activations rounded as llama.cpp's vec_dot_type for the
    type rounds them (q8_0, q8_K, float16, bfloat16)."""
    x = activations(5, 512)
    w = np.random.default_rng(2).standard_normal((16, 512)).astype(np.float32)
    kind = quantized.ACTIVATION_ROUNDING[DType[dtype]]
    if kind == "f16":
        rounded = x.astype(np.float16).astype(np.float64)
    elif kind == "bf16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)
    else:
        rounded = q8_reference(x, "Q4_K" if kind == "q8_K" else "Q8_0")
    got = quantized.rounded_mul_mat(kind)(w, x)
    want = np.asarray(rounded, np.float64) @ w.T.astype(np.float64)
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
    assert np.abs(got - x.astype(np.float64) @ w.T).max() > 1e-5 * np.abs(want).max()     # it did round


@pytest.mark.parametrize("fmt", ["Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"])
@pytest.mark.parametrize("m", [7, 8, quantized.TILED_FROM + 5])
def test_rows_of_a_batch_equal_rows_alone(fmt, m):
    """Row i of an m-row product is bit for bit the 1-row product of row i (a decode step), as in chunked
    prefill, speculative verification and several sequences' decode: 7 and 8 rows take the few-row kernel
    (4, then 2, then 1 activation rows a pass over eight weight rows; 8 in one pass; from 2 rows the weight
    rows a row a lane, except 2 rows of the types whose rows go in pairs), TILED_FROM + 5 the tiled
    one (4-row tiles, then single rows); 63 weight rows, so the last rows take the one-row tails too."""
    raw, shape = weight(fmt)
    w = quantized.QuantizedWeight(raw[:63], DType[fmt], (63, shape[1]))
    x = activations(m, shape[1])
    whole = w.matmul(x)
    for i in range(m):
        np.testing.assert_array_equal(w.matmul(x[i:i + 1])[0], whole[i], err_msg=f"row {i} of {m}")


@pytest.mark.parametrize("fmt", quantized.INTERLEAVED)
def test_interleaved_weights_give_the_file_s_bits(fmt, tmp_path):
    """A weight held interleaved (64 rows: eight eights) multiplies bit for bit as the file's bytes do, on every
    path (one row, the few-row passes, the tiles), and gives back the file's rows (embedding lookup, float32);
    made from a file mapping, as a model's weights are, whose pages it then gives back."""
    raw, shape = weight(fmt)
    path = tmp_path / "w.bin"
    raw.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    assert np.array_equal(mapped.reshape(raw.shape), raw) and mapping_rss_kb(path) >= raw.nbytes // 1024
    held = quantized.QuantizedWeight(mapped, DType[fmt], shape)
    assert mapping_rss_kb(path) <= 4                    # its pages dropped, but a part page at the end
    plain = quantized.QuantizedWeight(raw, DType[fmt], shape, interleaved=False)
    assert held.fmt != plain.fmt and not np.array_equal(held.raw, plain.raw)
    for m in (1, 2, 7, 8, quantized.TILED_FROM + 5):
        x = activations(m, shape[1])
        np.testing.assert_array_equal(held.matmul(x), plain.matmul(x), err_msg=f"{fmt}, {m} rows")
    ids = np.array([63, 0, 9, 9, 40])
    np.testing.assert_array_equal(held.rows(ids), plain.rows(ids))
    np.testing.assert_array_equal(held.float32(), plain.float32())


_PRODUCTS = """
import json, sys, numpy as np
from framework.core.graph.dtypes import DType
from framework.plugins.cpu import quantized
spec = json.loads(sys.argv[1])
print(json.dumps({"target": quantized.target()}))
out = {}
for fmt, path in spec["weights"].items():
    raw = np.load(path)
    x = np.load(spec["x"][str(raw.shape[1])])
    w = quantized.QuantizedWeight(raw, DType[fmt], tuple(spec["shapes"][fmt]))
    out[fmt] = w.matmul(x)                      # the tiled kernel
    out[fmt + " few"] = w.matmul(x[:7])         # the few-row kernel (4, 2 and 1 rows a pass)
    out[fmt + " eight"] = w.matmul(x[:8])       # its 8-row pass (sixteen vector registers on AVX2, 32 on AVX-512)
from framework.plugins.cpu.attention import flash_attn_ext
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((33, 4, 256), (96, 1, 256), (96, 1, 256)))
mask = np.where(np.arange(96)[None, :] <= 5 + np.arange(33)[:, None], 0.0, -np.inf).astype(np.float32)
out["attention"] = flash_attn_ext(q, k, v, mask, scale=0.0625)
from framework.plugins.cpu.norm import rms_norm
out["rms_norm"] = rms_norm(rng.standard_normal((300, 576)).astype(np.float32), eps=1e-6)
np.savez(spec["out"], **out)
"""


def _avx2_only_features() -> str:
    """The host's features as numba reads them, with AVX-512 and the VNNI extensions switched off."""
    from llvmlite import binding
    feats = binding.get_host_cpu_features()
    return ",".join(("-" if k.startswith(("avx512", "amx", "avxvnni")) or not v else "+") + k for k, v in feats.items())


def _run_products(tmp_path, env_extra: dict, tag: str) -> tuple[list, dict]:
    spec = {"weights": {}, "shapes": {}, "x": {}, "out": str(tmp_path / f"{tag}.npz")}
    for fmt in quantized.FORMATS:
        raw, shape = weight(fmt)
        np.save(tmp_path / f"{fmt}.npy", raw)
        spec["weights"][fmt], spec["shapes"][fmt] = str(tmp_path / f"{fmt}.npy"), shape
        np.save(tmp_path / f"x{shape[1]}.npy", activations(quantized.TILED_FROM + 1, shape[1]))
        spec["x"][str(raw.shape[1])] = str(tmp_path / f"x{shape[1]}.npy")
    env = {**os.environ, **env_extra}
    done = subprocess.run([sys.executable, "-c", _PRODUCTS, json.dumps(spec)], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    target = json.loads(done.stdout.strip().splitlines()[-1])["target"]
    return target, dict(np.load(spec["out"]))


def test_results_do_not_depend_on_the_instruction_set(tmp_path):
    """The kernels (each weight type's product, attention, RMS norm) compiled for a Haswell-class CPU (AVX2, one
    thread) and for this CPU (AVX-512 VNNI where it has it, all threads) give the same bits: CI's AVX2-only
    and AVX-512 machines compute the same logits (VNNI's few-row products take the signed types biased to
    unsigned, AVX2's their signs apart). On a CPU without VNNI both runs take the AVX2 path, for
    two CPU models."""
    if quantized.target()[1] == "":
        pytest.skip("this CPU has no AVX2: the fast path is off (test_no_avx2_means_float32_products checks it)")
    generic, a = _run_products(tmp_path, {"NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": _avx2_only_features(),
                                          "NUMBA_NUM_THREADS": "1"}, "avx2")
    assert generic == ["haswell", "avx2"]
    host, b = _run_products(tmp_path, {}, "host")
    assert host == list(quantized.target())
    for what in (*quantized.FORMATS, *(f + k for f in quantized.FORMATS for k in (" few", " eight")), "attention",
                 "rms_norm"):
        np.testing.assert_array_equal(a[what], b[what], err_msg=f"{what}: {generic} and {host} differ")


def test_no_avx2_means_float32_products():
    """Where numba compiles for a CPU without AVX2 the default is the float32 products, said in the
    description, and FRAMEWORK_CPU_MATMUL=q8 makes the device unavailable with the reason."""
    from llvmlite import binding
    feats = ",".join(("-" if k.startswith("avx") or k in ("fma", "f16c") or not v else "+") + k
                     for k, v in binding.get_host_cpu_features().items())
    code = ("from framework.plugins.cpu.device import CpuDevice; d = CpuDevice(); "
            "print(d.available, d.fast, '|', d.description, '|', d.unavailable_reason)")
    env = {**os.environ, "NUMBA_CPU_NAME": "x86-64", "NUMBA_CPU_FEATURES": feats}
    env.pop(MATMUL_ENV, None)
    default = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                             check=False)
    assert default.returncode == 0, default.stderr[-2000:]
    assert default.stdout.startswith("True False") and "no AVX2" in default.stdout, default.stdout
    asked = subprocess.run([sys.executable, "-c", code], env={**env, MATMUL_ENV: "q8"}, capture_output=True,
                           text=True, timeout=300, check=False)
    assert asked.stdout.startswith("False False") and f"{MATMUL_ENV}=q8" in asked.stdout, asked.stdout


def test_switch_and_report(monkeypatch):
    """FRAMEWORK_CPU_MATMUL=f32 turns the fast path off, the description says which path runs, and an
    unknown value makes the device unavailable naming the variable and the values it takes."""
    monkeypatch.setenv(MATMUL_ENV, "f32")
    off = CpuDevice()
    assert off.available and not off.fast and "float32 products" in off.description
    assert off.weight_buffer_type.name == "cpu_f32_unpacked"
    monkeypatch.delenv(MATMUL_ENV)
    on = CpuDevice()
    if quantized.target()[1]:
        assert on.fast and "GGUF blocks" in on.description and on.weight_buffer_type.name == "cpu_gguf_blocks"
    monkeypatch.setenv(MATMUL_ENV, "int4")
    bad = CpuDevice()
    assert not bad.available and "FRAMEWORK_CPU_MATMUL='int4'" in bad.unavailable_reason
    assert "'q8'" in bad.unavailable_reason and "'f32'" in bad.unavailable_reason


def test_kernels_cached_under_framework_cache():
    """numba's compiled kernels go to $FRAMEWORK_CACHE/numba, not beside the sources."""
    root = os.environ.get("FRAMEWORK_CACHE")
    assert str(quantized.cache_dir()).startswith(root or os.path.expanduser("~/.cache/framework"))
    raw, shape = weight("Q4_1")
    quantized.QuantizedWeight(raw, DType.Q4_1, shape).matmul(activations(1, shape[1]))
    assert any(quantized.cache_dir().rglob("*.nbi")), f"no numba index in {quantized.cache_dir()}"
    here = os.path.dirname(quantized.__file__)
    beside = [f for _, _, fs in os.walk(here) for f in fs if f.endswith((".nbi", ".nbc"))]
    assert not beside, f"numba cache files beside the sources: {beside}"


@pytest.mark.parametrize("t, h, hkv, d, s", [(1, 9, 3, 64, 40), (7, 9, 3, 64, 64), (33, 4, 1, 256, 96),
                                             (1, 9, 3, 64, 320)])
def test_fast_attention_equals_reference_and_rows_alone(t, h, hkv, d, s):
    """The fast path's FLASH_ATTN_EXT (attention.py) against the reference kernel, with grouped heads and a
    causal mask over a cache longer than the keys any query sees; each query row alone gives the same bits
    (so a prefill chunk of any size, and a decode step, see the same attention). (33, 4, 1, 256, 96) runs
    the threaded build, (1, 9, 3, 64, 320) a decode step's heads over the threads (312 keys seen)."""
    from framework.core.graph import reference
    from framework.plugins.cpu.attention import BY_KEY_THREADED_FROM, BY_KEY_UNTIL, THREADED_FROM, flash_attn_ext
    rng = np.random.default_rng(t)
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((t, h, d), (s, hkv, d), (s, hkv, d)))
    start = s - t - 7 if s > 300 else 5
    mask = np.where(np.arange(s)[None, :] <= start + np.arange(t)[:, None], 0.0, -np.inf).astype(np.float32)
    want = reference.flash_attn_ext(q, k, v, mask, scale=d ** -0.5)
    got = flash_attn_ext(q, k, v, mask, scale=d ** -0.5)
    nmse = float(((got - want) ** 2).sum() / (want ** 2).sum())
    assert nmse < 1e-10, f"attention off the reference: NMSE {nmse:.2e}"
    for i in range(t):
        np.testing.assert_array_equal(flash_attn_ext(q[i:i + 1], k, v, mask[i:i + 1], scale=d ** -0.5)[0], got[i])
    assert (t * h * s * d >= THREADED_FROM) == (t == 33)
    assert (t <= BY_KEY_UNTIL and t * h * (start + t) * d >= BY_KEY_THREADED_FROM) == (s == 320)


def test_fast_attention_of_several_sequences_scores_only_their_cells(monkeypatch):
    """The decode rows of 8 sequences in one step, each seeing only its own cells of a shared cache (interleaved,
    as a unified cache places them): the keys are read as the cache holds them and only the open ones scored,
    and each row's output is the bits the window transposed first gives (every key scored) and the bits of
    the row alone."""
    from framework.core.graph import reference
    from framework.plugins.cpu import attention as A
    rng = np.random.default_rng(8)
    t, h, hkv, d, s = 8, 4, 1, 256, 200
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((t, h, d), (s, hkv, d), (s, hkv, d)))
    owner = rng.integers(0, t, s)
    mask = np.where(owner[None, :] == np.arange(t)[:, None], 0.0, -np.inf).astype(np.float32)
    assert np.isfinite(mask).sum() <= A.BY_KEY_SHARE * t * s
    got = A.flash_attn_ext(q, k, v, mask, scale=d ** -0.5)
    want = reference.flash_attn_ext(q, k, v, mask, scale=d ** -0.5)
    assert float(((got - want) ** 2).sum() / (want ** 2).sum()) < 1e-10
    for i in range(t):
        np.testing.assert_array_equal(A.flash_attn_ext(q[i:i + 1], k, v, mask[i:i + 1], scale=d ** -0.5)[0], got[i])
    monkeypatch.setattr(A, "BY_KEY_SHARE", 0.0)
    monkeypatch.setattr(A, "BY_KEY_UNTIL", 0)
    np.testing.assert_array_equal(A.flash_attn_ext(q, k, v, mask, scale=d ** -0.5), got)


@pytest.mark.parametrize("t, h, hkv, d", [(1, 9, 3, 64), (8, 9, 3, 64), (3, 4, 1, 72), (1, 12, 2, 128), (5, 10, 2, 68)])
def test_decode_attention_gives_the_same_bits_however_its_jobs_split(t, h, hkv, d):
    """_attend_keys a query a job with all its heads (each key's row read once for them all), whole kv heads a job,
    runs of heads, a head a job, with the value rows prefetched or not, on one thread or over the threads: every
    way the same bits, near the reference (by_key_jobs picks among them by the thread count: every machine's). Kv
    heads of 3, 4, 6 and 5 query heads: scored four at a time (vectors.lanes8_dot4) and one at a time, and one at a
    time where the head's width is not a multiple of 8 (68)."""
    from framework.core.graph import reference
    from framework.plugins.cpu import attention as A
    rng = np.random.default_rng(t + d)
    s = 150
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((t, h, d), (s, hkv, d), (s, hkv, d)))
    mask = np.where(rng.integers(0, t, s)[None, :] == np.arange(t)[:, None], 0.0, -np.inf).astype(np.float32)
    keys, counts = A.OpenKeys().of(mask).keys
    ways = {}
    for build in (A._by_key_one, A._by_key_threads):
        for parts in sorted({1, 2, hkv, h}):
            for prefetch in (False, True):
                out = np.empty(q.shape, np.float32)
                build(q, k, v, mask, True, np.float32(d ** -0.5), keys, counts, out, parts, prefetch)
                ways[(build.__name__, parts, prefetch)] = out
    first = next(iter(ways.values()))
    for way, out in ways.items():
        np.testing.assert_array_equal(out, first, err_msg=f"{way} differs")
    want = reference.flash_attn_ext(q, k, v, mask, scale=d ** -0.5)
    assert float(((first - want) ** 2).sum() / (want ** 2).sum()) < 1e-10


def test_a_program_s_attention_calls_scan_their_mask_once_a_run():
    """Every layer's attention reads the step's one mask: OpenKeys finds its open keys once a run and gives
    each call the bits a call alone gets; an entry serves only the array it was made from, and a mask buffer
    rewritten in place is scanned again after clear() (which CpuProgram calls at the start of each run)."""
    from framework.plugins.cpu import attention as A
    rng = np.random.default_rng(9)
    t, h, hkv, d, s = 3, 6, 2, 64, 96
    q, k, v = (rng.standard_normal(shape).astype(np.float32) for shape in ((t, h, d), (s, hkv, d), (s, hkv, d)))
    mask = np.where(rng.random((t, s)) < 0.6, 0.0, -np.inf).astype(np.float32)
    masks = A.OpenKeys()
    alone = A.flash_attn_ext(q, k, v, mask, scale=0.125)
    for _ in range(3):                                # three layers of one run
        np.testing.assert_array_equal(A.flash_attn_ext(q, k, v, mask, scale=0.125, masks=masks), alone)
    other = mask.copy()
    other[:, ::2] = -np.inf                           # another array: its own entry
    np.testing.assert_array_equal(A.flash_attn_ext(q, k, v, other, scale=0.125, masks=masks),
                                  A.flash_attn_ext(q, k, v, other, scale=0.125))
    mask[:, ::3] = 0.0                                # the caller rewrites the buffer for its next run
    stale = A.flash_attn_ext(q, k, v, mask, scale=0.125, masks=masks)
    assert not np.array_equal(stale, A.flash_attn_ext(q, k, v, mask, scale=0.125))   # why each run clears it
    masks.clear()
    np.testing.assert_array_equal(A.flash_attn_ext(q, k, v, mask, scale=0.125, masks=masks),
                                  A.flash_attn_ext(q, k, v, mask, scale=0.125))


@pytest.mark.parametrize("shape, n_dims, mode", [((1, 9, 64), 64, "neox"), ((5, 3, 64), 64, "normal"),
                                                 ((300, 4, 128), 96, "neox")])
def test_fast_rope_is_the_reference_bits(shape, n_dims, mode):
    """The fast path's ROPE (rope.py) gives the reference kernel's bits, the pass-through dimensions past
    n_dims and a strided input included; (300, 4, 128) runs the threaded build."""
    from framework.core.graph import reference
    from framework.plugins.cpu.rope import THREADED_FROM, rope
    rng = np.random.default_rng(shape[0])
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    pos = rng.integers(0, 8000, shape[0]).astype(np.int32)
    for a in (x, x.transpose(1, 0, 2).copy().transpose(1, 0, 2)):
        kw = dict(n_dims=n_dims, mode=mode, freq_base=10000.0, freq_scale=0.5)
        np.testing.assert_array_equal(rope(a, pos, **kw), reference.rope(a, pos, **kw))
    assert (x.size >= THREADED_FROM) == (shape[0] == 300)


@pytest.mark.parametrize("shape", [(1, 576), (11, 640), (3, 4, 256), (300, 576)])
def test_fast_rms_norm_equals_reference_and_rows_alone(shape):
    """The fast path's RMS_NORM (norm.py) against the reference kernel, and each row alone gives the same bits
    (the reference takes one row through BLAS's dot and several through einsum). (300, 576) is threaded."""
    from framework.core.graph import reference
    from framework.plugins.cpu.norm import rms_norm
    x = np.random.default_rng(shape[0]).standard_normal(shape).astype(np.float32) * 3
    got = rms_norm(x, eps=1e-6)
    np.testing.assert_allclose(got, reference.rms_norm(x, eps=1e-6), rtol=2e-6, atol=2e-6)
    flat, rows = got.reshape(-1, shape[-1]), x.reshape(-1, shape[-1])
    for i in range(flat.shape[0]):
        np.testing.assert_array_equal(rms_norm(rows[i:i + 1], eps=1e-6)[0], flat[i])


def test_threaded_and_one_thread_builds_are_cached_apart(tmp_path):
    """numba keys its cache by a function's name, code and signature, not by its options: a process that
    compiled only a kernel's one-thread build must leave nothing a later process takes for its threaded build
    (which then ran on one thread: a decode step's head at twice its time). The threaded build compiles (a
    miss), and the next process loads it (a hit)."""
    code = ("import sys, numpy as np\n"
            "from framework.plugins.cpu import norm\n"
            "x = np.ones((4, 64), np.float32)\n"
            "k = getattr(norm, sys.argv[1])\n"
            "k(x, np.float32(1e-6), np.empty_like(x))\n"
            "print(sum(k.stats.cache_hits.values()), sum(k.stats.cache_misses.values()))\n")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}

    def hits_and_misses(name: str) -> tuple[int, ...]:
        done = subprocess.run([sys.executable, "-c", code, name], env=env, capture_output=True, text=True,
                              timeout=600, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return tuple(map(int, done.stdout.split()[-2:]))

    assert hits_and_misses("_norm_one") == (0, 1)
    assert hits_and_misses("_norm_threads") == (0, 1), "the threaded build came from the one-thread build's entry"
    assert hits_and_misses("_norm_threads") == (1, 0)
    assert hits_and_misses("_norm_one") == (1, 0)


def test_framework_cache_off_caches_no_kernel(tmp_path):
    """FRAMEWORK_CACHE=off: the kernels are not cached anywhere, and no folder named 'off' appears where the
    process runs (as one once did, under the repository's root)."""
    code = ("import numpy as np, gguf\n"
            "import framework.plugins.cpu.quantized as q\n"
            "from framework.core.graph import DType\n"
            "assert q.cache_dir() is None, q.cache_dir()\n"
            "w = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)\n"
            "raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType.Q8_0)\n"
            "out = q.QuantizedWeight(raw, DType.Q8_0, (8, 64)).matmul(np.ones((1, 64), np.float32))\n"
            "assert out.shape == (1, 8)\n")
    env = {**os.environ, "FRAMEWORK_CACHE": "off"}
    env.pop("NUMBA_CACHE_DIR", None)
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True, timeout=120)
    assert not (tmp_path / "off").exists()


def test_products_reading_one_input_quantize_it_once(monkeypatch):
    """q, k and v (gate and up) read one input: a program quantizes it once a run (SharedActivations) and drops
    it after the last reader; each output is bit for bit the product alone, and a second run with other values
    quantizes those (nothing kept from the first)."""
    from framework.core.graph import F32, Fragment, GraphBuilder
    from framework.core.graph.tensor import LeafKind, leaf
    raw, shape = weight("Q4_1")
    b = GraphBuilder()
    tx = b.input("x", F32, (3, shape[1]))
    ws = [b.use(leaf(f"blk.0.attn_{n}.weight", DType.Q4_1, shape, LeafKind.WEIGHT)) for n in "qkv"]
    outs = [b.mul_mat(w, tx) for w in ws]
    graph = b.build(outs)
    device = CpuDevice("q8")
    program = device.compile(Fragment(0, "cpu", graph.nodes, inputs=graph.leaves, outputs=outs))
    weights = [device.load_weight(w, raw) for w in ws]
    calls = []
    real = quantized.quantize_activations
    monkeypatch.setattr(quantized, "quantize_activations", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    for seed in (1, 2):
        x = np.random.default_rng(seed).standard_normal((3, shape[1])).astype(np.float32)
        got = program.run([x if t is tx else weights[ws.index(t)] for t in graph.leaves])
        assert calls == [x.shape], f"run {seed}: the input quantized {len(calls)} times for 3 products"
        assert program.shared._held == {}, "the input's 8-bit form outlived its last reader"
        for w, out in zip(weights, got):
            np.testing.assert_array_equal(out, w.matmul(x))
        calls.clear()
