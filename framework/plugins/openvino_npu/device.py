"""OpenVINO devices (openvino:CPU, openvino:GPU, openvino:NPU, ...) and their programs.

Scheme (see the package docstring for the whole story):
  * ``weights_in_programs = True``: a fragment's weights are folded into its ov.Model as compressed
    constants. ``load_weight`` repacks the GGUF bytes once (weights.py) and returns an ``OvWeight``;
    the device remembers (weakly) which tensor each handle belongs to, so ``compile(fragment)``,
    which only receives the fragment, finds its weights and compiles at once (the executor loads a
    plan's weights before it compiles). If a handle is missing the program compiles at its first
    ``run``, from the weight handles that arrive as arguments.
  * One compiled model per distinct ``fragment.program`` (structure, shapes and weight names): the
    executor caches programs by that key, and reservation counts them against the device's budget.
  * OpenVINO's on-disk model cache (CACHE_DIR) is on: a second run of the same model imports every
    compiled model instead of compiling it; ``stats`` and ``report_line()`` say which happened.
  * The KV cache: ``alloc`` returns a float32 numpy array owned by the device. On openvino:CPU host
    memory is the device's memory: the model reads the ``n_kv`` window of the cache through a
    zero-copy input, and the program writes the step's new rows into the array in place after the
    run. Nothing is copied through another buffer. (On a GPU or NPU the same program would send the
    window to the device at every step: state variables or remote tensors would be needed there; no
    such device exists here to build and test them on.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    release_file_pages,
    settings,
)
from . import kv_programs
from . import weights as W
from .options import (AUTO, CACHE_MAX_ENV, DYNQUANT, DYNQUANT_ENV, PRECISION_ENV, PROFILE_ENV, CompileSettings,
                      onednn_cap, read_settings)
from .kv_programs import DynamicKVError, Family, family_key, kv_length
from .profiles import PROFILES, Profile, get_profile, profile_for_architecture
from .rope import rope_table

if TYPE_CHECKING:
    from .translate import Translation

OV_WEIGHT_BUFFER = BufferType("openvino_compressed_weights", host=True)
# the ops translate_ops.TRANSLATE translates (declared here: this module imports without OpenVINO)
SUPPORTED_OPS = ops.names("GET_ROWS", "MUL_MAT", "ADD", "MUL", "SCALE", "UNARY", "GLU", "RMS_NORM", "SOFT_MAX",
                          "FLASH_ATTN_EXT", "ROPE", "SET_ROWS", "VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "CONT",
                          "CONCAT")
# Limits.exact_rows is left at 0 (not declared): on openvino:CPU a row's logits in a step of several rows differ from a
# one-row step's (by tenths of a logit with 8-bit activations, 1e-4 without: other kernels for several rows), so
# speculative decoding on OpenVINO needs --draft-inexact (docs/speculative.md)
TYPES = {"CPU": DeviceType.CPU, "GPU": DeviceType.GPU, "NPU": DeviceType.NPU}


_CORE = None
_CORE_LOCK = threading.Lock()
# compiled models alive per OpenVINO device (hardware, and the profile it emulates if any), over every
# OpenVinoDevice object and session of the process: an NPU driver's budget is per process
_LIVE: dict[tuple[str, str | None], int] = {}


def core():
    global _CORE
    with _CORE_LOCK:
        if _CORE is None:
            import openvino as ov
            _CORE = ov.Core()
        return _CORE


@dataclass
class CompileStats:
    compiled: int = 0             # compiled from scratch
    from_cache: int = 0           # imported from the on-disk cache
    seconds: float = 0.0          # compile_model time, both kinds
    build_seconds: float = 0.0    # building the ov.Model (translation)
    shared: int = 0               # programs run on a compiled model of their family (kv_programs.py)
    per_length: dict = field(default_factory=dict)   # why a family keeps a model per KV length -> programs
    live: int = 0                 # compiled models alive now


class OpenVinoDevice(Device):
    """One OpenVINO device. ``ov_name`` is OpenVINO's own name ("CPU", "GPU.0", "NPU")."""

    weights_in_programs = True
    weight_buffer_type = OV_WEIGHT_BUFFER
    profiles = tuple(PROFILES)
    supported_ops = SUPPORTED_OPS

    def __init__(self, ov_name: str, *, available: bool = True, unavailable_reason: str = "",
                 full_name: str = "", physical_id: str = "", architecture: str = "",
                 profile: Profile | None = None, emulated: bool = False, refuse: dict[str, str] | None = None,
                 cache_dir: Path | None | str = "default", precision: str | None = None, bits: int | None = None,
                 dynamic_quantization: int | str | None = None, threads: int | None = None):
        self.ov_name = ov_name
        self.name = f"openvino:{ov_name}"
        self.hardware = TYPES.get(ov_name.split(".")[0], DeviceType.ACCEL)    # its buffers, threads, settings
        self.available = available
        self.unavailable_reason = unavailable_reason
        self.physical_id = physical_id
        self.architecture = architecture
        self.full_name = full_name
        self.buffer_type = HOST_BUFFER if self.hardware == DeviceType.CPU else BufferType(f"openvino_{ov_name}")
        self.profile = profile
        self.emulation = profile.name if (profile and emulated) else None
        self.type = DeviceType.NPU if self.emulation else self.hardware   # every profile is an NPU's (alias npu)
        # a compiled model per step shape: without a profile's static shapes, a step's rows come padded to a
        # few sizes (Limits.padded_rows), so new mixes of requests reuse models rather than compile more
        self.limits = profile.limits if profile else Limits(padded_rows=True)
        if self.hardware in (DeviceType.CPU, DeviceType.NPU) and self.limits.memory_bytes is None:
            # the CPU, and Intel's NPUs, compute in host memory
            self.limits = dataclasses.replace(self.limits, memory_bytes=host_memory_limit())
        self.refused = {**(profile.refused_ops if profile else {}), **(refuse or {})}
        self.refused_ops = {op: Verdict.no("refused_by_profile", f"{self._refuser(op)} refuses {op}: {why}")
                            for op, why in self.refused.items()}
        self.compiling = CompileSettings(self.name, self.hardware, cache_dir, precision, bits, dynamic_quantization,
                                         threads)
        self.stats = CompileStats()
        self._loaded: dict[int, tuple[str, Any]] = {}       # id(tensor) -> (name, weakref to OvWeight)
        self.families: weakref.WeakValueDictionary = weakref.WeakValueDictionary()   # kv_programs: key -> Family
        self.first_length: dict = {}            # kv_programs: key -> (KV length, the programs on its fixed model)
        self.fixed_only: dict = {}              # kv_programs: key -> why its translation refused a dynamic KV length
        self._model_of: dict = {}               # programs_nbytes: (program, weights, shared) -> (model key, bytes)
        self._rope_cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        what = f"OpenVINO {ov_name}" + (f" ({full_name})" if full_name else "")
        if profile:
            what += (f", EMULATION of {profile.name} ({profile.description})" if emulated
                     else f", profile {profile.name} ({profile.description})")
        self.description = what + self.compiling.words()

    # -- derived devices ----------------------------------------------------------------------------
    def with_options(self, *, profile: str | Profile | None = None, refuse: dict[str, str] | None = None,
                     cache_dir: Path | None | str = "keep", precision: str | None = None,
                     bits: int | None = None, max_live_programs: int | None = None,
                     dynamic_quantization: int | str | None = None, threads: int | None = None) -> OpenVinoDevice:
        """A device on the same hardware with a profile applied (an emulation unless the hardware is
        that NPU), extra refusals, another cache folder, precision hint, weight packing,
        DYNAMIC_QUANTIZATION_GROUP_SIZE or thread count.
        ``max_live_programs`` changes the profile's budget; the profile's name then says so."""
        prof = get_profile(profile) if isinstance(profile, str) else (profile or self.profile)
        c = self.compiling
        if max_live_programs is not None:
            if prof is None:
                raise ValueError("max_live_programs needs a profile")
            prof = dataclasses.replace(prof, name=f"{prof.name}[max_live_programs={max_live_programs}]",
                                       limits=dataclasses.replace(prof.limits, max_live_programs=max_live_programs))
        emulated = prof is not None and not (self.hardware == DeviceType.NPU and self.profile is prof
                                             and self.emulation is None)
        return OpenVinoDevice(self.ov_name, available=self.available, unavailable_reason=self.unavailable_reason,
                              full_name=self.full_name, physical_id=self.physical_id,
                              architecture=self.architecture, profile=prof, emulated=emulated,
                              refuse={**{k: v for k, v in self.refused.items()
                                         if not (self.profile and k in self.profile.refused_ops)}, **(refuse or {})},
                              cache_dir=c.cache_dir if cache_dir == "keep" else cache_dir,
                              precision=precision or c.precision, bits=bits or c.bits,
                              dynamic_quantization=(c.dynamic_quantization if dynamic_quantization is None
                                                    else dynamic_quantization),
                              threads=c.threads if threads is None else threads)

    # -- verdicts -----------------------------------------------------------------------------------
    def _refuser(self, op: str) -> str:
        return f"profile {self.profile.name}" if self.profile and op in self.profile.refused_ops else self.name

    def supports_op(self, node: Tensor) -> Verdict:
        if node.op == "ROPE" and len(node.src) > 2:
            return Verdict.no("unsupported_op", f"{self.name} computes rope tables from positions alone; ROPE with "
                                                f"frequency factors ({node.src[2].name}) is not translated")
        if node.op == "SET_ROWS":
            dst = node.src[0]
            if not (dst.is_leaf and dst.kind == LeafKind.CACHE):
                return Verdict.no("unsupported_op", f"{self.name} writes rows only into a pre-allocated cache, "
                                                    f"not into {dst.describe()}")
            if dst.dtype.name != "F32":
                return Verdict.no("unsupported_dtype", f"{self.name} keeps caches in F32, not {dst.dtype.name}")
        for s in node.src:
            if not s.is_leaf or s.kind == LeafKind.WEIGHT:
                continue
            if s.dtype.name not in ("F32", "I32"):
                return Verdict.no("unsupported_dtype", f"{self.name} takes F32 and I32 inputs, not "
                                                       f"{s.dtype.name} ({s.name})")
        return Verdict.yes()

    # -- memory -------------------------------------------------------------------------------------
    def weight_nbytes(self, tensor: Tensor) -> int:
        return W.nbytes_for(tensor.dtype, tensor.shape, self.compiling.bits)

    def load_weight(self, tensor: Tensor, raw: np.ndarray) -> W.OvWeight:
        handle = W.load(tensor.name, tensor.dtype, tensor.shape, raw, self.compiling.bits)
        self._loaded[id(tensor)] = (tensor.name, weakref.ref(handle))
        release_file_pages(raw)
        return handle

    def alloc(self, tensor: Tensor) -> np.ndarray:
        return np.zeros(tensor.shape, dtype=np.float32 if tensor.dtype.name == "F32" else np.int32)

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return array

    def to_host(self, handle) -> np.ndarray:
        if isinstance(handle, W.OvWeight):
            return W.values(handle)
        return np.asarray(handle)

    def _weights_of(self, fragment: Fragment) -> dict[int, W.OvWeight] | None:
        out = {}
        for t in fragment.inputs:
            if t.is_leaf and t.kind == LeafKind.WEIGHT:
                entry = self._loaded.get(id(t))
                handle = entry[1]() if entry and entry[0] == t.name else None
                if handle is None or tuple(handle.shape) != tuple(t.shape):
                    return None
                out[id(t)] = handle
        return out

    # -- programs -----------------------------------------------------------------------------------
    def compile(self, fragment: Fragment) -> OvProgram:
        program = OvProgram(self, fragment)
        weights = self._weights_of(fragment)
        if weights is not None:
            program.build(weights)
        return program

    def compile_config(self) -> dict:
        """OpenVINO's compile properties (CompileSettings.config): every program and the settings probe compile
        with what this returns, so a subclass may add a property of its own."""
        return self.compiling.config()

    def rope(self, pos: np.ndarray, rope: tuple) -> tuple[np.ndarray, np.ndarray]:
        key = (pos.tobytes(), rope)
        table = self._rope_cache.get(key)
        if table is None:
            if len(self._rope_cache) > 64:
                self._rope_cache.clear()
            table = self._rope_cache[key] = rope_table(pos, rope)
        return table

    def programs_nbytes(self, fragments: list[Fragment]) -> int:
        """Each compiled model holds its own repacked copy of the weights it reads: 1.05-2.5x the weights as this
        plugin holds them, measured (docs/openvino.md, "One model for every KV length"); counted here at 1x,
        once a model: the fragments of one KV family (kv_programs) share a model, any other fragment has one."""
        shared = kv_programs.enabled(self.hardware == DeviceType.CPU, self.limits.static_shapes)
        return sum(dict(self._model(f, shared) for f in fragments).values())

    def _model(self, f: Fragment, shared: bool) -> tuple[tuple, int]:
        """(the key of the compiled model a fragment runs on, its weights' bytes), once a program key and its
        weight objects (the key names the weights; two models may name theirs alike): a server reserving a new
        step shape checks every kept one again."""
        weights = [t for t in f.inputs if t.is_leaf and t.kind == LeafKind.WEIGHT]
        ids = tuple(id(t) for t in weights)
        if (f.program, ids, shared) not in self._model_of:
            kv = kv_length(f) if shared else None
            key = (family_key(f, kv), ids) if kv is not None else (f.program, ids)
            self._model_of[f.program, ids, shared] = (key, sum(self.weight_nbytes(t) for t in weights))
        return self._model_of[f.program, ids, shared]

    def live_programs(self) -> int:
        return _LIVE.get(self._live_key, 0)

    @property
    def _live_key(self) -> tuple[str, str | None]:
        return (self.ov_name, self.emulation)

    def report_line(self) -> str:
        return self.compile_summary()

    def compile_summary(self) -> str:
        return self.compiling.summary(self.stats)

    def describe(self) -> str:
        return super().describe() + (f" [EMULATION of {self.emulation}]" if self.emulation else "")


