"""Steps of several sequences at once over one cache (llama.cpp's llama_batch on its unified cache).

A step's rows are the parts of several sequences: a decode token of one, a chunk of another's prompt.
Each row carries its sequence and position; the cells (runtime/cells.py) give the cache row its K and V
are written to and the mask of what it sees. Only the rows whose logits are wanted (a part's last token)
go through the output head. One graph and one plan per shape key (tokens, KV rows padded, logits rows),
as a single sequence's steps; decode reads each weight once for every sequence of the step. Where a device
compiles per shape (limits.padded_rows), the rows come padded to a few sizes (context.padded_rows).

Refused by name: architectures that keep recurrent state per sequence (their state is one tensor, not
rows of cells), and devices that demand static shapes (a batch's row count changes every step).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import caches
from .cells import Cells
from .session import Session, StepStats


class BatchError(ValueError):
    """Several sequences cannot be stepped together as asked."""


@dataclass
class Part:
    """One sequence's rows in a step: its next tokens (a decode token, or a chunk of its prompt)."""
    seq: int
    tokens: list[int]
    logits: bool = True          # return the logits of the part's last token
    all_logits: bool = False     # return the logits of every token of the part (perplexity's windows)


def batching_refusal(model, devices: list) -> str | None:
    """Why this model on these devices cannot run steps of several sequences, or None."""
    if model.arch.recurrent:
        return (f"{model.name} ({model.arch.name}) keeps recurrent state per sequence, which steps of several "
                f"sequences over one cache cannot hold apart")
    static = [d.name for d in devices if d.limits.static_shapes]
    if static:
        return (f"{', '.join(static)} demands static shapes (limits.static_shapes), and a step of several "
                f"sequences has as many rows as they bring")
    return None


class Batch:
    """The sequences stepped together over one session's cache: their cells, and one step at a time."""

    def __init__(self, session: Session):
        why = batching_refusal(session.model, session.devices)
        if why:
            raise BatchError(f"{why}; run one sequence per session (serve: --parallel 1, or each request a "
                             f"session of its own)")
        if session.context.hidden or session.context.role:
            raise BatchError("a draft's steps (hidden state, a shared cache) run one sequence at a time")
        self.session = session
        self.cells = Cells(session.n_ctx)
        self.stats = StepStats()            # every batched step: tokens of all rows, seconds
        self.steps = 0

    def n_past(self, seq: int) -> int:
        return self.cells.n_past(seq)

    def free(self, seq: int) -> None:
        self.cells.free(seq)

    def step(self, parts: list[Part]) -> list[np.ndarray | None]:
        """Run the parts as one step; return each part's last-token logits (None where not asked; all its
        tokens' rows, for a part with all_logits)."""
        self._check(parts)
        clock = caches.Stopwatch()
        taken: list[tuple[int, np.ndarray]] = []
        try:
            values, key, wanted = self._rows(parts, taken)
            plan, inp = self.session.plan_key(key)
            outputs = self.session.executor.run(plan, self._leaves(inp, values))
        except BaseException:
            for seq, cells in taken:             # a refused or failed step leaves the cells as they were
                self.cells.release(seq, cells)
            raise
        logits = outputs[0]
        self.steps += 1
        self.stats.tokens += sum(len(p.tokens) for p in parts)
        self.stats.seconds += clock.seconds
        self.stats.compile_seconds += clock.filled
        return [logits[wanted[i]] if i in wanted else None for i in range(len(parts))]

    def _check(self, parts: list[Part]) -> None:
        if not parts:
            raise BatchError("a step needs at least one part")
        seqs = [p.seq for p in parts]
        if len(set(seqs)) != len(seqs):
            raise BatchError(f"sequences {sorted({s for s in seqs if seqs.count(s) > 1})} appear twice in one "
                             f"step; a sequence brings one part (its tokens in order) per step")
        total = sum(len(p.tokens) for p in parts)
        if total > self.session.n_batch:
            raise BatchError(f"a step of {total} tokens exceeds the batch size {self.session.n_batch} (--batch); "
                             f"chunk the prompts")

    def _rows(self, parts: list[Part], taken: list) -> tuple[dict, tuple, dict]:
        """Allocate each part's cells; return the rows' values, the step's shape key and, for each part
        whose logits are wanted, its row among the logits."""
        ctx = self.session.context
        tokens, seqs, pos, rows, out_ids, wanted = [], [], [], [], [], {}
        for i, part in enumerate(parts):
            start = self.cells.n_past(part.seq)
            ids = ctx.check_tokens(part.tokens, start)
            cells = self.cells.allocate(part.seq, len(ids))
            taken.append((part.seq, cells))
            tokens += ids
            seqs += [part.seq] * len(ids)
            pos += range(start, start + len(ids))
            rows += cells.tolist()
            if part.all_logits:
                wanted[i] = slice(len(out_ids), len(out_ids) + len(ids))
                out_ids += range(len(tokens) - len(ids), len(tokens))
            elif part.logits:
                wanted[i] = len(out_ids)
                out_ids.append(len(tokens) - 1)
        out_ids = out_ids or [len(tokens) - 1]
        key = ctx.rows_key(len(tokens), self.cells.high(), len(out_ids))
        pad = key[0] - len(tokens)      # a device that compiles per shape: rows padded (context.padded_rows)
        if pad:         # scratch cache rows after the real ones; each sees what the last real row sees
            tokens, seqs, pos = tokens + [0] * pad, seqs + seqs[-1:] * pad, pos + pos[-1:] * pad
            rows += range(ctx.n_ctx, ctx.n_ctx + pad)
        out_ids += out_ids[-1:] * (key[2] - len(out_ids))
        values = {"tokens": np.array(tokens, np.int32), "seqs": np.array(seqs), "pos": np.array(pos, np.int32),
                  "rows": np.array(rows, np.int32), "out_ids": np.array(out_ids, np.int32)}
        return values, key, wanted

    def _leaves(self, inp, v: dict) -> dict[int, np.ndarray]:
        n_kv = inp.mask.shape[1]
        leaves = {id(inp.tokens): v["tokens"], id(inp.pos): v["pos"], id(inp.kv_rows): v["rows"],
                  id(inp.mask): self.cells.mask(v["seqs"], v["pos"], n_kv)}
        if inp.mask_swa is not None:
            window = self.session.model.hp.sliding_window
            leaves[id(inp.mask_swa)] = self.cells.mask(v["seqs"], v["pos"], n_kv, window)
        if inp.out_ids is not None:
            leaves[id(inp.out_ids)] = v["out_ids"]
        if inp.extra:
            raise BatchError(f"{self.session.model.name} needs inputs of its own ({', '.join(inp.extra)}) that a "
                             f"step of several sequences does not fill")
        return leaves
