"""The suite's pytest plumbing: the ``--device`` option and the choice of devices.

pytest only parses the command line once, before it has imported anything named by
``--pyargs``; a ``conftest.py`` inside an installed package is therefore read too late to add an
option. This module is registered as a pytest plugin (entry point group ``pytest11``), which pytest
loads before parsing; it adds ``--device`` only to runs that name this suite
(``--pyargs framework.conformance`` or a path inside it), so no other test suite ever sees the
option. ``conftest.py`` adds the same option when pytest is pointed at the directory itself; the
two never clash (``add_device_option`` is idempotent). Without the entry point (pytest run with
``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, or an install that predates it) pass
``-p framework.conformance.pytest_plugin`` on the command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

PACKAGE = "framework.conformance"
PACKAGE_DIR = Path(__file__).resolve().parent
OPTION = "--device"

_DEVICES = pytest.StashKey["list | Exception"]()   # the selected devices, or the error selecting them
_TARGETED = pytest.StashKey[bool]()                  # the command line names this suite


def targets_suite(args) -> bool:
    """Whether a pytest command line names this suite (as a module with --pyargs, or as a path)."""
    for arg in args:
        arg = str(arg)
        if arg.startswith("-"):
            continue
        target = arg.split("::")[0]
        if target == PACKAGE or target.startswith(PACKAGE + "."):
            return True
        try:
            path = Path(target).resolve()
        except (OSError, ValueError):
            continue
        if path == PACKAGE_DIR or PACKAGE_DIR in path.parents:
            return True
    return False


def _option_taken(parser) -> bool:
    """Whether some plugin or conftest (this suite's own, or another) already defines --device."""
    if OPTION in getattr(parser, "_opt2dest", {}):
        return True
    for group in getattr(parser, "_groups", []):
        for opt in getattr(group, "options", []):
            if OPTION in opt.names():
                return True
    return False


def add_device_option(parser) -> None:
    if _option_taken(parser):
        return
    group = parser.getgroup("framework-conformance", "framework backend conformance suite")
    try:
        group.addoption(
            OPTION, action="append", default=[], metavar="NAME",
            help="device to test, as `framework backends` lists them (example:0, cpu, or an alias cpu/gpu/npu/"
                 "accel); repeat it or give a comma-separated list for several. Default: every available device.")
    except (ValueError, argparse.ArgumentError):   # defined meanwhile by someone else: use theirs
        pass


@pytest.hookimpl(hookwrapper=True)       # the old-style wrapper: pytest 7 knows it too
def pytest_load_initial_conftests(early_config, parser, args):
    # after the initial conftests, so that one of them defining --device already is seen
    yield
    if targets_suite(args):
        add_device_option(parser)
        early_config.stash[_TARGETED] = True


def pytest_configure(config):
    if config.stash.get(_TARGETED, False):
        selected_devices(config)      # an unknown --device fails here, before collection


def requested_names(config) -> list[str]:
    value = config.getoption(OPTION.lstrip("-"), default=None)
    if not value:
        return []
    values = [value] if isinstance(value, str) else list(value)
    return [n.strip() for v in values for n in str(v).split(",") if n.strip()]


def selected_devices(config) -> list:
    """The devices the suite runs on, chosen once per session through the plugin registry.

    An unknown or unavailable --device name is a usage error carrying the registry's own message,
    which lists every device; it is never a skip.
    """
    cached = config.stash.get(_DEVICES, None)
    if cached is None:
        cached = _select(config)
        config.stash[_DEVICES] = cached
    if isinstance(cached, Exception):
        raise cached
    return cached


def _select(config):
    from ..registry import default_registry
    from ..core.scheduler.errors import DeviceSelectionError

    registry = default_registry()
    names = requested_names(config)
    try:
        if names:
            return registry.select(",".join(names))
        devices = [d for d in registry.devices() if d.available]
        if not devices:
            raise DeviceSelectionError(f"no available device to test; devices:\n{registry.describe_devices()}")
        return devices
    except DeviceSelectionError as e:
        return pytest.UsageError(f"{OPTION} {','.join(names) or '(every available device)'}: {e}")
