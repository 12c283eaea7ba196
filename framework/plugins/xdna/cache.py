"""The on-disk cache of packed weights: the second load of a model is a read, not a repack.

Layout, under ``$FRAMEWORK_CACHE/xdna`` (default ``~/.cache/framework/xdna``; another folder, or
``off``, with ``FRAMEWORK_XDNA_CACHE_DIR``)::

    <model key>/manifest.json   what is stored, per tensor (below)
    <model key>/packed.bin      the tiles of every tensor, each at its offset (4 KiB aligned)
    <model key>/.lock           held while a process appends (fcntl.flock)

The model key names the GGUF file (stem, plus a hash of its resolved path, size and modification
time); every entry also records a digest of the tensor's GGUF bytes, so a changed file is repacked,
never decoded from stale tiles. An entry::

    {"shape": [N, K], "padded_shape": [Np, Kp], "offset": 4096, "size": 1474560,
     "chunk_kind": "q4_1_tile_32x256_bf16", "chunk_bytes": 5120, "geometry_version": 1,
     "source_dtype": "Q4_1", "source_digest": "...", "conversion": "repacked"}

Reading an entry goes through geometry.check_container: the stored size must be exactly the tiles of
the shape's grid, or of the wider padded shape the entry declares; chunks of another kind, a
truncated file or any other size are errors naming the tensor, offset, size, valid sizes and
remainder. A manifest of another geometry version is stale: it is replaced, never read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...contract import DType, caches, settings
from . import tiles
from .geometry import (
    CHUNK_BYTES,
    CHUNK_KIND,
    GEOMETRY_VERSION,
    GeometryError,
    Grid,
    check_container,
    tile_grid,
)

CACHE_DIR_ENV = "FRAMEWORK_XDNA_CACHE_DIR"
FORMAT = "framework-xdna-packed/1"
ALIGN = 4096
DATA_FILE = "packed.bin"
MANIFEST = "manifest.json"


settings.declare(CACHE_DIR_ENV, "xdna", "a folder, or 'off'", None,
                 "the packed-weight cache; unset: xdna/ under FRAMEWORK_CACHE", settings.folder_or_off)
caches.register("xdna", "XDNA packed weight tiles and their manifests", lambda: default_root())


def default_root() -> Path | None:
    return settings.cache_dir("xdna", CACHE_DIR_ENV)


def model_key(raw: np.ndarray) -> str:
    """The folder of the model a weight's bytes come from: the GGUF file behind a memory map (its
    stem and a hash of path, size and mtime), or 'unnamed' for bytes not read from a file."""
    filename = getattr(raw, "filename", None)
    if not filename:
        return "unnamed"
    path = Path(filename).resolve()
    st = path.stat()
    digest = hashlib.sha256(f"{path}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in path.stem)[:48]
    return f"{stem}-{digest}"


def source_digest(raw: np.ndarray) -> str:
    return hashlib.blake2b(memoryview(np.ascontiguousarray(raw, dtype=np.uint8)).cast("B"),
                           digest_size=16).hexdigest()


@dataclass
class Packed:
    """One packed tensor: its tile bytes (a read-only view of packed.bin, or an array) on ``grid``."""

    name: str
    data: np.ndarray
    grid: Grid
    source_dtype: str
    conversion: str
    origin: str          # "packed" (this load packed it) or "read" (from the cache)
    offset: int = -1
    path: Path | None = None


@dataclass
class StoreStats:
    packed: int = 0                 # tensors packed by this process
    read: int = 0                   # tensors read back from the cache
    stale: int = 0                  # entries replaced because the GGUF bytes or geometry changed
    unwritable: str = ""            # why the cache could not be written (packed in memory instead)
    rebuilt: list = field(default_factory=list)     # entries found corrupt, truncated or foreign: why, each
    packed_names: list = field(default_factory=list)
    read_names: list = field(default_factory=list)


class PackedStore:
    """The cache of one device. ``root`` None: pack in memory every time (nothing written)."""

    def __init__(self, root: Path | None | str = "default"):
        self.root = default_root() if root == "default" else (Path(root) if root else None)
        self.stats = StoreStats()

    def folder(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key

    # -- manifest --------------------------------------------------------------------------------------
    @staticmethod
    def read_manifest(folder: Path) -> dict:
        path = folder / MANIFEST
        if not path.is_file():
            return {"format": FORMAT, "geometry_version": GEOMETRY_VERSION, "tensors": {}}
        try:
            manifest = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise GeometryError(f"the manifest {path} cannot be read ({type(e).__name__}: {e}); delete {folder} "
                                f"to repack") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("tensors"), dict):
            raise GeometryError(f"the manifest {path} has no 'tensors' table; delete {folder} to repack")
        return manifest

    @staticmethod
    def write_manifest(folder: Path, manifest: dict) -> None:
        caches.write_atomic(folder / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))

    def _manifest(self, folder: Path) -> dict:
        """The manifest, or (reported) an empty one in place of one that cannot be read."""
        try:
            return self.read_manifest(folder)
        except GeometryError as e:
            self._rebuilt(str(e))
            return {"format": FORMAT, "geometry_version": GEOMETRY_VERSION, "tensors": {}}

    def _rebuilt(self, why: str) -> None:
        self.stats.rebuilt.append(why)
        caches.report(f"xdna: {why}; repacked from the GGUF file")

    @contextlib.contextmanager
    def _locked(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / ".lock", "a+b") as f:
            try:
                import fcntl
                fcntl.flock(f, fcntl.LOCK_EX)
            except ImportError:      # no flock on this platform: single-process use only
                pass
            yield

    # -- load ------------------------------------------------------------------------------------------
    def load(self, name: str, dtype: DType, shape: tuple[int, ...], raw: np.ndarray, key: str | None = None) -> Packed:
        """The packed tiles of a GGUF tensor: read from the cache when it holds this tensor's bytes,
        otherwise packed (and stored)."""
        shape = tuple(int(d) for d in shape)
        if self.root is None:
            return self._pack(name, dtype, shape, raw)
        key = key or model_key(raw)
        folder = self.folder(key)
        digest = source_digest(raw)
        manifest = self._manifest(folder)
        entry = manifest["tensors"].get(name) if manifest.get("geometry_version") == GEOMETRY_VERSION else None
        if entry is not None and entry.get("source_digest") == digest and entry.get("source_dtype") == dtype.name:
            try:
                return self._read(folder, name, shape, entry)
            except GeometryError as e:      # corrupt, truncated or foreign: never decoded, repacked
                self._rebuilt(str(e))
        made: dict = {}
        try:
            return self._pack_and_store(folder, key, name, dtype, shape, raw, digest, made)
        except OSError as e:      # a cache folder we cannot write: keep (or make) the tiles in memory, say so
            self.stats.unwritable = f"{folder}: {type(e).__name__}: {e}"
            return made.get("packed") or self._pack(name, dtype, shape, raw)

    def _pack_and_store(self, folder: Path, key: str, name: str, dtype: DType, shape: tuple[int, ...],
                        raw: np.ndarray, digest: str, made: dict) -> Packed:
        with self._locked(folder):
            manifest = self._manifest(folder)
            if manifest.get("geometry_version") != GEOMETRY_VERSION or manifest.get("format") != FORMAT:
                # another geometry: its tiles mean something else; start over (never decode them)
                self.stats.stale += len(manifest.get("tensors", {}))
                (folder / DATA_FILE).unlink(missing_ok=True)
                manifest = {"format": FORMAT, "geometry_version": GEOMETRY_VERSION, "tensors": {}}
            entry = manifest["tensors"].get(name)
            fresh = (entry is not None and entry.get("source_digest") == digest
                     and entry.get("source_dtype") == dtype.name)
            if fresh:
                # another process packed it meanwhile; or it is the entry load() found bad (and said so)
                with contextlib.suppress(GeometryError):
                    return self._read(folder, name, shape, entry)
            if entry is not None and not fresh:
                self.stats.stale += 1
            packed = made["packed"] = self._pack(name, dtype, shape, raw)
            offset = self._append(folder / DATA_FILE, packed.data)
            manifest["tensors"][name] = {
                "shape": list(shape), "padded_shape": list(packed.grid.padded_shape), "offset": offset,
                "size": int(packed.data.size), "chunk_kind": CHUNK_KIND, "chunk_bytes": CHUNK_BYTES,
                "geometry_version": GEOMETRY_VERSION, "source_dtype": dtype.name, "source_digest": digest,
                "conversion": packed.conversion, "tiles_digest": caches.digest_bytes(np.ascontiguousarray(packed.data))}
            manifest["model"] = key
            self.write_manifest(folder, manifest)
            packed.offset, packed.path = offset, folder / DATA_FILE
            return packed

    def _pack(self, name: str, dtype: DType, shape: tuple[int, ...], raw: np.ndarray) -> Packed:
        grid = tile_grid(shape)
        data = tiles.pack(raw, dtype, grid)
        self.stats.packed += 1
        self.stats.packed_names.append(name)
        return Packed(name, data, grid, dtype.name, tiles.conversion_of(dtype.name), "packed")

    @staticmethod
    def _append(path: Path, data: np.ndarray) -> int:
        with open(path, "ab") as f:
            end = f.tell()
            offset = -(-end // ALIGN) * ALIGN
            if offset > end:
                f.write(b"\0" * (offset - end))
            f.write(memoryview(np.ascontiguousarray(data)).cast("B"))
        return offset

    def _read(self, folder: Path, name: str, shape: tuple[int, ...], entry: dict) -> Packed:
        path = folder / DATA_FILE
        try:
            offset, size = int(entry["offset"]), int(entry["size"])
            padded = entry.get("padded_shape")
            stored_shape = tuple(int(d) for d in entry["shape"])
            kind, chunk, version = entry["chunk_kind"], int(entry["chunk_bytes"]), int(entry["geometry_version"])
        except (KeyError, TypeError, ValueError) as e:
            raise GeometryError(f"packed tensor '{name}' in {folder / MANIFEST}: malformed entry ({e}): {entry}") \
                from None
        if stored_shape != shape:
            raise GeometryError(f"packed tensor '{name}' at offset {offset} of {path}: stored for shape "
                                f"{list(stored_shape)}, the model's is {list(shape)}")
        grid = check_container(name, shape, size, offset=offset, where=str(path),
                               padded_shape=tuple(padded) if padded else None, chunk_kind=kind, chunk_bytes=chunk,
                               version=version)
        held = max(0, (path.stat().st_size if path.is_file() else 0) - offset)
        if held < size:
            # the file ends inside this tensor: say what is there, on the same terms as a bad size
            where = f"{path} (truncated: the manifest says {size} bytes, the file holds {held} from this offset)"
            try:
                check_container(name, shape, held, offset=offset, where=where,
                                padded_shape=tuple(padded) if padded else None)
            except GeometryError as e:
                raise GeometryError(str(e)) from None
            raise GeometryError(f"packed tensor '{name}' at offset {offset} of {where}: {held} bytes is a valid size "
                                f"for another grid, but not the {size} bytes the manifest declares ({grid.describe()})")
        data = np.memmap(path, dtype=np.uint8, mode="r", offset=offset, shape=(size,))
        # the tiles must be the bytes that were stored: a flipped byte decodes into wrong weights silently
        stored = entry.get("tiles_digest")
        found = caches.digest_bytes(data)
        if stored != found:
            why = ("its manifest entry records no digest of the tiles (written by another packer or an older "
                   "version)" if not stored else f"the tiles' digest is {found}, the manifest recorded {stored}")
            raise GeometryError(f"packed tensor '{name}' at offset {offset} of {path}: {why}")
        self.stats.read += 1
        self.stats.read_names.append(name)
        return Packed(name, data, grid, str(entry.get("source_dtype", "")), str(entry.get("conversion", "")), "read",
                      offset, path)


def store_container(folder: Path, name: str, data: np.ndarray, *, shape, padded_shape, source_dtype: str,
                    source_digest_: str, chunk_kind: str = CHUNK_KIND, chunk_bytes: int = CHUNK_BYTES,
                    conversion: str = "repacked", size: int | None = None) -> dict:
    """Write one tensor's container the way another packer might have (tests and tools): the bytes
    as given and a manifest entry declaring them. Nothing is checked here; the reader checks."""
    folder.mkdir(parents=True, exist_ok=True)
    manifest = PackedStore.read_manifest(folder)
    manifest.setdefault("format", FORMAT)
    manifest.setdefault("geometry_version", GEOMETRY_VERSION)
    offset = PackedStore._append(folder / DATA_FILE, data)
    entry = {"shape": [int(d) for d in shape], "padded_shape": [int(d) for d in padded_shape], "offset": offset,
             "size": int(data.size if size is None else size), "chunk_kind": chunk_kind, "chunk_bytes": chunk_bytes,
             "geometry_version": GEOMETRY_VERSION, "source_dtype": source_dtype, "source_digest": source_digest_,
             "conversion": conversion, "tiles_digest": caches.digest_bytes(np.ascontiguousarray(data))}
    manifest["tensors"][name] = entry
    PackedStore.write_manifest(folder, manifest)
    return entry
