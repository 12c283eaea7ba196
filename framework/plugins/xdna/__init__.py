"""The XDNA backend plugin: AMD Ryzen AI NPUs through pyxrt (XRT's Python binding).

Matrix products with packed weights run on the NPU (or, emulated, on the host arm); every other op
is refused with its reason, so the plan puts the rest of each layer on the host device.

  geometry.py   the tile geometry, the one function used both to pack and to read
  tiles.py      GGUF weights to Q4_1 tiles and back (numpy)
  cache.py      packed weights cached on disk with a manifest (the second load is a read)
  profiles.py   xdna (Phoenix, Hawk Point) and xdna2 (Strix, Krackan): contexts, ops, chain limit
  kernels.py    the kernel set: xclbin/ELF and instruction streams of the GEMM shapes
  xrt.py        the thin layer that calls pyxrt (the only code that touches the NPU)
  device.py     the device, its programs, the NPU arm and the host arm
  discovery.py  pyxrt importable, an accel device bound to amdxdna, pyxrt.device(i) opening

See docs/xdna.md, which also says plainly what has never run on an NPU.
"""

from ...contract import hookimpl


@hookimpl
def framework_devices():
    from .discovery import discover
    return discover()
