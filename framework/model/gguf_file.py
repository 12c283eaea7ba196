"""Reading a GGUF file: metadata, tensor directory, memory-mapped tensor bytes, and checks.

The gguf package parses the file. Parsing a 262k-token vocabulary takes it tens of
seconds, so the parsed directory is kept in a small index cache keyed by the file's
path, size and modification time; the tensor bytes are always memory-mapped afresh.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader

from ..core.graph.dtypes import DType, block_shape, nbytes

GGUF_MAGIC = b"GGUF"
INDEX_VERSION = 1

# Tensor types this project can decode (gguf.quants has a reference for each).
SUPPORTED_TYPES = (DType.F32, DType.F16, DType.BF16, DType.Q4_0, DType.Q4_1, DType.Q5_0, DType.Q5_1,
                   DType.Q8_0, DType.Q2_K, DType.Q3_K, DType.Q4_K, DType.Q5_K, DType.Q6_K,
                   DType.IQ4_NL, DType.IQ4_XS)


class _DirectoryReader(GGUFReader):
    """GGUFReader that records the tensor directory but builds no data views: GGUFReader's own
    views fail on a truncated file before _check_tensors could name the tensor that is cut."""

    def _build_tensors(self, start_offs, fields) -> None:
        self.directory = []
        for field in fields:
            _name_len, name_data, _n_dims, dims, raw_dtype, offset_tensor = field.parts
            self.directory.append((str(bytes(name_data), encoding="utf-8"), int(raw_dtype[0]),
                                   tuple(int(d) for d in reversed(dims.tolist())),
                                   int(start_offs + offset_tensor[0])))


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
        return str(self.metadata.get("general.architecture", ""))

    def tensor_bytes(self, name: str) -> np.ndarray:
        t = self.tensors[name]
        return self.data[t.offset:t.offset + t.nbytes]


def open_model_file(path: str | os.PathLike) -> ModelFile:
    """Open and check a GGUF file. Raises ModelFileError naming what is wrong."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"model file not found: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path} is not a GGUF file: it starts with {magic!r}, a GGUF file starts with "
                             f"{GGUF_MAGIC!r}")
    metadata, entries = _read_index(path)
    size = path.stat().st_size
    _check_tensors(path, entries, size, int(metadata.get("general.alignment", 32)))
    data = np.memmap(path, dtype=np.uint8, mode="r")
    return ModelFile(path=path, metadata=metadata, tensors={e.name: e for e in entries}, data=data)


def _index_path(path: Path) -> Path:
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{INDEX_VERSION}".encode()).hexdigest()
    root = Path(os.environ.get("FRAMEWORK_CACHE", Path.home() / ".cache" / "framework"))
    return root / "gguf-index" / f"{key[:24]}.pkl"


def _read_index(path: Path) -> tuple[dict, list[TensorEntry]]:
    cached = _index_path(path)
    if cached.is_file():
        try:
            with open(cached, "rb") as f:
                return pickle.load(f)
        except Exception:   # a stale or half-written index is rebuilt, never trusted
            pass
    index = _parse(path)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        pickle.dump(index, f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(cached)
    return index


def _parse(path: Path) -> tuple[dict, list[TensorEntry]]:
    size = path.stat().st_size
    try:
        reader = _DirectoryReader(path)
    except Exception as e:  # the gguf package reports truncation as index or reshape errors
        raise ModelFileError(f"{path} ({size} bytes) could not be parsed as GGUF: {type(e).__name__}: {e}. "
                             f"The file is truncated or corrupt; fetch or assemble it again") from e
    metadata = {}
    for key, field in reader.fields.items():
        try:
            metadata[key] = field.contents()
        except Exception as e:
            raise ModelFileError(f"{path}: metadata key '{key}' cannot be decoded: {e}") from e
    entries, seen = [], set()
    for name, type_id, shape, offset in reader.directory:
        if name in seen:
            raise ModelFileError(f"{path}: tensor '{name}' appears twice in the tensor directory")
        seen.add(name)
        try:
            dtype = DType(type_id)
        except ValueError:
            raise ModelFileError(f"{path}: tensor '{name}' has tensor type {type_id}, which this "
                                 f"project does not know") from None
        entries.append(TensorEntry(name, dtype, shape, offset))
    return metadata, entries


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
