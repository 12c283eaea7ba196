"""`framework serve` without an API key: what a browser page may do, the request fields, structured output.

One server for the file (SmolLM2, 2 sessions, no key, --cors for one origin, a 5 s shutdown timeout),
started as `framework serve` on a free loopback port; the last test stops it with SIGTERM mid-stream.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import time

import openai
import pytest
from test_serve import FRAMEWORK, Server, _drop, _free_port

GOOD_ORIGIN = "http://good.example"
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 3}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port = _free_port()
    log = (tmp_path_factory.mktemp("serve") / "stderr.txt").open("w+")
    cmd = FRAMEWORK + ["serve", "-m", "smollm2", "--ctx", "512", "--parallel", "2", "--queue", "1",
                       "--port", str(port), "--cors", GOOD_ORIGIN, "--shutdown-timeout", "5"]
    env = {k: v for k, v in os.environ.items() if k != "FRAMEWORK_API_KEY"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True, env=env)
    srv = Server(port, proc, log)
    end = time.monotonic() + 180
    while True:
        if proc.poll() is not None:
            pytest.fail(f"framework serve exited with {proc.returncode} before it was ready: {srv.stderr()}")
        try:
            if srv.raw("GET", "/health")[0] == 200:
                break
        except OSError:
            pass
        if time.monotonic() > end:
            proc.kill()
            pytest.fail("framework serve was not ready within 180 s")
        time.sleep(0.2)
    yield srv
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _post(server, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict, dict]:
    """(status, headers with lower-case names, body) of a POST over plain HTTP."""
    status, h, reply = server.raw("POST", path, body, headers=headers, key=False)
    return status, {k.lower(): v for k, v in h.items()}, reply


# -- item 7: safe by default ---------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["evil.example", f"evil.example:{8080}", "127.0.0.1.nip.io"])
def test_a_foreign_host_is_403_naming_it_without_a_key(server, host):
    status, _, reply = _post(server, "/v1/chat/completions", CHAT, {"Host": host})
    assert status == 403 and reply["error"]["code"] == "host_not_allowed"
    assert f"'{host}'" in reply["error"]["message"] and "--api-key" in reply["error"]["message"]


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "[::1]"])
def test_loopback_hosts_are_served(server, host):
    status, _, reply = _post(server, "/v1/chat/completions", CHAT, {"Host": f"{host}:{server.port}"})
    assert status == 200, reply


def test_cross_origin_requests_are_refused_unless_allowed_and_get_no_cors_headers(server):
    # a web page's "simple" POST (text/plain: no preflight) would otherwise run
    status, headers, reply = _post(server, "/v1/chat/completions", CHAT,
                                   {"Origin": "http://evil.example", "Content-Type": "text/plain"})
    assert status == 403 and reply["error"]["code"] == "origin_not_allowed"
    assert "--cors http://evil.example" in reply["error"]["message"]
    assert not any(k.startswith("access-control-") for k in headers)
    status, headers, _ = _post(server, "/v1/chat/completions", CHAT, {"Origin": GOOD_ORIGIN})
    assert status == 200 and headers["access-control-allow-origin"] == GOOD_ORIGIN
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("OPTIONS", "/v1/chat/completions", headers={"Origin": GOOD_ORIGIN, "Access-Control-Request-Method":
                                                             "POST", "Access-Control-Request-Headers": "content-type"})
    preflight = conn.getresponse()
    conn.close()
    assert preflight.status == 200 and preflight.getheader("access-control-allow-origin") == GOOD_ORIGIN
    status, headers, _ = server.raw("GET", "/v1/models")
    assert status == 200 and "access-control-allow-origin" not in headers


def test_seed_minus_one_is_a_random_seed_and_other_negatives_are_refused(server):
    ask = dict(model="smollm2", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=6,
               temperature=2.0, seed=-1)
    texts = {server.client.chat.completions.create(**ask).choices[0].message.content for _ in range(3)}
    assert len(texts) > 1, texts          # three equal 6-token draws at temperature 2 would mean a fixed seed
    status, _, reply = _post(server, "/v1/chat/completions", {**CHAT, "seed": -2})
    assert status == 400 and "'seed'" in reply["error"]["message"]


def test_a_client_hang_up_is_one_log_line_never_a_traceback(server):
    before = server.stderr()
    conn, _ = server.open_stream(max_tokens=400)
    server.wait_for(lambda s: s["busy"] == 1, "one busy session")
    _drop(conn)
    server.wait_for(lambda s: s["busy"] == 0, "the session given back")
    time.sleep(0.5)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)     # and one mid-body
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Content-Length", "1000")
    conn.endheaders(b'{"model": "smollm2", ')
    _drop(conn)
    time.sleep(1.0)
    new = server.stderr()[len(before):]
    assert "Traceback" not in new and "ERROR" not in new, new
    assert new.count("client went away") == 2 and "sending its request body" in new, new


# -- item 6: every field honoured or refused by name -----------------------------------------------------
@pytest.mark.parametrize("extra, words", [
    ({"temprature": 0.5}, "'temprature' is not a field this server knows"),
    ({"repeat_penalty": 1.3}, "'repeat_penalty' is not supported"),
    ({"mirostat": 2}, "'mirostat' is not supported"),
    ({"logit_bias": {"42": 5}}, "'logit_bias' is not supported"),
    ({"cache_prompt": "yes"}, "'cache_prompt'"),
    ({"min_p": 1.5}, "'min_p'"),
    ({"n_predict": 0}, "'n_predict' must be"),
    ({"n_predict": 4, "max_tokens": 3}, "disagree"),
    ({"stream_options": {"include_usage": True, "chunk_size": 3}}, "'stream_options.chunk_size'"),
])
def test_fields_it_does_not_implement_are_400_naming_them(server, extra, words):
    status, _, reply = _post(server, "/v1/chat/completions", {**CHAT, **extra})
    assert status == 400 and words in reply["error"]["message"], reply


def test_neutral_values_of_llama_servers_fields_and_echoed_empty_extras_are_accepted(server):
    history = [{"role": "user", "content": "Hi"},
               {"role": "assistant", "content": "Hello!", "refusal": None, "tool_calls": [], "audio": None},
               {"role": "user", "content": "Name a colour."}]
    body = {**CHAT, "messages": history, "repeat_penalty": 1.0, "mirostat": 0, "typical_p": 1.0,
            "cache_prompt": False, "user": "someone", "n": 1}
    status, _, reply = _post(server, "/v1/chat/completions", body)
    assert status == 200, reply
    echoed = {**history[1], "tool_calls": [{"id": "x", "type": "function"}]}
    status, _, reply = _post(server, "/v1/chat/completions", {**CHAT, "messages": [echoed, history[2]]})
    assert status == 400 and "messages.0.tool_calls" in reply["error"]["message"]


def test_min_p_top_k_and_n_predict_are_honoured(server):
    greedy = server.client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=5,
                                              temperature=0).choices[0].text
    for cut in ({"min_p": 1.0}, {"top_k": 1}):       # only the likeliest token survives: greedy's text
        status, _, reply = _post(server, "/v1/completions", {"model": "smollm2", "prompt": "The capital of France is",
                                                             "max_tokens": 5, "temperature": 1.5, **cut})
        assert status == 200 and reply["choices"][0]["text"] == greedy, cut
    status, _, reply = _post(server, "/v1/completions", {"model": "smollm2", "prompt": "The capital of France is",
                                                         "n_predict": 3, "temperature": 0})
    assert status == 200 and reply["usage"]["completion_tokens"] == 3 and greedy.startswith(reply["choices"][0]["text"])


# -- last: stopping ----------------------------------------------------------------------------------------
def test_sigterm_cuts_streams_with_an_error_event_and_done_refuses_new_requests_then_exits(server):
    conn, response = server.open_stream(max_tokens=400)
    server.proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + 30
    while server.raw("GET", "/health")[2].get("status") != "stopping":
        assert time.monotonic() < end, "the server never said it was stopping"
        time.sleep(0.05)
    status, _, reply = _post(server, "/v1/chat/completions", CHAT)
    assert status == 503 and reply["error"]["code"] == "shutting_down"
    events = [line[len(b"data: "):] for line in response.read().splitlines() if line.startswith(b"data: ")]
    conn.close()
    assert events[-1] == b"[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "shutting_down" and "SIGTERM" in error["message"]
    assert server.proc.wait(timeout=60) == 0
    assert "stopped by SIGTERM" in server.stderr() and "Traceback" not in server.stderr()
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=server.client.base_url, api_key="x", max_retries=0, timeout=5).models.list()
