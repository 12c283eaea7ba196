"""A session: one model on a list of devices, a KV cache, and the steps that fill it.

Prefill runs in chunks of n_batch tokens, decode one token at a time. Each distinct step
shape gets its graph and plan once; the KV length a step attends over is rounded up to a
multiple of KV_PAD (as llama.cpp pads n_kv), so decode reuses a handful of plans.

When a selected device demands static shapes (limits.static_shapes), every prefill chunk is
padded to n_batch tokens and every step attends over all n_ctx cache rows: two shapes for a
whole run. Padding tokens write their K and V to scratch rows after the n_ctx real ones,
which no query reads, and their logits are never returned.

`reserve()` plans every shape a run will use and checks the plans before any weight is
loaded; a shape met later (a longer run than reserved) is planned and checked on arrival.

Sessions of one model can share its weights and compiled programs (`share_model_with`), each
keeping its own KV cache: a server's parallel slots. A shared program is one object, so steps of
such sessions must not run at the same time; the caller serialises them.

A draft session (speculative decoding, runtime/speculative.py) is made with `draft_of=target`: it
shares the target's loaded weights and compiled programs, and with `share_kv_with=target` also the
target's cache tensors, in place. Its plans are checked together with the target's (`partners`), since
both draw on the same devices' budgets. `rewind(n)` drops the context after n tokens: the cache is
indexed by position and the mask hides rows past n_past, so nothing is cleared.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .. import caches
from ..contract import Device
from ..core.graph import Graph, LeafKind, ops
from ..core.scheduler import Executor, Plan, Reservation, Residence, make_plan, reserve, reserve_together
from ..core.scheduler.memory import Fit, fit_layers, fit_needed, memory_budgets
from ..core.scheduler.verdicts import ask
from ..model.model import Model

KV_PAD = 256


class ContextFullError(ValueError):
    """The tokens do not fit in the context."""


@dataclass
class StepStats:
    tokens: int = 0
    seconds: float = 0.0             # compiling that a cache keeps for later runs left out (compile_seconds)
    compile_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class Session:
    def __init__(self, model: Model, devices: list[Device], n_ctx: int = 2048, n_batch: int = 512, progress=None,
                 strict: bool = False, kv_device: str | None = None, n_layers: int | None = None,
                 share_kv_with: "Session | None" = None, memory_caps: dict[str, int] | None = None,
                 share_model_with: "Session | None" = None, max_plans: int | None = None,
                 draft_of: "Session | None" = None, hidden: bool = False, check_values: bool = False):
        if n_ctx < 1 or n_batch < 1:
            raise ValueError(f"n_ctx ({n_ctx}) and n_batch ({n_batch}) must be positive")
        self.model, self.devices, self.n_batch = model, list(devices), n_batch
        self.progress, self.strict, self.n_layers = progress, strict, n_layers
        self.hidden = hidden                # graphs also return the hidden state the head reads (hidden_rows)
        self.hidden_rows: np.ndarray | None = None
        draft_of = draft_of or share_kv_with
        self.role = "draft" if draft_of is not None else None
        self.partners: list[Session] = []   # sessions of this process whose plans are checked with these
        self.borrowed: dict[int, object] = {}    # a draft's weights that are its target's, used in place
        self._unchecked: dict[tuple, Plan] = {}
        self.static = any(d.limits.static_shapes for d in self.devices)
        unknown = sorted(set(memory_caps or ()) - {d.name for d in self.devices})
        if unknown:
            raise ValueError(f"--device-memory names {', '.join(unknown)}, which is not among the selected devices "
                             f"({', '.join(d.name for d in self.devices)})")
        self.budgets = memory_budgets(self.devices, memory_caps)
        self.plans: dict[tuple, tuple[Plan, object]] = {}     # in order of last use
        self.graphs: dict[tuple, tuple[Graph, object]] = {}
        # a server meets a new prompt length with almost every request: keep the shapes used last
        self.max_plans = max_plans
        if share_kv_with is not None and model.arch.recurrent:
            raise ValueError(f"{model.name} ({model.arch.name}) keeps recurrent state per sequence, which a draft "
                             f"cannot share with its target: run the draft with its own cache")
        if share_kv_with is not None:
            # a draft that reads and writes the target's cache tensors where the target keeps them
            self.n_ctx, self.cache = share_kv_with.n_ctx, share_kv_with.cache
            self.residence = {k: replace(r, owner="the target") for k, r in share_kv_with.residence.items()}
            self.fit = share_kv_with.fit
            caches = share_kv_with.executor.caches
        else:
            self.n_ctx, self.cache = n_ctx, model.arch.make_cache(n_ctx, n_batch if self.static else 0)
            self.fit = self._fit_memory(kv_device)
            self.residence = self._place_cache(kv_device)
            caches = None
        other, names = share_model_with, [d.name for d in self.devices]
        if other is not None and (other.model is not model or [d.name for d in other.devices] != names):
            raise ValueError("share_model_with needs a session of the same model on the same devices")
        # another session of the model (a server's parallel slot: a cache of our own) or a draft's target:
        # its weights and programs; check_values: every device's outputs must be finite (devices of other
        # distributions' always are)
        lender = draft_of if draft_of is not None else other
        self.executor = Executor(self.devices, model.weight_bytes, self.residence, caches,
                                 lender.executor if lender is not None else None, check_values)
        self.n_past = 0
        self.prefill = StepStats()
        self.decode = StepStats()

    def _fit_memory(self, kv_device: str | None) -> Fit:
        """Which device runs each layer, when a device's memory cannot hold all it accepts: fitted once, over
        the steps with the most activations (a whole prefill chunk, and decode, over the whole context)."""
        if not fit_needed(self.devices, self.budgets):
            return fit_layers([], self.devices, self.budgets)
        chunk = min(self.n_batch, self.n_ctx)
        keys = dict.fromkeys([self._key(chunk, self.n_ctx - chunk, 1), self._key(1, self.n_ctx - 1, 1)])
        return fit_layers([self._graph(k)[0] for k in keys], self.devices, self.budgets, kv_device)

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

    def reset(self) -> None:
        self.n_past = 0

    def rewind(self, n_past: int) -> None:
        """Keep the first n_past tokens of the context (speculative decoding drops rejected ones)."""
        if not 0 <= n_past <= self.n_past:
            raise ValueError(f"cannot rewind to {n_past} tokens: the context holds {self.n_past}")
        if n_past < self.n_past and self.model.arch.recurrent:
            raise ValueError(f"{self.model.name} ({self.model.arch.name}) keeps recurrent state that the last "
                             f"{self.n_past - n_past} tokens have already changed; it cannot be rewound")
        self.n_past = n_past

    # -- shapes and plans -----------------------------------------------------------------
    def _key(self, n_tokens: int, n_past: int, n_out: int | None) -> tuple:
        if n_tokens == 1:
            n_out = 1               # the logits of every token of a one-token step are its last token's
        if self.static:
            return (1 if n_tokens == 1 else self.n_batch), self.n_ctx, (None if n_out is None else 1)
        return n_tokens, min(self.n_ctx, -(-(n_past + n_tokens) // KV_PAD) * KV_PAD), n_out

    def _graph(self, key: tuple) -> tuple[Graph, object]:
        if key not in self.graphs:
            n_tokens, n_kv, n_out = key
            graph, inp = self.model.build_step(n_tokens, n_kv, n_out, self.cache, self.n_layers, self.hidden)
            graph.meta["phase"] = "decode" if n_tokens == 1 else "prefill"
            if self.role:
                graph.meta["role"] = self.role
            self.graphs[key] = (graph, inp)
        return self.graphs[key]

    def shapes_for(self, n_prompt: int, n_predict: int, all_logits: bool = False) -> list[tuple]:
        """Every step shape a run of this prompt length and generation length will use."""
        if n_prompt < 1 or n_predict < 0:
            raise ValueError(f"a run needs a prompt of at least one token and a generation length of 0 or more, "
                             f"got {n_prompt} and {n_predict}")
        if n_prompt + n_predict > self.n_ctx:
            raise ContextFullError(f"a {n_prompt}-token prompt plus {n_predict} generated tokens exceed the "
                                   f"context length {self.n_ctx}; raise --ctx or lower -n")
        keys, past = [], 0
        for start in range(0, n_prompt, self.n_batch):
            n = min(self.n_batch, n_prompt - start)
            keys.append(self._key(n, past, None if all_logits else 1))
            past += n
        for _ in range(max(0, n_predict - 1)):
            keys.append(self._key(1, past, 1))
            past += 1
        return list(dict.fromkeys(keys))

    def reserve(self, n_prompt: int, n_predict: int, all_logits: bool = False) -> Reservation:
        """Plan and check every shape the run will use; nothing is loaded or compiled."""
        keys = self.shapes_for(n_prompt, n_predict, all_logits)
        if self.partners:
            return self.reserve_keys(keys)
        phases = {_phase_name(k): self.plans[k][0] if k in self.plans else self._graph(k)[0] for k in keys}
        known = {_phase_name(k): p for k, (p, _) in self.plans.items() if _phase_name(k) not in phases}
        result = reserve({**known, **phases}, self.devices, self.residence, self.strict,
                         self.executor.programs_per_device(), self.fit)
        for k in keys:
            self._remember(k, self.plans.get(k) or (result.plans[_phase_name(k)], self._graph(k)[1]))
        return result

    def make_plans(self, keys) -> dict[tuple, Plan]:
        """Plans of these step shapes (kept ones, or new ones), not yet checked or kept."""
        out = {}
        for k in dict.fromkeys(keys):
            if k in self.plans:
                out[k] = self.plans[k][0]
            else:
                if k not in self._unchecked:
                    self._unchecked[k] = make_plan(self._graph(k)[0], self.devices, self.residence, self.fit)
                out[k] = self._unchecked[k]
        return out

    def reserve_keys(self, keys, partner_keys: dict | None = None) -> Reservation:
        """Plan these shapes (and partner_keys: {partner session: its shapes}) and check them with every plan
        this session and its partners keep, as the budgets of one process; keep them when the check passes."""
        new = {self: self.make_plans(keys)}
        for other, other_keys in (partner_keys or {}).items():
            new[other] = other.make_plans(other_keys)
        groups, devices = [], {}
        for s in [self, *self.partners]:
            plans = {k: p for k, (p, _) in s.plans.items()}
            plans.update(new.get(s, {}))
            groups.append(({s.phase_name(k): p for k, p in plans.items()}, s.residence))
            devices.update({d.name: d for d in s.devices})
        result = reserve_together(groups, list(devices.values()), self.strict, self.executor.programs_per_device())
        for s, plans in new.items():
            for k, p in plans.items():
                s._remember(k, s.plans.get(k) or (p, s._graph(k)[1]))
                s._unchecked.pop(k, None)
        return result

    def phase_name(self, key: tuple) -> str:
        return _phase_name(key) if self.role is None else f"{self.role} {_phase_name(key)}"

    def plan(self, n_tokens: int, n_past: int = 0, n_out: int | None = 1) -> tuple[Plan, object]:
        if n_tokens < 1:
            raise ValueError(f"a step needs at least one token, got {n_tokens}")
        key = self._key(n_tokens, n_past, n_out)
        if key not in self.plans and self.partners:
            self.reserve_keys([key])
        elif key not in self.plans:
            graph, inp = self._graph(key)
            plan = make_plan(graph, self.devices, self.residence, self.fit)
            known = {_phase_name(k): p for k, (p, _) in self.plans.items()}
            reserve({**known, _phase_name(key): plan}, self.devices, self.residence, self.strict,
                    self.executor.programs_per_device())
            self._remember(key, (plan, inp))
        elif self.max_plans is not None:
            self._remember(key, self.plans[key])
        plan, inp = self.plans[key]
        self.executor.prepare(plan, self.progress)
        return plan, inp

    def _remember(self, key: tuple, value: tuple[Plan, object]) -> None:
        """Store (or mark as just used) a shape's plan; beyond max_plans forget the least recently used."""
        self.plans.pop(key, None)
        self.plans[key] = value
        while self.max_plans is not None and len(self.plans) > self.max_plans:
            old = next(iter(self.plans))
            plan, _ = self.plans.pop(old)
            self.graphs.pop(old, None)
            self.executor.forget(plan)

    # -- running --------------------------------------------------------------------------
    def eval(self, tokens: list[int], all_logits: bool = False, prompt: bool | None = None) -> np.ndarray:
        """Append tokens to the context; return logits of the last token, or of every token.
        ``prompt``: count the tokens as prefill (default: when there is more than one), so that a
        one-token prompt is reported as the prefill it is."""
        tokens = [int(t) for t in tokens]
        if not tokens:
            raise ValueError("eval() needs at least one token")
        if self.n_past + len(tokens) > self.n_ctx:
            raise ContextFullError(f"{self.n_past} tokens in the context plus {len(tokens)} new ones exceed the "
                                   f"context length {self.n_ctx}; raise --ctx (the model was trained with "
                                   f"{self.model.hp.n_ctx_train})")
        bad = [t for t in tokens if not 0 <= t < self.model.hp.n_vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary (0..{self.model.hp.n_vocab - 1})")
        out = []
        for start in range(0, len(tokens), self.n_batch):
            out.append(self._step(tokens[start:start + self.n_batch], all_logits,
                                  len(tokens) > 1 if prompt is None else prompt))
        return np.concatenate(out) if all_logits else out[-1][-1]

    def _step(self, chunk: list[int], all_logits: bool, prompt: bool) -> np.ndarray:
        clock = caches.Stopwatch()
        n = len(chunk)
        plan, inp = self.plan(n, self.n_past, None if all_logits else 1)
        n_tokens, n_kv = inp.mask.shape
        pos = np.arange(self.n_past, self.n_past + n_tokens, dtype=np.int32)
        rows = pos.copy()
        if n < n_tokens:
            rows[n:] = self.n_ctx + np.arange(n_tokens - n, dtype=np.int32)     # padding writes scratch rows
            tokens = np.zeros(n_tokens, dtype=np.int32)
            tokens[:n] = chunk
        else:
            tokens = np.array(chunk, dtype=np.int32)
        values = {id(inp.tokens): tokens, id(inp.pos): pos, id(inp.kv_rows): rows,
                  id(inp.mask): causal_mask(pos, n_kv, 0)}
        if inp.mask_swa is not None:
            values[id(inp.mask_swa)] = causal_mask(pos, n_kv, self.model.hp.sliding_window)
        if inp.out_ids is not None:
            values[id(inp.out_ids)] = np.array([n - 1], dtype=np.int32)
        values.update(self.model.arch.step_values(inp, n, self.n_past))
        outputs = self.executor.run(plan, values)
        logits = outputs[0][:n] if inp.out_ids is None else outputs[0]
        if self.hidden:
            self.hidden_rows = outputs[1][:n] if inp.out_ids is None else outputs[1]
        self.n_past += n
        stats = self.prefill if prompt else self.decode
        stats.tokens += n
        stats.seconds += clock.seconds
        stats.compile_seconds += clock.filled
        return logits


def _phase_name(key: tuple) -> str:
    n_tokens, n_kv, n_out = key
    kind = "decode" if n_tokens == 1 else "prefill"
    return f"{kind}[tokens={n_tokens},kv={n_kv}" + (",all-logits]" if n_out is None and n_tokens > 1 else "]")


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
