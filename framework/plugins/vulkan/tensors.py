"""What the device hands out: tensors in device buffers (or host values not yet uploaded), and weights
in their device layout, split into chunks of whole rows. The handles are the contract's, shared by every
plugin that computes in device buffers; these are the Vulkan plugin's names for them."""

from __future__ import annotations

from ...contract import Chunk, DeviceTensor, DeviceWeight, Lease, contiguous_strides

VkTensor, VkWeight, contig = DeviceTensor, DeviceWeight, contiguous_strides



class StagedTensor(DeviceTensor):
    """An output handle whose values its run also copied for reading back, in the run's own submission
    (submission.Stage): ``readback`` is (stage, run, byte offset there)."""

    __slots__ = ("readback",)

    def __init__(self, *a, readback=None, **k):
        super().__init__(*a, **k)
        self.readback = readback


__all__ = ["Chunk", "Lease", "StagedTensor", "VkTensor", "VkWeight", "contig"]
