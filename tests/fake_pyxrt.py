"""A test double of pyxrt, XRT's Python binding, with the signatures of the real one
(XRT src/python/pybind11/src/pyxrt.cpp): device, xclbin, uuid, hw_context, kernel, bo (and its flags),
run, runlist, xclBOSyncDirection, ert_cmd_state, elf, module, ext.bo, ext.kernel.

It behaves like the parts of XRT the plugin relies on, so mistakes show up as wrong numbers or errors:
  * a bo has a host copy and a device copy: ``write``/``read``/``map`` touch the host copy, ``sync``
    copies one way or the other, a kernel reads and writes the device copies only (forget a sync and
    the kernel sees stale bytes, or the host reads stale results);
  * ``run.set_arg(i, bo)`` refuses a bo whose memory group is not ``kernel.group_id(i)`` (XRT refuses a
    buffer not connected to the argument's memory bank);
  * a run added to a runlist must not have been started, and must belong to the runlist's hw_context;
  * the "NPU" executes a run by calling ``KERNELS[name]`` (tests install a GEMM that reads the shape
    from the first words of the instruction stream), after every argument was set;
  * failure injection (``behaviour``): ``pyxrt.device(i)`` raising, hw_context creation failing, and
    the driver timing out a chain longer than ``timeout_chains_over`` runs: the runs end
    ERT_CMD_STATE_TIMEOUT / ABORT and ``runlist.wait()`` raises RuntimeError("runlist failed
    execution"), as xrt::runlist::command_error does through pybind11.
Every call is appended to ``CALLS`` as a tuple, so tests can check the order.
"""

from __future__ import annotations

import enum
import json
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np

CALLS: list[tuple] = []
KERNELS: dict = {}          # kernel name -> fn(run) that computes on the device copies


@dataclass
class Behaviour:
    device_error: str | None = None          # pyxrt.device(i) raises RuntimeError(this)
    n_devices: int = 1
    max_contexts: int = 16
    timeout_chains_over: int | None = None   # the driver times out runlists longer than this
    single_run_state: str | None = None      # force the state a single run ends in (e.g. TIMEOUT)


behaviour = Behaviour()


def reset() -> None:
    CALLS.clear()
    KERNELS.clear()
    global behaviour
    behaviour = Behaviour()
    _contexts.clear()


XCL_BO_FLAGS_NONE = 0


class xclBOSyncDirection(enum.IntEnum):
    XCL_BO_SYNC_BO_TO_DEVICE = 0
    XCL_BO_SYNC_BO_FROM_DEVICE = 1
    XCL_BO_SYNC_BO_GMIO_TO_AIE = 2
    XCL_BO_SYNC_BO_AIE_TO_GMIO = 3


class ert_cmd_state(enum.IntEnum):     # values of XRT's ert.h
    ERT_CMD_STATE_NEW = 1
    ERT_CMD_STATE_QUEUED = 2
    ERT_CMD_STATE_RUNNING = 3
    ERT_CMD_STATE_COMPLETED = 4
    ERT_CMD_STATE_ERROR = 5
    ERT_CMD_STATE_ABORT = 6
    ERT_CMD_STATE_SUBMITTED = 7
    ERT_CMD_STATE_TIMEOUT = 8
    ERT_CMD_STATE_NORESPONSE = 9
    ERT_CMD_STATE_SKERROR = 10
    ERT_CMD_STATE_SKCRASHED = 11


class uuid:
    def __init__(self, text: str):
        self._text = text

    def to_string(self) -> str:
        return self._text

    def __eq__(self, other):
        return isinstance(other, uuid) and other._text == self._text

    def __hash__(self):
        return hash(self._text)


class device:
    def __init__(self, index: int | str = 0):
        CALLS.append(("device", index))
        if behaviour.device_error:
            raise RuntimeError(behaviour.device_error)
        if isinstance(index, int) and index >= behaviour.n_devices:
            raise RuntimeError(f"No such device index: {index}")
        self.index = index
        self.registered: dict[uuid, xclbin] = {}

    def register_xclbin(self, xb: xclbin) -> None:
        if not isinstance(xb, xclbin):
            raise TypeError("register_xclbin(): incompatible function arguments")
        CALLS.append(("register_xclbin", xb.path.name))
        self.registered[xb.get_uuid()] = xb

    def load_xclbin(self, xb) -> None:
        raise RuntimeError("load_axlf: Operation not supported")     # what NPUs answer


class _xclbinkernel:
    def __init__(self, name: str):
        self._name = name

    def get_name(self) -> str:
        return self._name

    def get_num_args(self) -> int:
        return 6


