"""Greedy decoding with each step queued before the token of the step before is read: the step's token is
taken on the device from that step's ARGMAX (queue_greedy), so the host's work for a step (its
inputs, the launch) runs while the device computes the step before, and the device does not wait for the
host between steps. Where the session cannot (a device does not declare Limits.queued_inputs, a verifier
compares every fragment, a model keeps recurrent state that cannot be rewound) the steps run one after
another through greedy(), which still takes the argmax on the device where the session's argmax_on_device
says so; the tokens are the same either way.

A step queued for a token the caller does not take (it stopped at a stop token) is dropped from the context
when the caller stops (Session.rewind): the cache row it wrote is past the context, which the mask hides."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from .. import caches
from ..core.scheduler.errors import DeviceRunError
from ..core.graph import Tensor
from ..core.scheduler.executor import Held
from .session import Session


def pipelined(session: Session) -> bool:
    return (session.argmax_on_device and all(d.limits.queued_inputs for d in session.devices)
            and session.executor.verifier is None and not session.model.arch.recurrent)


def greedy_tokens(session: Session, prompt_ids: list[int], n: int) -> Iterator[int]:
    """The n tokens greedy decoding gives after prompt_ids (the first from the prompt's last step); the
    session's prefill and decode statistics count the time the caller waited for each token."""
    if not pipelined(session):
        yield from _one_by_one(session, prompt_ids, n)
        return
    s = session
    ids = s.context.check_tokens(prompt_ids, s.n_past)
    last = _chunks_before_the_last(s, ids, True)
    clock = caches.Stopwatch()
    pending, queued = queue_greedy(s, ids[last:]), None
    try:
        for i in range(n):
            if i < n - 1 and s.n_past < s.n_ctx:      # the next step, on this one's token, before it is read
                queued = queue_greedy(s, pending)
            token = checked_index(s, s.executor.read(pending), lambda: pending.tensor)
            stats = s.prefill if i == 0 else s.decode
            stats.tokens += len(ids) - last if i == 0 else 1
            stats.seconds += clock.seconds
            stats.compile_seconds += clock.filled
            yield token
            clock = caches.Stopwatch()          # the caller's own time between tokens is not the engine's
            pending, queued = queued, None
            if pending is None:
                return
    finally:
        if queued is not None:                  # queued on a token the caller did not take
            s.rewind(s.n_past - 1)


def _one_by_one(session: Session, prompt_ids: list[int], n: int) -> Iterator[int]:
    token = greedy(session, prompt_ids, prompt=True)
    for i in range(n):
        yield token
        if i == n - 1 or session.n_past >= session.n_ctx:
            return
        token = greedy(session, [token])


def greedy(session: Session, tokens: list[int], prompt: bool | None = None) -> int:
    """Append tokens to the context; return the argmax of the last token's logits: where the logits are made
    (argmax_on_device: one index comes back instead of n_vocab logits), else here from eval's."""
    s = session
    if not s.argmax_on_device:
        return int(np.argmax(s.eval(tokens, prompt=prompt)))
    tokens = s.context.check_tokens(tokens, s.n_past)
    prompt = len(tokens) > 1 if prompt is None else prompt
    last, n_past = _chunks_before_the_last(s, tokens, prompt), s.n_past
    chunk = tokens[last:]
    return checked_index(s, s.step(chunk, False, prompt, greedy=True),
                         lambda: s.plan(len(chunk), n_past, 1, greedy=True)[0].graph.outputs[0])


def _chunks_before_the_last(s: Session, tokens: list[int], prompt: bool) -> int:
    """Step the chunks of n_batch tokens before the last one (no token wanted from them; Session.step times
    them); return where the last one starts."""
    last = (len(tokens) - 1) // s.n_batch * s.n_batch
    for start in range(0, last, s.n_batch):
        s.step(tokens[start:start + s.n_batch], False, prompt)
    return last


def queue_greedy(session: Session, tokens: list[int] | Held) -> Held:
    """A greedy step (argmax_on_device) given to the devices without waiting: tokens (at most n_batch),
    or one token Held on a device (an earlier step's ARGMAX, not read yet); returns its ARGMAX Held, which
    executor.read reads. The tokens count in the context; greedy_tokens times them."""
    s = session
    chunk = s.context.check_tokens([0] if isinstance(tokens, Held) else tokens, s.n_past)
    if len(chunk) > s.n_batch:
        raise ValueError(f"queue_greedy takes at most n_batch ({s.n_batch}) tokens, got {len(chunk)}")
    plan, inp = s.plan(len(chunk), s.n_past, 1, greedy=True)
    values = s.context.step_values(inp, chunk, s.n_past)
    if isinstance(tokens, Held):
        values[id(inp.tokens)] = tokens
    out = s.executor.run(plan, values, wait=False)[0]
    s.n_past += len(chunk)
    return out


def checked_index(session: Session, values: np.ndarray, node: Callable[[], Tensor | None]) -> int:
    """The last row's index from a greedy step's ARGMAX, whose rows are -1 where the logits were not finite (an error
    for any row: a verification step's too); node: the ARGMAX node, asked for on that error only."""
    values = values.reshape(-1)
    if (values < 0).any():
        arg = node()
        what = f"node {arg.describe()}: the logits {arg.src[0].describe()}" if arg is not None else "the logits"
        raise DeviceRunError(f"{what} of a greedy step hold values that are not finite (ARGMAX gave -1 on "
                             f"{', '.join(d.name for d in session.devices)})\n  fix: --check-values checks every "
                             f"device's outputs where they are made, naming the node that made them",
                             node=arg.name if arg is not None else None)
    return int(values[-1])

