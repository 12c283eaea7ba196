"""The OpenVINO plugin's settings (environment variables), declared once and read through framework.settings, and
what a device compiles with (CompileSettings): the compile properties that change results, the on-disk cache of
compiled models, and the line that says what compiling did."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from ...contract import DeviceType, caches, settings
from . import weights as W
from .blobcache import BlobCache
from .profiles import PROFILES

CACHE_ENV = "FRAMEWORK_OPENVINO_CACHE_DIR"      # a folder, or "off"
PROFILE_ENV = "FRAMEWORK_OPENVINO_PROFILE"      # a profile applied to every present non-NPU device
PRECISION_ENV = "FRAMEWORK_OPENVINO_PRECISION"  # INFERENCE_PRECISION_HINT (default f32: measured)
BITS_ENV = "FRAMEWORK_OPENVINO_WEIGHT_BITS"     # 4 (i4 or u4 for the 4-bit types) or 8 (i8 for every type)
CACHE_MAX_ENV = "FRAMEWORK_OPENVINO_CACHE_MAX_GB"
DYNQUANT_ENV = "FRAMEWORK_OPENVINO_DYNAMIC_QUANTIZATION"   # DYNAMIC_QUANTIZATION_GROUP_SIZE: 0 (off), a size, auto
THREADS_ENV = "FRAMEWORK_OPENVINO_THREADS"      # INFERENCE_NUM_THREADS of the CPU device: 0 (OpenVINO's) or a count
DEFAULT_PRECISION = "f32"
DEFAULT_BITS = 4
# "auto" by default: the activations of the compressed products are quantized to 8 bits, as llama.cpp's CPU
# backend quantizes them, where the CPU has an 8-bit dot product, and stay float32 where it has none. Issue 20's
# decode goal needs them quantized (the 1.5B's decode 1.05-1.11x faster than in float32, big-decode dq=0,16) and
# llama.cpp's reference bounds hold either way; a decode step then no longer gives its prefill's logits bit for
# bit, which FRAMEWORK_OPENVINO_DYNAMIC_QUANTIZATION=0 keeps (docs/openvino.md, "Activations").
DEFAULT_DYNQUANT = "auto"
# DYNAMIC_QUANTIZATION_GROUP_SIZE "auto": for each compiled model the first of these that divides the group of every
# compressed weight it holds. OpenVINO's CPU plugin quantizes a product's activations only where the group size
# divides the weight's group (Q6_K's is 16), and runs the 32-value forms (Q4_0, Q4_1, Q8_0) fastest with 32
# (benchmarks/openvino_measure.py fc-forms; docs/openvino.md, "8-bit activations in groups of 16").
AUTO = "auto"
AUTO_GROUPS = (32, 16)
# The CPUs whose 8-bit dot product OpenVINO's quantized-activation kernels use. Without one (an AVX2-only CPU, or
# oneDNN capped below a VNNI level) "auto" is 0: OpenVINO 2026.4 cannot even compile a quantized-activation product
# with oneDNN capped at AVX2 ("could not create a primitive descriptor"), and OpenVINO's own default there is 0.
DOT_PRODUCT_FLAGS = ("avx512_vnni", "avx_vnni")
CAPS_WITHOUT_DOT_PRODUCT = ("SSE41", "AVX", "AVX2", "AVX512_CORE")
PRECISION_HINT, DYNQUANT = "INFERENCE_PRECISION_HINT", "DYNAMIC_QUANTIZATION_GROUP_SIZE"

settings.declare(CACHE_ENV, "openvino", "a folder, or 'off'", None, "OpenVINO's compiled-model cache (CACHE_DIR); "
                 "unset: openvino/ under FRAMEWORK_CACHE", settings.folder_or_off)
settings.declare(PROFILE_ENV, "openvino", f"a device profile: {', '.join(PROFILES)}", None,
                 "a profile applied to every present non-NPU OpenVINO device (an EMULATION)",
                 settings.choice(PROFILES, fold=False))
settings.declare(PRECISION_ENV, "openvino", "f32, f16 or bf16", DEFAULT_PRECISION,
                 "OpenVINO's INFERENCE_PRECISION_HINT", settings.choice(("f32", "f16", "bf16")))
settings.declare(BITS_ENV, "openvino", "4 or 8", DEFAULT_BITS, "weight packing: 4 (i4 or u4 for the 4-bit types, "
                 "i8 for the others) or 8 (i8 for every type)", lambda text: int(settings.choice(("4", "8"))(text)))
settings.declare(CACHE_MAX_ENV, "openvino", "a number of GiB above 0", 4.0,
                 "size the compiled-model cache is trimmed to (least recently used blobs go first)",
                 settings.number(0.0, above=True))


def _group_size(text: str) -> int | str:
    """FRAMEWORK_OPENVINO_DYNAMIC_QUANTIZATION's value: 0 for off, auto, or a whole number."""
    word = text.strip().lower()
    return {"off": 0, AUTO: AUTO}[word] if word in ("off", AUTO) else settings.whole(0)(text)


