"""What a lowered program is made of: every tensor of a fragment is a ``Ref`` (an argument or a value
computed in the program), a weight's chunk a ``ChunkArg``, a rope table a ``RopeArg``; every kernel
dispatch a ``Step`` over them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.device_buffers import Ref


@dataclass(frozen=True)
class ChunkArg:
    """Chunk `chunk` of the weight that is argument `arg`; as a parameter, that chunk's scale-plane word offset."""
    arg: int
    chunk: int


@dataclass(frozen=True)
class RopeArg:
    """The (cos, sin) rows of rope table `table` for this run's positions (Program.rope_tables)."""
    table: int


@dataclass
class Step:
    """One dispatch: the plugin's kernel, its tensor operands in the kernel's order (Ref, ChunkArg,
    RopeArg, or None for a binding the kernel does not read), which of them it writes, its parameters by
    name and its grid (the plugin's: workgroups, or global and local sizes)."""
    name: str                 # "OP[variant] node": what profiles and tests see
    kernel: object
    binds: list
    rw: tuple
    params: dict
    grid: tuple
    reads: tuple = field(init=False)        # computed values read
    writes: tuple = field(init=False)       # ... and written
    arg_reads: tuple = field(init=False)    # the program's arguments read
    arg_writes: tuple = field(init=False)   # ... and written (caches)

    def __post_init__(self):
        refs = [(b, w) for b, w in zip(self.binds, self.rw) if isinstance(b, Ref)]
        self.reads = tuple(b.idx for b, w in refs if b.kind == "val" and not w)
        self.writes = tuple(b.idx for b, w in refs if b.kind == "val" and w)
        self.arg_reads = tuple(b.idx for b, w in refs if b.kind == "arg" and not w)
        self.arg_writes = tuple(b.idx for b, w in refs if b.kind == "arg" and w)


def pad4(shape) -> tuple:
    """A shape of at most 4 axes as 4 (leading 1s)."""
    return (1,) * (4 - len(shape)) + tuple(int(d) for d in shape)


__all__ = ["ChunkArg", "Ref", "RopeArg", "Step", "pad4"]
