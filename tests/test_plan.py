"""The planner's smoothing pass and its views-follow-their-memory pass (passes 4 and 5 of plan.py,
3 and 4 before the memory pass came) on small hand-built graphs, with devices whose abilities are
declared as data (supported_ops, refused_ops). Each plan is also run, and must give the reference
kernels' result."""

from __future__ import annotations

import numpy as np
import pytest

from framework.contract import HOST_BUFFER, Device, DeviceType, ReferenceProgram, Verdict, ops
from framework.core.graph import F32, I32, GraphBuilder, LeafKind, leaf
from framework.core.graph.interpreter import evaluate
from framework.core.scheduler import Executor, Residence, make_plan
from framework.core.scheduler.plan import SMOOTH_MAX_RUN


class Dev(Device):
    type = DeviceType.ACCEL

    def __init__(self, name: str, supported: tuple[str, ...] | None = None, refused: tuple[str, ...] = ()):
        self.name = name
        self.supported_ops = ops.names(*supported) if supported is not None else None
        self.refused_ops = {op: Verdict.no("refused_by_test", f"{name} refuses {op}") for op in refused}

    def supports_op(self, node):
        return Verdict.yes()

    def compile(self, fragment):
        return ReferenceProgram(fragment.nodes, fragment.inputs, fragment.outputs)


def picky() -> Dev:
    """First in the list, but it runs only ADD, MUL_MAT and the views: the rest falls back to 'all'."""
    return Dev("picky", ("ADD", "MUL_MAT", *ops.VIEW_OPS))


def devices():
    return [picky(), Dev("all")]


def run_and_compare(plan, values: dict, weights: dict | None = None) -> None:
    weights = weights or {}
    got = Executor(plan.devices, lambda t: weights[t.name]).run(plan, {k: v.copy() for k, v in values.items()})
    from framework.core.graph.quants import dequantize
    ref_values = {**values, **{id(t): dequantize(weights[t.name], t.dtype, t.shape) for t in plan.graph.leaves
                               if t.kind == LeafKind.WEIGHT}}
    for g, r in zip(got, evaluate(plan.graph, ref_values)):
        np.testing.assert_allclose(g, r, rtol=1e-6, atol=1e-6)


def where(plan, *nodes) -> list[str]:
    return [plan.device_of(n) for n in nodes]


# -- smoothing (pass 4) ---------------------------------------------------------------------------------

def chain(run: int, weight: bool = False):
    """all: silu -> picky: `run` ADDs (or a MUL_MAT by a weight) -> all: scale."""
    b = GraphBuilder()
    x = b.input("x", F32, (4, 8))
    first = b.unary(x, "silu", name="first")
    cur, middle, weights = first, [], {}
    if weight:
        w = b.use(leaf("w", F32, (8, 8), LeafKind.WEIGHT))
        weights["w"] = np.random.default_rng(0).uniform(-1, 1, (8, 8)).astype(np.float32).view(np.uint8).reshape(-1)
        cur = b.mul_mat(w, cur, name="product")
        middle.append(cur)
    for i in range(run):
        cur = b.add(cur, first, name=f"add{i}")
        middle.append(cur)
    last = b.scale(cur, 0.5, name="last")
    values = {id(x): np.random.default_rng(1).uniform(-1, 1, (4, 8)).astype(np.float32)}
    return b.build([last]), first, middle, last, values, weights


def test_a_short_cheap_run_between_two_runs_of_one_device_moves_there():
    graph, first, middle, last, values, _ = chain(run=2)
    plan = make_plan(graph, devices())
    assert where(plan, first, *middle, last) == ["all"] * 4
    for n in middle:
        p = plan.placement[id(n)]
        assert p.reason.startswith("smoothed: moved from picky to all, saving") and not p.pinned
        assert p.refusals == {}                  # picky accepted them: nothing was refused
    assert [f.device for f in plan.fragments] == ["all"] and plan.copies == []
    run_and_compare(plan, values)


def test_a_run_longer_than_the_limit_stays_where_the_verdicts_put_it():
    graph, first, middle, last, values, _ = chain(run=SMOOTH_MAX_RUN + 1)
    plan = make_plan(graph, devices())
    assert where(plan, *middle) == ["picky"] * len(middle)
    assert plan.placement[id(middle[0])].reason == "first device in the list"
    assert [f.device for f in plan.fragments] == ["all", "picky", "all"]
    assert [(c.tensor, c.dst_device) for c in plan.copies] == [("first", "picky"), (middle[-1].name, "all")]
    run_and_compare(plan, values)


def test_a_run_that_reads_a_weight_is_real_work_and_stays():
    graph, first, middle, last, values, weights = chain(run=1, weight=True)
    plan = make_plan(graph, devices())
    assert where(plan, *middle) == ["picky", "picky"]
    run_and_compare(plan, values, weights)


