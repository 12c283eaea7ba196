"""Where one streamed request's token time goes inside `framework serve`, layer by layer.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/serve_layers.py [--model smollm2] [--backends cpu]
        [--parallel 8] [--threads 2] [--requests 10] [--max-tokens 32] [--step-ahead]

Starts `framework serve` in a child process (this file again, with --child) whose layers are wrapped in
perf_counter clocks, sends 3 warm-up requests and then --requests streamed greedy chat requests one after
another (one client), stops it, and prints the time between two pieces as the client reads them (TPOT:
the median over the requests, and the mean), then per token between each request's first piece and its
last (the stretch TPOT covers; a layer's calls that ended there, summed, over those tokens): the event
loop's wait for a piece from the compute thread (Compute.call), the piece's work on that thread
(Run.step), the batched step (Batch.step) and the model's part of it (Executor.run), the chunk's body
(Reply.chunk), and the event loop's time between handing one piece to the stream and asking for the
next. What the server adds to a token is the mean TPOT less Executor.run.

--step-ahead: the child also runs the next step as soon as a piece is handed over (while the event loop
sends it), to measure that overlap; the server does not do this (docs/serve.md, "One client: where a
token's time goes").
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from serve_load import free_port, model_id  # noqa: E402

LAYERS = ["Compute.call", "Run.step", "Batch.step", "Executor.run", "Reply.chunk"]


# -- the child: framework serve with clocks ----------------------------------------------------------
def child(argv: list[str], out: Path, step_ahead: bool) -> int:
    import framework.serve.app as app
    import framework.serve.engine as engine
    from framework.cli import main
    from framework.core.scheduler import executor
    from framework.runtime import batch

    times: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)

    def clocked(owner, name: str, label: str, is_async: bool = False) -> None:
        fn = getattr(owner, name)

        def sync(*a, **k):
            t0 = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                times[label].append((t0, time.perf_counter() - t0))

        async def asynchronous(*a, **k):
            t0 = time.perf_counter()
            try:
                return await fn(*a, **k)
            finally:
                times[label].append((t0, time.perf_counter() - t0))
        setattr(owner, name, asynchronous if is_async else sync)

    clocked(engine.Compute, "call", "Compute.call", is_async=True)
    clocked(engine.Run, "step", "Run.step")
    clocked(batch.Batch, "step", "Batch.step")
    clocked(executor.Executor, "run", "Executor.run")
    clocked(app.Reply, "chunk", "Reply.chunk")
    if step_ahead:
        _step_ahead(engine)
    try:
        return main(argv)
    finally:
        out.write_text(json.dumps(times))


def _step_ahead(engine) -> None:
    """Each piece handed over queues the next step on the compute thread, before the event loop sends it."""
    made, init, step = [], engine.Compute.__init__, engine.Run.step

    def remembered(self):
        init(self)
        made.append(self)

    def ahead(run) -> None:
        sched = run.slot.scheduler
        with sched._lock:
            sched._tidy()
            if run in sched.active and run.generating and not run.pieces:
                sched._step()

    def step_then_ahead(run):
        text = step(run)
        if run.finish is None and run.job.observe is None and isinstance(run.slot, engine.Slot):
            made[0]._pool.submit(ahead, run)
        return text
    engine.Compute.__init__ = remembered
    engine.Run.step = step_then_ahead


# -- the parent: one client ---------------------------------------------------------------------------
def one_request(port: int, args) -> list[float]:
    """A streamed greedy chat request; the times its pieces of text arrived."""
    body = json.dumps({"model": model_id(args.model), "messages": [{"role": "user", "content": "Why is the sky blue?"}],
                       "max_tokens": args.max_tokens, "temperature": 0, "stream": True})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    stamps = []
    for line in conn.getresponse():
        if line.startswith(b"data: {") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
            stamps.append(time.perf_counter())
    conn.close()
    return stamps


def wait_ready(port: int, proc: subprocess.Popen) -> None:
    while proc.poll() is None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"framework serve exited with {proc.returncode} before it was ready")


def report(times: dict, requests: list[list[float]]) -> None:
    """Per token between each request's first piece and its last (the stretch its TPOT covers): each layer's
    time that ended there, summed, over those tokens (perf_counter is one monotonic clock for both
    processes on Linux)."""
    windows = [(r[0], r[-1]) for r in requests if len(r) > 1]
    tokens = sum(len(r) - 1 for r in requests if len(r) > 1)
    tpot = statistics.median((b - a) / (len(r) - 1) for r, (a, b) in zip(requests, windows))
    mean = sum(b - a for a, b in windows) / tokens * 1000
    per = {k: sum(d for t0, d in v if any(a <= t0 + d <= b for a, b in windows)) / tokens * 1000
           for k, v in times.items()}
    between = 0.0
    for a, b in windows:
        calls = [(t0, d) for t0, d in times["Compute.call"] if a <= t0 + d <= b]
        between += sum(t1 - t0 - d for (t0, d), (t1, _) in zip(calls, calls[1:]))
    print(f"| per token after a request's first ({len(windows)} requests, {tokens} tokens) | ms |\n| --- | --- |")
    print(f"| TPOT, as the client reads the stream: p50 of the requests, and the mean | {tpot * 1000:.2f}, "
          f"{mean:.2f} |")
    for name in LAYERS:
        print(f"| {name} | {per.get(name, 0.0):.2f} |")
    print(f"| the event loop between two Compute.call of a request | {between / tokens * 1000:.2f} |")
    print(f"\nwhat the server adds to a token (the mean TPOT less Executor.run): {mean - per['Executor.run']:.2f} ms")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backends", default="cpu")
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--requests", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--step-ahead", action="store_true")
    ap.add_argument("--child", metavar="OUT", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    if args.child:
        return child(rest, Path(args.child), args.step_ahead)
    port, out = free_port(), Path(f"/tmp/serve_layers_{time.time_ns()}.json")
    cmd = [sys.executable, __file__, "--child", str(out)] + (["--step-ahead"] if args.step_ahead else []) + [
        "serve", "-m", args.model, "--backends", args.backends, "--host", "127.0.0.1", "--port", str(port),
        "--parallel", str(args.parallel), "--threads", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        for _ in range(3):
            one_request(port, args)
        requests = [one_request(port, args) for _ in range(args.requests)]
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    times = json.loads(out.read_text())
    out.unlink()
    report(times, requests)
    return 0


if __name__ == "__main__":
    sys.exit(main())
