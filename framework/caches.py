"""On-disk caches: how they are written and read, and the list that ``framework cache`` shows.

Every cache of the project follows the same rules:
  * a file is written to a temporary name in its folder and renamed into place (``write_atomic``), so a
    reader never sees half a file, and two processes filling one cache each rename a whole file;
  * what is read back is checked against a size and a digest recorded when it was written; an entry
    that does not match is reported (``report``), deleted and rebuilt, never used;
  * a folder that cannot be written is reported once per process and the run goes on uncached.

A cache whose files a library writes and reads by itself (OpenVINO's blobs, numba's kernels, PoCL's
programs) keeps a ``Manifest`` of their sizes and digests beside them: the folder is checked before the
library may read it (a library's loader can abort the process on a bad file, as PoCL's does) and what the
library wrote is recorded after it ran (``guard`` does both for a whole process).

A cache registers its folder with ``register(name, folder_fn)`` when its module is imported.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
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


# -- a folder that a library writes and reads by itself --------------------------------------------------
MANIFEST = "manifest.json"
_OWN = (MANIFEST, ".lock")             # the manifest's own files, neither checked nor recorded

# files whose digest this process has checked: path -> (size, mtime_ns)
_VERIFIED: dict[str, tuple[int, int]] = {}


class Manifest:
    """The size and digest of every file a library wrote into ``folder`` (``manifest.json`` there).

    * ``check()``, before the library may read the folder: a file the manifest does not know, or that does
      not match it (truncated, corrupt, foreign, a write cut short), is deleted and reported on one line
      naming the cache (``what``) and what happens instead (``rebuilt``); the library builds it again. A
      file's size is always compared, its digest once per process and again whenever its size or
      modification time changes.
    * ``record(kept)``, after the library wrote: the files that are new or changed since ``check`` (the
      library's own rewrites, numba's index of a kernel's signatures say) are added, those gone dropped.

    ``using()`` holds the folder's lock around the three, so two processes filling one cache never record
    each other's half-written files. ``pattern`` (a glob under the folder) says which files are the
    library's; ``format`` and ``entries`` name the manifest's layout."""

    def __init__(self, folder: Path, what: str, rebuilt: str, pattern: str = "**/*",
                 format: str = "framework-cache-manifest/1", entries: str = "files"):
        self.folder, self.what, self.rebuilt, self.pattern = folder, what, rebuilt, pattern
        self.format, self.entries = format, entries
        self.rejected: list[str] = []           # what this process deleted, and why

    def files(self) -> list[Path]:
        return sorted(p for p in self.folder.glob(self.pattern)
                      if p.name not in _OWN and not p.name.startswith(".") and p.is_file() and not p.is_symlink())

    def _name(self, path: Path) -> str:
        return path.relative_to(self.folder).as_posix()

    def read(self) -> dict[str, dict]:
        path = self.folder / MANIFEST
        if not path.is_file():
            return {}
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if data.get("format") != self.format or not isinstance(data.get(self.entries), dict):
                raise ValueError(f"format {data.get('format')!r}")
            return {str(k): v for k, v in data[self.entries].items() if isinstance(v, dict)}
        except (OSError, ValueError, AttributeError) as e:
            report(f"{self.what} manifest {path} is unreadable ({type(e).__name__}: {e}): every file it listed "
                   f"is checked as unknown")
            return {}

    def _write(self, entries: dict[str, dict]) -> None:
        text = json.dumps({"format": self.format, "digest": DIGEST, self.entries: entries}, indent=1, sort_keys=True)
        write_atomic(self.folder / MANIFEST, text)

    def _reject(self, path: Path, why: str) -> None:
        with contextlib.suppress(OSError):
            path.unlink()
        _VERIFIED.pop(str(path), None)
        self.rejected.append(f"{self._name(path)}: {why}")
        report(f"{self.what} {path} {why}: deleted, {self.rebuilt}")

    def _why_bad(self, path: Path, entry: dict | None) -> str | None:
        """Why a file may not be handed to the library (None: it matches the manifest)."""
        st = path.stat()
        if entry is None:
            return f"({st.st_size} bytes) is not in the manifest (a write cut short, or a file from elsewhere)"
        if st.st_size != entry.get("size"):
            return f"holds {st.st_size} bytes, the manifest recorded {entry.get('size')} (truncated or replaced)"
        stamp = (st.st_size, st.st_mtime_ns)
        if _VERIFIED.get(str(path)) != stamp:
            digest = digest_file(path)
            if digest != entry.get("digest"):
                return f"has digest {digest}, the manifest recorded {entry.get('digest')} (corrupt)"
            _VERIFIED[str(path)] = stamp
        return None

    def check(self) -> dict[str, dict]:
        """Delete every file that does not match the manifest; the manifest of the files that remain. A file
        written since a live process began to guard the folder (``guard``) is that process's to record when
        it ends: left alone, neither kept nor deleted."""
        known = self.read()
        first = not (self.folder / MANIFEST).exists()     # a folder filled before it had a manifest
        since = _live_writers_since(self.folder)
        kept: dict[str, dict] = {}
        dropped: list[Path] = []
        for path in self.files():
            name = self._name(path)
            try:
                why, mtime = self._why_bad(path, known.get(name)), path.stat().st_mtime_ns
            except OSError:
                continue
            if why is None:
                kept[name] = known[name]
            elif since is not None and mtime >= since:
                continue
            elif first:
                dropped.append(path)
            else:
                self._reject(path, why)
        for path in dropped:
            with contextlib.suppress(OSError):
                path.unlink()
        if dropped:
            report(f"{self.what}s in {self.folder} have no manifest (a cache from an earlier version, or "
                   f"files from elsewhere): {len(dropped)} deleted, {self.rebuilt}")
        return kept

    def record(self, kept: dict[str, dict]) -> None:
        """After the library ran: add the files it wrote or rewrote since ``check`` (and drop those gone)."""
        entries = {}
        for path in self.files():
            name = self._name(path)
            try:
                st = path.stat()
                if name in kept and _VERIFIED.get(str(path)) == (st.st_size, st.st_mtime_ns):
                    entries[name] = kept[name]
                    continue
                entries[name] = {"size": st.st_size, "digest": digest_file(path)}
            except OSError:
                continue
            _VERIFIED[str(path)] = (st.st_size, st.st_mtime_ns)
        self._write(entries)

    @contextlib.contextmanager
    def using(self) -> Iterator[None]:
        """Around the library's use of the folder: check, use, record, under the folder's lock."""
        with locked(self.folder):
            kept = self.check()
            yield
            self.record(kept)


_GUARDED: dict[str, Manifest] = {}
WRITER = ".writer."         # + a process id: a live process guards the folder and records at its end


def _live_writers_since(folder: Path) -> int | None:
    """When the earliest other live process guarding ``folder`` began (its marker's mtime, ns), or None.
    A marker of a process that is gone is removed."""
    since = None
    for marker in folder.glob(WRITER + "*"):
        pid = marker.name[len(WRITER):]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            with contextlib.suppress(OSError):
                marker.unlink()
            continue
        except PermissionError:         # alive, another user's
            pass
        with contextlib.suppress(OSError):
            mtime = marker.stat().st_mtime_ns
            since = mtime if since is None else min(since, mtime)
    return since


def guard(folder: Path, what: str, rebuilt: str) -> Manifest:
    """For a library that reads its cache folder by itself whenever it likes (numba's kernels, PoCL's
    programs): check the folder now, before the library sees it, and record what the library wrote when
    the process ends (a process that dies first records nothing: the next one deletes those files, said,
    and the library builds them again). Once a process per folder.

    While it runs, a marker (``.writer.PID``) tells processes that start meanwhile to leave alone the
    files written since it began (the library's own, which it records when it ends), rather than delete
    them as unknown."""
    key = str(folder)
    if key not in _GUARDED:
        manifest = _GUARDED[key] = Manifest(folder, what, rebuilt)
        with locked(folder):
            kept = manifest.check()
            (folder / f"{WRITER}{os.getpid()}").touch()
        atexit.register(_record_at_exit, manifest, kept)
    return _GUARDED[key]


def _record_at_exit(manifest: Manifest, kept: dict[str, dict]) -> None:
    try:
        with locked(manifest.folder):
            manifest.record(kept)
            (manifest.folder / f"{WRITER}{os.getpid()}").unlink(missing_ok=True)
    except OSError as e:
        report(f"{manifest.what} manifest in {manifest.folder} cannot be written ({type(e).__name__}: "
               f"{e.strerror or e}): what this run built is checked as unknown next time")


# -- work that a cache keeps for later runs: said, and left out of every speed figure --------------------
_FILLED = {"seconds": 0.0, "depth": 0, "t0": 0.0}


@contextlib.contextmanager
def filling(what: str, cached: bool = True) -> Iterator[None]:
    """Around work whose result a cache keeps for later runs (numba compiling a kernel): the first time in a
    process, one line on stderr says what it is ("compiling the cpu kernels, once: cached for later runs"),
    so that a first run's wait reads as what it is; its time is added to ``filled_seconds()``, which every
    tokens-per-second figure leaves out (``Stopwatch``). Nested uses count once."""
    report_line = f"{what}, once: cached for later runs" if cached else f"{what} (the cache is off: again every run)"
    if _FILLED["depth"] == 0:
        if what not in _REPORTED:
            _REPORTED.add(what)
            sys.stdout.flush()
            # on a terminal the line comes amid the prompt just written: it starts a line of its own
            fresh = "\n" if sys.stdout.isatty() and sys.stderr.isatty() else ""
            sys.stderr.write(f"{fresh}{report_line}\n")
            sys.stderr.flush()
        _FILLED["t0"] = time.perf_counter()
    _FILLED["depth"] += 1
    try:
        yield
    finally:
        _FILLED["depth"] -= 1
        if _FILLED["depth"] == 0:
            _FILLED["seconds"] += time.perf_counter() - _FILLED["t0"]


def filled_seconds() -> float:
    """Seconds this process has spent in ``filling`` (compiling what a cache keeps), or waited for another
    process to (``filled_elsewhere``), up to now."""
    return _FILLED["seconds"] + (time.perf_counter() - _FILLED["t0"] if _FILLED["depth"] else 0.0)


def filled_elsewhere(seconds: float, what: str) -> None:
    """Seconds this process waited while another filled its cache for it (a Ray node compiling its kernels for
    a fragment placed there): said once for ``what``, and left out of speed figures as ``filling`` is."""
    with filling(what):
        pass
    _FILLED["seconds"] += seconds


class Stopwatch:
    """Seconds since it was made, less the time spent filling caches meanwhile (``filled``): a speed figure's
    clock, so a first run's compiling is not counted as prefill or decode."""

    def __init__(self):
        self.t0, self.f0 = time.perf_counter(), filled_seconds()

    @property
    def filled(self) -> float:
        return filled_seconds() - self.f0

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.t0 - self.filled


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
