"""The HTTP side: OpenAI's routes over the served models, keys, limits and errors.

A request is checked in full (body, model, prompt length) before it waits for a session, and it runs
on the model it names or on none: an unknown id is a 404 that lists the ids served. Every answer
names the devices that computed it, in the X-Framework-Devices header and, when not streamed, in
the body's "devices" field.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import ValidationError
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..core.scheduler.errors import CapabilityError, DeviceRunError
from ..model.chat import ChatTemplateError, chat_prompt_ids
from ..model.tokenizer import TokenizerError
from ..runtime.sampling import SamplingParams
from ..runtime.context import ContextFullError
from .embeddings import check_width, encoded, input_ids, normalised, pooled
from .engine import Compute, Job, Run, devices_of
from .errors import ApiError, invalid_body
from .guard import add_guards
from .logprobs import Logprobs
from .metrics import AccessLog, Clock, Metrics
from .models import ServedModel, warm
from .pool import QueueFull, SessionPool
from .schemas import (ChatRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest, Generation,
                      TokenizeRequest)
from .shutdown import Drain, InFlight
from .structured import GrammarMask, grammar_of

log = logging.getLogger("framework.serve")

DEVICES_HEADER = "X-Framework-Devices"
MODEL_HEADER = "X-Framework-Model"


@dataclass
class Settings:
    api_key: str | None = None
    max_body: int = 1 << 20
    shutdown_grace: float = 10.0     # seconds a running stream may go on after SIGINT/SIGTERM
    host: str = "127.0.0.1"          # the bound address: a Host the server answers without a key (guard.py)
    cors: list[str] = field(default_factory=list)     # origins a browser page may call from (--cors)


@dataclass
class ServerState:
    models: dict[str, ServedModel]
    settings: Settings
    compute: Compute = field(default_factory=Compute)
    drain: Drain = field(default_factory=lambda: Drain(0.0))
    metrics: Metrics | None = None
    ready: bool = False
    load_error: str | None = None

    def lookup(self, model_id: str) -> ServedModel:
        if model_id not in self.models:
            raise ApiError(404, f"the model '{model_id}' is not served here; this server serves: "
                           f"{', '.join(self.models)}", code="model_not_found", param="model",
                           available=list(self.models))
        return self.models[model_id]

    def pick(self, model_id: str | None) -> ServedModel:
        """The model a request names; one that names none gets the only model served."""
        self.check_ready()
        if model_id is None and len(self.models) > 1:
            raise ApiError(400, f"'model' is required: this server serves {', '.join(self.models)}",
                           code="invalid_value", param="model")
        return self.lookup(model_id if model_id is not None else next(iter(self.models)))

    def check_ready(self) -> None:
        self.drain.refuse_new()
        if self.load_error:
            raise ApiError(503, f"the server could not load its models: {self.load_error}", code="load_failed")
        if not self.ready:
            raise ApiError(503, "the server is still loading its models; retry shortly", code="loading",
                           headers={"Retry-After": "2"})


def create_app(models: list[ServedModel], settings: Settings, on_ready=None, on_failure=None,
               on_progress=None) -> FastAPI:
    """The application; its start-up warms every model on the compute thread (/health is 503 until then).
    on_ready() is called once all are warm; on_failure(message) if one cannot be loaded; on_progress(line)
    as a long warm goes on (models.warm)."""
    state = ServerState({m.id: m for m in models}, settings, drain=Drain(settings.shutdown_grace),
                        metrics=Metrics({m.id: m.pool.state for m in models}, {m.id: m.sessions for m in models}))

    async def lifespan(app: FastAPI):
        task = asyncio.create_task(_warm(state, on_ready, on_failure, on_progress))
        yield
        task.cancel()
        state.compute.shutdown()

    app = FastAPI(title="framework", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    _add_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body)
    app.add_middleware(InFlight, drain=state.drain)
    add_guards(app, settings.host, settings.api_key, settings.cors)
    app.add_middleware(AccessLog, metrics=state.metrics)
    key = Depends(_key_check(settings.api_key))

    @app.get("/health")
    async def health():
        if state.drain.stopping:
            return JSONResponse({"status": "stopping", "signal": state.drain.signal}, status_code=503)
        if state.load_error or not state.ready:
            status = "failed" if state.load_error else "loading"
            return JSONResponse({"status": status, "error": state.load_error}, status_code=503)
        return {"status": "ok", "models": {m.id: m.pool.state() for m in state.models.values()}}

    @app.get("/metrics", dependencies=[key])
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[key])
    async def list_models():
        state.check_ready()
        return {"object": "list", "data": [m.describe() for m in state.models.values()]}

    @app.get("/v1/models/{model_id}", dependencies=[key])
    async def get_model(model_id: str):
        state.check_ready()
        return state.lookup(model_id).describe()

    @app.post("/v1/chat/completions", dependencies=[key])
    async def chat_completions(request: Request):
        return await _complete(state, request, ChatRequest, chat=True)

    @app.post("/v1/completions", dependencies=[key])
    async def completions(request: Request):
        return await _complete(state, request, CompletionRequest, chat=False)

    @app.post("/tokenize", dependencies=[key])
    async def tokenize(request: Request):
        req = await _body(request, TokenizeRequest)
        tok = state.pick(req.model).model.tokenizer
        ids = await asyncio.to_thread(tok.encode, req.content, add_bos=None if req.add_special else False)
        if not req.with_pieces:
            return {"tokens": ids}
        return {"tokens": [{"id": i, "piece": tok.token_bytes(i, special=True).decode("utf-8", errors="replace")}
                           for i in ids]}

    @app.post("/detokenize", dependencies=[key])
    async def detokenize(request: Request):
        req = await _body(request, DetokenizeRequest)
        served = state.pick(req.model)
        tok = served.model.tokenizer
        bad = [t for t in req.tokens if t >= tok.n_vocab]
        if bad:
            raise ApiError(400, f"token ids {bad[:5]} are outside the vocabulary of '{served.id}' "
                           f"(0..{tok.n_vocab - 1})", code="invalid_value", param="tokens")
        return {"content": tok.decode(req.tokens)}

    @app.post("/v1/embeddings", dependencies=[key])
    async def embeddings(request: Request):
        return await _embed(state, request)

    return app


async def _warm(state: ServerState, on_ready, on_failure, on_progress=None) -> None:
    try:
        await state.compute.call(warm, list(state.models.values()), on_progress)
    except Exception as e:       # /health says what failed, in the device's words, until the server stops
        state.load_error = f"{type(e).__name__}: {e}"
        if on_failure:
            on_failure(state.load_error)
        return
    state.ready = True
    if on_ready:
        on_ready()


# -- one request -------------------------------------------------------------------------------------
async def _embed(state: ServerState, request: Request):
    """Each input's pooled hidden state (embeddings.py), in OpenAI's shape."""
    state.check_ready()
    req = await _body(request, EmbeddingRequest)
    served = state.lookup(req.model)
    session = served.embedder
    if session is None:
        raise ApiError(400, f"this server was started without --embeddings, so it has no session to compute "
                       f"embeddings of '{served.id}' on; start it with --embeddings (as llama-server)",
                       code="embeddings_disabled")
    check_width(req, served.model.hp.n_embd, served.id)
    single = isinstance(req.input, str) or isinstance(req.input[0], int)      # else a list of inputs

    def tokenized() -> list[list[int]]:
        return [input_ids(served.model.tokenizer, item, None if single else i, served.id, session.n_ctx)
                for i, item in enumerate(req.inputs())]

    ids = await asyncio.to_thread(tokenized)
    devices = devices_of([plan for plan, _ in session.plans.values()], session.devices)
    n_tokens = sum(len(x) for x in ids)
    request.state.access = (n_tokens, lambda: 0, devices)
    try:
        vectors = [await state.compute.call(pooled, session, x) for x in ids]
    except Exception as e:
        raise _run_error(e) from e
    data = [{"object": "embedding", "index": i, "embedding": encoded(normalised(v, req.embd_normalize),
                                                                      req.encoding_format)}
            for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": served.id,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}},
                        headers={DEVICES_HEADER: ", ".join(devices),
                                 MODEL_HEADER: f"{served.id} sha256:{served.sha256}"})


async def _complete(state: ServerState, request: Request, schema: type[Generation], chat: bool):
    state.check_ready()
    req = await _body(request, schema)
    served = state.lookup(req.model)
    clock = state.metrics.clock(served.id)
    ids = await asyncio.to_thread(_prompt_ids, served, req, chat)
    n_top = req.n_logprobs()
    trace = None if n_top is None else Logprobs(served.model.tokenizer, n_top)
    job = Job(ids, _max_tokens(served, len(ids), req.limit()), _sampling(req), req.stops(), req.cache_prompt,
              mask=await asyncio.to_thread(_mask, served, req), observe=trace)
    pool = served.pool
    try:
        session = await _acquire(pool, request, state.drain)
    except QueueFull as e:
        pool.counts.refuse(429)
        raise ApiError(429, str(e), code="queue_full", type="rate_limit_error",
                       headers={"Retry-After": str(e.retry_after)}) from None
    if session is None:          # the client left while it waited
        pool.counts.cancelled += 1
        return JSONResponse({}, status_code=499)
    lease = Lease(pool, session)
    run = Run(session, job)
    try:
        devices = await state.compute.call(run.start, when_abandoned=lease.release)
    except asyncio.CancelledError:
        pool.counts.cancelled += 1
        raise
    except BaseException as e:
        lease.release()
        raise _run_error(e) from e
    headers = {DEVICES_HEADER: ", ".join(devices), MODEL_HEADER: f"{served.id} sha256:{served.sha256}"}
    reply = Reply(served.id, chat, len(ids), devices, trace)
    request.state.access = (len(ids), lambda: run.n_out, devices)
    steps = _steps(state.compute, run, lease, clock, state.drain)
    if req.stream:
        events = _events(reply, run, steps, req.include_usage(), state.drain)
        return _Stream(events, lease=lease, headers=headers, sep="\n",
                       shutdown_grace_period=state.settings.shutdown_grace)
    text = []
    async for piece in steps:
        text.append(piece)
        if state.drain.cut:
            await steps.aclose()
            raise state.drain.cut_error(run.n_out)
        if await request.is_disconnected():
            await steps.aclose()
            return JSONResponse({}, status_code=499)
    return JSONResponse(reply.whole("".join(text), run), headers=headers)


async def _body(request: Request, schema):
    """The request's body, checked (a client that hangs up while sending it: see _add_error_handlers)."""
    return _parse(schema, await request.body())


