"""The CUDA plugin's kernels compiled and assembled without a GPU: every build (kernels.cu with one set of
``-D`` options) that the given models' steps take, lowered for a cuda:0 known only to lower, compiled by NVRTC
to PTX and the PTX assembled by ptxas for one architecture (sm_90: the H100 and H200), which is where an
inline-PTX typo first shows. A dry run before a GPU call; the results of the kernels are not checked here.

    pip install nvidia-cuda-nvrtc-cu12 nvidia-cuda-nvcc-cu12     # NVIDIA's wheels: libnvrtc and ptxas
    python benchmarks/cuda_nvrtc_check.py -m smollm2,gemma3,~/.cache/framework/models/qwen25-coder-1.5b.gguf

Steps of 1 row (decode), 4 and 8 rows (verification) and 16 (a prefill), under each FRAMEWORK_CUDA_X8 value.
Prints each 8-bit product build's registers; exits 1 when a build fails, naming its options and the log.

A change to the kernels' text that should leave the code as it was (a helper moved, a section shared with
another plugin) is checked by the PTX of two trees: ``--tree DIR`` takes the framework (its lowering and
kernels.cu) from another checkout, ``--dump DIR`` writes each build's PTX there, and ``--compare A B``
compares two dumps, build by build, each kernel's ``.entry`` block and the module's other declarations
(order aside):

    git archive main | tar -x -C /tmp/base
    python benchmarks/cuda_nvrtc_check.py --tree /tmp/base --dump /tmp/ptx-base
    python benchmarks/cuda_nvrtc_check.py --dump /tmp/ptx-new
    python benchmarks/cuda_nvrtc_check.py --compare /tmp/ptx-base /tmp/ptx-new"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
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


def every_type(found: dict[tuple, set[str]]) -> dict[tuple, set[str]]:
    """The builds again for every weight type (each build of a quantized weight with its type swapped for each
    other one), and the float kernels' F16 build: code that the given models' own types would not compile."""
    from framework.core import weight_words
    out = dict(found)
    for key, names in found.items():
        opts = dict(key)
        if not any(k.startswith("QT_") for k in opts):
            out.setdefault(tuple(sorted({**opts, "ELEM": "half", "ELEM_HALF": 1}.items())), set()).update(names)
            continue
        for qt in weight_words.QUANT_TYPES:
            lay = weight_words.layout(qt)
            swapped = {k: v for k, v in opts.items() if not k.startswith("QT_")}
            swapped.update({"QT_" + qt: 1, "QT_WPB": lay.words_per_block,
                            "QT_GPB": lay.block_elems // weight_words.GROUP})
            out.setdefault(tuple(sorted(swapped.items())), set()).update(names)
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


def ptx_parts(ptx: str) -> tuple[dict[str, str], list[str]]:
    """A module's PTX as its kernels (name -> the .entry block) and its other lines, sorted (comments and
    blank lines left out): what two builds of the same code have the same, whatever their kernels' order."""
    entries, rest, lines, i = {}, [], ptx.splitlines(), 0
    while i < len(lines):
        ln = lines[i]
        if ".entry " in ln:
            name, j = ln.split(".entry ", 1)[1].split("(", 1)[0].strip(), i
            while lines[j] != "}":
                j += 1
            entries[name] = "\n".join(lines[i:j + 1])
            i = j + 1
            continue
        if ln.strip() and not ln.lstrip().startswith("//"):
            rest.append(ln.strip())
        i += 1
    return entries, sorted(rest)


def compare(base: Path, new: Path) -> int:
    """Compares two --dump folders; the number of differences."""
    a, b = (json.loads((d / "builds.json").read_text()) for d in (base, new))
    diffs, kernels = 0, 0
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            diffs += 1
            print(f"build only in {base if key in a else new}: {key}")
            continue
        ea, ra = ptx_parts((base / a[key]["ptx"]).read_text())
        eb, rb = ptx_parts((new / b[key]["ptx"]).read_text())
        for name in sorted(set(ea) | set(eb)):
            kernels += 1
            if ea.get(name) != eb.get(name):
                diffs += 1
                print(f"kernel {name} differs in build {key}")
        if ra != rb:
            diffs += 1
            print(f"the declarations outside the kernels differ in build {key}")
    print(f"{len(set(a) & set(b))} builds, {kernels} kernels compared: "
          f"{'identical' if not diffs else f'{diffs} differences'}")
    return diffs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--models", default="smollm2,gemma3", help="packaged names or GGUF files, comma-separated")
    ap.add_argument("--arch", default="90", help="compute capability without the dot (default: 90)")
    ap.add_argument("--tree", type=Path, help="the checkout whose framework to build (default: this one)")
    ap.add_argument("--dump", type=Path, help="write each build's PTX and builds.json into this folder")
    ap.add_argument("--every-type", action="store_true", help="each quantized build for every weight type too")
    ap.add_argument("--compare", type=Path, nargs=2, metavar=("BASE", "NEW"), help="compare two --dump folders")
    args = ap.parse_args()
    if args.compare:
        sys.exit(1 if compare(*args.compare) else 0)
    if args.tree:
        sys.path.insert(0, str(args.tree.expanduser().resolve()))
    from framework.plugins.cuda import kernels
    print(f"kernels from {Path(kernels.__file__).parent}")
    lib = ctypes.CDLL(str(_nvidia_file("cuda_nvrtc", "lib/libnvrtc.so.12")))
    ptxas = _nvidia_file("cuda_nvcc", "bin/ptxas")
    found = builds(args.models.split(","))
    if args.every_type:
        found = every_type(found)
    source, bad, index = kernels.source(), 0, {}
    print(f"{len(found)} builds from {args.models}: {', '.join(sorted(set().union(*found.values())))}")
    for key, names in sorted(found.items()):
        opts = dict(key)
        ptx, log = compile_ptx(lib, source, opts, args.arch)
        rc, info = (1, log) if ptx is None else assemble(ptxas, ptx, args.arch)
        if args.dump and ptx is not None:
            args.dump.mkdir(parents=True, exist_ok=True)
            index[repr(key)] = {"ptx": f"{len(index)}.ptx", "kernels": sorted(names)}
            (args.dump / index[repr(key)]["ptx"]).write_bytes(ptx)
        if rc or "warning" in log:
            bad += 1
            print(f"FAILED {sorted(names)} {opts}:\n{log}\n{info}")
        elif opts.get("MV_X8"):
            regs = next((ln.split(":", 1)[1].strip() for ln in info.splitlines() if "registers" in ln), "")
            shape = " ".join(f"{k}={opts[k]}" for k in ("MV_MM", "MV_R", "MV_TPR", "MV_WG"))
            qt = next(k[3:] for k in opts if k.startswith("QT_") and k[3:] not in ("WPB", "GPB"))
            print(f"  matvec_q8 {qt:5s} {shape}: {regs}")
    if args.dump:
        (args.dump / "builds.json").write_text(json.dumps(index, indent=1))
    print(f"{len(found) - bad} of {len(found)} builds compiled and assembled for sm_{args.arch}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