class xclbin:
    """A fake xclbin file is JSON: {"uuid": "...", "kernels": ["MLIR_AIE"]}."""

    def __init__(self, filename: str):
        if not isinstance(filename, str):
            raise TypeError("xclbin(): incompatible constructor arguments (a str path)")
        CALLS.append(("xclbin", Path(filename).name))
        self.path = Path(filename)
        try:
            spec = json.loads(self.path.read_text())
        except (OSError, ValueError) as e:
            raise RuntimeError(f"Failed to load xclbin {filename}: {e}") from None
        self._uuid = uuid(spec.get("uuid", self.path.name))
        self._kernels = [_xclbinkernel(k) for k in spec.get("kernels", ["MLIR_AIE"])]

    def get_uuid(self) -> uuid:
        return self._uuid

    def get_kernels(self):
        return list(self._kernels)


_contexts: list = []


class hw_context:
    def __init__(self, dev: device = None, u: uuid = None):
        if dev is None:
            return
        CALLS.append(("hw_context", u.to_string()))
        if u not in dev.registered:
            raise RuntimeError(f"xclbin {u.to_string()} is not registered with the device")
        if len(_contexts) >= behaviour.max_contexts:
            raise RuntimeError("DRM_IOCTL_AMDXDNA_CREATE_HWCTX IOCTL failed (err=-16): Device or resource busy")
        _contexts.append(self)
        self.device, self.xclbin = dev, dev.registered[u]


GROUP_IDS = {1: 1, 3: 3, 4: 4, 5: 5}     # argument index -> memory group, like an mlir-aie xclbin


class kernel:
    def __init__(self, ctx: hw_context, name: str):
        if not isinstance(ctx, hw_context) or not isinstance(name, str):
            raise TypeError("kernel(): incompatible constructor arguments")
        CALLS.append(("kernel", name))
        if name not in [k.get_name() for k in ctx.xclbin.get_kernels()]:
            raise RuntimeError(f"No such kernel '{name}'")
        self.context, self.name, self.elf = ctx, name, None

    def group_id(self, index: int) -> int:
        return GROUP_IDS.get(index, 0)

    def __call__(self, *args):
        r = run(self)
        for i, a in enumerate(args):
            r.set_arg(i, a)
        r.start()
        return r


class _bo_flags(enum.IntEnum):
    normal = 0
    cacheable = 1 << 24
    device_only = 1 << 25
    host_only = 1 << 29
    p2p = 1 << 30
    svm = 1 << 27


class bo:
    flags = _bo_flags
    normal, cacheable, device_only, host_only, p2p, svm = (_bo_flags.normal, _bo_flags.cacheable,
                                                          _bo_flags.device_only, _bo_flags.host_only,
                                                          _bo_flags.p2p, _bo_flags.svm)

    def __init__(self, dev: device, size: int, flags: _bo_flags, group: int):
        if not isinstance(dev, device) or not isinstance(flags, _bo_flags):
            raise TypeError("bo(): incompatible constructor arguments (device, size, bo.flags, memory_group)")
        CALLS.append(("bo", int(size), flags.name, int(group)))
        self.flags, self.group = flags, int(group)
        self.host = np.zeros(int(size), dtype=np.uint8)
        self.dev = np.zeros(int(size), dtype=np.uint8)

    def write(self, buf, seek: int) -> None:
        data = np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)
        if seek + data.size > self.host.size:
            raise RuntimeError(f"bo.write: {data.size} bytes at {seek} overflow a bo of {self.host.size}")
        CALLS.append(("bo.write", int(data.size), int(seek), self.group))
        self.host[seek:seek + data.size] = data

    def read(self, size: int, skip: int) -> np.ndarray:
        CALLS.append(("bo.read", int(size), int(skip), self.group))
        return self.host[skip:skip + size].copy().view(np.int8)

    def sync(self, direction: xclBOSyncDirection, size: int | None = None, offset: int = 0) -> None:
        CALLS.append(("bo.sync", xclBOSyncDirection(direction).name, self.group))
        end = self.host.size if size is None else offset + size
        if direction == xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE:
            self.dev[offset:end] = self.host[offset:end]
        else:
            self.host[offset:end] = self.dev[offset:end]

    def map(self):
        return memoryview(self.host)

    def size(self) -> int:
        return int(self.host.size)

    def address(self) -> int:
        return id(self)


