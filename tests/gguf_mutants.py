"""Hostile GGUF files made from an intact one, and what the framework says to each.

Used by tests/test_hostile_files.py (a few hundred mutants) and benchmarks/fuzz_gguf.py (10,000).

A mutant is the intact file's header, taken apart into its metadata keys and tensor entries (read
here with struct, independently of the framework's reader), changed in one way, and written back:
truncations, bit flips, overwritten bytes, values of the wrong type or an absurd value, array lengths
and counts of 2**62, duplicate keys and tensor names, dimensions swapped or huge, offsets past the end,
unaligned or overlapping, bad alignments and versions. The tensor data is not copied: a mutant is its
header followed by a sparse (all-zero) body of the intact length, unless the caller asks for the real
bytes (the CLI path runs the model).

Each mutant is opened in-process the way `framework info` opens a file, under a time limit and a
memory limit; the outcome is one of:
  accepted      the file loads (hyper-parameters, weights, tokenizer)
  named         a ModelFileError that names the file
  unnamed       a ModelFileError whose message does not name the file
  raw           any other exception (a traceback for the user)
  hang          the time limit passed
  memory        the memory limit was reached (MemoryError)
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import random
import resource
import signal
import struct
import traceback
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

# GGUF value types (gguf.GGUFValueType), written out so this module reads files on its own terms
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
FMT = {UINT8: "<B", INT8: "<b", UINT16: "<H", INT16: "<h", UINT32: "<I", INT32: "<i", FLOAT32: "<f", BOOL: "<B",
       UINT64: "<Q", INT64: "<q", FLOAT64: "<d"}

# keys the framework reads (model/hparams.py, model/tokenizer.py, model/chat.py, model/gguf_file.py)
READ_KEYS = (
    "general.architecture", "general.alignment", "general.name",
    "llama.context_length", "llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
    "llama.attention.head_count", "llama.attention.head_count_kv", "llama.attention.layer_norm_rms_epsilon",
    "llama.rope.freq_base", "llama.rope.dimension_count", "llama.attention.key_length",
    "llama.attention.value_length", "llama.vocab_size",
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.eot_token_id", "tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_space_prefix",
    "tokenizer.chat_template",
)
NUMERIC_VALUES = (0, 1, -1, 2, 3, 7, 2**31, 2**32 + 1, 2**40, 2**62, float("nan"), float("inf"), float("-inf"),
                  1e30, 1e-45, -0.5, 2.5)


@dataclass
class KV:
    key: str
    vtype: int
    payload: bytes          # the value's bytes, after its type

    def encode(self) -> bytes:
        k = self.key.encode("utf-8")
        return struct.pack("<Q", len(k)) + k + struct.pack("<I", self.vtype) + self.payload


@dataclass
class TensorInfo:
    name: bytes
    dims: list[int]
    ttype: int
    offset: int
    n_dims: int | None = None       # as written (None: len(dims))

    def encode(self) -> bytes:
        n = len(self.dims) if self.n_dims is None else self.n_dims
        return (struct.pack("<Q", len(self.name)) + self.name + struct.pack("<I", n)
                + b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in self.dims)
                + struct.pack("<I", self.ttype & 0xFFFFFFFF) + struct.pack("<Q", self.offset & (2**64 - 1)))


@dataclass
class Layout:
    """The intact file's header, taken apart."""

    path: Path
    version: int
    kvs: list[KV]
    tensors: list[TensorInfo]
    alignment: int
    data_size: int                  # bytes from the data start to the end of the file

    def header(self, kvs=None, tensors=None, n_kv=None, n_tensors=None, version=None, magic=b"GGUF",
               alignment=None) -> bytes:
        kvs = self.kvs if kvs is None else kvs
        tensors = self.tensors if tensors is None else tensors
        out = [magic, struct.pack("<I", (self.version if version is None else version) & 0xFFFFFFFF),
               struct.pack("<Q", (len(tensors) if n_tensors is None else n_tensors) & (2**64 - 1)),
               struct.pack("<Q", (len(kvs) if n_kv is None else n_kv) & (2**64 - 1))]
        out += [kv.encode() for kv in kvs]
        out += [t.encode() for t in tensors]
        raw = b"".join(out)
        align = alignment or self.alignment
        return raw + bytes(-len(raw) % align)

    def kv(self, key: str) -> KV | None:
        return next((kv for kv in self.kvs if kv.key == key), None)


