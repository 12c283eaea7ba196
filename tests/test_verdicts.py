"""The contract's declared limits are applied in one place before a device's own verdict."""

import pytest
from conftest import load_model

from framework.contract import Limits, Verdict
from framework.core.scheduler import make_plan
from framework.core.scheduler.errors import PluginContractError
from framework.core.scheduler.verdicts import ask
from framework.model.arch.base import KVCache
from framework.plugins.cpu.device import CpuDevice


def test_declared_weight_types_refuse_other_types_with_a_reason():
    model = load_model("smollm2")
    graph, _ = model.build_step(1, 256, 1, KVCache(model.hp, 256), n_layers=1)
    picky = CpuDevice()
    picky.name = "picky"
    picky.limits = Limits(dtypes=frozenset({"F32", "Q8_0"}))
    q_proj = next(n for n in graph.nodes if n.name == "Qcur-0")               # Q4_1 weight
    verdict = ask(picky, q_proj)
    assert not verdict and verdict.code == "unsupported_dtype"
    assert "Q4_1" in verdict.reason and "blk.0.attn_q.weight" in verdict.reason
    assert ask(picky, next(n for n in graph.nodes if n.name == "inp_embd"))  # Q8_0 embedding is declared
    plan = make_plan(graph, [picky, CpuDevice()])
    assert plan.device_of(q_proj) == "cpu"
    assert plan.placement[id(q_proj)].refusals["picky"] == verdict       # the device's Verdict, kept as given


def test_a_bare_boolean_verdict_is_a_contract_error():
    class Sloppy(CpuDevice):
        name = "sloppy"

        def supports_op(self, node):
            return True

    model = load_model("smollm2")
    graph, _ = model.build_step(1, 256, 1, KVCache(model.hp, 256), n_layers=1)
    with pytest.raises(PluginContractError, match="(?s)sloppy.*returned True.*Verdict"):
        ask(Sloppy(), graph.nodes[0])
    assert isinstance(ask(CpuDevice(), graph.nodes[0]), Verdict)
