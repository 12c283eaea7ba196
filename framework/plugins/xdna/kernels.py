"""Kernel sets: the compiled NPU GEMMs the plugin drives, read from a directory.

The directory is named by ``FRAMEWORK_XDNA_KERNELS`` (or the device's ``kernels=`` argument), the way
mlir-aie/IRON programs are handed an xclbin and an instruction stream (``-x final.xclbin -i insts.bin``
or ``.txt``). It holds ``kernels.json``::

    {"format": "framework-xdna-kernels/1",
     "abi": "q4_1-tiles-32x256-bf16/a-bf16/c-f32",
     "xclbin": "gemm.xclbin",            # default for every entry
     "kernel": "MLIR_AIE",               # kernel name in the xclbin (mlir-aie's default)
     "insts_count": "words",             # 3rd kernel argument: instruction count in 32-bit words
                                         # (mlir-aie's test.cpp) or "bytes" (IRON's hostruntime)
     "gemm": [{"m": 1, "k": 768, "n": 1536, "insts": "insts_1x768x1536.bin"},
              {"m": 64, "k": 768, "n": 1536, "insts": "insts_64x768x1536.txt", "xclbin": "other.xclbin"},
              {"m": 1, "k": 768, "n": 576, "elf": "gemm_1x768x576.elf"}]}

Each entry is one GEMM shape C[m, n] = A[m, k] x W^T with ``k`` and ``n`` the *padded* sizes of a
weight's tile grid (geometry.py). The ABI (what every kernel of the set must implement; the manifest
must name it, so a set built for something else is refused rather than run):

    argument 0  opcode 3                      (start NPU: mlir-aie, IRON and FastFlowLM pass 3)
    argument 1  instruction bo (cacheable, group_id(1))   | ELF flow: 0
    argument 2  instruction count                          | ELF flow: 0
    argument 3  A: m x k bfloat16, row-major (host_only, group_id(3))
    argument 4  W: the weight's tiles, geometry.py layout (host_only, group_id(4))
    argument 5  C: m x n float32, row-major (host_only, group_id(5))

An ``insts`` entry is the legacy flow (instruction words in a cacheable buffer); an ``elf`` entry is
XRT's ELF flow (``xrt::elf`` -> ``xrt::module`` -> ``xrt::ext::kernel``), which carries its
instructions itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .geometry import TILE_COLS, TILE_ROWS

KERNELS_ENV = "FRAMEWORK_XDNA_KERNELS"
MANIFEST = "kernels.json"
FORMAT = "framework-xdna-kernels/1"
ABI = "q4_1-tiles-32x256-bf16/a-bf16/c-f32"
OPCODE_START_NPU = 3
DEFAULT_KERNEL = "MLIR_AIE"


class KernelSetError(ValueError):
    """A kernel set that cannot be used: the message names the file and what is wrong."""


@dataclass(frozen=True)
class GemmKernel:
    m: int
    k: int
    n: int
    flow: str                 # "insts" or "elf"
    program: Path             # the instruction stream or the ELF
    xclbin: Path
    kernel: str
    insts: np.ndarray | None = field(default=None, compare=False, hash=False, repr=False)

    def describe(self) -> str:
        return f"{self.m}x{self.k}x{self.n}"


@dataclass
class KernelSet:
    directory: Path
    entries: list[GemmKernel]
    insts_count: str = "words"

    @property
    def xclbins(self) -> list[Path]:
        return list(dict.fromkeys(e.xclbin for e in self.entries))

    def for_weight(self, k: int, n: int) -> list[GemmKernel]:
        """The kernels of a padded weight grid (k, n), smallest m first."""
        return sorted((e for e in self.entries if e.k == k and e.n == n), key=lambda e: e.m)

    def shapes(self) -> str:
        return ", ".join(sorted({f"k={e.k} n={e.n}" for e in self.entries})) or "none"

    def describe(self) -> str:
        return (f"kernel set {self.directory}: {len(self.entries)} GEMMs on {len(self.xclbins)} xclbin(s) "
                f"({', '.join(p.name for p in self.xclbins)})")


def read_insts(path: Path) -> np.ndarray:
    """An instruction stream: .bin is little-endian 32-bit words, .txt one hex word a line (mlir-aie)."""
    if path.suffix == ".txt":
        words = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
        try:
            data = np.array([int(w, 16) for w in words], dtype=np.uint32)
        except ValueError as e:
            raise KernelSetError(f"{path}: not one hex word a line ({e})") from None
    else:
        raw = path.read_bytes()
        if len(raw) % 4:
            raise KernelSetError(f"{path}: {len(raw)} bytes is not a whole number of 32-bit instruction words")
        data = np.frombuffer(raw, dtype="<u4").astype(np.uint32)
    if data.size == 0:
        raise KernelSetError(f"{path}: the instruction stream is empty")
    return data


def load_kernel_set(directory: str | Path) -> KernelSet:
    d = Path(directory)
    manifest = d / MANIFEST
    if not d.is_dir():
        raise KernelSetError(f"kernel set {d}: not a directory")
    if not manifest.is_file():
        raise KernelSetError(f"kernel set {d}: no {MANIFEST} (it names the xclbin, the kernel ABI and the "
                             f"instruction stream of every GEMM shape; see docs/xdna.md)")
    try:
        spec = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise KernelSetError(f"{manifest}: {type(e).__name__}: {e}") from None
    if spec.get("format") != FORMAT:
        raise KernelSetError(f"{manifest}: format {spec.get('format')!r}, expected {FORMAT!r}")
    if spec.get("abi") != ABI:
        raise KernelSetError(f"{manifest}: kernel ABI {spec.get('abi')!r}; this plugin writes {ABI!r} "
                             f"(Q4_1 tiles, bf16 activations, f32 results): refusing to run kernels built for "
                             f"another layout")
    insts_count = spec.get("insts_count", "words")
    if insts_count not in ("words", "bytes"):
        raise KernelSetError(f"{manifest}: insts_count must be 'words' or 'bytes', not {insts_count!r}")
    entries = []
    for i, e in enumerate(spec.get("gemm") or []):
        where = f"{manifest} gemm[{i}]"
        try:
            m, k, n = int(e["m"]), int(e["k"]), int(e["n"])
        except (KeyError, TypeError, ValueError):
            raise KernelSetError(f"{where}: needs integer m, k and n, got {e}") from None
        if m < 1 or k < TILE_COLS or n < TILE_ROWS or k % TILE_COLS or n % TILE_ROWS:
            raise KernelSetError(f"{where}: {m}x{k}x{n}: k must be a multiple of {TILE_COLS} and n of {TILE_ROWS} "
                                 f"(padded tile grids), m positive")
        xclbin = d / str(e.get("xclbin") or spec.get("xclbin") or "")
        if not xclbin.is_file():
            raise KernelSetError(f"{where}: xclbin {xclbin} not found")
        if ("insts" in e) == ("elf" in e):
            raise KernelSetError(f"{where}: give exactly one of 'insts' (instruction stream) or 'elf'")
        program = d / str(e.get("insts") or e.get("elf"))
        if not program.is_file():
            raise KernelSetError(f"{where}: {program} not found")
        flow = "insts" if "insts" in e else "elf"
        insts = read_insts(program) if flow == "insts" else None
        entries.append(GemmKernel(m, k, n, flow, program, xclbin, str(e.get("kernel") or spec.get("kernel")
                                                                        or DEFAULT_KERNEL), insts))
    if not entries:
        raise KernelSetError(f"{manifest}: no GEMM entries")
    return KernelSet(d, entries, insts_count)
