"""The CPU device: the core's reference kernels (numpy), weights unpacked once to float32 at load."""

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
)

# Weights are held dequantized: BLAS multiplies float32 far faster than numpy can unpack blocks.
CPU_F32_BUFFER = BufferType("cpu_f32_unpacked", host=True)


class CpuProgram(ReferenceProgram):
    """A fragment run node by node on the reference kernels."""

    def __init__(self, fragment: Fragment):
        super().__init__(fragment.nodes, fragment.inputs, fragment.outputs)


class CpuDevice(Device):
    name = "cpu"
    type = DeviceType.CPU
    buffer_type = HOST_BUFFER
    weight_buffer_type = CPU_F32_BUFFER
    limits = Limits()

    def __init__(self):
        self.physical_id = "host-cpu"
        # weights, caches and activations live in host memory: reservation checks them against it (a
        # subclass that declares its own limits, as tests do, keeps them)
        if type(self).limits is CpuDevice.limits:
            self.limits = Limits(memory_bytes=host_memory_limit())
        self.description = f"numpy {np.__version__} on {os.cpu_count()} CPU threads (float32)"

    def supports_op(self, node: Tensor) -> Verdict:
        return Verdict.yes()      # every op of the table has a reference kernel (the framework checks the op)

    def load_weight(self, tensor: Tensor, raw: np.ndarray) -> np.ndarray:
        return dequantize(raw, tensor.dtype, tensor.shape)

    def compile(self, fragment: Fragment) -> CpuProgram:
        return CpuProgram(fragment)