class OvProgram:
    """A fragment as one compiled model, with the feeding of its inputs and the cache writes. Fragments of one
    family (kv_programs.py: the same step at other KV lengths) run on one compiled model, each feeding its own
    window of the cache: the first KV length met on a model of fixed shapes, and from the second on, every
    length (the first's programs too) on one model whose KV length is dynamic."""

    def __init__(self, device: OpenVinoDevice, fragment: Fragment):
        self.device = device
        self.fragment = fragment
        self.family: Family | None = None
        self.kv: int | None = None

    @property
    def translation(self) -> Translation | None:
        return self.family.translation if self.family else None

    @property
    def loaded_from_cache(self) -> bool:
        return bool(self.family and self.family.loaded_from_cache)

    # the compiled model, its request and settings: the family's (None before the first build)
    compiled = property(lambda self: self.family and self.family.compiled)
    request = property(lambda self: self.family and self.family.request)
    effective = property(lambda self: self.family and self.family.effective)
    requested = property(lambda self: self.family and self.family.requested)

    def build(self, weights: dict[int, W.OvWeight]) -> None:
        dev = self.device
        kv = kv_length(self.fragment) if kv_programs.enabled(dev.hardware == DeviceType.CPU,
                                                             dev.limits.static_shapes) else None
        key = None
        if kv is not None:      # the weights' objects, not their names: two models may name theirs alike
            key = (family_key(self.fragment, kv), tuple(id(weights[id(t)]) for t in self.fragment.inputs
                                                        if id(t) in weights))
        self.kv = kv
        if key is None:
            self.family = self._compile(weights, None)
            return
        if key in dev.families:                 # the model of every KV length, made already
            self.family = dev.families[key]
            dev.stats.shared += 1
            return
        length, refs = dev.first_length.get(key, (None, []))
        first = [p for r in refs if (p := r()) is not None]
        if first and length == kv:              # the first KV length met again (another session's step)
            self.family = first[0].family
            refs.append(weakref.ref(self))
            dev.stats.shared += 1
        elif not first:                         # the family's first KV length: a model of fixed shapes, the fastest
            self.family = self._compile(weights, None)
            dev.first_length[key] = (kv, [weakref.ref(self)])
        elif key in dev.fixed_only:             # its translation keeps the window's rows: a model per length
            self._per_length(weights, dev.fixed_only[key])
        else:                                   # a second KV length: one model for every length, the first's too
            try:
                self.family = dev.families[key] = self._compile(weights, kv)
            except DynamicKVError as e:
                dev.fixed_only[key] = str(e)
                self._per_length(weights, str(e))
                return
            for p in first:
                p.family = self.family
            dev.stats.shared += len(first)
            del dev.first_length[key]

    def _per_length(self, weights: dict[int, W.OvWeight], why: str) -> None:
        """A model of fixed shapes for this KV length, counted with the reason (compile_summary says it)."""
        self.family = self._compile(weights, None)
        per = self.device.stats.per_length
        per[why] = per.get(why, 0) + 1

    def _compile(self, weights: dict[int, W.OvWeight], kv: int | None) -> Family:
        dev = self.device
        budget = dev.limits.max_live_programs
        if budget is not None and dev.live_programs() >= budget:
            emu = f" (EMULATION of {dev.emulation})" if dev.emulation else ""
            raise RuntimeError(f"{dev.name}{emu} already holds {dev.live_programs()} live compiled models in this "
                               f"process, its budget is {budget}: reservation should have refused this plan")
        t0 = time.perf_counter()
        from .translator import translate      # OpenVINO's opsets: imported once a model is built
        translation = translate(self.fragment, weights, kv)
        t1 = time.perf_counter()
        blobs = dev.compiling.blob_cache()
        requested = dev.compiling.requested(weights.values())
        config = dev.compile_config()
        if dev.compiling.dynamic_quantization == AUTO:       # this model's own group size
            config[DYNQUANT] = requested[DYNQUANT]
        try:
            with blobs.compiling() if blobs else contextlib.nullcontext():
                compiled = core().compile_model(translation.model, dev.ov_name, config)
        except RuntimeError as e:
            if requested.get(DYNQUANT) and "primitive descriptor" in str(e):
                cap = onednn_cap()
                raise RuntimeError(f"{e}\n{dev.name} asked for DYNAMIC_QUANTIZATION_GROUP_SIZE "
                                   f"{requested[DYNQUANT]} ({DYNQUANT_ENV}), which OpenVINO {_version()} could "
                                   f"not compile here"
                                   + (f" with oneDNN capped at ONEDNN_MAX_CPU_ISA={cap}" if cap else "")
                                   + f"; {DYNQUANT_ENV}=0 compiles on every CPU") from e
            raise
        t2 = time.perf_counter()
        if dev.compiling.cache_dir is not None:
            trim_cache(dev.compiling.cache_dir)
        try:
            from_cache = bool(compiled.get_property("LOADED_FROM_CACHE"))
        except Exception:   # noqa: BLE001 - a plugin without the property: not from a cache
            from_cache = False
        family = Family(translation, compiled, effective_settings(compiled), requested, from_cache,
                        list(weights.values()))
        self._check_settings(family)
        st = dev.stats
        st.build_seconds += t1 - t0
        st.seconds += t2 - t1
        if from_cache:
            st.from_cache += 1
        else:
            st.compiled += 1
        st.live += 1
        _LIVE[dev._live_key] = _LIVE.get(dev._live_key, 0) + 1
        weakref.finalize(family, _dead, weakref.ref(dev), dev._live_key)
        translation.model = None       # the compiled model keeps what it needs
        return family

    def _check_settings(self, family: Family) -> None:
        """Every requested setting must be the compiled model's (a model imported from the on-disk cache
        included): a CPU plugin that overrode one would change results without a word."""
        dev = self.device
        if dev.hardware != DeviceType.CPU:
            return
        wrong = {k: (v, family.effective.get(k)) for k, v in family.requested.items()
                 if str(family.effective.get(k)) != str(v)}
        if wrong:
            said = "; ".join(f"{k}: requested {want}, compiled model has {got}" for k, (want, got) in wrong.items())
            envs = " or ".join(SETTING_ENV[k] for k in wrong if k in SETTING_ENV)
            cached = " (imported from the on-disk cache)" if family.loaded_from_cache else ""
            raise RuntimeError(f"{dev.name} compiled {self.fragment.describe()}{cached} with other settings than "
                               f"requested ({said}): OpenVINO {_version()} does not apply them on this CPU; set {envs} "
                               f"to a value it supports here")

    def run(self, args: list) -> list:
        if self.family is None:
            weights = {id(t): a for t, a in zip(self.fragment.inputs, args)
                       if t.is_leaf and t.kind == LeafKind.WEIGHT}
            self.build(weights)
        family = self.family
        tr = family.translation
        feeds = []
        for f in tr.feeds:
            a = args[f.index]
            if f.kind == "arg":
                feeds.append(np.ascontiguousarray(a))
            elif f.kind in ("window", "kv_window"):
                feeds.append(a[:f.rows if f.kind == "window" else self.kv])
            else:
                cos, sin = self.device.rope(np.asarray(a), f.rope)
                feeds.append(cos if f.kind == "rope_cos" else sin)
        with family.lock:           # one infer request for the family: a run reads its outputs before the next
            req = family.request
            req.infer(feeds, share_inputs=True)
            outs = [req.get_output_tensor(i).data for i in range(family.n_out)]
            return [self._result(o, outs, args) for o in tr.outputs]

    def _result(self, o: tuple, outs: list, args: list):
        """A fragment output: a value copied out of the request, or the cache with the step's new rows written."""
        if o[0] == "value":
            return np.array(outs[o[1]], copy=True)
        _, cache_arg, new_idx, rows_arg, rows_idx = o
        cache = args[cache_arg]
        rows = np.asarray(args[rows_arg] if rows_arg is not None else outs[rows_idx])
        if rows.size and (rows.min() < 0 or rows.max() >= cache.shape[0]):
            raise IndexError(f"cache rows {rows.min()}..{rows.max()} are outside the {cache.shape[0]} rows of "
                             f"'{self.fragment.inputs[cache_arg].name}'")
        cache[rows] = outs[new_idx].reshape(rows.shape[0], -1)
        return cache


