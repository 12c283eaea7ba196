"""Running requests: one compute thread that every step goes through, the scheduler that joins the
requests of a model into batched steps, and one request's generation.

Why one thread: a plugin does not declare that its programs or its device may be driven from two
threads at once, and a model's sequences share its compiled programs and its cache. A request's next
piece is asked for on that thread; the scheduler then runs one step holding the decode row of every
active request of the model and chunks of the prompts of those that joined (at most --batch tokens a
step), and keeps each request's piece until that request asks for it (continuous batching, as
llama-server's slots). Requests join and leave between steps; the cells of one that leaves (finished,
or its client gone) are freed before the next step.

A model that cannot run batched steps (runtime/batch.py's refusals: recurrent state, static shapes) is
served by one session per request instead, whose steps take turns on the thread.

With ``--draft ngram[:N]`` (ServeDraft) a decoding request's part of a step is its last token and the tokens
prompt lookup proposes after it, with the logits of every row; the drafts the target agrees with are kept
(runtime/speculative.py's acceptance, greedy or sampled), the cells of the others dropped. A request with a
grammar or log-probabilities decodes a token a step (its sampler's state follows every token).
"""

from __future__ import annotations

import asyncio
import codecs
import threading
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..contract import Device
from ..core.scheduler import Plan
from ..runtime.batch import Batch, Part
from ..runtime.generate import FINISH_LENGTH, FINISH_STOP, Piece, generate
from ..runtime.lookup import lookup
from ..runtime.prefix import PrefixCache, common_prefix, least_shared
from ..runtime.sampling import Observer, Sampler, SamplingParams, TokenMask
from ..runtime.session import Session
from ..runtime.speculative import Adaptive, accept_greedy, accept_sampled
from .pool import Slot
from .stops import StopFilter


def device_label(d: Device) -> str:
    return d.name + (f" (EMULATION of {d.emulation})" if d.emulation else "")


def devices_of(plans: list[Plan], devices: list[Device]) -> list[str]:
    """The devices that compute some node of these plans, in the --backends order."""
    used = {name for plan in plans for name, use in plan.per_device().items() if use["nodes"]}
    return [device_label(d) for d in devices if d.name in used]


class Compute:
    def __init__(self):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="framework-compute")

    async def call(self, fn: Callable[..., Any], *args, when_abandoned: Callable[[], None] | None = None) -> Any:
        """Run fn on the compute thread. When the awaiting task is cancelled (the client went away),
        a step already running cannot be stopped midway: ``when_abandoned`` runs once it has returned,
        so a session is never lent out while a step still uses it."""
        loop = asyncio.get_running_loop()
        future = self._pool.submit(fn, *args)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if when_abandoned is not None:
                future.add_done_callback(lambda _: loop.call_soon_threadsafe(when_abandoned))
            raise

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@dataclass
class Job:
    """What a request asks for, checked: its prompt tokens, length, sampling and stop strings."""
    ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    stops: list[str]
    cache_prompt: bool = True        # llama-server's field: reuse the cells of a cached prefix, and keep this one
    mask: TokenMask | None = None          # structured output: the grammar's tokens only (serve/structured.py)
    observe: Observer | None = None        # told of every step's logits and token (logprobs)


AHEAD = 4        # pieces a request may have waiting, computed before it asked (its client reads slower)


@dataclass(frozen=True)
class ServeDraft:
    """serve --draft ngram[:N]: every request drafts by prompt lookup, up to n_draft tokens a step."""
    spec: str
    n_match: int
    n_draft: int


