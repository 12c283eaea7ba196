"""`framework serve` without an API key: what a browser page may do, the request fields, structured output.

One server for the file (SmolLM2, 2 sessions, no key, --cors for one origin, --embeddings, a 5 s shutdown timeout),
started as `framework serve` on a free loopback port; the last test stops it with SIGTERM mid-stream.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import time

import jsonschema
import numpy as np
import openai
import pytest
from conftest import load_model
from test_serve import _drop, start_server, stop_server

GOOD_ORIGIN = "http://good.example"
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 3}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if k != "FRAMEWORK_API_KEY"}
    srv = start_server(tmp_path_factory, ["--parallel", "2", "--queue", "1", "--cors", GOOD_ORIGIN, "--embeddings",
                                          "--shutdown-timeout", "5"], env)
    yield srv
    stop_server(srv)


def _post(server, path: str, body: dict, headers: dict | None = None) -> tuple[int, dict, dict]:
    """(status, headers with lower-case names, body) of a POST over plain HTTP."""
    status, h, reply = server.raw("POST", path, body, headers=headers, key=False)
    return status, {k.lower(): v for k, v in h.items()}, reply


# -- item 7: safe by default ---------------------------------------------------------------------------
@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "127.0.0.1.nip.io"])
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
    ask = dict(model="smollm2", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=4,
               temperature=2.0, seed=-1)
    texts = {server.client.chat.completions.create(**ask).choices[0].message.content for _ in range(3)}
    assert len(texts) > 1, texts          # three equal 4-token draws at temperature 2 would mean a fixed seed
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


# -- item 4: structured output -----------------------------------------------------------------------------
PERSON = {"type": "object", "additionalProperties": False, "required": ["colour", "count", "ok", "name"],
          "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]},
                         "count": {"type": "integer", "minimum": 0, "maximum": 9}, "ok": {"type": "boolean"},
                         "name": {"type": "string", "maxLength": 12}}}
ASK_JSON = [{"role": "user", "content": "Describe a ball as JSON."}]


def _valid(text: str, schema: dict) -> dict:
    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


def test_response_format_json_schema_answers_validate_greedy_sampled_and_streamed(server):
    fmt = {"type": "json_schema", "json_schema": {"name": "ball", "schema": PERSON, "strict": True}}
    answers = []
    for seed in (None, 1):
        kw = {"temperature": 0} if seed is None else {"temperature": 1.0, "seed": seed}
        reply = server.client.chat.completions.create(model="smollm2", messages=ASK_JSON, max_tokens=60,
                                                      response_format=fmt, **kw)
        assert reply.choices[0].finish_reason == "stop", reply
        answers.append(_valid(reply.choices[0].message.content, PERSON))
    streamed = server.client.chat.completions.create(model="smollm2", messages=ASK_JSON, max_tokens=60,
                                                     response_format=fmt, temperature=0, stream=True)
    assert _valid("".join(c.choices[0].delta.content or "" for c in streamed), PERSON) == answers[0]


def test_json_object_and_llama_servers_json_schema_and_gbnf_grammar(server):
    ask = [{"role": "user", "content": "Reply with a JSON object whose key 'a' is 1."}]
    reply = server.client.chat.completions.create(model="smollm2", messages=ask, max_tokens=40, temperature=0,
                                                  response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
    status, _, reply = _post(server, "/v1/completions", {"model": "smollm2", "prompt": "A ball:", "max_tokens": 60,
                                                         "temperature": 0, "json_schema": PERSON})
    assert status == 200 and reply["choices"][0]["finish_reason"] == "stop"
    _valid(reply["choices"][0]["text"], PERSON)
    for seed in (1, 2, 3):
        status, _, reply = _post(server, "/v1/chat/completions", {
            **CHAT, "max_tokens": 10, "temperature": 1.0, "seed": seed, "grammar": 'root ::= ("yes" | "no") "."'})
        assert status == 200 and reply["choices"][0]["message"]["content"] in ("yes.", "no."), reply


@pytest.mark.parametrize("extra, field, words", [
    ({"json_schema": {"type": "objekt"}}, "json_schema", "objekt"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
     "response_format", "cannot be compiled"),
    ({"grammar": 'root ::= "unclosed'}, "grammar", "GBNF"),
    ({"grammar": 'root ::= "a"', "json_schema": {"type": "object"}}, "grammar", "give one"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "'json_schema' is required"),
    ({"response_format": {"type": "yaml"}}, "response_format.type", "'response_format.type'"),
])
def test_a_bad_schema_or_grammar_is_400_naming_it(server, extra, field, words):
    status, _, reply = _post(server, "/v1/chat/completions", {**CHAT, **extra})
    assert status == 400 and words in reply["error"]["message"], reply
    assert reply["error"]["param"] == field, reply


# -- item 5: logprobs, tokenize, metrics, the access log ------------------------------------------------------
def test_chat_logprobs_are_openais_shape_and_the_greedy_token_is_the_likeliest(server):
    ask = dict(model="smollm2", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=5, temperature=0,
               logprobs=True, top_logprobs=3)
    reply = server.client.chat.completions.create(**ask)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 5
    assert "".join(e.token for e in content) == reply.choices[0].message.content
    for e in content:
        assert len(e.top_logprobs) == 3 and e.top_logprobs[0].token == e.token
        assert e.logprob == pytest.approx(e.top_logprobs[0].logprob) and e.logprob <= 0.0
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
        assert bytes(e.bytes).decode() == e.token
    streamed = [c.choices[0].logprobs for c in server.client.chat.completions.create(**ask, stream=True)
                if c.choices and c.choices[0].logprobs]
    assert [e.token for lp in streamed for e in lp.content] == [e.token for e in content]
    status, _, reply = _post(server, "/v1/chat/completions", {**CHAT, "top_logprobs": 2})
    assert status == 400 and "'top_logprobs' needs 'logprobs'" in reply["error"]["message"]


def test_completion_logprobs_are_openais_shape(server):
    reply = server.client.completions.create(model="smollm2", prompt="The capital of France is", max_tokens=4,
                                             temperature=0, logprobs=2)
    lp = reply.choices[0].logprobs
    assert "".join(lp.tokens) == reply.choices[0].text and len(lp.token_logprobs) == 4
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(4)]
    assert all(len(top) == 2 and max(top.values()) == pytest.approx(p) for top, p in zip(lp.top_logprobs,
                                                                                          lp.token_logprobs))


def test_tokenize_and_detokenize_are_llama_servers(server):
    ids = load_model("smollm2").tokenizer.encode("Hello world")
    status, _, reply = _post(server, "/tokenize", {"content": "Hello world"})
    assert status == 200 and reply == {"tokens": ids}
    status, _, reply = _post(server, "/tokenize", {"content": "Hello world", "with_pieces": True})
    assert [p["id"] for p in reply["tokens"]] == ids and "".join(p["piece"] for p in reply["tokens"]) == "Hello world"
    status, _, reply = _post(server, "/detokenize", {"tokens": ids, "model": "smollm2"})
    assert status == 200 and reply == {"content": "Hello world"}
    status, _, reply = _post(server, "/detokenize", {"tokens": [10 ** 6]})
    assert status == 400 and "outside the vocabulary" in reply["error"]["message"]
    status, _, reply = _post(server, "/tokenize", {"content": "x", "model": "gpt-4o"})
    assert status == 404 and reply["error"]["code"] == "model_not_found"


# -- embeddings ------------------------------------------------------------------------------------------
def test_embeddings_are_l2_normalised_pooled_states_the_same_for_the_same_text(server):
    texts = ["The cat sat on the mat.", "The cat sat on the mat.", "Interest rates rose in March."]
    reply = server.client.embeddings.create(model="smollm2", input=texts)      # the client asks for base64
    vectors = [np.array(d.embedding) for d in reply.data]
    width = load_model("smollm2").hp.n_embd
    assert [d.index for d in reply.data] == [0, 1, 2] and all(v.shape == (width,) for v in vectors)
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in vectors)
    assert np.array_equal(vectors[0], vectors[1])
    assert vectors[0] @ vectors[2] < 0.999
    ids = load_model("smollm2").tokenizer.encode(texts[0])
    assert reply.usage.prompt_tokens == reply.usage.total_tokens == sum(
        len(load_model("smollm2").tokenizer.encode(t)) for t in texts)
    as_floats = server.client.embeddings.create(model="smollm2", input=ids, encoding_format="float")
    assert np.allclose(as_floats.data[0].embedding, vectors[0], atol=1e-6)        # token ids: the same text
    raw = server.client.embeddings.create(model="smollm2", input=texts[0], encoding_format="float",
                                          extra_body={"embd_normalize": -1})
    mean = np.array(raw.data[0].embedding)
    assert abs(np.linalg.norm(mean) - 1) > 1e-3 and np.allclose(mean / np.linalg.norm(mean), vectors[0], atol=1e-5)


@pytest.mark.parametrize("extra, param, words", [
    ({"dimensions": 7}, "dimensions", "does not shorten"),
    ({"input": [10 ** 6]}, "input", "outside the vocabulary"),
    ({"input": ["ok", "x " * 600]}, "input[1]", "more than the context of 512"),
    ({"encoding_format": "int8"}, None, "encoding_format"),
])
def test_bad_embedding_requests_are_400_naming_the_field(server, extra, param, words):
    status, _, reply = _post(server, "/v1/embeddings", {"model": "smollm2", "input": "Hi", **extra})
    assert status == 400 and words in reply["error"]["message"], reply
    assert param is None or reply["error"]["param"] == param


def test_metrics_count_requests_and_tokens_and_each_request_is_one_access_log_line(server):
    def scrape() -> dict[str, float]:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", "/metrics")
        r = conn.getresponse()
        assert r.status == 200 and r.getheader("content-type").startswith("text/plain")
        text = r.read().decode()
        conn.close()
        return {line.rpartition(" ")[0]: float(line.rpartition(" ")[2]) for line in text.splitlines()
                if line and not line.startswith("#")}

    before, log_before = scrape(), server.stderr()
    reply = server.client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}],
                                                  max_tokens=3, temperature=0)
    after = scrape()
    ok = 'framework_requests_total{route="/v1/chat/completions",status="200"}'
    assert after[ok] == before.get(ok, 0) + 1
    gen = 'framework_generated_tokens_total{model="smollm2"}'
    assert after[gen] == before[gen] + reply.usage.completion_tokens
    assert after['framework_time_to_first_token_seconds_count{model="smollm2"}'] == \
        before['framework_time_to_first_token_seconds_count{model="smollm2"}'] + 1
    assert after['framework_queue_depth{model="smollm2"}'] == 0
    assert 'framework_prefix_cache_hit_tokens_total{model="smollm2"}' in after
    on_cpu = 'framework_device_seconds_total{device="cpu",model="smollm2"}'
    assert after[on_cpu] > before.get(on_cpu, 0)             # the request's steps ran on cpu, and took time
    runs = 'framework_device_fragment_runs_total{device="cpu",model="smollm2"}'
    assert after[runs] >= before.get(runs, 0) + reply.usage.completion_tokens     # a fragment a step at least
    lines = [ln for ln in server.stderr()[len(log_before):].splitlines() if "POST /v1/chat/completions" in ln]
    assert len(lines) == 1 and f"200 {reply.usage.prompt_tokens}+3 tokens on cpu" in lines[0], lines
    assert lines[0].endswith(" ms")


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
    log = server.stderr()
    assert "stopped by SIGTERM" in log and "cut by the shutdown (SIGTERM)" in log and "Traceback" not in log
    with pytest.raises(openai.APIConnectionError):
        openai.OpenAI(base_url=server.client.base_url, api_key="x", max_retries=0, timeout=5).models.list()