settings.declare(DYNQUANT_ENV, "openvino", "0 or off, a positive group size, or auto", DEFAULT_DYNQUANT,
                 "DYNAMIC_QUANTIZATION_GROUP_SIZE of OpenVINO's CPU and GPU plugins (0: activations not quantized; "
                 "auto: the largest of 32 and 16 that reaches every compressed product of a compiled model, on a CPU "
                 "with an 8-bit dot product, AVX-512 VNNI or AVX-VNNI; 0 on one without)",
                 _group_size)
settings.declare(THREADS_ENV, "openvino", "0 (OpenVINO's choice) or a thread count", 0,
                 "INFERENCE_NUM_THREADS of openvino:CPU (0: OpenVINO's choice, one thread per core); `framework bench` "
                 "sets it to --threads, the thread count its peer gets", settings.whole(0))
caches.register("openvino", "OpenVINO compiled models (blobs) and their manifest", lambda: default_cache_dir())


class OpenVinoSettingError(ValueError):
    """An environment setting of the OpenVINO plugin that it does not accept."""


def dynamic_quantization_from_env() -> int | str:
    """DYNAMIC_QUANTIZATION_GROUP_SIZE from FRAMEWORK_OPENVINO_DYNAMIC_QUANTIZATION, or the default (auto)."""
    try:
        return settings.read(DYNQUANT_ENV)
    except settings.SettingError:
        value = settings.raw(DYNQUANT_ENV)
    raise OpenVinoSettingError(f"{DYNQUANT_ENV}={value!r} is not accepted: use 0 or off (activations not quantized), "
                               f"a positive group size such as 16 (OpenVINO's CPU plugin quantizes the activations "
                               f"of compressed products to 8 bits in groups of that many values), or auto (the "
                               f"default: the largest of 32 and 16 that reaches every product of a compiled model, "
                               f"on a CPU with an 8-bit dot product; 0 on one without)")


def dynamic_quantization_words(group_size: int | str, dot_product: str | None = None, gpu: bool = False) -> str:
    """The setting in words; ``dot_product`` is what "auto" found on this CPU (None: no 8-bit dot product), ``gpu``
    that the device is a GPU (where "auto" is 0)."""
    if group_size == AUTO and dot_product is None:
        why = "not measured on an OpenVINO GPU" if gpu else f"no 8-bit dot product on this CPU: {cpu_isa()}"
        return f"activations not quantized (DYNAMIC_QUANTIZATION_GROUP_SIZE auto: 0, {why})"
    if group_size == 0:
        return "activations not quantized (DYNAMIC_QUANTIZATION_GROUP_SIZE 0)"
    if group_size == AUTO:
        return (f"activations quantized to 8 bits in groups of 32, or 16 where a model holds weights in groups of 16 "
                f"(DYNAMIC_QUANTIZATION_GROUP_SIZE auto: this CPU has {dot_product})")
    return f"activations quantized to 8 bits in groups of {group_size} (DYNAMIC_QUANTIZATION_GROUP_SIZE {group_size})"


def onednn_cap() -> str | None:
    """oneDNN's own cap on the instruction sets of OpenVINO's CPU kernels (ONEDNN_MAX_CPU_ISA: oneDNN's
    variable, not one of ours, so read here rather than through framework.settings), or None."""
    return os.environ.get("ONEDNN_MAX_CPU_ISA") or None