SETTING_ENV = {"INFERENCE_PRECISION_HINT": PRECISION_ENV, "DYNAMIC_QUANTIZATION_GROUP_SIZE": DYNQUANT_ENV}
SETTINGS_READ_BACK = ("INFERENCE_PRECISION_HINT", "DYNAMIC_QUANTIZATION_GROUP_SIZE", "KV_CACHE_PRECISION",
                      "INFERENCE_NUM_THREADS", "EXECUTION_MODE_HINT")


def _version() -> str:
    import openvino as ov
    return ov.get_version().split("-")[0]


def effective_settings(compiled) -> dict[str, Any]:
    """The settings a compiled model runs with, as OpenVINO reports them (types as "f32", "u8")."""
    out: dict[str, Any] = {}
    for name in SETTINGS_READ_BACK:
        try:
            value = compiled.get_property(name)
        except RuntimeError:        # a device without the property
            continue
        out[name] = value.get_type_name() if hasattr(value, "get_type_name") else (
            value if isinstance(value, (int, float, bool)) else str(value))
    return out


def trim_cache(folder: Path, max_bytes: int | None = None) -> None:
    """Keep OpenVINO's cache folder under FRAMEWORK_OPENVINO_CACHE_MAX_GB (default 4): a compiled model's
    blob holds its weights, so every distinct shape of a model adds about the model's size. The least
    recently used blobs (by access time) go first."""
    if max_bytes is None:
        max_bytes = int(settings.read(CACHE_MAX_ENV) * 2**30)
    try:
        blobs = [(p.stat().st_atime, p.stat().st_size, p) for p in folder.glob("*.blob")]
    except OSError:
        return
    total = sum(size for _, size, _ in blobs)
    for _, size, p in sorted(blobs):
        if total <= max_bytes:
            break
        try:
            p.unlink()
            total -= size
        except OSError:
            pass


