"""The CPU figures the docs cite, measured again here and printed beside the docs' values.

    .venv/bin/python benchmarks/docs_figures.py                          # every table below, both models
    .venv/bin/python benchmarks/docs_figures.py --models smollm2 --backends cpu

Covered: docs/memory.md's two tables (declared bytes held per file byte, and the peak resident set of
`framework run -n 8` per plugin, both from benchmarks/peak_rss.py's functions). Each line is one cell:
the table, the model, the column, the docs' value, the value measured now and their ratio; a ratio far
from 1 means the doc needs the new figure (with its command, CPU and date). Speed figures are not
re-measured here: they depend on the machine's load, and `framework bench` measures them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import peak_rss  # noqa: E402

MEMORY_DOC = ROOT / "docs" / "memory.md"
MODELS = {"smollm2": "smollm2", "gemma": "gemma3"}          # a table row's first word -> packaged model
HELD_TABLE = "held per file byte"
PEAK_TABLE = "peak RSS, MiB"


def markdown_tables(text: str) -> dict[str, list[list[str]]]:
    """Every table of a markdown text by the first cell of its header row: its rows of cells, header first,
    the |---| line left out."""
    tables: dict[str, list[list[str]]] = {}
    current: list[list[str]] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            current = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(re.fullmatch(r":?-+:?", c) for c in cells):
            continue
        if current is None:
            current = tables.setdefault(cells[0], [])
        current.append(cells)
    return tables


def doc_cells(table: list[list[str]]) -> dict[tuple[str, str], float]:
    """{(model, column's first word): the cell's first number} of a table whose rows start with a model name."""
    header, *rows = table
    cells = {}
    for row in rows:
        model = MODELS.get(row[0].split()[0].lower())
        for column, cell in zip(header[1:], row[1:]):
            number = re.match(r"[\d.]+", cell)
            if model and number:
                cells[model, column.split()[0]] = float(number.group())
    return cells


def table_starting(tables: dict[str, list[list[str]]], prefix: str) -> list[list[str]]:
    """The one table whose header starts with ``prefix``; the doc changed shape if there is none."""
    found = [t for head, t in tables.items() if head.startswith(prefix)]
    if len(found) != 1:
        sys.exit(f"docs_figures.py: {MEMORY_DOC} has {len(found)} tables headed '{prefix}...', expected 1: "
                 f"update this script's table names to the doc's")
    return found[0]


def show(table: str, model: str, column: str, doc: float, measured: float | None) -> None:
    digits = 2 if doc < 20 else 0               # bytes per byte to two places, MiB whole
    now = "failed" if measured is None else f"{measured:.{digits}f}"
    ratio = "" if measured is None else f"{measured / doc:.2f}x"
    print(f"{table:<20} {model:<8} {column:<14} {doc:>9.{digits}f} {now:>9} {ratio:>7}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="smollm2,gemma3")
    p.add_argument("--backends", default=",".join(peak_rss.BACKENDS),
                   help=f"keys of: {'; '.join(peak_rss.BACKENDS)}")
    args = p.parse_args()
    models = args.models.split(",")
    tables = markdown_tables(MEMORY_DOC.read_text())
    print(f"{'table':<20} {'model':<8} {'column':<14} {'docs':>9} {'now':>9} {'now/docs':>7}")
    held = peak_rss.held_per_byte(models)
    for (model, device), doc in doc_cells(table_starting(tables, HELD_TABLE)).items():
        if model in models:
            show(HELD_TABLE, model, device, doc, held.get((model, device)))
    keys = {key.split()[0]: key for key in peak_rss.backend_keys(args.backends)}
    peaks = doc_cells(table_starting(tables, PEAK_TABLE))
    if peaks:
        base = peak_rss.baseline_rss() / 2**20
        print(f"(baseline now: {base:.0f} MiB; the doc's peaks include its own baseline)")
    for (model, column), doc in peaks.items():
        if model in models and column in keys:
            peak = peak_rss.run_peak_rss(model, keys[column])
            show(PEAK_TABLE, model, column, doc, None if peak is None else peak / 2**20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
