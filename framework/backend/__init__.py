"""The skeleton of a backend that keeps tensors in its own memory (a GPU's, an accelerator's): one
lowering from a fragment to steps (lowering.py) applying the core's fusion plan and asking the plugin's
kernel table, one program (program.py: scratch from the pools, argument and weight binding, rope rows,
read-back, profiling; ahead.py: a run enqueued ahead behind a gate, for in-order queues), the lowering
of the shared C kernels (c_kernels.py) and a base device (device.py: the plain-operand rule, load_weight, alloc,
from_host, to_host, compile). A plugin on it gives discovery, a device with a few primitives, its
program's encoding, and a kernel table; docs/plugin-guide.md ("A GPU plugin") walks through one."""

from ..core import weight_words
from ..core.device_buffers import BufferPools, Chunk, DeviceTensor, DeviceWeight, Lease, contiguous_strides
from ..core.graph import fusion
from . import c_kernels
from .ahead import AheadDevice, AheadProgram, Pending
from .device import BackendDevice, plain_operand_refusal
from .lowering import KernelTable, Lowering, is_weight
from .memory import Memory
from .program import Arguments, Program, StagedTensor, read_as_ints, strided_copy
from .rope import RopeRows, rope_table
from .signatures import Signatures
from .steps import ChunkArg, Ref, RopeArg, Step, pad4

__all__ = ["AheadDevice", "AheadProgram", "Arguments", "BackendDevice", "BufferPools", "Chunk", "ChunkArg",
           "DeviceTensor", "DeviceWeight", "KernelTable", "Lease", "Lowering", "Memory", "Pending", "Program", "Ref",
           "RopeArg", "RopeRows", "Signatures", "StagedTensor", "Step", "c_kernels", "contiguous_strides", "fusion",
           "is_weight", "pad4", "plain_operand_refusal", "read_as_ints", "rope_table", "strided_copy", "weight_words"]