def _parse(schema, body: bytes):
    try:
        return schema.model_validate_json(body)
    except ValidationError as e:
        raise invalid_body(e) from None


def _prompt_ids(served: ServedModel, req: Generation, chat: bool) -> list[int]:
    param = "messages" if chat else "prompt"
    try:
        ids = _tokens(served, req, chat)
    except TokenizerError as e:
        raise ApiError(400, str(e), code="invalid_value", param=param) from None
    if not ids:             # nothing to start from: the model would have no position to predict at
        raise ApiError(400, f"the prompt is empty and '{served.id}' adds no beginning-of-sequence token, so there "
                       f"is nothing to continue from; give some text", code="invalid_value", param=param)
    return ids


def _tokens(served: ServedModel, req: Generation, chat: bool) -> list[int]:
    tok = served.model.tokenizer
    if not chat:
        prompt = req.prompt[0] if isinstance(req.prompt, list) and isinstance(req.prompt[0], str) else req.prompt
        if isinstance(prompt, str):
            return tok.encode(prompt)
        bad = [t for t in prompt if t >= tok.n_vocab]
        if bad:
            raise ApiError(400, f"prompt token ids {bad[:5]} are outside the vocabulary of '{served.id}' "
                           f"(0..{tok.n_vocab - 1})", code="invalid_value", param="prompt")
        return list(prompt)
    if served.template is None:
        raise ApiError(400, f"'{served.id}' has no chat template: {served.template_note}; use /v1/completions",
                       code="no_chat_template", param="messages")
    try:
        return chat_prompt_ids(tok, served.template, req.conversation())
    except ChatTemplateError as e:
        raise ApiError(400, str(e), code="invalid_messages", param="messages") from None


