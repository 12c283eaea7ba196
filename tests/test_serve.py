"""`framework serve` through the real openai client, against a server this file starts on loopback.

One server for the file (SmolLM2, 2 sessions, a queue of 1, an API key), started as `framework serve` in
a subprocess on a free port; the last test stops it with SIGTERM. Generations are a few tokens long.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from conftest import load_model, model_path

from framework.cli import main
from framework.contract import Limits, Verdict
from framework.core.scheduler import CapabilityError, check_together
from framework.plugins.cpu.device import CpuDevice
from framework.runtime.context import Context
from framework.runtime.session import Session
from framework.serve.models import load_models

KEY = "test-key"
CHAT_PROMPT = "Why is the sky blue?"
FRAMEWORK = [sys.executable, "-c", "import sys; from framework.cli import main; sys.exit(main(sys.argv[1:]))"]
TEXT_PROMPT = "The capital of France is"


class Server:
    def __init__(self, port: int, proc: subprocess.Popen, log):
        self.port, self.proc, self.log = port, proc, log
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=120)

    def raw(self, method: str, path: str, body=None, headers=None, key: bool = True):
        """(status, headers, parsed body) of one plain HTTP request."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {KEY}"} if key else {}),
             **(headers or {})}
        conn.request(method, path, body=data, headers=h)
        r = conn.getresponse()
        payload = r.read()
        conn.close()
        return r.status, dict(r.getheaders()), json.loads(payload) if payload else None

    def open_stream(self, max_tokens: int) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A streaming chat request whose first chunk has arrived (so it holds a session)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        body = {"model": "smollm2", "messages": [{"role": "user", "content": CHAT_PROMPT}],
                "max_tokens": max_tokens, "temperature": 0, "stream": True}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        r = conn.getresponse()
        assert r.status == 200
        assert r.readline().startswith(b"data: ")
        return conn, r

    def stderr(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def health(self) -> dict:
        return self.raw("GET", "/health")[2]

    def wait_for(self, predicate, what: str, seconds: float = 60) -> dict:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            state = self.health()["models"]["smollm2"]
            if predicate(state):
                return state
            time.sleep(0.05)
        pytest.fail(f"the server's state never showed {what}: {self.health()}")


def _drop(conn: http.client.HTTPConnection) -> None:
    """Go away mid-stream, as a client that is closed or crashes does."""
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(tmp_path_factory, args: list[str], env: dict[str, str]) -> Server:
    """`framework serve -m smollm2 --ctx 512 ARGS` on a free loopback port, once /health says it is ready."""
    port = _free_port()
    log = (tmp_path_factory.mktemp("serve") / "stderr.txt").open("w+")
    cmd = FRAMEWORK + ["serve", "-m", "smollm2", "--ctx", "512", "--port", str(port)] + args
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
    srv = Server(port, proc, log)
    end = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"framework serve exited with {proc.returncode} before it was ready: {srv.stderr()}")
        try:
            status, _, body = srv.raw("GET", "/health")
            if status == 200:
                break
            assert status == 503 and body["status"] == "loading"
        except OSError:
            pass                         # the port is not open yet: reservation comes first
        if time.monotonic() > end:
            proc.kill()
            pytest.fail("framework serve was not ready within 180 s")
        time.sleep(0.2)
    return srv


def stop_server(srv: Server) -> None:
    if srv.proc.poll() is None:
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(timeout=60)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory, ["--parallel", "2", "--queue", "1", "--api-key", KEY], os.environ.copy())
    yield srv
    stop_server(srv)


N_GREEDY = 12


@pytest.fixture(scope="module")
def greedy_stream(server):
    """The server's greedy chat answer, streamed with usage: (headers, chunks)."""
    with server.client.chat.completions.with_streaming_response.create(
            model="smollm2", messages=[{"role": "user", "content": CHAT_PROMPT}], max_tokens=N_GREEDY,
            temperature=0, stream=True, stream_options={"include_usage": True}) as response:
        return response.headers, list(response.parse())


@pytest.fixture(scope="module")
def greedy(greedy_stream):
    """Its text, a piece per token (every token of this answer is whole characters)."""
    return [c.choices[0].delta.content for c in greedy_stream[1] if c.choices and c.choices[0].delta.content]


def _chat(server, **kw):
    return server.client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": CHAT_PROMPT}],
                                                 temperature=0, **kw)


def _cli_run(capsys, prompt: str, n: int, chat: bool) -> str:
    code = main(["run", prompt, "-m", str(model_path("smollm2")), "-n", str(n), "--ctx", "512"]
                + (["--chat"] if chat else []))
    out = capsys.readouterr().out
    assert code == 0
    return out[:-1]                         # run ends its output with a newline


