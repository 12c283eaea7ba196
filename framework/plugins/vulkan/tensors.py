"""The Vulkan plugin's output handle read back through its run's own copy (submission.Stage); every other
handle is the skeleton's (framework.backend: DeviceTensor, DeviceWeight)."""

from __future__ import annotations

from ...backend import DeviceTensor


class StagedTensor(DeviceTensor):
    """An output handle whose values its run also copied for reading back, in the run's own submission
    (submission.Stage): ``readback`` is (stage, run, byte offset there)."""

    __slots__ = ("readback",)

    def __init__(self, *a, readback=None, **k):
        super().__init__(*a, **k)
        self.readback = readback
