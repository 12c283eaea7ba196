"""The example device: real numpy computation behind a private buffer type.

What it shows a plugin author:
  - reading the op table (framework.core.graph.ops, documented in docs/ops.md) and running its
    reference kernels (ops.bind), inside a device and a program class of one's own;
  - a private buffer type: handles are ExampleBuffer objects, not numpy arrays, so any code path
    that hands one to another device without from_host/to_host fails loudly instead of working
    by accident;
  - refusals as data (``refused_ops``, configured by the user), which the framework applies before it
    asks ``supports_op``: verdicts with a machine-readable code and a reason;
  - limits (memory, live programs, commands per submission) declared up front and honoured:
    the program runs each submission the plan cut for it separately.

Configuration, read when the device is created (constructor arguments win over the environment):
  FRAMEWORK_EXAMPLE_REFUSE        comma-separated op names to refuse ("ROPE,GLU")    refuse=
  FRAMEWORK_EXAMPLE_MAX_PROGRAMS  live compiled programs (Limits.max_live_programs)  max_programs=
  FRAMEWORK_EXAMPLE_MAX_CHAIN     commands per submission (Limits.max_chain)         max_chain=
  FRAMEWORK_EXAMPLE_MEMORY        bytes of device memory (Limits.memory_bytes)       memory=
A malformed setting makes the device unavailable, with the reason (``framework backends`` shows it).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from framework.contract import BufferType, Device, DeviceType, Limits, Verdict, dequantize, ops

EXAMPLE_BUFFER = BufferType("example_private", host=False)

ENV_REFUSE = "FRAMEWORK_EXAMPLE_REFUSE"
ENV_MAX_PROGRAMS = "FRAMEWORK_EXAMPLE_MAX_PROGRAMS"
ENV_MAX_CHAIN = "FRAMEWORK_EXAMPLE_MAX_CHAIN"
ENV_MEMORY = "FRAMEWORK_EXAMPLE_MEMORY"


class ExampleBuffer:
    """A handle to memory of the example device. It deliberately does not behave like an array:
    numpy refuses it (``np.asarray``, arithmetic, ufuncs all raise TypeError), so a tensor that
    lives here reaches another device only through ``to_host``."""

    __slots__ = ("array",)
    __array_ufunc__ = None          # numpy binary operators and ufuncs with it raise TypeError

    def __init__(self, array: np.ndarray):
        self.array = array

    def __array__(self, *args, **kwargs):
        raise TypeError("an ExampleBuffer is memory of the example device; copy it with the device's "
                        "to_host() before another device reads it")

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> np.dtype:
        return self.array.dtype

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    def __repr__(self) -> str:
        return f"ExampleBuffer({self.array.dtype}, shape {list(self.array.shape)})"


class ExampleProgram:
    """A compiled fragment: its steps grouped by submission, as the plan cut them to max_chain.

    Every call of ``run`` executes the submissions one after another and records, on the device,
    the number of commands (non-view nodes) each one chained.
    """

    def __init__(self, device: ExampleDevice, fragment):
        self.device = device
        slots = {id(t): i for i, t in enumerate(fragment.inputs)}
        self.n_args = len(fragment.inputs)
        steps = []
        for n in fragment.nodes:
            slots[id(n)] = len(slots)
            steps.append((ops.bind(n), slots[id(n)], tuple(slots[id(s)] for s in n.src)))
        self.n_slots = len(slots)
        self.out_slots = [slots[id(t)] for t in fragment.outputs]
        self.submissions = []
        for start, end in fragment.submissions or [(0, len(fragment.nodes))]:
            commands = sum(1 for n in fragment.nodes[start:end] if not ops.is_view(n.op))
            if device.limits.max_chain and commands > device.limits.max_chain:
                raise ValueError(f"a submission of {commands} commands exceeds max_chain="
                                 f"{device.limits.max_chain}")
            self.submissions.append((steps[start:end], commands))
        if sum(len(s) for s, _ in self.submissions) != len(steps):
            raise ValueError("the fragment's submissions do not cover its nodes exactly")

    def run(self, args: list[Any]) -> list[ExampleBuffer]:
        if len(args) != self.n_args:
            raise ValueError(f"expected {self.n_args} arguments, got {len(args)}")
        vals: list[Any] = [self.device.read(a) for a in args] + [None] * (self.n_slots - self.n_args)
        for steps, commands in self.submissions:      # one submission: at most max_chain commands
            for fn, out, ins in steps:
                vals[out] = fn(*[vals[i] for i in ins])
            self.device.submitted.append(commands)
        self.device.runs += 1
        return [ExampleBuffer(vals[i]) for i in self.out_slots]


def _parse_count(value: Any, what: str, problems: list[str]) -> int | None:
    if value is None or value == "":
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        problems.append(f"{what}={value!r} is not a whole number")
        return None
    if n < 1:
        problems.append(f"{what}={n} must be at least 1")
        return None
    return n


class ExampleDevice(Device):
    type = DeviceType.ACCEL
    buffer_type = EXAMPLE_BUFFER

    def __init__(self, index: int = 0, *, refuse: Iterable[str] | str | None = None, max_programs: int | None = None,
                 max_chain: int | None = None, memory: int | None = None):
        self.name = f"example:{index}"
        self.physical_id = "host-cpu"       # the same CPU the built-in cpu device runs on
        self.description = ("example plugin (framework-plugin-example): the core's reference kernels "
                            "behind a private buffer type, on the host CPU")
        problems: list[str] = []

        if refuse is None:
            refuse, self.refuse_source = os.environ.get(ENV_REFUSE, ""), ENV_REFUSE
        else:
            self.refuse_source = "the refuse= argument"
        if isinstance(refuse, str):
            refuse = refuse.split(",")
        self.refuse = frozenset(op.strip().upper() for op in refuse if op.strip())
        unknown = sorted(self.refuse - ops.OPS.keys())
        if unknown:
            problems.append(f"{self.refuse_source} names unknown ops {', '.join(unknown)} "
                            f"(known: {', '.join(sorted(ops.OPS))})")
        self.refused_ops = {op: Verdict.no("refused_by_config", f"{self.name} is configured to refuse {op} "
                                           f"(set by {self.refuse_source})") for op in sorted(self.refuse)}

        def setting(arg, env):
            if arg is not None:
                return arg, env.replace("FRAMEWORK_EXAMPLE_", "").lower()
            return os.environ.get(env), env

        self.limits = Limits(
            memory_bytes=_parse_count(*setting(memory, ENV_MEMORY), problems),
            max_live_programs=_parse_count(*setting(max_programs, ENV_MAX_PROGRAMS), problems),
            max_chain=_parse_count(*setting(max_chain, ENV_MAX_CHAIN), problems))
        if problems:
            self.available = False
            self.unavailable_reason = "bad configuration: " + "; ".join(problems)

        # what the device did, for tests and reports
        self.submitted: list[int] = []      # commands chained by every submission run, in order
        self.compiled = 0                   # programs compiled
        self.runs = 0                       # programs run

    # -- verdicts ---------------------------------------------------------------------------
    def supports_op(self, node) -> Verdict:
        # the framework has applied refused_ops and the op table already; every op of the table has a
        # reference kernel, so there is nothing left to refuse
        return Verdict.yes()

    def supports_buffer(self, buft: BufferType) -> Verdict:
        if buft == EXAMPLE_BUFFER or buft.host:
            return Verdict.yes()
        return Verdict.no("unsupported_buffer", f"{self.name} reads only its own buffers and host memory, "
                                                f"not '{buft.name}'")

    # -- memory -----------------------------------------------------------------------------
    def load_weight(self, tensor, raw: np.ndarray) -> ExampleBuffer:
        return ExampleBuffer(dequantize(raw, tensor.dtype, tensor.shape))

    def alloc(self, tensor) -> ExampleBuffer:
        dtype = np.float32 if tensor.dtype.name == "F32" else np.int32
        return ExampleBuffer(np.zeros(tensor.shape, dtype=dtype))

    def from_host(self, array: np.ndarray) -> ExampleBuffer:
        if isinstance(array, ExampleBuffer):
            raise TypeError(f"{self.name}.from_host() was given an ExampleBuffer, not host memory")
        return ExampleBuffer(np.array(array, copy=True))     # an upload: the device owns its copy

    def to_host(self, handle: Any) -> np.ndarray:
        if not isinstance(handle, ExampleBuffer):
            raise TypeError(f"{self.name}.to_host() was given {type(handle).__name__}, not an ExampleBuffer")
        return handle.array.copy()                            # a download: the host owns its copy

    def read(self, handle: Any) -> np.ndarray:
        """The array a program computes on: its own buffers, or host memory (which it can read)."""
        if isinstance(handle, ExampleBuffer):
            return handle.array
        if isinstance(handle, np.ndarray):
            return handle
        raise TypeError(f"{self.name} cannot read a {type(handle).__name__}")

    # -- work -------------------------------------------------------------------------------
    def compile(self, fragment) -> ExampleProgram:
        program = ExampleProgram(self, fragment)
        self.compiled += 1
        return program

    def reset_counters(self) -> None:
        self.submitted.clear()
        self.compiled = self.runs = 0
