"""The fragment graph for Graphviz: one box per fragment, an edge per dependency between fragments
(labelled with the bytes copied when it crosses devices). One cluster per phase."""

from __future__ import annotations

import shutil
import subprocess

from .record import UNPLACED, PlanView, human_bytes

PALETTE = ["#a6c8ec", "#b5dfa8", "#dcc3e6", "#b9e0dd", "#f5e4a3", "#d9c4b3", "#f4b6c2", "#cccccc"]
INSTALL_HINT = ("Graphviz's dot program is not installed; on Debian: apt-get install graphviz "
                "(then: dot -Tsvg {dot} -o {svg})")


def colours(lanes: list[str]) -> dict[str, str]:
    return {d: ("#f6c6c6" if d == UNPLACED else PALETTE[i % len(PALETTE)]) for i, d in enumerate(lanes)}


def _q(text: str) -> str:
    """A DOT string; its text keeps DOT's own escapes (\\n for a line break) and quotes are escaped."""
    return '"' + text.replace('"', '\\"') + '"'


def _e(name: str) -> str:
    """A name inside a DOT label: backslashes are not escapes."""
    return name.replace("\\", "\\\\")


def render_dot(view: PlanView) -> str:
    fill = colours(view.lanes)
    out = ["digraph plan {", '  graph [rankdir=TB, fontname="Helvetica", fontsize=12, newrank=true];',
           '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];',
           '  edge [fontname="Helvetica", fontsize=9];']
    title = _e(f"{view.model} on {', '.join(d.name for d in view.devices)}")
    if view.error is not None:
        title += f"\\nRESERVATION FAILED [{view.error.code}]"
    out.append(f"  label={_q(title)}; labelloc=t;")
    for p, (phase, plan) in enumerate(view.plans.items()):
        marks = view.error_marks(plan)
        extras = view.fragment_extras(phase)
        out.append(f"  subgraph cluster_{p} {{")
        out.append(f"    label={_q(_e(phase))}; style=rounded; color=\"#999999\";")
        for f, x in zip(plan.fragments, extras):
            names = _e(f.nodes[0].name if len(f.nodes) == 1 else f"{f.nodes[0].name} .. {f.nodes[-1].name}")
            label = (f"#{f.index} {_e(f.device)}\\n{names}\\n{len(f.nodes)} node{'s' if len(f.nodes) > 1 else ''}, "
                     f"{f.commands} command{'s' if f.commands != 1 else ''}")
            attrs = {"fillcolor": fill.get(f.device, "#eeeeee"),
                     "tooltip": _e(" ".join(f"{n.name}({n.op})" for n in f.nodes[:60]))}
            if x["fallbacks"]:
                label += f"\\n{x['fallbacks']} fallbacks"
                attrs.update(color="#f28e2b", penwidth="3")
            if "seconds" in x:
                label += f"\\n{x['seconds'] * 1000:.2f} ms"
            if f.index in marks.get("fragments", ()):
                label += f"\\nERROR [{view.error.code}] at {_e(', '.join(marks['nodes'][:2]))}"
                attrs.update(color="#e15759", penwidth="4", fontcolor="#b00020")
            attrs["label"] = label
            out.append(f"    p{p}f{f.index} [" + ", ".join(f"{k}={_q(v)}" for k, v in attrs.items()) + "];")
        frag_of = {id(n): f.index for f in plan.fragments for n in f.nodes}
        if plan.graph.meta.get("role") == "draft" and view.shared:
            out += _shared_node(view, plan, p)
        edges: dict[tuple[int, int], list] = {}
        for f in plan.fragments:
            for t in f.inputs:
                src = frag_of.get(id(t))
                if src is not None:
                    edges.setdefault((src, f.index), []).append(t)
        copied = {(c.fragment, c.tensor): c.nbytes for c in plan.copies}
        for (a, b), tensors in edges.items():
            nbytes = sum(copied.get((b, t.name), 0) for t in tensors)
            if nbytes:
                label = f"{human_bytes(nbytes)}" + (f" ({len(tensors)})" if len(tensors) > 1 else "")
                out.append(f"    p{p}f{a} -> p{p}f{b} [label={_q(label)}, color=\"#333333\", penwidth=1.6, "
                           f"tooltip={_q(_e(', '.join(t.name for t in tensors)))}];")
            else:
                out.append(f"    p{p}f{a} -> p{p}f{b} [color=\"#bbbbbb\", arrowsize=0.6];")
        out.append("  }")
    out.append("}")
    return "\n".join(out) + "\n"


def _shared_node(view: PlanView, plan, p: int) -> list[str]:
    """The target's tensors a draft's fragments use in place: one box, a dashed edge to every fragment
    that reads or writes one of them."""
    users = {}
    for f in plan.fragments:
        names = {t.name for t in f.inputs if t.is_leaf and view.is_shared(t, plan)}
        names |= {s.storage.name for n in f.nodes for s in n.src
                  if s.storage.is_leaf and view.is_shared(s.storage, plan)}
        if names:
            users[f.index] = sorted(names)
    if not users:
        return []
    held = sorted({d for d, _ in view.shared.values()})
    caches = sorted({n for names in users.values() for n in names if n.startswith("cache_")})
    weights = sorted({n for names in users.values() for n in names if not n.startswith("cache_")})
    label = (f"the target's, shared in place\\non {', '.join(held)}\\n{len(caches)} cache tensors, "
             f"{len(weights)} weights")
    out = [f"    p{p}shared [shape=cylinder, style=\"dashed,filled\", fillcolor=\"#ffffff\", label={_q(label)}, "
           f"tooltip={_q(_e(', '.join(caches + weights)))}];"]
    for idx, names in users.items():
        out.append(f"    p{p}shared -> p{p}f{idx} [style=dashed, dir=both, color=\"#e15759\", "
                   f"tooltip={_q(_e(', '.join(names)))}];")
    return out


def dot_program() -> str | None:
    return shutil.which("dot")


def render_svg(dot_text: str) -> str:
    """Lay out with Graphviz's dot; raises FileNotFoundError when it is absent."""
    exe = dot_program()
    if exe is None:
        raise FileNotFoundError("dot")
    done = subprocess.run([exe, "-Tsvg"], input=dot_text.encode(), capture_output=True, timeout=300,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"dot failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode()
