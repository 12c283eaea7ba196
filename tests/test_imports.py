"""The package's structure, read from its imports: no import cycle in framework/, and no import from a
lower floor to a higher one. Every import counts, those inside functions too (read with ast, nothing is
imported): an import deferred into a function still ties the two modules together."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The floors, from the ground up: a module imports from its own floor or the ones below it. A module
# belongs to the floor of the longest prefix below that names it; a module on no floor fails the test.
FLOORS = (
    ("framework.settings", "framework.caches", "framework.exit_codes"),    # the environment, the disk, exits
    ("framework.core",),                   # the graph and what device memory holds (core/ but its scheduler)
    ("framework.contract",),                                   # what a plugin implements and imports
    ("framework.core.scheduler",),                             # plans over the contract's devices
    ("framework.registry",),                                   # finding plugins, choosing devices
    ("framework.backend",),                                    # the skeleton of device-memory backends
    ("framework.plugins",),                                    # the built-in plugins
    ("framework.model", "framework.conformance"),              # a model file's graph; the op suite
    ("framework.runtime",),                                    # sessions: running a model
    ("framework.viz", "framework.terminal"),                   # views of plans; terminal output
    ("framework.serve", "framework.bench"),                    # the server and the benchmarks
    ("framework.cli", "framework.__main__"),                   # the command line over all of them
)


def modules() -> dict[str, tuple[Path, list[str]]]:
    """Every module of framework/: dotted name -> (file, the package its relative imports start from)."""
    out = {}
    for path in sorted((ROOT / "framework").rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        package = parts[:-1]
        if parts[-1] == "__init__":
            parts = package = parts[:-1]
        out[".".join(parts)] = (path, package)
    return out


def imports(path: Path, package: list[str], known) -> set[str]:
    """The framework modules a file imports, anywhere in it: `from a import b` is module a.b when that is
    a module, else a (a name a's __init__ hands on)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in known else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, package, known) - {name} for name, (path, package) in known.items()}


def floor_of(module: str) -> int | None:
    best = None
    for level, prefixes in enumerate(FLOORS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and (best is None or len(p) > len(best[1])):
                best = (level, p)
    return None if best is None else best[0]


def cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    component.add(m)
                    if m == node:
                        break
                if len(component) > 1:
                    out.append(frozenset(component))
    return out


def test_every_module_stands_on_a_floor():
    lost = sorted(m for m in modules() if m != "framework" and floor_of(m) is None)
    assert not lost, f"{', '.join(lost)}: on no floor of tests/test_imports.py FLOORS; add it where it belongs"


def test_no_import_runs_from_a_lower_floor_to_a_higher_one():
    upward = sorted((module, t) for module, targets in graph().items() for t in targets
                    if floor_of(module) is not None and floor_of(t) > floor_of(module))
    assert not upward, "imports that climb a floor (move what they take down, or the importer up): " + "; ".join(
        f"{a} (floor {floor_of(a)}) imports {b} (floor {floor_of(b)})" for a, b in upward)


def test_no_import_cycle():
    found = sorted(sorted(c) for c in cycles(graph()))
    assert not found, "modules that import each other (directly or around a loop): " + "; ".join(
        " <-> ".join(c) for c in found)


def test_the_reader_sees_imports_inside_functions_and_cycles_through_them(tmp_path):
    """The checks above are only as good as the reader: a deferred import is an edge, and a loop of three
    is one cycle."""
    (tmp_path / "a.py").write_text("def f():\n    from .b import x\n    return x\n")
    known = {"p.a": None, "p.b": None, "p.c": None}
    assert imports(tmp_path / "a.py", ["p"], known) == {"p.b"}
    assert cycles({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}, "p.d": {"p.a"}}) == [
        frozenset({"p.a", "p.b", "p.c"})]
    assert floor_of("framework.core.scheduler.plan") > floor_of("framework.contract") > floor_of(
        "framework.core.graph.ops")
