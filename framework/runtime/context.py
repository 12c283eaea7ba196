"""A session's context: one model on a list of devices, its KV cache, where that cache lives, and the
graph of every step shape. Each distinct step shape (``shape_key``) gets its graph once; the KV length
a step attends over is rounded up to a multiple of KV_PAD (as llama.cpp pads n_kv), so decode reuses a
handful of shapes. When a selected device demands static shapes (limits.static_shapes), every prefill
chunk is padded to n_batch tokens and every step attends over all n_ctx cache rows: two shapes for a
whole run. When a selected device compiles a program per shape (limits.padded_rows), a step's token rows
and logits rows are rounded up to a power of two (``padded_rows``): a server's ever-new mixes of prompt and
decode rows then meet a bounded set of programs. Padding tokens write their K and V to scratch rows after the
n_ctx real ones, which no query reads, see what the step's last real row sees, and their logits are never
returned.

The memory fit (which device runs each layer) is worked out once, over the largest steps; the cache is
then placed layer by layer on a device that can write it. A draft's context made with
``share_kv_with=target`` uses the target's cache tensors, fit and placement, in place.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..contract import Device
from ..core.graph import F32, Graph, GraphBuilder, LeafKind, ops
from ..core.scheduler import Residence
from ..core.scheduler.memory import Fit, fit_layers, fit_needed, memory_budgets
from ..core.scheduler.verdicts import ask
from ..model.model import Model

KV_PAD = 256
GREEDY = "argmax"       # a shape key's last element where the step's output is the ARGMAX of its logits


class ContextFullError(ValueError):
    """The tokens do not fit in the context."""


class Context:
    def __init__(self, model: Model, devices: list[Device], n_ctx: int = 2048, n_batch: int = 512,
                 kv_device: str | None = None, n_layers: int | None = None, memory_caps: dict[str, int] | None = None,
                 share_kv_with: "Context | None" = None, role: str | None = None, hidden: bool = False,
                 out_rows: int = 1):
        if n_ctx < 1 or n_batch < 1:
            raise ValueError(f"n_ctx ({n_ctx}) and n_batch ({n_batch}) must be positive")
        self.model, self.devices, self.n_batch, self.n_layers = model, list(devices), n_batch, n_layers
        self.role = role                    # "draft" for a draft's steps: named so in plans and reports
        self.hidden = hidden                # graphs also return the hidden state the head reads
        self.out_rows = out_rows            # the most rows of logits a step returns (a batch: --parallel)
        self.static = any(d.limits.static_shapes for d in self.devices)
        self.padded = not self.static and any(d.limits.padded_rows for d in self.devices)
        unknown = sorted(set(memory_caps or ()) - {d.name for d in self.devices})
        if unknown:
            raise ValueError(f"--device-memory names {', '.join(unknown)}, which is not among the selected devices "
                             f"({', '.join(d.name for d in self.devices)})")
        self.budgets = memory_budgets(self.devices, memory_caps)
        self.graphs: dict[tuple, tuple[Graph, object]] = {}
        if share_kv_with is not None and model.arch.recurrent:
            raise ValueError(f"{model.name} ({model.arch.name}) keeps recurrent state per sequence, which a draft "
                             f"cannot share with its target: run the draft with its own cache")
        if share_kv_with is not None:
            # a draft that reads and writes the target's cache tensors where the target keeps them
            self.n_ctx, self.cache, self.fit = share_kv_with.n_ctx, share_kv_with.cache, share_kv_with.fit
            self.residence = {k: replace(r, owner="the target") for k, r in share_kv_with.residence.items()}
            self.padded = self.padded and (share_kv_with.padded or share_kv_with.static)   # its scratch rows
        else:
            self.n_ctx, self.cache = n_ctx, model.arch.make_cache(n_ctx, n_batch if self.static or self.padded else 0)
            self.fit = self._fit_memory(kv_device)
            self.residence = self._place_cache(kv_device)

    def _fit_memory(self, kv_device: str | None) -> Fit:
        """Which device runs each layer, when a device's memory cannot hold all it accepts: fitted once, over
        the steps with the most activations (a whole prefill chunk with out_rows rows of logits, and decode,
        over the whole context)."""
        if not fit_needed(self.devices, self.budgets):
            return fit_layers([], self.devices, self.budgets)
        chunk = min(self.n_batch, self.n_ctx)
        keys = dict.fromkeys([self.shape_key(chunk, self.n_ctx - chunk, min(self.out_rows, chunk)),
                              self.shape_key(1, self.n_ctx - 1, 1)])
        return fit_layers([self.graph(k)[0] for k in keys], self.devices, self.budgets, kv_device)

    def _place_cache(self, kv_device: str | None) -> dict[int, Residence]:
        """The KV cache lives on kv_device, or each layer's on the first device from the one the memory fit
        gave the layer that can write it; each recurrent state likewise, on a device that accepts the op
        that reads it."""
        by_name = {d.name: d for d in self.devices}
        if kv_device is not None and kv_device not in by_name:
            raise ValueError(f"--kv-device {kv_device} is not among the selected devices "
                             f"({', '.join(by_name)})")
        graph, _ = self.model.build_step(1, min(KV_PAD, self.cache.n_ctx), 1, self.cache, n_layers=1)

        def first_accepting(op: str, layer: int | None) -> Device:
            devices = self.fit.start(layer, self.devices)
            node = next((n for n in graph.nodes if n.op == op and (not ops.writes_source(op) or
                                                                  n.storage.kind == LeafKind.CACHE)), None)
            if node is None:
                return devices[0]
            return next((d for d in devices if ask(d, node).ok), devices[0])

        home = {id(t): by_name.get(kv_device) or first_accepting("SET_ROWS", t.layer) for t in self.cache.tensors()}
        for t, op in self.cache.states():
            home[id(t)] = by_name.get(kv_device) or first_accepting(op, t.layer)
        return {k: Residence(d.name, d.buffer_type, d.physical_id) for k, d in home.items()}

    # -- step shapes and their graphs ------------------------------------------------------
    def shape_key(self, n_tokens: int, n_past: int, n_out: int | None) -> tuple:
        """(tokens, KV rows attended over, logits rows or None for all): the shape a step of n_tokens after
        n_past runs as, one graph and one plan per key."""
        return self.rows_key(n_tokens, n_past + n_tokens, n_out)

    def rows_key(self, n_tokens: int, n_rows: int, n_out: int | None) -> tuple:
        """The shape of a step of n_tokens whose queries see cache rows below n_rows (a batch of several
        sequences: one past the highest cell any of them uses)."""
        if n_tokens == 1:
            n_out = 1               # the logits of every token of a one-token step are its last token's
        if self.static:
            return (1 if n_tokens == 1 else self.n_batch), self.n_ctx, (None if n_out is None else 1)
        if self.padded and n_tokens > 1:
            n_tokens = padded_rows(n_tokens, self.n_batch)
            if n_out is not None:   # a batch's logits rows: at least as many as its sequences may bring
                n_out = min(n_tokens, padded_rows(max(n_out, self.out_rows), self.n_batch))
        return n_tokens, min(self.n_ctx, -(-n_rows // KV_PAD) * KV_PAD), n_out

    def graph(self, key: tuple) -> tuple[Graph, object]:
        """The graph of a step shape and its input leaves (StepInputs), built once."""
        if key not in self.graphs:
            graph, inp = self.model.build_step(*key[:3], self.cache, self.n_layers, self.hidden, key[3:] == (GREEDY,))
            graph.meta["phase"] = "decode" if key[0] == 1 else "prefill"
            if self.role:
                graph.meta["role"] = self.role
            self.graphs[key] = (graph, inp)
        return self.graphs[key]

    def shapes_for(self, n_prompt: int, n_predict: int, all_logits: bool = False, greedy: bool = False) -> list[tuple]:
        """Every step shape a run of this prompt and generation length will use (greedy: runtime/greedy.py's)."""
        if n_prompt < 1 or n_predict < 0:
            raise ValueError(f"a run needs a prompt of at least one token and a generation length of 0 or more, "
                             f"got {n_prompt} and {n_predict}")
        if n_prompt + n_predict > self.n_ctx:
            raise ContextFullError(f"a {n_prompt}-token prompt plus {n_predict} generated tokens exceed the "
                                   f"context length {self.n_ctx}; raise --ctx or lower -n")
        tail = (GREEDY,) if greedy and not all_logits else ()    # the prompt's last chunk and decode give ARGMAX
        keys, past = [], 0
        for start in range(0, n_prompt, self.n_batch):
            n = min(self.n_batch, n_prompt - start)
            keys.append(self.shape_key(n, past, None if all_logits else 1) + tail * (start + n == n_prompt))
            past += n
        for _ in range(max(0, n_predict - 1)):
            keys.append(self.shape_key(1, past, 1) + tail)
            past += 1
        return list(dict.fromkeys(keys))

    def phase_name(self, key: tuple) -> str:
        return phase_name(key) if self.role is None else f"{self.role} {phase_name(key)}"

    def check_tokens(self, tokens, n_past: int) -> list[int]:
        """The tokens as ints, when they fit in the context after n_past and in the vocabulary."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("eval() needs at least one token")
        if n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(f"{n_past} tokens in the context plus {len(tokens)} new ones exceed the "
                                   f"context length {self.n_ctx}; raise --ctx (the model was trained with "
                                   f"{self.model.hp.n_ctx_train})")
        bad = [t for t in tokens if not 0 <= t < self.model.hp.n_vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary (0..{self.model.hp.n_vocab - 1})")
        return tokens

    def step_values(self, inp, chunk: list[int], n_past: int) -> dict[int, np.ndarray]:
        """The values of a step's input leaves for these tokens after n_past: padding tokens (a static shape
        longer than the chunk) write scratch rows after the n_ctx real ones and sit at the last real position."""
        n, (n_tokens, n_kv) = len(chunk), inp.mask.shape
        pos = np.arange(n_past, n_past + n_tokens, dtype=np.int32)
        rows = pos.copy()
        rows[n:] = self.n_ctx + np.arange(n_tokens - n, dtype=np.int32)
        pos[n:] = n_past + n - 1
        tokens = np.zeros(n_tokens, dtype=np.int32)
        tokens[:n] = chunk
        values = {id(inp.tokens): tokens, id(inp.pos): pos, id(inp.kv_rows): rows,
                  id(inp.mask): causal_mask(pos, n_kv, 0)}
        if inp.mask_swa is not None:
            values[id(inp.mask_swa)] = causal_mask(pos, n_kv, self.model.hp.sliding_window)
        if inp.out_ids is not None:
            values[id(inp.out_ids)] = np.array([n - 1], dtype=np.int32)
        values.update(self.model.arch.step_values(inp, n, n_past))
        return values


def greedy_key(key: tuple) -> tuple:
    """The shape key of the same step whose output is the argmax of each logits row (ARGMAX) instead."""
    return key[:3] + (GREEDY,)


def argmax_on_device(devices: list[Device], n_vocab: int) -> bool:
    """Whether greedy steps take their argmax where the logits are made: some device keeps its values in
    memory of its own (else the logits are in host memory already, and nothing is saved) and every device
    runs ARGMAX over the vocabulary (one that could not would put it on another, the logits copied there)."""
    if all(d.buffer_type.host for d in devices):
        return False
    b = GraphBuilder()
    node = b.argmax(b.input("logits", F32, (1, n_vocab)))
    return all(ask(d, node).ok for d in devices)


def padded_rows(n: int, cap: int) -> int:
    """The rows a step of n rows runs as where every shape is a compile: the next power of two, at most cap (10
    sizes up to a --batch of 512; a step computes at most twice its rows, on devices bound by reading weights)."""
    return min(cap, 1 << (n - 1).bit_length())


def phase_name(key: tuple) -> str:
    """A step shape's name in plans and reports: decode[tokens=1,kv=256], prefill[tokens=7,kv=256], and a
    step of several sequences batch[tokens=5,kv=256,out=3] (logits of 3 rows)."""
    n_tokens, n_kv, n_out = key[:3]
    greedy = f",{GREEDY}" if key[3:] == (GREEDY,) else ""
    if n_tokens > 1 and n_out is not None and n_out > 1:
        return f"batch[tokens={n_tokens},kv={n_kv},out={n_out}{greedy}]"
    kind = "decode" if n_tokens == 1 else "prefill"
    return f"{kind}[tokens={n_tokens},kv={n_kv}" + (",all-logits" if n_out is None and n_tokens > 1 else "") + \
        f"{greedy}]"


def causal_mask(pos: np.ndarray, n_kv: int, window: int) -> np.ndarray:
    """0 where query position p may see cache row s (s <= p, and p - s < window when windowed), else -inf."""
    if len(pos) == 1:           # a decode step: one run of zeros (a third of the time of the general case)
        p = int(pos[0])
        row = np.full((1, n_kv), -np.inf, dtype=np.float32)
        row[0, max(0, p - window + 1) if window else 0:max(0, p + 1)] = 0
        return row
    s = np.arange(n_kv, dtype=np.int64)[None, :]
    p = pos.astype(np.int64)[:, None]
    visible = s <= p
    if window:
        visible &= (p - s) < window
    return np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)
