"""The XDNA device: matrix products with packed weights on the NPU (or its host arm), nothing else.

* ``supports_op``: MUL_MAT whose first operand is a 2-D weight leaf of a type with an exact tile form
  (Q4_0, Q4_1, Q4_K; others only with FRAMEWORK_XDNA_REQUANTIZE=allow) and, on the NPU arm, a GEMM of
  the kernel set for its padded grid; views (free); everything else is refused with the reason, so
  the plan puts the rest of each layer on the next device ("matrix products on the NPU, the rest of
  each layer on the host").
* ``load_weight``: the tensor's tiles from the packed cache (cache.py; packed and stored on first
  use), checked against the shape (geometry.py). NPU arm: written once into a device buffer. Host
  arm: decoded from the tiles once, into float32 (what the NPU kernel reads, in numpy).
* programs (``XdnaProgram``): per submission of the fragment (``fragment.submissions``, cut by the
  plan to ``limits.max_chain``), consecutive independent GEMMs are chained; a chain never holds more
  runs than the limit, and one that depends on a result not yet computed is closed first. NPU arm:
  one pyxrt runlist per chain (xrt.py). Host arm: the same chains, each run a numpy product of the
  bf16-rounded activations with the decoded tiles.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...contract import (
    HOST_BUFFER,
    BufferType,
    Device,
    DeviceType,
    Fragment,
    LeafKind,
    Limits,
    Tensor,
    Verdict,
    host_memory_limit,
    ops,
    settings,
)
from . import tiles
from .cache import PackedStore
from .geometry import tile_grid
from .kernels import KERNELS_ENV, GemmKernel, KernelSet
from .profiles import PROFILES, Profile, get_profile
from .xrt import MAX_CHAIN_ENV, TIMEOUT_ENV, XrtSession

XDNA_TILES = BufferType("xdna_q4_1_tiles")
REQUANTIZE_ENV = "FRAMEWORK_XDNA_REQUANTIZE"     # "allow": requantize weight types without an exact tile form
HOST_ARM_ENV = "FRAMEWORK_XDNA_HOST_ARM"         # "1" (profile xdna2) or a profile name: the host arm
PROFILE_ENV = "FRAMEWORK_XDNA_PROFILE"           # force a profile (an NPU whose PCI id the table lacks)


@dataclass
class XdnaStats:
    runs: int = 0                                   # GEMM runs executed
    chains: Counter = field(default_factory=Counter)   # runs in a chain (runlist) -> chains executed
    weights: dict[str, str] = field(default_factory=dict)   # tensor -> how its tiles were made

    @property
    def longest_chain(self) -> int:
        return max(self.chains, default=0)


@dataclass(eq=False)
class XdnaWeight:
    """A weight held as tiles (buffer type xdna_q4_1_tiles)."""

    name: str
    shape: tuple[int, int]
    grid: Any
    packed: np.ndarray
    source_dtype: str
    conversion: str
    origin: str
    bo: Any = None                         # NPU arm: the device buffer
    kernels: list = field(default_factory=list)   # NPU arm: GEMMs of this grid, smallest m first
    _values: np.ndarray | None = None

    def values(self) -> np.ndarray:
        """float32 (N, K) decoded from the tiles (once)."""
        if self._values is None:
            self._values = tiles.decode(self.packed, self.grid)
        return self._values


class XdnaDevice(Device):
    type = DeviceType.NPU
    buffer_type = HOST_BUFFER               # activations are host arrays (NPU buffers are host memory too)
    weight_buffer_type = XDNA_TILES
    weights_in_programs = False
    profiles = tuple(PROFILES)

    def __init__(self, index: int = 0, *, profile: Profile | str = "xdna2", arm: str = "host",
                 available: bool = True, unavailable_reason: str = "", physical_id: str = "",
                 session: XrtSession | None = None, kernel_set: KernelSet | None = None,
                 max_chain: int | None = None, requantize: bool = False, cache_root: Path | str | None = "default",
                 note: str = "", bf16_activations: bool = True, emulated_profile: bool = False,
                 bad_settings: bool = False):
        if arm not in ("host", "npu"):
            raise ValueError(f"arm must be 'host' or 'npu', not {arm!r}")
        self.index = index
        self.name = f"xdna:{index}"
        self.profile = get_profile(profile) if isinstance(profile, str) else profile
        self.arm = arm
        self.available = available
        self.unavailable_reason = unavailable_reason
        # unavailable because FRAMEWORK_XDNA_* settings are wrong: no profile brings up the host arm in its
        # place, so the settings are mended rather than hidden behind an emulation
        self.bad_settings = bad_settings
        self.session = session
        self.kernel_set = kernel_set
        self.requantize = requantize
        self.bf16_activations = bf16_activations
        self.note = note
        self.cache_root = cache_root
        self.store = PackedStore(cache_root)
        self.stats = XdnaStats()
        if max_chain is not None and not 1 <= max_chain <= self.profile.max_chain:
            raise ValueError(f"max_chain {max_chain} must be between 1 and profile {self.profile.name}'s "
                             f"{self.profile.max_chain}")
        self.chain_setting = max_chain      # what FRAMEWORK_XDNA_MAX_CHAIN or the option asked: kept under any profile
        self.max_chain = max_chain or self.profile.max_chain
        # the host arm computes in host memory, and a Ryzen AI NPU's buffers are host memory too
        self.limits = Limits(max_chain=self.max_chain, memory_bytes=host_memory_limit())
        self.supported_ops = ops.names(*self.profile.ops) | ops.VIEW_OPS    # views are free: they stay with the data
        self.refused_ops = {op: Verdict.no("refused_by_profile", f"profile {self.profile.name} refuses {op}: {why}")
                            for op, why in self.profile.refused_ops.items()}
        if arm == "host":
            self.physical_id = "host-cpu"
            self.emulation = f"{self.profile.name} on the xdna host arm (numpy)"
        else:
            self.physical_id = physical_id
            self.emulation = f"{self.profile.name} (profile applied to another NPU)" if emulated_profile else None
        what = (f"AMD {self.profile.description}" + (f" at {physical_id}" if physical_id and arm == "npu" else ""))
        if arm == "host":
            what = (f"EMULATION: xdna host arm (numpy) executing the packed tiles, limits of profile "
                    f"{self.profile.name} ({self.profile.description})")
        else:
            what += f", {kernel_set.describe()}" if kernel_set else ""
        what += f"; chains of at most {self.max_chain} runs"
        if requantize:
            what += "; requantizes weight types without an exact tile form (lossy)"
        self.description = what + (f"; {note}" if note else "")

    # -- derived devices ----------------------------------------------------------------------------
    def with_options(self, *, profile: str | Profile | None = None, max_chain: int | None = None,
                     requantize: bool | None = None, cache_root: Path | str | None = "keep") -> XdnaDevice:
        """The same device with another profile's limits (an emulation on the NPU arm unless it is the
        hardware's own), another chain limit, requantization or cache folder. Without a usable NPU, a
        profile brings up the host arm in its place (``--device-profile xdna2``), an emulation."""
        prof = get_profile(profile) if isinstance(profile, str) else (profile or self.profile)
        max_chain = self.chain_setting if max_chain is None else max_chain
        if max_chain is not None and max_chain > prof.max_chain:
            raise ValueError(f"{MAX_CHAIN_ENV} (or max_chain) {max_chain} exceeds profile {prof.name}'s limit of "
                             f"{prof.max_chain} runs per chain: it can only lower it")
        if (profile is not None and self.arm == "npu" and not self.available
                and not self.bad_settings):
            root = self.cache_root if cache_root == "keep" else cache_root
            return host_arm_device(self.index, prof.name, why=f"NPU arm unavailable: {self.unavailable_reason}",
                                   max_chain=max_chain, cache_root=root,
                                   requantize=self.requantize if requantize is None else requantize)
        return XdnaDevice(self.index, profile=prof, arm=self.arm, available=self.available,
                          unavailable_reason=self.unavailable_reason, physical_id=self.physical_id,
                          session=self.session, kernel_set=self.kernel_set, max_chain=max_chain,
                          requantize=self.requantize if requantize is None else requantize,
                          cache_root=self.cache_root if cache_root == "keep" else cache_root, note=self.note,
                          bf16_activations=self.bf16_activations,
                          emulated_profile=self.arm == "npu" and prof is not self.profile,
                          bad_settings=self.bad_settings)

    # -- verdicts -----------------------------------------------------------------------------------
    def supports_op(self, node: Tensor) -> Verdict:
        # the framework has applied refused_ops and refused every op outside supported_ops (MUL_MAT, views)
        if ops.is_view(node.op):
            return Verdict.yes()
        w, b = node.src[0], node.src[1]
        if not (w.is_leaf and w.kind == LeafKind.WEIGHT) or len(w.shape) != 2:
            return Verdict.no("unsupported_op", f"xdna multiplies activations by a packed 2-D weight; the first "
                              f"operand of {node.name} is {w.describe()}")
        if w.dtype.name not in tiles.REPACKED_TYPES and not self.requantize:
            return Verdict.no("unsupported_dtype", f"weight type {w.dtype.name} ({w.name}) has no exact tile form; "
                              f"requantizing it to Q4_1 tiles would change results ({REQUANTIZE_ENV}=allow to "
                              f"requantize anyway)")
        if b.dtype.name != "F32":
            return Verdict.no("unsupported_dtype", f"xdna takes F32 activations, not {b.dtype.name} ({b.name})")
        if self.arm == "npu" and self.kernel_set is not None:
            grid = tile_grid(w.shape)
            if not self.kernel_set.for_weight(grid.padded_cols, grid.padded_rows):
                return Verdict.no("unsupported_shape", f"{self.kernel_set.directory} has no GEMM for "
                                  f"k={grid.padded_cols} n={grid.padded_rows} ({w.name} {list(w.shape)}); "
                                  f"it has {self.kernel_set.shapes()}")
        return Verdict.yes()

    # -- memory -------------------------------------------------------------------------------------
    def weight_nbytes(self, tensor: Tensor) -> int:
        return tile_grid(tensor.shape).nbytes if len(tensor.shape) == 2 else tensor.nelements * 4

    def load_weight(self, tensor: Tensor, raw: np.ndarray) -> XdnaWeight:
        if tensor.dtype.name not in tiles.REPACKED_TYPES and not self.requantize:
            raise ValueError(f"{self.name}: weight type {tensor.dtype.name} of '{tensor.name}' has no exact tile form "
                             f"({REQUANTIZE_ENV}=allow to requantize)")
        packed = self.store.load(tensor.name, tensor.dtype, tensor.shape, raw)
        weight = XdnaWeight(tensor.name, tuple(tensor.shape), packed.grid, packed.data, tensor.dtype.name,
                            tiles.describe_conversion(tensor.dtype.name), packed.origin)
        self.stats.weights[tensor.name] = f"{weight.conversion} ({packed.origin})"
        if self.arm == "npu":
            self.session.open()
            grid = tile_grid(tensor.shape)
            weight.kernels = self.kernel_set.for_weight(grid.padded_cols, grid.padded_rows)
            if not weight.kernels:
                raise ValueError(f"{self.name}: no GEMM in {self.kernel_set.directory} for '{tensor.name}' "
                                 f"(padded grid k={grid.padded_cols} n={grid.padded_rows})")
            data = packed.data
            if packed.grid.wider:        # the NPU's GEMMs are per grid: the shape's own one, exactly
                data = tiles.regrid(data, packed.grid, tile_grid(tensor.shape))
            weight.bo = self.session.weight_bo(weight.kernels[0], data)
        return weight

    def to_host(self, handle) -> np.ndarray:
        if isinstance(handle, XdnaWeight):
            return handle.values()
        return np.asarray(handle)

    # -- programs -----------------------------------------------------------------------------------
    def compile(self, fragment: Fragment) -> XdnaProgram:
        for n in fragment.nodes:
            v = self.supports_op(n) if n.op in self.supported_ops else Verdict.no("unsupported_op", "not a GEMM")
            if not v.ok:
                raise ValueError(f"{self.name} cannot compile {n.describe()}: {v.code}: {v.reason}")
        return XdnaProgram(self, fragment)

    def conversions(self) -> str:
        kinds: dict[str, int] = {}
        for how in self.stats.weights.values():
            kinds[how] = kinds.get(how, 0) + 1
        return "; ".join(f"{n} x {how}" for how, n in kinds.items())

    def describe(self) -> str:
        return super().describe() + (f" [EMULATION of {self.emulation}]" if self.emulation else "")


# -- programs ------------------------------------------------------------------------------------------
@dataclass
class Gemm:
    node: Tensor
    weight: int          # slot of the weight handle
    src: int             # slot of the activations
    out: int


@dataclass
class View:
    node: Tensor
    fn: Any
    src: int
    out: int


class XdnaProgram:
    """A fragment of GEMMs (and free views) as chains of runs, one chain per runlist."""

    def __init__(self, device: XdnaDevice, fragment: Fragment):
        self.device = device
        self.fragment = fragment
        slots = {id(t): i for i, t in enumerate(fragment.inputs)}
        self.n_args = len(fragment.inputs)
        self.steps: list[Gemm | View] = []
        for n in fragment.nodes:
            slots[id(n)] = len(slots)
            if n.op == "MUL_MAT":
                self.steps.append(Gemm(n, slots[id(n.src[0])], slots[id(n.src[1])], slots[id(n)]))
            else:
                self.steps.append(View(n, ops.bind(n), slots[id(n.src[0])], slots[id(n)]))
        self.n_slots = len(slots)
        self.out_slots = [slots[id(t)] for t in fragment.outputs]
        self.arm = NpuArm(device) if device.arm == "npu" else HostArm(device)

    def run(self, args: list) -> list:
        vals = list(args) + [None] * (self.n_slots - self.n_args)
        limit = self.device.max_chain
        for start, end in self.fragment.submissions or [(0, len(self.steps))]:
            chain: list[Gemm] = []          # the open chain: independent products, at most `limit`
            for step in self.steps[start:end]:
                pending = {g.out for g in chain}
                if isinstance(step, View):
                    if step.src in pending:
                        self._flush(chain, vals, limit)
                    vals[step.out] = step.fn(vals[step.src])
                    continue
                if step.src in pending or len(chain) == limit:
                    self._flush(chain, vals, limit)
                chain.append(step)
            self._flush(chain, vals, limit)
        return [vals[i] for i in self.out_slots]

    def _flush(self, chain: list[Gemm], vals: list, limit: int) -> None:
        """Run the open chain as one runlist (the arm may cut a product into several runs, never past
        the limit), store its results, and start a new chain."""
        if chain:
            results = self.arm.run_chain([(g, vals[g.weight], vals[g.src]) for g in chain], limit)
            for g, value in zip(chain, results):
                vals[g.out] = value
            chain.clear()


def _rows(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b, dtype=np.float32).reshape(-1, b.shape[-1])


class HostArm:
    """The NPU kernel's arithmetic in numpy: activations rounded to bfloat16, weights decoded from the
    very tiles the NPU would read, products accumulated in float32."""

    def __init__(self, device: XdnaDevice):
        self.device = device

    def run_chain(self, items: list[tuple[Gemm, XdnaWeight, np.ndarray]], limit: int) -> list[np.ndarray]:
        if len(items) > limit:
            raise ValueError(f"{self.device.name}: internal error: a chain of {len(items)} runs exceeds {limit}")
        out = []
        for g, w, b in items:
            x = _rows(b)
            if self.device.bf16_activations:
                x = tiles.round_bf16(x)
            values = w.values()
            y = (values @ x[0])[None, :] if x.shape[0] == 1 else x @ values.T
            out.append(y.reshape(b.shape[:-1] + (values.shape[0],)))
        self.device.stats.runs += len(items)
        self.device.stats.chains[len(items)] += 1
        return out


class NpuArm:
    """GEMMs on the NPU through xrt.py. A GEMM of T rows runs as ceil(T / m) runs of the kernel set's
    m; runs are chained into runlists of at most ``limit`` runs, one hardware context per runlist."""

    def __init__(self, device: XdnaDevice):
        self.device = device
        self.session: XrtSession = device.session

    @staticmethod
    def plan_rows(t: int, kernels: list[GemmKernel]) -> list[tuple[int, int, GemmKernel]]:
        """(row start, rows, kernel) covering t rows: the largest m while more rows remain than it holds,
        then the smallest m that holds the rest (padded with zero rows)."""
        out, start = [], 0
        largest = kernels[-1]
        while start < t:
            left = t - start
            k = next((e for e in kernels if e.m >= left), largest)
            rows = min(left, k.m)
            out.append((start, rows, k))
            start += rows
        return out

    def run_chain(self, items: list[tuple[Gemm, XdnaWeight, np.ndarray]], limit: int) -> list[np.ndarray]:
        s = self.session
        runs: list[tuple[int, int, int, GemmKernel]] = []      # (item, row start, rows, kernel)
        xs = []
        for i, (g, w, b) in enumerate(items):
            x = _rows(b)
            xs.append(x)
            for start, rows, k in self.plan_rows(x.shape[0], w.kernels):
                runs.append((i, start, rows, k))
        results = [np.empty((x.shape[0], items[i][1].shape[0]), dtype=np.float32) for i, x in enumerate(xs)]
        # runlists: at most `limit` runs, one hardware context each
        batches: list[list] = []
        for r in runs:
            ctx = s.loaded[r[3]].context
            if not batches or len(batches[-1]) == limit or s.loaded[batches[-1][0][3]].context is not ctx:
                batches.append([])
            batches[-1].append(r)
        for batch in batches:
            made, used = [], {}
            for i, start, rows, k in batch:
                w = items[i][1]
                a = np.zeros((k.m, k.k), dtype=np.uint16)
                a[:rows, :w.shape[1]] = tiles.to_bf16(xs[i][start:start + rows])
                slot = used.get(k, 0)
                used[k] = slot + 1
                run, bo_c, ctx = s.make_run(k, a, w.bo, slot)
                made.append((run, bo_c, i, start, rows, k))
            names = ", ".join(dict.fromkeys(items[i][0].node.name for _, _, i, _, _, _ in made))
            s.execute([m[0] for m in made], s.loaded[batch[0][3]].context, limit, f"GEMMs {names}")
            for run, bo_c, i, start, rows, k in made:
                c = s.result(k, bo_c)
                results[i][start:start + rows] = c[:rows, :items[i][1].shape[0]]
            self.device.stats.runs += len(batch)
            self.device.stats.chains[len(batch)] += 1
        return [r.reshape(b.shape[:-1] + (r.shape[1],)) for r, (_, _, b) in zip(results, items)]


# -- configuration ----------------------------------------------------------------------------------------
@dataclass
class Config:
    kernels: str | None = None
    max_chain: int | None = None
    host_arm: str | None = None          # profile name for the host arm, None: NPU arm only
    profile: str | None = None
    requantize: bool = False
    timeout_ms: int | None = None
    problems: list[str] = field(default_factory=list)


def _host_arm(text: str) -> str | None:
    if text.lower() in ("0", "off", "no"):
        return None
    name = "xdna2" if text.lower() in ("1", "yes", "on") else text
    get_profile(name)                   # UnknownProfileError (a ValueError) lists the profiles
    return name


def _profile(text: str) -> str:
    get_profile(text)
    return text


settings.declare(KERNELS_ENV, "xdna", "a folder holding a kernel set (kernels.json)", None,
                 "the GEMM kernel set (xclbin or ELF and instruction streams) for the NPU arm", str)
settings.declare(MAX_CHAIN_ENV, "xdna", "a positive whole number", None,
                 "runs one runlist may chain (lowers the profile's limit)", settings.whole(1))
settings.declare(TIMEOUT_ENV, "xdna", "a positive whole number of milliseconds", None,
                 "how long a runlist may run before it is an error", settings.whole(1))
settings.declare(HOST_ARM_ENV, "xdna", "1, yes or on (profile xdna2), 0, no or off, or a profile name", None,
                 "the host arm (numpy in place of the NPU), an EMULATION", _host_arm)
settings.declare(PROFILE_ENV, "xdna", "a profile name (xdna, xdna2)", None,
                 "force a profile (an NPU whose PCI id the table lacks)", _profile)
settings.declare(REQUANTIZE_ENV, "xdna", "'allow' or 'refuse'", "refuse",
                 "requantize weight types without an exact tile form (lossy)", settings.choice(("allow", "refuse")))


def _setting(env, key: str, problems: list[str]):
    """A setting's value; None (and a problem) when malformed."""
    try:
        return settings.read(key, env)
    except settings.SettingError as e:
        problems.append(str(e))
        return None