def _mask(served: ServedModel, req: Generation) -> GrammarMask | None:
    grammar = grammar_of(req)
    return None if grammar is None else GrammarMask(served.model.tokenizer, grammar)


def _max_tokens(served: ServedModel, n_prompt: int, asked: int | None) -> int:
    n_ctx = served.pool.sessions[0].n_ctx
    room = n_ctx - n_prompt
    if room < 1 or (asked is not None and asked > room):
        wanted = f" plus max_tokens {asked}" if asked is not None else " plus at least one generated token"
        raise ApiError(400, f"the prompt is {n_prompt} tokens{wanted}, more than the context of {n_ctx} tokens "
                       f"that '{served.id}' is served with (--ctx)", code="context_length_exceeded",
                       param="max_tokens" if asked is not None and room >= 1 else "messages",
                       prompt_tokens=n_prompt, max_tokens=asked, context_length=n_ctx)
    return asked if asked is not None else room


def _sampling(req: Generation) -> SamplingParams:
    """OpenAI's defaults: temperature 1, no nucleus cut; no top-k cut unless asked (llama.cpp's extension)."""
    return SamplingParams(temperature=1.0 if req.temperature is None else req.temperature,
                          top_k=req.top_k or 0, top_p=1.0 if req.top_p is None else req.top_p, min_p=req.min_p or 0.0,
                          seed=None if req.seed == -1 else req.seed)     # -1: llama-server's "random"


