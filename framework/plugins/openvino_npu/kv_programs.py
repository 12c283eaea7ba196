"""One compiled model for a step at every KV length (openvino:CPU).

The core plans a step for each KV length it attends over (rounded up to KV_PAD), and each is a fragment of
its own. On OpenVINO's CPU device every compiled model holds its own repacked copy of the weights, 1 to 2.5
times their bytes (SmolLM2: 241-253 MiB a model for 98 MiB of weights; the 1.5B: 2.2 GiB for 1.3 GiB;
docs/openvino.md, "One model for every KV length"), so a server's 8 row counts at 64 KV lengths needed hundreds of GB. A
fragment whose only KV-length-shaped values are its attentions' cache views and masks belongs to a family (the
same ops, shapes, parameters, wiring and weights once the KV length is set aside). Its first KV length runs a
model of fixed shapes (the fastest); from its second on, every length runs on one model translated with the KV
length left dynamic (the window and mask inputs, the attention over them), each program feeding its own window
rows at run time (device.py's OvProgram.build). Anything else keeps a model per KV length.
"""

from __future__ import annotations

import hashlib
import threading

from ...contract import Fragment, Tensor, settings

KV_PROGRAMS_ENV = "FRAMEWORK_OPENVINO_KV_PROGRAMS"
SHARED, PER_LENGTH = "shared", "per_length"


class DynamicKVError(RuntimeError):
    """A fragment the translation cannot leave its KV length dynamic in: it keeps a model of fixed shapes for
    each KV length."""


settings.declare(KV_PROGRAMS_ENV, "openvino", f"{SHARED} or {PER_LENGTH}", SHARED,
                 "openvino:CPU: one compiled model for a step shape at every KV length (shared), or one per KV "
                 "length (per_length: each holds its own copy of the weights)", settings.choice((SHARED, PER_LENGTH)))


def kv_length(fragment: Fragment) -> int | None:
    """The KV length of a fragment that can be one model for every KV length: each FLASH_ATTN_EXT reads offset-0
    views of caches written in this fragment, with a mask given to the fragment, all over one length; those views
    and masks are read by the attentions alone, and the writes by their views alone. None for any other
    fragment (the translation may still refuse one: DynamicKVError)."""
    attentions = [n for n in fragment.nodes if n.op == "FLASH_ATTN_EXT"]
    inside = {id(n) for n in fragment.nodes}
    lengths = set()
    for a in attentions:
        if len(a.src) < 4 or id(a.src[3]) in inside:
            return None
        for kv in a.src[1:3]:
            if not (kv.op == "VIEW" and kv.params["offset"] == 0 and id(kv) in inside and kv.src[0].op == "SET_ROWS"):
                return None
        lengths |= {a.src[1].shape[0], a.src[2].shape[0], a.src[3].shape[1]}
    if len(lengths) != 1:
        return None
    readers = _readers(fragment)
    views = {id(t) for a in attentions for t in a.src[1:3]}
    for a in attentions:
        for t, places in ((a.src[1], (1, 2)), (a.src[2], (1, 2)), (a.src[3], (3,))):
            if any(r.op != "FLASH_ATTN_EXT" or not _only_at(r, t, places) for r in readers.get(id(t), ())):
                return None
        for view in a.src[1:3]:
            if any(id(r) not in views for r in readers.get(id(view.src[0]), ())):
                return None
    return lengths.pop()


def _readers(fragment: Fragment) -> dict[int, list[Tensor]]:
    out: dict[int, list[Tensor]] = {}
    for n in fragment.nodes:
        for s in n.src:
            out.setdefault(id(s), []).append(n)
    return out


def _only_at(reader: Tensor, t: Tensor, places: tuple) -> bool:
    return all(i in places for i, s in enumerate(reader.src) if s is t)


def family_key(fragment: Fragment, kv: int) -> str:
    """The fragment's ops, dtypes, shapes, parameters and wiring, with the KV length of its attentions' views and
    masks set aside: fragments with one key differ in that length alone. (framework.core's structure hash with
    those dimensions written as "KV"; only the tensors kv_length checked carry it.)"""
    marked = {}
    for n in fragment.nodes:
        if n.op == "FLASH_ATTN_EXT":
            marked[id(n.src[1])] = marked[id(n.src[2])] = 0
            marked[id(n.src[3])] = 1
    index = {id(n): i for i, n in enumerate(fragment.nodes)}
    external: dict[int, int] = {}
    h = hashlib.sha256()
    for n in fragment.nodes:
        refs = []
        for s in n.src:
            if id(s) in index:
                refs.append(f"n{index[id(s)]}")
            else:
                kind = s.kind.value if s.is_leaf and s.kind else "ext"
                refs.append(f"x{external.setdefault(id(s), len(external))}:{kind}:{s.dtype.name}:{_shape(s, marked)}")
        params = sorted((k, repr(_shape_param(v, kv) if k == "shape" and id(n) in marked else v))
                        for k, v in n.params.items())
        h.update(repr((n.op, n.dtype.name, _shape(n, marked), tuple(refs), params)).encode())
    h.update(repr([index.get(id(o), -1) for o in fragment.outputs]).encode())
    return h.hexdigest()[:16]


def _shape(t: Tensor, marked: dict[int, int]) -> tuple:
    axis = marked.get(id(t))
    return tuple("KV" if i == axis else d for i, d in enumerate(t.shape))


def _shape_param(shape, kv: int) -> tuple:
    return ("KV",) + tuple(shape[1:]) if shape and shape[0] == kv else tuple(shape)


class Family:
    """A compiled model every fragment of one family runs on: its translation (the feeds and outputs, the
    window inputs sized at run time), the compiled model, one infer request and the lock that keeps two runs
    from sharing it at once."""

    def __init__(self, translation, compiled, effective: dict, requested: dict, loaded_from_cache: bool,
                 weights: list):
        self.translation = translation
        self.weights = weights          # held while the model is: the family's key names them by identity
        self.compiled = compiled
        self.request = compiled.create_infer_request()
        self.effective = effective
        self.requested = requested
        self.loaded_from_cache = loaded_from_cache
        self.lock = threading.Lock()
        self.n_out = len(compiled.outputs)


def enabled(hardware_is_cpu: bool, static_shapes: bool) -> bool:
    """Shared models on OpenVINO's CPU device, unless a profile fixes shapes or the setting asks for one per length
    (OpenVINO's GPU and NPU plugins are not here to test a dynamic KV length on)."""
    return hardware_is_cpu and not static_shapes and settings.read(KV_PROGRAMS_ENV) == SHARED
