"""On-disk caches: how they are written and read, and the list that ``framework cache`` shows.

Every cache of the project follows the same rules:
  * a file is written to a temporary name in its folder and renamed into place (``write_atomic``), so a
    reader never sees half a file, and two processes filling one cache each rename a whole file;
  * what is read back is checked against a size and a digest recorded when it was written; an entry
    that does not match is reported (``report``), deleted and rebuilt, never used;
  * a folder that cannot be written is reported once per process and the run goes on uncached.

A cache registers its folder with ``register(name, folder_fn)`` when its module is imported.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

DIGEST = "blake2b-128"


def digest_bytes(data) -> str:
    """The digest recorded for cached bytes (any buffer: bytes, memoryview, a numpy array)."""
    return hashlib.blake2b(memoryview(data).cast("B"), digest_size=16).hexdigest()


def digest_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16)).hexdigest()


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
        os.replace(tmp, path)
    except BaseException:        # an interrupt mid-write leaves no temporary file behind
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot hold cache files (None when it can): made if missing, then written to."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=folder)
        os.close(fd)
        os.unlink(probe)
        return None
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"


_REPORTED: set[str] = set()


def report(message: str, once_key: str | None = None) -> None:
    """One line on stderr about a cache (an entry rebuilt, a folder not writable); with ``once_key``, at
    most once per process for that key."""
    if once_key is not None:
        if once_key in _REPORTED:
            return
        _REPORTED.add(once_key)
    sys.stderr.write(f"cache: {message}\n")
    sys.stderr.flush()


@contextlib.contextmanager
def locked(folder: Path, name: str = ".lock") -> Iterator[None]:
    """An exclusive lock on a cache folder between processes (fcntl.flock; a no-op where there is none)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "a+b") as f:
        try:
            import fcntl
        except ImportError:
            yield
            return
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


# -- the caches of the project (framework cache) ------------------------------------------------------
@dataclass(frozen=True)
class CacheInfo:
    name: str
    what: str
    folder: Callable[[], Path | None]


CACHES: dict[str, CacheInfo] = {}


def register(name: str, what: str, folder: Callable[[], Path | None]) -> None:
    CACHES[name] = CacheInfo(name, what, folder)


def folder_size(folder: Path) -> tuple[int, int]:
    """(files, bytes) under a folder."""
    files = size = 0
    for root, _, names in os.walk(folder):
        for n in names:
            with contextlib.suppress(OSError):
                size += os.lstat(os.path.join(root, n)).st_size
                files += 1
    return files, size


def clear(folder: Path) -> int:
    """Delete a cache folder; the bytes freed."""
    _, size = folder_size(folder)
    shutil.rmtree(folder)
    return size
