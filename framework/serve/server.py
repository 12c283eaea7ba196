"""`framework serve`: reserve every model and session, then open the port, warm, and answer.

Order matters: every check that can fail (a model file, a device, a capability, a budget counted over
all models and sessions together) runs before the port opens, so a server that listens can run what
it lists. SIGINT and SIGTERM stop accepting; running requests get --shutdown-timeout seconds to
finish, then are cancelled, and the process exits.
"""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable

import uvicorn

from ..exit_codes import EXIT_DEVICE, EXIT_INPUT, EXIT_OK
from .app import Settings, create_app
from .guard import parse_origins
from .shutdown import Drain
from .models import load_models, serve_draft


def serve(args, devices, memory_caps: dict[str, int], say: Callable[[str], None]) -> int:
    verify = None
    if args.verify:     # every --verify-every-th step of each model compared with the reference device's
        from ..registry import default_registry
        from ..core.scheduler.verify import reference_device
        verify = (reference_device(args.verify, default_registry().select), args.verify_every)
        say(f"verifying one step in {args.verify_every} against {verify[0].name} (--verify)")
    draft = serve_draft(args.draft, args.draft_n, args.draft_inexact)
    served = load_models(args.model, devices, n_ctx=args.ctx, n_batch=args.batch, parallel=args.parallel,
                         max_queue=args.queue, strict=args.strict, kv_device=args.kv_device,
                         memory_caps=memory_caps, verify=verify, embeddings=args.embeddings, draft=draft,
                         draft_inexact=args.draft_inexact, say=say)
    if draft:
        say(f"every request drafts by prompt lookup ({draft.spec}, up to {draft.n_draft} tokens a step); each "
            f"response's usage reports them (\"speculative\")")
    for m in served:
        say(f"{m.id}: {m.path} (sha256 {m.sha256[:16]}...) on {', '.join(m.devices)}, {args.parallel} sessions of "
            f"{args.ctx} tokens" + (", and one for /v1/embeddings" if m.embedder else "") + ", reserved")
    url = f"http://{_host_in_url(args.host)}:{args.port}/v1"
    settings = Settings(api_key=args.api_key, max_body=args.max_body,
                        shutdown_grace=max(0.0, args.shutdown_timeout - 1.0), host=args.host,
                        cors=parse_origins(args.cors))
    failed: list[str] = []

    def on_failure(message: str) -> None:
        failed.append(message)
        say(f"error: loading the models failed, stopping: {message}")
        server.should_exit = True

    app = create_app(served, settings, on_ready=lambda: say(f"ready: {url} serves {', '.join(m.id for m in served)}"),
                     on_failure=on_failure, on_progress=say)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        say(f"listening on {args.host}, not only this machine" + ("" if args.api_key else "; no --api-key is set"))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("framework.serve.access").setLevel(logging.INFO)     # a line per request (metrics.py)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=args.shutdown_timeout, lifespan="on")
    server = _Server(config, app.state.server.drain)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then raises the signal again for the handler it found:
    # this one notes it, so the process ends by returning 0 rather than by the signal or a KeyboardInterrupt
    stops: list[int] = []
    previous = {sig: signal.signal(sig, lambda sig, frame: stops.append(sig))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if stops:
        say(f"stopped by {signal.Signals(stops[0]).name}")
    # uvicorn also returns when it could not bind the port (it has logged why)
    return EXIT_DEVICE if failed else EXIT_OK if server.started else EXIT_INPUT


class _Server(uvicorn.Server):
    """uvicorn's server, whose first SIGINT/SIGTERM drains (shutdown.py) before it stops accepting; a second
    stops at once."""

    def __init__(self, config: uvicorn.Config, drain: Drain):
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame) -> None:
        if self.drain.stopping or self.should_exit or not self.started:
            return super().handle_exit(sig, frame)
        self._captured_signals.append(sig)      # raised again once uvicorn returns, as its own handler does
        self.drain.begin(signal.Signals(sig).name, then=lambda: setattr(self, "should_exit", True))


def _host_in_url(host: str) -> str:
    return f"[{host}]" if ":" in host else host