def read_config(env: dict | None = None) -> Config:
    """The plugin's settings from the environment; a malformed value is a problem (the device is then
    unavailable and says which)."""
    c = Config()
    c.kernels = _setting(env, KERNELS_ENV, c.problems)
    c.max_chain = _setting(env, MAX_CHAIN_ENV, c.problems)
    c.host_arm = _setting(env, HOST_ARM_ENV, c.problems)
    c.profile = _setting(env, PROFILE_ENV, c.problems)
    c.requantize = _setting(env, REQUANTIZE_ENV, c.problems) == "allow"
    timeout = _setting(env, TIMEOUT_ENV, c.problems)
    if timeout is not None:
        c.timeout_ms = timeout
    if c.max_chain is not None:
        limit = get_profile(c.profile or c.host_arm or "xdna").max_chain if not c.problems else None
        if limit is not None and c.max_chain > limit:
            c.problems.append(f"{MAX_CHAIN_ENV}={c.max_chain} exceeds the profile's limit of {limit} runs per chain "
                              f"(it can only lower it)")
    return c


def host_arm_device(index: int = 0, profile: str = "xdna2", *, why: str = "", config: Config | None = None,
                    **kwargs) -> XdnaDevice:
    """The host arm: the plugin's packing, geometry checks, runlist construction and chunking with numpy
    in place of the NPU. An emulation, labelled as such everywhere."""
    config = config or Config()
    opts = {"max_chain": config.max_chain, "requantize": config.requantize}
    opts.update(kwargs)
    return XdnaDevice(index, profile=profile, arm="host", note=why, **opts)


__all__ = [
    "XDNA_TILES",
    "Config",
    "HostArm",
    "NpuArm",
    "XdnaDevice",
    "XdnaProgram",
    "XdnaWeight",
    "host_arm_device",
    "read_config",
]
