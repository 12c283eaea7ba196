"""One launch of a CUDA kernel as a step of the skeleton's program, its arguments checked by name against
the kernel's signature (signatures.py): what lowering.py's op functions and fused.py's groups emit."""

from __future__ import annotations

from dataclasses import dataclass

from ...backend import Step
from . import kernels
from .signatures import arguments


@dataclass(frozen=True)
class Launch:
    """A Step's kernel: which kernel of which build."""
    kernel: str
    options: dict


def launch(lw, name: str, kernel: str, options: dict, n_items: int, block: int, /, **args) -> None:
    """One launch of `kernel` over n_items threads (whole blocks of `block`); every parameter of its
    signature given by name, and no other."""
    binds, rw, values = arguments(name, kernel, args)
    lw.emit(Step(name, Launch(kernel, options), binds, rw, values, (max(1, -(-int(n_items) // block)), block)))


def each(lw, node, kernel: str, n_items: int, /, **args) -> None:
    """A one-thread-an-element kernel of the base build."""
    launch(lw, f"{node.op} {node.name}", kernel, kernels.base_options(), n_items, kernels.EWG, **args)
