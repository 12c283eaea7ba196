"""A product output larger than one tensor of a device may hold (the logits of a perplexity window over a
large vocabulary, more than one storage binding) is planned in blocks of token rows and joined on the host,
with the logits of the unsplit product: on lavapipe with its binding capped so that a tiny model's logits
need the split, and on the cpu plugin with a declared cap (core/scheduler/products.py)."""

from __future__ import annotations

import numpy as np
import pytest

import tiny_models
from framework.core.scheduler import make_plan
from framework.core.scheduler.products import PARTS, split_large_products, tensor_limit
from framework.model.model import Model
from framework.plugins.cpu.device import CpuDevice
from framework.runtime.session import Session

TOKENS = list(range(20, 36))          # 16 prompt tokens: 16 rows of logits


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Model:
    return Model(tiny_models.write("llama", tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf"))


def all_logits(model: Model, devices) -> tuple[np.ndarray, Session]:
    s = Session(model, devices, n_ctx=64, n_batch=32)
    return s.eval(TOKENS, all_logits=True), s


def row_bytes(model: Model) -> int:
    return model.tokenizer.n_vocab * 4


class CappedCpu(CpuDevice):
    """The cpu plugin with a declared most bytes one tensor may hold, as device-buffer plugins declare."""

    name = "cpu"

    def __init__(self, cap: int, matmul: str | None = None):
        super().__init__(matmul)
        self.max_chunk_bytes = cap


def test_logits_over_the_cap_are_computed_in_blocks_of_rows_with_the_same_values(tiny):
    """On the q8 path, whose products give a row the same bits in a block of any size (the float32 path's
    reference product runs blocks of up to 8 rows row by row and larger ones through BLAS, which rounds
    otherwise); the head here is Q8_0."""
    whole_device = CpuDevice("q8")
    if not whole_device.available:
        pytest.skip(f"cpu plugin's q8 path unavailable: {whole_device.unavailable_reason}")
    whole, plain = all_logits(tiny, [whole_device])
    cap = 6 * row_bytes(tiny) + 100            # 6 rows a block: 6 + 6 + 4
    split, s = all_logits(tiny, [CappedCpu(cap, "q8")])
    plan = next(p for p, _ in s.plans.values())
    assert plan.graph.meta[PARTS] == [3]
    assert [t.name for t in plan.graph.outputs] == ["result_output[0:6]", "result_output[6:12]",
                                                   "result_output[12:16]"]
    assert all(t.nbytes <= cap for t in plan.graph.outputs)
    assert split.shape == whole.shape == (len(TOKENS), tiny.tokenizer.n_vocab)
    np.testing.assert_array_equal(split, whole)


def test_nothing_is_split_without_a_declared_cap_or_within_it(tiny):
    s = Session(tiny, [CpuDevice()], n_ctx=64, n_batch=32)
    graph = s.context.graph(s.context.shape_key(len(TOKENS), 0, None))[0]
    assert tensor_limit([CpuDevice()]) is None
    assert split_large_products(graph, [CpuDevice()]) is graph
    assert split_large_products(graph, [CappedCpu(len(TOKENS) * row_bytes(tiny))]) is graph
    decode = s.context.graph(s.context.shape_key(1, len(TOKENS), 1))[0]          # one row: nothing to split by rows
    assert split_large_products(decode, [CappedCpu(row_bytes(tiny) // 2)]) is decode


def test_lavapipe_with_a_capped_binding_splits_the_logits_it_refused_whole(tiny, registry):
    """The tiny llama's output matrix is Q8_0 (vulkan:0 takes it) and some layers' types are not (the cpu
    plugin takes those): the product of the logits is vulkan:0's, whole or in blocks."""
    vk = next(d for d in registry.devices() if d.name == "vulkan:0")
    if not vk.available:
        pytest.fail(f"vulkan:0 is unavailable: {vk.unavailable_reason}")
    devices = [vk, CpuDevice()]
    whole, s = all_logits(tiny, devices)
    head = {p.device for p in next(iter(s.plans.values()))[0].placement.values()}
    assert "vulkan:0" in head
    saved = vk.max_binding
    # the logits of 16 rows no longer fit one binding, 8 rows do; every other activation still fits (the
    # largest, 16 x 512 float32), so the plan differs from the whole one by the split alone
    vk.max_binding = 8 * row_bytes(tiny)
    try:
        s = Session(tiny, devices, n_ctx=64, n_batch=32)
        graph = s.context.graph(s.context.shape_key(len(TOKENS), 0, None))[0]
        out = graph.outputs[0]
        assert out.nbytes > vk.max_chunk_bytes
        assert not vk.supports_op(out).ok              # the device refuses the whole product ...
        plan = make_plan(graph, devices)               # ... and the planner splits it instead
        assert plan.graph.meta[PARTS] == [2]
        assert {plan.placement[id(t)].device for t in plan.graph.outputs} == {"vulkan:0"}
        split, _ = all_logits(tiny, devices)
    finally:
        vk.max_binding = saved
    np.testing.assert_array_equal(split, whole)
