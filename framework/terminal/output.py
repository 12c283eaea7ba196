"""The two streams: generated text and results on stdout, everything else (notes, progress, errors,
summaries) on stderr, so that `framework run ... > out.txt` keeps only the text."""

from __future__ import annotations

import sys

from rich.console import Console

err = Console(stderr=True, highlight=False)

_line_open = False      # the text streamed to stdout does not end with a newline yet


def out(text: str) -> None:
    global _line_open
    if not text:
        return
    sys.stdout.write(text)
    sys.stdout.flush()
    _line_open = not text.endswith("\n")


def start_output() -> None:
    """A command starts with nothing streamed (main() may run several times in one process)."""
    global _line_open
    _line_open = False


def end_line() -> None:
    """End the streamed text's line, so that what stderr prints next starts on a line of its own."""
    if _line_open:
        out("\n")