async def _acquire(pool: SessionPool, request: Request, drain: Drain):
    """A session, or None when the client disconnects while it waits in the queue (a 503 when the server
    stops meanwhile)."""
    task = asyncio.ensure_future(pool.acquire())
    handed = False
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                handed = True
                return task.result()
            if await request.is_disconnected():
                return None
            drain.refuse_new()
    finally:
        if not handed:
            task.cancel()
            if task.done() and not task.cancelled() and task.exception() is None:
                pool.release(task.result())      # it got one just as the client left


class Lease:
    """A session lent to one request, given back exactly once."""

    def __init__(self, pool: SessionPool, session):
        self.pool, self.session, self.t0, self.done = pool, session, time.perf_counter(), False
        self.stepping = False          # a step runs on the session: only its end may give it back

    def release(self) -> None:
        if not self.done:
            self.done = True
            self.pool.release(self.session, time.perf_counter() - self.t0)


class _Stream(EventSourceResponse):
    """A stream that gives its session back even when it never started (the client left before)."""

    def __init__(self, *args, lease: Lease, **kw):
        super().__init__(*args, **kw)
        self._lease = lease

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._lease.done and not self._lease.stepping:
                self._lease.pool.counts.cancelled += 1
                self._lease.release()


async def _steps(compute: Compute, run: Run, lease: Lease, clock: Clock, drain: Drain) -> AsyncIterator[str]:
    """The request's text, a piece per step ("" while a stop string may be starting). Cancelled mid-step
    (the client went away), the session is given back once that step returns; closed between steps, at once."""
    try:
        while run.finish is None:
            lease.stepping = True
            text = await compute.call(run.step, when_abandoned=lease.release)
            lease.stepping = False
            clock.step()
            yield text
    except asyncio.CancelledError:
        _gone(lease, run, drain)
        raise
    except GeneratorExit:       # closed between steps: the client went away, or (finished) the stream ended
        if run.finish is None:
            _gone(lease, run, drain)
        lease.release()
        raise
    except BaseException as e:
        lease.release()
        raise _run_error(e) from e
    lease.release()
    lease.pool.counts.answered += 1
    clock.done(len(run.job.ids), run.n_out, run.cached_tokens)


def _gone(lease: Lease, run: Run, drain: Drain) -> None:
    lease.pool.counts.cancelled += 1
    why = f"cut by the shutdown ({drain.signal})" if drain.cut else "client went away"
    log.warning("%s after %d generated tokens; its generation stops and its session is given back", why, run.n_out)


def _run_error(e: BaseException) -> BaseException:
    if isinstance(e, (ApiError, asyncio.CancelledError)) or not isinstance(e, Exception):
        return e
    if isinstance(e, ContextFullError):
        return ApiError(400, str(e), code="context_length_exceeded")
    if isinstance(e, (CapabilityError, DeviceRunError)):
        return ApiError(500, str(e), code=getattr(e, "code", None) or "device_error")
    return ApiError(500, f"generation failed: {type(e).__name__}: {e}", code="internal_error")


