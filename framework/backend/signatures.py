"""A kernel source's parameters, named once for C and for Python: each kernel's signature is a list of
``kind name`` items; the plugin says what each kind becomes in its C dialect (``{n}`` for the name), and
the skeleton generates the ``ARGS_<kernel>`` macros the source's definitions use and gives the launch
code each kernel's (kind, name) list, so the source and the arguments bound by name cannot drift apart."""

from __future__ import annotations


class Signatures:
    def __init__(self, plugin: str, table: dict[str, str], c_kinds: dict[str, str]):
        self.plugin, self.table, self.c_kinds = plugin, table, c_kinds

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
