"""What every command shares: loading the model and devices, one-line errors, progress."""

from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path

from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from ..exit_codes import EXIT_INPUT
from ..terminal import end_line, err


class UsageError(Exception):
    """A bad value on the command line: printed as one line, exit status 2."""


def load_model(arg: str | None):
    from ..model.default import resolve_model
    from ..model.model import Model
    path = resolve_model(arg)
    with err.status(f"reading {path.name}"):
        model = Model(path)
    for note in model.notes:
        err.print(f"[yellow]note: {escape(note)}[/yellow]", soft_wrap=True)
    return model


@contextmanager
def weight_progress(label: str = "unpacking weights"):
    """A progress bar over the bytes of weights a device loads, then a word for each program it compiles
    (shown on stderr when it is a terminal)."""
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=err, transient=True, disable=not err.is_terminal) as bar:
        task = bar.add_task(label, total=None)

        def update(name: str, done: int, total: int) -> None:
            what = name if name.startswith("compiling ") else f"{label} {name}"
            bar.update(task, completed=done, total=total, description=escape(what))

        yield update


def _checked(text: str, convert, what: str, ok, bound: str):
    """One argument checker's shape: parse `text` with `convert`, then test the value against `ok`."""
    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not {what}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"{value} {bound}")
    return value


def port_number(text: str) -> int:
    """A TCP port: 0 (any free one) to 65535."""
    return _checked(text, int, "a port number (0 to 65535)", lambda v: 0 <= v <= 65535,
                    "is not a port number (0 to 65535)")


def whole_number(text: str) -> int:
    """0 or more."""
    return _checked(text, int, "a whole number", lambda v: v >= 0, "must be 0 or more")


def seconds(text: str) -> float:
    """A finite number of seconds, 0 or more."""
    return _checked(text, float, "a number of seconds", lambda v: math.isfinite(v) and v >= 0,
                    "must be a finite number of seconds, 0 or more")


def positive_int(text: str) -> int:
    """1 or more."""
    return _checked(text, int, "a whole number", lambda v: v >= 1, "must be at least 1")


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", re.IGNORECASE)


def device_memory(text: str) -> tuple[str, int]:
    """--device-memory DEVICE=SIZE: SIZE in bytes, or with K, M, G or T (binary units: 1.5G is 1.5 GiB)."""
    device, sep, size = text.partition("=")
    m = _SIZE.fullmatch(size.strip())
    if not sep or not device.strip() or m is None:
        raise argparse.ArgumentTypeError(f"'{text}' is not DEVICE=SIZE (for example vulkan:0=200M or npu:0=1.5G; a "
                                         f"size in bytes or with K, M, G or T)")
    nbytes = int(float(m[1]) * 1024 ** " kmgt".index((m[2] or " ").lower()))
    if nbytes < 1:
        raise argparse.ArgumentTypeError(f"'{text}': the size must be at least 1 byte")
    return device.strip(), nbytes


def memory_caps(pairs: list[tuple[str, int]] | None) -> dict[str, int]:
    """The --device-memory caps by device; a device capped twice is an error, not a silent choice."""
    caps: dict[str, int] = {}
    for device, nbytes in pairs or ():
        if device in caps:
            raise ValueError(f"--device-memory caps {device} twice ({caps[device]} and {nbytes} bytes): give it once")
        caps[device] = nbytes
    return caps


def check_output(arg: str | None, option: str) -> Path | None:
    """A file the command will write, checked before any work is done: not a folder, in a folder that
    exists and can be written, and writable itself when it exists. Raises UsageError naming the option."""
    if not arg:
        return None
    path = Path(arg)
    if path.is_dir():
        raise UsageError(f"{option} {arg}: that is a folder; name a file in it")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{option} {arg}: the folder {folder} does not exist")
    # try it (permission bits do not answer for root, nor for read-only mounts): open the file for
    # appending, which changes nothing, and make and remove a file in its folder (the write renames one)
    try:
        if path.exists():
            with open(path, "ab"):
                pass
    except OSError as e:
        raise UsageError(f"{option} {arg}: the file cannot be written ({e.strerror or e})") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"{option} {arg}: the folder {folder} cannot be written ({e.strerror or e})") from None
    return path


def write_output(path: Path, text: str) -> None:
    """Write a result file whole or not at all (a temporary file renamed into place): an interrupt or a
    full disk never leaves half a plan behind."""
    from ..caches import write_atomic
    write_atomic(path, text)


def text_argument(text: str, what: str = "the prompt") -> str:
    """A text given on the command line, which must be UTF-8 (Python keeps other bytes of argv as lone
    surrogates: they are named here, with their offset, instead of failing later in a tokenizer)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raw = os.fsencode(text)
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise UsageError(f"{what} is not UTF-8 text: byte 0x{raw[e.start]:02x} at byte offset {e.start} "
                             f"({e.reason}); pass text, not binary data") from None
        raise UsageError(f"{what} is not valid text") from None
    return text


class Terminated(BaseException):
    """SIGTERM arrived: raised in the main thread so that the command stops where it is, like Ctrl-C."""


def on_sigterm(signum, frame) -> None:
    raise Terminated()


def fail(message: str, code: int = EXIT_INPUT) -> int:
    end_line()
    err.print(f"[red]error:[/red] {escape(message)}", soft_wrap=True)
    return code


def show_traceback(e: BaseException) -> None:
    """--debug: the traceback of the error and of what caused it (a plugin's own frames, file and line)."""
    import traceback
    end_line()
    err.print(escape("".join(traceback.format_exception(e)).rstrip()), soft_wrap=True)
