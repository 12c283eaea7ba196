"""The only module that touches the NPU: thin calls into pyxrt (XRT's Python binding), nothing else.

Every call here is one the binding really has (XRT src/python/pybind11/src/pyxrt.cpp):
``pyxrt.device(i)``, ``pyxrt.xclbin(path)``, ``device.register_xclbin(xclbin)``,
``pyxrt.hw_context(device, xclbin.get_uuid())``, ``pyxrt.kernel(hw_context, name)``,
``kernel.group_id(i)``, ``pyxrt.bo(device, size, pyxrt.bo.flags.X, group_id)``, ``bo.write(buf, seek)``,
``bo.sync(pyxrt.xclBOSyncDirection.X)``, ``bo.read(size, skip)``, ``pyxrt.run(kernel)``,
``run.set_arg(i, value)``, ``run.start()``, ``run.wait(timeout_ms)``, ``run.state()``,
``pyxrt.runlist(hw_context)``, ``runlist.add(run)``, ``runlist.execute()``, ``runlist.wait()``, and for
the ELF flow ``pyxrt.elf(path)``, ``pyxrt.module(elf)``, ``pyxrt.ext.kernel(hw_context, module, name)``,
``pyxrt.ext.bo(device, size)``.

Never run on an NPU: it is tested against tests/fake_pyxrt.py, a double with these signatures.

Two things of the binding shape what is done here:
  * ``runlist.wait(timeout)`` takes a ``std::chrono::milliseconds`` and returns ``std::cv_status``,
    for which the binding registers no converter; so a chain is waited with ``runlist.wait()``, and
    the driver's own command timeout (ERT_CMD_STATE_TIMEOUT) is what ends a chain that hangs. XRT then
    raises ``xrt::runlist::command_error`` ("runlist failed execution"), a RuntimeError in Python;
    the state of each run says which one failed and how.
  * a runlist needs XRT 2.17 or later; without ``pyxrt.runlist`` every run is started and waited
    on its own (chains of one).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .kernels import OPCODE_START_NPU, GemmKernel, KernelSet
from .profiles import Profile

XRT_PYTHON_DIRS = ("/opt/xilinx/xrt/python",)
MAX_CHAIN_ENV = "FRAMEWORK_XDNA_MAX_CHAIN"
TIMEOUT_ENV = "FRAMEWORK_XDNA_TIMEOUT_MS"
DEFAULT_TIMEOUT_MS = 10_000


def import_pyxrt(module_name: str = "pyxrt") -> tuple[Any, str]:
    """(module, "") or (None, reason): pyxrt from sys.path, else from $XILINX_XRT/python or
    /opt/xilinx/xrt/python (where XRT installs it; setup.sh would put it on PYTHONPATH)."""
    try:
        return importlib.import_module(module_name), ""
    except ImportError as e:
        first = f"{type(e).__name__}: {e}"
    dirs = [str(Path(os.environ["XILINX_XRT"]) / "python")] if os.environ.get("XILINX_XRT") else []
    dirs += [d for d in XRT_PYTHON_DIRS if d not in dirs]
    present = [d for d in dirs if Path(d).is_dir()]
    if not present:
        return None, (f"pyxrt not importable: XRT not installed ({first}; no XRT Python folder at "
                      f"{' or '.join(dirs)})")
    for d in present:
        if d not in sys.path:
            sys.path.append(d)
        try:
            return importlib.import_module(module_name), ""
        except ImportError as e:
            first = f"{type(e).__name__}: {e}"
    return None, f"pyxrt not importable from {', '.join(present)}: {first}"


class XdnaRunError(RuntimeError):
    """A run or a chain of runs failed on the NPU; says the chain length, the limit and how to lower it."""

    def __init__(self, message: str, *, chain: int, limit: int, state: str):
        self.chain, self.limit, self.state = chain, limit, state
        super().__init__(message)


def chain_error(device: str, profile: Profile, chain: int, limit: int, state: str, detail: str,
                what: str) -> XdnaRunError:
    lower = max(1, min(limit, chain) // 2)
    return XdnaRunError(
        f"{device}: a chain of {chain} runs ({what}) failed on the NPU: {state} ({detail}); the limit is {limit} "
        f"runs per chain (profile {profile.name}); lower it with {MAX_CHAIN_ENV}={lower} (or the device's "
        f"max_chain option), so the host drives shorter chains", chain=chain, limit=limit, state=state)


def _state_name(state: Any) -> str:
    return getattr(state, "name", None) or str(state).split(".")[-1]


@dataclass
class Loaded:
    """What an opened kernel set holds per GEMM entry."""

    entry: GemmKernel
    context: Any
    kernel: Any
    instr_bo: Any
    instr_count: int


class XrtSession:
    """An opened NPU: its pyxrt device, one hardware context per xclbin of the kernel set, the kernels and
    their instruction buffers. Built by ``open``; used by the device's NPU arm."""

    def __init__(self, pyxrt, device: Any, kernel_set: KernelSet, profile: Profile, name: str,
                 timeout_ms: int = DEFAULT_TIMEOUT_MS):
        self.x, self.device, self.kernel_set, self.profile, self.name = pyxrt, device, kernel_set, profile, name
        self.timeout_ms = timeout_ms
        self.loaded: dict[GemmKernel, Loaded] = {}
        self.contexts: dict[Path, tuple[Any, Any]] = {}      # xclbin -> (xclbin object, hw_context)
        self._pool: dict[tuple[GemmKernel, int], tuple[Any, Any]] = {}
        self.has_runlist = hasattr(pyxrt, "runlist")

    # -- opening -------------------------------------------------------------------------------------
    def open(self) -> None:
        if self.loaded:
            return
        x = self.x
        xclbins = self.kernel_set.xclbins
        if len(xclbins) > self.profile.hw_contexts:
            raise RuntimeError(f"{self.name}: the kernel set needs {len(xclbins)} hardware contexts (one per xclbin), "
                               f"profile {self.profile.name} supports {self.profile.hw_contexts}")
        for path in xclbins:
            xb = x.xclbin(str(path))
            self.device.register_xclbin(xb)
            try:
                ctx = x.hw_context(self.device, xb.get_uuid())
            except RuntimeError as e:
                raise RuntimeError(f"{self.name}: no hardware context for {path.name}: {e} (profile "
                                   f"{self.profile.name}: {self.profile.hw_contexts} concurrent contexts on the NPU, "
                                   f"other processes may hold some)") from e
            self.contexts[path] = (xb, ctx)
        kernels: dict[tuple, Any] = {}
        for e in self.kernel_set.entries:
            _, ctx = self.contexts[e.xclbin]
            if e.flow == "elf":
                kern = x.ext.kernel(ctx, x.module(x.elf(str(e.program))), e.kernel)
                self.loaded[e] = Loaded(e, ctx, kern, None, 0)
                continue
            key = (e.xclbin, e.kernel)
            if key not in kernels:
                kernels[key] = x.kernel(ctx, e.kernel)
            kern = kernels[key]
            insts = np.ascontiguousarray(e.insts, dtype=np.uint32)
            bo = x.bo(self.device, insts.nbytes, x.bo.flags.cacheable, kern.group_id(1))
            bo.write(insts.view(np.uint8), 0)
            bo.sync(x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
            count = insts.size if self.kernel_set.insts_count == "words" else insts.nbytes
            self.loaded[e] = Loaded(e, ctx, kern, bo, count)

    # -- buffers ---------------------------------------------------------------------------------------
    def _bo(self, loaded: Loaded, size: int, arg: int):
        x = self.x
        if loaded.entry.flow == "elf":
            return x.ext.bo(self.device, size)
        return x.bo(self.device, size, x.bo.flags.host_only, loaded.kernel.group_id(arg))

    def weight_bo(self, entry: GemmKernel, packed: np.ndarray):
        """The weight's tiles in a device buffer (argument 4), written and synced once at load."""
        self.open()
        bo = self._bo(self.loaded[entry], int(packed.size), 4)
        bo.write(np.ascontiguousarray(packed).view(np.uint8), 0)
        bo.sync(self.x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
        return bo

    def io_bos(self, entry: GemmKernel, slot: int):
        """(A, C) buffers of the slot-th run of this GEMM in a chain, reused from chain to chain."""
        key = (entry, slot)
        if key not in self._pool:
            loaded = self.loaded[entry]
            self._pool[key] = (self._bo(loaded, entry.m * entry.k * 2, 3), self._bo(loaded, entry.m * entry.n * 4, 5))
        return self._pool[key]

    # -- runs ------------------------------------------------------------------------------------------
    def make_run(self, entry: GemmKernel, a_bf16: np.ndarray, weight_bo, slot: int):
        """Write A into its buffer, sync it, and return (run, C buffer): the run has its arguments set and
        is not started (a runlist starts it)."""
        x = self.x
        loaded = self.loaded[entry]
        bo_a, bo_c = self.io_bos(entry, slot)
        bo_a.write(np.ascontiguousarray(a_bf16).view(np.uint8), 0)
        bo_a.sync(x.xclBOSyncDirection.XCL_BO_SYNC_BO_TO_DEVICE)
        run = x.run(loaded.kernel)
        run.set_arg(0, OPCODE_START_NPU)
        if entry.flow == "elf":
            run.set_arg(1, 0)
            run.set_arg(2, 0)
        else:
            run.set_arg(1, loaded.instr_bo)
            run.set_arg(2, loaded.instr_count)
        run.set_arg(3, bo_a)
        run.set_arg(4, weight_bo)
        run.set_arg(5, bo_c)
        return run, bo_c, loaded.context

    def result(self, entry: GemmKernel, bo_c) -> np.ndarray:
        bo_c.sync(self.x.xclBOSyncDirection.XCL_BO_SYNC_BO_FROM_DEVICE)
        raw = np.asarray(bo_c.read(entry.m * entry.n * 4, 0))
        return raw.view(np.float32).reshape(entry.m, entry.n)

    def execute(self, runs: list, context, limit: int, what: str) -> None:
        """Run a chain: one runlist of len(runs) <= limit runs (or one run started and waited)."""
        n = len(runs)
        if n > limit:
            raise ValueError(f"{self.name}: internal error: a chain of {n} runs exceeds the limit {limit}")
        x = self.x
        completed = x.ert_cmd_state.ERT_CMD_STATE_COMPLETED
        if n == 1 or not self.has_runlist:
            for run in runs:
                try:
                    run.start()
                    state = run.wait(self.timeout_ms)
                except RuntimeError as e:
                    raise chain_error(self.name, self.profile, n, limit, _state_name(run.state()), f"XRT: {e}",
                                      what) from e
                if state != completed:
                    raise chain_error(self.name, self.profile, n, limit, _state_name(state),
                                      f"run.wait({self.timeout_ms} ms) returned it", what)
            return
        rl = x.runlist(context)
        for run in runs:
            rl.add(run)
        try:
            rl.execute()
            rl.wait()
        except RuntimeError as e:
            failed = [(i, run.state()) for i, run in enumerate(runs) if run.state() != completed]
            if failed:
                i, st = failed[0]
                state, detail = _state_name(st), f"run {i + 1} of the chain ended {_state_name(st)}; XRT: {e}"
            else:
                state, detail = "ERT_CMD_STATE_ERROR", f"XRT: {e}"
            raise chain_error(self.name, self.profile, n, limit, state, detail, what) from e
