"""Steps of several sequences over one cache (runtime/cells.py, runtime/batch.py): the cells' bookkeeping,
and batched rows giving each sequence the logits it gets alone, bit for bit on the cpu plugin (whose
products and attention sums do not depend on the other rows of a step), within bounds on openvino:CPU."""

import dataclasses

import numpy as np
import pytest
import tiny_models
from conftest import load_model

from framework.core.scheduler import CapabilityError
from framework.model.model import Model
from framework.plugins.cpu.device import CpuDevice
from framework.runtime.batch import Batch, BatchError, Part
from framework.runtime.cells import Cells
from framework.runtime.context import ContextFullError, padded_rows
from framework.runtime.perplexity import perplexity, windows_per_step
from framework.runtime.prefix import PrefixCache, block_hashes
from framework.runtime.session import Session
from framework.serve.models import batched_shapes

PROMPTS = {1: [20, 31, 42, 53, 64, 75, 86], 2: [90, 91, 92, 93, 94], 3: [300, 17, 250, 9, 120, 33, 71, 45, 12, 8, 199]}
DECODE = 4


# -- the cells --------------------------------------------------------------------------------------
def test_shared_cells_survive_until_their_last_sequence_is_freed():
    c = Cells(16)
    a = c.allocate(1, 5)
    assert a.tolist() == [0, 1, 2, 3, 4] and c.n_past(1) == 5
    c.share(1, 2, 3)                          # sequence 2: the first 3 tokens of 1, on the same cells
    assert c.cells_of(2).tolist() == [0, 1, 2] and c.n_past(2) == 3
    b = c.allocate(2, 2)                      # its own next tokens go above its last cell, in free ones
    assert b.tolist() == [5, 6] and c.pos[b].tolist() == [3, 4]
    c.free(1)
    assert c.cells_of(2).tolist() == [0, 1, 2, 5, 6]
    assert c.pos[[3, 4]].tolist() == [-1, -1] and c.n_free == 11       # 1's own cells freed at once
    c.free(2)
    assert c.n_free == 16 and c.high() == 0 and c.sequences() == []


def test_new_cells_go_above_the_sequences_last_one_and_a_full_cache_names_the_fix():
    c = Cells(8)
    c.allocate(1, 2)
    c.allocate(2, 3)                          # cells 2..4
    c.free(1)                                 # 0 and 1 free, below sequence 2's cells
    assert c.allocate(2, 2).tolist() == [5, 6]
    assert c.allocate(2, 2).tolist() == [0, 1]      # nothing left above: the lowest free cells
    c.keep(2, 4)                              # a rewind drops positions 4 and up
    assert c.n_past(2) == 4 and sorted(c.pos[c.cells_of(2)].tolist()) == [0, 1, 2, 3]
    c.allocate(3, 4)
    with pytest.raises(ContextFullError) as info:
        c.allocate(3, 1)
    assert "0 free cells of 8" in str(info.value) and "raise --ctx, lower --parallel" in str(info.value)


def test_the_mask_shows_a_row_its_own_sequences_cells_up_to_its_position_within_the_window():
    c = Cells(8)
    c.allocate(1, 3)                          # cells 0..2, positions 0..2
    c.share(1, 2, 2)                          # 2 uses cells 0, 1
    c.allocate(2, 2)                          # cells 3, 4 at positions 2, 3
    m = c.mask(np.array([1, 2, 2]), np.array([2, 2, 3]), 8)
    seen = np.isfinite(m)
    assert seen[0].tolist() == [True, True, True, False, False, False, False, False]
    assert seen[1].tolist() == [True, True, False, True, False, False, False, False]
    assert seen[2].tolist() == [True, True, False, True, True, False, False, False]
    swa = np.isfinite(c.mask(np.array([2]), np.array([3]), 8, window=2))
    assert np.flatnonzero(swa[0]).tolist() == [3, 4]       # positions 2 and 3 only
    assert (m[seen] == 0).all()