# -- what comes back ---------------------------------------------------------------------------------
@dataclass
class Reply:
    model: str
    chat: bool
    n_prompt: int
    devices: list[str]
    trace: Logprobs | None = None      # when the request asked for log-probabilities
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))
    sent: int = 0                      # characters of text sent so far (completions' text_offset)

    def _head(self, object_: str) -> dict:
        prefix = "chatcmpl-" if self.chat else "cmpl-"
        return {"id": prefix + self.id, "object": object_, "created": self.created, "model": self.model}

    def usage(self, run: Run) -> dict:
        usage = {"prompt_tokens": self.n_prompt, "completion_tokens": run.n_out,
                 "total_tokens": self.n_prompt + run.n_out,
                 "prompt_tokens_details": {"cached_tokens": run.cached_tokens}}
        if run.drafting:        # serve --draft (an extension: docs/speculative.md, "In the server")
            usage["speculative"] = {"drafted_tokens": run.drafted, "accepted_tokens": run.accepted}
        return usage

    def logprobs(self) -> dict | None:
        """The log-probabilities of the tokens since the last call, in the route's shape."""
        if self.trace is None:
            return None
        entries = self.trace.take()
        return self.trace.chat(entries) if self.chat else self.trace.completion(entries, self.sent)

    def whole(self, text: str, run: Run) -> dict:
        lp = self.logprobs()
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                      "finish_reason": run.finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": lp, "finish_reason": run.finish}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": self.usage(run), "devices": self.devices}

    def chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict:
        lp = None if first else self.logprobs()
        self.sent += len(text or "")
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else ({} if text is None else {"content": text})
            choice = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": lp, "finish_reason": finish}
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [choice]}


async def _events(reply: Reply, run: Run, steps: AsyncIterator[str], include_usage: bool, drain: Drain):
    """OpenAI's stream: a chunk per piece of text, one with the finish reason, the usage when asked, [DONE];
    cut by a shutdown, an error event then [DONE]."""
    usage = {"usage": None} if include_usage else {}

    def event(body: dict) -> dict:
        return {"data": json.dumps(body, ensure_ascii=False)}

    try:
        if reply.chat:
            yield event({**reply.chunk(None, None, first=True), **usage})
        async for text in steps:
            if text:
                yield event({**reply.chunk(text, None), **usage})
            if drain.cut:
                raise drain.cut_error(run.n_out)
        yield event({**reply.chunk(None, run.finish), **usage})
        if include_usage:
            yield event({**reply._head("chat.completion.chunk" if reply.chat else "text_completion"), "choices": [],
                         "usage": reply.usage(run)})
    except ApiError as e:        # headers are sent: the error goes in the stream, where OpenAI's clients look
        yield event(e.body())
    finally:
        await steps.aclose()
    yield {"data": "[DONE]"}


# -- keys, limits, error bodies ------------------------------------------------------------------------
def _key_check(api_key: str | None):
    async def check(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer KEY' with the key the "
                           "server was started with (--api-key)", code="invalid_api_key", type="authentication_error",
                           headers={"WWW-Authenticate": "Bearer"})
    return check


class _TooLarge(Exception):
    pass


class BodyLimit:
    """Refuse a request body larger than max_bytes with 413: by its Content-Length before reading it, or
    as soon as a body without one grows past the limit."""

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_large = ApiError(413, f"the request body is larger than the server's limit of {self.max_bytes} bytes "
                             f"(--max-body)", code="body_too_large")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await too_large.response()(scope, receive, send)
        seen, started = 0, False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await too_large.response()(scope, receive, send)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError):
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        words = {404: f"no route {request.method} {request.url.path}; the routes are GET /health, GET /metrics, "
                      f"GET /v1/models, POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, "
                      f"POST /tokenize and POST /detokenize",
                 405: f"{request.method} is not allowed on {request.url.path}"}
        return ApiError(e.status_code, words.get(e.status_code, str(e.detail)), code=f"http_{e.status_code}",
                        headers=dict(e.headers or {})).response()

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, e: ClientDisconnect):
        log.warning("client went away while sending its request body to %s", request.url.path)
        return JSONResponse({}, status_code=499)

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception):
        # the traceback goes to the server's log, never into a response
        log.exception("internal error on %s %s", request.method, request.url.path)
        return ApiError(500, f"internal error: {type(e).__name__}: {e}", code="internal_error").response()
