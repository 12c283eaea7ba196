"""A program's next run enqueued ahead, behind a gate, for a device whose queue runs in order (the
OpenCL plugin's: docs/opencl.md). Right after a run's work, when the same program ran twice in a row with
the same buffers (decode, step after step), its outputs are copied back without waiting, a marker is
enqueued, and then the next run's kernels, the first one waiting for a gate (the in-order queue holds the
rest behind it). When that run comes with the same buffers, its host values (tokens, positions, masks,
cache rows) are written once the marker says the run before no longer reads them, and the gate is
opened: nothing is enqueued while the device waits, and enqueueing ran while the device computed the
run before.

Anything else that comes first (another program, other buffers, a read, an upload, closing, the device
collected) opens the gate as it is: the run ahead then replays the last run with that run's own host
values (its value buffers hold them: only this program's runs write them). A replay writes what that run
wrote: every cache row it writes was written with the same value by the run, from inputs the run had, and
rows it does not write are not touched. That holds where no kernel reads a written argument before the
first kernel that writes it (``replayable``; a cache write is an overwrite, SET_ROWS or CPY), which is
checked when the program is built. Its outputs go to buffers of its own (the pool's), returned when it is
released. So the queue is never left behind a closed gate, and a released run changes nothing a later
run or read sees.

Where the run ahead is enqueued (the device's ``ahead_setting``): ``inline`` enqueues it on the caller's
thread before the run returns; ``thread`` hands its kernels to the device's worker thread (Worker), so the
run returns at once and the caller's Python may run while the worker is in the driver's enqueue calls
(ones that release the interpreter lock, as ctypes calls do). Python gives the lock back to a waiting
thread only every switch interval (5 ms by default), so while a worker has kernels to enqueue the interval
is the device's ``switch_setting`` (in microseconds; 0 leaves Python's own), then restored. Everything
that needs the run ahead whole (the run that takes it, once its gate is open; releasing it, so another
program's run, an upload or a read; close; the device's finalizer) waits for the worker first, so the
in-order queue holds what it would inline; an error on the worker is raised there, naming the program
and the kernel. ``off`` turns this off (every run enqueued when it comes); profiling does too.

The device mixes in ``AheadDevice`` (the run held ahead, the worker, close and settle) and its program
``AheadProgram`` (taking a run ahead, and after a run, enqueueing the next one through the plugin's
``copy_back`` and ``enqueue_next``)."""

from __future__ import annotations

import queue as queues
import sys
import threading
import weakref
from functools import partial

import numpy as np

from ..contract import settings
from .program import StagedTensor, read_as_ints

STAGE_MAX = 8 << 20       # bytes of a run's value outputs copied back ahead of the next run (a decode step's logits)


class Pending:
    """A run enqueued ahead: its kernels wait for ``gate``, which ``open_gate(gate)`` opens; ``marker`` (with
    a ``wait()``) completes when the run before has. ``enqueued`` is set once all its kernels are (at once
    inline, by the worker on a thread)."""

    def __init__(self, program, fixed: tuple, gate, open_gate, marker, outs: dict, keep: tuple):
        # the program weakly: the device's finalizer holds this, and must not keep the device alive through it
        self.program = weakref.ref(program)
        self.name = program.name
        self.fixed, self.gate, self.opener, self.marker, self.outs = fixed, gate, open_gate, marker, outs
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

    def start(self, write_values) -> None:
        """Its host values written (``write_values()``: after the run before has read its own, and waited
        for), then the gate opened (the worker may still be enqueueing its last kernels: they join the queue
        behind the first), then its kernels waited for: the caller enqueues behind them next."""
        try:
            write_values()
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
        opener, self.opener = self.opener, None
        if opener is not None:
            opener(self.gate)


class Worker:
    """A device's thread that enqueues runs ahead, one after another (jobs in order); the device's close and
    finalizer stop it. It holds no reference to the device (its jobs hold the launches and the queue)."""

    def __init__(self, name: str, switch_setting: str):
        self.switch_setting = switch_setting
        self.jobs: queues.SimpleQueue = queues.SimpleQueue()
        self.thread = threading.Thread(target=self._loop, name=f"{name} enqueue ahead", daemon=True)
        self.thread.start()

    def submit(self, pending: Pending, enqueue) -> None:
        self.jobs.put((pending, enqueue))

    def _loop(self) -> None:
        while (job := self.jobs.get()) is not None:
            with _switching(settings.read(self.switch_setting)):
                job[0].enqueue_with(job[1])
            job = None            # nothing of the last job held while waiting for the next

    def stop(self) -> None:
        self.jobs.put(None)
        if self.thread is not threading.current_thread():
            self.thread.join()


_switch_lock = threading.Lock()
_switch = {"busy": 0, "saved": None}


