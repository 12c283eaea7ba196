"""Verification rows bit for bit a one-row step's (Limits.exact_rows), what speculative decoding's greedy
correctness rests on (docs/speculative.md, "Correct by construction"):

- on every device that declares it (cpu on both product paths, vulkan on lavapipe, opencl on PoCL), the logits
  of each row of a step of 2 to exact_rows tokens equal those of one-row steps at the same positions, bit for bit
  (a tiny model: every device's products and attention);
- greedy text with an ngram draft is the target's own greedy text on SmolLM2's real weights on each of them;
- openvino:CPU declares no rows (its several-row products sum in another order, and its 8-bit activations
  differ by a few tenths of a logit): speculation on it is refused at reservation, naming the device, the limit
  and the fixes, and allowed with inexact (--draft-inexact), which the run's draft line says.
"""

from __future__ import annotations

import numpy as np
import pytest
import tiny_models
from conftest import load_model
from test_lookup_draft import EDIT

from framework.model.model import Model
from framework.plugins.cpu.device import CpuDevice
from framework.runtime.generate import generate
from framework.runtime.sampling import Sampler, SamplingParams
from framework.runtime.session import Session
from framework.runtime.speculative import SpeculationError, SpeculativeDecoder, make_draft

N_TOKENS = 20           # the answer copies the prompt's code from its first line: drafts are accepted at once
DEVICE_LISTS = ("cpu-q8", "cpu-f32", "vulkan:0,cpu", "opencl:0,cpu")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return Model(tiny_models.write("qwen2", tmp_path_factory.mktemp("rows") / "tiny-qwen2.gguf"))


def devices_of(registry, which: str):
    """The device list a case names: the cpu plugin on a product path asked for by name (not the CPU's default)."""
    if which.startswith("cpu-"):
        return [CpuDevice(which.split("-", 1)[1])]
    devices = registry.select(which)
    for d in devices:
        if not d.available:
            pytest.fail(f"{d.name} is unavailable: {d.unavailable_reason} (make test installs lavapipe and PoCL)")
    return devices


@pytest.mark.parametrize("which", DEVICE_LISTS)
def test_each_row_of_a_step_is_a_one_row_steps_logits(tiny, registry, which):
    devices = devices_of(registry, which)
    rows = min(d.limits.exact_rows for d in devices)
    assert rows >= 5, f"{which} declares exact_rows {rows}: a verification of 4 drafts needs 5"
    s = Session(tiny, devices, n_ctx=64)
    s.eval([3, 14, 15, 9, 2, 6])
    start, tokens = s.n_past, [5, 35, 8, 9, 7, 9, 3, 2][:rows]
    one = [s.eval([t]).copy() for t in tokens]
    for k in (2, rows):
        s.rewind(start)
        got = s.eval(tokens[:k], all_logits=True)
        for i in range(k):
            assert np.array_equal(got[i], one[i]), (which, k, i, float(np.abs(got[i] - one[i]).max()))


@pytest.mark.parametrize("which", ("cpu-q8", "vulkan:0,cpu", "opencl:0,cpu"))
def test_greedy_with_an_ngram_draft_is_the_targets_greedy_text_on_each_plugin(registry, which):
    """(cpu's float32 path: tests/test_lookup_draft.py.)"""
    model, devices = load_model("smollm2"), devices_of(registry, which)
    ids = model.tokenizer.encode(EDIT)
    alone = Session(model, devices, n_ctx=160)
    want = [p.token for p in generate(alone, ids, N_TOKENS, Sampler(SamplingParams()))]
    target = Session(model, devices, n_ctx=160)
    decoder = SpeculativeDecoder(target, make_draft("ngram:2", target, devices), 4, baseline=0)
    decoder.reserve(len(ids), N_TOKENS)
    got = [p.token for p in decoder.generate(ids, N_TOKENS, Sampler(SamplingParams()))]
    assert got == want, (which, model.tokenizer.decode(got), model.tokenizer.decode(want))
    assert decoder.stats.accepted > 0, decoder.stats.line()


def test_openvino_cpu_is_refused_at_reservation_unless_inexact(tiny, registry):
    (ov,) = registry.select("openvino:CPU")
    assert ov.limits.exact_rows == 0
    devices = [ov] + registry.select("cpu")
    target = Session(tiny, devices, n_ctx=64)
    decoder = SpeculativeDecoder(target, make_draft("ngram:2", target, devices), 3, baseline=0)
    with pytest.raises(SpeculationError) as info:
        decoder.reserve(6, 8)
    msg = str(info.value)
    for part in ("speculative decoding refused", "openvino:CPU", "declares no row count", "Limits.exact_rows",
                 "step holds up to 4", "--draft-inexact"):
        assert part in msg, (part, msg)
    assert target.executor.programs == {}              # refused before anything is compiled
    allowed = SpeculativeDecoder(target, make_draft("ngram:2", target, devices), 3, baseline=0, inexact=True)
    allowed.reserve(6, 8)
    assert [d.split(" ")[0] for d in allowed.inexact_devices] == ["openvino:CPU"]


def test_a_draft_longer_than_the_exact_rows_is_refused_with_the_draft_n_that_fits(tiny, registry):
    devices = [CpuDevice("f32")]
    target = Session(tiny, devices, n_ctx=64)
    decoder = SpeculativeDecoder(target, make_draft("ngram", target, devices), 9, baseline=0)
    with pytest.raises(SpeculationError, match=r"declares at most 8 rows.*step holds up to 10.*--draft-n 7 or fewer"):
        decoder.reserve(6, 12)
