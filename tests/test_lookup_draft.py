"""Prompt lookup (``--draft ngram[:N]``, framework/runtime/lookup.py) and adaptive drafting
(framework/runtime/speculative.py's Adaptive and p_min).

- the proposer: the continuation of the latest earlier occurrence of the last N tokens, none without one;
- correct by construction: greedy text with an ngram draft is the target's own greedy text on SmolLM2's real
  weights, with drafts accepted on a prompt the answer copies from (that rejection sampling keeps the target's
  distribution with deterministic proposals is tests/test_speculative.py's chi-square test);
- drafting pauses when acceptance falls and comes back when it recovers; a model draft stops at a token it
  is unsure of; the draft length follows the acceptance and the measured costs of verification rows and of
  draft tokens;
- the command line: refusals by name, and a run that reports its drafts.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import load_model

from framework.cli import main as cli_main
from framework.runtime.generate import generate
from framework.runtime.lookup import lookup, parse_match
from framework.runtime.sampling import Sampler, SamplingParams
from framework.runtime.session import Session
from framework.runtime.speculative import (Adaptive, DraftLength, SpecStats, SpeculationError,
                                           SpeculativeDecoder, confident, make_draft, picker)

EDIT = ("Original code:\ndef area(width, height):\n    return width * height\n\n\n"
        "def total_area(shapes):\n    total = 0\n    for width, height in shapes:\n"
        "        total += area(width, height)\n    return total\n\n"
        "The same code with the function `area` renamed to `rectangle_area`:\n"
        "def rectangle_area(width, height):\n")


# -- the proposer ------------------------------------------------------------------------------------------

def test_lookup_takes_the_latest_earlier_occurrence():
    h = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert lookup(h, 3, 2) == [7, 8]             # the occurrence at 5, not the one at 0
    assert lookup(h, 3, 10) == [7, 8, 5, 1, 2, 3]   # up to the end of the history
    assert lookup(h, 2, 1) == [7]
    assert lookup(h + [4], 3, 4) == []           # (2, 3, 4) never occurred before
    assert lookup([5, 5, 5, 5], 2, 3) == [5]     # an overlapping occurrence: only what followed it
    assert lookup([1, 2], 3, 4) == [] and lookup(h, 3, 0) == []


def test_parse_match():
    assert parse_match("ngram") == 3 and parse_match("ngram:5") == 5
    for bad in ("ngram:0", "ngram:x", "ngram:-1"):
        with pytest.raises(ValueError, match="N must be a whole number"):
            parse_match(bad)


# -- correct by construction ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2_edit(registry):
    model = load_model("smollm2")
    cpu = registry.select("cpu")
    ids = model.tokenizer.encode(EDIT)
    target = Session(model, cpu, n_ctx=256)
    want = [p.token for p in generate(target, ids, 40, Sampler(SamplingParams()))]
    target.reset()
    return model, cpu, ids, want


def test_greedy_with_an_ngram_draft_is_the_targets_greedy_text(smollm2_edit):
    model, cpu, ids, want = smollm2_edit
    target = Session(model, cpu, n_ctx=256)
    decoder = SpeculativeDecoder(target, make_draft("ngram:3", target, cpu), 4, baseline=0)
    decoder.reserve(len(ids), 40)
    got = [p.token for p in decoder.generate(ids, 40, Sampler(SamplingParams()))]
    assert got == want, (model.tokenizer.decode(got), model.tokenizer.decode(want))
    st = decoder.stats
    assert st.accepted > 0 and st.tokens_per_step > 1.0, st.line()
    assert st.rounds < 39          # fewer target steps than tokens decoded


# -- adapting ----------------------------------------------------------------------------------------------

def test_drafting_pauses_when_acceptance_falls_and_resumes_when_it_recovers():
    a = Adaptive(floor=0.3, window=4)
    for _ in range(4):
        assert a.allows()
        a.update(4, 0)                       # nothing accepted in 4 rounds: a pause of 2
    assert [a.allows() for _ in range(3)] == [False, False, True]
    a.update(4, 0)                           # the probe fails: twice as long
    assert [a.allows() for _ in range(5)] == [False] * 4 + [True]
    a.update(4, 3)                           # the probe succeeds: drafting goes on, the pause back to 2
    assert a.allows() and a.next_pause == 2
    a.update(0, 0)                           # a round without a draft (no match) changes nothing
    assert a.allows()


def test_a_probe_waits_while_the_drafting_that_bought_nothing_is_over_its_budget():
    """A model draft's probe after a pause costs a catch-up over every token since its last step: it waits until
    the drafting time whose drafts were refused is within the budget's share of all the rounds' time."""
    a = Adaptive(floor=0.3, window=4, budget=0.05)
    for _ in range(4):
        assert a.allows()
        a.update(1, 0, drafting=0.125, seconds=0.25)   # refused: 0.5 s of 1 s bought nothing
    assert a.probing and [a.allows() for _ in range(2)] == [False, False]     # the pause of 2
    waits = 0
    while not a.allows():                              # the target alone, 0.125 s a round
        a.update(0, 0, seconds=0.125)
        waits += 1
    assert waits == 72 and a.wasted == 0.05 * a.elapsed        # 0.5 s is 5% of 10 s
    a.update(2, 2, drafting=0.1, seconds=0.3)          # the probe pays: drafting goes on, the budget aside
    assert not a.probing and a.allows()
    ngram = Adaptive(floor=0.3, window=4)              # a draft that costs nothing to run never waits
    for _ in range(4):
        ngram.update(3, 0)
    assert [ngram.allows() for _ in range(3)] == [False, False, True]


def rounds(length: DraftLength, drafted: int, accepted: int, times: int, draft_seconds: float = 0.0) -> None:
    """Rounds with steps costing 1 s plus 0.2 s a row after the first (cheap rows: weights read once)."""
    for _ in range(times):
        length.record(drafted, accepted, draft_seconds * drafted, 1.0 + 0.2 * drafted)


def test_the_draft_length_drafts_the_most_until_two_row_counts_are_measured():
    length = DraftLength(6)
    assert length.choose() == 6
    rounds(length, 6, 0, 8)                     # every draft refused, but only one row count measured
    assert length.choose() == 6


def test_the_draft_length_follows_acceptance_and_costs():
    length = DraftLength(6)
    rounds(length, 0, 0, 1)                     # a round without a draft: the cost of one row
    rounds(length, 6, 6, 8)                     # every draft accepted: rows this cheap pay for the most drafts
    assert length.choose() == 6
    rounds(length, 6, 0, 8)                     # every first draft refused: one draft risks the least
    assert length.choose() == 1
    rounds(length, 4, 3, 8)                     # three in four: a few
    assert 1 < length.choose() < 6
    slow = DraftLength(6)
    rounds(slow, 0, 0, 1)
    rounds(slow, 6, 6, 1)
    rounds(slow, 4, 3, 8, draft_seconds=1.0)    # a draft token as dear as a target step: short drafts
    assert slow.choose() < length.choose()


def test_a_draft_position_seldom_checked_takes_the_chance_of_the_one_before():
    length = DraftLength(6)
    rounds(length, 0, 0, 1)
    rounds(length, 1, 1, 8)                     # a draft model stopped by p_min after one token, each accepted
    assert length.chances()[5] == pytest.approx(length.chances()[0]) and length.chances()[0] > 0.8
    assert length.choose() == 6                 # not kept at one by a guess about positions it never reached


def test_the_draft_length_interpolates_row_counts_not_measured():
    length = DraftLength(8)
    length.record(0, 0, 0.0, 1.0)
    length.record(4, 4, 0.0, 2.0)               # 5 rows
    assert length.rows_cost(3) == pytest.approx(1.5) and length.rows_cost(7) == pytest.approx(2.5)
    length.record(6, 6, 0.0, 2.0)               # 7 rows cost what 5 did: no slope past them, never falling
    assert length.rows_cost(9) == pytest.approx(2.0)


def test_a_model_draft_stops_at_a_token_it_is_unsure_of():
    sure, unsure = np.array([10.0, 0.0, 0.0]), np.array([1.0, 0.9, 0.8])
    assert confident(sure, None, 0.75) and not confident(unsure, None, 0.75) and confident(unsure, None, 0.0)
    pick = picker(Sampler(SamplingParams()), p_min=0.75)
    assert pick(sure) == (0, None) and pick(unsure) is None


def test_a_model_draft_that_proposes_nothing_is_paused(smollm2_edit):
    """A draft model unsure of every first token (p_min) still runs a step a round: that counts against
    drafting as refused drafts do, so drafting pauses; every draft it does propose (the target's own file) is
    accepted, which alone would never pause it."""
    model, cpu, ids, want = smollm2_edit
    target = Session(model, cpu, n_ctx=256)
    decoder = SpeculativeDecoder(target, make_draft(str(model.file.path), target, cpu), 4, baseline=0,
                                 p_min=0.999999)
    decoder.reserve(len(ids), 40)
    got = [p.token for p in decoder.generate(ids, 40, Sampler(SamplingParams()))]
    assert got == want
    st = decoder.stats
    assert st.accepted == st.drafted and st.paused > 0, st.line()


def test_the_report_says_when_nothing_was_decoded():
    assert SpecStats().line() == "speculative: nothing was decoded (the first token came from the prompt's step)"
    assert "x0.00" not in SpecStats().line()


# -- the command line --------------------------------------------------------------------------------------

@pytest.mark.parametrize(("argv", "says"), [
    (["--draft", "ngram:0"], "--draft ngram:0: N must be a whole number"),
    (["--draft", "ngram", "--draft-backends", "cpu"], "--draft ngram runs no model and uses no device"),
    (["--draft-p-min", "0.5"], "need --draft SPEC"),
    (["--draft", "ngram", "--draft-p-min", "0.5"], "--draft ngram proposes without probabilities"),
])
def test_the_command_line_refuses_by_name(capsys, argv, says):
    code = cli_main(["run", "-m", "smollm2", "Hi", "-n", "4", "--backends", "cpu", *argv])
    assert code == 2, capsys.readouterr()
    assert says in capsys.readouterr().err


def test_p_min_out_of_range_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        cli_main(["run", "-m", "smollm2", "Hi", "--draft", "ngram", "--draft-p-min", "1.5"])
    assert e.value.code == 2 and "a probability at least 0 and below 1" in capsys.readouterr().err


def test_run_with_an_ngram_draft_reports_it(capsys):
    code = cli_main(["run", "-m", "smollm2", EDIT, "-n", "24", "--backends", "cpu", "--draft", "ngram"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "draft ngram:3 (prompt lookup" in err and "(no model, no device)" in err, err
    assert "speculative: drafted" in err and "reads only the text" in err, err


def test_make_draft_refuses_a_bad_ngram_spec(smollm2_edit):
    model, cpu, _, _ = smollm2_edit
    with pytest.raises(SpeculationError, match="ngram:N"):
        make_draft("ngram:zero", Session(model, cpu, n_ctx=64), cpu)
