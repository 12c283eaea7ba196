"""A model's parallel slots (places in its batched steps, or sessions of their own where the model cannot
batch), and the bounded queue of requests waiting for one."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

from ..runtime.session import Session


class Slot:
    """A place for one request among a model's --parallel: the scheduler its sequence joins, the most tokens
    a request may hold (--ctx), and the run it holds now."""

    def __init__(self, scheduler, n_ctx: int):
        self.scheduler, self.n_ctx, self.run = scheduler, n_ctx, None


class QueueFull(Exception):
    def __init__(self, model: str, sessions: int, queued: int, retry_after: int):
        super().__init__(f"model '{model}' is busy: all {sessions} sessions are generating and {queued} requests "
                         f"are waiting, the most the queue holds; retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass
class Counts:
    answered: int = 0
    cancelled: int = 0                 # the client went away; its generation was stopped
    refused: dict[int, int] = field(default_factory=dict)     # status code -> requests

    def refuse(self, status: int) -> None:
        self.refused[status] = self.refused.get(status, 0) + 1


class SessionPool:
    """Sessions are lent one per request. When all are busy a request waits in a queue of at most
    ``max_queue``; beyond that it is refused with the seconds after which a slot is likely free."""

    def __init__(self, model_id: str, sessions: list[Session | Slot], max_queue: int):
        self.model_id, self.sessions, self.max_queue = model_id, sessions, max_queue
        self._free: asyncio.Queue[Session] = asyncio.Queue()
        for s in sessions:
            self._free.put_nowait(s)
        self.waiting = 0
        self.counts = Counts()
        self._seconds = 1.0            # a running mean of how long a request holds a session

    @property
    def busy(self) -> int:
        return len(self.sessions) - self._free.qsize()

    async def acquire(self) -> Session:
        if self._free.empty() and self.waiting >= self.max_queue:
            raise QueueFull(self.model_id, len(self.sessions), self.waiting, self.retry_after())
        self.waiting += 1
        try:
            return await self._free.get()
        finally:
            self.waiting -= 1

    def release(self, session: Session | Slot, seconds: float | None = None) -> None:
        """Take a slot back (its run leaves the scheduler: its cells are freed before the next step)."""
        if isinstance(session, Slot) and session.run is not None:
            session.scheduler.leave(session.run)
            session.run = None
        if seconds is not None:
            self._seconds = 0.8 * self._seconds + 0.2 * seconds
        self._free.put_nowait(session)

    def retry_after(self) -> int:
        return max(1, math.ceil(self._seconds * (self.waiting + 1) / len(self.sessions)))

    def state(self) -> dict:
        return {"sessions": len(self.sessions), "busy": self.busy, "queued": self.waiting,
                "max_queue": self.max_queue, "answered": self.counts.answered, "cancelled": self.counts.cancelled,
                "refused": {str(k): v for k, v in sorted(self.counts.refused.items())}, **self._batching()}

    def _batching(self) -> dict:
        """A batched model's steps: how many ran, and the most requests one of them held."""
        first = self.sessions[0]
        return {"batched": first.scheduler.state()} if isinstance(first, Slot) else {}