class Scheduler:
    """A model's active requests, each a sequence of one Batch, stepped together on the compute thread."""

    def __init__(self, session: Session, devices: list[str], cache_cells: int | None = None,
                 draft: ServeDraft | None = None):
        self.batch, self.session, self.devices, self.draft = Batch(session), session, devices, draft
        self.prefix = PrefixCache(self.batch.cells, cache_cells)
        self.active: list[Run] = []
        self.leaving: list[Run] = []          # told from any thread, freed under the lock
        self._lock = threading.Lock()         # held while the cells change: a step, a join, a tidy
        self._seq = 0
        self.steps, self.widest = 0, 0        # batched steps run, and the most requests one step held
        self.in_flight = Counter(hits=0, tokens=0)   # requests that took an active request's prompt cells, tokens

    def state(self) -> dict:
        return {"steps": self.steps, "widest": self.widest, "active": len(self.active),
                "prefix_cache": {"hits": self.prefix.hits, "tokens": self.prefix.reused,
                                 "in_flight": dict(self.in_flight), "cells": self.prefix.held(),
                                 "budget": self.prefix.budget}}

    def join(self, run: "Run") -> tuple[int, int]:
        """A new request's sequence id, and how many of its prompt tokens a cached prefix already holds. Where
        an active request's prompt starts with more of them, this one takes that request's cells for them
        instead: now if it has fed them, else once it has (``run.awaits``; nothing computed twice)."""
        with self._lock:
            self._tidy()
            self._seq += 1
            reused = self.prefix.reuse(self._seq, run.job.ids) if run.job.cache_prompt else 0
            run.awaits = self._sharer(run.job.ids, reused) if run.job.cache_prompt else None
            self.active.append(run)
            if run.awaits is not None and self._fed(run.awaits):
                reused = self._share(self._seq, run.awaits)
                run.awaits = None
        return self._seq, reused

    def _sharer(self, ids: list[int], reused: int) -> tuple["Run", int] | None:
        """(the active request whose prompt shares the longest prefix with ids, its length) where that is more
        than ``reused`` and at least a block or all the prompt but its last token (whose logits the request
        needs): a short prompt sent by several clients at once is computed once too."""
        best, most = None, max(reused, least_shared(len(ids), self.prefix.block) - 1)
        for other in self.active:
            n = common_prefix(other.job.ids, ids, len(ids) - 1)
            if n > most:
                best, most = other, n
        return (best, most) if best is not None else None

    def _fed(self, awaits: tuple["Run", int]) -> bool:
        other, n = awaits
        return self.batch.n_past(other.seq) >= n

    def _share(self, seq: int, awaits: tuple["Run", int]) -> int:
        other, n = awaits
        self.batch.cells.share(other.seq, seq, n)
        self.in_flight.update(hits=1, tokens=n)
        return n

    def _caught_up(self, run: "Run") -> bool:
        """Whether a request may step: one awaiting another's prompt takes its cells once they are fed; if
        that request left first, the prefix cache may hold them (it kept them), else this one computes them."""
        if run.awaits is None:
            return True
        other, _ = run.awaits
        if other in self.active and not self._fed(run.awaits):
            return False
        n = self._share(run.seq, run.awaits) if other in self.active else self.prefix.reuse(run.seq, run.job.ids)
        if n:                                 # (reuse finding none leaves the cells the request had)
            run.cached_tokens, run.pending = n, run.tokens[n:]
        run.awaits = None
        return True

    def leave(self, run: "Run") -> None:
        """A request ends (finished, or its client gone): its cells are freed now, or, while a step runs,
        as soon as it returns."""
        self.leaving.append(run)
        if self._lock.acquire(blocking=False):
            try:
                self._tidy()
            finally:
                self._lock.release()

    def _tidy(self) -> None:
        while self.leaving:
            run = self.leaving.pop()
            if run in self.active:
                self.active.remove(run)
                if run.job.cache_prompt:
                    self.prefix.retire(run.seq, run.tokens)
                else:
                    self.batch.free(run.seq)

    def advance(self, run: "Run") -> None:
        """Step every active request together until this one has a piece."""
        with self._lock:
            self._tidy()
            while not run.pieces:
                self._step()
            self._tidy()                      # those that left while the steps ran

    def _step(self) -> None:
        ready = [r for r in self.active if r.generating and len(r.pieces) < AHEAD and self._caught_up(r)]
        decoding = [r for r in ready if not r.pending]
        budget = self.session.n_batch - len(decoding)
        parts, who = [], []
        drafts: dict[int, list[int]] = {}
        for r in decoding if self.draft else ():      # drafts after the decode rows, before prompt chunks
            drafts[id(r)] = r.propose(self.draft, budget)
            budget -= len(drafts[id(r)])
        for r in ready:                       # decode rows first, then prompt chunks while the batch has room
            if r.pending and budget > 0:
                take = r.pending[:budget]
                budget -= len(take)
                parts.append(Part(r.seq, take, logits=len(take) == len(r.pending)))
            elif not r.pending:
                more = drafts.get(id(r), [])
                parts.append(Part(r.seq, [r.last] + more, all_logits=bool(more)))
            else:
                continue
            who.append(r)
        self.prefix.evict(sum(len(p.tokens) for p in parts))      # cells for the step, from kept prefixes
        results = self.batch.step(parts)
        self.steps, self.widest = self.steps + 1, max(self.widest, len(parts))
        for r, part, logits in zip(who, parts, results):
            r.took(part, logits)


