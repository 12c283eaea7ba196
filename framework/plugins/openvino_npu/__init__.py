"""The OpenVINO backend plugin: openvino:CPU, openvino:GPU, openvino:NPU, ... (one device per device
OpenVINO offers; the NPU, and the GPU, listed as unavailable with the reason when absent).

A fragment becomes one ``ov.Model`` of OpenVINO opset operations (translator.py) with its weights
folded in as compressed constants (weights.py), compiled once per fragment program key and cached
on disk by OpenVINO (device.py; the settings it compiles with: options.py). NPU profiles (profiles.py)
give the limits of Intel NPUs; applied to a device that is present they are an emulation, and every
report says so.
"""

from ...contract import hookimpl


@hookimpl
def framework_devices():
    from .device import discover
    return discover()
