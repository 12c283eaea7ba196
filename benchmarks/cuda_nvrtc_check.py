"""The CUDA plugin's kernels compiled and assembled without a GPU: every build (kernels.cu with one set of
``-D`` options) that the given models' steps take, lowered for a cuda:0 known only to lower, compiled by NVRTC
to PTX and the PTX assembled by ptxas for one architecture (sm_90: the H100 and H200), which is where an
inline-PTX typo first shows. A dry run before a GPU call; the results of the kernels are not checked here.

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12     # NVIDIA's wheels: libnvrtc and ptxas
    python benchmarks/cuda_nvrtc_check.py -m smollm2,gemma3,~/.cache/framework/models/qwen25-coder-1.5b.gguf

Steps of 1 row (decode), 4 and 8 rows (verification) and 16 (a prefill), under each FRAMEWORK_CUDA_X8 value.
Prints each 8-bit product build's registers; exits 1 when a build fails, naming its options and the log."""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _nvidia_file(package: str, rel: str) -> Path:
    spec = importlib.util.find_spec("nvidia")
    for base in (spec.submodule_search_locations if spec else []) or []:
        p = Path(base) / package / rel
        if p.exists():
            return p
    raise SystemExit(f"no {package}/{rel}: pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12")


def builds(models: list[str]) -> dict[tuple, set[str]]:
    """Build options -> kernels, over the models' steps of 1, 4, 8 and 16 rows and every X8 choice."""
    from framework.backend import Lowering
    from framework.core.scheduler import make_plan
    from framework.model.arch.base import KVCache
    from framework.model.default import resolve_model
    from framework.model.model import Model
    from framework.plugins.cpu.device import CpuDevice
    from framework.plugins.cuda.device import CudaDevice
    from framework.plugins.cuda.options import X8_CHOICES
    from framework.plugins.cuda.program import TABLE
    out: dict[tuple, set[str]] = {}
    for name in models:
        model = Model(resolve_model(str(Path(name).expanduser()) if "/" in name else name))
        for rows, logits in ((1, 1), (4, 4), (8, 8), (16, 1)):
            graph, _ = model.build_step(rows, 64, logits, KVCache(model.hp, 512))
            (frag,) = make_plan(graph, [CpuDevice()]).fragments
            for x8 in X8_CHOICES:
                dev = CudaDevice(0, reason="lowering only")
                dev.x8 = x8
                for st in Lowering(dev, frag, TABLE).steps:
                    out.setdefault(tuple(sorted(st.kernel.options.items())), set()).add(st.kernel.kernel)
    return out


def compile_ptx(lib, source: str, options: dict, arch: str) -> tuple[bytes | None, str]:
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"kernels.cu", 0, None, None):
        raise SystemExit("nvrtcCreateProgram failed")
    flags = [f"-D{k}={v}".encode() for k, v in sorted(options.items())]
    flags += [b"--std=c++14", f"-arch=compute_{arch}".encode()]
    rc = lib.nvrtcCompileProgram(prog, len(flags), (ctypes.c_char_p * len(flags))(*flags))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc:
        return None, log.value.decode()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    return ptx.value, log.value.decode()


def assemble(ptxas: Path, ptx: bytes, arch: str) -> tuple[int, str]:
    with tempfile.NamedTemporaryFile("wb", suffix=".ptx") as f:
        f.write(ptx)
        f.flush()
        r = subprocess.run([str(ptxas), f"-arch=sm_{arch}", "-v", f.name, "-o", "/dev/null"], capture_output=True,
                           text=True)
    return r.returncode, r.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--models", default="smollm2,gemma3", help="packaged names or GGUF files, comma-separated")
    ap.add_argument("--arch", default="90", help="compute capability without the dot (default: 90)")
    args = ap.parse_args()
    from framework.plugins.cuda import kernels
    lib = ctypes.CDLL(str(_nvidia_file("cuda_nvrtc", "lib/libnvrtc.so.12")))
    ptxas = _nvidia_file("cuda_nvcc", "bin/ptxas")
    found = builds(args.models.split(","))
    source, bad = kernels.source(), 0
    print(f"{len(found)} builds from {args.models}: {', '.join(sorted(set().union(*found.values())))}")
    for key, names in sorted(found.items()):
        opts = dict(key)
        ptx, log = compile_ptx(lib, source, opts, args.arch)
        rc, info = (1, log) if ptx is None else assemble(ptxas, ptx, args.arch)
        if rc or "warning" in log:
            bad += 1
            print(f"FAILED {sorted(names)} {opts}:\n{log}\n{info}")
        elif opts.get("MV_X8"):
            regs = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if "registers" in ln), "")
            shape = " ".join(f"{k}={opts[k]}" for k in ("MV_MM", "MV_R", "MV_TPR", "MV_WG"))
            qt = next(k[3:] for k in opts if k.startswith("QT_") and k[3:] not in ("WPB", "GPB"))
            print(f"  matvec_q8 {qt:5s} {shape}: {regs}")
    print(f"{len(found) - bad} of {len(found)} builds compiled and assembled for sm_{args.arch}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