def dot_product_isa() -> str | None:
    """The CPU's 8-bit dot product that OpenVINO's quantized-activation kernels use (a /proc/cpuinfo flag), or None
    where it has none or oneDNN is capped below it (ONEDNN_MAX_CPU_ISA)."""
    if (onednn_cap() or "").strip().upper() in CAPS_WITHOUT_DOT_PRODUCT:
        return None
    return next((f for f in DOT_PRODUCT_FLAGS if f in cpu_flags()), None)


def group_size_for(weights) -> int:
    """DYNAMIC_QUANTIZATION_GROUP_SIZE "auto" for a compiled model holding ``weights`` (OvWeights): the first of
    AUTO_GROUPS that divides every compressed weight's group, the last where none does."""
    groups = {w.group for w in weights if getattr(w, "kind", None) == "compressed"}
    return next((g for g in AUTO_GROUPS if all(x % g == 0 for x in groups)), AUTO_GROUPS[-1])


def default_cache_dir() -> Path | None:
    return settings.cache_dir("openvino", CACHE_ENV)


def read_settings() -> str | None:
    """Why the plugin's settings cannot be used (None when they all parse)."""
    try:
        for name in (CACHE_ENV, PROFILE_ENV, PRECISION_ENV, BITS_ENV, CACHE_MAX_ENV, DYNQUANT_ENV, THREADS_ENV,
                     settings.CACHE.name):
            settings.read(name)
    except settings.SettingError as e:
        return f"bad openvino settings: {e}"
    return None


