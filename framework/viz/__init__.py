"""Views of a plan: where every node runs, why, and what it costs.

    view = PlanView.from_session(session, n_prompt, n_predict)     # reserved, or failed with its error
    view = PlanView.after_run(session)                              # what ran, with measured time
    write_view(view, Path("plan.html"))                             # .html .svg .dot .json .txt

Formats: a self-contained interactive HTML page, Graphviz's fragment graph (.dot, or .svg laid
out by the `dot` program), the plan record (.json), and a terminal summary (.txt).
"""

from __future__ import annotations

import json
from pathlib import Path

from .dot import INSTALL_HINT, dot_program, render_dot, render_svg
from .html import render_html, view_data
from .record import UNPLACED, PlanView, estimated_cost, layer_of, plan_with_unplaced
from .text import render_text

FORMATS = (".html", ".svg", ".dot", ".json", ".txt")


class GraphvizMissing(RuntimeError):
    """An .svg was asked for without Graphviz's dot; the .dot was written instead."""


def render(view: PlanView, fmt: str) -> str:
    if fmt == ".html":
        return render_html(view)
    if fmt == ".dot":
        return render_dot(view)
    if fmt == ".svg":
        return render_svg(render_dot(view))
    if fmt == ".json":
        return json.dumps(view.record(), indent=1)
    if fmt == ".txt":
        return render_text(view)
    raise ValueError(f"unknown view format '{fmt}': use one of {', '.join(FORMATS)}")


def write_view(view: PlanView, path: Path) -> Path:
    """Write the view in the format the extension names; returns the file written.

    An .svg without Graphviz installed writes the .dot beside it and raises GraphvizMissing, which says
    how to install Graphviz and render the .dot."""
    fmt = path.suffix.lower()
    if fmt not in FORMATS:
        raise ValueError(f"cannot tell the view format from '{path.name}': name it .html, .svg, .dot, .json or .txt")
    if fmt == ".svg" and dot_program() is None:
        dot = path.with_suffix(".dot")
        dot.write_text(render_dot(view), encoding="utf-8")
        raise GraphvizMissing(f"cannot write {path}: " + INSTALL_HINT.format(dot=dot, svg=path)
                              + f"; the graph was written to {dot}")
    path.write_text(render(view, fmt), encoding="utf-8")
    return path


__all__ = [
    "FORMATS",
    "UNPLACED",
    "GraphvizMissing",
    "PlanView",
    "estimated_cost",
    "layer_of",
    "plan_with_unplaced",
    "render",
    "render_dot",
    "render_html",
    "render_svg",
    "render_text",
    "view_data",
    "write_view",
]
