"""The design brief's shared-KV failure, reproduced: a draft made of the target's first layers
shares the target's KV cache tensors. Placed on a device that cannot use the cache's buffer,
reservation fails naming the tensor, its buffer and device, the consumer and the fix, before
anything is loaded; placed on the cache's device, the draft runs and reads the target's cache."""

import numpy as np
import pytest
from conftest import load_model, reference

from framework.core.scheduler import CapabilityError
from framework.core.scheduler.errors import DeviceSelectionError
from framework.runtime.session import Session

DRAFT_LAYERS = 2


@pytest.fixture(scope="module")
def devices(registry):
    names = {d.name for d in registry.devices()}
    assert "example:0" in names, "the example plugin (examples/plugin-example) must be installed"
    return registry.select("example:0")[0], registry.select("cpu")[0]


@pytest.fixture(scope="module")
def target(devices):
    example, cpu = devices
    return Session(load_model("smollm2"), [example, cpu], n_ctx=256, kv_device="example:0")


def test_draft_on_a_device_that_cannot_use_the_kv_buffer_fails_at_reservation(devices, target):
    _, cpu = devices
    draft = Session(target.model, [cpu], n_layers=DRAFT_LAYERS, share_kv_with=target)
    with pytest.raises(CapabilityError) as info:
        draft.reserve(8, 4)
    e = info.value
    assert e.code == "buffer_not_usable"
    assert e.tensor == "cache_k_l0" and e.node == "k_cache_write-0"
    assert e.devices == ("example:0", "cpu")
    text = str(e)
    for part in ("cache_k_l0", "example_private", "example:0", "k_cache_write-0", "SET_ROWS", "cpu",
                 "same physical device", "the target's, shared with the draft", "of the draft",
                 "fix: place the draft with the target: list example:0 first in --draft-backends"):
        assert part in text, part
    assert draft.executor.weights == {} and draft.executor.programs == {}   # nothing loaded or compiled


def test_draft_on_the_cache_owner_runs_on_the_targets_cache(devices, target):
    example, cpu = devices
    prompt = reference("smollm2")[0]["prompts"][0]["ids"]
    target.reset()
    target.eval(prompt)
    draft = Session(target.model, [example, cpu], n_layers=DRAFT_LAYERS, share_kv_with=target)
    draft.reserve(len(prompt), 2)
    draft.n_past = target.n_past                       # the draft continues where the target stopped
    shared = draft.eval([prompt[-1]])
    # the same draft with a cache of its own, prefilled itself, must predict the same
    alone = Session(target.model, [cpu], n_ctx=256, n_layers=DRAFT_LAYERS)
    alone.eval(prompt)
    own = alone.eval([prompt[-1]])
    np.testing.assert_allclose(shared, own, rtol=1e-4, atol=1e-4)
    assert draft.executor.caches is target.executor.caches


# -- one chip through two plugins: a target's KV cache on vulkan:0, a draft on opencl:0 ------------------
# In CI both are the host CPU (Mesa's lavapipe and PoCL), on an NVIDIA machine both the one GPU: each
# plugin keeps the cache in its own buffers, which the other cannot use in place, so reservation must
# fail naming the shared tensor and the one physical device; placed together, the draft runs.

@pytest.fixture(scope="module")
def pair(registry):
    try:
        vk, ocl = registry.select("vulkan:0")[0], registry.select("opencl:0")[0]
    except DeviceSelectionError as e:     # the reason names the missing driver; make test installs both
        pytest.fail(f"needs vulkan:0 and opencl:0: {e}")
    return vk, ocl


@pytest.fixture(scope="module")
def vk_target(pair):
    vk, _ = pair
    return Session(load_model("smollm2"), [vk], n_ctx=256, kv_device="vulkan:0")


def test_one_chip_two_plugins_reports_one_physical_id(pair):
    vk, ocl = pair
    assert vk.physical_id and vk.physical_id == ocl.physical_id, (vk.physical_id, ocl.physical_id)


def test_draft_on_opencl_of_a_vulkan_cache_fails_naming_the_one_physical_device(pair, vk_target):
    vk, ocl = pair
    draft = Session(vk_target.model, [ocl], n_layers=DRAFT_LAYERS, share_kv_with=vk_target)
    with pytest.raises(CapabilityError) as info:
        draft.reserve(8, 4)
    e = info.value
    assert e.code == "buffer_not_usable" and e.tensor == "cache_k_l0" and e.devices == ("vulkan:0", "opencl:0")
    text = str(e)
    for part in ("cache_k_l0", "buffer 'vulkan:0'", "opencl:0", "SET_ROWS",
                 f"same physical device ({vk.physical_id}) reached through two plugins",
                 "fix: place the draft with the target: list vulkan:0 first in --draft-backends"):
        assert part in text, part
    assert draft.executor.weights == {} and draft.executor.programs == {}   # nothing loaded or compiled


def test_draft_placed_with_the_vulkan_cache_runs(pair, vk_target):
    vk, _ = pair
    prompt = reference("smollm2")[0]["prompts"][0]["ids"]
    vk_target.reset()
    vk_target.eval(prompt)
    draft = Session(vk_target.model, [vk], n_layers=DRAFT_LAYERS, share_kv_with=vk_target)
    draft.reserve(len(prompt), 2)
    draft.n_past = vk_target.n_past
    shared = draft.eval([prompt[-1]])
    alone = Session(vk_target.model, [vk], n_ctx=256, n_layers=DRAFT_LAYERS)
    alone.eval(prompt)
    np.testing.assert_allclose(shared, alone.eval([prompt[-1]]), rtol=1e-4, atol=1e-4)
    assert draft.executor.caches is vk_target.executor.caches
