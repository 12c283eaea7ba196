"""Reading a GGUF file: metadata, tensor directory, memory-mapped tensor bytes, and checks.

The header (metadata and tensor directory) is read by a bounded reader over the gguf package's
tables of value and tensor types: every count, length and offset the header declares is checked
against the bytes the file has left before anything is allocated or looped over, so a hostile header
(an array length of 2**62, a string longer than the file, a tensor count of 2**40) is a
ModelFileError naming the key or tensor and the offset, never a hang or a huge allocation. The gguf
package's own reader trusts those counts and builds one numpy view per array element (about 20 s
for Gemma's 262k-token vocabulary); this one reads numeric arrays whole.

The parsed directory is kept in an index cache (JSON, with a digest of its content, keyed by the
file's path, size and modification time); the tensor bytes are memory-mapped on every open.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFValueType

from .. import caches, settings
from ..core.graph.dtypes import DType, block_shape, nbytes
from .metadata import MetadataError, get_int

GGUF_MAGIC = b"GGUF"
VERSIONS = (2, 3)               # GGUF versions with 64-bit counts (the gguf package reads the same)
INDEX_VERSION = 2
INDEX_FORMAT = "framework-gguf-index"
MAX_DIMS = 4                    # GGML_MAX_DIMS
MAX_ARRAY_DEPTH = 2             # arrays of arrays (of scalars) at most
DEFAULT_ALIGNMENT = 32

# Tensor types this project can decode (gguf.quants has a reference for each).
SUPPORTED_TYPES = (DType.F32, DType.F16, DType.BF16, DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1,
                   DType.Q8_0, DType.Q2_K, DType.Q3_K, DType.Q4_K, DType.Q5_K, DType.Q6_K,
                   DType.IQ4_NL, DType.IQ4_XS)

V = GGUFValueType
# value type -> (struct format, numpy dtype) of the little-endian scalars
_SCALARS = {V.UINT8: ("<B", "<u1"), V.INT8: ("<b", "<i1"), V.UINT16: ("<H", "<u2"), V.INT16: ("<h", "<i2"),
            V.UINT32: ("<I", "<u4"), V.INT32: ("<i", "<i4"), V.FLOAT32: ("<f", "<f4"), V.BOOL: ("<B", "<u1"),
            V.UINT64: ("<Q", "<u8"), V.INT64: ("<q", "<i8"), V.FLOAT64: ("<d", "<f8")}
# the fewest bytes one element of each type takes (a string: its 8-byte length; an array: type and count)
_U64 = struct.Struct("<Q")
_MIN_SIZE = {**{t: struct.calcsize(f) for t, (f, _) in _SCALARS.items()}, V.STRING: 8, V.ARRAY: 12}

caches.register("gguf-index", "parsed GGUF headers (metadata and tensor directory)",
                lambda: settings.cache_dir("gguf-index"))


class ModelFileError(ValueError):
    """The model file is missing, not GGUF, truncated, or holds a tensor that does not add up."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the file: shape in numpy order, offset from the start of the file."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, self.shape)