def _value_size(buf: bytes, pos: int, vtype: int) -> int:
    if vtype == STRING:
        return 8 + struct.unpack_from("<Q", buf, pos)[0]
    if vtype == ARRAY:
        itype, count = struct.unpack_from("<IQ", buf, pos)
        if itype in FMT:
            return 12 + count * struct.calcsize(FMT[itype])
        size = 12
        for _ in range(count):
            size += _value_size(buf, pos + size, itype)
        return size
    return struct.calcsize(FMT[vtype])


def scan(path: Path) -> Layout:
    """Take an intact GGUF file's header apart (version 2 or 3, little-endian)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        buf = f.read(min(size, 64 << 20))
    assert buf[:4] == b"GGUF"
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, kvs = 24, []
    for _ in range(n_kv):
        (klen,) = struct.unpack_from("<Q", buf, pos)
        key = buf[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos += 4
        n = _value_size(buf, pos, vtype)
        kvs.append(KV(key, vtype, buf[pos:pos + n]))
        pos += n
    tensors = []
    for _ in range(n_tensors):
        (nlen,) = struct.unpack_from("<Q", buf, pos)
        name = buf[pos + 8:pos + 8 + nlen]
        pos += 8 + nlen
        (nd,) = struct.unpack_from("<I", buf, pos)
        dims = list(struct.unpack_from(f"<{nd}Q", buf, pos + 4))
        pos += 4 + 8 * nd
        ttype, offset = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        tensors.append(TensorInfo(name, dims, ttype, offset))
    align_kv = next((kv for kv in kvs if kv.key == "general.alignment"), None)
    alignment = struct.unpack("<I", align_kv.payload)[0] if align_kv else 32
    data_start = -(-pos // alignment) * alignment
    return Layout(path, version, kvs, tensors, alignment, size - data_start)


# -- encoding values -------------------------------------------------------------------------------------
def scalar(vtype: int, value) -> bytes:
    fmt = FMT[vtype]
    if vtype in (FLOAT32, FLOAT64):
        return struct.pack(fmt, float(value))
    bits = struct.calcsize(fmt) * 8
    v = int(value) if math.isfinite(value) else 0
    if fmt[1].isupper():
        v &= (1 << bits) - 1
    else:
        v = ((v + (1 << (bits - 1))) % (1 << bits)) - (1 << (bits - 1))
    return struct.pack(fmt, v)


def string(text: bytes | str) -> bytes:
    raw = text.encode("utf-8") if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def array(itype: int, items: list) -> bytes:
    body = b"".join(string(x) if itype == STRING else scalar(itype, x) for x in items)
    return struct.pack("<IQ", itype, len(items)) + body


@dataclass
class Mutant:
    kind: str
    detail: str
    header: bytes
    size: int                       # the whole file's size
    body_from: int | None = None    # where the intact data starts in the intact file (None: no real body)

    def write(self, path: Path, layout: Layout | None = None, real_body: bool = False) -> Path:
        with open(path, "wb") as f:
            f.write(self.header[:self.size])
            if real_body and layout is not None and self.size > len(self.header):
                with open(layout.path, "rb") as src:
                    start = layout.path.stat().st_size - layout.data_size
                    n = min(self.size - len(self.header), layout.data_size)
                    done = 0
                    while done < n:
                        done += os.copy_file_range(src.fileno(), f.fileno(), n - done, start + done)
            f.truncate(self.size)               # a sparse tail: zeros that take no disk
        return path


# -- the mutations ---------------------------------------------------------------------------------------
class Mutator:
    def __init__(self, layout: Layout, seed: int):
        self.L = layout
        self.rng = random.Random(seed)
        self.intact = layout.header()
        self.full = len(self.intact) + layout.data_size
        self.kinds = [(self.truncate, 6), (self.bit_flips, 8), (self.overwrite, 6), (self.wrong_type, 12),
                      (self.bad_value, 14), (self.array_length, 8), (self.duplicate_key, 3), (self.drop_key, 5),
                      (self.add_key, 5), (self.counts, 4), (self.version, 2), (self.dims, 10),
                      (self.tensor_type, 5), (self.offset, 8), (self.duplicate_tensor, 3), (self.rename_tensor, 3),
                      (self.swap_tensors, 4), (self.alignment, 4), (self.magic, 1), (self.bad_strings, 3)]

    def make(self) -> Mutant:
        fns, weights = zip(*self.kinds)
        return self.rng.choices(fns, weights)[0]()

    def _m(self, kind, detail, header, size=None) -> Mutant:
        return Mutant(kind, detail, header, self.full - len(self.intact) + len(header) if size is None else size)

    def _key(self) -> str:
        present = [k for k in READ_KEYS if self.L.kv(k)]
        return self.rng.choice(present if self.rng.random() < 0.85 else [kv.key for kv in self.L.kvs])

    def _replace(self, key: str, vtype: int, payload: bytes) -> list[KV]:
        return [KV(kv.key, vtype, payload) if kv.key == key else kv for kv in self.L.kvs]

    def truncate(self) -> Mutant:
        r = self.rng.random()
        size = (self.rng.randrange(0, len(self.intact)) if r < 0.6 else
                self.rng.randrange(len(self.intact), self.full))
        return self._m("truncate", f"cut at {size} of {self.full}", self.intact, size)

    def bit_flips(self) -> Mutant:
        h = bytearray(self.intact)
        n = self.rng.choice((1, 1, 2, 4, 8))
        spots = [self.rng.randrange(len(h)) for _ in range(n)]
        for p in spots:
            h[p] ^= 1 << self.rng.randrange(8)
        return self._m("bit_flips", f"{n} bits at {spots[:3]}", bytes(h))

    def overwrite(self) -> Mutant:
        h = bytearray(self.intact)
        p = self.rng.randrange(len(h) - 8)
        pattern = self.rng.choice((b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff\xff\xff\xff\xff",
                                   bytes(self.rng.randrange(256) for _ in range(8))))
        h[p:p + 8] = pattern
        return self._m("overwrite", f"8 bytes at {p} = {pattern.hex()}", bytes(h))

    def wrong_type(self) -> Mutant:
        key = self._key()
        kv = self.L.kv(key)
        options = [(INT32, scalar(INT32, self.rng.choice((0, 5, -1)))), (FLOAT32, scalar(FLOAT32, 1.5)),
                   (STRING, string("not the type")), (BOOL, scalar(BOOL, 1)), (UINT64, scalar(UINT64, 2**40)),
                   (ARRAY, array(INT32, [1, 2, 3])), (ARRAY, array(STRING, ["a", "b"])),
                   (ARRAY, array(FLOAT32, [0.5])), (ARRAY, array(BOOL, [1]))]
        vtype, payload = self.rng.choice([o for o in options if o[0] != kv.vtype or o[0] == ARRAY])
        return self._m("wrong_type", f"{key} as type {vtype}", self.L.header(kvs=self._replace(key, vtype, payload)))

    def bad_value(self) -> Mutant:
        key = self._key()
        kv = self.L.kv(key)
        if kv.vtype in FMT:
            value = self.rng.choice(NUMERIC_VALUES)
            vtype = kv.vtype
            if isinstance(value, float) and vtype not in (FLOAT32, FLOAT64) and self.rng.random() < 0.5:
                vtype = FLOAT32
            if isinstance(value, int) and abs(value) >= 2**31 and vtype in (UINT32, INT32) and self.rng.random() < 0.7:
                vtype = UINT64
            payload = scalar(vtype, value)
            return self._m("bad_value", f"{key} = {value!r} (type {vtype})",
                           self.L.header(kvs=self._replace(key, vtype, payload)))
        if kv.vtype == STRING:
            value = self.rng.choice(("", "x" * 300, "llama2", "gpt2", "{{ 1/0 }}", "{% for %}",
                                     "{{ raise_exception('no') }}", "default", "\u0000", "llama"))
            header = self.L.header(kvs=self._replace(key, STRING, string(value)))
            return self._m("bad_value", f"{key} = {value!r}", header)
        # an array: change elements in place (same length), or shorten it
        itype, count = struct.unpack_from("<IQ", kv.payload)
        r = self.rng.random()
        if r < 0.3 and count:
            keep = self.rng.choice((0, 1, count // 2, count - 1))
            items = self._array_items(kv)[:keep]
            return self._m("bad_value", f"{key} cut to {keep} of {count} elements",
                           self.L.header(kvs=self._replace(key, ARRAY, array(itype, items))))
        items = self._array_items(kv)
        i = self.rng.randrange(max(1, count))
        if itype == STRING:
            value = self.rng.choice(("", "<0xZZ>", "\u2581" * 50, "a b c", " "))
        else:
            value = self.rng.choice(NUMERIC_VALUES)
        if items:
            items[i] = value
        return self._m("bad_value", f"{key}[{i}] = {value!r}",
                       self.L.header(kvs=self._replace(key, ARRAY, array(itype, items))))

    def _array_items(self, kv: KV) -> list:
        itype, count = struct.unpack_from("<IQ", kv.payload)
        pos, out = 12, []
        for _ in range(count):
            if itype == STRING:
                (n,) = struct.unpack_from("<Q", kv.payload, pos)
                out.append(kv.payload[pos + 8:pos + 8 + n])
                pos += 8 + n
            else:
                fmt = FMT[itype]
                out.append(struct.unpack_from(fmt, kv.payload, pos)[0])
                pos += struct.calcsize(fmt)
        return out

    def array_length(self) -> Mutant:
        arrays = [kv for kv in self.L.kvs if kv.vtype == ARRAY]
        kv = self.rng.choice(arrays)
        itype, count = struct.unpack_from("<IQ", kv.payload)
        new = self.rng.choice((2**62, 2**40, 2**32, 2**64 - 1, count + 1, count * 2, max(0, count - 1), 0))
        payload = struct.pack("<IQ", itype, new) + kv.payload[12:]
        return self._m("array_length", f"{kv.key} length {count} -> {new}",
                       self.L.header(kvs=self._replace(kv.key, ARRAY, payload)))

    def duplicate_key(self) -> Mutant:
        kvs = list(self.L.kvs)
        kv = self.L.kv(self._key())
        kvs.insert(self.rng.randrange(len(kvs) + 1), replace(kv))
        return self._m("duplicate_key", kv.key, self.L.header(kvs=kvs))

    def drop_key(self) -> Mutant:
        key = self._key()
        return self._m("drop_key", key, self.L.header(kvs=[kv for kv in self.L.kvs if kv.key != key]))

    def add_key(self) -> Mutant:
        key = self.rng.choice(("llama.attention.key_length", "llama.attention.value_length", "llama.vocab_size",
                               "llama.rope.dimension_count", "tokenizer.ggml.scores", "tokenizer.ggml.eot_token_id",
                               "tokenizer.ggml.add_space_prefix", "general.alignment",
                               "llama.attention.sliding_window"))
        vtype, payload = self.rng.choice([(UINT32, scalar(UINT32, self.rng.choice((0, 1, 3, 63, 64, 2**31)))),
                                          (INT32, scalar(INT32, -7)), (FLOAT32, scalar(FLOAT32, float("nan"))),
                                          (STRING, string("x")), (ARRAY, array(FLOAT32, [0.0] * 3))])
        kvs = [kv for kv in self.L.kvs if kv.key != key] + [KV(key, vtype, payload)]
        return self._m("add_key", f"{key} (type {vtype})", self.L.header(kvs=kvs))

    def counts(self) -> Mutant:
        which = self.rng.choice(("n_kv", "n_tensors"))
        real = len(self.L.kvs) if which == "n_kv" else len(self.L.tensors)
        value = self.rng.choice((2**62, 2**40, 2**64 - 1, real + 1, real - 1, 0))
        return self._m("counts", f"{which} {real} -> {value}", self.L.header(**{which: value}))

    def version(self) -> Mutant:
        v = self.rng.choice((0, 1, 4, 2**31, 0x03000000, 2))
        return self._m("version", f"version {v}", self.L.header(version=v))

    def _tensor(self) -> int:
        return self.rng.randrange(len(self.L.tensors))

    def dims(self) -> Mutant:
        i = self._tensor()
        t = self.L.tensors[i]
        d = list(t.dims)
        r = self.rng.randrange(7)
        if r == 0 and len(d) > 1:
            d[0], d[1] = d[1], d[0]
            what = "swapped"
        elif r == 1:
            d[self.rng.randrange(len(d))] += self.rng.choice((1, 32, 256))
            what = "grown"
        elif r == 2:
            d[self.rng.randrange(len(d))] = 0
            what = "zero"
        elif r == 3:
            d[self.rng.randrange(len(d))] = self.rng.choice((2**40, 2**62, 2**64 - 1))
            what = "huge"
        elif r == 4:
            d = d + [1]
            what = "extra 1"
        elif r == 5:
            nt = replace(t, n_dims=self.rng.choice((0, 5, 2**31, 2**32 - 1)))
            return self._m("dims", f"{t.name.decode()} n_dims {nt.n_dims}", self._with_tensor(i, nt))
        else:
            d = d[:1]
            what = "dropped"
        return self._m("dims", f"{t.name.decode()} {t.dims} {what} -> {d}", self._with_tensor(i, replace(t, dims=d)))

    def _with_tensor(self, i: int, t: TensorInfo) -> bytes:
        tensors = list(self.L.tensors)
        tensors[i] = t
        return self.L.header(tensors=tensors)

    def tensor_type(self) -> Mutant:
        i = self._tensor()
        t = self.L.tensors[i]
        value = self.rng.choice((0, 1, 2, 8, 12, 14, 16, 24, 30, 39, 99, 2**31))
        return self._m("tensor_type", f"{t.name.decode()} type {t.ttype} -> {value}",
                       self._with_tensor(i, replace(t, ttype=value)))

    def offset(self) -> Mutant:
        i = self._tensor()
        t = self.L.tensors[i]
        other = self.L.tensors[self._tensor()]
        value = self.rng.choice((t.offset + 1, t.offset + 32, self.L.data_size, self.L.data_size * 2, 2**63,
                                 2**64 - 32, other.offset, 0))
        return self._m("offset", f"{t.name.decode()} offset {t.offset} -> {value}",
                       self._with_tensor(i, replace(t, offset=value)))

    def duplicate_tensor(self) -> Mutant:
        i, j = self._tensor(), self._tensor()
        t = self.L.tensors[i]
        name = self.L.tensors[j].name
        return self._m("duplicate_tensor", f"tensor {i} renamed {name.decode()}",
                       self._with_tensor(i, replace(t, name=name)))

    def rename_tensor(self) -> Mutant:
        i = self._tensor()
        t = self.L.tensors[i]
        new = self.rng.choice((t.name + b"x", b"blk.99999999999." + t.name, t.name.replace(b"blk.", b"blk.1", 1),
                               b"\xff\xfe" + t.name, b"", b"blk.\xd9\xa3.attn_q.weight"))
        return self._m("rename_tensor", f"{t.name.decode()} -> {new!r}", self._with_tensor(i, replace(t, name=new)))

    def swap_tensors(self) -> Mutant:
        i, j = self._tensor(), self._tensor()
        tensors = list(self.L.tensors)
        a, b = tensors[i], tensors[j]
        tensors[i], tensors[j] = replace(a, dims=b.dims, ttype=b.ttype), replace(b, dims=a.dims, ttype=a.ttype)
        return self._m("swap_tensors", f"{a.name.decode()} <-> {b.name.decode()} shapes",
                       self.L.header(tensors=tensors))

    def alignment(self) -> Mutant:
        value = self.rng.choice((0, 1, 3, 16, 64, 4096, 2**31, 2**32 - 1))
        vtype = self.rng.choice((UINT32, UINT32, UINT64, INT32, STRING))
        payload = string(str(value)) if vtype == STRING else scalar(vtype, value)
        kvs = [kv for kv in self.L.kvs if kv.key != "general.alignment"] + [KV("general.alignment", vtype, payload)]
        align = value if vtype == UINT32 and value and not value & (value - 1) and value <= 4096 else None
        return self._m("alignment", f"general.alignment = {value} (type {vtype})",
                       self.L.header(kvs=kvs, alignment=align))

    def magic(self) -> Mutant:
        m = self.rng.choice((b"GGUG", b"FUGG", b"\0\0\0\0", b"GGML"))
        return self._m("magic", f"magic {m!r}", self.L.header(magic=m))

    def bad_strings(self) -> Mutant:
        key = self._key()
        kv = self.L.kv(key)
        raw = self.rng.choice((b"\xff\xfe", b"\xc3", b"abc\xed\xa0\x80", b"\x80"))
        if kv.vtype == ARRAY and struct.unpack_from("<I", kv.payload)[0] == STRING:
            items = self._array_items(kv)
            items[self.rng.randrange(len(items))] = raw
            payload = array(STRING, items)
            return self._m("bad_strings", f"{key}[i] = {raw!r}", self.L.header(kvs=self._replace(key, ARRAY, payload)))
        kvs = [KV(key, STRING, string(raw)) if k.key == key else k for k in self.L.kvs]
        return self._m("bad_strings", f"{key} = {raw!r}", self.L.header(kvs=kvs))


# -- running one mutant ------------------------------------------------------------------------------------
class TimeLimit(BaseException):
    """The per-file time limit passed (a BaseException, so no `except Exception` in the code under test
    swallows it)."""


def _vm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def limits(seconds: float, memory_bytes: int):
    """A wall-clock limit (SIGALRM raises TimeLimit) and an address-space limit of memory_bytes beyond
    what the process maps now (an allocation past it is a MemoryError)."""
    def on_alarm(signum, frame):
        raise TimeLimit()

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = _vm_bytes() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        signal.signal(signal.SIGALRM, old_handler)


@dataclass
class Outcome:
    kind: str               # accepted, named, unnamed, raw, hang, memory (CLI path: ran, ran_other, ...)
    message: str = ""


@dataclass
class Tally:
    counts: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)        # outcome -> [(mutant kind, detail, message)]
    by_kind: dict = field(default_factory=dict)         # mutation kind -> Counter of outcomes

    def add(self, mutant: Mutant, outcome: Outcome) -> None:
        self.counts[outcome.kind] += 1
        self.by_kind.setdefault(mutant.kind, Counter())[outcome.kind] += 1
        ex = self.examples.setdefault(outcome.kind, [])
        if len(ex) < 12:
            ex.append((mutant.kind, mutant.detail, outcome.message[:400]))


def _tokenizer_memo():
    """A tokenizer is a pure function of the tokenizer.* keys: a mutant that leaves them as the intact
    file has them gets the tokenizer built for those values (building one takes about half a second)."""
    from framework.model import tokenizer as T
    build = T.tokenizer_from_metadata
    memo: dict[int, object] = {}

    def memoized(fields):
        key = hash(tuple((k, _frozen(v), type(v).__name__) for k, v in sorted(fields.items())
                         if k.startswith("tokenizer.")))
        if key not in memo:
            if len(memo) > 4:
                memo.clear()
            memo[key] = build(fields)
        return memo[key]
    return T, build, memoized


def _frozen(v):
    if not isinstance(v, list):
        return v
    t = tuple(v)
    try:
        hash(t)
        return t
    except TypeError:           # an array of arrays
        return repr(v)


@contextlib.contextmanager
def memoized_tokenizers():
    T, build, memoized = _tokenizer_memo()
    T.tokenizer_from_metadata = memoized
    try:
        yield
    finally:
        T.tokenizer_from_metadata = build


def open_like_info(path: Path, seconds: float, memory_bytes: int) -> Outcome:
    """What `framework info` does with a file: load it (hyper-parameters, weights checked against the
    architecture), build its tokenizer, and read what info prints."""
    from framework.model.gguf_file import ModelFileError
    from framework.model.model import Model
    try:
        with limits(seconds, memory_bytes):
            model = Model(path)
            tok = model.tokenizer
            _ = (model.name, model.hp.n_layer, tok.n_vocab, sorted(tok.eog_ids), tok.bos_id, tok.add_bos,
                 sum(t.nbytes for t in model.file.tensors.values()))
            tok.decode(tok.encode("Hello, world 123"))
    except TimeLimit:
        return Outcome("hang", f"over {seconds} s")
    except MemoryError as e:
        return Outcome("memory", f"MemoryError: {e}")
    except ModelFileError as e:
        return Outcome("named" if str(path) in str(e) else "unnamed", str(e))
    except Exception as e:      # noqa: BLE001 - the point: anything else is a raw exception
        return Outcome("raw", f"{type(e).__name__}: {e} | {_where(e)}")
    return Outcome("accepted")


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    ours = [f for f in tb if "/framework/" in f.filename] or tb
    return f"{Path(ours[-1].filename).name}:{ours[-1].lineno}" if ours else "?"


def run_cli(path: Path, seconds: float, memory_bytes: int, expected: str | None = None) -> Outcome:
    """`framework run -m FILE -n 1 hi`, in-process: ran (the intact file's text, when ``expected`` is
    given), ran_other (other text), named (a one-line error, exit 2), raw, hang, memory."""
    from framework.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    try:
        with limits(seconds, memory_bytes), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main(["run", "-m", str(path), "-n", "1", "hi"])
    except TimeLimit:
        return Outcome("hang", f"over {seconds} s")
    except MemoryError as e:
        return Outcome("memory", f"MemoryError: {e}")
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except Exception as e:      # noqa: BLE001
        return Outcome("raw", f"{type(e).__name__}: {e} | {_where(e)}")
    text = err.getvalue()
    if rc == 0:
        if expected is not None and out.getvalue() != expected:
            return Outcome("ran_other", f"printed {out.getvalue()!r}")
        return Outcome("ran", out.getvalue())
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    return Outcome("named" if errors else "unnamed", (errors or [text.strip()[-300:]])[0])
