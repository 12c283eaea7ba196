"""framework-plugin-example: a third-party backend plugin, as small as a complete one can be.

The framework finds this module through the entry point ``example`` in the group
``framework.backends`` (see pyproject.toml) and calls the hook below.
"""

from framework.contract import hookimpl

from .device import EXAMPLE_BUFFER, ExampleBuffer, ExampleDevice, ExampleProgram

__version__ = "0.1.0"


@hookimpl
def framework_devices():
    # Every call makes a fresh device, so settings read from the environment apply to it.
    return [ExampleDevice()]


__all__ = ["EXAMPLE_BUFFER", "ExampleBuffer", "ExampleDevice", "ExampleProgram", "framework_devices"]
