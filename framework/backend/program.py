"""A compiled fragment, the part every device-memory backend shares: the fragment lowered (lowering.py),
its values placed (memory.py), and what a run does on the host before and after the device's work:
the arguments bound (weights taken as a block while the handles stay the same, host values gathered
for the plugin to upload), the rope tables' rows, the operands resolved to buffers, the outputs handed
back as handles, and the profile added up. The plugin's subclass encodes the steps and submits them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.device_buffers import DeviceTensor, DeviceWeight, contiguous_strides, picker
from ..core.graph import LeafKind
from . import memory
from .lowering import Lowering
from .steps import ChunkArg, Ref, RopeArg


class StagedTensor(DeviceTensor):
    """An output whose run also copied its values for reading back (to host memory, or to a buffer the host
    maps), in the run's own submission: ``readback()`` gives them, or None where a later run has copied over
    them (the device then reads the handle's own buffer)."""

    __slots__ = ("readback",)

    def __init__(self, *a, readback=None, **k):
        super().__init__(*a, **k)
        self.readback = readback


def read_as_ints(read):
    """A StagedTensor's readback for an index output (ARGMAX's): the words `read` gives, as int32 (None stays)."""
    values = read()
    return None if values is None else values.view(np.int32)


def strided_copy(flat: np.ndarray, offset: int, shape: tuple, strides: tuple | None) -> np.ndarray:
    """The values a view (an element offset, strides in elements or None: contiguous) sees of a flat array."""
    st = strides or contiguous_strides(shape)
    return np.array(np.lib.stride_tricks.as_strided(flat[offset:], shape, tuple(s * flat.itemsize for s in st)))


@dataclass
class Arguments:
    """A run's arguments: each one's buffer and element offset, the host values among them (by argument),
    those the plugin must upload (argument, values), the weights by argument, and what stands for the
    weights in the plugin's keys (the same while the weight handles are)."""
    bufs: list
    offs: list
    host_vals: dict
    staged: list
    weights: dict
    wkey: object


class Program:
    # True: an input leaf given as a device tensor (an earlier run's output: a greedy step's token) is staged
    # like host values, in ``Arguments.staged`` as that DeviceTensor, for the plugin to copy on the device
    # into its values buffer, so that the run's buffers (and a CUDA graph of them) stay the same run after run
    stage_device_inputs = False

    def __init__(self, dev, fragment, table):
        self.dev = dev
        self.name = fragment.describe()
        self.inputs, self.outputs = list(fragment.inputs), list(fragment.outputs)
        lowered = Lowering(dev, fragment, table)
        self.refs, self.steps, self.ropes = lowered.refs, lowered.steps, lowered.ropes
        self.val_sizes, self.written_args, self.align4 = lowered.val_sizes, lowered.written_args, lowered.align4
        self.out_refs = [self.refs[id(t)] for t in self.outputs]
        self.out_dtypes = [np.int32 if t.dtype.name == "I32" else np.float32 for t in self.outputs]
        self.memory = memory.assign(self.steps, self.val_sizes, self.out_refs)
        self.out_vals = [v for v in range(len(self.val_sizes)) if self.memory.val_out[v] >= 0]     # the outputs
        # outputs that are an argument seen whole (a written cache): that argument's handle, if on the device
        self.whole_arg = [r.kind == "arg" and r.off == 0 and r.contiguous and r.shape == tuple(self.inputs[r.idx].shape)
                          for r in self.out_refs]
        # weights are the same handles run after run: taken as a block (see arguments)
        self.weight_idx = [i for i, t in enumerate(self.inputs) if t.is_leaf and t.kind == LeafKind.WEIGHT]
        self.other_idx = [i for i, t in enumerate(self.inputs) if not (t.is_leaf and t.kind == LeafKind.WEIGHT)]
        self.pick_weights = picker(self.weight_idx)
        self.last_weights, self.weights_ok, self.weight_bufs, self.weight_map = None, False, [], {}
        self.weights_seen = 0      # counts the sets of weight handles taken: the weights' part of the keys
        self.rope_tabs: list = [None] * len(self.ropes)
        # the caches are the same handles step after step too (written in place): their places and the
        # outputs that are them whole are kept from the last run that had them (a decode step has 60)
        self.cache_idx = [i for i in self.other_idx if self.inputs[i].is_leaf and self.inputs[i].kind == LeafKind.CACHE]
        caches = set(self.cache_idx)
        self.rest_idx = [i for i in self.other_idx if i not in caches]
        self.input_idx = {i for i in self.other_idx if self.inputs[i].is_leaf and self.inputs[i].kind == LeafKind.INPUT}
        self.pick_caches = picker(self.cache_idx)
        cache_outs = {k for k, (r, whole) in enumerate(zip(self.out_refs, self.whole_arg)) if whole and r.idx in caches}
        self.rest_outs = [k for k in range(len(self.out_refs)) if k not in cache_outs]
        self.last_caches, self.cache_places, self.cache_results, self.same_caches = None, None, None, False

    # -- before a run ---------------------------------------------------------------------------
    def arguments(self, args) -> Arguments:
        """Each argument's buffer and element offset: a weight's first chunk, a device tensor's own buffer,
        or for host values (and views a kernel cannot read in place) values for the plugin to upload (a
        cache handed over as values gets a buffer of its own: it lives on here from now)."""
        dev = self.dev
        host_vals: dict[int, np.ndarray] = {}
        staged: list[tuple[int, np.ndarray]] = []
        held = self.pick_weights(args)
        if held != self.last_weights or len(self.weight_bufs) != len(args):      # weights compared by identity
            self._take_weights(held, len(args))
        caches = self.pick_caches(args)
        self.same_caches = self.weights_ok and bool(self.cache_idx) and caches == self.last_caches
        if self.same_caches:                    # compared by identity: the same device handles as last run
            bufs, offs = list(self.cache_places[0]), list(self.cache_places[1])
        else:
            bufs, offs = list(self.weight_bufs), [0] * len(args)
        extra: dict[int, DeviceWeight] = {}     # weights among the other arguments (a program of other weights)
        for i in (self.rest_idx if self.same_caches else self.other_idx if self.weights_ok else range(len(args))):
            h = args[i]
            if isinstance(h, DeviceWeight):
                extra[i] = h
                bufs[i] = h.chunks[0].buffer
                continue
            if isinstance(h, np.ndarray):
                h = dev.from_host(h)
            elif self.stage_device_inputs and h.host is None and i in self.input_idx and h.contiguous:
                staged.append((i, h))
                continue
            if h.host is not None or not h.contiguous or (i in self.align4 and h.offset % 4):
                data = np.ascontiguousarray(h.host if h.host is not None else dev.to_host(h))
                host_vals[i] = data
                if i in self.written_args:
                    bufs[i] = dev.buffer_with(data)
                else:
                    staged.append((i, data))
            else:
                bufs[i], offs[i] = h.buffer, h.offset
        if not self.same_caches:
            self._keep_cache_places(caches, bufs, offs, host_vals, extra)
        if not extra:
            return Arguments(bufs, offs, host_vals, staged, self.weight_map, self.weights_seen)
        return Arguments(bufs, offs, host_vals, staged, {**self.weight_map, **extra},
                         (self.weights_seen, tuple(extra.items())))

    def _keep_cache_places(self, caches: tuple, bufs: list, offs: list, host_vals: dict, extra: dict) -> None:
        """The weights' and caches' places of this run, for the next run with the same handles: where every
        cache is in device memory as it is (no values to upload, no weight among them)."""
        plain = self.weights_ok and self.cache_idx and not any(i in host_vals or i in extra for i in self.cache_idx)
        self.last_caches, self.cache_results = (caches, None) if plain else (None, None)
        if plain:
            kept_bufs, kept_offs = list(self.weight_bufs), [0] * len(bufs)
            for i in self.cache_idx:
                kept_bufs[i], kept_offs[i] = bufs[i], offs[i]
            self.cache_places = (kept_bufs, kept_offs)

    def _take_weights(self, held: tuple, n_args: int) -> None:
        """This run's weights (the same handles as last run's in decode), and their first chunks' buffers."""
        self.last_weights, self.last_caches = held, None
        self.weights_seen += 1
        self.weights_ok = all(isinstance(h, DeviceWeight) for h in held)
        self.weight_map = dict(zip(self.weight_idx, held)) if self.weights_ok else {}
        self.weight_bufs = [None] * n_args
        for i, h in self.weight_map.items():
            self.weight_bufs[i] = h.chunks[0].buffer

    def rope_tables(self, args, host_vals: dict) -> list[np.ndarray]:
        """The (cos, sin) rows of each rope table for this run's positions (the device's RopeRows)."""
        dev = self.dev
        for ti, (pa, poff, n_dims, base, scale, t) in enumerate(self.ropes):
            pos = host_vals.get(pa)
            if pos is None:
                pos = dev.to_host(args[pa])
            pos = np.asarray(pos).reshape(-1)[poff:poff + t]
            self.rope_tabs[ti] = dev.rope_rows.table(pos, n_dims, base, scale)
        return self.rope_tabs

    def output_buffers(self) -> dict:
        """(buffer, lease) of every value that is an output, from the device's pool."""
        return {v: self.dev.output_buffer(4 * self.val_sizes[v]) for v in self.out_vals}

    def scratch_buffers(self) -> list:
        return [self.dev.scratch(s, nb) for s, nb in enumerate(self.memory.slot_bytes)]

    def place(self, b, a: Arguments, outs: dict, slots: list, tables=None) -> tuple:
        """(buffer, element offset) of an operand in this run: an argument's, a value's (its output buffer or
        scratch slot), a weight chunk's (with its scale plane's word offset), the rope tables' (`tables`:
        (buffer, each table's offset or None)), or the device's dummy."""
        if isinstance(b, Ref):
            if b.kind == "arg":
                return a.bufs[b.idx], a.offs[b.idx] + b.off
            if self.memory.val_out[b.idx] >= 0:
                return outs[b.idx][0], b.off
            return slots[self.memory.val_slot[b.idx]], b.off
        if isinstance(b, ChunkArg):
            chunk = a.weights[b.arg].chunks[b.chunk]
            return chunk.buffer, chunk.moff
        if isinstance(b, RopeArg):
            return tables[0], tables[1][b.table] if tables[1] is not None else 0
        return self.dev.dummy(), 0

    # -- after a run ------------------------------------------------------------------------------
    def results(self, args, bufs, outs: dict, wrap=None) -> list:
        """The fragment's outputs as handles: a value's own buffer (``wrap(output index, ref, buffer, lease)``
        may make its handle), or (an argument, a written cache) the argument's buffer seen through the
        output's view."""
        if self.same_caches and self.cache_results is not None:     # the caches' handles: as last run
            results = list(self.cache_results)
            for i in self.rest_outs:
                results[i] = self._result(i, args, bufs, outs, wrap)
            return results
        results = [self._result(i, args, bufs, outs, wrap) for i in range(len(self.out_refs))]
        if self.last_caches is not None:        # kept by arguments(): these caches are the handles next run too
            self.cache_results = list(results)
            for i in self.rest_outs:
                self.cache_results[i] = None
        return results

    def _result(self, i: int, args, bufs, outs: dict, wrap):
        r = self.out_refs[i]
        if self.whole_arg[i]:
            h = args[r.idx]
            if not isinstance(h, np.ndarray) and h.host is None and h.strides is None:
                return h
        if r.kind == "arg":
            return self._arg_result(r, args[r.idx], bufs)
        buf, lease = outs[r.idx]
        made = wrap(i, r, buf, lease) if wrap is not None else None
        return made if made is not None else DeviceTensor(buf, r.off, r.shape, self.out_dtypes[i],
                                                          None if r.contiguous else r.strides, lease=lease)

    def _arg_result(self, r: Ref, h, bufs):
        if isinstance(h, np.ndarray):
            h = self.dev.from_host(h)
        if r.idx in self.written_args and (h.host is not None or not h.contiguous):
            h = DeviceTensor(bufs[r.idx], 0, tuple(self.inputs[r.idx].shape), np.float32)
        if r.off == 0 and r.contiguous and tuple(r.shape) == tuple(h.shape) and h.contiguous:
            return h
        if h.host is not None:
            flat = np.ascontiguousarray(h.host).reshape(-1)
            return DeviceTensor(None, 0, r.shape, flat.dtype, host=strided_copy(flat, r.off, r.shape, r.strides))
        return DeviceTensor(h.buffer, h.offset + r.off, r.shape, h.dtype, None if r.contiguous else r.strides,
                            lease=h.lease)

    def profiled(self, times) -> None:
        """Each step's device time (seconds, in step order) added to the device's profile, by the step
        name's first word."""
        for st, seconds in zip(self.steps, times):
            tot = self.dev.profile.setdefault(st.name.split(" ")[0], [0.0, 0])
            tot[0] += seconds
            tot[1] += 1