class run:
    def __init__(self, k: kernel = None):
        self.kernel = k
        self.args: dict = {}
        self._state = ert_cmd_state.ERT_CMD_STATE_NEW
        self.started = False
        self.in_runlist = None
        if k is not None:
            CALLS.append(("run", k.name))

    def set_arg(self, index: int, value) -> None:
        if isinstance(value, bo):
            if not isinstance(value, ext.bo) and self.kernel.elf is None and value.group != self.kernel.group_id(index):
                raise RuntimeError(f"kernel argument {index}: bo of memory group {value.group} is not connected to "
                                   f"group {self.kernel.group_id(index)}")
        elif not isinstance(value, int):
            raise TypeError(f"set_arg(): incompatible function arguments ({type(value).__name__})")
        CALLS.append(("run.set_arg", index, "bo" if isinstance(value, bo) else int(value)))
        self.args[index] = value

    def _execute(self) -> None:
        missing = [i for i in range(6) if i not in self.args]
        if missing:
            raise RuntimeError(f"run: arguments {missing} were never set")
        fn = KERNELS.get(self.kernel.name)
        if fn is None:
            raise RuntimeError(f"the fake NPU has no behaviour for kernel {self.kernel.name}")
        fn(self)
        self._state = ert_cmd_state.ERT_CMD_STATE_COMPLETED

    def start(self) -> None:
        if self.in_runlist is not None:
            raise RuntimeError("run is part of a runlist")
        CALLS.append(("run.start",))
        self.started = True
        if behaviour.single_run_state:
            self._state = ert_cmd_state[behaviour.single_run_state]
            return
        self._execute()

    def wait(self, timeout_ms: int = 0) -> ert_cmd_state:
        CALLS.append(("run.wait", int(timeout_ms)))
        return self._state

    def state(self) -> ert_cmd_state:
        return self._state


class runlist:
    def __init__(self, ctx: hw_context = None):
        self.context = ctx
        self.runs: list[run] = []
        self.failed = False
        self.executed = False
        CALLS.append(("runlist",))

    def add(self, r: run) -> None:
        if r.started:
            raise RuntimeError("a started run cannot be added to a runlist")
        if r.in_runlist is not None:
            raise RuntimeError("run is already in a runlist")
        if r.kernel.context is not self.context:
            raise RuntimeError("run and runlist belong to different hardware contexts")
        r.in_runlist = self
        self.runs.append(r)
        CALLS.append(("runlist.add",))

    def execute(self) -> None:
        if self.executed:
            raise RuntimeError("runlist must be idle before submitting for execution, current state: running")
        self.executed = True
        CALLS.append(("runlist.execute", len(self.runs)))
        limit = behaviour.timeout_chains_over
        if limit is not None and len(self.runs) > limit:
            # the chained command runs past the driver's timeout: the run in progress times out,
            # the rest are aborted (xrt_kernel.cpp runlist_impl::wait)
            for i, r in enumerate(self.runs):
                if i < limit:
                    r._execute()
                elif i == limit:
                    r._state = ert_cmd_state.ERT_CMD_STATE_TIMEOUT
                else:
                    r._state = ert_cmd_state.ERT_CMD_STATE_ABORT
            self.failed = True
            return
        for r in self.runs:
            r._execute()

    def wait(self, *timeout) -> None:
        if timeout:
            # the binding's timed wait takes std::chrono::milliseconds, which pyxrt registers no caster for
            raise TypeError("wait(): incompatible function arguments")
        CALLS.append(("runlist.wait",))
        if self.failed:
            raise RuntimeError("runlist failed execution")


class elf:
    def __init__(self, path: str):
        CALLS.append(("elf", Path(path).name))
        self.path = Path(path)
        self.words = np.frombuffer(self.path.read_bytes(), dtype="<u4")


class module:
    def __init__(self, e: elf):
        CALLS.append(("module", e.path.name))
        self.elf = e


class _ext_bo(bo):
    def __init__(self, dev: device, size: int):
        CALLS.append(("ext.bo", int(size)))
        self.flags, self.group = _bo_flags.normal, -1
        self.host = np.zeros(int(size), dtype=np.uint8)
        self.dev = np.zeros(int(size), dtype=np.uint8)


class _ext_kernel(kernel):
    def __init__(self, ctx: hw_context, mod: module, name: str):
        CALLS.append(("ext.kernel", name))
        if name not in [k.get_name() for k in ctx.xclbin.get_kernels()]:
            raise RuntimeError(f"No such kernel '{name}'")
        self.context, self.name, self.elf = ctx, name, mod.elf


ext = types.SimpleNamespace(bo=_ext_bo, kernel=_ext_kernel)
