"""A bounded load test of `framework serve`, on loopback only, against `framework run` on the same prompt.

    .venv/bin/python benchmarks/serve_load.py [--model smollm2] [--backends cpu] [--parallel 2]
        [--clients 1,2,4] [--requests 8] [--max-tokens 32] [--burst 8] [--burst-at-once N]
        [--burst-rounds 1] [--json-schema N] [--repeats 3] [--threads N] [--llama-server PATH] [--turns 3]

1. `framework run` --repeats times on the prompt (chat template, greedy), and --repeats times again
   after the server has stopped: the medians of its own prefill time and decode time per token, as
   its summary line prints them. Beside it, the same loop warm in this process (see warm_baseline).
   --repeats 0 leaves them out (and the ratios to them).
2. `framework serve` on a free loopback port, --parallel sessions, a queue of --queue; one warm-up
   request per session (it plans the prompt's shape, which `framework run` also does before its clock).
3. For each count of clients: --requests streamed chat requests in all, each client sending its next
   when the last one ends. --distinct-prompts: each request of the run its own prompt (a numbered line of
   1 to 97 words of a fixed text before --prompt), so prompts differ in length and share no prefix beyond
   the chat template: steps mix a new prompt's tokens with the decode rows in ever-new counts.
   Per request: time to first token (request sent to first text), time per
   output token (first text to last, over the tokens after the first), tokens (the usage chunk). Per
   phase, from /metrics before and after it: the seconds the server's devices spent on its steps
   (framework_device_seconds_total), and the phase's time outside them per generated token (the server's
   own work and the client's: at most what the server adds to a token).
4. A burst, --burst-rounds times: --burst requests, --burst-at-once of them in flight (default all),
   more than the sessions and queue hold, to show refusals counted. The server's resident memory
   (VmRSS) is printed before the first round and after each: flat after, when nothing leaks.
5. --json-schema N: N requests (--parallel at a time, not streamed, sampled with a seed each) whose
   response_format is a JSON schema; the share of answers that parse and validate (jsonschema).
6. SIGTERM; the server must exit 0.

--llama-server PATH (benchmarks/build_llama_tools.sh builds it): llama.cpp's server beside ours, on another
free loopback port, with the same GGUF file, --parallel slots, --ctx cells per slot (its -c is the total,
so --ctx times --parallel) and --threads. Both warmed as in 2; then --turns rounds, each running every count
of clients on the two engines in turns (the first engine alternating), with the same requests as 3, so the
host's drift falls on every engine and count of clients alike. Printed: each
engine's table (tok/s the median of its turns, with the range), and at each client count the ratio of our
aggregate tok/s to llama-server's and each engine's own ratio to its one-client figure. Bursts and
structured requests (4, 5) run on `framework serve` alone, after the turns.

Every request ends as answered (a finish_reason and [DONE]), refused (an HTTP status, counted by code)
or lost (anything else: a reset, a cut stream). Lost must be zero, and every refusal must be one
docs/serve.md documents (429 `queue_full` with Retry-After; 503 `shutting_down`). It stops by itself.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

PROMPT = "Why is the sky blue?"
FILLER = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old oak tree near the river "
          "bank and children play with a red ball on the green grass under a bright summer sky full of white "
          "clouds that drift slowly toward the distant blue mountains where snow still covers the highest peaks "
          "and a narrow path winds between tall pine trees past a quiet lake and a wooden cabin").split()
_serial = itertools.count()


def prompt_of(args) -> str:
    """The request's prompt: --prompt, or with --distinct-prompts one no other request of the run sends."""
    if not args.distinct_prompts:
        return args.prompt
    n = next(_serial)
    words = (FILLER * 2)[:(n * 37) % 97 + 1]
    return f"Note {n}: {' '.join(words)}. {args.prompt}"


FRAMEWORK = [sys.executable, "-c", "import sys; from framework.cli import main; sys.exit(main(sys.argv[1:]))"]


