"""Building kernels.cl into programs, once per device and set of build options, and the settings of
the kernels whose shape is chosen per device (work-group sizes, matrix-vector and tiled-product
shapes).

A program is the whole kernels.cl built with ``-D`` options: the weight type (``QT_Q4_K``, with its
layout's numbers: c_kernels.Dialect.quant_options), the tile or team shape, the element type of float
kernels. Options are the only way code is specialised: no source text is edited. The header prepended to
the source is generated from signatures.py (the kernels' parameters) and the skeleton's op codes
(c_kernels.source).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import numpy as np

from ...backend import c_kernels
from ...contract import caches, settings
from .coverage import MAX_HEAD
from .options import MATMUL_ENV, MATVEC_ENV, cache_dir
from .signatures import KERNELS

SOURCE = Path(__file__).with_name("kernels.cl")
RWG = 128                # work-group of the row kernels (RMS norm, softmax)
AWG = 64                 # work-group of attention
EWG = 256                # work-group of the one-thread-an-element kernels (fewer where the device allows fewer)
MATVEC_MAX_ROWS = 8      # rows of x up to which a quantized product is a matrix-vector one
MATVEC_MIN_GROUPS = 264  # work-groups a matrix-vector product should make at least (2 an SM on an H200)
MATVEC_X8_BYTES = 4 << 20   # weights from this size take x in 8 bits where the device has a 4-way byte dot product
MATVEC_XL_BYTES = 36 << 10  # local memory the matrix-vector kernel may take to stage f32 x (rows x groups x 144 B)
SPLIT_ATTN_BELOW = 64    # query rows x heads under which attention splits its keys over work-groups (GPUs)


@lru_cache(maxsize=1)
def source() -> str:
    return c_kernels.source(KERNELS, SOURCE)


def base_options(dev) -> dict[str, int]:
    opts = {"RWG": RWG, "AWG": AWG, "MAX_HEAD": MAX_HEAD}
    if dev.fp64:
        opts["HAS_FP64"] = 1
    return opts


def matvec_shape(dev, gpr: int, m: int, rows: int, nbytes: int) -> dict[str, int]:
    """The matrix-vector kernel and its shape (kernels.cl, "Matrix-vector products"), what
    FRAMEWORK_OPENCL_MATVEC may override (options.MATVEC_KEYS):

    * v: 1, the kernel of record (x loaded once a group for all of a thread's rows, sums in registers
      until one reduction at the end); 0, the first version (x re-read from global memory for every
      weight row; its sums meet by a tree in local memory), kept for comparison;
    * tpr: threads a team, the largest power of two up to 32 and the row's groups; r: weight rows a
      team, 4 for one row of x (4 // rows of x), halved while the matrix would make fewer than
      MATVEC_MIN_GROUPS work-groups; wg: the work-group, 256 (or the device's largest), halved likewise
      down to 64;
    * dp4a, shfl: PTX's dp4a and warp shuffles (the team's sums meet without local memory or barriers),
      on where the device takes them (ptx(): NVIDIA's OpenCL, checked by a probe);
    * x8: x in 8 bits (QUANT_X) and 4-way byte dot products, for weights of MATVEC_X8_BYTES and more on
      devices with one (dp4a, or cl_khr_integer_dot_product): the extra launch costs more than it saves
      on smaller matrices, whose time is mostly latency;
    * xl: f32 x staged once per work-group in local memory (where its MATVEC_XL_BYTES allow: x's rows
      of groups padded to 36 floats, xg groups a row, a power of two from 32), so that a team's float4
      loads of x are free of bank conflicts instead of each touching 32 cache lines.

    mm (rows of x, a power of two) is not a setting. A bad setting is a ValueError naming the variable, the
    item, what it may be and the device."""
    try:
        env = settings.read(MATVEC_ENV)
    except settings.SettingError as e:
        raise ValueError(f"{e} ({dev.name}); unset the variable for the plugin's choice") from None
    mm, tpr, r, wg = c_kernels.matvec_teams(gpr, m, rows, min(256, dev.max_wg), 4, MATVEC_MIN_GROUPS)
    v = env.get("v", 1)
    feats = ptx(dev) if v else {"dp4a": False, "shfl": False}
    shape = {"v": v, "tpr": tpr, "r": r, "wg": wg, "mm": mm, "dp4a": int(feats["dp4a"]), "shfl": int(feats["shfl"])}
    shape.update({k: env[k] for k in ("tpr", "r", "wg", "dp4a", "shfl") if k in env})
    shape["x8"] = env.get("x8", int((dev.int_dot or bool(shape["dp4a"])) and nbytes >= MATVEC_X8_BYTES))
    xg = max(32, 1 << (gpr - 1).bit_length())
    red = 0 if shape["shfl"] else 4 * shape["r"] * mm * shape["wg"]      # the tree's local memory
    fits = mm * xg * 144 <= min(MATVEC_XL_BYTES, local_bytes(dev) - red)
    shape["xl"] = env.get("xl", int(v == 1 and not shape["x8"] and fits))
    shape["xg"] = xg if shape["xl"] else 0
    _check_matvec(dev, shape, fits, xg, red)
    return shape


def _check_matvec(dev, shape: dict, fits: bool, xg: int, red: int) -> None:
    """Settings the kernel cannot take on this device or matrix: a ValueError that says which and why."""
    feats = ptx(dev) if shape["v"] else {}
    problems = []
    if shape["wg"] > dev.max_wg:
        problems.append(f"wg={shape['wg']} is over {dev.name}'s largest work-group ({dev.max_wg})")
    if shape["wg"] % shape["tpr"]:
        problems.append(f"wg={shape['wg']} is not a multiple of tpr={shape['tpr']}")
    for key in ("dp4a", "shfl"):
        if shape[key] and not shape["v"]:
            problems.append(f"{key}=1 needs v=1 (the first kernel has no PTX)")
        elif shape[key] and not feats.get(key):
            problems.append(f"{key}=1, but {dev.name} does not take PTX's {key} "
                            f"({dev.data.get('inline_ptx', 'not probed')})")
    if red > local_bytes(dev):
        problems.append(f"the sums' tree in local memory (r x rows of x x wg x 4 = {red} bytes) is over "
                        f"{dev.name}'s {local_bytes(dev)} bytes")
    if shape["shfl"] and shape["wg"] % 32:
        problems.append(f"shfl=1 needs work-groups of whole warps (wg={shape['wg']})")
    if shape["xl"] and (not shape["v"] or shape["x8"]):
        problems.append("xl=1 stages f32 x: it needs v=1 and x8=0")
    elif shape["xl"] and not fits:
        problems.append(f"xl=1: {shape['mm']} rows of x of {xg} padded groups ({shape['mm'] * xg * 144} bytes) do not "
                        f"fit the {MATVEC_XL_BYTES}-byte budget and {dev.name}'s {local_bytes(dev)} bytes of local "
                        f"memory (less the reduction's, without shfl)")
    if problems:
        raise ValueError(f"{MATVEC_ENV}={settings.raw(MATVEC_ENV) or ''!r} ({dev.name}): {'; '.join(problems)}; "
                         f"change or unset the variable")


def local_bytes(dev) -> int:
    """The device's local memory a work-group (32 KiB where it reports none)."""
    return int(dev.data.get("local_mem_bytes") or 32768)


def ptx(dev) -> dict[str, bool]:
    """Which of PTX's dp4a, warp shuffles and device-wide memory fence (membar.gl) dev's compiler takes, as
    inline assembly, and computes right:
    on NVIDIA's OpenCL platform only (other drivers have no PTX), each checked once per device by
    building and running ptx_probe against the values it must give, the statement spelt __asm__, else
    asm. dev.data["inline_ptx"] says what was found, with the errors where a probe failed."""
    found = getattr(dev, "ptx", None)
    if found is not None:
        return found
    if dev.is_cpu or "nvidia" not in str(dev.data.get("platform", "")).lower():
        found, said = {"dp4a": False, "shfl": False, "fence": False}, "no: not NVIDIA's OpenCL platform"
    else:
        found, notes = {}, []
        for feature in ("dp4a", "shfl", "fence"):
            errors = []
            for plain in (0, 1):
                error = _probe(dev, feature, plain)
                if error is None:
                    found[feature] = True
                    found["plain_asm"] = found.get("plain_asm", 0) | plain
                    notes.append(f"{feature}: yes (built with {'asm' if plain else '__asm__'}, ran, matched)")
                    break
                errors.append(f"{'asm' if plain else '__asm__'}: {error}")
            else:
                found[feature] = False
                notes.append(f"{feature}: no ({'; '.join(errors)})")
        said = "; ".join(notes)
    dev.ptx = found
    dev.data["inline_ptx"] = said
    return found


def ptx_options(dev) -> dict[str, int]:
    """Build options of a kernel that uses inline PTX: the spelling of the statement the probes found."""
    return {"PTX_ASM_PLAIN": 1} if ptx(dev).get("plain_asm") else {}


def _probe(dev, feature: str, plain: int) -> str | None:
    """None where ptx_probe's `feature` builds, runs and gives the expected values; else what failed."""
    import pyopencl as cl
    rng = np.random.default_rng(7)
    p = rng.integers(0, 2**32, size=64, dtype=np.uint64).astype(np.uint32)
    try:
        opts = {"PTX_PROBE": 1, f"PTX_{feature.upper()}": 1}
        if plain:
            opts["PTX_ASM_PLAIN"] = 1
        prog = build(dev, opts)
        pb, ob = dev.buffer_with(p.view(np.int32)), dev.new_buffer(64 * 4)
        cl.enqueue_fill_buffer(dev.queue, ob, np.float32(-1.0), 0, 64 * 4)
        kernel = cl.Kernel(prog, "ptx_probe")
        kernel.set_args(pb, np.uint32(0), ob, np.uint32(0))
        cl.enqueue_nd_range_kernel(dev.queue, kernel, (32,), (32,))
        out = np.empty(64, np.float32)
        cl.enqueue_copy(dev.queue, out, ob, is_blocking=True)
    except Exception as e:  # noqa: BLE001  (the driver's own error, reported in device data)
        return f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    want, got = probe_expected(p, feature), out[:32] if feature == "dp4a" else out[32:]
    if not np.array_equal(got.astype(np.int64), want):
        return f"the probe ran but computed {got[:4].tolist()}... where {want[:4].tolist()}... were due"
    return None


def probe_expected(p, feature: str):
    """What ptx_probe must give for its inputs p (64 words): dp4a of p[i]'s unsigned and p[32 + i]'s
    signed bytes plus i; lane i ^ 5's own index (the fence's probe writes that too, after a fence)."""
    if feature in ("shfl", "fence"):
        return np.arange(32) ^ 5
    shifts = np.arange(0, 32, 8, dtype=np.uint32)
    u = (p[:32, None] >> shifts & 0xFF).astype(np.int64)
    s = (p[32:, None] >> shifts & 0xFF).astype(np.int64)
    return (u * np.where(s > 127, s - 256, s)).sum(1) + np.arange(32)


def matmul_shape(dev, m: int, n: int) -> dict[str, int]:
    """The tiled product's tile: 64 x 64 outputs a work-group, 4 x 4 a thread, where the device allows
    256 threads a work-group; 32 x 32 (64 threads) where it does not, or where a 64 x 64 tile would
    leave a GPU with fewer than MATVEC_MIN_GROUPS work-groups."""
    big = dev.max_wg >= 256 and (dev.is_cpu or -(-m // 64) * -(-n // 64) >= MATVEC_MIN_GROUPS)
    shape = {"bm": 64, "bn": 64, "tm": 4, "tn": 4} if big else {"bm": 32, "bn": 32, "tm": 4, "tn": 4}
    shape.update(settings.read(MATMUL_ENV))
    return shape


def reg_shape(dev, m: int) -> dict[str, int] | None:
    """The register-tiled product's shape where it serves (CPU devices; ``reg=1`` in MATMUL_ENV forces
    it, ``reg=0`` keeps it off): rows of x by weight rows a work-item, and the work-group size."""
    env = settings.read(MATMUL_ENV)
    if not env.get("reg", int(dev.is_cpu)):
        return None
    tm = 1 if m == 1 else 2 if m <= 2 else 4
    shape = {"tm": tm, "tn": 4, "wg": 16}
    shape.update({k[1:]: v for k, v in env.items() if k in ("rtm", "rtn", "rwg")})
    return shape


def _binary_cache() -> str | None:
    """pyopencl's binaries under the plugin's cache folder, or None (caching off, or the folder cannot be
    written: said once, and kernels are then built each run)."""
    root = cache_dir()
    if root is None:
        return None
    folder = root / "pyopencl"
    why = caches.unwritable(folder)
    if why is not None:
        caches.report(f"OpenCL kernel cache {folder} cannot be written ({why}): kernels are built without it",
                      once_key=f"opencl:{folder}")
        return None
    return str(folder)


def build(dev, options: dict[str, int]):
    """The program of kernels.cl for these build options, built once per device."""
    key = tuple(sorted(options.items()))
    prog = dev.programs.get(key)
    if prog is None:
        import pyopencl as cl
        flags = [f"-D{k}={v}" for k, v in key] + ["-cl-std=CL1.2"]
        folder = _binary_cache()
        try:
            # cache_dir=False: no on-disk binaries (pyopencl's default folder would ignore FRAMEWORK_CACHE=off)
            prog = cl.Program(dev.context, source()).build(options=flags, cache_dir=folder or False)
        except cl.RuntimeError as e:
            raise RuntimeError(f"{dev.name}: building kernels.cl with {' '.join(flags)} failed: {e}") from None
        dev.programs[key] = prog
    return prog
