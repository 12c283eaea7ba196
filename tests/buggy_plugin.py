"""A third-party backend plugin that makes one mistake, chosen by FRAMEWORK_BUGGY (or the constructor).

It runs the core's reference kernels behind the contract, on the nodes it is told to take (``take``, a
regular expression on node names; the rest it refuses with a verdict), and makes its mistake there:

  shape       the node's result loses its last column (a kernel that writes the wrong shape)
  nan         the node's result holds a NaN
  q8-scale    a product with a Q8_0 weight reads every other block's scale 1/4 too large: finite, plausible,
              wrong (only --verify or the conformance suite notices)
  too-few     the program returns one output fewer than the fragment has
  cache-later from its third run on, a program returns each cache write (SET_ROWS) one column short (its
              first two gave back the caches' own handles, which the executor checks once)
  bool        supports_op answers True instead of a Verdict
  raise       supports_op raises
  buffer      supports_buffer raises
  none        no mistake: a correct plugin

The tests register it through the Registry (tests/test_contract.py), and install it as a
distribution for the CLI (an entry point in a throwaway dist-info on PYTHONPATH).
"""

from __future__ import annotations

import os
import re

import numpy as np

from framework.contract import Device, DeviceType, ReferenceProgram, Verdict, hookimpl

FRAMEWORK_CONTRACT = 1
MISTAKES = ("none", "shape", "nan", "too-few", "cache-later", "bool", "raise", "buffer", "q8-scale")
SCALE_ERROR = 1 / 4


class BuggyProgram(ReferenceProgram):
    def __init__(self, device: BuggyDevice, fragment):
        super().__init__(fragment.nodes, fragment.inputs, fragment.outputs)
        self.mistake = device.mistake
        self.writes = [t.op == "SET_ROWS" for t in fragment.outputs]
        self.runs = 0
        self.wrong = {i for i, n in enumerate(fragment.nodes) if device.take.search(n.name)}
        self.steps = [(self._wrong(fn, fragment.nodes[i]) if i in self.wrong else fn, out, ins)
                      for i, (fn, out, ins) in enumerate(self.steps)]

    def _wrong(self, fn, node):
        if self.mistake == "shape":
            return lambda *a: fn(*a)[..., :-1]
        if self.mistake == "nan":
            def nan(*a):
                out = np.array(fn(*a), copy=True)
                out.reshape(-1)[out.size // 2] = np.nan
                return out
            return nan
        if self.mistake == "q8-scale" and node.op == "MUL_MAT" and node.src[0].dtype.name == "Q8_0":
            def scaled(w, x):           # the even 32-value blocks of each weight row count 1 + SCALE_ERROR times
                even = (np.arange(w.shape[-1]) // 32) % 2 == 0
                return fn(w, x) + SCALE_ERROR * fn(w * even, x)
            return scaled
        return fn

    def run(self, args):
        out = super().run(args)
        self.runs += 1
        if self.mistake == "cache-later" and self.runs > 2:
            return [o[..., :-1] if w else o for o, w in zip(out, self.writes)]
        return out[:-1] if self.mistake == "too-few" else out


class BuggyDevice(Device):
    type = DeviceType.ACCEL
    physical_id = "host-cpu"
    description = "a plugin with one mistake (tests/buggy_plugin.py)"

    def __init__(self, mistake: str | None = None, take: str | None = None, name: str = "buggy:0"):
        self.name = name
        self.mistake = mistake or os.environ.get("FRAMEWORK_BUGGY", "shape")
        self.take = re.compile(take or os.environ.get("FRAMEWORK_BUGGY_TAKE", "^result_output$"))
        if self.mistake not in MISTAKES:
            self.available = False
            self.unavailable_reason = f"FRAMEWORK_BUGGY={self.mistake!r} is not one of {MISTAKES}"

    def supports_op(self, node):
        if self.mistake == "bool":
            return True
        if self.mistake == "raise":
            raise KeyError(node.op)
        if not self.take.search(node.name):
            return Verdict.no("not_taken", f"{self.name} takes only nodes matching {self.take.pattern}")
        return Verdict.yes()

    def supports_buffer(self, buft):
        if self.mistake == "buffer":
            raise AttributeError("'BufferType' object has no attribute 'kind'")
        return super().supports_buffer(buft)

    def compile(self, fragment):
        return BuggyProgram(self, fragment)


@hookimpl
def framework_devices():
    return [BuggyDevice()]