@dataclass
class Result:
    status: int = 0
    ttft: float | None = None
    tpot: float | None = None
    tokens: int = 0
    lost: str | None = None
    code: str | None = None            # a refusal's error code
    retry_after: str | None = None     # a refusal's Retry-After header
    valid: bool | None = None          # a structured answer: it parsed and validated
    finish: str | None = None

    def documented(self) -> bool:
        """The status is one docs/serve.md gives for this load: answered, queue full, or shutting down."""
        return (self.status == 200 or (self.status == 429 and self.code == "queue_full"
                                       and (self.retry_after or "").isdigit())
                or (self.status == 503 and self.code == "shutting_down"))


@dataclass
class Phase:
    name: str
    results: list[Result] = field(default_factory=list)
    seconds: float = 0.0
    device_s: float | None = None      # framework serve: its devices' seconds on the phase's steps (/metrics)

    def answered(self) -> list[Result]:
        return [r for r in self.results if r.status == 200 and r.lost is None]

    def refused(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for r in self.results:
            if r.status not in (0, 200):
                out[r.status] = out.get(r.status, 0) + 1
        return out

    def lost(self) -> list[Result]:
        return [r for r in self.results if r.lost is not None]

    def undocumented(self) -> list[Result]:
        return [r for r in self.results if r.lost is None and not r.documented()]

    def tokens_per_second(self) -> float:
        return sum(r.tokens for r in self.answered()) / self.seconds if self.seconds else 0.0


def pct(values: list[float], q: float) -> float:
    """The q-th percentile, nearest rank (p99 of a few requests is their maximum)."""
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


# -- framework run -------------------------------------------------------------------------------------
SUMMARY = re.compile(r"prefill (\d+) tokens at ([\d.]+) tok/s, decode (\d+) tokens at ([\d.]+) tok/s")


def run_baseline(args, prefill: list[float], decode: list[float]) -> dict:
    for _ in range(args.repeats):
        cmd = FRAMEWORK + ["run", args.prompt, "--chat", "-m", str(model_file(args.model)),
               "--backends", args.backends, "-n", str(args.max_tokens), "--ctx", str(args.ctx)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=_env())
        m = SUMMARY.search(p.stderr)
        if p.returncode != 0 or not m:
            sys.exit(f"framework run failed ({p.returncode}): {p.stderr[-2000:]}")
        n_pre, pre_tps, dec_tps = int(m[1]), float(m[2]), float(m[4])
        prefill.append(n_pre / pre_tps)
        decode.append(1 / dec_tps)
    return {"prefill_s": statistics.median(prefill), "decode_s": statistics.median(decode), "n_prompt": n_pre,
            "runs": len(prefill)}


def warm_baseline(args, prefill: list[float], decode: list[float]) -> None:
    """`framework run`'s own loop (Session and generate, the chat prompt, greedy) in this process, --repeats
    rounds after one that is not counted: prefill and decode warm, as the server runs them after its
    warm-up. A fresh `framework run` times its first prefill, which also pays first-call costs."""
    from framework.terminal import select_devices
    from framework.model.chat import chat_prompt_ids, chat_template_for
    from framework.model.model import Model
    from framework.runtime.generate import generate
    from framework.runtime.sampling import Sampler, SamplingParams
    from framework.runtime.session import Session, StepStats
    model = Model(model_file(args.model))
    template, _ = chat_template_for(model.file.metadata, model.arch.name)
    ids = chat_prompt_ids(model.tokenizer, template, [{"role": "user", "content": args.prompt}])
    session = Session(model, select_devices(args.backends), n_ctx=args.ctx)
    session.reserve(len(ids), args.max_tokens)
    session.plan(len(ids), 0)
    session.plan(1, len(ids))
    for round_ in range(args.repeats + 1):
        session.reset()
        session.prefill, session.decode = StepStats(), StepStats()
        for _ in generate(session, ids, args.max_tokens, Sampler(SamplingParams()), model.tokenizer.eog_ids):
            pass
        if round_:
            prefill.append(session.prefill.seconds)
            decode.append(session.decode.seconds / session.decode.tokens)


# -- framework serve -----------------------------------------------------------------------------------
def _env() -> dict:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args, port: int, log) -> subprocess.Popen:
    cmd = FRAMEWORK + ["serve", "-m", args.model, "--backends", args.backends,
           "--host", "127.0.0.1", "--port", str(port), "--parallel", str(args.parallel), "--queue", str(args.queue),
           "--ctx", str(args.ctx)] + (["--threads", str(args.threads)] if args.threads else [])
    return wait_ready(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=_env()), port, log,
                      "framework serve")