def _dead(dev_ref, live_key: tuple) -> None:
    _LIVE[live_key] -= 1
    dev = dev_ref()
    if dev is not None:
        dev.stats.live -= 1


# -- what the numerics depend on (the CPU's instruction sets: options.py) --------------------------------
def probe_settings(dev: OpenVinoDevice) -> tuple[dict[str, Any], str]:
    """Compile and run a small compressed product with the device's config: the settings the compiled model
    reports, and the kernel OpenVINO's profiler names for the product (its instruction set shows there)."""
    import openvino as ov
    from openvino import opset13 as ops
    x = ops.parameter([1, 64], ov.Type.f32, name="x")
    codes = ops.convert(ops.constant(np.ones((16, 2, 32), dtype=np.int8), ov.Type.i4), ov.Type.f32)
    w = ops.reshape(ops.multiply(codes, ops.constant(np.full((16, 2, 1), 0.5, dtype=np.float32))),
                    ops.constant(np.array([16, 64], dtype=np.int64)), False)
    cfg = {**dev.compile_config(), "PERF_COUNT": True}
    cfg.pop("CACHE_DIR", None)
    compiled = core().compile_model(ov.Model([ops.matmul(x, w, False, True)], [x]), dev.ov_name, cfg)
    request = compiled.create_infer_request()
    request.infer([np.ones((1, 64), dtype=np.float32)])
    kernels = sorted({f"{i.node_type} {i.exec_type}" for i in request.get_profiling_info()
                      if i.node_type.startswith("FullyConnected")})
    return effective_settings(compiled), ", ".join(kernels) or "no FullyConnected kernel"


