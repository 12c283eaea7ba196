"""The models a server holds: resolved from -m, loaded, their sessions reserved together before the port
opens, then warmed (weights loaded, programs compiled) while /health answers 503."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..contract import Device
from ..core.scheduler import check_together
from ..core.scheduler.verify import Verifier
from ..model.chat import ChatTemplateError, chat_template_for
from ..model.default import MODELS
from ..model.model import Model
from ..runtime.batch import batching_refusal
from ..runtime.context import KV_PAD, padded_rows
from ..runtime.session import Session
from ..runtime.lookup import is_lookup, parse_match
from ..runtime.speculative import DEFAULT_DRAFT_N, SpeculationError, exact_rows_check
from .embeddings import embedding_session, without_weights
from .engine import Scheduler, ServeDraft, devices_of
from .pool import SessionPool, Slot


@dataclass
class ServedModel:
    id: str
    path: Path
    sha256: str
    model: Model
    pool: SessionPool
    devices: list[str]                 # the devices its reserved plans run on, EMULATION said where so
    template: str | None               # its chat template (None: /v1/chat/completions refuses it, saying why)
    template_note: str                 # where the template came from, or why there is none
    created: int
    embedder: Session | None = None    # with --embeddings: the session /v1/embeddings runs on (embeddings.py)

    def describe(self) -> dict:
        return {"id": self.id, "object": "model", "created": self.created, "owned_by": "framework",
                "file": self.path.name, "sha256": self.sha256, "devices": self.devices,
                "context_length": self.pool.sessions[0].n_ctx, "parallel": len(self.pool.sessions),
                "chat_template": self.template_note, "embeddings": self.embedder is not None}

    def sessions(self) -> list[Session]:
        """Every session of the model, once each: its batched one or its per-request ones, and its embedder."""
        found = [x.scheduler.session if isinstance(x, Slot) else x for x in self.pool.sessions]
        found += [self.embedder] if self.embedder is not None else []
        return list({id(s): s for s in found}.values())


def resolve(arg: str) -> tuple[str, Path]:
    """A model id and its file, as every command reads -m: a GGUF file (the id is its name without .gguf),
    or a packaged model's short name (the id is the name)."""
    path = Path(arg)
    if path.exists():
        return path.name.removesuffix(".gguf"), path
    if arg in MODELS:
        return arg, MODELS[arg]()
    raise FileNotFoundError(f"model '{arg}' is neither a GGUF file nor a packaged model's short name "
                            f"({', '.join(MODELS)})")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def max_plans(n_ctx: int) -> int:
    """Shapes a session keeps planned: every decode length twice over, and the prompt lengths met last."""
    return 2 * (n_ctx // 256 + 1) + 48


def reserve_session(session: Session):
    """Every shape a request can use: a full prefill chunk, and decode at every KV length of the context."""
    session.reserve(min(session.n_batch, session.n_ctx - 1), 1)
    return session.reserve(1, session.n_ctx - 1)


def batched_shapes(session: Session, parallel: int) -> list[tuple]:
    """Every shape a batched step can take: decode rows of 1 to `parallel` requests at every KV length, and
    the largest step (a full --batch of rows: decode rows and a prompt chunk) over the whole cache. Where a
    device compiles per shape (its rows padded to a few sizes), also every padded size of a step that joins a
    prompt to the decode rows, at the first two KV lengths: the start compiles their models, which then serve
    every KV length (openvino's KV-length families), where a request would otherwise wait for a compile."""
    ctx, n = session.context, min(session.n_batch, session.n_ctx)
    kvs = list(range(KV_PAD, session.n_ctx + KV_PAD, KV_PAD))
    keys = [ctx.rows_key(n, session.n_ctx, min(parallel, n))]
    keys += [ctx.rows_key(k, kv, k) for k in range(1, parallel + 1) for kv in kvs]
    if ctx.padded:
        sizes = sorted({padded_rows(k, n) for k in range(parallel + 1, n + 1)})
        keys += [ctx.rows_key(t, kv, min(t, parallel)) for t in sizes for kv in kvs[:2]]
    return list(dict.fromkeys(keys))


def serve_draft(spec: str | None, n_draft: int, inexact: bool) -> ServeDraft | None:
    """serve's --draft SPEC as a ServeDraft, or None; ValueError naming what serve does not draft with."""
    if not spec:
        if n_draft != DEFAULT_DRAFT_N or inexact:
            raise ValueError("--draft-n and --draft-inexact need --draft ngram[:N]")
        return None
    if not is_lookup(spec):
        raise ValueError(f"--draft {spec}: serve drafts by prompt lookup only, ngram[:N]; a draft model or layers:K "
                         f"runs in `framework run`")
    return ServeDraft(spec, parse_match(spec), n_draft)


def verification_shapes(session: Session, draft: ServeDraft) -> list[tuple]:
    """serve --draft: a request's step of its last token and 1 to n_draft drafts, the logits of every row, at every
    KV length (several requests' rows together are planned when first met)."""
    ctx, rows = session.context, min(draft.n_draft + 1, session.n_batch)
    return [ctx.rows_key(k, kv, k) for k in range(2, rows + 1) for kv in range(KV_PAD, session.n_ctx + KV_PAD, KV_PAD)]


def batched_pool(model: Model, devices: list[Device], parallel: int, max_queue: int, model_id: str, keep: dict,
                 draft: ServeDraft | None = None, inexact: bool = False):
    """One session whose cache holds --ctx tokens for each of the --parallel requests, stepped together:
    (pool, reservation)."""
    n_ctx = keep["n_ctx"]
    session = Session(model, devices, **{**keep, "n_ctx": n_ctx * parallel, "max_plans": None},
                      out_rows=parallel)     # the memory fit counts a step of --parallel rows of logits
    keys = batched_shapes(session, parallel)
    if draft:
        verify = verification_shapes(session, draft)
        exact_rows_check(session, session.make_plans(verify), draft.n_draft, inexact)
        keys = list(dict.fromkeys(keys + verify))
    result = session.reserve_shapes(keys)
    session.max_plans = len(keys) + 48          # the reserved shapes, and the prompt lengths met last
    scheduler = Scheduler(session, devices_of(list(result.plans.values()), devices), draft=draft)
    return SessionPool(model_id, [Slot(scheduler, n_ctx) for _ in range(parallel)], max_queue), result


def load_models(specs: list[str], devices: list[Device], *, n_ctx: int, n_batch: int, parallel: int,
                max_queue: int, strict: bool = False, kv_device: str | None = None, embeddings: bool = False,
                memory_caps: dict[str, int] | None = None, verify: tuple[Device, int] | None = None,
                draft: ServeDraft | None = None, draft_inexact: bool = False,
                say: Callable[[str], None] = lambda line: None) -> list[ServedModel]:
    """Load and reserve every model with its parallel sessions; check them all together against each
    device's program budget and memory. Nothing is loaded onto a device or compiled here. verify: (reference
    device, every N steps) for --verify: one Verifier per model, shared by its sessions. embeddings: each
    model also gets a session for /v1/embeddings (--embeddings), checked with the others. draft: --draft,
    its verification steps reserved too, refused on devices whose rows are not exact unless draft_inexact."""
    if n_ctx < 2:
        raise ValueError(f"--ctx must be at least 2 tokens (a prompt token and a generated one), got {n_ctx}")
    resolved: dict[str, Path] = {}
    for spec in specs:
        model_id, path = resolve(spec)
        if model_id in resolved:
            raise ValueError(f"model id '{model_id}' is given twice (-m {spec}); every -m must name another model")
        resolved[model_id] = path
    served, reservations = [], {}
    for model_id, path in resolved.items():
        say(f"reading {path.name}")
        model = Model(path)
        for note in model.notes:          # tensors the architecture does not read, as `run` says them
            say(f"note: {note}")
        keep = dict(n_ctx=n_ctx, n_batch=n_batch, strict=strict, kv_device=kv_device, memory_caps=memory_caps,
                    max_plans=max_plans(n_ctx), verifier=Verifier(verify[0], model.weight_bytes, verify[1])
                    if verify else None)
        why = batching_refusal(model, devices)
        if why is None:
            pool, result = batched_pool(model, devices, parallel, max_queue, model_id, keep, draft, draft_inexact)
            reservations[model_id] = (result, 1)           # one cache, one set of plans, for every request
        elif draft:
            raise SpeculationError(f"--draft {draft.spec}: the server drafts in its batched steps, and {why}; "
                                   f"serve {model_id} without --draft")
        else:                                              # a session, and a cache, per request
            first = Session(model, devices, **keep)
            sessions = [first] + [Session(model, devices, share_model_with=first, **keep)
                                  for _ in range(parallel - 1)]
            result = [reserve_session(s) for s in sessions][0]
            pool = SessionPool(model_id, sessions, max_queue)
            reservations[model_id] = (result, parallel)
        embedder = None
        if embeddings:
            first = pool.sessions[0]
            embedder, hidden = embedding_session(first.scheduler.session if isinstance(first, Slot) else first, keep)
            reservations[f"{model_id} embeddings"] = (without_weights(hidden), 1)
        try:
            template, note = chat_template_for(model.file.metadata, model.arch.name)
        except ChatTemplateError as e:
            template, note = None, str(e)
        served.append(ServedModel(
            id=model_id, path=path, sha256=sha256_of(path), model=model,
            pool=pool, devices=devices_of(list(result.plans.values()), devices), template=template,
            template_note=note, created=int(path.stat().st_mtime), embedder=embedder))
    check_together(reservations, {d.name: d for d in devices})
    return served


WARM_REPORT_S = 5.0      # seconds between lines of a start's progress (a start that takes less says nothing)


def warm(served: list[ServedModel], say: Callable[[str], None] | None = None) -> None:
    """Load every weight, compile every reserved program, allocate every session's KV cache (on the
    compute thread: devices are driven from there only). say: a line every WARM_REPORT_S seconds, and at the
    end, where it takes that long (a batched server compiles a program for each of its step shapes)."""
    for m in served:
        plans = [(s, plan) for s in m.sessions() for plan, _ in s.plans.values()]
        start = last = time.monotonic()
        for i, (session, plan) in enumerate(plans, 1):
            session.executor.prepare(plan)
            now = time.monotonic()
            if say and (now - last >= WARM_REPORT_S or (i == len(plans) and now - start >= WARM_REPORT_S)):
                say(f"{m.id}: {i} of {len(plans)} step shapes loaded and compiled ({now - start:.0f} s)")
                last = now