def start_llama_server(args, port: int, log) -> subprocess.Popen:
    """llama.cpp's server on the same file: --parallel slots of --ctx cells each (its -c is all slots' cells
    together), --threads for decode and prompt alike, no web UI."""
    cmd = [args.llama_server, "-m", str(model_file(args.model)), "--host", "127.0.0.1", "--port", str(port),
           "--parallel", str(args.parallel), "-c", str(args.ctx * args.parallel), "--threads", str(args.threads),
           "--threads-batch", str(args.threads), "--no-webui"]
    return wait_ready(subprocess.Popen(cmd, stdout=log, stderr=log, env=_env()), port, log, "llama-server")


def wait_ready(proc: subprocess.Popen, port: int, log, name: str) -> subprocess.Popen:
    """The server once its /health answers 200 (llama-server answers 503 while it loads)."""
    end = time.monotonic() + 600
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"{name} exited with {proc.returncode}; its log: {log.name}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return proc
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"{name} was not ready within 600 s; its log: {log.name}")


def model_file(spec: str) -> Path:
    from framework.model.default import MODELS, model_path
    return model_path(spec) if spec in MODELS else Path(spec)


def model_id(spec: str) -> str:
    return spec if not spec.endswith(".gguf") else Path(spec).name.removesuffix(".gguf")


def one_request(port: int, args, _index: int = 0) -> Result:
    """One streamed chat request, read chunk by chunk with the clock running."""
    body = json.dumps({"model": model_id(args.model), "messages": [{"role": "user", "content": prompt_of(args)}],
                       "max_tokens": args.max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    res = Result()
    try:
        t0 = time.perf_counter()
        conn, r = post_chat(port, body, res)
        if r is None:
            return res
        first = last = None
        finished = done = False
        for line in r:
            if not line.startswith(b"data: "):
                continue
            data = line[6:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if chunk.get("usage"):
                res.tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    last = time.perf_counter()
                    first = first or last
                finished = finished or choice.get("finish_reason") is not None
        conn.close()
        if not (done and finished and first is not None):
            res.lost = f"stream ended without {'[DONE]' if not done else 'a finish_reason or text'}"
            return res
        res.ttft = first - t0
        res.tpot = (last - first) / (res.tokens - 1) if res.tokens > 1 else None
    except (OSError, http.client.HTTPException, ValueError) as e:
        res.lost = f"{type(e).__name__}: {e}"
    return res


def post_chat(port: int, body: str, res: Result):
    """Send a chat request; (connection, response), or (connection, None) when it was refused (res then holds
    its status, error code and Retry-After)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    res.status = r.status
    if r.status != 200:
        refused(res, r)
        return conn, None
    return conn, r


def refused(res: Result, r: http.client.HTTPResponse) -> None:
    """A refusal's error code and Retry-After, to check them against the documented ones."""
    res.retry_after = r.getheader("Retry-After")
    try:
        res.code = json.loads(r.read())["error"]["code"]
    except (ValueError, KeyError, TypeError):
        res.code = None


SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 24},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "colours": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}},
    "required": ["name", "age", "colours"], "additionalProperties": False}


