"""The CPU device: the core's reference kernels (numpy), and for products with quantized weights the
fast path of quantized.py (the GGUF blocks as stored, 8-bit activations, numba kernels). The switch
FRAMEWORK_CPU_MATMUL=f32 turns the fast path off: every weight is then unpacked once to float32 at load
and multiplied by BLAS, as the reference does."""

from __future__ import annotations

import os

import numpy as np

from ...contract import (
    HOST_BUFFER,
    BufferType,
    Device,
    DeviceType,
    Fragment,
    Limits,
    ReferenceProgram,
    Tensor,
    Verdict,
    dequantize,
    host_memory_limit,
    reference,
    settings,
)

# Weights unpacked to float32 (FRAMEWORK_CPU_MATMUL=f32, and every type without a fast kernel).
CPU_F32_BUFFER = BufferType("cpu_f32_unpacked", host=True)
# Quantized weights in their GGUF blocks (the fast path); the other weights as in CPU_F32_BUFFER.
CPU_BLOCKS_BUFFER = BufferType("cpu_gguf_blocks", host=True)

MATMUL_ENV = "FRAMEWORK_CPU_MATMUL"
MATMUL_MODES = {"q8": "quantized weights in their GGUF blocks times 8-bit activations (numba kernels, AVX2 or "
                      "AVX-512 VNNI; the default where the CPU has AVX2); the types without a kernel in float32, "
                      "their activations rounded as llama.cpp rounds them",
                "f32": "every weight unpacked to float32 at load, products by numpy's BLAS"}


settings.declare(MATMUL_ENV, "cpu", " or ".join(MATMUL_MODES), None,
                 "the CPU's products with quantized weights: " + "; ".join(f"{k}: {v}" for k, v in MATMUL_MODES.items())
                 + "; unset: q8 where the CPU can", settings.choice(MATMUL_MODES, fold=False))


def matmul_mode(env=None) -> tuple[str, str]:
    """(mode, problem) from FRAMEWORK_CPU_MATMUL: 'q8', 'f32' or '' (unset: q8 where the CPU can); problem
    is "" unless the value is unknown."""
    try:
        return settings.read(MATMUL_ENV, env) or "", ""
    except settings.SettingError as e:
        known = "; ".join(f"'{k}': {v}" for k, v in MATMUL_MODES.items())
        return "", f"{e}; use {known}"


def matmul_path(mode: str) -> tuple[bool, str, str]:
    """(fast, what the products run on, problem) for a mode of matmul_mode: the fast path needs the
    instructions of vectors.py on the CPU numba compiles for."""
    if mode == "f32":
        return False, f"float32 products (numpy's BLAS; {MATMUL_ENV}=f32)", ""
    try:
        from .quantized import target
        from .vectors import ISAS
    except ImportError as e:                # numba or llvmlite missing: a dependency, said so
        why = f"numba not importable ({type(e).__name__}: {e}); pip install 'numba>=0.60'"
        if mode == "q8":
            return False, "", f"{MATMUL_ENV}=q8 asks for the quantized products: {why}"
        return False, f"float32 products (numpy's BLAS: {why})", ""
    cpu, isa = target()
    if isa:
        return True, f"quantized products on the GGUF blocks, 8-bit activations (numba, {ISAS[isa]} on {cpu})", ""
    if mode == "q8":
        return False, "", (f"{MATMUL_ENV}=q8 asks for the quantized products, which need AVX2, and numba compiles "
                           f"for {cpu} without it: unset {MATMUL_ENV} or set it to f32")
    return False, f"float32 products (numpy's BLAS: {cpu} has no AVX2 for the quantized ones)", ""


def exact_rows(fast: bool) -> int:
    """Limits.exact_rows: the rows of a step whose products each give what a one-row step gives, the reference's
    one matrix-vector product per row and, on the fast path, the few-row kernels (from TILED_FROM rows the tiled
    ones sum in another order)."""
    if not fast:
        return reference.EXACT_ROWS
    from .quantized import TILED_FROM
    return min(reference.EXACT_ROWS, TILED_FROM - 1)


class CpuProgram(ReferenceProgram):
    """A fragment run node by node on the reference kernels, the fast path's where ``fast``."""

    def __init__(self, fragment: Fragment, fast: bool):
        super().__init__(fragment.nodes, fragment.inputs, fragment.outputs)
        self.shared = self.masks = None
        if fast:
            from . import quantized
            from .attention import OpenKeys
            self.shared, self.masks = quantized.SharedActivations(fragment.nodes), OpenKeys()
            self.steps = [(quantized.bind(n, fn, self.shared, self.masks), out, ins)
                          for n, (fn, out, ins) in zip(fragment.nodes, self.steps)]

    def run(self, args):
        if self.shared is not None:
            self.shared.clear()
            self.masks.clear()
        return super().run(args)


class CpuDevice(Device):
    name = "cpu"
    type = DeviceType.CPU
    buffer_type = HOST_BUFFER
    limits = Limits()

    def __init__(self, matmul: str | None = None):
        """matmul: 'q8' or 'f32' (see MATMUL_MODES); None reads FRAMEWORK_CPU_MATMUL."""
        self.physical_id = "host-cpu"
        # weights, caches and activations live in host memory: reservation checks them against it (a
        # subclass that declares its own limits, as tests do, keeps them)
        mode, problem = (matmul, "") if matmul in MATMUL_MODES else matmul_mode()
        self.fast, path, problem = (False, "", problem) if problem else matmul_path(mode)
        if type(self).limits is CpuDevice.limits:
            self.limits = Limits(memory_bytes=host_memory_limit(), exact_rows=exact_rows(self.fast))
        if problem:
            self.available, self.unavailable_reason = False, problem
        self.matmul_path = path
        self.weight_buffer_type = CPU_BLOCKS_BUFFER if self.fast else CPU_F32_BUFFER
        self.description = f"numpy {np.__version__} on a {os.cpu_count()}-CPU host; {path or 'no products'}"

    def supports_op(self, node: Tensor) -> Verdict:
        return Verdict.yes()      # every op of the table has a reference kernel (the framework checks the op)

    def _blocks(self, tensor: Tensor) -> bool:
        if not self.fast:
            return False
        from .quantized import keeps_blocks
        return keeps_blocks(tensor)

    def weight_nbytes(self, tensor: Tensor) -> int:
        return tensor.nbytes if self._blocks(tensor) else tensor.nelements * 4

    def load_weight(self, tensor: Tensor, raw: np.ndarray):
        if self._blocks(tensor):
            from .quantized import QuantizedWeight
            return QuantizedWeight(raw, tensor.dtype, tensor.shape)
        return dequantize(raw, tensor.dtype, tensor.shape)

    def compile(self, fragment: Fragment) -> CpuProgram:
        return CpuProgram(fragment, self.fast)