def settings_report() -> list[str]:
    """Lines for a test report: OpenVINO's CPU defaults on this machine, what openvino:CPU requests, and what
    a model compiled with its config reports."""
    import openvino as ov
    c = core()
    defaults = {k: _prop(c, "CPU", k) for k in SETTINGS_READ_BACK[:3]}
    defaults = {k: v.get_type_name() if hasattr(v, "get_type_name") else v for k, v in defaults.items()}
    dev = OpenVinoDevice("CPU", cache_dir=None)
    effective, kernels = probe_settings(dev)
    requested = (f"openvino:CPU requests {dev.compiling.requested()}; a compiled model reports {effective} and "
                 f"runs a compressed product with {kernels}")
    return [f"openvino {ov.get_version()}: CPU plugin defaults here {defaults}", requested]


# -- discovery ------------------------------------------------------------------------------------------
def _prop(c, dev: str, name: str):
    try:
        return c.get_property(dev, name)
    except RuntimeError:        # OpenVINO's answer for a property this device does not have
        return None


def _pci(c, dev: str) -> str:
    info = _prop(c, dev, "DEVICE_PCI_INFO")
    if info is None:
        return ""
    try:
        return f"{info.domain:04x}:{info.bus:02x}:{info.device:02x}.{info.function:x}"
    except (AttributeError, TypeError, ValueError):
        return str(info)