def structured_request(port: int, args, seed: int) -> Result:
    """One chat request whose answer must follow SCHEMA, sampled (temperature 1, its own seed)."""
    import jsonschema
    body = json.dumps({"model": model_id(args.model), "max_tokens": args.schema_tokens, "seed": seed,
                       "messages": [{"role": "user", "content": "Describe a person as JSON."}],
                       "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}})
    res = Result()
    try:
        conn, r = post_chat(port, body, res)
        if r is None:
            return res
        reply = json.loads(r.read())
        conn.close()
        res.tokens, res.finish = reply["usage"]["completion_tokens"], reply["choices"][0]["finish_reason"]
        try:
            jsonschema.validate(json.loads(reply["choices"][0]["message"]["content"]), SCHEMA)
            res.valid = True
        except (ValueError, jsonschema.ValidationError):
            res.valid = False
    except (OSError, http.client.HTTPException, ValueError) as e:
        res.lost = f"{type(e).__name__}: {e}"
    return res


def device_seconds(port: int) -> float:
    """framework serve's framework_device_seconds_total summed over models and devices: the time its devices
    spent in the model's steps (docs/serve.md, /metrics)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("framework_device_seconds_total{"))


def serve_phase(port: int, args, name: str, clients: int, requests: int) -> Phase:
    """run_phase on framework serve, with the seconds its devices spent on the phase's steps (step_share)."""
    before = device_seconds(port)
    phase = run_phase(port, args, name, clients, requests)
    phase.device_s = device_seconds(port) - before
    return phase


def step_share(phases: list[Phase]) -> str:
    """How much of these phases' wall time the devices spent on steps, and the time outside the steps per
    generated token: the server's own work (HTTP, tokenizing, scheduling, sampling, the hand-off to the
    event loop, the stream) and the client's, an upper bound of the server's cost."""
    tokens = sum(r.tokens for p in phases for r in p.answered())
    wall, device = sum(p.seconds for p in phases), sum(p.device_s for p in phases)
    outside = (wall - device) / tokens * 1000 if tokens else float("nan")
    return (f"the devices' steps {device:.2f} s of {wall:.2f} s ({100 * device / wall:.0f}%, "
            f"framework_device_seconds_total); outside them {outside:.2f} ms a generated token")


def rss_mib(pid: int) -> float:
    """A process's resident memory (Linux's /proc/PID/status VmRSS), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_phase(port: int, args, name: str, clients: int, requests: int, together: bool = False,
              send=one_request) -> Phase:
    """`requests` requests over `clients` threads; together: all at once, one each. send(port, args, i):
    the i-th request."""
    phase = Phase(name)
    left = [requests]
    lock = threading.Lock()

    def client():
        while True:
            with lock:
                if left[0] == 0:
                    return
                left[0] -= 1
                i = left[0]
            r = send(port, args, i)
            with lock:
                phase.results.append(r)
            if together:
                return

    threads = [threading.Thread(target=client) for _ in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    phase.seconds = time.perf_counter() - t0
    return phase


def report(phases: list[Phase], base: dict | None, args) -> int:
    """The table of phases (with ratios to `framework run` when it ran), then the summary: 1 when any request
    was lost or refused otherwise than documented."""
    if base is not None:
        return _report_against(phases, base, args)
    ms = lambda s: f"{s * 1000:.0f}"     # noqa: E731
    print("\n| phase | answered | refused | lost | tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in phases:
        ok = p.answered()
        ttft, tpot = [r.ttft for r in ok if r.ttft is not None], [r.tpot for r in ok if r.tpot is not None]
        refused = ", ".join(f"{n}x{code}" for code, n in sorted(p.refused().items())) or "0"
        print(f"| {p.name} | {len(ok)} | {refused} | {len(p.lost())} | {p.tokens_per_second():.1f} | "
              f"{ms(pct(ttft, 50))} ms | {ms(pct(ttft, 99))} ms | {ms(pct(tpot, 50))} ms | {ms(pct(tpot, 99))} ms |")
    return summary(phases)


def summary(phases: list[Phase]) -> int:
    """Lost and undocumented requests, structured answers' validity: 1 when anything was lost or undocumented."""
    lost = sum(len(p.lost()) for p in phases)
    odd = [r for p in phases for r in p.undocumented()]
    for p in phases:
        for r in p.lost():
            print(f"lost in {p.name}: {r.lost}")
    for r in odd:
        print(f"undocumented: status {r.status}, code {r.code}, Retry-After {r.retry_after}")
    for p in phases:
        checked = [r for r in p.answered() if r.valid is not None]
        if checked:
            valid = sum(r.valid for r in checked)
            cut = sum(r.finish == "length" for r in checked)
            print(f"{p.name}: {valid} of {len(checked)} answers valid against the schema "
                  f"({100 * valid / len(checked):.1f}%); {cut} cut by max_tokens")
    for p in phases:
        if p.device_s is not None and not p.name.startswith("framework serve"):     # turns: report_turns says it
            print(f"{p.name}: {step_share([p])}")
    print(f"lost requests: {lost}; refusals not as documented: {len(odd)}")
    return 1 if lost or odd else 0


def _report_against(phases: list[Phase], base: dict, args) -> int:
    ms = lambda s: f"{s * 1000:.0f}"     # noqa: E731
    print(f"\nframework run (median of {base['runs']}, half before the server and half after): prefill of "
          f"{base['n_prompt']} tokens {ms(base['prefill_s'])} ms, decode {ms(base['decode_s'])} ms/token "
          f"({1 / base['decode_s']:.1f} tok/s)\n")
    print(f"the same loop warm in this process (median of {2 * args.repeats}): prefill "
          f"{ms(base['warm_prefill_s'])} ms, decode {ms(base['warm_decode_s'])} ms/token "
          f"({1 / base['warm_decode_s']:.1f} tok/s)\n")
    print("| phase | answered | refused | lost | tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 | "
          "TTFT p50 / prefill (run, warm) | TPOT p50 / decode (run, warm) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for p in phases:
        ok = p.answered()
        ttft = [r.ttft for r in ok if r.ttft is not None]
        tpot = [r.tpot for r in ok if r.tpot is not None]
        refused = ", ".join(f"{n}x{code}" for code, n in sorted(p.refused().items())) or "0"
        print(f"| {p.name} | {len(ok)} | {refused} | {len(p.lost())} | {p.tokens_per_second():.1f} | "
              f"{ms(pct(ttft, 50))} ms | {ms(pct(ttft, 99))} ms | {ms(pct(tpot, 50))} ms | {ms(pct(tpot, 99))} ms | "
              f"{pct(ttft, 50) / base['prefill_s']:.2f}, {pct(ttft, 50) / base['warm_prefill_s']:.2f} | "
              f"{pct(tpot, 50) / base['decode_s']:.2f}, {pct(tpot, 50) / base['warm_decode_s']:.2f} |")
    one = next((p for p in phases if p.name == "1 client"), None)
    for p in phases:                   # batched steps: every client's decode row in one step
        if one and p is not one and p.name.endswith("clients") and one.tokens_per_second():
            print(f"\naggregate tok/s, {p.name} against 1: {p.tokens_per_second() / one.tokens_per_second():.2f}")
    return summary(phases)


# -- llama-server beside framework serve ------------------------------------------------------------------
def take_turns(args, ports: dict[str, int]) -> dict[str, dict[int, list[Phase]]]:
    """--turns rounds, each a phase of every count of clients and every engine, one engine after the other (the
    first one alternating): a shared host's drift falls on both engines and on every count of clients alike (the
    ratio to one client compares phases of each round, not phases minutes apart). {engine: {clients: [phase per
    turn]}}."""
    turns: dict[str, dict[int, list[Phase]]] = {engine: {} for engine in ports}
    for t in range(args.turns):
        for c in (int(x) for x in args.clients.split(",") if x):
            for engine in (list(ports) if t % 2 == 0 else list(ports)[::-1]):
                say(f"{engine}: {c} clients, {args.requests} requests, turn {t + 1} of {args.turns}")
                name = f"{engine}, {c} client{'s' if c > 1 else ''}, turn {t + 1}"
                phase = (serve_phase if engine == "framework serve" else run_phase)(ports[engine], args, name, c,
                                                                                    args.requests)
                turns[engine].setdefault(c, []).append(phase)
    return turns


def beside_llama_server(args, port: int, log_path: Path) -> tuple[dict, int]:
    """llama-server started and warmed beside the running `framework serve`, the two taking turns, then
    llama-server stopped: (the turns, its exit status after SIGTERM)."""
    llama_port = free_port()
    with log_path.open("w") as log:
        llama = start_llama_server(args, llama_port, log)
        try:
            run_phase(llama_port, args, "warm-up", args.parallel, args.parallel, together=True)
            turns = take_turns(args, {"framework serve": port, "llama-server": llama_port})
        finally:
            llama.send_signal(signal.SIGTERM)
            code = llama.wait(timeout=120)
    return turns, code


def report_turns(turns: dict[str, dict[int, list[Phase]]], args) -> None:
    """Each engine's table, then the ratios between the engines and to each one's single client."""
    ms = lambda s: f"{s * 1000:.0f}"     # noqa: E731
    median_tps = {e: {c: statistics.median(p.tokens_per_second() for p in ps) for c, ps in by.items()}
                  for e, by in turns.items()}
    for engine, by in turns.items():
        print(f"\n{engine} (tok/s: the median of {args.turns} turns, with the range; TTFT and TPOT over every "
              f"request of the turns)\n")
        print("| clients | answered | lost | tokens a request | tok/s | TTFT p50 | TTFT p99 | TPOT p50 | TPOT p99 |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for c, phases in by.items():
            ok = [r for p in phases for r in p.answered()]
            ttft, tpot = [r.ttft for r in ok if r.ttft is not None], [r.tpot for r in ok if r.tpot is not None]
            tps = [p.tokens_per_second() for p in phases]
            tokens = statistics.mean(r.tokens for r in ok) if ok else 0.0
            print(f"| {c} | {len(ok)} | {sum(len(p.lost()) for p in phases)} | {tokens:.1f} | "
                  f"{median_tps[engine][c]:.1f} ({min(tps):.1f} to {max(tps):.1f}) | {ms(pct(ttft, 50))} ms | "
                  f"{ms(pct(ttft, 99))} ms | {ms(pct(tpot, 50))} ms | {ms(pct(tpot, 99))} ms |")
    print()
    for c, phases in turns["framework serve"].items():
        print(f"framework serve, {c} client{'s' if c > 1 else ''}: {step_share(phases)}")
    ours, theirs = median_tps["framework serve"], median_tps["llama-server"]
    first = min(ours)
    print(f"\n| clients | framework serve tok/s | llama-server tok/s | framework / llama-server | framework, against "
          f"{first} client | llama-server, against {first} client |")
    print("| --- | --- | --- | --- | --- | --- |")
    for c in ours:
        print(f"| {c} | {ours[c]:.1f} | {theirs[c]:.1f} | {ours[c] / theirs[c]:.2f}x | "
              f"{ours[c] / ours[first]:.2f}x | {theirs[c] / theirs[first]:.2f}x |")
    print()
    for engine, by in turns.items():     # each round's own ratios: phases of one round, minutes apart at most
        for c in (c for c in by if c != first):
            each = [p.tokens_per_second() / q.tokens_per_second() for p, q in zip(by[c], by[first])
                    if q.tokens_per_second()]
            print(f"{engine}, {c} clients against {first}, round by round: "
                  + ", ".join(f"{r:.2f}x" for r in each))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--backends", default="cpu")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--distinct-prompts", action="store_true",
                    help="every request its own prompt, of 1 to 97 words more than --prompt (no shared prefix)")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--queue", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--clients", default="1,2,4", help="comma-separated client counts, one phase each")
    ap.add_argument("--requests", type=int, default=8, help="requests per phase")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--burst", type=int, default=8, help="requests of the burst phase (0: none)")
    ap.add_argument("--burst-at-once", type=int, default=None, help="burst requests in flight at a time "
                    "(default: all of them)")
    ap.add_argument("--burst-rounds", type=int, default=1, help="bursts, one after another (memory after each)")
    ap.add_argument("--json-schema", type=int, default=0, help="structured requests after the bursts (0: none)")
    ap.add_argument("--schema-tokens", type=int, default=64, help="max_tokens of a structured request")
    ap.add_argument("--repeats", type=int, default=3, help="runs of `framework run` for its medians")
    ap.add_argument("--threads", type=int, help="threads of framework serve (-t) and of llama-server (default: "
                    "framework serve's own; with --llama-server, this machine's CPUs for both)")
    ap.add_argument("--llama-server", metavar="PATH", help="llama.cpp's llama-server binary, to run beside "
                    "framework serve on the client phases (benchmarks/build_llama_tools.sh builds it)")
    ap.add_argument("--turns", type=int, default=3, help="with --llama-server: phases of each engine per client "
                    "count, taking turns (default 3)")
    args = ap.parse_args()
    if args.llama_server and not args.threads:
        args.threads = os.cpu_count()      # both engines the same threads, said in the output

    prefill, decode, warm_pre, warm_dec = [], [], [], []
    if args.repeats:
        say("framework run, and its loop warm in this process")
        run_baseline(args, prefill, decode)         # before the server, and again after it: a shared host drifts
        warm_baseline(args, warm_pre, warm_dec)
    port = free_port()
    log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"serve_load_{port}.log"
    turns, llama_code = None, None
    with log_path.open("w") as log:
        proc = start_server(args, port, log)
        try:
            run_phase(port, args, "warm-up", args.parallel, args.parallel, together=True)
            phases = []
            if args.llama_server:
                turns, llama_code = beside_llama_server(args, port, log_path.with_name("llama_server.log"))
            else:
                for c in (int(x) for x in args.clients.split(",") if x):
                    say(f"{c} clients, {args.requests} requests")
                    phases.append(serve_phase(port, args, f"{c} client{'s' if c > 1 else ''}", c, args.requests))
            memory = [("before the bursts", rss_mib(proc.pid))]
            for round_ in range(1, args.burst_rounds + 1 if args.burst else 1):
                at_once = args.burst_at_once or args.burst
                say(f"a burst of {args.burst}, {at_once} at once (round {round_})")
                phases.append(run_phase(port, args, f"burst of {args.burst}, {at_once} at once, round {round_}",
                                        at_once, args.burst))
                memory.append((f"after round {round_}", rss_mib(proc.pid)))
            if args.json_schema:
                say(f"{args.json_schema} json_schema requests, {args.parallel} at a time")
                phases.append(run_phase(port, args, f"{args.json_schema} json_schema", args.parallel,
                                        args.json_schema, send=structured_request))
                memory.append(("after the json_schema requests", rss_mib(proc.pid)))
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
    base = None
    if args.repeats:
        say("framework run again, and its loop warm")
        base = run_baseline(args, prefill, decode)
        warm_baseline(args, warm_pre, warm_dec)
        base.update(warm_prefill_s=statistics.median(warm_pre), warm_decode_s=statistics.median(warm_dec))
    print(f"server: --parallel {args.parallel} --queue {args.queue} --ctx {args.ctx}, {args.max_tokens} tokens a "
          f"request, greedy; exited with {code} after SIGTERM")
    print("server's resident memory (VmRSS): " + ", ".join(f"{what} {mib:.0f} MiB" for what, mib in memory))
    if turns is not None:
        print(f"llama-server {args.llama_server}: --parallel {args.parallel} -c {args.ctx * args.parallel}, "
              f"{args.threads} threads as framework serve; exited with {llama_code} after SIGTERM")
        report_turns(turns, args)
        phases = [p for by in turns.values() for ps in by.values() for p in ps] + phases
    return report(phases, base, args) or (1 if code or llama_code else 0)


if __name__ == "__main__":
    sys.exit(main())