# -- batched steps against each sequence alone ----------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Model:
    return Model(tiny_models.write("llama", tmp_path_factory.mktemp("batch") / "tiny-llama.gguf"))


@pytest.fixture(scope="module")
def tiny_gemma4(tmp_path_factory) -> Model:
    return Model(tiny_models.write("gemma4", tmp_path_factory.mktemp("batch") / "tiny-gemma4.gguf"))


def alone(model: Model, devices, prompt: list[int], n: int = DECODE) -> tuple[list[np.ndarray], list[int]]:
    """The logits of the prompt's last token and of n greedy decode steps, in a session of its own."""
    s = Session(model, devices if isinstance(devices, list) else [devices], n_ctx=128)
    out = [s.eval(prompt)]
    tokens = []
    for _ in range(n):
        tokens.append(int(np.argmax(out[-1])))
        out.append(s.eval([tokens[-1]]))
    return out, tokens


def batched(model: Model, devices, keys: list | None = None) -> dict[int, list[np.ndarray]]:
    """Sequences 1 and 2 prefill together and decode together; 3 joins mid-generation with its prompt
    beside their decode rows; one leaves early (its cells freed) while the others go on. keys: given a list,
    the step shapes that ran are added to it."""
    b = Batch(Session(model, devices if isinstance(devices, list) else [devices], n_ctx=128))
    got = {1: [], 2: [], 3: []}

    def run(parts):
        for part, logits in zip(parts, b.step(parts)):
            got[part.seq].append(logits)

    def next_token(seq):
        return [int(np.argmax(got[seq][-1]))]

    run([Part(1, PROMPTS[1]), Part(2, PROMPTS[2])])
    run([Part(1, next_token(1)), Part(2, next_token(2))])
    run([Part(2, next_token(2)), Part(3, PROMPTS[3]), Part(1, next_token(1))])
    for _ in range(DECODE - 2):
        run([Part(s, next_token(s)) for s in (1, 2, 3)])
    b.free(2)
    run([Part(1, next_token(1)), Part(3, next_token(3))])
    run([Part(3, next_token(3))])
    assert b.cells.sequences() == [1, 3]
    if keys is not None:
        keys += list(b.session.plans)
    return got


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean((a - b) ** 2) / np.mean(a ** 2))


def test_batched_rows_give_each_sequence_its_logits_alone_bit_for_bit_on_cpu_q8(tiny_llama):
    device = CpuDevice("q8")
    if not device.available:
        pytest.skip(f"cpu plugin's q8 path unavailable: {device.unavailable_reason}")
    got = batched(tiny_llama, device)
    for seq, logits in got.items():
        ref, _ = alone(tiny_llama, device, PROMPTS[seq], len(logits) - 1)
        assert len(ref) == len(logits)
        for i, (a, b) in enumerate(zip(ref, logits)):
            assert np.array_equal(a, b), f"sequence {seq}, step {i}: {np.abs(a - b).max()}"


def test_batched_rows_on_cpu_f32_match_alone_to_blas_rounding(tiny_llama):
    """numpy's BLAS rounds a row of a product differently with other rows beside it (a matrix-vector
    product for one row, blocked matrix products for several): bounds, not bits, and the same greedy tokens."""
    device = CpuDevice("f32")
    got = batched(tiny_llama, device)
    for seq, logits in got.items():
        ref, _ = alone(tiny_llama, device, PROMPTS[seq], len(logits) - 1)
        assert len(ref) == len(logits)
        for i, (a, b) in enumerate(zip(ref, logits)):
            assert nmse(a, b) < 1e-10, (seq, i, nmse(a, b))
            assert np.argmax(a) == np.argmax(b), (seq, i)


def test_a_sliding_window_model_batched_matches_alone(tiny_gemma4):
    """Gemma 4's sliding layers (a window of 8, shorter than the prompts) see only their window of their own
    sequence's cells. Its per-layer embeddings are float32 products through numpy's BLAS: bounds, not bits."""
    device = CpuDevice("f32")
    got = batched(tiny_gemma4, device)
    for seq, logits in got.items():
        ref, _ = alone(tiny_gemma4, device, PROMPTS[seq], len(logits) - 1)
        for i, (a, b) in enumerate(zip(ref, logits)):
            assert nmse(a, b) < 1e-10, (seq, i, nmse(a, b))
            assert np.argmax(a) == np.argmax(b), (seq, i)