# -- models, health, the answers and where they ran --------------------------------------------------------
def test_models_lists_what_is_loaded_with_its_sha256_and_devices(server):
    models = server.client.models.list().data
    assert [m.id for m in models] == ["smollm2"]
    digest = hashlib.sha256(model_path("smollm2").read_bytes()).hexdigest()
    assert models[0].sha256 == digest and models[0].devices == ["cpu"]
    assert server.client.models.retrieve("smollm2").context_length == 512
    state = server.health()
    assert state["status"] == "ok" and state["models"]["smollm2"]["sessions"] == 2


def test_chat_greedy_is_framework_runs_answer_and_names_its_devices(server, greedy, capsys):
    expected = _cli_run(capsys, CHAT_PROMPT, N_GREEDY, chat=True)
    raw = server.client.chat.completions.with_raw_response.create(
        model="smollm2", messages=[{"role": "user", "content": CHAT_PROMPT}], max_tokens=N_GREEDY, temperature=0)
    reply = raw.parse()
    assert reply.choices[0].message.content == expected == "".join(greedy) and len(expected) > 10
    assert reply.model == "smollm2" and reply.object == "chat.completion"
    assert raw.headers["x-framework-devices"] == "cpu" and reply.devices == ["cpu"]
    assert raw.headers["x-framework-model"].endswith(server.client.models.retrieve("smollm2").sha256)
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == N_GREEDY
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + N_GREEDY


def test_completion_greedy_is_framework_runs_answer_streamed_or_not(server, capsys):
    expected = _cli_run(capsys, TEXT_PROMPT, 6, chat=False)
    reply = server.client.completions.create(model="smollm2", prompt=TEXT_PROMPT, max_tokens=6, temperature=0)
    assert TEXT_PROMPT + reply.choices[0].text == expected
    ids = load_model("smollm2").tokenizer.encode(TEXT_PROMPT)
    assert reply.usage.prompt_tokens == len(ids) and reply.devices == ["cpu"] and reply.model == "smollm2"
    pieces = list(server.client.completions.create(model="smollm2", prompt=ids, max_tokens=6, temperature=0,
                                                   stream=True))
    assert all(p.object == "text_completion" and p.model == "smollm2" for p in pieces)
    assert "".join(p.choices[0].text for p in pieces) == reply.choices[0].text
    assert pieces[-1].choices[0].finish_reason == "length"


def test_chat_streams_are_openais_chunks_with_usage_last(greedy_stream):
    headers, chunks = greedy_stream
    assert headers["x-framework-devices"] == "cpu" and headers["content-type"].startswith("text/event-stream")
    assert all(c.object == "chat.completion.chunk" and c.model == "smollm2" for c in chunks)
    assert len({c.id for c in chunks}) == 1 and chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-2])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == N_GREEDY


# -- stop strings ------------------------------------------------------------------------------------------
def test_a_stop_string_split_across_two_tokens_never_appears(server, greedy):
    full = "".join(greedy)
    for i in range(1, len(greedy) - 1):
        at = len("".join(greedy[:i]))
        stop = greedy[i - 1][-2:] + greedy[i][:2]
        if full.find(stop) == at - len(greedy[i - 1][-2:]) and stop.strip():
            break
    else:
        pytest.fail(f"no token boundary to split a stop string over in {greedy}")
    expected = full[:full.find(stop)]
    reply = _chat(server, max_tokens=N_GREEDY, stop=stop)
    assert reply.choices[0].message.content == expected and reply.choices[0].finish_reason == "stop"
    streamed = [c.choices[0] for c in _chat(server, max_tokens=N_GREEDY, stop=[stop, "never-seen-x"], stream=True)]
    assert "".join(c.delta.content or "" for c in streamed) == expected
    assert streamed[-1].finish_reason == "stop"


def test_text_that_might_begin_a_stop_string_is_held_back_then_sent(server, greedy):
    full = "".join(greedy)
    stops = [greedy[3] + "\u2603", greedy[-1] + "\u2603"]      # each begins like the text, then parts from it
    streamed = [c.choices[0] for c in _chat(server, max_tokens=N_GREEDY, stop=stops, stream=True)]
    pieces = [c.delta.content for c in streamed if c.delta.content]
    assert "".join(pieces) == full and streamed[-1].finish_reason == "length"
    assert len(pieces) < len(greedy)        # some pieces were held and went out together with the next


