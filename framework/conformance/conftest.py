"""pytest configuration of the conformance suite: the --device option and the `device` fixture.

The option is defined in ``pytest_plugin`` (see there why a conftest alone cannot add it to a
``--pyargs`` run); this conftest adds it too, for runs that point pytest at this directory.
"""

from __future__ import annotations

from framework.conformance.pytest_plugin import add_device_option, selected_devices


def pytest_addoption(parser):
    add_device_option(parser)


def pytest_configure(config):
    selected_devices(config)      # an unknown --device name fails the run with the registry's list


def pytest_generate_tests(metafunc):
    """Every test that takes `device` runs once per selected device, named by the device."""
    if "device" in metafunc.fixturenames:
        devices = selected_devices(metafunc.config)
        metafunc.parametrize("device", devices, ids=[d.name for d in devices], scope="session")