def test_smollm2_joining_sequence_changes_no_other_sequences_greedy_tokens():
    model, device = load_model("smollm2"), CpuDevice("f32")
    _, want = alone(model, device, PROMPTS[1], 6)
    b = Batch(Session(model, [device], n_ctx=128))
    tokens = [int(np.argmax(b.step([Part(1, PROMPTS[1])])[0]))]
    for i in range(5):
        parts = [Part(1, tokens[-1:])] + ([Part(2, PROMPTS[2])] if i == 1 else [])
        tokens.append(int(np.argmax(b.step(parts)[0])))
    assert tokens == want


def test_batched_rows_on_openvino_cpu_are_within_bounds_of_alone(registry, tiny_llama):
    """openvino:CPU first, the cpu plugin for what it does not translate (rope with frequency factors).
    openvino:CPU's own result for a row moves with the rows beside it (5e-5 NMSE between a 7-token and a
    12-token prompt here): the bound is ggml's for matrix products, 5e-4."""
    devices = [*registry.select("openvino:CPU"), CpuDevice("f32")]
    got = batched(tiny_llama, devices)
    for seq, logits in got.items():
        ref, _ = alone(tiny_llama, devices, PROMPTS[seq], len(logits) - 1)
        for a, b in zip(ref, logits):
            assert nmse(a, b) < 5e-4, (seq, nmse(a, b))


def with_padded_rows(device):
    """The device as one that compiles a program per step shape declares itself (limits.padded_rows)."""
    device.limits = dataclasses.replace(device.limits, padded_rows=True)
    return device


def test_padded_rows_are_the_next_power_of_two_within_the_batch():
    assert [padded_rows(n, 512) for n in (1, 2, 3, 5, 8, 9, 100, 300, 512)] == [1, 2, 4, 8, 8, 16, 128, 512, 512]
    assert padded_rows(70, 100) == 100


def test_padded_rows_give_each_row_the_logits_it_gets_unpadded_bit_for_bit_on_cpu_q8(tiny_llama):
    """Where a device compiles per shape, a step's token and logits rows are rounded up to a power of two: the
    padding rows write scratch cache rows, see what the last real row sees, and are dropped. The cpu plugin's
    rows do not depend on each other, so every logit equals the unpadded step's, alone and batched."""
    plain, padded = CpuDevice("q8"), with_padded_rows(CpuDevice("q8"))
    if not plain.available:
        pytest.skip(f"cpu plugin's q8 path unavailable: {plain.unavailable_reason}")
    keys, plain_keys = [], []
    got, want = batched(tiny_llama, padded, keys), batched(tiny_llama, plain, plain_keys)
    for seq in want:
        assert len(got[seq]) == len(want[seq])
        for i, (a, b) in enumerate(zip(want[seq], got[seq])):
            assert np.array_equal(a, b), f"sequence {seq}, step {i}: {np.abs(a - b).max()}"
    powers = {1, 2, 4, 8, 16, 32}
    assert all(t in powers and o in powers and o <= t for t, _, o in keys), keys
    assert any(t not in powers for t, _, _ in plain_keys)          # the same steps unpadded: other shapes
    (ref, ref_tokens), (out, tokens) = alone(tiny_llama, plain, PROMPTS[3]), alone(tiny_llama, padded, PROMPTS[3])
    assert tokens == ref_tokens and all(np.array_equal(a, b) for a, b in zip(ref, out))


