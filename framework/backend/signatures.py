"""A kernel source's parameters, named once for C and for Python: each kernel's signature is a list of
``kind name`` items; the plugin says what each kind becomes in its C dialect (``{n}`` for the name), and
the skeleton generates the ``ARGS_<kernel>`` macros the source's definitions use and gives the launch
code each kernel's (kind, name) list, so the source and the arguments bound by name cannot drift apart."""

from __future__ import annotations


class Signatures:
    def __init__(self, plugin: str, table: dict[str, str], c_kinds: dict[str, str], buffers: tuple[str, ...]):
        """buffers: the kinds bound as buffers (tensors, weight chunks); the others are values."""
        self.plugin, self.table, self.c_kinds, self.buffers = plugin, table, c_kinds, buffers

    def params(self, kernel: str) -> list[tuple[str, str]]:
        """(kind, name) of each parameter of a kernel, in order."""
        out = []
        for item in self.table[kernel].split(","):
            kind, name = item.split()
            if kind not in self.c_kinds:
                raise ValueError(f"{self.plugin} signatures: unknown kind {kind!r} in {kernel}")
            out.append((kind, name))
        return out

    def c_header(self) -> str:
        """The ARGS_<kernel> macros, prepended to the kernel source."""
        return "".join(f"#define ARGS_{k} {', '.join(self.c_kinds[kind].format(n=n) for kind, n in self.params(k))}\n"
                       for k in self.table)

    def arguments(self, name: str, kernel: str, args: dict) -> tuple[list, tuple[bool, ...], dict]:
        """A launch's arguments given by name, checked against the kernel's signature (every parameter given,
        and no other): the buffers in order, whether each is written, and the values by name."""
        binds, rw, values = [], [], {}
        for kind, pname in self.params(kernel):
            if pname not in args:
                raise ValueError(f"{name}: kernel {kernel} needs parameter '{pname}', not given")
            if kind in self.buffers:
                binds.append(args[pname])
                rw.append(kind == "out")
            else:
                values[pname] = args[pname]
        extra = sorted(set(args) - {pname for _, pname in self.params(kernel)})
        if extra:
            raise ValueError(f"{name}: kernel {kernel} has no parameter {', '.join(extra)}")
        return binds, tuple(rw), values
