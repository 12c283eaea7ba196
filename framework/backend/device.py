"""The base of a device that keeps tensors in its own memory (tinygrad's ``Compiled``): it owns the
buffers a run needs (scratch, pooled outputs: BufferPools), weights in the word layout of
weight_words, handles from and to the host, the verdict rules every such device shares, and compile.

The kit it holds, for the plugin and its program: ``BufferPools`` (scratch buffers shared by every
program, pooled output buffers held by a ``Lease`` while a handle lives, a dummy binding,
``chunk_plan``), the handles ``DeviceTensor`` and ``DeviceWeight`` (in ``Chunk``s of whole rows),
``weight_words`` (GGUF blocks in 32-bit words, each f16 scale moved to a plane of its own where it
breaks word alignment), the core's ``fusion`` matcher, and ``plain_operand_refusal`` (the rule below).

A plugin's device subclasses it and gives the primitives:

* ``new_buffer(nbytes)``, ``buffer_with(array)`` (a buffer holding the array's bytes) and
  ``read_buffer(buffer, byte_offset, count, dtype)`` (a flat array): memory;
* ``program_class``: its Program subclass (program.py), which encodes a fragment's steps and submits
  them, and ``synchronize()``: waiting for the queue;
* ``buffer_type`` with its ``max_size`` (the contract's BufferType: the most one buffer or binding may
  hold; a weight over it is split into chunks of whole rows, ``max_chunk_bytes`` here) and
  ``even_chunks`` (kernels read scale planes in word pairs);
* ``kernel_verdict(node)`` (optional, default yes): what its kernels refuse beyond the shared rules;
* ``disable_setting`` (optional): the setting naming the ops every device of the plugin refuses,
  read into ``disabled`` by the subclass.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..contract import Device, LeafKind, Limits, Tensor, Verdict
from ..core.device_buffers import BufferPools, DeviceTensor
from ..core.graph import ops
from .lowering import is_weight
from .program import StagedTensor
from .rope import RopeRows


def plain_operand_refusal(dev, n: Tensor, unit: str) -> Verdict | None:
    """The refusal (or None) a device with BufferPools (device buffers of F32 values) gives a node whose
    operands it reads as plain values: weights other than a product's or a row gather's first operand must
    be F32 and within one chunk of dev.chunk_plan, other operands F32 or I32, contiguous (except CONT's) and
    at most dev.max_chunk_bytes (`unit`: what that limit is, e.g. "one storage binding"); the result F32 and
    within the same limit."""
    device, max_bytes = dev.name, dev.max_chunk_bytes
    for i, s in enumerate(n.src):
        if s.is_leaf and s.kind == LeafKind.WEIGHT:
            in_kernel = n.op in ("GET_ROWS", "MUL_MAT") and i == 0
            if not in_kernel and (s.dtype.name != "F32" or len(dev.chunk_plan("F32", s.shape)) > 1):
                return Verdict.no("unsupported_dtype", f"{n.op} reads weight {s.describe()} as plain float32 values; "
                                  f"{device} does that only for F32 weights within {unit}")
            continue
        if s.dtype.name not in ("F32", "I32"):
            return Verdict.no("unsupported_dtype", f"{device} computes on F32 (and I32 indices) only, not "
                              f"{s.describe()}")
        if s.nbytes > max_bytes:
            return Verdict.no("unsupported_shape", f"{s.describe()} is {s.nbytes} bytes, more than {unit} of "
                              f"{device} ({max_bytes} bytes)")
        if n.op != "CONT" and not s.contiguous:
            return Verdict.no("unsupported_shape", f"{n.op} on {device} needs contiguous operands; {s.describe()} "
                              f"is a permuted view (CONT it first)")
    if n.dtype.name not in ("F32", "I32"):     # I32: an index (ARGMAX), as an int in a 4-byte word
        return Verdict.no("unsupported_dtype", f"{device} writes F32 results (and I32 indices) only, not "
                          f"{n.describe()}")
    if n.nbytes > max_bytes:
        return Verdict.no("unsupported_shape", f"the result {n.describe()} is {n.nbytes} bytes, more than {unit} "
                          f"of {device} ({max_bytes} bytes); use smaller batches")
    return None


class BackendDevice(BufferPools, Device):
    program_class: type = None
    disable_setting = ""
    disabled: frozenset = frozenset()
    binding_unit = "one buffer"     # what max_chunk_bytes bounds, in the refusals' words
    max_axes = 4

    def backend_limits(self, **kw) -> Limits:
        """The contract's Limits with what the program class decides: queued_inputs where it stages device
        inputs (a greedy step's token copied on the device, so that a step may be queued before it is read)."""
        return Limits(queued_inputs=self.program_class.stage_device_inputs, **kw)

    def init_backend(self) -> None:
        """The pools and the rope rows: called by the subclass once the device is available."""
        self.init_pools()
        self.rope_rows = RopeRows()    # the rope tables' rows by position, for every program

    @property
    def max_chunk_bytes(self) -> int:
        """The most one buffer or binding holds: the buffer type's max_size (set by the subclass, or here)."""
        if self.buffer_type.max_size is None:
            raise ValueError(f"{self.name}: its buffer type {self.buffer_type.name} declares no max_size, which a "
                             f"device on the backend skeleton needs (BufferType(name, max_size=...))")
        return self.buffer_type.max_size

    @max_chunk_bytes.setter
    def max_chunk_bytes(self, nbytes: int) -> None:
        """Both buffer types' max_size (the device's limit, or a smaller one: tests of split weights)."""
        self.buffer_type = replace(self.buffer_type, max_size=int(nbytes))
        if self.weight_buffer_type is not None:
            self.weight_buffer_type = replace(self.weight_buffer_type, max_size=int(nbytes))

    @property
    def refused_ops(self) -> dict[str, Verdict]:
        return {op: Verdict.no("refused_by_profile", f"{op} is disabled on {self.name} by {self.disable_setting}")
                for op in self.disabled}

    # -- verdicts --------------------------------------------------------------------------------
    def supports_op(self, node: Tensor) -> Verdict:
        """The shared rules (views of weights, at most max_axes axes, plain operands), then the kernels'."""
        if node.op in ops.VIEW_OPS:
            if any(is_weight(s) for s in node.src):
                return Verdict.no("unsupported_buffer",
                                  f"{self.name} does not take views of weights ({node.src[0].describe()})")
            return Verdict.yes()
        for t in (node, *node.src):
            if len(t.shape) > self.max_axes:
                return Verdict.no("unsupported_shape",
                                  f"{self.name} kernels take at most {self.max_axes} axes ({t.describe()})")
        refusal = plain_operand_refusal(self, node, self.binding_unit)
        return refusal if refusal is not None else self.kernel_verdict(node)

    def kernel_verdict(self, node: Tensor) -> Verdict:
        return Verdict.yes()

    # -- memory ----------------------------------------------------------------------------------
    def weight_nbytes(self, tensor: Tensor) -> int:
        """The file's bytes, and per chunk a scale plane's padding word and a buffer's rounding to 16 bytes."""
        return tensor.nbytes + 16 * len(self.chunk_plan(tensor.dtype.name, tensor.shape))

    def alloc(self, tensor: Tensor) -> DeviceTensor:
        """A zero-filled tensor (``zeros(nbytes)``, by default new_buffer, which must then zero-fill)."""
        dt = np.float32 if tensor.dtype.name == "F32" else np.int32
        return DeviceTensor(self.zeros(tensor.nelements * 4), 0, tensor.shape, dt)

    def zeros(self, nbytes: int):
        return self.new_buffer(nbytes)

    def to_host(self, handle) -> np.ndarray:
        """A handle's values: those its run copied for reading back where they are still there, else its
        buffer's (BufferPools.to_host)."""
        if isinstance(handle, StagedTensor) and handle.host is None:
            values = handle.readback()
            if values is not None:
                return values
        return super().to_host(handle)

    # -- programs --------------------------------------------------------------------------------
    def compile(self, fragment):
        return self.program_class(self, fragment)

    def describe(self) -> str:
        state = "available" if self.available else f"unavailable: {self.unavailable_reason}"
        what = f", {self.description}" if self.available else ""
        return f"{self.name} ({self.type.value}, {state}{what})"
