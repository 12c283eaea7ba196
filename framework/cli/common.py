"""What every command shares: loading the model and devices, one-line errors, progress."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

err = Console(stderr=True, highlight=False)


class UsageError(Exception):
    """A bad value on the command line: printed as one line, exit status 2."""


def model_path(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    from ..model.default import default_model_path
    return default_model_path()


def load_model(arg: str | None):
    from ..model.model import Model
    path = model_path(arg)
    with err.status(f"reading {path.name}"):
        return Model(path)


def select_devices(spec: str):
    """Resolve --backends; say when two chosen devices are one physical device."""
    from ..core.registry import default_registry
    registry = default_registry()
    devices = registry.select(spec)
    for group in registry.same_silicon():
        chosen = [d.name for d in group if d in devices]
        if len(chosen) > 1:
            err.print(f"[yellow]note: {' and '.join(chosen)} are one physical device ({group[0].physical_id}) "
                      f"reached through two plugins[/yellow]")
    return devices


@contextmanager
def weight_progress(label: str = "unpacking weights"):
    """A progress bar over the bytes of weights a device loads (shown on stderr when it is a terminal)."""
    with Progress(TextColumn(f"[bold]{label}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(label, total=None)

        def update(name: str, done: int, total: int) -> None:
            bar.update(task, completed=done, total=total, description=name)

        yield update


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def fail(message: str, code: int = 2) -> int:
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return code


def out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
