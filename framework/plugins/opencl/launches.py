"""How the OpenCL plugin's lowering appends a kernel launch: its arguments by name (signatures.py), put
in the kernel's order as the skeleton's Step (tensors as binds, the rest as parameters), with its build
options and its global and local sizes."""

from __future__ import annotations

from dataclasses import dataclass

from ...backend import Ref, Step
from . import kernels
from .signatures import arguments


@dataclass(frozen=True)
class Launch:
    """A Step's kernel: which kernel of which build, and the tensor parameters it reads as float4 (their
    offsets must be multiples of 4)."""
    kernel: str
    options: dict
    vec4: tuple = ()


def launch(lw, name: str, kernel: str, options: dict, n_items: int, lsize: int | None, /, vec4: tuple = (),
           **args) -> None:
    """One launch of `kernel` over n_items work-items (rounded up to whole work-groups of lsize); every
    parameter of its signature given by name, and no other."""
    gsize = max(lsize, -(-int(n_items) // lsize) * lsize) if lsize else int(n_items)
    binds, rw, values = arguments(name, kernel, args)
    lw.emit(Step(name, Launch(kernel, options, tuple(vec4)), binds, rw, values, (gsize, lsize)))


def ewg(dev) -> int:
    """The work-group of the one-thread-an-element kernels."""
    return min(kernels.EWG, dev.max_wg)


def each(lw, node, kernel: str, n_items: int, /, **args) -> None:
    """A one-thread-an-element kernel of the base build."""
    launch(lw, f"{node.op} {node.name}", kernel, kernels.base_options(lw.dev), n_items, ewg(lw.dev), **args)


def float_options(dev, dtype: str) -> dict:
    """The build of a float kernel reading elements of dtype (F32, or F16 as half)."""
    opts = kernels.base_options(dev)
    if dtype == "F16":
        opts.update(ELEM="half", ELEM_HALF=1)
    return opts


__all__ = ["Launch", "Ref", "each", "ewg", "float_options", "launch"]
