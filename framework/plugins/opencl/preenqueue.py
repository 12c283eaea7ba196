"""A program's next run enqueued ahead, behind a gate: right after a run's kernels, when the same program ran
twice in a row with the same buffers (decode, step after step), its outputs are copied back without
waiting, a marker is enqueued, and then the next run's kernels, the first one waiting for a user event
(the in-order queue holds the rest behind it). When that run comes with the same buffers, its host values
(tokens, positions, masks, cache rows) are written on a queue of their own once the marker says the run
before no longer reads them, and the gate is opened: no kernel is enqueued while the device waits. Enqueueing
costs the host 10-24 us a kernel on NVIDIA (docs/opencl.md); ahead of time it runs while the device
computes the run before.

Anything else that comes first (another program, other buffers, a read, an upload, closing, the device
collected) opens the gate as it is: the run ahead then replays the last run with that run's own host
values (its value buffers hold them: only this program's runs write them). A replay writes what that run
wrote: every cache row it writes was written with the same value by the run, from inputs the run had, and
rows it does not write are not touched. That holds where no kernel reads a written argument before the
first kernel that writes it (``replayable``; a cache write is an overwrite, SET_ROWS or CPY), which is
checked when the program is built. Its outputs go to buffers of its own (the pool's), returned when it is
released. So the queue is never left behind an unset event, and a released run changes nothing a
later run or read sees.

Where the run ahead is enqueued (FRAMEWORK_OPENCL_PREENQUEUE): ``inline`` (the default) enqueues it on the
caller's thread before the run returns. ``thread`` (measured no faster on the H200: docs/opencl.md) hands
its kernels to the device's worker thread (Worker), so the run returns at once and the caller's Python (the
executor, the session, sampling, the read-back wait) may run while the worker is in clEnqueueNDRangeKernel,
which ctypes calls without the interpreter lock. Python gives the lock back to a waiting thread only every
switch interval (5 ms by default), so while a worker has kernels to enqueue the interval is
FRAMEWORK_OPENCL_ENQUEUE_SWITCH_US (20 us unless set; 0 leaves Python's own), then restored. Everything
that needs the run ahead whole (the run that takes it, once its gate is open; releasing it, through
OpenCLDevice.queue, so another program's run, an upload or a read; close; the device's finalizer) waits for
the worker first, so the in-order queue holds what it would inline; an error on the worker is raised
there, naming the program and the kernel. ``off`` (or 0) turns this off (every run enqueued when it
comes); profiling (FRAMEWORK_OPENCL_PROFILE) does too.
"""

from __future__ import annotations

import queue as queues
import sys
import threading
import weakref

import numpy as np

from ...backend import contiguous_strides
from ...contract import settings
from .options import PREENQUEUE_ENV, SWITCH_ENV

STAGE_MAX = 8 << 20       # bytes of a run's value outputs copied back ahead of the next run (a decode step's logits)


class Stage:
    """Pinned host memory (a buffer made with ALLOC_HOST_PTR, mapped once and never used by a kernel) that a
    program's value outputs are copied to at the end of each run that enqueues the next one ahead: a copy
    to pinned memory is a transfer that does not wait for the host, where pageable memory may be copied
    through a staging buffer by the host. Handles of an earlier run than the last read their own buffers."""

    def __init__(self, dev, sizes: dict[int, int]):
        import pyopencl as cl
        self.runs = 0              # runs copied here
        self.buffers, self.arrays, self.events = {}, {}, {}
        flags = cl.mem_flags.READ_WRITE | cl.mem_flags.ALLOC_HOST_PTR
        for v, n in sizes.items():
            buf = self.buffers[v] = cl.Buffer(dev.context, flags, max(16, 4 * n))
            self.arrays[v], _ = cl.enqueue_map_buffer(dev.values_queue, buf, cl.map_flags.READ | cl.map_flags.WRITE,
                                                      0, (n,), np.float32, is_blocking=True)

    def copy(self, queue, outs: dict) -> int:
        """This run's value outputs copied here without waiting; the run's number, for the handles."""
        import pyopencl as cl
        self.runs += 1
        for v, (buf, _) in outs.items():
            self.events[v] = cl.enqueue_copy(queue, self.arrays[v], buf, is_blocking=False)
        return self.runs

    def values(self, run: int, v: int, offset: int, shape: tuple, strides: tuple | None) -> np.ndarray | None:
        """Value v of run `run` as an output sees it, or None where a later run has copied over it."""
        if run != self.runs:
            return None
        self.events[v].wait()
        flat = self.arrays[v]
        if not int(np.prod(shape)):
            return np.zeros(shape, flat.dtype)
        strides = strides or contiguous_strides(shape)
        view = np.lib.stride_tricks.as_strided(flat[offset:], shape, tuple(s * flat.itemsize for s in strides))
        return np.array(view, copy=True)


