"""Running requests: one compute thread that every step goes through, and one request's generation.

Why one thread: a plugin does not declare that its programs or its device may be driven from two
threads at once, and the sessions of one model share their compiled programs. So steps (a prefill
chunk, a decode token) of concurrent requests interleave on one thread in arrival order; each
request's next step is queued when its previous one returns, which makes the interleaving fair.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ..runtime.generate import FINISH_STOP, generate
from ..runtime.sampling import Observer, Sampler, SamplingParams, TokenMask
from ..runtime.session import Session
from .models import devices_of
from .stops import StopFilter


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
    mask: TokenMask | None = None          # structured output: the grammar's tokens only (serve/structured.py)
    observe: Observer | None = None        # told of every step's logits and token (logprobs)


class Run:
    """One request's generation on a session it holds. ``start`` and ``step`` run on the compute thread."""

    def __init__(self, session: Session, job: Job):
        self.session, self.job = session, job
        self.filter = StopFilter(job.stops)
        self.n_out = 0
        self.finish: str | None = None     # "stop" or "length" once generation has ended
        self._gen = None

    def start(self) -> list[str]:
        """Plan the shapes this request uses (checking any new one) and say which devices compute them."""
        s, job = self.session, self.job
        s.reset()
        keys = s.context.shapes_for(len(job.ids), job.max_tokens)
        if any(k not in s.plans for k in keys):
            s.reserve(len(job.ids), job.max_tokens)
        tok = s.model.tokenizer
        self._gen = generate(s, job.ids, job.max_tokens, Sampler(job.sampling, job.mask, job.observe), tok.eog_ids)
        return devices_of([s.plans[k][0] for k in keys], s.devices)

    def step(self) -> str:
        """One token (the first call also prefills): the text now safe to send, maybe ""."""
        try:
            piece = next(self._gen)
        except StopIteration as end:
            self.finish = end.value
            return self.filter.flush()
        self.n_out += 1
        text = self.filter.feed(piece.text)
        if self.filter.stopped:
            self._gen.close()
            self.finish = FINISH_STOP
        return text