class Run:
    """One request's generation. ``start`` and ``step`` run on the compute thread. ``slot`` is what the pool
    lends: a Slot of a model's Scheduler, or a Session of its own (a model that cannot batch)."""

    def __init__(self, slot, job: Job):
        self.slot, self.job = slot, job
        if isinstance(slot, Slot):
            slot.run = self
        self.filter = StopFilter(job.stops)
        self.n_out = 0
        self.finish: str | None = None     # "stop" or "length" once generation has ended
        self.cached_tokens = 0             # prompt tokens whose cells were reused, not computed
        self.awaits: tuple[Run, int] | None = None   # an active request whose first n prompt tokens this one takes
        self.drafted = self.accepted = 0   # serve --draft: tokens proposed, and those the target agreed with
        self.adaptive = Adaptive()
        self.pieces: deque = deque()       # Piece, then the finish reason once generation ends
        self._gen = None

    def start(self) -> list[str]:
        """Join the model's scheduler (or plan a session of its own); say which devices compute it."""
        if isinstance(self.slot, Session):
            return self._start_alone(self.slot)
        sched, job = self.slot.scheduler, self.job
        self.seq, self.cached_tokens = sched.join(self)
        self.tokens = list(job.ids)              # the prompt and every token sampled: what its cells hold
        self.pending, self.last, self.produced = self.tokens[self.cached_tokens:], 0, 0
        self.generating = True
        self.sampler = Sampler(job.sampling, job.mask, job.observe)
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return sched.devices

    def _start_alone(self, s: Session) -> list[str]:
        job = self.job
        s.reset()
        keys = s.context.shapes_for(len(job.ids), job.max_tokens)
        if any(k not in s.plans for k in keys):
            s.reserve(len(job.ids), job.max_tokens)
        tok = s.model.tokenizer
        self._gen = generate(s, job.ids, job.max_tokens, Sampler(job.sampling, job.mask, job.observe), tok.eog_ids)
        return devices_of([s.plans[k][0] for k in keys], s.devices)

    @property
    def drafting(self) -> bool:
        """Whether the server drafts for this request's model (serve --draft): its usage reports the drafts."""
        return isinstance(self.slot, Slot) and self.slot.scheduler.draft is not None

    def propose(self, draft: ServeDraft, budget: int) -> list[int]:
        """Prompt lookup's tokens after the last one, as many as the step's room, the request's length and its
        context allow; none for a request whose sampler follows every token (a grammar, log-probabilities)."""
        if self.job.mask is not None or self.job.observe is not None:
            return []
        n = min(draft.n_draft, budget, self.job.max_tokens - self.produced - 1, self.slot.n_ctx - len(self.tokens))
        if n < 1 or not self.adaptive.allows():
            return []
        return lookup(self.tokens, draft.n_match, n)

    def took(self, part: Part, logits) -> None:
        """A step ran this request's part: the prompt tokens it fed, and a new piece where it had logits."""
        if self.pending:
            self.pending = self.pending[len(part.tokens):]
        if logits is None:
            return
        if part.all_logits:
            return self._verified(part.tokens[1:], logits)
        if self.job.max_tokens == 0:
            return self._end(FINISH_LENGTH)
        self._add(self.sampler(logits))

    def _verified(self, drafts: list[int], rows) -> None:
        """The target's rows after the last token and each draft: keep the drafts it agrees with and its own
        next token; the cells of the rest are dropped."""
        s = self.sampler
        if s.greedy:
            n_ok, new = accept_greedy(rows, drafts)
        else:
            n_ok, new = accept_sampled([s.distribution(r) for r in rows], [None] * len(drafts), drafts, s.rng)
        batch = self.slot.scheduler.batch
        batch.cells.keep(self.seq, batch.n_past(self.seq) - len(drafts) + n_ok)
        self.drafted, self.accepted = self.drafted + len(drafts), self.accepted + n_ok
        self.adaptive.update(len(drafts), n_ok)
        for token in drafts[:n_ok] + [new]:
            if not self.generating or not self._add(token):
                return

    def _add(self, token: int) -> bool:
        """A sampled token: a piece, or the end; whether generation goes on."""
        tok = self.slot.scheduler.session.model.tokenizer
        if token in tok.eog_ids:
            self._end(FINISH_STOP)
            return False
        self.produced += 1
        self.tokens.append(token)
        self.pieces.append(Piece(token, self.decoder.decode(tok.token_bytes(token))))
        if self.produced == self.job.max_tokens or len(self.job.ids) + self.produced - 1 >= self.slot.n_ctx:
            self._end(FINISH_LENGTH)       # the last token's logits are not needed
            return False
        self.last = token
        return True

    def _end(self, why: str) -> None:
        self.generating = False
        self.pieces.append(why)

    def _next(self) -> Piece | str:
        if self._gen is not None:
            try:
                return next(self._gen)
            except StopIteration as end:
                return end.value
        if not self.pieces:
            self.slot.scheduler.advance(self)
        return self.pieces.popleft()

    def step(self) -> str:
        """One token (the first call also prefills): the text now safe to send, maybe ""."""
        item = self._next()
        if isinstance(item, str):
            self._stop(item)
            return self.filter.flush()
        self.n_out += 1
        text = self.filter.feed(item.text)
        if self.filter.stopped:
            self._stop(FINISH_STOP)
        return text

    def _stop(self, why: str) -> None:
        self.finish = why
        if self._gen is not None:
            self._gen.close()
        else:
            self.slot.scheduler.leave(self)