def _npu_absent_reason(c, version: str) -> str:
    try:
        found = list(c.get_property("NPU", "AVAILABLE_DEVICES"))
        plugin = "OpenVINO's NPU plugin loaded but found no NPU"
        if found:
            return f"OpenVINO's NPU plugin lists {found} but the core does not offer them"
    except RuntimeError as e:
        plugin = f"OpenVINO's NPU plugin could not be loaded ({str(e).strip().splitlines()[-1]})"
    node = ("no /dev/accel/accel* device node (the intel_vpu kernel driver is not loaded, or there is no NPU)"
            if not any(Path("/dev/accel").glob("accel*")) else
            "/dev/accel exists: check the NPU user-mode driver (level-zero) and the permissions of /dev/accel")
    return f"OpenVINO {version} reports no NPU: {plugin}; {node}"


def _gpu_absent_reason(c, version: str) -> str:
    try:
        found = list(c.get_property("GPU", "AVAILABLE_DEVICES"))
        return f"OpenVINO {version}'s GPU plugin loaded but found no GPU ({found or 'no OpenCL device'})"
    except RuntimeError as e:
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        return f"OpenVINO {version} cannot use a GPU: {lines[-1] if lines else e}"


def discover() -> list[OpenVinoDevice]:
    """One device per device OpenVINO offers; openvino:NPU (and openvino:GPU) listed as unavailable
    with the reason when there is none."""
    try:
        import openvino as ov
        c = core()
        version = ov.get_version().split("-")[0]
    except (ImportError, OSError, RuntimeError) as e:
        absent = isinstance(e, ModuleNotFoundError) and e.name == "openvino"
        reason = ("openvino is not installed: pip install 'openvino>=2025.0'" if absent else
                  f"the openvino package cannot be imported: {type(e).__name__}: {e}")
        return [OpenVinoDevice(n, available=False, unavailable_reason=reason, threads=0) for n in ("CPU", "GPU", "NPU")]
    bad = read_settings()
    if bad is not None:
        return [OpenVinoDevice(n, available=False, unavailable_reason=bad, cache_dir=None, precision="f32", bits=4,
                               threads=0) for n in ("CPU", "GPU", "NPU")]
    devices = []
    profile_name = settings.read(PROFILE_ENV)
    for name in c.available_devices:
        kind = name.split(".")[0]
        full = _prop(c, name, "FULL_DEVICE_NAME") or ""
        arch = str(_prop(c, name, "DEVICE_ARCHITECTURE") or "")
        phys = "host-cpu" if kind == "CPU" else (_pci(c, name) or f"openvino-{name}")
        dev = OpenVinoDevice(name, full_name=str(full), physical_id=phys, architecture=arch)
        if kind == "NPU":
            prof, note = profile_for_architecture(arch)
            dev = OpenVinoDevice(name, full_name=str(full), physical_id=phys, architecture=arch, profile=prof)
            if note:
                dev.description += f"; {note}"
        elif profile_name:
            dev = dev.with_options(profile=profile_name)
        devices.append(dev)
    kinds = {d.ov_name.split(".")[0] for d in devices}
    if "GPU" not in kinds:
        devices.append(OpenVinoDevice("GPU", available=False, unavailable_reason=_gpu_absent_reason(c, version)))
    if "NPU" not in kinds:
        devices.append(OpenVinoDevice("NPU", available=False, unavailable_reason=_npu_absent_reason(c, version)))
    return devices