# -- what the numerics depend on -----------------------------------------------------------------------
ISA_FLAGS = ("avx2", "avx_vnni", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16")


@functools.cache        # read once a process: every device made (with_options too) asks what "auto" finds
def cpu_flags() -> tuple[str, ...]:
    """The instruction sets OpenVINO's CPU kernels choose from, as /proc/cpuinfo lists them (empty if unreadable)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next(ln for ln in f if ln.startswith("flags")).split(":", 1)[1].split()
    except (OSError, StopIteration):
        flags = []
    return tuple(f for f in flags if f in ISA_FLAGS or f.startswith("amx"))


def cpu_isa() -> str:
    """The instruction sets OpenVINO's CPU kernels choose from (/proc/cpuinfo), and oneDNN's cap if set."""
    found = " ".join(cpu_flags())
    cap = onednn_cap()
    return found + (f"; ONEDNN_MAX_CPU_ISA={cap}" if cap else "")


class CompileSettings:
    """What one OpenVINO device compiles with: the precision hint, the weights' packing (bits), the activations'
    group size and the CPU's threads, each read from its setting where not given, and OpenVINO's cache folder
    (``cache_dir`` "default": FRAMEWORK_OPENVINO_CACHE_DIR's; None: no on-disk cache)."""

    def __init__(self, name: str, hardware: DeviceType, cache_dir: Path | None | str = "default",
                 precision: str | None = None, bits: int | None = None,
                 dynamic_quantization: int | str | None = None, threads: int | None = None):
        self.name, self.hardware = name, hardware
        self.cache_dir = default_cache_dir() if cache_dir == "default" else (Path(cache_dir) if cache_dir else None)
        self.precision = precision or settings.read(PRECISION_ENV)
        self.bits = int(bits or settings.read(BITS_ENV))
        self.dynamic_quantization = (dynamic_quantization_from_env() if dynamic_quantization is None
                                     else dynamic_quantization if dynamic_quantization == AUTO
                                     else int(dynamic_quantization))
        if self.dynamic_quantization != AUTO and self.dynamic_quantization < 0:
            raise OpenVinoSettingError(f"dynamic_quantization={dynamic_quantization} for {name}: use 0 (off), "
                                       f"a positive group size or {AUTO!r}")
        # threads of a CPU device's kernels (INFERENCE_NUM_THREADS); 0: OpenVINO's choice
        self.threads = int(settings.read(THREADS_ENV) if threads is None else threads)
        self._blobs: BlobCache | None = None
        self.cache_off = ""                     # why the on-disk cache is off, when not by the setting
        # what "auto" finds: an 8-bit dot product on a CPU device; none assumed on others (not measured there)
        self.dot_product = dot_product_isa() if hardware == DeviceType.CPU else None

    def words(self) -> str:
        """The settings, for the device's description ("" on a device that is given none)."""
        if self.hardware == DeviceType.CPU:
            what = (f"; {self.precision} ({PRECISION_HINT}), "
                    f"{dynamic_quantization_words(self.dynamic_quantization, self.dot_product)}")
            if self.threads:
                what += f", {self.threads} thread{'' if self.threads == 1 else 's'} (INFERENCE_NUM_THREADS)"
            return what
        if self.hardware == DeviceType.GPU:       # it gets DYNAMIC_QUANTIZATION_GROUP_SIZE too (requested)
            return f"; {dynamic_quantization_words(self.dynamic_quantization, gpu=True)}"
        return ""

    def config(self) -> dict:
        """OpenVINO's compile properties. Every one that changes results is set here, none left to what
        OpenVINO picks for the CPU at hand (``requested``, read back from every compiled model)."""
        cfg = {"PERFORMANCE_HINT": "LATENCY", **self.requested()}
        if self.hardware == DeviceType.CPU and self.threads:
            # one thread per core by default: on a shared machine, a step's ~1000 kernels each wait at a barrier
            # for the slowest of them (docs/openvino.md, "Decode against llama.cpp")
            cfg["INFERENCE_NUM_THREADS"] = self.threads
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            cfg["CACHE_DIR"] = str(self.cache_dir)
        return cfg

    def requested(self, weights=()) -> dict:
        """The settings that change results, as OpenVINO names them, for a compiled model holding ``weights``
        (which the "auto" group size reads); DYNAMIC_QUANTIZATION_GROUP_SIZE only where the device has the property
        (OpenVINO's CPU and GPU plugins)."""
        cfg: dict[str, Any] = {PRECISION_HINT: self.precision}
        if self.hardware in (DeviceType.CPU, DeviceType.GPU):
            cfg[DYNQUANT] = self.group_size(weights)
        return cfg

    def group_size(self, weights=()) -> int:
        """DYNAMIC_QUANTIZATION_GROUP_SIZE for a compiled model holding ``weights``: "auto" is the model's own
        group where the device has an 8-bit dot product, else 0."""
        dq = self.dynamic_quantization
        if dq != AUTO:
            return dq
        return group_size_for(weights) if self.dot_product else 0

    def blob_cache(self) -> BlobCache | None:
        """The checks around OpenVINO's cache folder; None when caching is off or the folder cannot be
        written (said once, and this device then compiles without CACHE_DIR)."""
        if self.cache_dir is None:
            return None
        if self._blobs is None or self._blobs.folder != self.cache_dir:
            why = caches.unwritable(self.cache_dir)
            if why is not None:
                caches.report(f"OpenVINO cache folder {self.cache_dir} cannot be written ({why}): {self.name} "
                              f"compiles without an on-disk cache", once_key=f"openvino:{self.cache_dir}")
                self.cache_off = f"{self.cache_dir} cannot be written"
                self.cache_dir = None
                return None
            self._blobs = BlobCache(self.cache_dir)
        return self._blobs

    def summary(self, s) -> str:
        """What the device's programs' compiling did (``s``: the device's CompileStats), in one line."""
        off = self.cache_off or f"{CACHE_ENV}=off"
        where = (f"{s.compiled} compiled, {s.from_cache} loaded from the on-disk cache {self.cache_dir}"
                 if self.cache_dir else f"all compiled: the on-disk cache is off ({off})")
        n = s.compiled + s.from_cache
        line = (f"{self.name}: {n} compiled model{'' if n == 1 else 's'} ({where}) in {s.seconds:.2f} s, graphs "
                f"built in {s.build_seconds:.2f} s")
        if s.shared:
            line += (f"; {s.shared} more step shape{'' if s.shared == 1 else 's'} ran on them (one model for every KV "
                     f"length)")
        if s.per_length:
            n, why = sum(s.per_length.values()), next(iter(s.per_length))
            line += (f"; {n} step shape{'' if n == 1 else 's'} kept a model per KV length ({why}"
                     + (f"; {len(s.per_length) - 1} other reasons)" if len(s.per_length) > 1 else ")"))
        if s.compiled == 0 and s.from_cache:
            line += "; this run compiled nothing"
        if W.CONVERTED:
            line += "; converted at load: " + "; ".join(W.CONVERTED.values())
        return line
