"""The CPU device: numpy kernels, weights unpacked once to float32 at load."""

from __future__ import annotations

import functools
import os

import numpy as np

from ...contract import HOST_BUFFER, BufferType, Device, DeviceType, Limits, Verdict
from ...core.graph import Tensor
from ...core.graph.quants import dequantize
from ...core.scheduler.fragment import Fragment
from .kernels import KERNELS

# Weights are held dequantized: BLAS multiplies float32 far faster than numpy can unpack blocks.
CPU_F32_BUFFER = BufferType("cpu_f32_unpacked", host=True)
PARAMS = {"SCALE": ("scale",), "UNARY": ("op",), "GLU": ("op",), "RMS_NORM": ("eps",), "SOFT_MAX": ("scale",),
          "FLASH_ATTN_EXT": ("scale",), "ROPE": ("n_dims", "mode", "freq_base", "freq_scale"),
          "VIEW": ("shape", "offset"), "RESHAPE": ("shape",), "PERMUTE": ("axes",), "TRANSPOSE": ("axes",)}


class CpuProgram:
    """A fragment as a list of (kernel, output slot, input slots); slots 0..n-1 are the arguments."""

    def __init__(self, fragment: Fragment):
        slots = {id(t): i for i, t in enumerate(fragment.inputs)}
        self.n_args = len(fragment.inputs)
        self.steps = []
        for n in fragment.nodes:
            slots[id(n)] = len(slots)
            kernel = KERNELS[n.op]
            bound = {k: n.params[k] for k in PARAMS.get(n.op, ())}
            fn = functools.partial(kernel, **bound) if bound else kernel
            self.steps.append((fn, slots[id(n)], tuple(slots[id(s)] for s in n.src)))
        self.n_slots = len(slots)
        self.out_slots = [slots[id(t)] for t in fragment.outputs]

    def run(self, args):
        vals = list(args) + [None] * (self.n_slots - self.n_args)
        for fn, out, ins in self.steps:
            vals[out] = fn(*[vals[i] for i in ins])
        return [vals[i] for i in self.out_slots]


class CpuDevice(Device):
    name = "cpu"
    type = DeviceType.CPU
    buffer_type = HOST_BUFFER
    weight_buffer_type = CPU_F32_BUFFER
    limits = Limits()

    def __init__(self):
        self.physical_id = "host-cpu"
        self.description = f"numpy {np.__version__} on {os.cpu_count()} CPU threads (float32)"

    def supports_op(self, node: Tensor) -> Verdict:
        if node.op not in KERNELS:
            return Verdict.no("unsupported_op", f"the CPU plugin has no kernel for {node.op}")
        return Verdict.yes()

    def load_weight(self, tensor: Tensor, raw: np.ndarray) -> np.ndarray:
        return dequantize(raw, tensor.dtype, tensor.shape)

    def compile(self, fragment: Fragment) -> CpuProgram:
        return CpuProgram(fragment)
