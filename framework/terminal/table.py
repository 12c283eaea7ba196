"""Plain tables for a terminal and for a pipe alike: columns as wide as their content, two spaces
between them, nothing padded at the end of a line. A row's note (a reason, a label) goes on its own
indented line under the row, wrapped to the terminal's width (never when piped, so that one note is
one line to grep), so the columns stay narrow enough for 80 columns."""

from __future__ import annotations

import shutil
import textwrap
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape

NOTE_INDENT = "    "


@dataclass
class Row:
    cells: list[str]
    note: str = ""
    style: str = ""          # a rich style for the whole row and its note on a terminal ("yellow")


def render(headers: list[str], rows: list[Row], right: tuple[int, ...] = (), width: int | None = None) -> list[str]:
    """The table's lines (no markup). ``right``: indices of right-aligned columns; ``width``: where notes
    wrap (None: they do not)."""
    widths = [max(len(c) for c in col) for col in zip(headers, *(r.cells for r in rows))]

    def line(cells: list[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))]
        return "  ".join(parts).rstrip()

    lines = [line(headers)]
    for r in rows:
        lines.append(line(r.cells))
        if r.note:
            lines += _wrapped(r.note, width)
    return lines


def _wrapped(note: str, width: int | None) -> list[str]:
    if width is None:
        return [NOTE_INDENT + note]
    return textwrap.wrap(note, width=max(40, width), initial_indent=NOTE_INDENT, subsequent_indent=NOTE_INDENT,
                         break_on_hyphens=False, break_long_words=False) or [NOTE_INDENT]


def print_table(console: Console, headers: list[str], rows: list[Row], right: tuple[int, ...] = (),
                title: str | None = None) -> None:
    """Print on ``console``: coloured on a terminal, plain (and unwrapped) when piped."""
    width = shutil.get_terminal_size().columns if console.is_terminal else None
    if title:
        console.print(escape(title), soft_wrap=True, highlight=False)
    lines = render(headers, rows, right, width)
    console.print(f"[bold]{escape(lines[0])}[/bold]", soft_wrap=True, highlight=False)
    i = 1
    for r in rows:
        n = 1 + (len(_wrapped(r.note, width)) if r.note else 0)
        for text in lines[i:i + n]:
            console.print(f"[{r.style}]{escape(text)}[/{r.style}]" if r.style else escape(text), soft_wrap=True,
                          highlight=False)
        i += n


def print_wrapped(console: Console, text: str) -> None:
    """A line of prose after a table: wrapped to a terminal's width, its continuation lines indented as a
    row's note is; one line when piped."""
    width = shutil.get_terminal_size().columns if console.is_terminal else None
    lines = [text] if width is None else textwrap.wrap(text, width=max(40, width), subsequent_indent=NOTE_INDENT,
                                                       break_on_hyphens=False, break_long_words=False)
    for line in lines:
        console.print(escape(line), soft_wrap=True, highlight=False)
