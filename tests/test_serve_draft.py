"""`framework serve --draft ngram:N` through the real openai client (docs/speculative.md, "In the server"):

- a greedy answer with drafts is the answer without them: the same server answers a request that asks for
  log-probabilities a token a step, without drafting, and the texts match;
- each response's usage reports the tokens drafted and accepted ("speculative"), drafts accepted on a prompt
  the answer copies from, none for the request without drafts;
- a draft serve cannot run is refused by name before anything loads.
"""

from __future__ import annotations

import os
import subprocess

import pytest
from test_lookup_draft import EDIT
from test_serve import FRAMEWORK, start_server, stop_server

N_TOKENS = 20


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = start_server(tmp_path_factory, ["--backends", "cpu", "--api-key", "test-key", "--draft", "ngram:2"],
                       os.environ.copy())
    yield srv
    stop_server(srv)


def test_greedy_answers_with_drafts_equal_those_without_and_usage_reports_them(server):
    drafted = server.client.completions.create(model="smollm2", prompt=EDIT, max_tokens=N_TOKENS, temperature=0)
    plain = server.client.completions.create(model="smollm2", prompt=EDIT, max_tokens=N_TOKENS, temperature=0,
                                             logprobs=1)
    assert drafted.choices[0].text == plain.choices[0].text
    assert drafted.usage.completion_tokens == plain.usage.completion_tokens == N_TOKENS
    spec = drafted.usage.model_extra["speculative"]
    assert spec["accepted_tokens"] > 0 and spec["drafted_tokens"] >= spec["accepted_tokens"], spec
    assert plain.usage.model_extra["speculative"] == {"drafted_tokens": 0, "accepted_tokens": 0}
    assert "every request drafts by prompt lookup (ngram:2" in server.stderr()


def test_a_model_draft_is_refused_by_name():
    done = subprocess.run(FRAMEWORK + ["serve", "-m", "smollm2", "--backends", "cpu", "--draft", "layers:4"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--draft layers:4: serve drafts by prompt lookup only, ngram[:N]" in done.stderr, done.stderr
