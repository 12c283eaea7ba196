"""A session steps over a context (runtime/context.py: the model on its devices, the KV cache, the memory
fit, the graph of every step shape): it plans those shapes, runs them through the executor and counts the
tokens in the context. Prefill runs in chunks of n_batch tokens, decode one token at a time. `reserve()`
plans every shape a run will use and checks the plans before any weight is loaded; a shape met later (a
longer run than reserved) is planned and checked on arrival.

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

import functools
from dataclasses import dataclass

import numpy as np

from .. import caches
from ..contract import Device
from ..core.scheduler import Executor, Plan, Reservation, make_plan, reserve, reserve_together
from ..model.model import Model
from .context import Context, argmax_on_device, greedy_key, phase_name


@dataclass
class StepStats:
    tokens: int = 0
    seconds: float = 0.0             # compiling that a cache keeps for later runs left out (compile_seconds)
    compile_seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class Session:
    """Steps over a Context: each step shape planned once, checked with its partners' plans, then run."""

    def __init__(self, model: Model, devices: list[Device], n_ctx: int = 2048, n_batch: int = 512, progress=None,
                 strict: bool = False, kv_device: str | None = None, n_layers: int | None = None,
                 share_kv_with: "Session | None" = None, memory_caps: dict[str, int] | None = None,
                 share_model_with: "Session | None" = None, max_plans: int | None = None,
                 draft_of: "Session | None" = None, hidden: bool = False, check_values: bool = False,
                 verifier=None, out_rows: int = 1):
        draft_of = draft_of or share_kv_with
        shared = share_kv_with.context if share_kv_with is not None else None
        self.context = c = Context(model, devices, n_ctx, n_batch, kv_device, n_layers, memory_caps, shared,
                                   "draft" if draft_of is not None else None, hidden, out_rows)
        # the context's, read by callers and reports; none of them changes during the session
        self.model, self.devices, self.n_ctx, self.n_batch = c.model, c.devices, c.n_ctx, c.n_batch
        self.cache, self.fit, self.residence, self.budgets = c.cache, c.fit, c.residence, c.budgets
        self.progress, self.strict = progress, strict
        self.hidden_rows: np.ndarray | None = None    # with hidden: the rows the head read in the last step
        self.partners: list[Session] = []   # sessions of this process whose plans are checked with these
        self.borrowed: dict[int, object] = {}    # a draft's weights that are its target's, used in place
        self._unchecked: dict[tuple, Plan] = {}
        self.plans: dict[tuple, tuple[Plan, object]] = {}     # in order of last use
        self.max_plans = max_plans     # a server meets new prompt lengths all the time: keep those used last
        other, names = share_model_with, [d.name for d in self.devices]
        if other is not None and (other.model is not model or [d.name for d in other.devices] != names):
            raise ValueError("share_model_with needs a session of the same model on the same devices")
        # another session of the model (a server's parallel slot: a cache of our own) or a draft's target:
        # its weights and programs; check_values: every device's outputs must be finite (devices of other
        # distributions' always are); verifier: --verify's (core/scheduler/verify.py)
        lender = draft_of if draft_of is not None else other
        kv = share_kv_with.executor.caches if share_kv_with is not None else None
        self.executor = Executor(self.devices, model.weight_bytes, self.residence, kv,
                                 lender.executor if lender is not None else None, check_values, verifier)
        self.n_past, self.prefill, self.decode = 0, StepStats(), StepStats()

    # runtime/greedy.py's steps: the devices asked on first use only (a server's slots may never decode greedily)
    argmax_on_device = functools.cached_property(lambda self: argmax_on_device(self.devices, self.model.hp.n_vocab))

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

    # -- plans ----------------------------------------------------------------------------
    def reserve(self, n_prompt: int, n_predict: int, all_logits: bool = False, greedy: bool = False) -> Reservation:
        """Plan and check every shape the run will use (greedy: a run of greedy()); nothing is loaded or compiled."""
        return self.reserve_shapes(self.context.shapes_for(n_prompt, n_predict, all_logits,
                                                           greedy and self.argmax_on_device))

    def reserve_shapes(self, keys: list[tuple]) -> Reservation:
        """Plan and check these step shapes (shape keys) with those already kept; nothing is loaded."""
        if self.partners:
            return self.reserve_keys(keys)
        phases = {phase_name(k): self.plans[k][0] if k in self.plans else self.context.graph(k)[0] for k in keys}
        known = {phase_name(k): p for k, (p, _) in self.plans.items() if phase_name(k) not in phases}
        result = reserve({**known, **phases}, self.devices, self.residence, self.strict,
                         self.executor.programs_per_device(), self.fit)
        for k in keys:
            self._remember(k, self.plans.get(k) or (result.plans[phase_name(k)], self.context.graph(k)[1]))
        return result

    def make_plans(self, keys) -> dict[tuple, Plan]:
        """Plans of these step shapes (kept ones, or new ones), not yet checked or kept."""
        out = {}
        for k in dict.fromkeys(keys):
            if k not in self.plans and k not in self._unchecked:
                self._unchecked[k] = make_plan(self.context.graph(k)[0], self.devices, self.residence, self.fit)
            out[k] = self.plans[k][0] if k in self.plans else self._unchecked[k]
        return out

    def reserve_keys(self, keys, partner_keys: dict | None = None) -> Reservation:
        """Plan these shapes (and partner_keys: {partner session: its shapes}) and check them with every plan
        this session and its partners keep, as the budgets of one process; keep them when the check passes."""
        new = {self: self.make_plans(keys), **{o: o.make_plans(k) for o, k in (partner_keys or {}).items()}}
        groups, devices = [], {}
        for s in [self, *self.partners]:
            plans = {k: p for k, (p, _) in s.plans.items()}
            plans.update(new.get(s, {}))
            groups.append(({s.context.phase_name(k): p for k, p in plans.items()}, s.residence))
            devices.update({d.name: d for d in s.devices})
        result = reserve_together(groups, list(devices.values()), self.strict, self.executor.programs_per_device())
        for s, plans in new.items():
            for k, p in plans.items():
                s._remember(k, s.plans.get(k) or (p, s.context.graph(k)[1]))
                s._unchecked.pop(k, None)
        return result

    def plan(self, n_tokens: int, n_past: int = 0, n_out: int | None = 1, greedy: bool = False) -> tuple[Plan, object]:
        if n_tokens < 1:
            raise ValueError(f"a step needs at least one token, got {n_tokens}")
        key = self.context.shape_key(n_tokens, n_past, n_out)
        return self.plan_key(greedy_key(key) if greedy and self.argmax_on_device else key)

    def plan_key(self, key: tuple) -> tuple[Plan, object]:
        """The plan of a step shape (planned and checked on first use) and its input leaves, its programs
        loaded and compiled."""
        if key not in self.plans:
            self.reserve_shapes([key])       # with the partners' plans where there are partners
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
            self.context.graphs.pop(old, None)
            self.executor.forget(self.plans.pop(old)[0])

    # -- running --------------------------------------------------------------------------
    def eval(self, tokens: list[int], all_logits: bool = False, prompt: bool | None = None) -> np.ndarray:
        """Append tokens to the context; return logits of the last token, or of every token.
        ``prompt``: count the tokens as prefill (default: when there is more than one), so that a
        one-token prompt is reported as the prefill it is."""
        tokens = self.context.check_tokens(tokens, self.n_past)
        out = []
        for start in range(0, len(tokens), self.n_batch):
            out.append(self.step(tokens[start:start + self.n_batch], all_logits,
                                 len(tokens) > 1 if prompt is None else prompt))
        return np.concatenate(out) if all_logits else out[-1][-1]

    def step(self, chunk: list[int], all_logits: bool, prompt: bool, greedy: bool = False) -> np.ndarray:
        """One step of at most n_batch tokens: the logits of its last token (or of every token); greedy: its
        ARGMAX instead (runtime/greedy.py), where argmax_on_device."""
        clock = caches.Stopwatch()
        n = len(chunk)
        plan, inp = self.plan(n, self.n_past, None if all_logits else 1, greedy)
        values = self.context.step_values(inp, chunk, self.n_past)
        outputs = self.executor.run(plan, values)
        logits = outputs[0][:n] if inp.out_ids is None else outputs[0]
        if self.context.hidden:
            self.hidden_rows = outputs[1][:n] if inp.out_ids is None else outputs[1]
        self.n_past += n
        stats = self.prefill if prompt else self.decode
        stats.tokens += n
        stats.seconds += clock.seconds
        stats.compile_seconds += clock.filled
        return logits