class Pending:
    """A run enqueued ahead: its kernels wait for ``gate``; ``marker`` completes when the run before has.
    ``enqueued`` is set once all its kernels are (at once inline, by the worker on a thread)."""

    def __init__(self, program, fixed: tuple, gate, marker, outs: dict, keep: tuple):
        # the program weakly: the device's finalizer holds this, and must not keep the device alive through it
        self.program = weakref.ref(program)
        self.name = program.name
        self.fixed, self.gate, self.marker, self.outs = fixed, gate, marker, outs
        self.keep = keep          # the buffers its kernels were bound to, alive until it has run
        self.enqueued = threading.Event()
        self.error: BaseException | None = None

    def enqueue_with(self, enqueue) -> None:
        """Run enqueue() (its kernels, behind the gate), keeping what it raised for wait_enqueued."""
        try:
            enqueue()
        except BaseException as e:  # noqa: BLE001  (raised on the caller's thread by wait_enqueued)
            self.error = e
        finally:
            self.enqueued.set()

    def wait_enqueued(self) -> None:
        """Wait until every kernel of it is enqueued; an error of its enqueueing raised here (once), named."""
        self.enqueued.wait()
        error, self.error = self.error, None
        if error is not None:
            raise RuntimeError(f"{self.name}: enqueueing its next run ahead failed: {error}") from error

    def start(self, values_queue, uploads) -> None:
        """Its host values written (after the run before has read its own), then the gate opened (the worker
        may still be enqueueing its last kernels: they join the queue behind the first), then its kernels
        waited for: the caller enqueues behind them next."""
        import pyopencl as cl
        try:
            last = None
            for buf, data in uploads:
                last = cl.enqueue_copy(values_queue, buf, data, is_blocking=False, wait_for=[self.marker])
            if last is not None:
                last.wait()
        finally:             # never left closed, even when a write failed
            self._open()
            self.wait_enqueued()

    def release(self) -> None:
        """Its kernels waited for, then the gate opened (once): with the values in place it runs as asked, else
        it replays the run before. The gate is opened even when the enqueueing failed, then the error raised."""
        try:
            self.enqueued.wait()
        finally:
            self._open()
        self.wait_enqueued()

    def _open(self) -> None:
        gate, self.gate = self.gate, None
        if gate is not None:
            import pyopencl as cl
            gate.set_status(cl.command_execution_status.COMPLETE)


class Worker:
    """A device's thread that enqueues runs ahead, one after another (jobs in order); the device's close and
    finalizer stop it. It holds no reference to the device (its jobs hold the launches and the queue)."""

    def __init__(self, name: str):
        self.jobs: queues.SimpleQueue = queues.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=f"{name} enqueue ahead", daemon=True)
        self.thread.start()

    def submit(self, pending: Pending, enqueue) -> None:
        self.jobs.put((pending, enqueue))

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            with _switching():
                job[0].enqueue_with(job[1])
            job = None            # nothing of the last job held while waiting for the next

    def stop(self) -> None:
        self.jobs.put(None)
        if self.thread is not threading.current_thread():
            self.thread.join()


_switch_lock = threading.Lock()
_switch = {"busy": 0, "saved": None}


class _switching:
    """The interpreter's switch interval at FRAMEWORK_OPENCL_ENQUEUE_SWITCH_US while any worker enqueues (Python
    hands the lock to a waiting thread only that often), restored when none does."""

    def __enter__(self):
        self.us = settings.read(SWITCH_ENV)
        if self.us:
            with _switch_lock:
                if _switch["busy"] == 0:
                    _switch["saved"] = sys.getswitchinterval()
                    sys.setswitchinterval(self.us * 1e-6)
                _switch["busy"] += 1
        return self

    def __exit__(self, *exc):
        if self.us:
            with _switch_lock:
                _switch["busy"] -= 1
                if _switch["busy"] == 0:
                    sys.setswitchinterval(_switch["saved"])
        return False


def mode(dev) -> str:
    """thread, inline or off (profiling turns it off)."""
    return "off" if dev.profile is not None else settings.read(PREENQUEUE_ENV)


def enabled(dev) -> bool:
    return mode(dev) != "off"


def replayable(steps, written_args) -> bool:
    """Whether a replay of a run writes what the run wrote: no kernel reads a written argument before the first
    kernel that writes it (kernels that write a cache write its rows whole, then may read them)."""
    written: set[int] = set()
    for st in steps:
        written |= {i for i in st.arg_writes if i in written_args}
        if any(i in written_args and i not in written for i in st.arg_reads):
            return False
    return True


def release_held(held: list) -> None:
    """The device's run ahead, released (after its worker has enqueued it)."""
    pending, held[0] = held[0], None
    if pending is not None:
        pending.release()


def shut(held: list, workers: list) -> None:
    """The device closing or collected: its run ahead released, its worker thread stopped (even when the
    release raised: the error is raised after)."""
    try:
        release_held(held)
    finally:
        worker, workers[0] = workers[0], None
        if worker is not None:
            worker.stop()