def test_a_run_the_device_around_it_refuses_stays():
    graph, first, middle, last, values, _ = chain(run=2)
    plan = make_plan(graph, [picky(), Dev("all", refused=("ADD",)), Dev("rest")])
    assert where(plan, first, *middle, last) == ["all", "picky", "picky", "all"]
    run_and_compare(plan, values)


def test_a_run_at_the_end_has_nothing_to_join():
    b = GraphBuilder()
    x = b.input("x", F32, (4, 8))
    first = b.unary(x, "silu", name="first")
    out = b.add(first, first, name="out")
    plan = make_plan(b.build([out]), devices())
    assert where(plan, first, out) == ["all", "picky"]


def test_a_pinned_node_is_never_smoothed_away():
    b = GraphBuilder()
    x = b.input("x", F32, (2, 8))
    rows = b.input("rows", I32, (2,))
    cache = b.use(leaf("cache", F32, (6, 8), LeafKind.CACHE))
    first = b.unary(x, "silu", name="first")
    write = b.set_rows(cache, first, rows, name="write")        # touches the cache held on 'picky'
    last = b.scale(b.add(b.view(write, (2, 8), 0, name="seen"), first, name="sum"), 2.0, name="last")
    owner = Dev("picky", ("ADD", "SET_ROWS", *ops.VIEW_OPS))
    plan = make_plan(b.build([last]), [owner, Dev("all")], {id(cache): Residence("picky", HOST_BUFFER)})
    p = plan.placement[id(write)]
    assert p.device == "picky" and p.pinned and p.reason.startswith("pinned: reads or writes 'cache'")
    assert plan.device_of(first) == "all" and plan.device_of(last) == "all"


# -- views follow their memory (pass 5) -------------------------------------------------------------------

def test_views_of_a_computed_tensor_stay_with_it_and_views_of_views_too():
    b = GraphBuilder()
    x = b.input("x", F32, (4, 8))
    y = b.add(x, x, name="y")                                  # on picky
    r = b.reshape(y, (8, 4), name="r")
    t = b.transpose(r, name="t")                              # a view of a view
    out = b.cont(t, name="out")                               # picky has no CONT: on 'all'
    plan = make_plan(b.build([out]), devices())
    assert where(plan, y, r, t, out) == ["picky", "picky", "picky", "all"]
    assert plan.placement[id(r)].reason == plan.placement[id(t)].reason == "view of a tensor on this device"
    assert [c.tensor for c in plan.copies] == ["t"]            # the view crosses, not a copy of y and a re-view
    run_and_compare(plan, {id(x): np.arange(32, dtype=np.float32).reshape(4, 8)})


def test_a_view_of_a_leaf_runs_where_it_is_first_read():
    b = GraphBuilder()
    x = b.input("x", F32, (4, 8))
    v = b.view(x, (2, 8), 8, name="v")
    out = b.unary(v, "tanh", name="out")                      # on 'all'
    plan = make_plan(b.build([out]), devices())
    assert where(plan, v, out) == ["all", "all"]
    assert plan.placement[id(v)].reason == "view read on this device"
    run_and_compare(plan, {id(x): np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)})


def test_a_view_its_memory_s_device_refuses_runs_where_it_is_read_and_keeps_the_refusal():
    b = GraphBuilder()
    x = b.input("x", F32, (4, 8))
    y = b.add(x, x, name="y")                                  # on picky
    p = b.permute(y, (1, 0), name="p")                         # picky refuses PERMUTE
    out = b.cont(p, name="out")
    noperm = Dev("picky", ("ADD", "MUL_MAT", *ops.VIEW_OPS), refused=("PERMUTE",))
    plan = make_plan(b.build([out]), [noperm, Dev("all")])
    place = plan.placement[id(p)]
    assert place.device == "all" and place.reason == "fallback: refused by picky"
    assert place.refusals == {"picky": Verdict.no("refused_by_test", "picky refuses PERMUTE")}   # kept as given
    assert plan.to_dict()["fallbacks"][0]["refusals"] == {"picky": "refused_by_test: picky refuses PERMUTE"}
    assert (p, place) in plan.fallbacks
    assert [c.tensor for c in plan.copies] == ["y"]
    run_and_compare(plan, {id(x): np.arange(32, dtype=np.float32).reshape(4, 8)})


def test_a_view_no_device_accepts_is_a_capability_error_naming_every_refusal():
    from framework.core.scheduler import CapabilityError
    b = GraphBuilder()
    x = b.input("x", F32, (4, 8))
    y = b.add(x, x, name="y")
    out = b.cont(b.permute(y, (1, 0), name="p"), name="out")
    devs = [Dev("picky", ("ADD", *ops.VIEW_OPS), refused=("PERMUTE",)), Dev("all", refused=("PERMUTE",))]
    with pytest.raises(CapabilityError) as info:
        make_plan(b.build([out]), devs)
    assert info.value.code == "no_device_for_node" and info.value.node == "p"
    assert "picky says refused_by_test" in str(info.value) and "all says refused_by_test" in str(info.value)