class _switching:
    """The interpreter's switch interval at `us` microseconds while any worker enqueues (Python hands the
    lock to a waiting thread only that often), restored when none does."""

    def __init__(self, us: int):
        self.us = us

    def __enter__(self):
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


class AheadDevice:
    """What a device holds of runs enqueued ahead: the run held (``pending``), its worker thread, the
    counts (taken: ran as asked; released: replayed), the program that ran last. The subclass names its
    settings (``ahead_setting``: thread, inline or off; ``switch_setting``) and calls ``init_ahead()``."""
    ahead_setting = switch_setting = ""
    profile = None

    def init_ahead(self) -> None:
        self._held = [None]               # the run enqueued ahead, if any (a list: the finalizer holds it, not self)
        self._workers = [None]            # the thread that enqueues runs ahead, made on first use
        self.last_run = None              # the program that ran last here
        self.ahead_taken = self.ahead_released = 0
        self._finalizer = weakref.finalize(self, shut, self._held, self._workers)

    @property
    def ahead_mode(self) -> str:
        """thread, inline or off (profiling turns it off)."""
        return "off" if self.profile is not None else settings.read(self.ahead_setting)

    @property
    def ahead(self) -> bool:
        """Whether a run with the same buffers as the one before enqueues the next one ahead."""
        return self.ahead_mode != "off"

    @property
    def pending(self):
        return self._held[0]

    @pending.setter
    def pending(self, value) -> None:
        self._held[0] = value

    @property
    def worker(self) -> Worker:
        if self._workers[0] is None:
            self._workers[0] = Worker(self.name, self.switch_setting)
        return self._workers[0]

    def close(self) -> None:
        """Release the run enqueued ahead (after the worker has enqueued it) and stop the worker thread. The
        device stays usable: a later run ahead starts a new worker."""
        if self.available:
            self.settle()
            shut(self._held, self._workers)

    def settle(self) -> None:
        """Release the run enqueued ahead, if any: it replays the last run with that run's own values."""
        if self._held[0] is not None:
            self.ahead_released += 1
            release_held(self._held)


class AheadProgram:
    """What a program does about runs ahead: ``init_ahead()`` once built (whether a replay is harmless and
    the outputs fit a stage), ``take_ahead(sig)`` as a run starts (the run enqueued ahead with these
    buffers, taken, or None), ``finish(args, a, outs, sig)`` as it ends (the run counted in the device's
    ``runs``; its results; where the run came again with the same buffers, its outputs copied back by the
    plugin's ``copy_back(outs)`` -> (stage, run) and the next run enqueued by its ``enqueue_next(sig)``),
    and ``hand_ahead(pending, inline, threaded)`` for enqueue_next: the run ahead enqueued inline, or
    handed to the worker."""

    def init_ahead(self) -> None:
        out_bytes = 4 * sum(self.val_sizes[v] for v in self.out_vals)
        self.ahead_ok = replayable(self.steps, self.written_args) and out_bytes <= STAGE_MAX
        self.last_sig = None

    def take_ahead(self, sig) -> Pending | None:
        dev = self.dev
        ahead = dev.pending
        if ahead is None or ahead.program() is not self or ahead.fixed != sig:
            return None
        dev.pending = None                  # taken: this run was enqueued ahead, behind its gate
        dev.ahead_taken += 1
        return ahead

    def finish(self, args, a, outs: dict, sig) -> list:
        dev = self.dev
        dev.runs += 1
        again = dev.ahead and self.ahead_ok and dev.last_run is self and self.last_sig == sig
        dev.last_run, self.last_sig = self, sig
        if not again:
            return self.results(args, a.bufs, outs)
        stage, run = self.copy_back(outs)
        results = self.results(args, a.bufs, outs, _staged_handle(stage, run, self.out_dtypes))
        self.enqueue_next(sig)
        return results

    def hand_ahead(self, pending: Pending, inline, threaded) -> None:
        dev = self.dev
        if dev.ahead_mode == "thread":    # the caller goes on; whatever needs it whole waits for the worker
            dev.pending = pending
            dev.worker.submit(pending, threaded)
            return
        pending.enqueue_with(inline)
        if pending.error is not None:
            pending.release()             # what was enqueued of it replays the run before: harmless; raises
        dev.pending = pending


def _staged_handle(stage, run: int, dtypes: list):
    """The handles of the value outputs this run copied back ahead of the next (``stage.values``: the words
    of an index output read as ints)."""
    def wrap(i, r, buf, lease):
        read = partial(stage.values, run, r.idx, r.off, r.shape, r.strides)
        return StagedTensor(buf, r.off, r.shape, dtypes[i], r.strides, lease=lease,
                            readback=read if dtypes[i] is np.float32 else partial(read_as_ints, read))
    return wrap
