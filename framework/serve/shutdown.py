"""Stopping on SIGINT/SIGTERM without a client mistaking a cut answer for a whole one.

1. New requests are answered 503 `shutting_down` (the port stays open meanwhile, so a client learns
   why rather than meeting a refused connection).
2. Running requests get the grace period (--shutdown-timeout less a second) to finish.
3. Those still running are cut between two steps: a stream gets an `error` event and `[DONE]`, a
   whole answer a 503; a request still queued, a 503.
4. Once nothing runs (or a step has had CUT_WAIT seconds to return), the server is told to exit.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from .errors import ApiError

CUT_WAIT = 10.0     # seconds a step still running may take to return once requests are cut


class Drain:
    def __init__(self, grace: float):
        self.grace = grace
        self.signal: str | None = None     # the signal's name once one arrived
        self.cut = False                   # requests still running are to end now
        self.in_flight = 0                 # HTTP requests being answered (a stream until its last event)

    @property
    def stopping(self) -> bool:
        return self.signal is not None

    def refuse_new(self) -> None:
        if self.stopping:
            raise ApiError(503, f"the server is shutting down ({self.signal}); send the request again once it "
                           f"is back, or to another server", code="shutting_down", headers={"Connection": "close"})

    def cut_error(self, n_out: int) -> ApiError:
        return ApiError(503, f"the server is shutting down ({self.signal}): this answer was cut after {n_out} "
                        f"tokens, when the grace period (--shutdown-timeout) ran out", code="shutting_down")

    def begin(self, signal_name: str, then: Callable[[], None]) -> None:
        """Called from the signal handler, on the event loop's thread."""
        self.signal = signal_name
        loop = asyncio.get_running_loop()
        loop.call_soon_threadsafe(lambda: loop.create_task(self._run(then)))

    async def _run(self, then: Callable[[], None]) -> None:
        await self._idle(self.grace)
        self.cut = True
        await self._idle(CUT_WAIT)
        then()

    async def _idle(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while self.in_flight and time.monotonic() < end:
            await asyncio.sleep(0.05)


class InFlight:
    """Counts the HTTP requests being answered, for the drain to wait on."""

    def __init__(self, app, drain: Drain):
        self.app, self.drain = app, drain

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1