def test_openvino_cpu_meets_new_row_counts_with_the_models_it_has(registry, tiny_llama):
    """openvino:CPU compiles a model per step shape, so it declares padded rows: prompts of 6, 7 and 8 tokens run
    on the model of 8 rows a 5-token prompt compiled, within the bounds of the cpu plugin's logits."""
    ov = registry.select("openvino:CPU")[0]
    assert ov.limits.padded_rows and not CpuDevice("f32").limits.padded_rows
    b = Batch(Session(tiny_llama, [ov, CpuDevice("f32")], n_ctx=128))
    b.step([Part(1, PROMPTS[2])])                                # 5 tokens: the model of 8 rows
    compiled = ov.stats.compiled
    for seq, n in ((2, 6), (3, 7), (4, 8)):
        logits = b.step([Part(seq, PROMPTS[3][:n])])[0]
        ref, _ = alone(tiny_llama, CpuDevice("f32"), PROMPTS[3][:n], 0)
        assert nmse(ref[0], logits) < 5e-4, (n, nmse(ref[0], logits))
    assert ov.stats.compiled == compiled
    assert {k[0] for k in b.session.plans} == {8}


def test_a_server_on_openvino_cpu_reserves_every_padded_step_size(registry, tiny_llama):
    """serve's batched session reserves (and its start compiles) every padded size of a step that joins a prompt to
    the decode rows, at the first two KV lengths, so that a request never waits for openvino:CPU to compile one."""
    ov = registry.select("openvino:CPU")[0]
    keys = batched_shapes(Session(tiny_llama, [ov, CpuDevice("f32")], n_ctx=1024, n_batch=64, out_rows=4), 4)
    assert {(t, o) for t, _, o in keys} == {(1, 1), (2, 2), (4, 4), (8, 4), (16, 4), (32, 4), (64, 4)}
    assert {kv for t, kv, _ in keys if t == 1} == {256, 512, 768, 1024}
    assert {kv for t, kv, _ in keys if t == 16} == {256, 512}
    plain = batched_shapes(Session(tiny_llama, [CpuDevice("f32")], n_ctx=1024, n_batch=64, out_rows=4), 4)
    assert {t for t, _, _ in plain} == {1, 2, 3, 4, 64}      # the cpu plugin compiles nothing per shape


def test_a_new_step_shape_is_checked_with_the_kept_ones_without_counting_them_again(monkeypatch, tiny_llama):
    """A server meets a new prompt length at almost every request: reserving its shape checks it with every
    kept shape (the devices' budgets are shared), but counts only the new plan's weights, and the totals are
    those of all the shapes reserved at once; a kept shape still counts against a budget a new one exceeds."""
    def session(cap=None):
        caps = {"cpu": cap} if cap else None
        return Session(tiny_llama, [CpuDevice("f32")], n_ctx=1024, n_batch=64, out_rows=4, memory_caps=caps)
    s = session()
    dev = s.devices[0]
    kept = batched_shapes(s, 4)
    s.reserve_shapes(kept)
    calls, real = [], dev.weight_nbytes
    monkeypatch.setattr(dev, "weight_nbytes", lambda t: calls.append(t.name) or real(t))
    new = s.context.rows_key(37, 512, 4)
    result = s.reserve_shapes([new])
    assert len(calls) == len(set(calls)) > 0           # the new plan's weights, each once; no kept plan's
    at_once = session().reserve_shapes(kept + [new])
    assert result.memory == at_once.memory and len(result.plans) == len(kept) + 1
    monkeypatch.undo()
    decode = [k for k in kept if k[0] <= 4]
    tight = session(session().reserve_shapes(decode).memory["cpu"]["total"])    # room for the decode steps only
    tight.reserve_shapes(decode)
    with pytest.raises(CapabilityError, match=r"out_of_memory.*batch\[tokens=37"):
        tight.reserve_shapes([new])


