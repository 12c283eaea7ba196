"""What the server did, for people and for Prometheus: GET /metrics and one access-log line per request.

/metrics is Prometheus's text format through prometheus_client, on a registry of this app's own (two
apps in one process count apart). The time each device spends on a model is read from the model's
executors when /metrics is scraped (DeviceTime): they already time every fragment they run. The access
log goes to stderr through the `framework.serve.access` logger: the route, the status, the tokens
(prompt+generated), the milliseconds and the devices.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

access_log = logging.getLogger("framework.serve.access")

SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self, pools: dict[str, Callable[[], dict]], sessions: dict[str, Callable[[], list]] | None = None):
        """pools: per model id, a function giving its pool's state (busy, queued, ...); sessions: per model id,
        a function giving its sessions (their executors' device times are shown)."""
        r = self.registry = CollectorRegistry()
        r.register(DeviceTime(sessions or {}))
        self.requests = Counter("framework_requests", "HTTP requests answered, by route and status",
                                ["route", "status"], registry=r)
        self.prompt_tokens = Counter("framework_prompt_tokens", "prompt tokens of generation requests", ["model"],
                                     registry=r)
        self.generated_tokens = Counter("framework_generated_tokens", "tokens generated", ["model"], registry=r)
        self.prefix_cache_hits = Counter("framework_prefix_cache_hit_tokens", "prompt tokens taken from the prefix "
                                         "cache", ["model"], registry=r)
        self.ttft = Histogram("framework_time_to_first_token_seconds", "request received to its first token",
                              ["model"], buckets=SECONDS, registry=r)
        self.tpot = Histogram("framework_time_per_output_token_seconds", "first token to last, per later token",
                              ["model"], buckets=SECONDS, registry=r)
        queued = Gauge("framework_queue_depth", "requests waiting for a session", ["model"], registry=r)
        busy = Gauge("framework_sessions_busy", "sessions generating", ["model"], registry=r)
        for model, state in pools.items():
            queued.labels(model).set_function(lambda state=state: state()["queued"])
            busy.labels(model).set_function(lambda state=state: state()["busy"])
            for per_model in (self.prompt_tokens, self.generated_tokens, self.prefix_cache_hits, self.ttft, self.tpot):
                per_model.labels(model)         # shown at 0 from the start, not only once counted

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def clock(self, model: str) -> "Clock":
        return Clock(self, model)


class DeviceTime:
    """framework_device_seconds_total and framework_device_fragment_runs_total, by model and device: the
    seconds each device spent running a model's fragments (its runs, its waits, its read-backs) and the
    fragments it ran, summed over the model's sessions' executors (core/scheduler/executor.py's stats)."""

    def __init__(self, sessions: dict[str, Callable[[], list]]):
        self.sessions = sessions

    def collect(self):
        seconds = CounterMetricFamily("framework_device_seconds", "seconds a device spent running a model's "
                                      "fragments, transfers included", labels=["model", "device"])
        runs = CounterMetricFamily("framework_device_fragment_runs", "fragments of a model a device ran",
                                   labels=["model", "device"])
        for model, sessions_of in self.sessions.items():
            totals: dict[str, list] = {}
            for session in sessions_of():
                for device, st in list(session.executor.stats.items()):     # the compute thread may add a device
                    total = totals.setdefault(device, [0.0, 0])
                    total[0] += st["seconds"]
                    total[1] += st["runs"]
            for device, (sec, n) in sorted(totals.items()):
                seconds.add_metric([model, device], sec)
                runs.add_metric([model, device], n)
        yield seconds
        yield runs


class Clock:
    """One generation's times: started when the request arrived, first token, last token."""

    def __init__(self, metrics: Metrics, model: str):
        self.metrics, self.model = metrics, model
        self.t0, self.first = time.perf_counter(), None

    def step(self) -> None:
        if self.first is None:
            self.first = time.perf_counter()
            self.metrics.ttft.labels(self.model).observe(self.first - self.t0)

    def done(self, n_prompt: int, n_out: int, n_cached: int = 0) -> None:
        self.metrics.prompt_tokens.labels(self.model).inc(n_prompt)
        self.metrics.prefix_cache_hits.labels(self.model).inc(n_cached)
        self.metrics.generated_tokens.labels(self.model).inc(n_out)
        if self.first is not None and n_out > 1:
            self.metrics.tpot.labels(self.model).observe((time.perf_counter() - self.first) / (n_out - 1))


class AccessLog:
    """One line per HTTP request once its answer (a stream: its last event) is sent. A generation route
    leaves ``scope["state"]["access"]`` = (prompt tokens, a function giving the generated count, devices)."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [0]
        state = scope.setdefault("state", {})

        async def noting_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noting_send)
        finally:
            route = f"{scope['method']} {scope['path']}"
            self.metrics.requests.labels(scope["path"], str(status[0])).inc()
            access_log.info("%s %s%s %.0f ms", route, status[0] or "-", _generation(state.get("access")),
                            (time.perf_counter() - t0) * 1e3)


def _generation(access) -> str:
    if access is None:
        return ""
    n_prompt, n_out, devices = access
    return f" {n_prompt}+{n_out()} tokens on {', '.join(devices)}"
