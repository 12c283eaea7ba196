"""Every weight type a GGUF file may hold here, decoded by the CPU plugin and by the OpenVINO plugin's
loader, against gguf.quants (the gguf package's reference decoders); random blocks of each type."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

import tiny_models
from framework.core.graph import LeafKind, leaf
from framework.model.gguf_file import SUPPORTED_TYPES
from framework.plugins.cpu import quantized
from framework.plugins.cpu.device import CpuDevice
from framework.plugins.openvino_npu import weights as W

NEW_TYPES = ("Q5_K", "Q3_K", "Q2_K", "Q5_1", "IQ4_NL", "IQ4_XS", "F16", "BF16")


def _raw(dtype: str, shape=(8, 512)) -> np.ndarray:
    data, _ = tiny_models.random_weight(tiny_models.Random(zlib.crc32(dtype.encode())), dtype, shape, 0.05)
    return np.frombuffer(np.ascontiguousarray(data).tobytes(), dtype=np.uint8)


@pytest.mark.parametrize("matmul", ["f32", "q8"])
@pytest.mark.parametrize("dtype", [t.name for t in SUPPORTED_TYPES if t.name != "F32"])
def test_cpu_plugin_decodes_like_gguf_quants(dtype, matmul):
    """Both paths of the CPU plugin (FRAMEWORK_CPU_MATMUL): with q8 a weight of a type the quantized products
    read stays in its blocks, and its values, where an op other than a product needs them, are these too."""
    raw = _raw(dtype)
    want = quants.dequantize(raw.reshape(8, -1), Q[dtype]).reshape(8, 512)
    t = leaf("w", Q[dtype], (8, 512), LeafKind.WEIGHT)
    dev = CpuDevice(matmul)
    got = dev.load_weight(t, raw)
    if dev.fast and Q[dtype].name in quantized.FORMATS:
        assert isinstance(got, quantized.QuantizedWeight) and got.nbytes == raw.nbytes
        got = got.float32()
    assert got.dtype == np.float32 and got.shape == (8, 512)
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("dtype", NEW_TYPES)
def test_openvino_loader_decodes_like_gguf_quants(dtype):
    raw = _raw(dtype)
    want = quants.dequantize(raw.reshape(8, -1), Q[dtype]).reshape(8, 512).astype(np.float32)
    got = W.values(W.load("w", Q[dtype], (8, 512), raw))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))


def test_the_new_types_are_supported():
    assert set(NEW_TYPES) <= {t.name for t in SUPPORTED_TYPES}


def test_tiny_models_mix_every_type():
    """Q4_K_M and Q5_K_M files mix types; the tiny models spread every supported type over their tensors
    (and tests/test_tiny_models.py loads and runs them)."""
    used = {t for spec in tiny_models.SPECS.values() for row in spec.types for t in row}
    used |= {spec.embd_type for spec in tiny_models.SPECS.values()}
    assert {t.name for t in SUPPORTED_TYPES} - {"F32"} <= used