def test_refusals_name_the_reason(tmp_path, tiny_llama):
    recurrent = Model(tiny_models.write("qwen35", tmp_path / "tiny-qwen35.gguf"))
    with pytest.raises(BatchError, match=r"keeps recurrent state per sequence.*--parallel 1"):
        Batch(Session(recurrent, [CpuDevice("f32")], n_ctx=64))
    b = Batch(Session(tiny_llama, [CpuDevice("f32")], n_ctx=64, n_batch=8))
    with pytest.raises(BatchError, match=r"sequences \[1\] appear twice"):
        b.step([Part(1, [5]), Part(1, [6])])
    with pytest.raises(BatchError, match="exceeds the batch size 8"):
        b.step([Part(1, list(range(5))), Part(2, list(range(5)))])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        b.step([Part(1, [1, 2]), Part(2, [10 ** 7])])
    assert b.cells.n_free == 64           # a refused step leaves no cell taken


# -- prefix caching --------------------------------------------------------------------------------------
LONG = [(7 * i + 3) % 900 + 20 for i in range(40)]     # 40 tokens: two whole blocks of 16, and 8 more


def test_block_hashes_name_whole_prefixes():
    a, b = block_hashes(LONG), block_hashes(LONG[:16] + [5] + LONG[17:])
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]       # a change in block 2 changes its hash only


def test_a_reused_prefix_gives_the_logits_of_a_cold_prompt_and_lru_eviction_frees_it(tiny_llama):
    device = CpuDevice("q8")
    if not device.available:
        pytest.skip(f"cpu plugin's q8 path unavailable: {device.unavailable_reason}")
    b = Batch(Session(tiny_llama, [device], n_ctx=128))
    cache = PrefixCache(b.cells, budget=40)
    b.step([Part(1, LONG)])
    cache.retire(1, LONG)
    assert cache.held() == 32 and b.cells.n_free == 128 - 32          # the two whole blocks are kept
    other = LONG[:35] + [44, 45]                                   # shares 35 tokens: 2 blocks of them
    assert cache.reuse(2, other) == 32 and cache.hits == 1
    warm = b.step([Part(2, other[32:])])[0]
    cold, _ = alone(tiny_llama, device, other, 0)
    assert np.array_equal(warm, cold[0])
    assert cache.reuse(3, LONG[:16]) == 15         # a prompt of one block: all but its last token, found whole
    b.free(3)
    cache.retire(2, other)                         # its blocks are the same prefix: the older keeper goes
    assert len(cache.keepers) == 1 and cache.held() == 32
    b.step([Part(4, list(range(100, 140)))])
    cache.retire(4, list(range(100, 140)))         # 64 kept cells pass the budget of 40: the older one goes
    assert cache.held() == 32 and cache.reuse(5, other) == 0 and cache.reuse(6, list(range(100, 150))) == 32


def test_a_prompt_under_a_block_is_found_whole_in_a_kept_prefix(tiny_llama):
    """A prompt shorter than a block (no hash names it) reuses a keeper that holds all of it but its last token,
    with the logits of a cold prompt; one that a keeper holds only in part is computed."""
    device = CpuDevice("q8")
    if not device.available:
        pytest.skip(f"cpu plugin's q8 path unavailable: {device.unavailable_reason}")
    b = Batch(Session(tiny_llama, [device], n_ctx=128))
    cache = PrefixCache(b.cells)
    fed = LONG[:9] + list(range(300, 320))          # a 9-token prompt and 20 tokens after it: one block kept
    b.step([Part(1, fed)])
    cache.retire(1, fed)
    assert cache.reuse(2, LONG[:9]) == 8 and cache.hits == 1
    warm = b.step([Part(2, LONG[8:9])])[0]
    cold, _ = alone(tiny_llama, device, LONG[:9], 0)
    assert np.array_equal(warm, cold[0])
    assert cache.reuse(3, LONG[:4] + [5, 6, 7]) == 0 and cache.hits == 1