@dataclass
class ModelFile:
    path: Path
    metadata: dict
    tensors: dict[str, TensorEntry]
    data: np.ndarray        # the whole file, memory-mapped, uint8

    @property
    def architecture(self) -> str:
        value = self.metadata.get("general.architecture", "")
        return value if isinstance(value, str) else ""

    def tensor_bytes(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        return self.data[t.offset:t.offset + t.nbytes]


def open_model_file(path: str | os.PathLike) -> ModelFile:
    """Open and check a GGUF file. Raises ModelFileError naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}" + (" (it is a folder)" if path.is_dir() else ""))
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelFileError(f"model file {path} cannot be read: {e.strerror or e}") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file: it starts with {magic!r}, a GGUF file starts with "
                             f"{GGUF_MAGIC!r}")
    metadata, entries, alignment = _read_index(path)
    size = path.stat().st_size
    _check_tensors(path, entries, size, alignment)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    return ModelFile(path=path, metadata=metadata, tensors={e.name: e for e in entries}, data=data)


# -- the header --------------------------------------------------------------------------------------------
class _Header:
    """A cursor over the file's bytes that never reads, allocates or loops past what the file holds."""

    def __init__(self, path: Path, buf, size: int):
        self.path, self.buf, self.size, self.pos = path, buf, size, 0

    def need(self, n: int, what: str) -> None:
        left = self.size - self.pos
        if n > left:
            raise ModelFileError(f"{self.path}: {what} at offset {self.pos} needs {n} bytes, but the file ends "
                                 f"{left} bytes later (it has {self.size} bytes): the file is truncated or its "
                                 f"header is corrupt")

    def scalar(self, vtype: V, what: str):
        fmt = _SCALARS[vtype][0]
        n = struct.calcsize(fmt)
        self.need(n, what)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        if vtype == V.BOOL:
            return value != 0
        return float(value) if vtype in (V.FLOAT32, V.FLOAT64) else value

    def u32(self, what: str) -> int:
        return self.scalar(V.UINT32, what)

    def u64(self, what: str) -> int:
        return self.scalar(V.UINT64, what)

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        self.need(n, what)
        start = self.pos
        self.pos += n
        try:
            return self.buf[start:self.pos].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelFileError(f"{self.path}: {what} at offset {start} is not UTF-8 text (byte {e.start} of "
                                 f"{n}: {e.reason})") from None

    def value(self, vtype: int, what: str, depth: int = 0):
        try:
            vtype = V(vtype)
        except ValueError:
            raise ModelFileError(f"{self.path}: {what} at offset {self.pos} has value type {vtype}, which GGUF "
                                 f"does not define (0 to {max(V)})") from None
        if vtype == V.STRING:
            return self.string(what)
        if vtype == V.ARRAY:
            return self.array(what, depth)
        return self.scalar(vtype, what)

    def array(self, what: str, depth: int) -> list:
        start = self.pos
        itype = self.u32(f"the element type of {what}")
        count = self.u64(f"the length of {what}")
        try:
            itype = V(itype)
        except ValueError:
            raise ModelFileError(f"{self.path}: {what} at offset {start} is an array of value type {itype}, which "
                                 f"GGUF does not define (0 to {max(V)})") from None
        if itype == V.ARRAY and depth + 1 >= MAX_ARRAY_DEPTH:
            raise ModelFileError(f"{self.path}: {what} at offset {start} nests arrays deeper than "
                                 f"{MAX_ARRAY_DEPTH} levels")
        self.need(count * _MIN_SIZE[itype], f"{what}, an array of {count} {itype.name} values,")
        if itype in _SCALARS:
            dtype = np.dtype(_SCALARS[itype][1])
            values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
            self.pos += count * dtype.itemsize
            return (values != 0).tolist() if itype == V.BOOL else values.tolist()
        if itype == V.STRING:
            return self.strings(count, what)
        return [self.value(itype, f"element {i} of {what}", depth + 1) for i in range(count)]

    def strings(self, count: int, what: str) -> list[str]:
        """An array of strings (a vocabulary, merges): a tight loop; the first string that does not fit
        or decode is read again by string() for its message."""
        buf, size, pos = self.buf, self.size, self.pos
        length = _U64.unpack_from
        out = []
        try:
            for _ in range(count):
                (n,) = length(buf, pos)
                if n > size - pos - 8:
                    break
                out.append(buf[pos + 8:pos + 8 + n].decode("utf-8"))
                pos += 8 + n
        except (struct.error, UnicodeDecodeError):
            pass
        self.pos = pos
        if len(out) < count:
            self.string(f"element {len(out)} of {what}")       # raises, naming the element
        return out


def _parse(path: Path) -> tuple[dict, list[TensorEntry], int]:
    size = path.stat().st_size
    with open(path, "rb") as f:
        if size < 4:
            raise ModelFileError(f"{path} is not a GGUF file: it has {size} bytes")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _read_header(_Header(path, buf, size))


def _read_header(h: _Header) -> tuple[dict, list[TensorEntry], int]:
    path = h.path
    h.pos = 4
    version = h.u32("the GGUF version")
    if version not in VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        hint = (" (a big-endian file: only little-endian GGUF files are read)" if version & 0xFFFF == 0
                and swapped in VERSIONS else "")
        raise ModelFileError(f"{path}: GGUF version {version} is not supported{hint}; supported: "
                             f"{', '.join(map(str, VERSIONS))}")
    n_tensors = h.u64("the tensor count")
    n_kv = h.u64("the metadata count")
    # bound both counts by the bytes left before looping over them: a key takes at least 13 bytes, a
    # tensor's entry at least 24
    h.need(n_kv * 13 + n_tensors * 24, f"{n_kv} metadata keys and {n_tensors} tensor entries")
    metadata: dict = {}
    for i in range(n_kv):
        at = h.pos
        key = h.string(f"the name of metadata key {i}")
        vtype = h.u32(f"the value type of metadata key '{key}'")
        value = h.value(vtype, f"metadata key '{key}'")
        if key in metadata:
            raise ModelFileError(f"{path}: metadata key '{key}' appears twice (again at offset {at})")
        metadata[key] = value
    try:
        alignment = get_int(metadata, "general.alignment", DEFAULT_ALIGNMENT, lo=1, hi=1 << 30)
    except MetadataError as e:
        raise ModelFileError(f"{path}: {e}") from None
    if alignment & (alignment - 1):
        raise ModelFileError(f"{path}: metadata key 'general.alignment' holds {alignment}; expected a power of two")
    directory = []
    names: set[str] = set()
    for i in range(n_tensors):
        name = h.string(f"the name of tensor {i}")
        if name in names:
            raise ModelFileError(f"{path}: tensor '{name}' appears twice in the tensor directory")
        names.add(name)
        n_dims = h.u32(f"the dimension count of tensor '{name}'")
        if n_dims > MAX_DIMS:
            raise ModelFileError(f"{path}: tensor '{name}' has {n_dims} dimensions; GGUF tensors have at most "
                                 f"{MAX_DIMS}")
        dims = [h.u64(f"dimension {d} of tensor '{name}'") for d in range(n_dims)]
        type_id = h.u32(f"the type of tensor '{name}'")
        rel = h.u64(f"the data offset of tensor '{name}'")
        directory.append((name, dims, type_id, rel))
    data_start = -(-h.pos // alignment) * alignment
    entries = []
    for name, dims, type_id, rel in directory:
        try:
            dtype = DType(type_id)
        except ValueError:
            raise ModelFileError(f"{path}: tensor '{name}' has tensor type {type_id}, which this "
                                 f"project does not know") from None
        if rel % alignment:
            raise ModelFileError(f"{path}: tensor '{name}' has data offset {rel}, not a multiple of the file's "
                                 f"alignment {alignment}")
        entries.append(TensorEntry(name, dtype, tuple(reversed(dims)), data_start + rel))
    return metadata, entries, alignment


# -- the index cache ---------------------------------------------------------------------------------------
def _index_path(path: Path) -> Path | None:
    folder = settings.cache_dir("gguf-index")
    if folder is None:
        return None
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{INDEX_VERSION}".encode()).hexdigest()
    return folder / f"{key[:24]}.json"


def _to_record(path: Path, index: tuple[dict, list[TensorEntry], int]) -> dict:
    metadata, entries, alignment = index
    return {"metadata": metadata, "alignment": alignment,
            "tensors": [[e.name, int(e.dtype), list(e.shape), e.offset] for e in entries]}


def _from_record(record: dict) -> tuple[dict, list[TensorEntry], int]:
    entries = [TensorEntry(str(n), DType(int(t)), tuple(int(d) for d in s), int(o)) for n, t, s, o in record["tensors"]]
    return dict(record["metadata"]), entries, int(record["alignment"])


def _encode(record: dict) -> str:
    return json.dumps(record, separators=(",", ":"), allow_nan=True)


def _load_index(cached: Path, path: Path) -> tuple[dict, list[TensorEntry], int] | None:
    """The cached index, or None (reported) when the entry is not one this version wrote for this file."""
    try:
        text = cached.read_text(encoding="utf-8")
        head, _, body = text.partition("\n")
        meta = json.loads(head)
        if meta.get("format") != INDEX_FORMAT or meta.get("version") != INDEX_VERSION:
            raise ValueError(f"format {meta.get('format')!r} version {meta.get('version')!r}")
        if meta.get("size") != len(body.encode("utf-8")) or meta.get("digest") != caches.digest_bytes(body.encode()):
            raise ValueError("its size or digest does not match its content")
        if meta.get("source") != str(path.resolve()):
            raise ValueError(f"it indexes {meta.get('source')!r}")
        return _from_record(json.loads(body))
    except (OSError, ValueError, KeyError, TypeError) as e:
        caches.report(f"GGUF index {cached} is corrupt or foreign ({type(e).__name__}: {e}): rebuilt from {path}")
        return None


def _store_index(cached: Path, path: Path, index) -> None:
    why = caches.unwritable(cached.parent)
    if why is not None:
        caches.report(f"GGUF index folder {cached.parent} cannot be written ({why}): reading headers uncached",
                      once_key=f"gguf-index:{cached.parent}")
        return
    body = _encode(_to_record(path, index)).encode("utf-8")
    head = json.dumps({"format": INDEX_FORMAT, "version": INDEX_VERSION, "source": str(path.resolve()),
                       "size": len(body), "digest": caches.digest_bytes(body), "digest_kind": caches.DIGEST})
    try:
        caches.write_atomic(cached, head.encode() + b"\n" + body)
    except OSError as e:
        caches.report(f"GGUF index {cached} cannot be written ({type(e).__name__}: {e.strerror or e}): reading "
                      f"headers uncached", once_key=f"gguf-index:{cached.parent}")


def _read_index(path: Path) -> tuple[dict, list[TensorEntry], int]:
    cached = _index_path(path)
    if cached is not None and cached.is_file():
        index = _load_index(cached, path)
        if index is not None:
            return index
    index = _parse(path)
    if cached is not None:
        _store_index(cached, path, index)
    return index


# -- the tensors -------------------------------------------------------------------------------------------
def _check_tensors(path: Path, entries: list[TensorEntry], size: int, alignment: int) -> None:
    """Every tensor's bytes must be exactly what its type and shape imply: never decode on a guess."""
    for e in entries:
        if e.dtype not in SUPPORTED_TYPES:
            names = ", ".join(t.name for t in SUPPORTED_TYPES)
            raise ModelFileError(f"{path}: tensor '{e.name}' has type {e.dtype.name}, which no decoder here "
                                 f"supports (supported: {names})")
        per_block, _ = block_shape(e.dtype)
        if e.shape and e.shape[-1] % per_block:
            raise ModelFileError(f"{path}: tensor '{e.name}' rows of {e.shape[-1]} elements are not whole "
                                 f"{e.dtype.name} blocks of {per_block}")
    ordered = sorted(entries, key=lambda e: e.offset)
    for i, e in enumerate(ordered):
        need = e.nbytes
        if e.offset + need > size:
            raise ModelFileError(
                f"{path}: tensor '{e.name}' at offset {e.offset} needs {need} bytes ({list(e.shape)} as "
                f"{e.dtype.name}), {e.offset + need - size} bytes more than the file's {size} bytes hold: "
                f"the file is truncated; fetch or assemble it again")
        last = i + 1 == len(ordered)
        end = size if last else ordered[i + 1].offset
        held = end - e.offset
        if need <= held and held - need < alignment:
            continue
        where = "to the end of the file" if last else f"before tensor '{ordered[i + 1].name}'"
        hint = (f"the file is truncated: {size} bytes, tensor ends at {e.offset + need}" if last and need > held
                else f"the remainder is {held - need} bytes")
        raise ModelFileError(
            f"{path}: tensor '{e.name}' at offset {e.offset} holds {held} bytes {where}, but its shape "
            f"{list(e.shape)} as {e.dtype.name} implies {need} bytes ({hint})")