def test_stop_filter_holds_only_what_could_still_become_a_stop_string():
    from framework.serve.stops import StopFilter
    f = StopFilter(["abc", "bcd"])
    assert [f.feed(t) for t in ["xa", "b", "d"]] == ["x", "", "abd"] and not f.stopped
    assert [f.feed(t) for t in ["xab", "cd"]] == ["x", ""] and f.stopped              # the earliest stop cuts
    f = StopFilter(["</s>"])
    assert [f.feed(t) for t in ["a <", "/", "x"]] == ["a ", "", "</x"] and not f.stopped
    assert f.feed("y</") == "y" and f.flush() == "</"                                # the end releases it
    f = StopFilter(["\n\n"])
    assert f.feed("\n\nrest") == "" and f.stopped and f.feed("more") == ""


# -- refusals ----------------------------------------------------------------------------------------------
def test_an_unknown_model_is_404_listing_the_served_ids(server):
    with pytest.raises(openai.NotFoundError) as e:
        server.client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert e.value.code == "model_not_found" and "smollm2" in e.value.message
    assert e.value.body["available"] == ["smollm2"]
    with pytest.raises(openai.NotFoundError):
        server.client.models.retrieve("SmolLM2-135M-Instruct.Q4_1")


@pytest.mark.parametrize("body, words", [
    (b'{"model": "smollm2", "messages": [', "not valid JSON"),
    ({"model": "smollm2", "messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
    ({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    ({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "temperature": 2.5}, "less than or equal"),
    ({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "stop": list("abcde")}, "1 to 4"),
    ({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "n": 2}, "'n' is not supported"),
    ({"model": "smollm2", "messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}]}, "'model' is required"),
    ({"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}, "context of 512"),
])
def test_bad_requests_are_400_with_a_sentence(server, body, words):
    status, _, reply = server.raw("POST", "/v1/chat/completions", body)
    assert status == 400, reply
    assert words in reply["error"]["message"] and "Traceback" not in reply["error"]["message"]


def test_an_empty_prompt_is_400_not_a_crash(server):
    """SmolLM2 adds no BOS: an empty prompt gives no token to start from (the CLI names it the same way)."""
    status, _, reply = server.raw("POST", "/v1/completions", {"model": "smollm2", "prompt": ""})
    assert status == 400 and "the prompt is empty" in reply["error"]["message"], reply
    assert reply["error"]["param"] == "prompt"
    assert server.health()["status"] == "ok"               # and the server goes on


def test_keys_body_size_and_routes_are_refused_in_words(server):
    status, headers, reply = server.raw("GET", "/v1/models", key=False)
    assert status == 401 and reply["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.client.base_url, api_key="wrong", max_retries=0).models.list()
    status, _, reply = server.raw("POST", "/v1/completions", b"x" * (1 << 21))
    assert status == 413 and "1048576 bytes" in reply["error"]["message"]
    status, _, reply = server.raw("POST", "/v1/completions", {"model": "smollm2", "prompt": "x" * 4000})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    assert reply["error"]["context_length"] == 512 and str(reply["error"]["prompt_tokens"]) in reply["error"]["message"]
    assert server.raw("GET", "/v1/chat/completions")[0] == 405


# -- sessions, queue, disconnects, concurrency -------------------------------------------------------------
def test_a_client_that_disconnects_frees_its_session(server):
    for stream in (True, False):
        before = server.health()["models"]["smollm2"]
        if stream:
            conn, _ = server.open_stream(max_tokens=400)
        else:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
            conn.request("POST", "/v1/completions", body=json.dumps(
                {"model": "smollm2", "prompt": TEXT_PROMPT, "max_tokens": 400, "temperature": 0}),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"})
        server.wait_for(lambda s: s["busy"] == 1, "one busy session")
        _drop(conn)
        after = server.wait_for(lambda s: s["busy"] == 0, "the session given back")
        assert after["cancelled"] == before["cancelled"] + 1 and after["answered"] == before["answered"], stream
        assert after["batched"]["active"] == 0, stream          # its cells freed at once, no step needed
    assert _chat(server, max_tokens=2).choices[0].finish_reason == "length"      # and it serves again


def test_a_full_queue_is_429_with_retry_after(server):
    streams = [server.open_stream(max_tokens=400) for _ in range(2)]
    server.wait_for(lambda s: s["busy"] == 2, "both sessions busy")
    waiting: dict = {}
    t = threading.Thread(target=lambda: waiting.update(reply=_chat(server, max_tokens=2)))
    t.start()
    server.wait_for(lambda s: s["queued"] == 1, "one request queued")
    status, headers, reply = server.raw("POST", "/v1/chat/completions", {
        "model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert status == 429 and int(headers["retry-after"]) >= 1 and reply["error"]["code"] == "queue_full"
    for conn, _ in streams:
        _drop(conn)
    t.join(timeout=120)
    assert waiting["reply"].choices[0].finish_reason == "length"
    assert server.health()["models"]["smollm2"]["refused"]["429"] >= 1


def test_concurrent_clients_each_get_their_own_answer(server):
    prompts = ["Name a colour.", "Count to three.", CHAT_PROMPT]
    alone = [server.client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": p}],
                                                   max_tokens=4, temperature=0).choices[0].message.content
             for p in prompts]
    together: dict[int, str] = {}

    def ask(i):
        together[i] = server.client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": prompts[i]}], max_tokens=4,
            temperature=0).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]   # 2 sessions and 1 queued
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [together[i] for i in range(3)] == alone


def test_concurrent_requests_join_one_batched_step_and_answer_as_they_do_alone(server):
    """Continuous batching: two requests at once share steps (fewer steps than the two alone took), and
    each greedy answer is the one it gets alone."""
    prompts = ["Write a short poem about rain.", "What is the capital of France? Explain briefly."]

    def ask(prompt):
        reply = server.client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": prompt}], max_tokens=16, temperature=0)
        return reply.choices[0].message.content

    def steps():
        return server.health()["models"]["smollm2"]["batched"]["steps"]

    start = steps()
    alone = [ask(p) for p in prompts]
    middle = steps()
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(ask, prompts))
    state = server.health()["models"]["smollm2"]["batched"]
    assert together == alone
    assert state["widest"] >= 2 and state["steps"] - middle < middle - start, (start, middle, state)


def test_a_cached_prefix_is_reused_reported_and_answers_as_a_cold_prompt(server):
    """The second request's prompt comes from the prefix cache (the first one's whole blocks of 16 of the tokens
    it fed, all but the last prompt token); cache_prompt false (llama-server's field) computes them all again;
    the greedy text is the same all three times."""
    prompt = ("The lighthouse keeper counted the ships that passed each night, writing their names in a "
              "blue notebook that his grandmother had given him, and on the last page he wrote")

    def ask(**extra):
        reply = server.client.completions.create(model="smollm2", prompt=prompt, max_tokens=8, temperature=0,
                                                 extra_body=extra)
        return reply.choices[0].text, reply.usage.prompt_tokens, reply.usage.prompt_tokens_details.cached_tokens

    text, n_prompt, cached = ask()
    assert cached == 0 and n_prompt >= 32
    again, _, reused = ask()
    cold, _, none = ask(cache_prompt=False)
    assert again == cold == text
    assert reused == min(n_prompt - 1, (n_prompt + 7) // 16 * 16) and none == 0      # it fed 7 of its 8 tokens
    assert server.health()["models"]["smollm2"]["batched"]["prefix_cache"]["hits"] >= 1


def test_a_seed_makes_sampling_repeatable(server):
    ask = dict(model="smollm2", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=5,
               temperature=1.0, top_p=0.9, seed=7)
    first = server.client.chat.completions.create(**ask).choices[0].message.content
    assert server.client.chat.completions.create(**ask).choices[0].message.content == first


# -- before the port opens ---------------------------------------------------------------------------------
def test_serve_refuses_to_start_on_an_unknown_model_or_a_repeated_id(capsys):
    assert main(["serve", "-m", "no-such-model.gguf", "--port", "1"]) == 2
    assert "smollm2, gemma3" in capsys.readouterr().err
    assert main(["serve", "-m", "smollm2", "-m", "smollm2", "--port", "1"]) == 2
    assert "given twice" in capsys.readouterr().err


def test_embeddings_without_the_flag_are_400_naming_it(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client.embeddings.create(model="smollm2", input="Hi")
    assert e.value.code == "embeddings_disabled" and "--embeddings" in e.value.message


def test_budgets_count_every_model_and_session_together():
    model = load_model("smollm2")
    from framework.serve.models import reserve_session
    plain = reserve_session(Session(model, [CpuDevice()], n_ctx=512))
    programs, mem = plain.programs["cpu"], plain.memory["cpu"]

    class Tight(CpuDevice):
        limits = Limits(max_live_programs=programs, memory_bytes=mem["total"] + mem["caches"] // 2)

    dev = Tight()
    res = reserve_session(Session(model, [dev], n_ctx=512))
    assert check_together({"a": (res, 1)}, {"cpu": dev})["cpu"]["programs"] == programs
    with pytest.raises(CapabilityError) as e:
        check_together({"a": (res, 1), "b": (res, 1)}, {"cpu": dev})
    assert e.value.code == "program_budget" and "a: " in str(e.value) and "b: " in str(e.value)
    with pytest.raises(CapabilityError) as e:       # a second session's KV cache does not fit
        check_together({"a": (res, 2)}, {"cpu": dev})
    assert e.value.code == "out_of_memory" and "2 sessions" in str(e.value)


class OneRow(CpuDevice):
    """The cpu plugin with kernels for one row only: it refuses every matrix product of a step of more rows
    (a batch of sequences, or a prompt chunk)."""

    name = "onerow"

    def supports_op(self, node):
        if node.op == "MUL_MAT" and node.shape[0] > 1:
            return Verdict.no("one_row_only", f"{self.name} multiplies one row at a time; {node.name} has "
                              f"{node.shape[0]}")
        return super().supports_op(node)


def test_a_plugin_refusing_batched_steps_shows_in_their_plans_or_stops_the_start_naming_itself():
    served = load_models(["smollm2"], [OneRow(), CpuDevice()], n_ctx=64, n_batch=16, parallel=2, max_queue=1)
    plans = {key: plan for key, (plan, _) in served[0].pool.sessions[0].scheduler.session.plans.items()}
    two_rows = next(plan for (rows, _, out), plan in plans.items() if rows == 2 and out == 2)
    products = [(n, p) for n, p in two_rows.fallbacks if n.op == "MUL_MAT"]
    assert products and all(p.device == "cpu" and str(p.refusals["onerow"]).startswith("one_row_only: onerow "
                                                                                        "multiplies one row")
                            for _, p in products)
    one_row = next(plan for (rows, _, _), plan in plans.items() if rows == 1)
    assert not one_row.fallbacks and one_row.per_device()["onerow"]["nodes"]
    with pytest.raises(CapabilityError) as e:            # no device after it: the start stops, naming it
        load_models(["smollm2"], [OneRow()], n_ctx=64, n_batch=16, parallel=2, max_queue=1)
    assert "onerow" in str(e.value) and "one row at a time" in str(e.value)


def test_the_memory_fit_counts_a_step_of_parallel_rows_of_logits():
    """The fit sizes the largest step: a prompt chunk that also carries --parallel decode rows, each with logits."""
    model = load_model("smollm2")
    one, four = (Context(model, [OneRow(), CpuDevice()], n_ctx=64, n_batch=16, out_rows=n) for n in (1, 4))
    assert one.rows_key(16, 64, 1) in one.graphs and one.rows_key(16, 64, 4) not in one.graphs
    assert four.rows_key(16, 64, 4) in four.graphs and four.rows_key(16, 64, 1) not in four.graphs


# -- last: stopping ----------------------------------------------------------------------------------------
def test_sigterm_stops_accepting_ends_what_runs_and_exits(server):
    ended: dict = {}

    def stream():
        try:
            chunks = list(_chat(server, max_tokens=4, stream=True))
            ended["finish"] = chunks[-1].choices[0].finish_reason
        except openai.APIError as e:           # cancelled after the grace period: the stream is cut, not hung
            ended["cut"] = repr(e)

    t = threading.Thread(target=stream)
    t.start()
    server.wait_for(lambda s: s["busy"] == 1, "the stream running")
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0
    t.join(timeout=60)
    assert ended, "the running stream neither finished nor was cut"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    assert "stopped by SIGTERM" in server.stderr()


def test_a_long_start_says_how_many_step_shapes_are_ready(monkeypatch):
    """A batched server compiles a program for each step shape it reserved before /health turns ready (on
    openvino:CPU a --parallel 8 start took minutes): warm says how far it is, here every shape (the interval
    set to 0), and nothing where the start is quick."""
    from framework.serve import models
    served = load_models(["smollm2"], [CpuDevice()], n_ctx=64, n_batch=16, parallel=2, max_queue=1)
    n = sum(len(s.plans) for s in served[0].sessions())
    lines: list[str] = []
    monkeypatch.setattr(models, "WARM_REPORT_S", 0.0)
    models.warm(served, lines.append)
    assert n > 1 and len(lines) == n, lines
    for i, line in enumerate(lines, 1):
        assert line.startswith(f"smollm2: {i} of {n} step shapes loaded and compiled (") and line.endswith(" s)")
    again: list[str] = []
    monkeypatch.setattr(models, "WARM_REPORT_S", 3600.0)
    models.warm(served, again.append)        # everything prepared already: a quick start says nothing
    assert again == []