def test_a_prompt_sent_again_reuses_every_matching_token_past_its_last_whole_block(tiny_llama):
    """As llama-server's cache_prompt: the kept cells go on past the prompt's last whole block as far as the
    tokens match, all but the prompt's last token, with the logits of a cold prompt."""
    device = CpuDevice("q8")
    if not device.available:
        pytest.skip(f"cpu plugin's q8 path unavailable: {device.unavailable_reason}")
    b = Batch(Session(tiny_llama, [device], n_ctx=128))
    cache = PrefixCache(b.cells)
    fed = LONG + [61, 62, 63, 64, 65, 66, 67, 68]          # 48 tokens: three whole blocks kept
    b.step([Part(1, fed)])
    cache.retire(1, fed)
    again = LONG + [61, 62, 99]                             # 43 tokens, all but the last as kept
    assert cache.reuse(2, again) == 42                     # 32 by whole blocks, then 10 token by token
    warm = b.step([Part(2, again[42:])])[0]
    cold, _ = alone(tiny_llama, device, again, 0)
    assert np.array_equal(warm, cold[0])
    assert cache.reuse(3, LONG[:37] + [5, 6]) == 37 and cache.reused == 42 + 37    # parts at the first mismatch


# -- perplexity: several windows a step ----------------------------------------------------------------
def test_perplexity_scores_several_windows_a_step_as_it_does_one_by_one(tiny_llama):
    device = CpuDevice("q8")
    if not device.available:
        pytest.skip(f"cpu plugin's q8 path unavailable: {device.unavailable_reason}")
    ids = [(13 * i + 5) % 1000 + 10 for i in range(70)]          # 4 windows of 16, then one of 6
    assert windows_per_step(tiny_llama, [device], 16, 64) == 4
    one = perplexity(Session(tiny_llama, [device], n_ctx=16, n_batch=64), ids, 16)
    many_session = Session(tiny_llama, [device], n_ctx=64, n_batch=64)
    many = perplexity(many_session, ids, 16)
    assert np.array_equal(one.nll, many.nll) and np.array_equal(one.top1, many.top1)
    assert one.n_tokens == many.n_tokens == 70 and len(many.nll) == 4 * 15 + 5
    assert any(k[0] == 64 and k[2] == 64 for k in many_session.plans)      # the four windows ran as one step


def test_requests_with_one_prompt_compute_it_once_and_answer_as_it_does_alone(tiny_llama):
    """serve's scheduler: a request joining while another with the same prompt has not fed it yet waits for
    that one's cells and takes them (computing only its last prompt token); one joining after it fed them
    takes them at once. Every one answers (greedy) as the prompt does with nothing cached. A prompt shorter
    than a block is shared too."""
    from framework.runtime.sampling import SamplingParams
    from framework.serve.engine import Job, Run, Scheduler
    from framework.serve.pool import Slot
    device = CpuDevice("q8")
    if not device.available:
        pytest.skip(f"cpu plugin's q8 path unavailable: {device.unavailable_reason}")
    sched = Scheduler(Session(tiny_llama, [device], n_ctx=256), ["cpu"])

    def request(cache_prompt: bool = True, prompt: list[int] = LONG) -> Run:
        run = Run(Slot(sched, 256), Job(list(prompt), 6, SamplingParams(), [], cache_prompt=cache_prompt))
        run.start()
        return run

    def finish(*runs: Run) -> None:
        while any(r.finish is None for r in runs):
            for r in runs:
                if r.finish is None:
                    r.step()

    cold = request(cache_prompt=False)
    finish(cold)
    first, second = request(), request()
    assert second.awaits is not None and second.awaits[0] is first and second.cached_tokens == 0
    first.step()                                   # the step that feeds the first one's prompt
    third = request()
    assert third.awaits is None and third.cached_tokens == len(LONG) - 1       # fed: taken at once
    finish(first, second, third)
    assert second.cached_tokens == len(LONG) - 1
    assert sched.state()["prefix_cache"]["in_flight"] == {"hits": 2, "tokens": 2 * (len(LONG) - 1)}
    assert first.tokens == second.tokens == third.tokens == cold.tokens
    short = [request(prompt=list(range(500, 509))) for _ in range(2)]      # under a block, kept nowhere yet
    assert short[1].awaits is not None
    finish(*short)
    assert short[1].cached_tokens == 8 and short[0].tokens == short[1].tokens
